"""Moving one pipeline layer between ranks with its optimizer state, for
any ``torch.optim`` optimizer.

    send_layer(modules, optimizer, dst, group)   # the rank that gives it up
    recv_layer(modules, optimizer, src, group)   # the rank that takes it;
                                                 # modules: an empty layer

What travels, in order: a header (the byte length of the metadata), the
metadata (pickled: per parameter its optimizer group's index and
hyper-parameters and the layout of its state — for each key a tensor's
dtype, shape and whether it lives on the CPU or with the parameter, or a
plain value), then every parameter and buffer, then every state tensor.
Tensors travel as they are over ``torch.distributed`` point-to-point (Gloo
moves them where they are, NCCL on the parameters' device), so the copy is
bit-identical and any optimizer's state comes along: AdamW's ``exp_avg``,
``exp_avg_sq`` and ``step``, SGD's ``momentum_buffer``, Adagrad's ``sum``,
RMSprop's, Adafactor's row and column factors.

The receiver puts each parameter into the optimizer group of the same
index (the optimizer is built the same way on every rank) or, when the
hyper-parameters differ or the group is missing, into a new group and
tells the LR scheduler (``base_lrs``), so a scheduler keeps stepping every
group. The sender's groups keep their place even when they empty, so the
scheduler's per-group lists stay aligned. Gradients do not travel: move
between iterations, after ``zero_grad``.

Both calls block until the peer's matching call; a plan's moves executed in
their rounds cannot deadlock (coordinator/core/migration.h). Not
thread-safe: the training thread.
"""
from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from dynmo.torch.migration import recv_into, send_tensors

_WITH_PARAM, _ON_CPU = 0, 1


def _wire_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    """Where the header travels: the layer's device (NCCL needs CUDA)."""
    return tensors[0].device if tensors else torch.device("cpu")


def _hyper(group: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _group_index(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> int:
    for i, g in enumerate(optimizer.param_groups):
        if any(q is p for q in g["params"]):
            return i
    raise ValueError("dynmo.pipelining: a parameter of the layer is not in the optimizer")


def _state_layout(state: Dict[str, Any], p: torch.Tensor) -> List[tuple]:
    out = []
    for key in sorted(state):
        v = state[key]
        if isinstance(v, torch.Tensor):
            where = _ON_CPU if v.device.type == "cpu" and p.device.type != "cpu" else _WITH_PARAM
            out.append((key, "tensor", v.dtype, tuple(v.shape), where))
        else:
            out.append((key, "value", v))
    return out


def _params(modules: Sequence[nn.Module]) -> List[nn.Parameter]:
    return [p for m in modules for p in m.parameters()]


def _buffers(modules: Sequence[nn.Module]) -> List[torch.Tensor]:
    return [b for m in modules for b in m.buffers()]


def send_layer(modules: Sequence[nn.Module], optimizer: Optional[torch.optim.Optimizer],
               dst: int, group: Optional[dist.ProcessGroup] = None) -> int:
    """Sends the layer's tensors and optimizer state to ``dst`` (a global
    rank) and removes its parameters from ``optimizer``; returns bytes sent."""
    params = _params(modules)
    meta = []
    states = []
    for p in params:
        if optimizer is None:
            meta.append((-1, {}, []))
            states.append({})
            continue
        gi = _group_index(optimizer, p)
        s = optimizer.state.get(p, {})
        meta.append((gi, _hyper(optimizer.param_groups[gi]), _state_layout(s, p)))
        states.append(s)
    blob = pickle.dumps({"params": [(tuple(p.shape), p.dtype) for p in params],
                         "requires_grad": [p.requires_grad for p in params],
                         "buffers": len(_buffers(modules)), "meta": meta})
    device = _wire_device(params)
    payload = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
    dist.send(torch.tensor([payload.numel()], dtype=torch.int64, device=device), dst,
              group=group)
    dist.send(payload, dst, group=group)
    tensors = [p.detach() for p in params] + [b.detach() for b in _buffers(modules)]
    for p, s in zip(params, states):
        for key in sorted(s):
            if isinstance(s[key], torch.Tensor):
                tensors.append(s[key].to(p.device))
    sent = send_tensors(tensors, dst, group)
    if optimizer is not None:
        forget_parameters(optimizer, params)
    return sent


def recv_layer(modules: Sequence[nn.Module], optimizer: Optional[torch.optim.Optimizer],
               src: int, group: Optional[dist.ProcessGroup] = None,
               lr_scheduler: Optional[Any] = None) -> int:
    """Receives into ``modules`` (an empty layer of the same architecture)
    from ``src``; its parameters join ``optimizer``. Returns bytes received."""
    params = _params(modules)
    device = _wire_device(params)
    size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(size, src, group=group)
    payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.recv(payload, src, group=group)
    info = pickle.loads(payload.cpu().numpy().tobytes())
    shapes = [(tuple(p.shape), p.dtype) for p in params]
    if info["params"] != shapes or info["buffers"] != len(_buffers(modules)):
        raise RuntimeError("dynmo.pipelining: the layer received does not match the local "
                           f"architecture ({len(info['params'])} parameters sent, "
                           f"{len(params)} here)")
    for p, flag in zip(params, info["requires_grad"]):
        p.requires_grad_(flag)  # a frozen layer stays frozen
    received = recv_into(params + _buffers(modules), src, group)
    with torch.no_grad():
        new_state: List[Dict[str, Any]] = []
        for p, (_, _, layout) in zip(params, info["meta"]):
            s: Dict[str, Any] = {}
            for entry in layout:
                if entry[1] == "value":
                    s[entry[0]] = entry[2]
                    continue
                key, _, dtype, shape, where = entry
                buf = torch.empty(shape, dtype=dtype, device=p.device)
                dist.recv(buf, src, group=group)
                received += buf.numel() * buf.element_size()
                s[key] = buf.cpu() if where == _ON_CPU else buf
            new_state.append(s)
    if optimizer is not None:
        adopt_parameters(optimizer, params, [(m[0], m[1]) for m in info["meta"]],
                         new_state, lr_scheduler)
    return received


def forget_parameters(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
    """Removes ``params`` and their state from ``optimizer``; groups stay."""
    gone = {id(p) for p in params}
    for p in params:
        optimizer.state.pop(p, None)
    for g in optimizer.param_groups:
        g["params"] = [p for p in g["params"] if id(p) not in gone]


def adopt_parameters(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                     groups: Sequence[tuple], states: Sequence[Dict[str, Any]],
                     lr_scheduler: Optional[Any] = None) -> None:
    """Adds each parameter to the group of the sender's index when its
    hyper-parameters match, else to a new group (told to ``lr_scheduler``)."""
    for p, (gi, hyper), s in zip(params, groups, states):
        target = None
        if 0 <= gi < len(optimizer.param_groups) and \
                _hyper(optimizer.param_groups[gi]) == hyper:
            target = optimizer.param_groups[gi]
        else:
            for g in optimizer.param_groups:
                if _hyper(g) == hyper:
                    target = g
                    break
        if target is not None:
            target["params"].append(p)
        else:
            optimizer.add_param_group({**hyper, "params": [p]})
            if lr_scheduler is not None and hasattr(lr_scheduler, "base_lrs"):
                lr_scheduler.base_lrs.append(hyper.get("initial_lr", hyper.get("lr")))
        if s:
            optimizer.state[p] = s
