"""The speed probe: a fixed piece of work a rank times like its layers.

A throttled GPU, a noisy neighbour or an older card takes longer for the
same kernel, and so for every layer it holds. Reporting the probe's time
(``Agent.report(..., probe_s=...)``) lets the coordinator price layers at
speed 1 and each rank at its own speed (coordinator/core/rank_speed.h),
instead of taking a slow rank's layers for heavy ones. The work is eight
products of one seeded 128 x 128 matrix on the rank's device, as
dynmo-train's ``--speed_probe_every`` runs it; on CUDA it is timed with
events (one synchronisation), on CPU with the wall clock.
"""
import time
from typing import Dict, Optional

import torch

_SIZE = 128
_PRODUCTS = 8
_operands: Dict[str, torch.Tensor] = {}


def speed_probe(device: Optional[torch.device] = None) -> float:
    """Runs the probe once on ``device`` (default CPU); returns its seconds."""
    device = torch.device(device or "cpu")
    key = str(device)
    if key not in _operands:
        gen = torch.Generator().manual_seed(1234)  # apart from the model's streams
        a = (torch.randn(_SIZE, _SIZE, generator=gen) / 16).to(device)
        _operands[key] = a
        torch.mm(a, a)  # untimed: first-call allocation and kernel choice
    a = _operands[key]
    with torch.no_grad():
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            x = a
            for _ in range(_PRODUCTS):
                x = torch.mm(x, a)
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1000.0
        t0 = time.perf_counter()
        x = a
        for _ in range(_PRODUCTS):
            x = torch.mm(x, a)
        return time.perf_counter() - t0
