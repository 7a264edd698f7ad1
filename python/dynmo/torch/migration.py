"""Moving one layer between ranks: its parameters, buffers and AdamW state.

    send_layer(module, optimizer, dst)     # on the rank that gives it up
    recv_layer(module, optimizer, src)     # on the rank that takes it; module
                                           # is a fresh layer of the same shape

The sender first sends a header (per parameter: whether the optimizer holds
state for it, the dtype of its ``step``), then every parameter and buffer
in ``named_parameters`` / ``named_buffers`` order, then per parameter with
state ``exp_avg``, ``exp_avg_sq`` and ``step``. Tensors travel as they are
(``torch.distributed.send`` / ``recv``, Gloo or NCCL), so the receiver's
copy is bit-identical. The sender's optimizer forgets the parameters; the
receiver's gains them as a new parameter group with the hyper-parameters of
its first group (or its defaults) and the received state. Gradients are not
moved: migrate between iterations, after ``zero_grad``.

Both calls block until the peer's matching call; a plan's moves, executed
in their listed order (rounds), cannot deadlock (coordinator/core/migration.h).
Not thread-safe: the training thread.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

_STATE_KEYS = ("exp_avg", "exp_avg_sq")
# dtype codes for a ``step`` in the header (0: no state for this parameter).
_STEP_DTYPES = [torch.float32, torch.float64, torch.int64, torch.float16, torch.bfloat16]


def _step_code(state: Dict) -> int:
    if not state:
        return 0
    step = state.get("step")
    if not isinstance(step, torch.Tensor):
        raise ValueError("optimizer state has no tensor 'step': expected torch.optim.AdamW/Adam")
    for key in _STATE_KEYS:
        if key not in state:
            raise ValueError(f"optimizer state has no '{key}': expected torch.optim.AdamW/Adam")
    return _STEP_DTYPES.index(step.dtype) + 1


def _wire_device(module: nn.Module) -> torch.device:
    """NCCL moves CUDA tensors; Gloo moves the tensors where they are."""
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def send_layer(module: nn.Module, optimizer: Optional[torch.optim.Optimizer], dst: int,
               group: Optional[dist.ProcessGroup] = None) -> int:
    """Sends ``module``'s state to rank ``dst``; returns the bytes sent."""
    params = list(module.parameters())
    states = [optimizer.state.get(p, {}) if optimizer is not None else {} for p in params]
    header = torch.tensor([_step_code(s) for s in states], dtype=torch.int64,
                          device=_wire_device(module))
    dist.send(header, dst, group=group)
    tensors: List[torch.Tensor] = [p.detach() for p in params]
    tensors += [b.detach() for b in module.buffers()]
    for s in states:
        if s:
            tensors += [s[k] for k in _STATE_KEYS]
            tensors.append(s["step"].to(header.device))
    sent = send_tensors(tensors, dst, group)
    if optimizer is not None:
        forget_parameters(optimizer, params)
    return sent


def recv_into(tensors: List[torch.Tensor], src: int,
              group: Optional[dist.ProcessGroup] = None) -> int:
    """Receives each tensor's new value in place (the twin of send_tensors);
    returns the bytes received."""
    received = 0
    with torch.no_grad():
        for t in tensors:
            buf = torch.empty_like(t, memory_format=torch.contiguous_format)
            dist.recv(buf, src, group=group)
            t.copy_(buf)
            received += buf.numel() * buf.element_size()
    return received


def send_tensors(tensors: List[torch.Tensor], dst: int,
                 group: Optional[dist.ProcessGroup] = None) -> int:
    """Sends each tensor as it is (contiguous); returns the bytes sent."""
    sent = 0
    for t in tensors:
        t = t.contiguous()
        dist.send(t, dst, group=group)
        sent += t.numel() * t.element_size()
    return sent


def recv_layer(module: nn.Module, optimizer: Optional[torch.optim.Optimizer], src: int,
               group: Optional[dist.ProcessGroup] = None) -> int:
    """Receives into ``module`` (same architecture) from rank ``src``; returns
    the bytes received. The optimizer then steps its parameters too."""
    params = list(module.parameters())
    device = _wire_device(module)
    header = torch.empty(len(params), dtype=torch.int64, device=device)
    dist.recv(header, src, group=group)
    received = recv_into(params + list(module.buffers()), src, group)
    with torch.no_grad():
        new_state = {}
        for p, code in zip(params, header.tolist()):
            if code == 0:
                continue
            s = {}
            for key in _STATE_KEYS:
                s[key] = torch.empty_like(p, memory_format=torch.contiguous_format)
                dist.recv(s[key], src, group=group)
                received += s[key].numel() * s[key].element_size()
            step = torch.empty((), dtype=_STEP_DTYPES[code - 1], device=device)
            dist.recv(step, src, group=group)
            received += step.element_size()
            # AdamW keeps `step` on the CPU unless capturable / fused.
            s["step"] = step.to(_step_device(optimizer, p))
            new_state[p] = s
    if optimizer is not None:
        adopt_parameters(optimizer, params, new_state)
    return received


def _step_device(optimizer: Optional[torch.optim.Optimizer], p: torch.Tensor) -> torch.device:
    group = optimizer.param_groups[0] if optimizer is not None and optimizer.param_groups else {}
    if group.get("capturable") or group.get("fused"):
        return p.device
    return torch.device("cpu")


def forget_parameters(optimizer: torch.optim.Optimizer, params: List[torch.Tensor]) -> None:
    """Removes ``params`` and their state from ``optimizer`` (empty groups go)."""
    gone = {id(p) for p in params}
    for p in params:
        optimizer.state.pop(p, None)
    groups = []
    for g in optimizer.param_groups:
        g["params"] = [p for p in g["params"] if id(p) not in gone]
        if g["params"]:
            groups.append(g)
    optimizer.param_groups[:] = groups


def adopt_parameters(optimizer: torch.optim.Optimizer, params: List[torch.Tensor],
                     state: Dict[torch.Tensor, Dict]) -> None:
    """Adds ``params`` as a group like the optimizer's first, with ``state``."""
    template = optimizer.param_groups[0] if optimizer.param_groups else optimizer.defaults
    group = {k: v for k, v in template.items() if k != "params"}
    group["params"] = params
    optimizer.add_param_group(group)
    for p, s in state.items():
        optimizer.state[p] = s
