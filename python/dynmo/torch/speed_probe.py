"""The speed probe: a fixed piece of work a rank times like its layers.

A throttled GPU, a noisy neighbour or an older card takes longer for the
same kernel, and so for every layer it holds. Reporting the probe's time
(``Agent.report(..., probe_s=...)``) lets the coordinator price layers at
speed 1 and each rank at its own speed (coordinator/core/rank_speed.h),
instead of taking a slow rank's layers for heavy ones. The work is a chain
of products of one seeded matrix, as dynmo-train's ``--speed_probe_every``
runs it: 192 of 128 x 128 on CPU (~8 ms: longer than the scheduler's time
slice, or a core shared with another process would go unseen), 16 of
1024 x 1024 on CUDA; timed with events there (one synchronisation), with
the wall clock on CPU.
"""
import time
from typing import Dict, Optional

import torch

_CPU = (128, 192)   # size, products
_CUDA = (1024, 16)
_operands: Dict[str, torch.Tensor] = {}


def speed_probe(device: Optional[torch.device] = None) -> float:
    """Runs the probe once on ``device`` (default CPU); returns its seconds."""
    device = torch.device(device or "cpu")
    size, products = _CUDA if device.type == "cuda" else _CPU
    key = str(device)
    if key not in _operands:
        gen = torch.Generator().manual_seed(1234)  # apart from the model's streams
        a = (torch.randn(size, size, generator=gen) / size ** 0.5).to(device)
        _operands[key] = a
        torch.mm(a, a)  # untimed: first-call allocation and kernel choice
    a = _operands[key]
    with torch.no_grad():
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            x = a
            for _ in range(products):
                x = torch.mm(x, a)
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1000.0
        t0 = time.perf_counter()
        x = a
        for _ in range(products):
            x = torch.mm(x, a)
        return time.perf_counter() - t0
