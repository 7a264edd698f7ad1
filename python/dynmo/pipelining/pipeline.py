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
this rank's layers (with ``data_parallel="fsdp2"`` each ``fully_shard``ed
over its stage's replicas, ``fsdp.py``), wrap each local stage's chunk in
a ``PipelineStage`` (in DDP over the stage's data-parallel group when
dp > 1, or as the FSDP2 root over its layers), build the
schedule from ``get_schedule_class``, build the optimizer and LR scheduler
with the user's factories over the held parameters, attach the layer timer
and connect one ``dynmo.Agent`` per local stage.

At ``begin_iteration`` every rank of the job agrees in-band on the plan due
(``dynmo.torch.agree_on_plan``, over the CPU control group: no GPU wait);
when all hold it, each replica executes the plan's moves
(``dynmo.torch.migration.migrate``: weights, buffers and the optimizer's
per-parameter state, one batch per round on the job group, confirmed by
every rank before a sender lets go; under FSDP2 each replica moves its
shards), then the chunks, the ``PipelineStage`` objects, DDP or the FSDP2
roots and the schedule are rebuilt and the optimizer
and scheduler objects stay the same. A peer that dies or stops answering
mid-migration raises ``MigrationError`` on every survivor within
``migration_timeout_s``; a layer that does not match changes nothing
anywhere and the plan is acknowledged as not applied.

``end_iteration`` reports the newest iteration whose clocks the device has
finished (``CostMeter``: on a GPU usually the one before, never a wait),
with parameter counts and resident bytes computed once per plan; an MoE
model's tokens per expert of that iteration are read with them
(``tokens_per_expert``).

