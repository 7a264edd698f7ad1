"""Moving layers between ranks with their optimizer state: the one
migration of ``dynmo.torch`` and ``dynmo.pipelining``.

    moved = migrate(transfers, optimizer, rank=r, device=wire, group=g,
                    epoch=plan.epoch, timeout_s=60, lr_scheduler=sched)
    moved.bytes                  # sent + received by this rank
    moved.received               # {layer: its modules} (the receiver's)

A ``Transfer`` names a layer, its sending and receiving global ranks, the
plan's round, and on this rank the layer's modules (the sender's own, or
on the receiver an empty layer of the same architecture). A rank passes
the transfers it takes part in; every rank of ``group`` calls ``migrate``
(even with none), because a plan is confirmed by all of them.

What travels, per pair of ranks and in three kinds of batch:
- once per plan, one header per peer (its length, then the bytes): per
  layer its parameters' and buffers' shapes and dtypes, per parameter its
  optimizer group's index and hyper-parameters and its state's layout —
  each state tensor's dtype, shape and place, and scalar state (AdamW's
  CPU ``step``) by value, so no host round trip per parameter;
- per round of the plan, one ``batch_isend_irecv`` of every parameter,
  buffer and state tensor this rank sends or receives in that round, on
  the tensors' own device (NCCL coalesces the batch into one group on the
  communicator of ``group``, which the plan's agreement has built);
- a confirmation: a SUM all-reduce over ``group`` of each rank's "every
  move I received landed and matched". Only then does a sender drop its
  parameters from its optimizer and a receiver adopt its own: a plan that
  fails anywhere changes nothing anywhere.

A DTensor parameter (FSDP2's ``fully_shard``) travels as its local shard
and its state as theirs, into a layer the receiver has sharded alike (the
same global and local shapes and placements, checked with the header):
each replica of a sharded stage moves its own shard to its peer replica,
so the layer's full state moves once, split over the replicas.

Any ``torch.optim`` optimizer's per-parameter state travels bit-exactly
(AdamW's ``exp_avg``/``exp_avg_sq``/``step``, AMSGrad's ``max_exp_avg_sq``,
SGD's ``momentum_buffer``, Adagrad's ``sum``...). The receiver puts each
parameter into the group of the sender's index when its hyper-parameters
match (the optimizer is built the same way on every rank), else into the
first group that matches, else into a new group it tells ``lr_scheduler``
about (``base_lrs``). Groups that empty keep their place, so a scheduler's
per-group lists stay aligned. Gradients do not travel: move between
iterations, after ``zero_grad``.

Every wait is bounded by ``timeout_s``: a peer that died or stopped
answering raises ``MigrationError`` naming the plan and the peers, on
every survivor, instead of hanging in the backend's watchdog. The plan's
rounds (core/migration.h) give every rank the same global
order, so the batches cannot deadlock. Not thread-safe: the training thread.
"""
from __future__ import annotations

import dataclasses
import datetime
import pickle
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

DEFAULT_TIMEOUT_S = 60.0


class MigrationError(RuntimeError):
    """A migration that could not complete: a peer died, timed out, or sent
    a layer that does not match this rank's architecture. Nothing changed
    on this rank's optimizer or layers. ``recoverable``: every rank is alive
    and agreed the plan failed (a layer that did not match), so training can
    go on with the layout it had; otherwise the job's ranks can no longer
    talk (a dead or silent peer) and it must stop."""

    def __init__(self, message: str, epoch: int = 0, peers: Sequence[int] = (),
                 recoverable: bool = False) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.peers = list(peers)
        self.recoverable = recoverable


@dataclasses.dataclass
class Transfer:
    """One layer's move: ``modules`` are the sender's (on ``src``) or the
    empty layer to fill (on ``dst``)."""

    layer: int
    src: int
    dst: int
    modules: Sequence[nn.Module]
    round: int = 0


@dataclasses.dataclass
class Migrated:
    bytes: int = 0
    received: Dict[int, Sequence[nn.Module]] = dataclasses.field(default_factory=dict)


