"""``DynamicPipeline``: a ``torch.distributed.pipelining`` job whose layer
split DynMo changes while it trains.

    pipe = DynamicPipeline(model, schedule="1F1B", n_microbatches=8,
                           loss_fn=loss_fn, pp=2, dp=1, device=device,
                           optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
                           coordinator="embedded")
    for step in range(steps):
        pipe.begin_iteration(step)          # a committed plan due now is applied
        pipe.schedule.step(...)             # the user's own loop, unchanged
        pipe.optimizer.step(); pipe.lr_scheduler.step(); pipe.optimizer.zero_grad()
        pipe.end_iteration(step)            # per-layer costs go to the coordinator

The steps, in the order the constructor takes them: read the model's
layout (``layout.py``), place ranks and build groups (``topology.py``), keep
this rank's layers, wrap each local stage's chunk in a ``PipelineStage``
(in DDP over the stage's data-parallel group when dp > 1), build the
schedule from ``get_schedule_class``, build the optimizer and LR scheduler
with the user's factories over the held parameters, attach the layer timer
and connect one ``dynmo.Agent`` per local stage.

At ``begin_iteration`` every rank of the job agrees in-band on the plan due
(``dynmo.torch.agree_on_plan``); when all hold it, each replica executes the
plan's moves in their listed order (``layer_transfer``: weights, buffers
and the optimizer's per-parameter state), then the chunks, the
``PipelineStage`` objects, DDP and the schedule are rebuilt and the optimizer
and scheduler objects stay the same. A re-pack plan also shrinks the
groups to the ranks that stay; a released rank frees its layers and
``released`` turns true (its loop ends). Re-shape plans are refused (see
docs/python.md). A plan that fails its checks changes nothing: it is
acknowledged as not applied and training goes on with the layout it had.
Not thread-safe: the training thread.
"""
from __future__ import annotations

import logging
import socket
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (PipelineScheduleMulti,
                                                    PipelineScheduleSingle,
                                                    get_schedule_class)

from dynmo.pipelining.layer_transfer import recv_layer, send_layer
from dynmo.pipelining.layout import ModelLayout, ModelParts
from dynmo.pipelining.topology import Topology
from dynmo.torch.memory import tensor_bytes
from dynmo.torch.plan import agree_on_plan
from dynmo.torch.timing import LayerTimer
from dynmo.types import LayerCost, Plan

_log = logging.getLogger("dynmo.pipelining")

