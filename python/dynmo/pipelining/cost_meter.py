"""``CostMeter``: what one rank measures of its layers each iteration and
turns into the ``dynmo.LayerCost`` list its agents report.

- forward and backward seconds per layer and micro-batch (``LayerTimer``:
  host clock on the CPU, CUDA events on a GPU read once per iteration);
- weight-gradient seconds of zero-bubble schedules: each ``W`` action of a
  ``PipelineStage`` timed with the same clock (no host sync per action)
  and shared among the stage's layers in proportion to their parameter
  counts (weight-gradient work scales with the weights);
- activation bytes per layer and micro-batch, sampled: counting them runs
  a Python hook per saved tensor (~5% of a small model's step), so they are
  counted on the first iteration after each ``attach`` and then every
  ``sample_every`` iterations, and reused in between;
- resident bytes per layer (parameters, gradients, optimizer state,
  buffers) and the rank's memory in use (the caching allocator's reserved
  bytes on a GPU: cached blocks are memory the process holds).

Not thread-safe: the training thread.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch
from torch import nn

from dynmo.torch.memory import tensor_bytes
from dynmo.torch.timing import LayerTimer
from dynmo.types import LayerCost


class CostMeter:
    def __init__(self, device: torch.device, microbatches: int,
                 measure_activations: bool = True, sample_every: int = 16) -> None:
        self.device = device
        self.microbatches = microbatches
        self.sample_every = sample_every
        self.timer = LayerTimer(device, measure_activations=measure_activations)
        self._sample = measure_activations
        self._activation_bytes: Dict[int, int] = {}
        self._w_marks: List[tuple] = []  # (start, end, layer shares) per W action
        self._timings: Dict[int, Any] = {}
        self.layer_seconds: Dict[int, float] = {}  # the last iteration's, per layer
        self.weight_gradient_seconds: Dict[int, float] = {}
        self.forward_seconds: Dict[int, float] = {}

    def attach(self, layers: Dict[int, Sequence[nn.Module]],
               weight_stages: Sequence[Tuple[Any, Sequence[int]]] = ()) -> None:
        """Times these layers (id -> its modules) from now on, and the W
        actions of each (PipelineStage, its layer ids) given."""
        self.timer.attach({i: m[0] if len(m) == 1 else list(m) for i, m in layers.items()})
        self._activation_bytes = {}  # the layers changed: sample anew
        for stage, ids in weight_stages:
            sizes = {i: sum(p.numel() for m in layers[i] for p in m.parameters()) for i in ids}
            total = float(sum(sizes.values())) or 1.0
            self._time_weight_actions(stage, [(i, sizes[i] / total) for i in ids])

    def detach(self) -> None:
        self.timer.detach()

    def begin(self, iteration: int) -> None:
        self.timer.measure_activations = self._sample and (
            not self._activation_bytes or iteration % self.sample_every == 0)

    def end(self) -> None:
        """Reads the iteration's clocks (one sync on a GPU)."""
        self._timings = self.timer.collect()
        marks, self._w_marks = self._w_marks, []
        w: Dict[int, float] = {}
        if marks:
            seconds = self.timer.clock.seconds([(a, b) for a, b, _ in marks])
            for spent, (_, _, shares) in zip(seconds, marks):
                for layer, share in shares:
                    w[layer] = w.get(layer, 0.0) + spent * share
        self.weight_gradient_seconds = w
        self.forward_seconds = {i: t.fwd_s for i, t in self._timings.items()}
        self.layer_seconds = {i: t.fwd_s + t.bwd_s + w.get(i, 0.0)
                              for i, t in self._timings.items()}
        if self.timer.measure_activations:
            self._activation_bytes = {i: t.activation_bytes // self.microbatches
                                      for i, t in self._timings.items()}

    def costs(self, layers: Sequence[int], held: Dict[int, Sequence[nn.Module]],
              optimizer: torch.optim.Optimizer) -> List[LayerCost]:
        """The last iteration's cost of each of ``layers``, per micro-batch."""
        m = self.microbatches
        out = []
        for layer in layers:
            t = self._timings.get(layer)
            out.append(LayerCost(
                layer=layer, fwd_s=t.fwd_s / m if t else 0.0,
                bwd_s=t.bwd_s / m if t else 0.0,
                wgrad_s=self.weight_gradient_seconds.get(layer, 0.0) / m,
                params=sum(p.numel() for mod in held[layer] for p in mod.parameters()),
                resident_bytes=_resident(held[layer], optimizer),
                activation_bytes=self._activation_bytes.get(layer, 0)))
        return out

    @staticmethod
    def memory_used(costs: Sequence[LayerCost]) -> int:
        """A CPU rank's memory in use: its layers' bytes. (A GPU rank reports
        what its device says, ``dynmo.torch.memory.device_memory``.)"""
        return sum(c.resident_bytes for c in costs)

    def _time_weight_actions(self, stage: Any, shares: List[Tuple[int, float]]) -> None:
        inner = stage.backward_weight_one_chunk
        clock = self.timer.clock

        def timed(*args, **kwargs):
            start = clock.mark()
            out = inner(*args, **kwargs)
            self._w_marks.append((start, clock.mark(), shares))
            return out

        stage.backward_weight_one_chunk = timed


def _resident(modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer) -> int:
    total = 0
    for m in modules:
        for p in m.parameters():
            total += tensor_bytes(p)
            if p.grad is not None:
                total += tensor_bytes(p.grad)
            for v in optimizer.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    total += tensor_bytes(v)
        for b in m.buffers():
            total += tensor_bytes(b)
    return total