A re-pack plan also shrinks the
groups to the ranks that stay; a released rank frees its layers and
``released`` turns true (its loop ends). Re-shape plans are refused (see
docs/python.md). A plan that fails its checks changes nothing: it is
acknowledged as not applied and training goes on with the layout it had.
Not thread-safe: the training thread.
"""
from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from dynmo import _core
from dynmo.pipelining.cost_meter import CostMeter
from dynmo.pipelining.fsdp import replica_mesh, shard_chunk, shard_layer
from dynmo.pipelining.job_link import JobLink
from dynmo.pipelining.layout import ModelLayout, ModelParts
from dynmo.pipelining.plan_check import plan_problem
from dynmo.pipelining.schedules import (SPLIT_BACKWARD, V_STYLE, agent_schedule, canonical_name,
                                       schedule_class)
from dynmo.pipelining.tied import TiedGradients, find_ties
from dynmo.pipelining.topology import Topology
from dynmo.torch.memory import device_memory
from dynmo.torch.plan import agree_on_plan
from dynmo.torch.migration import DEFAULT_TIMEOUT_S, MigrationError, Transfer, migrate
from dynmo.torch.speed_probe import launch_probe
from dynmo.types import Plan

_log = logging.getLogger("dynmo.pipelining")

class DynamicPipeline:
    """One rank's part of a pipelined model that DynMo may re-split live.

    ``model``: the model as it is — torchtitan's or a transformers causal
    LM's layout is recognised, another's pieces are named with ``blocks``,
    ``first`` and ``last`` (dotted paths; see ``ModelLayout``) — with the
    same initial weights on every rank (build it under the same seed). The
    constructor takes it apart once it has built the pipeline (a model it
    refuses, or a constructor that fails, keeps its modules); use
    ``pipe.stage_modules`` afterwards.
    ``schedule``: a name ``get_schedule_class`` knows. ``stages_per_rank``:
    virtual stages per rank for multi-stage schedules (2 by default).
    ``boundaries``: the initial split over ``pp * stages_per_rank`` stages
    (default: even). ``optimizer(params)`` and ``lr_scheduler(optimizer)``
    build this rank's optimizer and scheduler. ``coordinator``: None (static),
    "embedded" (global rank 0 starts a ``dynmo-coordinator`` on loopback) or
    "HOST:PORT"; ``policy`` the job's policy keywords for ``dynmo.set_policy``
    (trigger, balancer, repack). ``planned_iterations``: the steps the run
    trains in all (0: unknown), so the coordinator pays for no move the run
    ends before repaying. ``speed_probe_every``: iterations between speed
    probes while the rank is watched (its first probes, and whenever the
    time its layers take moves); ``speed_probe_steady_every`` otherwise
    (``dynmo._core.ProbeCadence``; 0: never probe). ``migration_timeout_s``:
    the bound on every wait of a migration (a dead peer raises
    ``MigrationError`` within it). ``data_parallel``: how a stage's
    replicas share its layers, "ddp" (each a full copy, gradients
    all-reduced: the default) or "fsdp2" (each layer ``fully_shard``ed over
    them, parameters and optimizer state DTensors of this replica's shard:
    see ``fsdp.py``; also at dp 1).
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
                 tls_ca: Optional[str] = None, blocks: Optional[str] = None,
                 first: Optional[Sequence[str]] = None,
                 last: Optional[Sequence[str]] = None,
                 measure_activations: bool = True, timing: bool = True,
                 speed_probe_every: int = 5, speed_probe_steady_every: int = 25,
                 planned_iterations: int = 0,
                 migration_timeout_s: float = DEFAULT_TIMEOUT_S,
                 data_parallel: str = "ddp") -> None:
        if not dist.is_initialized():
            raise RuntimeError("dynmo.pipelining: call torch.distributed.init_process_group "
                               "first")
        if n_microbatches < 1:
            raise ValueError(f"dynmo.pipelining: n_microbatches must be >= 1, "
                             f"got {n_microbatches}")
        self._schedule_cls = schedule_class(schedule)
        self.schedule_name = canonical_name(self._schedule_cls)
        single = issubclass(self._schedule_cls, PipelineScheduleSingle)
        v = 1 if single else stages_per_rank
        if not single and v < 1:
            raise ValueError(f"dynmo.pipelining: stages_per_rank must be >= 1, got {v}")
        if self.schedule_name in V_STYLE and v != 2:
            raise ValueError(f"dynmo.pipelining: {self.schedule_name} needs exactly 2 stages "
                             f"per rank, got {v}")
        if self.schedule_name in V_STYLE and dist.get_backend() == "gloo":
            # torch 2.11 opens each stage's links with a send to its neighbour's
            # rank; under "v" placement two neighbours share a rank and Gloo
            # cannot send to itself ("Pair is not connected").
            raise ValueError(f"dynmo.pipelining: {self.schedule_name} cannot run over Gloo in "
                             f"torch 2.11 (its stages send to their own rank); use NCCL or "
                             f"InterleavedZeroBubble")
        if data_parallel not in ("ddp", "fsdp2"):
            raise ValueError(f"dynmo.pipelining: data_parallel must be 'ddp' or 'fsdp2', "
                             f"got {data_parallel!r}")
        self.data_parallel = data_parallel
        fsdp2 = data_parallel == "fsdp2"
        if self.schedule_name in SPLIT_BACKWARD and fsdp2:
            raise ValueError(f"dynmo.pipelining: {self.schedule_name} with data_parallel "
                             f"'fsdp2' is not supported yet (its W actions' gradient "
                             f"reduction under FSDP2 is untested); use GPipe, 1F1B, "
                             f"Interleaved1F1B or LoopedBFS")
        if self.schedule_name in SPLIT_BACKWARD and dp > 1:
            # Measured here: under DDP the W actions' weight gradients are
            # not averaged (DDP's reducer never sees them), so the replicas
            # of every stage but the first drift apart.
            raise ValueError(f"dynmo.pipelining: {self.schedule_name} with dp {dp}: DDP does "
                             f"not average the gradients its W actions compute in torch 2.11 "
                             f"(the replicas would drift apart); use GPipe, 1F1B, "
                             f"Interleaved1F1B or LoopedBFS with dp > 1")
        if speed_probe_every < 0:
            raise ValueError(f"dynmo.pipelining: speed_probe_every must be >= 0 (0: never), "
                             f"got {speed_probe_every}")
        if speed_probe_every > 0 and speed_probe_steady_every < speed_probe_every:
            raise ValueError(f"dynmo.pipelining: speed_probe_steady_every must be >= "
                             f"speed_probe_every ({speed_probe_every}), got "
                             f"{speed_probe_steady_every}")
        if not migration_timeout_s > 0:
            raise ValueError(f"dynmo.pipelining: migration_timeout_s must be > 0, "
                             f"got {migration_timeout_s}")
        self.migration_timeout_s = float(migration_timeout_s)
        self.speed_probe_every = speed_probe_every
        self._pending_probe = None  # a probe the device has not finished
        self._probe_cadence = _core.ProbeCadence(every=speed_probe_every,
                                                 steady_every=speed_probe_steady_every)
        self._probed_layers: Optional[frozenset] = None  # the held layers last time
        if planned_iterations < 0:
            raise ValueError(f"dynmo.pipelining: planned_iterations must be >= 0 (0: unknown), "
                             f"got {planned_iterations}")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.n_microbatches = n_microbatches
        self._step_s = 0.0  # this iteration's schedule.step wall seconds
        # The last iteration's seconds outside the layers (end_iteration).
        self.last_exchange_s = 0.0
        self.loss_fn = loss_fn
        self.layout = ModelLayout(model, blocks, first, last)
        self.topology = Topology(pp, dp, v, "v" if self.schedule_name in V_STYLE else "loop",
                                 replica_groups=fsdp2)
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
        # A parameter two layers share (tied embeddings) stays one parameter
        # wherever the layers go (tied.py): each rank keeps its copy, the
        # copies' gradients are summed before every optimizer step.
        layer_modules = {i: [model.get_submodule(f) for f in self.layout.fqns(i)]
                         for i in range(self.layout.num_layers)}
        ties = find_ties(layer_modules)
        if ties and fsdp2:
            # A tie's copies would be DTensors of two FSDP units; summing
            # their gradients (tied.py) is written for plain tensors.
            raise ValueError("dynmo.pipelining: tied parameters (tied embeddings) with "
                             "data_parallel 'fsdp2' are not supported yet; untie them or "
                             "use 'ddp'")
        self.parts = ModelParts(model, self.layout, held, self.device)
        self._mesh = replica_mesh(self.topology.dp_group, self.device) if fsdp2 else None
        if self._mesh is not None:
            for modules in self.parts.held.values():
                shard_layer(modules, self._mesh)
        self.optimizer = optimizer(_distinct(self.parts.parameters()))
        self.lr_scheduler = lr_scheduler(self.optimizer) if lr_scheduler else None
        self._tied = TiedGradients(ties) if ties else None
        if self._tied is not None:
            self._regroup_ties()
            self.optimizer.register_step_pre_hook(
                lambda opt, args, kwargs: self._tied.sum(self.parts.held))
        if coordinator and not timing:
            raise ValueError("dynmo.pipelining: timing=False leaves the coordinator nothing to "
                             "decide from")
        self._timing = timing
        self.meter = CostMeter(self.device, n_microbatches, measure_activations)
        self._build()
        self._warm_job_group()
        self._link: Optional[JobLink] = None
        if coordinator:
            self._link = JobLink.connect(
                coordinator, job=job, stages=self.local_stage_ids, num_stages=stages,
                dp=dp, dp_rank=self.topology.dp_rank, num_layers=self.layout.num_layers,
                boundaries=self.boundaries, microbatches=n_microbatches,
                schedule=agent_schedule(self.schedule_name),
                device_index=self.device.index or 0, group=self.topology.control_group,
                policy=policy or {}, flags=coordinator_flags, token_file=token_file,
                tls_ca=tls_ca, planned_iterations=planned_iterations)
        self.parts.take_apart(model)  # built: the user's model lets go of its layers

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
        self.meter.begin(iteration)
        self._step_s = 0.0
        return plan

    def _apply_due_plan(self, iteration: int) -> Optional[Plan]:
        if self._link is None or self.released:
            return None
        plan = self._link.plan_due(iteration)
        if not agree_on_plan(plan, group=self.topology.control_group,
                             device=torch.device("cpu")):
            if plan is not None:
                self._link.acknowledge(plan, False, "not every rank holds this epoch")
            return None
        why = self.check_plan(plan)
        if why:
            _log.warning("dynmo.pipelining: plan epoch %d not applied: %s", plan.epoch, why)
            self._link.acknowledge(plan, False, why)
            return None
        try:
            self.apply_plan(plan)
        except MigrationError as e:
            self._link.acknowledge(plan, False, str(e))
            if not e.recoverable:
                raise
            _log.warning("%s", e)
            return None
        self._link.acknowledge(plan, True, "")
        return plan

    def end_iteration(self, iteration: int) -> None:
        """Reports per-layer costs (after optimizer.step): this iteration's
        on the CPU, the newest the device has finished on a GPU."""
        # The schedule's time outside this rank's layers: its sends, receives
        # and the waits for them (and the schedule's own work), all
        # micro-batches. On CPU the layers' clock is the same wall clock; on
        # a GPU the layers' events and the host's clock do not subtract
        # (kernels run behind the host), so nothing is measured there.
        fresh = self.meter.end()
        layers_s = sum(self.meter.layer_seconds.values())
        self.last_exchange_s = (max(0.0, self._step_s - layers_s)
                                if self.device.type == "cpu" and self._step_s > 0 else 0.0)
        if self._link is None or self.released:
            return
        # Every few iterations the speed probe, timed like the layers: the
        # coordinator tells a slow rank from heavy layers by it. Often while
        # the rank is watched (its start, a move in its layers' time), seldom
        # otherwise (ProbeCadence). On a GPU it is read once the device has
        # run it, with a later iteration's report.
        held = frozenset(self.parts.held)
        changed = self._probed_layers is not None and held != self._probed_layers
        self._probed_layers = held
        if self._pending_probe is None and \
                self._probe_cadence.should_probe(iteration, layers_s, changed):
            self._pending_probe = launch_probe(self.device)
        if not fresh:
            return  # the device has not finished a newer iteration yet
        probe_s = self._pending_probe.seconds() if self._pending_probe is not None else None
        if probe_s is not None:
            self._pending_probe = None
        # On a GPU: the reserved peak since the last report plus this rank's
        # share of the context and NCCL, and its share of the device (once
        # per iteration, for every local stage; allocator counters, no wait);
        # (0, 0) on a CPU.
        gpu_used, gpu_capacity = device_memory(self.device)
        measured = self.meter.measured_iteration
        for stage in self._link.agents:
            costs = self.meter.costs(self._range(stage), self.parts.held, self.optimizer)
            used = gpu_used if self.device.type == "cuda" else self.meter.memory_used(costs)
            self._link.report(stage, measured, costs, used, probe_s=probe_s or 0.0,
                              memory_capacity_bytes=gpu_capacity,
                              exchange_s=self.last_exchange_s,
                              # The newest step's host time: on a GPU the
                              # host keeps pace with the device within
                              # MAX_LAG iterations, so it is the device's
                              # step time in the steady state.
                              iteration_s=self._step_s)

    @property
    def layer_seconds(self) -> Dict[int, float]:
        """The last iteration's measured seconds per held layer (all passes)."""
        return self.meter.layer_seconds

    @property
    def tokens_per_expert(self) -> Dict[int, tuple]:
        """Per held MoE layer, the tokens its router sent to each expert in
        the iteration ``layer_seconds`` are of (``routing.py``)."""
        return self.meter.tokens_per_expert

    @property
    def weight_gradient_seconds(self) -> Dict[int, float]:
        """The last iteration's W (weight-gradient) seconds per layer."""
        return self.meter.weight_gradient_seconds

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
        layers' measured seconds, the slowest replica's), and per layer of the
        model, summed over the iteration's micro-batches and the slowest
        replica's: ``layer_forward_s``, ``layer_backward_s`` (input and
        weight gradient, as dynmo-train logs it) and ``layer_weight_grad_s``
        (zero-bubble ``W`` actions) — what ``dynmo.perfetto`` and
        ``dynmo.whatif`` read."""
        stages = len(self.stage_ids)
        n = self.layout.num_layers
        head = 4 + stages
        row = torch.zeros(head + 3 * n, dtype=torch.float64)
        if loss is not None:
            row[0], row[1] = loss, 1.0
        row[2], row[3] = elapsed_s, float(self.last_moved_bytes)
        for stage in self.local_stage_ids:
            row[4 + self._position(stage)] = sum(self.layer_seconds.get(i, 0.0)
                                                 for i in self._range(stage))
        w = self.weight_gradient_seconds
        for layer, seconds in self.layer_seconds.items():
            if 0 <= layer < n:
                fwd = self.meter.forward_seconds.get(layer, 0.0)
                row[head + layer] = fwd
                row[head + n + layer] = seconds - fwd
                row[head + 2 * n + layer] = w.get(layer, 0.0)
        group = self.topology.control_group  # CPU: no wait on a GPU
        rows = [torch.zeros_like(row) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, row, group=group)
        table = torch.stack(rows)
        held = table[:, 1] > 0
        slowest = table.max(dim=0).values
        return {"loss": float(table[held, 0].mean()) if bool(held.any()) else float("nan"),
                "iteration_s": float(table[:, 2].max()),
                "moved_bytes": int(table[:, 3].sum()),
                "stage_times": [float(x) for x in slowest[4:head]],
                "layer_forward_s": [float(x) for x in slowest[head:head + n]],
                "layer_backward_s": [float(x) for x in slowest[head + n:head + 2 * n]],
                "layer_weight_grad_s": [float(x) for x in slowest[head + 2 * n:]]}

    def close(self, barrier: bool = True) -> None:
        """Flushes and stops the agents, then the embedded coordinator.
        Collective with ``barrier``: a barrier over the job's CPU control
        group, bounded by ``migration_timeout_s`` (a rank that never arrives
        is named in the error instead of a hang). After an error on this
        rank pass ``barrier=False``: the others may never arrive."""
        if self._link is not None:
            self._link.close()
        if barrier and dist.get_world_size() > 1 and not self.released:
            dist.monitored_barrier(group=self.topology.control_group,
                                   timeout=datetime.timedelta(seconds=self.migration_timeout_s))
        if self._link is not None:
            self._link.stop_coordinator()

    # ---- plans -------------------------------------------------------------

    def check_plan(self, plan: Plan) -> str:
        """Why ``plan`` cannot apply to this job ("" when it can); the same
        answer on every rank (plan_check.py)."""
        return plan_problem(plan, stage_ids=self.stage_ids, boundaries=self.boundaries,
                            num_layers=self.layout.num_layers,
                            stages_per_rank=self.topology.v, schedule=self.schedule_name)

    def apply_plan(self, plan: Plan) -> int:
        """Executes ``plan`` (checked first: ValueError, nothing changed, when it
        cannot apply); returns the bytes this rank sent and received."""
        why = self.check_plan(plan)
        if why:
            raise ValueError(f"dynmo.pipelining: plan epoch {plan.epoch}: {why}")
        topo = self.topology
        mine = set(self.local_stage_ids)
        transfers = []
        for move in plan.migrations:
            # Stage ids are original ids; the topology places positions
            # among the stages active before this plan.
            src = topo.rank_of_stage(self._position(move.from_stage))
            dst = topo.rank_of_stage(self._position(move.to_stage))
            if move.from_stage in mine and move.to_stage in mine:
                continue  # both stages run here: the module stays where it is
            if move.from_stage in mine:
                transfers.append(Transfer(move.layer, src, dst, self.parts.held[move.layer],
                                          move.round))
            elif move.to_stage in mine:
                transfers.append(Transfer(move.layer, src, dst, self._empty_layer(move.layer),
                                          move.round))
        done = migrate(transfers, self.optimizer, rank=topo.rank, device=self._wire,
                       group=topo.job_group, epoch=plan.epoch,
                       timeout_s=self.migration_timeout_s, lr_scheduler=self.lr_scheduler)
        for t in transfers:
            if t.src == topo.rank:
                self.parts.held.pop(t.layer)
        self.parts.held.update(done.received)
        moved = done.bytes
        released = set(plan.released_stages)
        # The pipeline ranks that stay, placed by today's stage positions.
        keep = sorted({topo.pp_rank_of_stage(self._position(s)) for s in plan.active_stages})
        self.stage_ids = list(plan.active_stages)
        self.boundaries = list(plan.boundaries)
        self.epoch = plan.epoch
        self.last_moved_bytes = moved
        if released:
            topo.shrink(keep)
        self._regroup_ties()  # collective: released ranks take part too
        if released:
            was_here = bool(mine & released)
            if was_here:
                self._release()
                return moved
            self._warm_job_group()
        self._build()
        return moved

    # ---- internals ---------------------------------------------------------

    def _regroup_ties(self) -> None:
        """The groups of the ranks holding each tied parameter's copies, for
        the layout in force (collective over the world)."""
        if self._tied is None:
            return
        topo = self.topology

        def rank_of_layer(layer: int, replica: int) -> int:
            position = next(s for s in range(len(self.stage_ids))
                            if self.boundaries[s] <= layer < self.boundaries[s + 1])
            return topo.global_rank(topo.pp_rank_of_stage(position), replica)

        self._tied.regroup(rank_of_layer, topo.dp, topo.dp_rank)

    def _warm_job_group(self) -> None:
        """Builds the job group's communicator now, with every rank in it: a
        migration's batches then run on it (NCCL needs every rank of a group
        in its first call; torch builds communicators lazily)."""
        if self.topology.job_group is not self.topology.control_group and \
                not self.released and dist.get_world_size() > 1:
            dist.all_reduce(torch.zeros(1, device=self._wire), group=self.topology.job_group)

    def _position(self, stage: int) -> int:
        return self.stage_ids.index(stage)

    def _range(self, stage: int) -> range:
        i = self._position(stage)
        return range(self.boundaries[i], self.boundaries[i + 1])

    @property
    def _wire(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _build(self) -> None:
        """Chunks, PipelineStages (in DDP when dp > 1, FSDP2 roots with
        ``data_parallel="fsdp2"``), schedule and timer for the current layout."""
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
                timed[layer] = mods
            self.stage_modules.append(chunk)
            stages.append(PipelineStage(self._data_parallel(chunk, r), position,
                                        topo.num_stages, self.device, group=topo.pp_group))
        self.pipeline_stages = stages
        self._grad_signature = self._requires_grad_signature()
        if self._timing:
            self.meter.attach(
                timed, [(s, list(self._range(self.stage_ids[s.stage_index]))) for s in stages]
                if self.schedule_name in SPLIT_BACKWARD else [])
        if issubclass(self._schedule_cls, PipelineScheduleSingle):
            self._schedule = self._schedule_cls(stages[0], n_microbatches=self.n_microbatches,
                                                loss_fn=self.loss_fn)
        else:
            self._schedule = self._schedule_cls(stages, n_microbatches=self.n_microbatches,
                                                loss_fn=self.loss_fn)
        self._time_steps(self._schedule)

    def _time_steps(self, schedule) -> None:
        """Times every ``step`` of ``schedule`` however the loop calls it
        (``pipe.step`` or its own ``pipe.schedule.step``, as torchtitan's
        does): the exchanges' time is the steps' less the layers'."""
        untimed = schedule.step

        def step(*args, **kwargs):
            start = time.perf_counter()
            self.meter.routing.step_begins()
            try:
                return untimed(*args, **kwargs)
            finally:
                self.meter.routing.step_ends()
                self._step_s += time.perf_counter() - start

        schedule.step = step

    @property
    def schedule(self):
        """The schedule to ``step``: rebuilt after a plan, and under dp > 1 also
        when the set of trainable parameters changed (DDP registers them at
        construction; freezing a layer changes it; FSDP2 reads it in every
        backward)."""
        if self.released:
            return None
        if self.topology.dp > 1 and self._mesh is None and \
                self._requires_grad_signature() != self._grad_signature:
            # Every replica of a stage changes alike (same layers, same
            # iteration), so the DDP constructor's collective matches; the
            # stages and the schedule stay, as do their neighbours'.
            for stage, chunk in zip(self.pipeline_stages, self.stage_modules):
                stage.submod = self._data_parallel(chunk, self._range(
                    self.stage_ids[stage.stage_index]))
            self._grad_signature = self._requires_grad_signature()
        return self._schedule

    def _data_parallel(self, chunk: nn.Module, layers: range) -> nn.Module:
        """``chunk`` (of ``layers``) as the FSDP2 root over its layers' units,
        or in DDP over its stage's replicas (dp > 1), else itself."""
        if self._mesh is not None:
            return shard_chunk(chunk, [self.parts.held[i] for i in layers], self._mesh)
        if self.topology.dp == 1:
            return chunk
        return nn.parallel.DistributedDataParallel(
            chunk, process_group=self.topology.dp_group, broadcast_buffers=False,
            device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def _empty_layer(self, layer: int) -> List[nn.Module]:
        """An empty ``layer`` to receive a migrated one into: sharded like
        the held ones under FSDP2 (each replica receives its shard)."""
        modules = self.parts.empty_layer(layer)
        if self._mesh is not None:
            shard_layer(modules, self._mesh)
        return modules

    def _requires_grad_signature(self):
        return tuple(p.requires_grad for p in self.parts.parameters())

    def _release(self) -> None:
        """A re-pack released this rank: drop its layers, state and agents."""
        self.released = True
        self.meter.detach()
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


def _distinct(params: List[nn.Parameter]) -> List[nn.Parameter]:
    """``params`` without repeats (a tied parameter a rank holds in two layers)."""
    seen = set()
    return [p for p in params if id(p) not in seen and not seen.add(id(p))]
