"""``CostMeter``: what one rank measures of its layers each iteration and
turns into the ``dynmo.LayerCost`` list its agents report.

- forward and backward seconds per layer and micro-batch (``LayerTimer``:
  host clock on the CPU, CUDA events on a GPU);
- weight-gradient seconds of zero-bubble schedules: each ``W`` action of a
  ``PipelineStage`` timed with the same clock and shared among the stage's
  layers in proportion to their parameter counts (weight-gradient work
  scales with the weights);
- activation bytes per layer and micro-batch, sampled: counting them runs
  a Python hook per saved tensor (~5% of a small model's step), so they are
  counted on the first iteration after each ``attach`` and then every
  ``sample_every`` iterations, and reused in between;
- resident bytes per layer (parameters, a gradient per trainable
  parameter, optimizer state, buffers), computed once per ``attach`` (a
  plan) and again at the activation samples and when the optimizer's
  state set changes: they do not change between plans otherwise;
- tokens per expert of each MoE block (``routing.ExpertCounts``: the
  model's own ``tokens_per_expert`` counters, taken around each
  ``schedule.step``: ``step_begins`` / ``step_ends``), of the same
  iteration as the times.

On a GPU nothing here waits on the device: ``end`` queues the iteration's
marks and reads the newest iteration the device has finished (``query``),
so the figures lag the host by the device's queue — usually one
iteration; ``measured_iteration`` says which. Only a host more than
``MAX_LAG`` iterations ahead waits, for its oldest marks (the device then
still has ``MAX_LAG`` iterations queued and never idles). On the CPU every
iteration is read at its end.

Not thread-safe: the training thread.
"""
from __future__ import annotations

import collections
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from dynmo.pipelining.routing import ExpertCounts
from dynmo.torch.memory import resident_bytes
from dynmo.torch.timing import LayerTimer, Marks
from dynmo.types import LayerCost


