"""``LayerTimer``: per-module forward and backward time from hooks.

    timer = LayerTimer()                    # CUDA events if on a GPU
    timer.attach({layer_id: module, ...})   # (re-)attach after a plan
    ...forward and backward passes of an iteration...
    t = timer.collect()                     # {layer_id: LayerTiming}; resets

Forward time runs from the module's forward pre-hook to its forward hook;
backward time from the moment autograd has the gradient of the module's
output to the moment it has the gradient of its input (tensor hooks the
forward hooks register: no module backward hooks, which would turn the
outputs into views that ``torch.distributed.pipelining``'s split backward
cannot detach), so it covers input and weight gradients (reported as
``bwd_s``), or only the input gradient when a zero-bubble schedule defers
the weight gradient. The input is the first tensor needing a gradient
among the module's arguments, positional or keyword; the output the first
of its result (a tensor, or a tuple, list or dict of them: a Hugging Face
``ModelOutput`` is one). Several micro-batches add up;
``LayerTiming.calls`` says how many. On a GPU the hooks record CUDA events,
read without blocking once the device has passed them (``take`` an
iteration's marks, ``timings`` when ``clock.done``: the per-iteration path
never waits on the device; ``collect`` waits, for callers outside the
loop); on the CPU they read ``time.perf_counter_ns``. Optionally the bytes
the autograd graph saves during a module's forward (its stashed
activations) are counted with ``torch.autograd.graph.saved_tensors_hooks``.

A module whose input needs no gradient (an embedding fed token ids) has no
backward end to observe; its backward time reads zero. Not thread-safe: the training thread.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn


@dataclasses.dataclass
class LayerTiming:
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    calls: int = 0  # forward passes (micro-batches) measured
    activation_bytes: int = 0  # saved for backward, summed over calls


class _CpuClock:
    """The host's monotonic clock: a mark is read when it is taken."""

    def mark(self):
        return time.perf_counter_ns()

    def done(self, mark) -> bool:
        return True

    def wait(self, mark) -> None:
        pass

    def seconds(self, pairs: List[Tuple[object, object]]) -> List[float]:
        return [(b - a) * 1e-9 for a, b in pairs]


class _CudaClock:
    """CUDA events on the current stream: a mark is known once the device
    has passed it. ``done`` asks without blocking (``Event.query``);
    ``seconds`` reads only marks that are done."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(self.device))
        return e

    def done(self, mark) -> bool:
        return mark.query()

    def wait(self, mark) -> None:
        # host-sync(event): only for a caller that asks for its timings now
        # (LayerTimer.collect) or a host more than CostMeter.MAX_LAG
        # iterations ahead; waits for that mark, not for the device's queue.
        mark.synchronize()

    def seconds(self, pairs: List[Tuple[object, object]]) -> List[float]:
        # host-sync(event): elapsed_time of events already done (query()
        # returned True or wait() returned): no wait on the device.
        return [a.elapsed_time(b) * 1e-3 for a, b in pairs]


@dataclasses.dataclass
class Marks:
    """One iteration's raw marks (``LayerTimer.take``), read later."""

    fwd: Dict[int, List[Tuple[object, object]]]
    bwd: Dict[int, List[Tuple[object, object]]]
    saved: Dict[int, int]
    latest: object = None  # the last mark taken: done means all are
    extra: List[tuple] = dataclasses.field(default_factory=list)  # a caller's own pairs
    iteration: int = -1


