"""Checkpoints of a ``DynamicPipeline`` that resume at any split, through
``torch.distributed.checkpoint`` (DCP).

    save(pipe, root, iteration)            # collective: root/step-<iteration>/
    path = latest(root)                    # the newest complete one, or None
    split = saved_split(path)              # the split in force when saved
    pipe = DynamicPipeline(model, ..., boundaries=split)   # or any other split
    iteration = load(pipe, path)           # collective: the iteration saved

What a checkpoint holds, keyed by the model's own FQNs so that any split
(and a job without DynMo, through DCP) reads it: every held layer's
parameters and buffers (``model.<fqn>``), each parameter's optimizer state
(``optim.<fqn>.<key>``, AdamW's ``step`` included) and group index, the
optimizer's group hyper-parameters, the LR scheduler's state, each rank's
RNG states (CPU and CUDA), and in ``dynmo.json`` the iteration, split,
stage ids and plan epoch in force. Replicas of a stage (dp > 1) hold the
same FQNs and DCP writes them once; on load every rank reads the FQNs of
the layers it holds now, wherever they were saved from. Under FSDP2 a
parameter and its state are DTensors: each replica writes its shard, and
on load reads the shard it holds now (DCP re-shards).

A checkpoint is written into ``.step-<iteration>.partial`` and renamed to
``step-<iteration>`` by rank 0 only after every rank's DCP write and the
sidecar are on disk, so a job killed mid-save leaves no directory
``latest`` would pick. Not thread-safe: the training thread; every rank
of the job calls ``save`` and ``load`` at the same iteration.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor

_DONE = re.compile(r"^step-(\d+)$")
_SIDECAR = "dynmo.json"
_log = logging.getLogger("dynmo.pipelining")


def save(pipe, root: str, iteration: int) -> str:
    """Writes ``pipe``'s state at the end of ``iteration`` under ``root``;
    returns the checkpoint's directory. Collective over the job's ranks."""
    final = os.path.join(root, f"step-{iteration}")
    partial = os.path.join(root, f".step-{iteration}.partial")
    rank = dist.get_rank()
    if rank == 0:
        # A job killed while saving this iteration before left its pieces
        # here; none of them may mix with this save's.
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
    _barrier(pipe)
    dcp.save(_state(pipe, with_values=True), checkpoint_id=partial,
             process_group=pipe.topology.control_group)
    if rank == 0:
        meta = {"iteration": iteration, "boundaries": list(pipe.boundaries),
                "stage_ids": list(pipe.stage_ids), "epoch": pipe.epoch,
                "num_layers": pipe.layout.num_layers, "pp": pipe.topology.pp,
                "dp": pipe.topology.dp, "schedule": pipe.schedule_name}
        _write_durably(os.path.join(partial, _SIDECAR), json.dumps(meta))
    _barrier(pipe)
    if rank == 0:
        if os.path.exists(final):
            raise FileExistsError(f"dynmo.pipelining: checkpoint {final} exists")
        os.rename(partial, final)
        _fsync_dir(root)
    _barrier(pipe)
    return final


def latest(root: str) -> Optional[str]:
    """The newest complete checkpoint under ``root`` (None when none is)."""
    if not os.path.isdir(root):
        return None
    done = [(int(m.group(1)), n) for n in os.listdir(root) for m in [_DONE.match(n)] if m
            and os.path.exists(os.path.join(root, n, _SIDECAR))]
    return os.path.join(root, max(done)[1]) if done else None


def saved_split(path: str) -> List[int]:
    """The split in force when the checkpoint at ``path`` was saved."""
    return list(_sidecar(path)["boundaries"])


def load(pipe, path: str) -> int:
    """Reads the checkpoint at ``path`` into ``pipe`` (any split, the same
    model and optimizer factory); returns the iteration it was saved at.
    ``pipe.epoch`` becomes the plan epoch in force when it was saved.
    Collective over the job's ranks."""
    meta = _sidecar(path)
    if meta["num_layers"] != pipe.layout.num_layers:
        raise ValueError(f"dynmo.pipelining: checkpoint {path} has {meta['num_layers']} "
                         f"layers, the model {pipe.layout.num_layers}")
    stored = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = _state(pipe, with_values=False, stored=stored)
    dcp.load(state, checkpoint_id=path, process_group=pipe.topology.control_group)
    _restore(pipe, state)
    pipe.epoch = int(meta.get("epoch", 0))
    if dist.get_rank() == 0:
        _log.info("dynmo.pipelining: resumed from %s (iteration %d, saved at split %s, "
                  "epoch %d) at split %s", path, meta["iteration"], meta["boundaries"],
                  pipe.epoch, list(pipe.boundaries))
    return int(meta["iteration"])


# ---- the state dict ---------------------------------------------------------

def _held_tensors(pipe) -> List[Tuple[str, torch.nn.Parameter, bool]]:
    """(FQN, tensor, is a parameter) of every held layer, in layer order."""
    out = []
    for layer in sorted(pipe.parts.held):
        for fqn, module in zip(pipe.layout.fqns(layer), pipe.parts.held[layer]):
            out += [(f"{fqn}.{n}", p, True) for n, p in module.named_parameters()]
            out += [(f"{fqn}.{n}", b, False) for n, b in module.named_buffers()]
    return out


