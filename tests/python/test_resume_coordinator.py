"""A dynmo.pipelining job restarted from a checkpoint, and the coordinator
that decides its plans (issue 41 item 3). The ranks register with the split
they loaded (``DynamicPipeline(boundaries=checkpoint.saved_split(path))``).

- Embedded coordinator: a new one per launch, so it starts from the split
  the ranks register with; its plans move layers from there and the resumed
  job trains as the uninterrupted one did.
- A standalone ``dynmo-coordinator`` whose state dir outlives the job, and
  a checkpoint older than the job's last applied plan: the coordinator must
  take the loaded split, with a logged event, instead of planning from the
  split it recorded (a ``layout_adopted`` warning): otherwise every later
  plan would move layers from stages that do not hold them, each refused by
  the ranks and aborted, and the job never re-balanced again.
"""
import json
import os
import subprocess
import tempfile

import pytest

torch = pytest.importorskip("torch")

import pipelining_workers as w  # noqa: E402
from conftest import BIN_DIR, run_ranks  # noqa: E402

SKEWED = [0, 7, 8]


def losses(records):
    return {k: v for r in records for k, _, v in r["losses"]}


def events(log, name):
    """The event lines called ``name`` in a coordinator log (logfmt)."""
    with open(log) as f:
        return [line for line in f if f"event={name} " in line]


def refused_as_stale(log):
    """Plans aborted because a rank's layout was not the one planned from
    (an abort for time, under load, is not this test's business)."""
    return [line for line in events(log, "plan_aborted") if "does not hold" in line]


def field(line, key):
    return line.split(f" {key}=")[1].split(" ")[0]


def test_an_embedded_coordinator_plans_from_the_split_a_resumed_job_loaded(monkeypatch):
    with tempfile.TemporaryDirectory() as root:
        cfg = dict(schedule="1F1B", pp=2, steps=14, boundaries=SKEWED, coordinator="embedded",
                   policy={"trigger": "every:2"}, job="resume-embedded")
        whole = run_ranks(w.train, dict(cfg, save_at=0, save_root=root), 2)
        log = os.path.join(root, "coordinator.log")
        monkeypatch.setenv("DYNMO_COORDINATOR_LOG", log)
        resumed = run_ranks(w.train, dict(cfg, resume=root), 2)
        issued = events(log, "plan_issued")
        aborted = refused_as_stale(log)
    assert all(not r["errors"] for r in resumed)
    assert issued and field(issued[0], "boundaries_from") == "0,7,8", issued
    assert resumed[0]["plans"], "the resumed job applied no plan"
    assert not aborted, aborted
    after = losses(resumed)
    assert after and all(after[k] == losses(whole)[k] for k in after)


def test_a_coordinator_with_state_adopts_the_split_of_an_older_checkpoint_with_an_event():
    import dynmo
    binary = os.path.join(BIN_DIR, "dynmo-coordinator")
    with tempfile.TemporaryDirectory() as root:
        state = os.path.join(root, "state")
        flags = [f"--state_dir={state}", "--trigger=every:2", "--plan_lead_iterations=2"]
        cfg = dict(schedule="1F1B", pp=2, boundaries=SKEWED, policy={"trigger": "every:2"},
                   job="resume-standalone")
        # The job saves at iteration 0, then the coordinator moves layers.
        with dynmo.LocalCoordinator(flags, binary=binary,
                                    log_path=os.path.join(root, "first.log")) as c:
            first = run_ranks(w.train, dict(cfg, steps=14, coordinator=c.address,
                                            save_at=0, save_root=root), 2)
            recorded = _job(c.address, cfg["job"])["boundaries"]
        if not first[0]["plans"] or recorded == SKEWED:  # the premise
            raise RuntimeError(f"the first launch moved nothing: {first[0]['plans']}, "
                               f"{recorded}")
        # A new coordinator process on the same state dir; the job restarts
        # from its checkpoint of iteration 0, at the split saved there.
        log = os.path.join(root, "second.log")
        with dynmo.LocalCoordinator(flags, binary=binary, log_path=log) as c:
            resumed = run_ranks(w.train, dict(cfg, steps=20, coordinator=c.address,
                                              resume=root), 2)
        issued = events(log, "plan_issued")
        aborted = refused_as_stale(log)
        with open(log) as f:
            warned = [line for line in f if "level=warning" in line and "0,7,8" in line]
    assert all(not r["errors"] for r in resumed)
    assert warned, "no logged event names the split the resumed job registered with"
    assert issued and field(issued[0], "boundaries_from") == "0,7,8", issued
    assert not aborted, aborted


def _job(address, name):
    out = subprocess.run([os.path.join(BIN_DIR, "dynmo-ctl"), f"--coordinator={address}",
                          "--json", "job", name], capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)