class LayerTimer:
    """Times the modules it is attached to, per layer id."""

    def __init__(self, device: Optional[torch.device] = None,
                 measure_activations: bool = True, clock: Optional[object] = None) -> None:
        device = torch.device(device) if device is not None else torch.device("cpu")
        # mark() / done(m) / wait(m) / seconds(pairs); public so other work
        # can be timed alike (and a test can give a clock of its own).
        self.clock = clock if clock is not None else (
            _CudaClock(device) if device.type == "cuda" else _CpuClock())
        # Counting saved bytes runs a Python hook per saved tensor; a caller
        # may switch it off between samples (dynmo.pipelining does).
        self.measure_activations = measure_activations
        self._handles: List[torch.utils.hooks.RemovableHandle] = []
        self._reset()

    def _reset(self) -> None:
        self._fwd: Dict[int, List[Tuple[object, object]]] = {}
        self._bwd: Dict[int, List[Tuple[object, object]]] = {}
        self._open_fwd: Dict[int, List[object]] = {}
        self._open_bwd: Dict[int, List[object]] = {}
        self._saved: Dict[int, int] = {}
        self._saving: Dict[int, List[object]] = {}
        self._latest: object = None

    def attach(self, modules: Mapping[int, Union[nn.Module, Sequence[nn.Module]]]) -> None:
        """Times exactly these modules from now on (drops earlier ones). A
        layer made of several modules run in sequence (a final norm and the
        output head) is given as their list: its time runs from the first
        one's forward pre-hook to the last one's forward hook, and back."""
        self.detach()
        for layer, module in modules.items():
            parts = [module] if isinstance(module, nn.Module) else list(module)
            head, tail = parts[0], parts[-1]
            self._handles += [
                head.register_forward_pre_hook(self._fwd_pre(layer), with_kwargs=True),
                tail.register_forward_hook(self._fwd_post(layer), with_kwargs=True),
            ]

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def mark(self):
        """A mark of the timer's clock (tracked: ``take`` knows the latest)."""
        m = self.clock.mark()
        self._latest = m
        return m

    def take(self) -> Marks:
        """The marks since the last ``take`` (nothing read); starts anew."""
        out = Marks(self._fwd, self._bwd, self._saved, self._latest)
        self._reset()
        return out

    def timings(self, marks: Marks) -> Dict[int, LayerTiming]:
        """The totals of ``marks`` per layer id; the clock must be ``done``
        with ``marks.latest``."""
        out: Dict[int, LayerTiming] = {}
        for table, field in ((marks.fwd, "fwd_s"), (marks.bwd, "bwd_s")):
            for layer, pairs in table.items():
                t = out.setdefault(layer, LayerTiming())
                setattr(t, field, sum(self.clock.seconds(pairs)))
                if field == "fwd_s":
                    t.calls = len(pairs)
        for layer, saved in marks.saved.items():
            out.setdefault(layer, LayerTiming()).activation_bytes = saved
        return out

    def collect(self) -> Dict[int, LayerTiming]:
        """The totals since the last collect, per layer id; starts anew. On a
        GPU it waits for the last mark: per-iteration code reads lagged
        (``take``, then ``timings`` once ``clock.done``), as CostMeter does."""
        marks = self.take()
        if marks.latest is not None:
            self.clock.wait(marks.latest)
        return self.timings(marks)

    # ---- hooks -------------------------------------------------------------

    def _fwd_pre(self, layer: int):
        def hook(module, args, kwargs):
            if torch.is_grad_enabled():
                # This call's backward ends when the gradient of its input is
                # known; it starts when its output's is (see _fwd_post). The
                # input is the first tensor that needs a gradient, passed by
                # position or by keyword (``layer(hidden_states=h, ...)``).
                slot = {"start": None, "done": False}
                self._open_bwd.setdefault(layer, []).append(slot)
                for t in _tensors((args, kwargs)):
                    if t.requires_grad:
                        t.register_hook(self._bwd_end(layer, slot))
                        break
            if self.measure_activations and torch.is_grad_enabled():
                ctx = torch.autograd.graph.saved_tensors_hooks(self._pack(layer), _unpack)
                ctx.__enter__()
                self._saving.setdefault(layer, []).append(ctx)
            self._open_fwd.setdefault(layer, []).append(self.mark())
        return hook

    def _fwd_post(self, layer: int):
        def hook(module, args, kwargs, output):
            start = self._open_fwd[layer].pop()
            self._fwd.setdefault(layer, []).append((start, self.mark()))
            if self._saving.get(layer):
                self._saving[layer].pop().__exit__(None, None, None)
            if torch.is_grad_enabled() and self._open_bwd.get(layer):
                slot = self._open_bwd[layer].pop()
                for t in _tensors(output):
                    if t.requires_grad:
                        t.register_hook(self._bwd_start(slot))
                        break
        return hook

    def _bwd_start(self, slot):
        def hook(grad):
            if slot["start"] is None:
                slot["start"] = self.mark()
        return hook

    def _bwd_end(self, layer: int, slot):
        def hook(grad):
            if slot["start"] is not None and not slot["done"]:
                slot["done"] = True
                self._bwd.setdefault(layer, []).append((slot["start"], self.mark()))
        return hook

    def _pack(self, layer: int):
        def pack(t: torch.Tensor):
            self._saved[layer] = self._saved.get(layer, 0) + t.numel() * t.element_size()
            return t
        return pack


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _tensors(value) -> List[torch.Tensor]:
    """The tensors of a module's arguments or output, in order: a tensor, or
    tuples, lists and dicts of them at any depth (keyword arguments; a
    Hugging Face ``ModelOutput`` is a dict)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []
