"""A 2-rank dynmo.pipelining job (CPU, Gloo) killed with SIGKILL in the
middle of a migration, inside a checkpoint's save and in a layer's forward,
each time restarted from its newest complete checkpoint (once at another
split than the saved one): every loss of every launch and the final weights
equal an uninterrupted run's, each restart loads the newest complete
checkpoint and never the half-written one beside it, and the surviving rank
of each killed launch ends by itself (Gloo's and the migration's bounded
waits). The kill points are fixed; kill_restart.py draws them at random for
the long form (bench/kill_restart.sh). No test here decides on a measured
time: the harness's grace period only catches a hang."""
import tempfile

import pytest

pytest.importorskip("torch")

import kill_restart  # noqa: E402

CHOSEN = [
    # Saves at 3 and 7 are complete; the plan of iteration 6 moves layers.
    {"kill": {"where": "migration", "iteration": 6, "rank": 1, "call": 2}},
    # From step-3: rank 0 dies after the sidecar of step 11, before the
    # rename: .step-11.partial holds every byte and must not be loaded.
    {"kill": {"where": "save_sidecar", "iteration": 11, "rank": 0}},
    # From step-7, at another split than the saved one, into iteration 13.
    {"kill": {"where": "forward", "iteration": 13, "rank": 0, "call": 3},
     "boundaries": [0, 4, 6]},
]


def test_a_job_killed_anywhere_resumes_from_its_last_complete_checkpoint_identically():
    with tempfile.TemporaryDirectory() as work:
        summary = kill_restart.run(0, seed=0, work=work, chosen=CHOSEN)
    assert summary["violations"] == []
    launches = summary["launches"]
    assert [l["resumed_from"] for l in launches] == [None, "step-3", "step-7", "step-11"]
    assert ".step-11.partial" in launches[2]["partial_before"]
    assert all(-9 in l["returncodes"] and not l["stuck"] for l in launches[:3])
    assert launches[-1]["returncodes"] == [0, 0] and launches[-1]["iterations"][-1] == 15