def migrate(transfers: Sequence[Transfer], optimizer: Optional[torch.optim.Optimizer], *,
            rank: int, device: torch.device, group: Optional[dist.ProcessGroup] = None,
            epoch: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S,
            lr_scheduler: Optional[Any] = None, confirm: str = "group") -> Migrated:
    """Carries out this rank's ``transfers`` (see the module doc). ``device``:
    where headers travel (the group's wire: CUDA under NCCL). ``confirm``:
    "group" (an all-reduce over ``group``: every rank calls) or "peers"
    (receivers answer their senders only: a pairwise call)."""
    mine = [t for t in transfers if rank in (t.src, t.dst) and t.src != t.dst]
    ex = _Exchange(device, group, epoch, timeout_s)
    out = Migrated()
    outgoing = [t for t in mine if t.src == rank]
    incoming = [t for t in mine if t.dst == rank]
    headers = {t.layer: _header(t.modules, optimizer) for t in outgoing}
    by_peer: Dict[int, List[tuple]] = {}
    for t in outgoing:
        by_peer.setdefault(t.dst, []).append((t.layer, headers[t.layer]))
    sent_meta = ex.headers(by_peer, sorted({t.src for t in incoming}))
    received_meta = {layer: meta for metas in sent_meta.values() for layer, meta in metas}
    problems = []
    plans: Dict[int, _Receipt] = {}
    for t in incoming:
        meta = received_meta.get(t.layer)
        if meta is None:
            problems.append(f"layer {t.layer} did not arrive from rank {t.src}")
            continue
        plans[t.layer] = _Receipt(t.modules, meta)
        if plans[t.layer].mismatch:
            problems.append(plans[t.layer].mismatch)
    for r in sorted({t.round for t in mine}):
        ops = []
        for t in mine:
            if t.round != r:
                continue
            if t.src == rank:
                for x in _wire_tensors(t.modules, optimizer, headers[t.layer], device):
                    ops.append(dist.P2POp(dist.isend, x, t.dst, group))
                    out.bytes += x.numel() * x.element_size()
            elif t.layer in plans:
                for x in plans[t.layer].buffers:
                    ops.append(dist.P2POp(dist.irecv, x, t.src, group))
                    out.bytes += x.numel() * x.element_size()
        ex.run(ops, f"round {r}", sorted({t.src if t.dst == rank else t.dst for t in mine
                                          if t.round == r}))
    landed = not problems
    if confirm == "group":
        landed = ex.all_landed(landed)
    else:
        landed = ex.acknowledge(landed, senders=sorted({t.src for t in incoming}),
                                receivers=sorted({t.dst for t in outgoing}))
    if not landed:
        why = "; ".join(problems) or "a peer's layer did not land"
        raise MigrationError(f"dynmo: plan epoch {epoch}: migration not applied, nothing "
                             f"changed: {why}", epoch,
                             sorted({t.src for t in incoming} | {t.dst for t in outgoing}),
                             recoverable=True)
    # Every move landed everywhere: the senders let go, the receivers adopt.
    if optimizer is not None:
        for t in outgoing:
            forget_parameters(optimizer, _params(t.modules))
    for t in incoming:
        receipt = plans[t.layer]
        receipt.install(optimizer, lr_scheduler)
        out.received[t.layer] = t.modules
    return out


