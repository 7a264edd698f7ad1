"""dynmo.pipelining on CPU over Gloo: a torch.distributed.pipelining job
re-split live. Every run is compared with the static run of the same
model and data: the losses of every micro-batch and the final weights of
every layer must be bit-identical wherever the layers went."""
import json
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.multiprocessing as mp  # noqa: E402

import pipelining_workers as w  # noqa: E402


def run(cfg, world):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(w.train, args=(world, os.path.join(d, "init"), d, cfg), nprocs=world,
                 join=True)
        return [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(world)]


def losses(records):
    """(iteration, replica, micro-batch losses) of every last stage, in order."""
    return sorted(tuple((k, d, tuple(v))) for r in records for k, d, v in r["losses"])


def weights(records):
    out = {}
    for r in records:
        for layer, v in r["weights"].items():
            out.setdefault(int(layer), set()).add(v)
    return out


def same_training(a, b):
    assert losses(a) == losses(b)
    assert weights(a) == weights(b)