def _group_of(optimizer, p) -> int:
    for i, g in enumerate(optimizer.param_groups):
        if any(q is p for q in g["params"]):
            return i
    return -1


def _state(pipe, with_values: bool, stored: Optional[Dict[str, Any]] = None
           ) -> Dict[str, Any]:
    """The flat DCP state dict of this rank: its tensors to write
    (``with_values``), or to read into (shaped after ``stored``)."""
    opt = pipe.optimizer
    state: Dict[str, Any] = {}
    for fqn, t, is_param in _held_tensors(pipe):
        state[f"model.{fqn}"] = t.detach()
        if not is_param:
            continue
        if with_values:
            state[f"optim.{fqn}.group"] = torch.tensor(_group_of(opt, t))
            for key, v in opt.state.get(t, {}).items():
                state[f"optim.{fqn}.{key}"] = v if isinstance(v, torch.Tensor) else _blob(v)
            continue
        prefix = f"optim.{fqn}."
        for name, item in stored.items():
            if not name.startswith(prefix) or "." in name[len(prefix):]:
                continue
            if isinstance(item, TensorStorageMetadata):
                dtype = item.properties.dtype
                if isinstance(t, DTensor) and tuple(item.size) == tuple(t.shape):
                    # FSDP2: this replica's shard of the state, as its parameter's.
                    state[name] = torch.empty_like(t.detach(), dtype=dtype)
                    continue
                dev = t.device if len(item.size) else _scalar_device(opt, t)
                state[name] = torch.empty(item.size, dtype=dtype, device=dev)
            else:
                state[name] = b""  # a plain value (pickled): DCP puts it here
    rank = dist.get_rank()
    state[f"dynmo.rng.{rank}"] = torch.get_rng_state()
    if pipe.device.type == "cuda":
        state[f"dynmo.cuda_rng.{rank}"] = torch.cuda.get_rng_state(pipe.device)
    # Objects travel pickled, as DCP's leaves (a nested dict would be
    # flattened into keys a reader cannot know in advance).
    state["optim.param_groups"] = _blob([{k: v for k, v in g.items() if k != "params"}
                                         for g in opt.param_groups]) if with_values else b""
    if pipe.lr_scheduler is not None:
        state["lr_scheduler"] = _blob(pipe.lr_scheduler.state_dict()) if with_values else b""
    return state


def _blob(value: Any) -> bytes:
    return pickle.dumps(value)


def _value(blob: Any) -> Any:
    return pickle.loads(blob) if isinstance(blob, bytes) and blob else None


def _scalar_device(optimizer, p) -> torch.device:
    """Where a 0-dim state tensor lives: AdamW keeps ``step`` on the CPU
    unless capturable or fused."""
    g = optimizer.param_groups[0] if optimizer.param_groups else {}
    return p.device if g.get("capturable") or g.get("fused") else torch.device("cpu")


def _restore(pipe, state: Dict[str, Any]) -> None:
    opt = pipe.optimizer
    groups = _value(state.get("optim.param_groups"))
    if groups:
        for g, hyper in zip(opt.param_groups, groups):
            g.update(hyper)
    for fqn, t, is_param in _held_tensors(pipe):
        if not is_param:
            continue
        prefix = f"optim.{fqn}."
        s = {name[len(prefix):]: v for name, v in state.items()
             if name.startswith(prefix) and "." not in name[len(prefix):]}
        s = {k: v if isinstance(v, torch.Tensor) else _value(v) for k, v in s.items()}
        want = s.pop("group", None)
        if want is not None:
            _move_to_group(opt, t, int(want))
        if s:
            opt.state[t] = s
    scheduler = _value(state.get("lr_scheduler"))
    if pipe.lr_scheduler is not None and scheduler is not None:
        pipe.lr_scheduler.load_state_dict(scheduler)
    rank = dist.get_rank()
    if f"dynmo.rng.{rank}" in state:
        torch.set_rng_state(state[f"dynmo.rng.{rank}"])
    if pipe.device.type == "cuda" and f"dynmo.cuda_rng.{rank}" in state:
        torch.cuda.set_rng_state(state[f"dynmo.cuda_rng.{rank}"], pipe.device)


def _move_to_group(optimizer, p, index: int) -> None:
    if not 0 <= index < len(optimizer.param_groups):
        return
    for g in optimizer.param_groups:
        g["params"] = [q for q in g["params"] if q is not p]
    optimizer.param_groups[index]["params"].append(p)


# ---- files ------------------------------------------------------------------

def _sidecar(path: str) -> Dict[str, Any]:
    file = os.path.join(path, _SIDECAR)
    if not os.path.exists(file):
        raise FileNotFoundError(f"dynmo.pipelining: {path} is not a complete checkpoint "
                                f"(no {_SIDECAR})")
    with open(file) as f:
        return json.load(f)


def _write_durably(file: str, text: str) -> None:
    with open(file, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _barrier(pipe) -> None:
    dist.barrier(group=pipe.topology.control_group)