def send_layer(modules, optimizer: Optional[torch.optim.Optimizer], dst: int,
               group: Optional[dist.ProcessGroup] = None, *,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Sends one layer (a module or a list of modules) to global rank ``dst``,
    which calls ``recv_layer``; its parameters leave ``optimizer`` once the
    receiver confirms. Returns the bytes sent."""
    modules = _as_list(modules)
    rank = dist.get_rank()
    return migrate([Transfer(-1, rank, dst, modules)], optimizer, rank=rank,
                   device=_device_of(modules, group), group=group, timeout_s=timeout_s,
                   confirm="peers").bytes


def recv_layer(modules, optimizer: Optional[torch.optim.Optimizer], src: int,
               group: Optional[dist.ProcessGroup] = None,
               lr_scheduler: Optional[Any] = None, *,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Receives into ``modules`` (an empty layer of the same architecture)
    from global rank ``src``; its parameters join ``optimizer``. Returns the
    bytes received."""
    modules = _as_list(modules)
    rank = dist.get_rank()
    return migrate([Transfer(-1, src, rank, modules)], optimizer, rank=rank,
                   device=_device_of(modules, group), group=group, timeout_s=timeout_s,
                   lr_scheduler=lr_scheduler, confirm="peers").bytes


def forget_parameters(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
    """Removes ``params`` and their state from ``optimizer``; groups stay."""
    gone = {id(p) for p in params}
    for p in params:
        optimizer.state.pop(p, None)
    for g in optimizer.param_groups:
        g["params"] = [p for p in g["params"] if id(p) not in gone]


def adopt_parameters(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                     groups: Sequence[Tuple[int, Dict[str, Any]]],
                     states: Sequence[Dict[str, Any]],
                     lr_scheduler: Optional[Any] = None) -> None:
    """Adds each parameter to the group of the sender's index when its
    hyper-parameters match, else to the first that matches, else to a new
    group (told to ``lr_scheduler``); with its state."""
    for p, (gi, hyper), s in zip(params, groups, states):
        target = None
        if 0 <= gi < len(optimizer.param_groups) and \
                _hyper(optimizer.param_groups[gi]) == hyper:
            target = optimizer.param_groups[gi]
        else:
            target = next((g for g in optimizer.param_groups if _hyper(g) == hyper), None)
        if target is not None:
            target["params"].append(p)
        else:
            optimizer.add_param_group({**hyper, "params": [p]})
            if lr_scheduler is not None and hasattr(lr_scheduler, "base_lrs"):
                lr_scheduler.base_lrs.append(hyper.get("initial_lr", hyper.get("lr")))
        if s:
            optimizer.state[p] = s


# ---- what a layer sends -----------------------------------------------------

_TENSOR, _SCALAR, _VALUE = "tensor", "scalar", "value"


def _as_list(modules) -> List[nn.Module]:
    return [modules] if isinstance(modules, nn.Module) else list(modules)


def _params(modules: Sequence[nn.Module]) -> List[nn.Parameter]:
    return [p for m in modules for p in m.parameters()]


def _buffers(modules: Sequence[nn.Module]) -> List[torch.Tensor]:
    return [b for m in modules for b in m.buffers()]


def _local(t: torch.Tensor) -> torch.Tensor:
    """What of ``t`` this rank holds: a DTensor's local shard (a view of
    its storage), else ``t``."""
    if isinstance(t, DTensor):
        with torch.no_grad():
            return t.to_local()
    return t


def _sharding(t: torch.Tensor) -> Optional[Tuple[str, int]]:
    """A DTensor's placements and mesh size (None for a plain tensor)."""
    return (str(t.placements), t.device_mesh.size()) if isinstance(t, DTensor) else None


def _hyper(group: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _group_index(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> int:
    for i, g in enumerate(optimizer.param_groups):
        if any(q is p for q in g["params"]):
            return i
    raise ValueError("dynmo: a parameter of the layer to move is not in the optimizer")


def _header(modules: Sequence[nn.Module], optimizer) -> Dict[str, Any]:
    """What the receiver needs to know before the tensors (module doc)."""
    params = _params(modules)
    state = []
    for p in params:
        if optimizer is None:
            state.append((-1, {}, []))
            continue
        gi = _group_index(optimizer, p)
        layout = []
        s = optimizer.state.get(p, {})
        for key in sorted(s):
            v = s[key]
            if isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu":
                # host-sync(cpu): a CPU scalar (AdamW's step) read on the host.
                layout.append((key, _SCALAR, v.dtype, v.item()))
            elif isinstance(v, torch.Tensor):
                if isinstance(v, DTensor) and _sharding(v) != _sharding(p):
                    raise ValueError(f"dynmo: optimizer state {key!r} is sharded unlike its "
                                     f"parameter ({v.placements} vs {_sharding(p)}); it "
                                     f"cannot travel as a shard")
                layout.append((key, _TENSOR, v.dtype, tuple(_local(v).shape),
                               v.device.type == "cpu", isinstance(v, DTensor)))
            else:
                layout.append((key, _VALUE, v))
        state.append((gi, _hyper(optimizer.param_groups[gi]), layout))
    return {"params": [(tuple(p.shape), p.dtype, p.requires_grad) for p in params],
            "shards": [(tuple(_local(p).shape), _sharding(p)) for p in params],
            "buffers": [(tuple(b.shape), b.dtype) for b in _buffers(modules)],
            "state": state}


def _wire_tensors(modules, optimizer, header, device) -> List[torch.Tensor]:
    """The sender's tensors in wire order: parameters, buffers, state."""
    params = _params(modules)
    out = [_local(p).detach().contiguous() for p in params]
    out += [_local(b).detach().contiguous() for b in _buffers(modules)]
    for p, (_, _, layout) in zip(params, header["state"]):
        s = optimizer.state.get(p, {}) if optimizer is not None else {}
        for entry in layout:
            if entry[1] == _TENSOR:
                v = _local(s[entry[0]])
                # A CPU state tensor beside a device parameter travels on the wire's device.
                out.append((v.to(device) if v.device != p.device and
                            device.type != "cpu" else v).contiguous())
    return out


class _Receipt:
    """A layer being received: the tensors to receive into, in wire order,
    and how to install them once the plan is confirmed."""

    def __init__(self, modules: Sequence[nn.Module], header: Dict[str, Any]) -> None:
        self.params = _params(modules)
        self.buffer_targets = _buffers(modules)
        here = [(tuple(p.shape), p.dtype) for p in self.params]
        there = [(shape, dtype) for shape, dtype, _ in header["params"]]
        buffers_here = [(tuple(b.shape), b.dtype) for b in self.buffer_targets]
        shards_here = [(tuple(_local(p).shape), _sharding(p)) for p in self.params]
        self.mismatch = ""
        if here == there and buffers_here == header["buffers"] and \
                shards_here != header["shards"]:
            self.mismatch = (f"the layer received is sharded unlike this rank's "
                             f"({header['shards'][:2]} vs {shards_here[:2]})")
        elif here != there or buffers_here != header["buffers"]:
            self.mismatch = (f"the layer received ({len(there)} parameters, "
                             f"{len(header['buffers'])} buffers) does not match the local "
                             f"architecture ({len(here)} parameters, {len(buffers_here)} "
                             f"buffers)")
        device = self.params[0].device if self.params else (
            self.buffer_targets[0].device if self.buffer_targets else torch.device("cpu"))
        self.header = header
        # Receive straight into the empty layer when it matches (it is
        # discarded if the plan fails); into scratch of the sender's shapes
        # when it does not, so the sender's batch still completes.
        if self.mismatch:
            self.buffers = [torch.empty(s, dtype=d, device=device)
                            for (s, _), (_, d, _) in zip(header["shards"], header["params"])]
            self.buffers += [torch.empty(s, dtype=d, device=device) for s, d in header["buffers"]]
        else:
            self.buffers = [_landing(_local(t)) for t in self.params + self.buffer_targets]
        self.states: List[Tuple[str, torch.Tensor, bool, bool]] = []
        for i, (_, _, layout) in enumerate(header["state"]):
            where = self.params[i].device if i < len(self.params) and not self.mismatch \
                else device
            for entry in layout:
                if entry[1] == _TENSOR:
                    key, _, dtype, shape, on_cpu, sharded = entry
                    buf = torch.empty(shape, dtype=dtype, device=where)
                    self.buffers.append(buf)
                    self.states.append((key, buf, on_cpu, sharded))

    def install(self, optimizer, lr_scheduler) -> None:
        n = len(self.params) + len(self.buffer_targets)
        with torch.no_grad():
            for target, buf in zip(self.params + self.buffer_targets, self.buffers[:n]):
                target = _local(target)
                if buf.data_ptr() != target.data_ptr():
                    target.copy_(buf)
        for p, (_, _, flag) in zip(self.params, self.header["params"]):
            p.requires_grad_(flag)  # a frozen layer stays frozen
        if optimizer is None:
            return
        received = iter(self.states)
        states = []
        for p, (_, _, layout) in zip(self.params, self.header["state"]):
            s: Dict[str, Any] = {}
            for entry in layout:
                if entry[1] == _VALUE:
                    s[entry[0]] = entry[2]
                elif entry[1] == _SCALAR:
                    s[entry[0]] = torch.tensor(entry[3], dtype=entry[2])
                else:
                    key, buf, on_cpu, sharded = next(received)
                    # host-sync(event): a plan's CPU-resident state (offloaded), back home.
                    buf = buf.cpu() if on_cpu and buf.device.type != "cpu" else buf
                    # A shard of the state becomes a DTensor in this rank's mesh.
                    s[key] = DTensor.from_local(buf, p.device_mesh, p.placements,
                                                run_check=False, shape=p.shape,
                                                stride=p.stride()) if sharded else buf
            states.append(s)
        adopt_parameters(optimizer, self.params,
                         [(gi, hyper) for gi, hyper, _ in self.header["state"]], states,
                         lr_scheduler)


def _landing(t: torch.Tensor) -> torch.Tensor:
    """Where a received tensor lands: ``t`` itself when it is contiguous."""
    if t.is_contiguous():
        return t.detach()
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _device_of(modules: Sequence[nn.Module], group) -> torch.device:
    """The wire of a pairwise call: the layer's device, else the group's."""
    for t in _params(modules) + _buffers(modules):
        return t.device
    from dynmo.torch.plan import _device_for_backend
    return _device_for_backend(str(dist.get_backend(group)))


# ---- the exchanges ----------------------------------------------------------

class _Exchange:
    """Batched point-to-point over one group, every wait bounded."""

    def __init__(self, device, group, epoch: int, timeout_s: float) -> None:
        self.device = torch.device(device)
        self.group = group
        self.epoch = epoch
        self.timeout = datetime.timedelta(seconds=timeout_s)

    def run(self, ops: List[dist.P2POp], what: str, peers: Sequence[int]) -> None:
        if not ops:
            return
        try:
            works = dist.batch_isend_irecv(ops)
            for w in works:
                w.wait(self.timeout)
        except Exception as e:  # noqa: BLE001  (the backend's error, made one line)
            raise self._failed(what, peers, e) from e

    def _failed(self, what: str, peers: Sequence[int], e: BaseException) -> MigrationError:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        names = ", ".join(str(p) for p in peers) or "?"
        return MigrationError(
            f"dynmo: plan epoch {self.epoch}: migration {what} with rank(s) {names} failed "
            f"within {self.timeout.total_seconds():g} s: {first}", self.epoch, peers)

    def headers(self, outgoing: Dict[int, List[tuple]], sources: Sequence[int]
                ) -> Dict[int, List[tuple]]:
        """Sends each peer its headers, receives each source's."""
        blobs = {p: torch.frombuffer(bytearray(pickle.dumps(v)), dtype=torch.uint8)
                 .to(self.device) for p, v in outgoing.items()}
        sizes_in = {s: torch.zeros(1, dtype=torch.int64, device=self.device) for s in sources}
        ops = [dist.P2POp(dist.isend, torch.tensor([b.numel()], dtype=torch.int64,
                                                   device=self.device), p, self.group)
               for p, b in blobs.items()]
        ops += [dist.P2POp(dist.irecv, t, s, self.group) for s, t in sizes_in.items()]
        peers = sorted(set(blobs) | set(sources))
        self.run(ops, "header sizes", peers)
        # host-sync(event): the header sizes, once per plan.
        payloads = {s: torch.empty(int(t.item()), dtype=torch.uint8, device=self.device)
                    for s, t in sizes_in.items()}
        ops = [dist.P2POp(dist.isend, b, p, self.group) for p, b in blobs.items()]
        ops += [dist.P2POp(dist.irecv, t, s, self.group) for s, t in payloads.items()]
        self.run(ops, "headers", peers)
        # host-sync(event): the headers, once per plan.
        return {s: pickle.loads(t.cpu().numpy().tobytes()) for s, t in payloads.items()}

    def all_landed(self, landed: bool) -> bool:
        """Whether every rank of the group says its moves landed."""
        flag = torch.tensor([0 if landed else 1], dtype=torch.int64, device=self.device)
        try:
            work = dist.all_reduce(flag, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            work.wait(self.timeout)
        except Exception as e:  # noqa: BLE001
            raise self._failed("confirmation", [], e) from e
        # host-sync(event): the confirmation, once per plan.
        return int(flag.item()) == 0

    def acknowledge(self, landed: bool, senders: Sequence[int],
                    receivers: Sequence[int]) -> bool:
        """Pairwise confirmation: each receiver tells its senders."""
        mine = torch.tensor([1 if landed else 0], dtype=torch.int64, device=self.device)
        theirs = {r: torch.zeros(1, dtype=torch.int64, device=self.device) for r in receivers}
        ops = [dist.P2POp(dist.isend, mine, s, self.group) for s in senders]
        ops += [dist.P2POp(dist.irecv, t, r, self.group) for r, t in theirs.items()]
        self.run(ops, "confirmation", sorted(set(senders) | set(receivers)))
        # host-sync(event): the confirmation, once per plan.
        return landed and all(int(t.item()) == 1 for t in theirs.values())
