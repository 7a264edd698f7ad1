"""Shared fixtures of the dynmo Python suites (run by ctest with PYTHONPATH
at build/python and DYNMO_BIN_DIR / DYNMO_SOURCE_DIR set; see
python/CMakeLists.txt)."""
import os

import pytest


def _dir(var, fallback):
    return os.environ.get(var) or os.path.abspath(os.path.join(os.path.dirname(__file__),
                                                               *fallback))


SOURCE_DIR = _dir("DYNMO_SOURCE_DIR", ["..", ".."])
BIN_DIR = _dir("DYNMO_BIN_DIR", ["..", "..", "build", "bin"])


@pytest.fixture
def bin_dir():
    return BIN_DIR


@pytest.fixture
def source_dir():
    return SOURCE_DIR


@pytest.fixture
def coordinator():
    """A dynmo-coordinator on loopback that decides every 2 iterations."""
    import dynmo
    c = dynmo.LocalCoordinator(["--trigger=every:2", "--plan_lead_iterations=4"],
                               binary=os.path.join(BIN_DIR, "dynmo-coordinator"))
    yield c
    c.stop()


def spawn_ranks(fn, make_args, nprocs, attempts=3):
    """``torch.multiprocessing.spawn(fn, args=make_args(attempt), ...)``,
    started again with a fresh rendezvous (``make_args`` gets the attempt
    number) only when Gloo's own connection set-up inside
    ``init_process_group`` failed — a port of a test running beside this
    one under ``ctest -j``, not this test's code; any other failure is
    raised at once."""
    import torch.multiprocessing as mp
    for attempt in range(attempts):
        try:
            mp.spawn(fn, args=make_args(attempt), nprocs=nprocs, join=True)
            return
        except mp.ProcessRaisedException as e:
            text = str(e)
            if (attempt + 1 == attempts or "connectFullMesh failed" not in text
                    or "init_process_group" not in text):
                raise


def run_ranks(fn, cfg, nprocs):
    """``fn(rank, nprocs, init_file, out_dir, cfg)`` on ``nprocs`` spawned
    ranks (``spawn_ranks``, each attempt in a fresh directory); the records
    the ranks wrote to ``out_dir/rank<r>.json``, by rank."""
    import json
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        dirs = []

        def args(attempt):
            dirs.append(os.path.join(root, str(attempt)))
            os.makedirs(dirs[-1])
            return (nprocs, os.path.join(dirs[-1], "init"), dirs[-1], cfg)

        spawn_ranks(fn, args, nprocs)
        return [json.load(open(os.path.join(dirs[-1], f"rank{r}.json")))
                for r in range(nprocs)]