class CostMeter:
    MAX_LAG = 3  # iterations the host may run ahead before a read waits

    def __init__(self, device: torch.device, microbatches: int,
                 measure_activations: bool = True, sample_every: int = 16,
                 clock: Optional[object] = None) -> None:
        self.device = device
        self.microbatches = microbatches
        self.sample_every = sample_every
        self.timer = LayerTimer(device, measure_activations=measure_activations, clock=clock)
        self._sample = measure_activations
        self._activation_bytes: Dict[int, int] = {}
        self._w_marks: List[tuple] = []  # (start, end, layer shares) per W action
        self._pending: Deque[Marks] = collections.deque()
        self._timings: Dict[int, Any] = {}
        self._static: Dict[int, Tuple[int, int]] = {}  # layer -> (params, resident bytes)
        self._static_key: Any = None
        self._iteration = -1
        self.measured_iteration = -1  # the iteration the figures below are of
        self.layer_seconds: Dict[int, float] = {}  # per layer, of measured_iteration
        self.weight_gradient_seconds: Dict[int, float] = {}
        self.forward_seconds: Dict[int, float] = {}
        self.routing = ExpertCounts()
        self._routing_taken: Dict[int, Any] = {}  # iteration -> ExpertCounts.take()
        # Per MoE layer, of measured_iteration: tokens its router sent to
        # each expert, all micro-batches.
        self.tokens_per_expert: Dict[int, Tuple[int, ...]] = {}

    def attach(self, layers: Dict[int, Sequence[nn.Module]],
               weight_stages: Sequence[Tuple[Any, Sequence[int]]] = ()) -> None:
        """Times these layers (id -> its modules) from now on, and the W
        actions of each (PipelineStage, its layer ids) given."""
        self.timer.attach({i: m[0] if len(m) == 1 else list(m) for i, m in layers.items()})
        self.routing.attach(layers)
        self._activation_bytes = {}  # the layers changed: sample anew
        self._static_key = None
        for stage, ids in weight_stages:
            sizes = {i: sum(p.numel() for m in layers[i] for p in m.parameters()) for i in ids}
            total = float(sum(sizes.values())) or 1.0
            self._time_weight_actions(stage, [(i, sizes[i] / total) for i in ids])

    def detach(self) -> None:
        self.timer.detach()
        self.routing.attach({})

    def begin(self, iteration: int) -> None:
        self._iteration = iteration
        sampling = not self._activation_bytes or iteration % self.sample_every == 0
        self.timer.measure_activations = self._sample and sampling
        if iteration % self.sample_every == 0:
            self._static_key = None  # freezing changes which gradients exist

    def end(self) -> bool:
        """Queues this iteration's marks and reads the newest iteration the
        device has finished; True when that is a newer one than before."""
        counts = self.routing.take()
        if counts is not None:
            # A mark after the counts' copy: done, it says the copy is too.
            self.timer.mark()
            self._routing_taken[self._iteration] = counts
        marks = self.timer.take()
        marks.extra, self._w_marks = self._w_marks, []
        marks.iteration = self._iteration
        if marks.latest is not None or marks.extra:
            self._pending.append(marks)
        clock = self.timer.clock
        newest = None
        while self._pending and (self._pending[0].latest is None
                                 or clock.done(self._pending[0].latest)):
            newest = self._pending.popleft()
        if newest is None and len(self._pending) > self.MAX_LAG:
            clock.wait(self._pending[0].latest)  # see the module doc: no idle device
            newest = self._pending.popleft()
        if newest is None:
            return False
        self._read(newest)
        return True

    def _read(self, marks: Marks) -> None:
        self._timings = self.timer.timings(marks)
        w: Dict[int, float] = {}
        if marks.extra:
            seconds = self.timer.clock.seconds([(a, b) for a, b, _ in marks.extra])
            for spent, (_, _, shares) in zip(seconds, marks.extra):
                for layer, share in shares:
                    w[layer] = w.get(layer, 0.0) + spent * share
        self.measured_iteration = marks.iteration
        for older in [i for i in self._routing_taken if i < marks.iteration]:
            del self._routing_taken[older]  # an iteration never read (nothing timed)
        counts = self._routing_taken.pop(marks.iteration, None)
        self.tokens_per_expert = ExpertCounts.read(counts) if counts is not None else {}
        self.weight_gradient_seconds = w
        self.forward_seconds = {i: t.fwd_s for i, t in self._timings.items()}
        self.layer_seconds = {i: t.fwd_s + t.bwd_s + w.get(i, 0.0)
                              for i, t in self._timings.items()}
        if marks.saved:
            self._activation_bytes = {i: t.activation_bytes // self.microbatches
                                      for i, t in self._timings.items()}

    def costs(self, layers: Sequence[int], held: Dict[int, Sequence[nn.Module]],
              optimizer: torch.optim.Optimizer) -> List[LayerCost]:
        """The measured iteration's cost of each of ``layers``, per micro-batch."""
        m = self.microbatches
        key = len(optimizer.state)
        if key != self._static_key:
            self._static = {}
            self._static_key = key
        out = []
        for layer in layers:
            t = self._timings.get(layer)
            if layer not in self._static:
                mods = held[layer]
                self._static[layer] = (sum(p.numel() for mod in mods for p in mod.parameters()),
                                       resident_bytes(mods, optimizer))
            params, resident = self._static[layer]
            out.append(LayerCost(
                layer=layer, fwd_s=t.fwd_s / m if t else 0.0,
                bwd_s=t.bwd_s / m if t else 0.0,
                wgrad_s=self.weight_gradient_seconds.get(layer, 0.0) / m,
                params=params, resident_bytes=resident,
                activation_bytes=self._activation_bytes.get(layer, 0)))
        return out

    @staticmethod
    def memory_used(costs: Sequence[LayerCost]) -> int:
        """A CPU rank's memory in use: its layers' bytes. (A GPU rank reports
        what its device says, ``dynmo.torch.memory.device_memory``.)"""
        return sum(c.resident_bytes for c in costs)

    def _time_weight_actions(self, stage: Any, shares: List[Tuple[int, float]]) -> None:
        inner = stage.backward_weight_one_chunk
        timer = self.timer

        def timed(*args, **kwargs):
            start = timer.mark()
            out = inner(*args, **kwargs)
            self._w_marks.append((start, timer.mark(), shares))
            return out

        stage.backward_weight_one_chunk = timed
