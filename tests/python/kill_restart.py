"""Kill -9 and restart a 2-rank dynmo.pipelining job until it finishes.

Each launch starts two ranks of kill_restart_worker.py by hand (env://
rendezvous, each rank in its own process group), resuming from the newest
complete checkpoint. A launch told to kill has one rank SIGKILL itself at
the chosen point (a layer's forward, a migration's batch, inside a save);
the survivor must end by itself within the job's bounded waits (Gloo's
process-group timeout, ``migration_timeout_s``), else its process group is
killed after ``grace_s`` and that is a violation. Every launch's losses and the
last launch's final weights are compared with one uninterrupted run's.

    python kill_restart.py --kills 12 --seed 1 [--timed] [--json out.json]

The kinds of kill come round in turn (each once per round, in a seeded
order); ``--timed`` adds one more kind, a SIGKILL from outside 0-2 s after
both ranks loaded (the point it lands on is wherever the rank was).
test_kill_restart.py runs a few fixed kills; bench/kill_restart.sh the long
form. Violations (a loss or weight that differs, a half-written checkpoint
loaded, a rank that did not end by itself within ``grace_s`` of its peer's
death) are listed in the summary's ``violations``: empty means the
guarantees held.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "kill_restart_worker.py")

JOB = dict(steps=16, save_every=4, plan_every=3, timeout_s=5,
           initial=[0, 3, 6], splits=[[0, 3, 6], [0, 1, 6], [0, 5, 6], [0, 2, 6]])
# Splits a restart may resume at instead of the checkpoint's own.
OTHER_SPLITS = [[0, 4, 6], [0, 2, 6], [0, 3, 6]]
POINTS = ("forward", "migration", "save", "boundary")
SAVE_POINTS = ("save_begin", "save_written", "save_sidecar")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _complete(root):
    """The complete checkpoints under root (step-k names), oldest first."""
    names = os.listdir(root) if os.path.isdir(root) else []
    return sorted((n for n in names if n.startswith("step-")),
                  key=lambda n: int(n.split("-")[1]))


def _partial(root):
    return sorted(n for n in os.listdir(root) if n.endswith(".partial")) \
        if os.path.isdir(root) else []


def _saved_split(root, name):
    with open(os.path.join(root, name, "dynmo.json")) as f:
        return json.load(f)["boundaries"]


def _read(out_dir):
    """rank -> its event lines (a killed rank's last line may be cut)."""
    records = {}
    for r in range(2):
        lines = []
        path = os.path.join(out_dir, f"rank{r}.jsonl")
        if os.path.exists(path):
            for line in open(path):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass
        records[r] = lines
    return records


def launch(cfg, out_dir, grace_s, kill_after_s=None, victim=None):
    """Runs one launch of the job; returns what happened to its ranks."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(cfg, out=out_dir)
    port = _free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2", PYTHONUNBUFFERED="1")
    procs = []
    for r in range(2):
        log = open(os.path.join(out_dir, f"rank{r}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, WORKER, json.dumps(cfg)],
                                      env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                      stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    start = time.monotonic()
    died_at, training_since = None, None
    timed_kill = kill_after_s is not None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if timed_kill and training_since is None and \
                all(e for e in _read(out_dir).values()):  # both ranks wrote "loaded"
            training_since = now
        if timed_kill and training_since is not None and \
                now - training_since >= kill_after_s and procs[victim].poll() is None:
            procs[victim].send_signal(signal.SIGKILL)
            timed_kill = False
        if died_at is None and any(p.poll() is not None and p.returncode != 0 for p in procs):
            died_at = now
        if died_at is not None and now - died_at > grace_s:
            break
        if now - start > 600:
            break
        time.sleep(0.05)
    stuck = [r for r, p in enumerate(procs) if p.poll() is None]
    for r in stuck:
        os.killpg(procs[r].pid, signal.SIGKILL)
        procs[r].wait()
    return {"returncodes": [p.returncode for p in procs], "stuck": stuck,
            "survivor_s": None if died_at is None else round(time.monotonic() - died_at, 2),
            "wall_s": round(time.monotonic() - start, 2)}


def _losses(records):
    """iteration -> the last stage's micro-batch losses (rank 1: pp 2, 1F1B)."""
    return {e["it"]: e["losses"] for e in records[1] if "it" in e}


def _weights(records):
    """layer -> the sum of its final parameters, whichever rank held it."""
    return {k: v for r in range(2) for e in records[r] if "weights" in e
            for k, v in e["weights"].items()}


def _moving_plans(first, split, job):
    """The plan iterations at or after ``first`` that move layers, for a
    launch that starts at ``split``."""
    out = []
    for k in range(max(first, 1), job["steps"]):
        if k % job["plan_every"] == 0:
            target = job["splits"][(k // job["plan_every"]) % len(job["splits"])]
            if target != split:
                out.append(k)
            split = target
    return out


def _kill_point(rng, first, split, job, where):
    """A kill point of kind ``where`` in the few iterations after ``first``
    (a checkpoint's worth and two more; a layer's forward when none of them
    has that kind)."""
    steps = min(job["steps"], first + job["save_every"] + 2)
    plans = [k for k in _moving_plans(first, split, job) if k < steps]
    saves = [k for k in range(first, steps) if (k + 1) % job["save_every"] == 0]
    if where == "save":  # one kind among the others, its three points among it
        where = rng.choice(SAVE_POINTS)
    if where == "migration" and plans:
        return {"where": where, "iteration": rng.choice(plans), "rank": rng.randrange(2),
                "call": rng.randint(1, 3)}
    if where.startswith("save_") and saves:
        return {"where": where, "iteration": rng.choice(saves),
                "rank": 0 if where == "save_sidecar" else rng.randrange(2)}
    if where == "boundary":
        return {"where": where, "iteration": rng.randrange(first, steps),
                "rank": rng.randrange(2)}
    # A rank holds one layer at least, so it runs two forwards an iteration
    # (two micro-batches).
    return {"where": "forward", "iteration": rng.randrange(first, steps),
            "rank": rng.randrange(2), "call": rng.randint(1, 2)}


def run(kills, seed, work, points=POINTS, timed=False, grace_s=30.0, chosen=None, steps=None):
    """The reference run, then launches with ``kills`` kills and one to finish;
    returns the summary (``violations`` empty when every guarantee held).
    ``chosen``: the kills as given instead of drawn, in order, each
    {"kill": point, "boundaries": a split to resume at (optional)}.
    ``steps``: the job's iterations (JOB's by default)."""
    if chosen is not None:
        kills = len(chosen)
    job = dict(JOB, steps=steps or JOB["steps"])
    rng = random.Random(seed)
    ref_root = os.path.join(work, "reference")
    ref = launch(dict(job, root=os.path.join(ref_root, "ckpt")), ref_root, grace_s)
    ref_records = _read(ref_root)
    reference = _losses(ref_records)
    ref_weights = _weights(ref_records)
    violations = []
    if ref["returncodes"] != [0, 0] or len(reference) != job["steps"]:
        return {"violations": [f"the uninterrupted run failed: {ref}"]}
    root = os.path.join(work, "ckpt")
    launches, n, order = [], 0, []
    while True:
        n += 1
        newest = _complete(root)
        first = int(newest[-1].split("-")[1]) + 1 if newest else 0
        cfg = dict(job, root=root)
        if newest and rng.random() < 0.3:  # resume at another split than the saved one
            cfg["boundaries"] = rng.choice(OTHER_SPLITS)
        kill, kill_after_s, victim = None, None, None
        if chosen is not None and len(launches) < kills:
            kill = cfg["kill"] = chosen[len(launches)]["kill"]
            cfg.pop("boundaries", None)
            if "boundaries" in chosen[len(launches)]:
                cfg["boundaries"] = chosen[len(launches)]["boundaries"]
        elif len(launches) < kills and first < job["steps"]:
            if not order:  # every kind once per round, in a seeded order
                kinds = list(points) + (["timed"] if timed else [])
                order = rng.sample(kinds, len(kinds))
            where = order.pop()
            if where == "timed":
                victim, kill_after_s = rng.randrange(2), round(rng.uniform(0.0, 2.0), 2)
                kill = {"where": "timed", "after_s": kill_after_s, "rank": victim}
            else:
                split = cfg.get("boundaries") or (_saved_split(root, newest[-1]) if newest
                                                  else job["initial"])
                kill = _kill_point(rng, first, split, job, where)
                cfg["kill"] = kill
        out_dir = os.path.join(work, f"launch{n}")
        partial_before = _partial(root)
        result = launch(cfg, out_dir, grace_s, kill_after_s, victim)
        records = _read(out_dir)
        entry = dict(result, kill=kill, resumed_from=newest[-1] if newest else None,
                     boundaries=cfg.get("boundaries"), first=first,
                     partial_before=partial_before, partial_after=_partial(root))
        loaded = [e for r in range(2) for e in records[r] if "loaded" in e]
        for e in loaded:
            want = os.path.join(root, newest[-1]) if newest else None
            if e["loaded"] != want:
                violations.append(f"launch {n} loaded {e['loaded']}, not the newest complete "
                                  f"checkpoint {want}")
        got = _losses(records)
        entry["iterations"] = sorted(got)
        for k, v in got.items():
            if reference.get(k) != v:
                violations.append(f"launch {n} iteration {k}: losses {v} != {reference.get(k)}")
        if result["stuck"]:
            violations.append(f"launch {n}: rank(s) {result['stuck']} did not end within "
                              f"{grace_s} s of the kill")
        launches.append(entry)
        if result["returncodes"] == [0, 0]:  # the job finished
            if _weights(records) != ref_weights:
                violations.append(f"launch {n}: final weights differ from the "
                                  f"uninterrupted run's")
            if kill is not None and kill["where"] != "timed":
                violations.append(f"launch {n}: kill {kill} never fired")
            break
        if kill is None or n > kills + 3:
            violations.append(f"launch {n} failed: {result}")
            break
    return {"seed": seed, "kills": sum(1 for l in launches if l["kill"]),
            "launches": launches, "reference_wall_s": ref["wall_s"],
            "violations": violations}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=12)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help=f"iterations (default {JOB['steps']})")
    p.add_argument("--timed", action="store_true", help="also kill at random wall times")
    p.add_argument("--json", default=None, help="write the summary here")
    p.add_argument("--keep", default=None, help="work directory to keep (default: temporary)")
    args = p.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix="dynmo-kill-")
    try:
        summary = run(args.kills, args.seed, work, timed=args.timed, steps=args.steps)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "launches"}))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
