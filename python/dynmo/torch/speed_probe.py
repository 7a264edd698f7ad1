"""The speed probe: a fixed piece of work a rank times like its layers.

A throttled GPU, a noisy neighbour or an older card takes longer for the
same kernel, and so for every layer it holds. Reporting the probe's time
(``Agent.report(..., probe_s=...)``) lets the coordinator price layers at
speed 1 and each rank at its own speed (core/rank_speed.h),
instead of taking a slow rank's layers for heavy ones. The work is a chain
of products of one seeded matrix, as dynmo-train's ``--speed_probe_every``
runs it: 192 of 128 x 128 on CPU (~8 ms: longer than the scheduler's time
slice, or a core shared with another process would go unseen), 16 of
1024 x 1024 on CUDA; timed with events there, with the wall clock on CPU.

``launch_probe(device)`` queues the probe and returns a ``PendingProbe``
whose ``seconds()`` is None until the device has run it (``Event.query``:
the training loop never waits); ``speed_probe(device)`` waits for it, for
callers outside the loop.
"""
import time
from typing import Dict, Optional, Tuple

import torch

_CPU = (128, 192)   # size, products
_CUDA = (1024, 16)
_operands: Dict[str, torch.Tensor] = {}


class PendingProbe:
    """One run of the probe, read once the device has finished it."""

    def __init__(self, events: Optional[Tuple[object, object]], seconds: float = 0.0) -> None:
        self._events = events
        self._seconds = seconds

    def seconds(self) -> Optional[float]:
        """The probe's seconds, or None while the device is still behind."""
        if self._events is None:
            return self._seconds
        start, stop = self._events
        if not stop.query():
            return None
        # host-sync(event): elapsed_time of events already done (query()).
        return start.elapsed_time(stop) / 1000.0

    def wait(self) -> float:
        if self._events is not None:
            # host-sync(event): speed_probe's callers outside the loop only.
            self._events[1].synchronize()
        return self.seconds()


def _operand(device: torch.device) -> Tuple[torch.Tensor, int]:
    size, products = _CUDA if device.type == "cuda" else _CPU
    key = str(device)
    if key not in _operands:
        gen = torch.Generator().manual_seed(1234)  # apart from the model's streams
        a = (torch.randn(size, size, generator=gen) / size ** 0.5).to(device)
        _operands[key] = a
        torch.mm(a, a)  # untimed: first-call allocation and kernel choice
    return _operands[key], products


def launch_probe(device: Optional[torch.device] = None) -> PendingProbe:
    """Runs (CPU) or queues (CUDA) the probe once on ``device``."""
    device = torch.device(device or "cpu")
    a, products = _operand(device)
    with torch.no_grad():
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            x = a
            for _ in range(products):
                x = torch.mm(x, a)
            stop.record()
            return PendingProbe((start, stop))
        t0 = time.perf_counter()
        x = a
        for _ in range(products):
            x = torch.mm(x, a)
        return PendingProbe(None, time.perf_counter() - t0)


def speed_probe(device: Optional[torch.device] = None) -> float:
    """Runs the probe once on ``device`` (default CPU); returns its seconds."""
    return launch_probe(device).wait()
