"""``LayerTimer``: per-module forward and backward time from hooks.

    timer = LayerTimer()                    # CUDA events if on a GPU
    timer.attach({layer_id: module, ...})   # (re-)attach after a plan
    ...forward and backward passes of an iteration...
    t = timer.collect()                     # {layer_id: LayerTiming}; resets

Forward time runs from the module's forward pre-hook to its forward hook;
backward time from its full backward pre-hook (the gradient of its output
arrived) to its full backward hook (the gradient of its input is computed),
so it covers input and weight gradients (reported as ``bwd_s``). Several
micro-batches add up; ``LayerTiming.calls`` says how many. On a GPU the
hooks record CUDA events and ``collect`` synchronises once; on the CPU they
read ``time.perf_counter_ns``. Optionally the bytes the autograd graph
saves during a module's forward (its stashed activations) are counted with
``torch.autograd.graph.saved_tensors_hooks``.

A module whose input needs no gradient (an embedding fed token ids) gets its
backward hook as soon as its output's gradient is known, so its backward
time reads about zero. Not thread-safe: the training thread.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn


@dataclasses.dataclass
class LayerTiming:
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    calls: int = 0  # forward passes (micro-batches) measured
    activation_bytes: int = 0  # saved for backward, summed over calls


class _CpuClock:
    def mark(self):
        return time.perf_counter_ns()

    def seconds(self, pairs: List[Tuple[object, object]]) -> List[float]:
        return [(b - a) * 1e-9 for a, b in pairs]


class _CudaClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(self.device))
        return e

    def seconds(self, pairs: List[Tuple[object, object]]) -> List[float]:
        torch.cuda.synchronize(self.device)
        return [a.elapsed_time(b) * 1e-3 for a, b in pairs]


class LayerTimer:
    """Times the modules it is attached to, per layer id."""

    def __init__(self, device: Optional[torch.device] = None,
                 measure_activations: bool = True) -> None:
        device = torch.device(device) if device is not None else torch.device("cpu")
        self._clock = _CudaClock(device) if device.type == "cuda" else _CpuClock()
        self._measure_activations = measure_activations
        self._handles: List[torch.utils.hooks.RemovableHandle] = []
        self._reset()

    def _reset(self) -> None:
        self._fwd: Dict[int, List[Tuple[object, object]]] = {}
        self._bwd: Dict[int, List[Tuple[object, object]]] = {}
        self._open_fwd: Dict[int, List[object]] = {}
        self._open_bwd: Dict[int, List[object]] = {}
        self._saved: Dict[int, int] = {}
        self._saving: Dict[int, List[object]] = {}

    def attach(self, modules: Mapping[int, nn.Module]) -> None:
        """Times exactly these modules from now on (drops earlier ones)."""
        self.detach()
        # Said once per module whose input needs no gradient (see above);
        # expected here, so not repeated to the user.
        warnings.filterwarnings("ignore", message="Full backward hook is firing when "
                                "gradients are computed with respect to module outputs")
        for layer, module in modules.items():
            self._handles += [
                module.register_forward_pre_hook(self._fwd_pre(layer)),
                module.register_forward_hook(self._fwd_post(layer)),
                module.register_full_backward_pre_hook(self._bwd_pre(layer)),
                module.register_full_backward_hook(self._bwd_post(layer)),
            ]

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def collect(self) -> Dict[int, LayerTiming]:
        """The totals since the last collect, per layer id; starts anew."""
        out: Dict[int, LayerTiming] = {}
        for table, field in ((self._fwd, "fwd_s"), (self._bwd, "bwd_s")):
            for layer, pairs in table.items():
                t = out.setdefault(layer, LayerTiming())
                setattr(t, field, sum(self._clock.seconds(pairs)))
                if field == "fwd_s":
                    t.calls = len(pairs)
        for layer, saved in self._saved.items():
            out.setdefault(layer, LayerTiming()).activation_bytes = saved
        self._reset()
        return out

    # ---- hooks -------------------------------------------------------------

    def _fwd_pre(self, layer: int):
        def hook(module, args):
            if self._measure_activations and torch.is_grad_enabled():
                ctx = torch.autograd.graph.saved_tensors_hooks(self._pack(layer), _unpack)
                ctx.__enter__()
                self._saving.setdefault(layer, []).append(ctx)
            self._open_fwd.setdefault(layer, []).append(self._clock.mark())
        return hook

    def _fwd_post(self, layer: int):
        def hook(module, args, output):
            start = self._open_fwd[layer].pop()
            self._fwd.setdefault(layer, []).append((start, self._clock.mark()))
            if self._saving.get(layer):
                self._saving[layer].pop().__exit__(None, None, None)
        return hook

    def _bwd_pre(self, layer: int):
        def hook(module, grad_output):
            self._open_bwd.setdefault(layer, []).append(self._clock.mark())
        return hook

    def _bwd_post(self, layer: int):
        def hook(module, grad_input, grad_output):
            opened = self._open_bwd.get(layer)
            if opened:
                self._bwd.setdefault(layer, []).append((opened.pop(), self._clock.mark()))
        return hook

    def _pack(self, layer: int):
        def pack(t: torch.Tensor):
            self._saved[layer] = self._saved.get(layer, 0) + t.numel() * t.element_size()
            return t
        return pack


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