# Schedules a running job can be rebuilt into, with their stage placement.
_V_STYLE = {"ZBVZeroBubble", "DualPipeV"}
_SPLIT_BACKWARD = {"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}
_REFUSED = {
    "PipelineScheduleSingle": "an abstract base class, not a schedule",
    "PipelineScheduleMulti": "an abstract base class, not a schedule",
}


def schedule_class(name: str):
    """The schedule class for ``name`` (case-insensitive, torch's names);
    ValueError for one that cannot be built or rebuilt."""
    try:
        cls = get_schedule_class(name)
    except ValueError as e:
        raise ValueError(f"dynmo.pipelining: {e}") from None
    why = _REFUSED.get(cls.__name__.replace("Schedule", "", 1)) or _REFUSED.get(cls.__name__)
    if why:
        raise ValueError(f"dynmo.pipelining: schedule '{name}' cannot run a job: {why}")
    return cls


def _canonical(cls) -> str:
    return cls.__name__[len("Schedule"):] if cls.__name__.startswith("Schedule") else \
        cls.__name__


class DynamicPipeline:
    """One rank's part of a pipelined model that DynMo may re-split live.

    ``model``: a torchtitan-style model (see ``ModelLayout``), the same
    initial weights on every rank (build it under the same seed). The
    constructor takes it apart; use ``pipe.stage_modules`` afterwards.
    ``schedule``: a name ``get_schedule_class`` knows. ``stages_per_rank``:
    virtual stages per rank for multi-stage schedules (2 by default).
    ``boundaries``: the initial split over ``pp * stages_per_rank`` stages
    (default: even). ``optimizer(params)`` and ``lr_scheduler(optimizer)``
    build this rank's optimizer and scheduler. ``coordinator``: None (static),
    "embedded" (global rank 0 starts a ``dynmo-coordinator`` on loopback) or
    "HOST:PORT"; ``policy`` the job's policy keywords for ``dynmo.set_policy``
    (trigger, balancer, repack).
    """

    def __init__(self, model: nn.Module, *, schedule: str, n_microbatches: int,
                 loss_fn: Callable[..., torch.Tensor], pp: int, dp: int = 1,
                 device: Optional[torch.device] = None,
                 optimizer: Callable[[List[nn.Parameter]], torch.optim.Optimizer],
                 lr_scheduler: Optional[Callable[[torch.optim.Optimizer], Any]] = None,
                 boundaries: Optional[Sequence[int]] = None, stages_per_rank: int = 2,
                 coordinator: Optional[str] = None, job: str = "pipelining",
                 policy: Optional[Dict[str, Any]] = None,
                 coordinator_flags: Sequence[str] = (), token_file: Optional[str] = None,
                 tls_ca: Optional[str] = None, blocks: str = "layers",
                 first: Sequence[str] = ("tok_embeddings",),
                 last: Sequence[str] = ("norm", "output"),
                 measure_activations: bool = True, timing: bool = True) -> None:
        if not dist.is_initialized():
            raise RuntimeError("dynmo.pipelining: call torch.distributed.init_process_group "
                               "first")
        if n_microbatches < 1:
            raise ValueError(f"dynmo.pipelining: n_microbatches must be >= 1, "
                             f"got {n_microbatches}")
        self._schedule_cls = schedule_class(schedule)
        self.schedule_name = _canonical(self._schedule_cls)
        single = issubclass(self._schedule_cls, PipelineScheduleSingle)
        v = 1 if single else stages_per_rank
        if not single and v < 1:
            raise ValueError(f"dynmo.pipelining: stages_per_rank must be >= 1, got {v}")
        if self.schedule_name in _V_STYLE and v != 2:
            raise ValueError(f"dynmo.pipelining: {self.schedule_name} needs exactly 2 stages "
                             f"per rank, got {v}")
        if self.schedule_name in _V_STYLE and dist.get_backend() == "gloo":
            # torch 2.11 opens each stage's links with a send to its neighbour's
            # rank; under "v" placement two neighbours share a rank and Gloo
            # cannot send to itself ("Pair is not connected").
            raise ValueError(f"dynmo.pipelining: {self.schedule_name} cannot run over Gloo in "
                             f"torch 2.11 (its stages send to their own rank); use NCCL or "
                             f"InterleavedZeroBubble")
        if self.schedule_name in _SPLIT_BACKWARD and dp > 1:
            # Measured here: under DDP the W actions' weight gradients are
            # not averaged (DDP's reducer never sees them), so the replicas
            # of every stage but the first drift apart.
            raise ValueError(f"dynmo.pipelining: {self.schedule_name} with dp {dp}: DDP does "
                             f"not average the gradients its W actions compute in torch 2.11 "
                             f"(the replicas would drift apart); use GPipe, 1F1B, "
                             f"Interleaved1F1B or LoopedBFS with dp > 1")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.n_microbatches = n_microbatches
        self.loss_fn = loss_fn
        self.layout = ModelLayout(model, blocks, first, last)
        self.topology = Topology(pp, dp, v, "v" if self.schedule_name in _V_STYLE else "loop")
        stages = self.topology.num_stages
        if stages > self.layout.num_layers:
            raise ValueError(f"dynmo.pipelining: {stages} stages for {self.layout.num_layers} "
                             f"layers: a stage needs at least one")
        self.boundaries = self.layout.check_boundaries(
            boundaries if boundaries is not None else
            [self.layout.num_layers * s // stages for s in range(stages + 1)], stages)
        self.stage_ids = list(range(stages))  # the active (original) stage ids
        self.epoch = 0
        self.released = False
        self.last_moved_bytes = 0
        held = [i for s in self.topology.local_stages() for i in self._range(s)]
        self.parts = ModelParts(model, self.layout, held, self.device)
        self.optimizer = optimizer(self.parts.parameters())
        self.lr_scheduler = lr_scheduler(self.optimizer) if lr_scheduler else None
        if coordinator and not timing:
            raise ValueError("dynmo.pipelining: timing=False leaves the coordinator nothing to "
                             "decide from")
        self._timing = timing
        self.timer = LayerTimer(self.device, measure_activations=measure_activations)
        self.layer_seconds: Dict[int, float] = {}  # the last iteration's, per layer
        # Activation bytes per layer and micro-batch, counted on sampled
        # iterations only (a Python hook per saved tensor costs ~5% of a
        # small model's step): the first after each build, then every
        # ``activation_sample_every``.
        self.activation_sample_every = 16
        self._activation_bytes: Dict[int, int] = {}
        self._sample_activations = measure_activations
        self._wgrad_marks: List[tuple] = []  # (start, end, layer shares) per W action
        self.weight_gradient_seconds: Dict[int, float] = {}
        self._build()
        self._agents: Dict[int, Any] = {}
        self._local_coordinator = None
        if coordinator:
            self._connect(coordinator, job, policy or {}, list(coordinator_flags),
                          token_file, tls_ca)

    # ---- what the user's loop reads ----------------------------------------

    @property
    def has_first_stage(self) -> bool:
        return any(self._position(s) == 0 for s in self.local_stage_ids)

    @property
    def has_last_stage(self) -> bool:
        return any(self._position(s) == len(self.stage_ids) - 1 for s in self.local_stage_ids)

    @property
    def local_stage_ids(self) -> List[int]:
        """The (original) ids of the stages this rank runs."""
        positions = self.topology.local_stages()
        return [self.stage_ids[p] for p in positions]

    def layers_of(self, stage: int) -> range:
        return self._range(stage)

    def held_layers(self) -> Dict[int, List[nn.Module]]:
        """The layers this rank holds now: layer id -> its modules (to apply
        a per-layer setting such as freezing; re-apply after a plan)."""
        return dict(self.parts.held)

    def step(self, *args, target=None, losses: Optional[list] = None, **kwargs):
        """``schedule.step`` with the inputs only the first stage takes and
        the target only the last stage takes (torchtitan's train step)."""
        if self.released:
            raise RuntimeError("dynmo.pipelining: this rank was released by a re-pack plan")
        if not self.has_first_stage:
            args, kwargs = (), {}
        if not self.has_last_stage:
            target, losses = None, None
        return self.schedule.step(*args, target=target, losses=losses, **kwargs)

    # ---- iteration boundaries ----------------------------------------------

    def begin_iteration(self, iteration: int) -> Optional[Plan]:
        """Applies the committed plan due at ``iteration`` when every rank
        holds it; returns the plan applied (else None). Collective."""
        self.last_moved_bytes = 0
        plan = self._apply_due_plan(iteration)
        self.timer.measure_activations = self._sample_activations and (
            not self._activation_bytes or iteration % self.activation_sample_every == 0)
        return plan

    def _apply_due_plan(self, iteration: int) -> Optional[Plan]:
        if not self._agents or self.released:
            return None
        plans = [a.plan_to_apply_at(iteration) for a in self._agents.values()]
        plan = plans[0] if all(p is not None and p.epoch == plans[0].epoch for p in plans) \
            else None
        held_by_all = agree_on_plan(plan, group=self.topology.job_group, device=self._wire)
        if not held_by_all:
            if plan is not None:
                self._acknowledge(plan, False, "not every rank holds this epoch")
            return None
        why = self.check_plan(plan)
        if why:
            _log.warning("dynmo.pipelining: plan epoch %d not applied: %s", plan.epoch, why)
            self._acknowledge(plan, False, why)
            return None
        self.apply_plan(plan)
        self._acknowledge(plan, True, "")
        return plan

    def end_iteration(self, iteration: int) -> None:
        """Reports this iteration's per-layer costs (after optimizer.step)."""
        timings = self.timer.collect()
        wgrad = self._collect_weight_gradients()
        self.weight_gradient_seconds = wgrad  # the last iteration's W time, per layer
        self.layer_seconds = {i: t.fwd_s + t.bwd_s + wgrad.get(i, 0.0)
                              for i, t in timings.items()}
        if self.timer.measure_activations:
            self._activation_bytes = {i: t.activation_bytes // self.n_microbatches
                                      for i, t in timings.items()}
        if not self._agents or self.released:
            return
        m = self.n_microbatches
        for stage, agent in self._agents.items():
            costs = []
            for layer in self._range(stage):
                t = timings.get(layer)
                params = sum(p.numel() for mod in self.parts.held[layer]
                             for p in mod.parameters())
                costs.append(LayerCost(
                    layer=layer, fwd_s=t.fwd_s / m if t else 0.0,
                    bwd_s=t.bwd_s / m if t else 0.0, wgrad_s=wgrad.get(layer, 0.0) / m,
                    params=params, resident_bytes=self._resident(layer),
                    activation_bytes=self._activation_bytes.get(layer, 0)))
            agent.report(iteration, costs, memory_used_bytes=self._memory_used(costs))

    @property
    def is_reporter(self) -> bool:
        """True on the lowest global rank still in the job (it logs)."""
        topo = self.topology
        return not self.released and topo.rank == topo.global_rank(topo.active_pp_ranks[0], 0)

    def iteration_summary(self, loss: Optional[float], elapsed_s: float) -> Dict[str, Any]:
        """What the job did this iteration, gathered from every rank still in
        it (collective over them): ``loss`` (the mean over replicas of the
        last stage's), ``iteration_s`` (the slowest rank's), ``moved_bytes``
        (the plan's, all ranks), ``stage_times`` (per active stage, its
        layers' measured seconds, the slowest replica's)."""
        stages = len(self.stage_ids)
        row = torch.zeros(4 + stages, dtype=torch.float64)
        if loss is not None:
            row[0], row[1] = loss, 1.0
        row[2], row[3] = elapsed_s, float(self.last_moved_bytes)
        for stage in self.local_stage_ids:
            row[4 + self._position(stage)] = sum(self.layer_seconds.get(i, 0.0)
                                                 for i in self._range(stage))
        group = self.topology.job_group
        row = row.to(self._wire)
        rows = [torch.zeros_like(row) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, row, group=group)
        table = torch.stack([r.cpu() for r in rows])
        held = table[:, 1] > 0
        return {"loss": float(table[held, 0].mean()) if bool(held.any()) else float("nan"),
                "iteration_s": float(table[:, 2].max()),
                "moved_bytes": int(table[:, 3].sum()),
                "stage_times": [float(x) for x in table[:, 4:].max(dim=0).values]}

    def close(self) -> None:
        """Flushes and stops the agents, then the embedded coordinator.
        Collective (a barrier over the world) when a coordinator was started."""
        for a in self._agents.values():
            a.flush(5.0)
            a.stop()
        self._agents = {}
        if self._local_coordinator is not None or dist.get_world_size() > 1:
            dist.barrier()
        if self._local_coordinator is not None:
            self._local_coordinator.stop()
            self._local_coordinator = None

    # ---- plans -------------------------------------------------------------

    def check_plan(self, plan: Plan) -> str:
        """Why ``plan`` cannot apply to this job ("" when it can). Pure:
        every rank reaches the same answer."""
        if plan.reshape:
            return (f"re-shaping to pp {plan.reshape['pipeline_size']} x dp "
                    f"{plan.reshape['data_parallel_size']} needs a restart under "
                    f"torch.distributed.pipelining (docs/python.md)")
        L = self.layout.num_layers
        active = list(plan.active_stages)
        if not active or any(s not in self.stage_ids for s in active):
            return f"active stages {active} are not stages of this job {self.stage_ids}"
        if len(plan.boundaries) != len(active) + 1 or plan.boundaries[0] != 0 or \
                plan.boundaries[-1] != L or \
                any(x >= y for x, y in zip(plan.boundaries, plan.boundaries[1:])):
            return (f"boundaries {list(plan.boundaries)} are not {len(active) + 1} increasing "
                    f"layer ids from 0 to {L}")
        for move in plan.migrations:
            if not 0 <= move.layer < L:
                return f"it moves layer {move.layer}, which the model lacks (0..{L - 1})"
            if move.from_stage not in self.stage_ids or move.to_stage not in self.stage_ids:
                return f"it moves layer {move.layer} between unknown stages"
        if plan.released_stages:
            if self.topology.v != 1:
                return (f"re-packing is offered for one stage per rank; {self.schedule_name} "
                        f"runs {self.topology.v}")
            if sorted(set(active) | set(plan.released_stages)) != sorted(self.stage_ids):
                return "active and released stages do not cover the job's stages"
        # The moves must turn today's layout into the plan's.
        owner = {i: s for s in self.stage_ids for i in self._range(s)}
        for move in plan.migrations:
            if owner.get(move.layer) != move.from_stage:
                return (f"it moves layer {move.layer} from stage {move.from_stage}, which does "
                        f"not hold it")
            owner[move.layer] = move.to_stage
        for i, s in enumerate(active):
            for layer in range(plan.boundaries[i], plan.boundaries[i + 1]):
                if owner[layer] != s:
                    return f"after its moves layer {layer} is not on stage {s}"
        return ""

    def apply_plan(self, plan: Plan) -> int:
        """Executes ``plan`` (checked first: ValueError, nothing changed, when it
        cannot apply); returns the bytes this rank sent and received."""
        why = self.check_plan(plan)
        if why:
            raise ValueError(f"dynmo.pipelining: plan epoch {plan.epoch}: {why}")
        topo = self.topology
        mine = set(self.local_stage_ids)
        moved = 0
        wire = self._p2p_group()
        for move in plan.migrations:
            # Stage ids are original ids; the topology places positions
            # among the stages active before this plan.
            src = topo.rank_of_stage(self._position(move.from_stage))
            dst = topo.rank_of_stage(self._position(move.to_stage))
            if move.from_stage in mine and move.to_stage in mine:
                continue  # both stages run here: the module stays where it is
            if move.from_stage in mine:
                moved += send_layer(self.parts.held.pop(move.layer), self.optimizer, dst, wire)
            elif move.to_stage in mine:
                modules = self.parts.empty_layer(move.layer)
                moved += recv_layer(modules, self.optimizer, src, wire, self.lr_scheduler)
                self.parts.held[move.layer] = modules
        released = set(plan.released_stages)
        # The pipeline ranks that stay, placed by today's stage positions.
        keep = sorted({topo.pp_rank_of_stage(self._position(s)) for s in plan.active_stages})
        self.stage_ids = list(plan.active_stages)
        self.boundaries = list(plan.boundaries)
        self.epoch = plan.epoch
        self.last_moved_bytes = moved
        if released:
            was_here = bool(mine & released)
            topo.shrink(keep)
            if was_here:
                self._release()
                return moved
        self._build()
        return moved

    # ---- internals ---------------------------------------------------------

    def _position(self, stage: int) -> int:
        return self.stage_ids.index(stage)

    def _range(self, stage: int) -> range:
        i = self._position(stage)
        return range(self.boundaries[i], self.boundaries[i + 1])

    @property
    def _wire(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _p2p_group(self) -> Optional[dist.ProcessGroup]:
        return None  # moves address global ranks over the world group

    def _build(self) -> None:
        """Chunks, PipelineStages (in DDP when dp > 1), schedule and timer for
        the current layout."""
        topo = self.topology
        self.stage_modules: List[nn.Module] = []
        stages = []
        timed: Dict[int, Any] = {}
        for position in topo.local_stages():
            stage = self.stage_ids[position]
            r = self._range(stage)
            chunk = self.parts.chunk(r.start, r.stop)
            for layer in r:
                mods = self.parts.held[layer]
                timed[layer] = mods[0] if len(mods) == 1 else mods
            self.stage_modules.append(chunk)
            stages.append(PipelineStage(self._data_parallel(chunk), position, topo.num_stages,
                                        self.device, group=topo.pp_group))
        self.pipeline_stages = stages
        self._activation_bytes = {}  # the layers changed: sample anew
        self._grad_signature = self._requires_grad_signature()
        if self._timing:
            self.timer.attach(timed)
        if self._timing and self.schedule_name in _SPLIT_BACKWARD:
            for s in stages:
                self._time_weight_gradients(s)
        if issubclass(self._schedule_cls, PipelineScheduleSingle):
            self._schedule = self._schedule_cls(stages[0], n_microbatches=self.n_microbatches,
                                                loss_fn=self.loss_fn)
        else:
            self._schedule = self._schedule_cls(stages, n_microbatches=self.n_microbatches,
                                                loss_fn=self.loss_fn)

    @property
    def schedule(self):
        """The schedule to ``step``: rebuilt after a plan, and under dp > 1 also
        when the set of trainable parameters changed (DDP registers them at
        construction; freezing a layer changes it)."""
        if self.released:
            return None
        if self.topology.dp > 1 and self._requires_grad_signature() != self._grad_signature:
            # Every replica of a stage changes alike (same layers, same
            # iteration), so the DDP constructor's collective matches; the
            # stages and the schedule stay, as do their neighbours'.
            for stage, chunk in zip(self.pipeline_stages, self.stage_modules):
                stage.submod = self._data_parallel(chunk)
            self._grad_signature = self._requires_grad_signature()
        return self._schedule

    def _data_parallel(self, chunk: nn.Module) -> nn.Module:
        """``chunk`` in DDP over its stage's replicas (dp > 1), else itself."""
        if self.topology.dp == 1:
            return chunk
        return nn.parallel.DistributedDataParallel(
            chunk, process_group=self.topology.dp_group, broadcast_buffers=False,
            device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def _requires_grad_signature(self):
        return tuple(p.requires_grad for p in self.parts.parameters())

    def _time_weight_gradients(self, stage: PipelineStage) -> None:
        """Times the schedule's W actions of ``stage`` with the layer timer's
        clock (CUDA events on a GPU: no host sync; read in end_iteration)
        and shares each among its layers in proportion to their parameter
        counts (weight-gradient work scales with the weights)."""
        layers = list(self._range(self.stage_ids[stage.stage_index]))
        sizes = {i: sum(p.numel() for m in self.parts.held[i] for p in m.parameters())
                 for i in layers}
        total = float(sum(sizes.values())) or 1.0
        shares = [(i, sizes[i] / total) for i in layers]
        inner = stage.backward_weight_one_chunk
        clock = self.timer.clock

        def timed(*args, **kwargs):
            start = clock.mark()
            out = inner(*args, **kwargs)
            self._wgrad_marks.append((start, clock.mark(), shares))
            return out

        stage.backward_weight_one_chunk = timed

    def _collect_weight_gradients(self) -> Dict[int, float]:
        marks, self._wgrad_marks = self._wgrad_marks, []
        out: Dict[int, float] = {}
        if not marks:
            return out
        seconds = self.timer.clock.seconds([(a, b) for a, b, _ in marks])
        for spent, (_, _, shares) in zip(seconds, marks):
            for layer, share in shares:
                out[layer] = out.get(layer, 0.0) + spent * share
        return out

    def _resident(self, layer: int) -> int:
        total = 0
        for m in self.parts.held[layer]:
            for p in m.parameters():
                total += tensor_bytes(p)
                if p.grad is not None:
                    total += tensor_bytes(p.grad)
                for v in self.optimizer.state.get(p, {}).values():
                    if isinstance(v, torch.Tensor):
                        total += tensor_bytes(v)
            for b in m.buffers():
                total += tensor_bytes(b)
        return total

    def _memory_used(self, costs: List[LayerCost]) -> int:
        if self.device.type == "cuda":
            # What the caching allocator holds, cached blocks included: what
            # the process really takes from the device.
            return int(torch.cuda.memory_reserved(self.device))
        return sum(c.resident_bytes for c in costs)

    def _release(self) -> None:
        """A re-pack released this rank: drop its layers, state and agents."""
        self.released = True
        self.timer.detach()
        self.parts.held.clear()
        self.optimizer.state.clear()
        for g in self.optimizer.param_groups:
            g["params"] = []
        self.pipeline_stages = []
        self.stage_modules = []
        self._schedule = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        _log.info("dynmo.pipelining: rank %d released at epoch %d", self.topology.rank,
                  self.epoch)

    def _acknowledge(self, plan: Plan, applied: bool, detail: str) -> None:
        for a in self._agents.values():
            try:
                a.acknowledge(plan.epoch, applied, detail)
            except Exception as e:  # an old epoch or a lost session: say it, go on
                _log.warning("dynmo.pipelining: acknowledge epoch %d: %s", plan.epoch, e)

    def _connect(self, coordinator: str, job: str, policy: Dict[str, Any], flags: List[str],
                 token_file: Optional[str], tls_ca: Optional[str]) -> None:
        import dynmo  # the C++ agent; only needed with a coordinator
        topo = self.topology
        address = coordinator
        if coordinator == "embedded":
            port = torch.zeros(1, dtype=torch.int64, device=self._wire)
            if topo.rank == 0:
                trigger = policy.get("trigger", "every:5")
                extra = [f"--trigger={trigger}"]
                if policy.get("repack"):
                    extra.append("--repack=true")
                self._local_coordinator = dynmo.LocalCoordinator(extra + flags)
                port[0] = self._local_coordinator.port
            dist.broadcast(port, 0)
            address = f"127.0.0.1:{int(port.item())}"
        stages = len(self.stage_ids)
        for stage in self.local_stage_ids:
            self._agents[stage] = dynmo.Agent(
                address, job, stage * topo.dp + topo.dp_rank, pipeline_rank=stage,
                pipeline_size=stages, data_parallel_rank=topo.dp_rank,
                data_parallel_size=topo.dp, num_layers=self.layout.num_layers,
                boundaries=self.boundaries, microbatches=self.n_microbatches,
                schedule=_agent_schedule(self.schedule_name),
                model_fingerprint=f"pipelining:{self.layout.num_layers}",
                host=socket.gethostname(),
                device=(self.device.index or 0) * topo.v + self.local_stage_ids.index(stage),
                token_file=token_file, tls_ca=tls_ca, connect_timeout_s=20)
        if topo.rank == 0 and coordinator != "embedded" and policy:
            token = dynmo._core.read_token(token_file) if token_file else None
            dynmo.set_policy(address, job, token=token, tls_ca=tls_ca, **policy)


def _agent_schedule(name: str) -> str:
    """The coordinator's schedule name for the bubble model."""
    if name == "GPipe":
        return "gpipe"
    return "zb-h1" if name in _SPLIT_BACKWARD else "1f1b"
