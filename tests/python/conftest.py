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
