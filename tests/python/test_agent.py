"""dynmo.Agent and dynmo.set_policy against a real dynmo-coordinator: every
call, a plan end to end (two ranks in one process), and every error path."""
import math
import os
import time

import pytest

import dynmo


def agent(coordinator, rank=0, **kw):
    kw.setdefault("pipeline_size", 2)
    kw.setdefault("num_layers", 4)
    kw.setdefault("boundaries", [0, 3, 4])
    kw.setdefault("connect_timeout_s", 20)
    return dynmo.Agent(coordinator.address, kw.pop("job", "pytest"), rank, **kw)


def wait_for(condition, what, timeout_s=30):
    """Polls until `condition()` is true; fails naming `what` (no timing asserts:
    the deadline only bounds a hang)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def test_connects_and_reports(coordinator):
    with agent(coordinator, pipeline_size=1, boundaries=[]) as a:
        assert a.wait_connected(1.0)
        a.report(0, [dynmo.LayerCost(0, 0.1, 0.2, 0.0, 10, 100, 5),
                     (1, 0.1, 0.2), {"layer": 2, "fwd_s": 0.3}],
                 memory_used_bytes=1000, memory_capacity_bytes=10**9,
                 neighbour_wait_s=0.01, model_changed=True)
        wait_for(lambda: a.stats().reports_sent >= 1, "the report to be sent")
        s = a.stats()
        assert s.connected and s.connects == 1 and s.applied_epoch == 0
        assert a.plan_to_apply_at(1) is None
        assert a.latest_committed_plan() is None
        assert a.flush(5.0)
        a.stop()
        a.stop()  # idempotent
        assert not a.stats().connected


def test_a_plan_end_to_end(coordinator):
    """Two ranks report a skewed layout (stage 0: 3 heavy layers); the
    coordinator (every:2) commits a plan that moves a layer to stage 1."""
    ranks = [agent(coordinator, r, job="e2e") for r in (0, 1)]
    held = [[0, 1, 2], [3]]
    for k in range(4):
        for r, a in enumerate(ranks):
            a.report(k, [dynmo.LayerCost(l, 1.0, 2.0, 0.0, 100, 4000, 10) for l in held[r]])
    plans = [wait_for(a.latest_committed_plan, "a committed plan") for a in ranks]
    plan = plans[0]
    assert plans[1] == plan and plan.job == "e2e" and plan.epoch >= 1
    assert plan.boundaries == [0, 2, 4] and plan.active_stages == [0, 1]
    assert plan.migrations == [dynmo.LayerMove(2, 0, 1, 4000, 0)]
    assert list(plan.layers_of(1)) == [2, 3] and list(plan.layers_of(7)) == []
    assert plan.reason == "every:2" and plan.apply_iteration > 3
    assert all(a.plan_to_apply_at(plan.apply_iteration - 1) is None for a in ranks)
    due = [a.plan_to_apply_at(plan.apply_iteration) for a in ranks]
    assert due == [plan, plan]
    for a in ranks:
        a.acknowledge(plan.epoch, True)
        with pytest.raises(dynmo.FailedPreconditionError, match="not the pending plan"):
            a.acknowledge(plan.epoch, True)
        assert a.flush(5.0)
    stats = [a.stats() for a in ranks]
    assert [s.applied_epoch for s in stats] == [plan.epoch] * 2
    assert [s.boundaries for s in stats] == [[0, 2, 4]] * 2
    assert all(s.plans_applied == 1 and s.plans_prepared >= 1 for s in stats)
    for a in ranks:
        a.stop()


@pytest.mark.parametrize("layers,message", [
    ([(0, math.nan)], "layer 0: times and sizes must be finite and >= 0"),
    ([(0, math.inf)], "layer 0: times and sizes must be finite and >= 0"),
    ([(0, -1.0)], "layer 0: times and sizes must be finite and >= 0"),
    ([(0, 0.1, 0.1, 0.1, -5)], "layer 0: times and sizes must be finite and >= 0"),
    ([(9, 0.1)], r"layer id 9 outside \[0, 4\)"),
])
def test_bad_reports_raise_the_validators_message(coordinator, layers, message):
    with agent(coordinator, pipeline_size=1, boundaries=[]) as a:
        with pytest.raises(dynmo.InvalidArgumentError, match=message):
            a.report(0, layers)


def test_bad_report_fields(coordinator):
    with agent(coordinator, pipeline_size=1, boundaries=[]) as a:
        with pytest.raises(dynmo.InvalidArgumentError, match="iteration is negative"):
            a.report(-1, [])
        with pytest.raises(dynmo.InvalidArgumentError, match="memory must be >= 0"):
            a.report(0, [], memory_used_bytes=-1)
        with pytest.raises(dynmo.InvalidArgumentError, match="neighbour_wait_s"):
            a.report(0, [], neighbour_wait_s=math.nan)
        with pytest.raises(TypeError):
            a.report(0, [("zero", 0.1)])
        with pytest.raises(TypeError):
            a.report(0, [(0, 0.1, 0.1, 0.1, 2**70)])
        with pytest.raises(dynmo.FailedPreconditionError, match="not the pending plan") as e:
            a.acknowledge(3, True)
        assert e.value.code == "FAILED_PRECONDITION" and isinstance(e.value, RuntimeError)
        with pytest.raises(dynmo.InvalidArgumentError, match="timeout_s"):
            a.wait_connected(-1)
        with pytest.raises(dynmo.InvalidArgumentError, match="timeout_s"):
            a.flush(math.nan)


@pytest.mark.parametrize("kwargs,message", [
    (dict(pipeline_rank=2, pipeline_size=2), "coordinates out of range"),
    (dict(pipeline_size=0), "sizes must be >= 1"),
    (dict(data_parallel_rank=1), "coordinates out of range"),
    (dict(num_layers=1, pipeline_size=2), "fewer layers than stages"),
    (dict(job=""), "no job name"),
    (dict(queue_capacity=0), "queue_capacity must be >= 1"),
    (dict(rpc_timeout_s=-1.0), "rpc_timeout_s must be finite"),
    (dict(address=""), "no coordinator address"),
])
def test_bad_configs_raise_before_connecting(kwargs, message):
    kw = dict(address="127.0.0.1:1", job="j", rank=0, num_layers=4)
    kw.update(kwargs)
    with pytest.raises(dynmo.InvalidArgumentError, match=message):
        dynmo.Agent(kw.pop("address"), kw.pop("job"), kw.pop("rank"), **kw)


def test_a_rank_the_coordinator_refuses_raises_its_message(coordinator):
    with pytest.raises(dynmo.UnavailableError, match=r"rank 5 outside \[0, 2\)"):
        agent(coordinator, 5, pipeline_rank=1, connect_timeout_s=3)
    with pytest.raises(dynmo.UnavailableError, match="job name 'bad job!'"):
        agent(coordinator, job="bad job!", connect_timeout_s=3)


@pytest.mark.parametrize("address", ["127.0.0.1:1", "not an address"])
def test_an_unreachable_coordinator(address):
    a = dynmo.Agent(address, "j", 0, num_layers=4)
    assert not a.wait_connected(0.2)
    a.report(0, [(0, 0.1)])  # queued; training never waits on the network
    a.stop()
    with pytest.raises(dynmo.UnavailableError, match="cannot reach the DynMo coordinator") as e:
        dynmo.Agent(address, "j", 0, num_layers=4, connect_timeout_s=0.3)
    assert isinstance(e.value, ConnectionError)


def test_tls_and_token_errors(tmp_path):
    with pytest.raises(dynmo.NotFoundError, match="cannot read TLS CA"):
        dynmo.Agent("127.0.0.1:1", "j", 0, num_layers=4, tls_ca=str(tmp_path / "none.pem"))
    with pytest.raises(dynmo.InvalidArgumentError, match="needs --tls_ca"):
        dynmo.Agent("127.0.0.1:1", "j", 0, num_layers=4, tls_cert=str(tmp_path / "c.pem"))
    with pytest.raises(dynmo.NotFoundError):
        dynmo.Agent("127.0.0.1:1", "j", 0, num_layers=4, token_file=str(tmp_path / "none"))
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(dynmo.InvalidArgumentError, match="is empty"):
        dynmo.Agent("127.0.0.1:1", "j", 0, num_layers=4, token_file=str(empty))
    with pytest.raises(ValueError, match="not both"):
        dynmo.Agent("127.0.0.1:1", "j", 0, num_layers=4, token="t", token_file=str(empty))
    with pytest.raises(ValueError, match="planned_iterations must be >= 0"):
        dynmo.Agent("127.0.0.1:1", "j", 0, num_layers=4, planned_iterations=-1)


def test_a_secured_coordinator_wants_the_token(tmp_path, bin_dir):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with dynmo.LocalCoordinator([f"--token_file={token}"],
                                binary=os.path.join(bin_dir, "dynmo-coordinator")) as c:
        with pytest.raises(dynmo.UnavailableError):
            dynmo.Agent(c.address, "j", 0, num_layers=4, connect_timeout_s=2)
        with dynmo.Agent(c.address, "j", 0, num_layers=4, token_file=str(token),
                         connect_timeout_s=20) as a:
            assert a.stats().connected
        with pytest.raises(dynmo.PermissionDeniedError):
            dynmo.set_policy(c.address, "j", trigger="every:3")
        dynmo.set_policy(c.address, "j", trigger="every:3", token="s3cret")


def test_set_policy(coordinator):
    with agent(coordinator, job="policy"):
        dynmo.set_policy(coordinator.address, "policy", balancer="optimal", trigger="every:4")
        dynmo.set_policy(coordinator.address, "policy", repack=True, elastic="reshape")
        with pytest.raises(dynmo.InvalidArgumentError, match="elastic must be release or reshape"):
            dynmo.set_policy(coordinator.address, "policy", elastic="grow")
        with pytest.raises(dynmo.InvalidArgumentError, match="unknown trigger 'sometimes'"):
            dynmo.set_policy(coordinator.address, "policy", trigger="sometimes")
        with pytest.raises(dynmo.NotFoundError, match="no job named 'other'"):
            dynmo.set_policy(coordinator.address, "other", trigger="every:4", patience_s=0.1)
        with pytest.raises(dynmo.InvalidArgumentError, match="patience_s"):
            dynmo.set_policy(coordinator.address, "policy", patience_s=-1)


def test_local_coordinator_errors(tmp_path, monkeypatch):
    import dynmo.coordinator
    monkeypatch.delenv("DYNMO_BIN_DIR", raising=False)
    monkeypatch.setenv("DYNMO_COORDINATOR", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(dynmo.coordinator, "__file__", str(tmp_path / "a" / "b" / "x.py"))
    with pytest.raises(dynmo.NotFoundError, match="dynmo-coordinator not found"):
        dynmo.find_coordinator_binary()
    bad = tmp_path / "fails"
    bad.write_text("#!/bin/sh\necho 'no such flag' >&2\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(dynmo.UnavailableError, match="no such flag"):
        dynmo.LocalCoordinator(binary=str(bad), start_timeout_s=5)


def test_the_embedded_coordinators_log_is_kept_where_asked(tmp_path, bin_dir, monkeypatch):
    kept = tmp_path / "coordinator.log"
    monkeypatch.setenv("DYNMO_COORDINATOR_LOG", str(kept))
    with dynmo.LocalCoordinator(binary=os.path.join(bin_dir, "dynmo-coordinator")) as c:
        assert c.port > 0
    assert "event=listening" in kept.read_text()  # still there after stop()
    monkeypatch.setenv("DYNMO_COORDINATOR_LOG", str(tmp_path / "no" / "such" / "dir.log"))
    with pytest.raises(ValueError, match="dynmo-coordinator log .*dir.log: No such file"):
        dynmo.LocalCoordinator(binary=os.path.join(bin_dir, "dynmo-coordinator"))


def test_the_probe_cadence_both_trainers_share():
    from dynmo import _core
    start = _core.ProbeCadence(every=5, steady_every=25, watch_probes=4, start_probes=3)
    assert [i for i in range(40) if start.should_probe(i, 0.5, False)] == [0, 1, 2, 7, 32]
    c = _core.ProbeCadence(every=5, steady_every=25, watch_probes=4, start_probes=0)
    steady = [i for i in range(100) if c.should_probe(i, 0.5, False)]
    assert steady == [0, 5, 10, 15, 40, 65, 90]
    assert not c.watching
    # The rank slows to half speed at 103: probed at once, then watched.
    throttled = [i for i in range(100, 160)
                 if c.should_probe(i, 0.5 if i < 103 else 1.0, False)]
    assert throttled == [104, 109, 114, 119, 144]
    # A plan that gives the rank more layers starts no watch.
    moved = [i for i in range(160, 200) if c.should_probe(i, 2.0, i == 160)]
    assert moved == [169, 194]
    assert _core.ProbeCadence(every=0, steady_every=0).should_probe(0, 1.0, False) is False
    with pytest.raises(ValueError, match="steady_every must be >= every"):
        _core.ProbeCadence(every=5, steady_every=2)
    with pytest.raises(ValueError, match="smoothing must be in"):
        _core.ProbeCadence(smoothing=0)
    with pytest.raises(ValueError, match="start_probes must be >= 0"):
        _core.ProbeCadence(start_probes=-1)
