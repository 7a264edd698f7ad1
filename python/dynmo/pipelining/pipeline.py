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
    pipe.close()                            # after an error: line = pipe.close(error=e)

The steps, in the order the constructor takes them: read the model's
layout (``layout.py``), place ranks and build groups (``topology.py``), keep
this rank's layers (with ``data_parallel="fsdp2"`` each ``fully_shard``ed
over its stage's replicas, ``fsdp.py``), wrap each local stage's chunk in
a ``PipelineStage`` (in DDP over the stage's data-parallel group when
dp > 1, or as the FSDP2 root over its layers), build the
schedule from ``get_schedule_class``, build the optimizer and LR scheduler
with the user's factories over the held parameters, attach the layer timer
and connect one ``dynmo.Agent`` per local stage.

At ``begin_iteration`` (replan.py) every rank of the job agrees in-band
on the plan due (over the CPU control group: no GPU wait; started a
boundary early where the plan lead allows, so no boundary waits on it:
plan_agreement.py);
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

``end_iteration`` (iteration_report.py) reports the newest iteration whose clocks the device has
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
from dynmo.pipelining.arguments import Arguments, check_arguments
from dynmo.pipelining.cost_meter import CostMeter
from dynmo.pipelining.failure import JobFailure, abort_process_groups
from dynmo.pipelining.fsdp import replica_mesh, shard_chunk, shard_layer, sharded_copy
from dynmo.pipelining.iteration_report import gather_summary, report_costs
from dynmo.pipelining.job_link import JobLink
from dynmo.pipelining.plan_agreement import Agreement, BoundaryAgreement, agreement_for
from dynmo.pipelining.layout import ModelParts
from dynmo.pipelining.plan_check import plan_problem
from dynmo.pipelining.replan import apply_due_plan, execute_plan
from dynmo.pipelining.schedules import SPLIT_BACKWARD, V_STYLE, agent_schedule
from dynmo.pipelining.tied import TiedGradients
from dynmo.pipelining.topology import Topology
from dynmo.torch.migration import DEFAULT_TIMEOUT_S
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
    ``MigrationError`` within it). ``connect_timeout_s``: how long each
    agent waits for the coordinator (an unreachable one: ``UnavailableError``). ``data_parallel``: how a stage's
    replicas share its layers, "ddp" (each a full copy, gradients
    all-reduced: the default) or "fsdp2" (each layer ``fully_shard``ed over
    them, parameters and optimizer state DTensors of this replica's shard:
    see ``fsdp.py``; also at dp 1). ``plan_agreement``: when the ranks
    agree on the plan due (plan_agreement.py): "boundary" at each iteration
    boundary (any plan lead), "early" started one boundary ahead so that no
    boundary waits on it (the coordinator's plan lead must be >= 3), "auto"
    (default) early under the embedded coordinator when its lead is >= 3,
    at the boundary otherwise.
    Every argument is checked first (``arguments.py``): a refusal is one
    ``dynmo.InvalidArgumentError`` naming it, before anything is touched.
    From then on an error on one rank ends every rank (``failure.py``;
    ``close(error=e)`` after an error in the loop).
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
                 data_parallel: str = "ddp", connect_timeout_s: float = 20.0,
                 plan_agreement: str = "auto") -> None:
        if not dist.is_initialized():
            raise RuntimeError("dynmo.pipelining: call torch.distributed.init_process_group "
                               "first")
        a = check_arguments({k: v for k, v in locals().items() if k != "self"})
        self._schedule_cls, self.schedule_name = a.schedule_cls, a.schedule_name
        self.data_parallel = data_parallel
        self.migration_timeout_s = float(migration_timeout_s)
        self.speed_probe_every = speed_probe_every
        self._pending_probe = None  # a probe the device has not finished
        self._probe_cadence = _core.ProbeCadence(every=speed_probe_every,
                                                 steady_every=speed_probe_steady_every)
        self._probed_layers: Optional[frozenset] = None  # the held layers last time
        self.device = a.device
        self.n_microbatches = n_microbatches
        self._step_s = 0.0  # this iteration's schedule.step wall seconds
        # The last iteration's seconds outside the layers (end_iteration).
        self.last_exchange_s = 0.0
        self.loss_fn = loss_fn
        self.layout = a.layout
        self.boundaries = a.boundaries
        self.stage_ids = list(range(a.stages))  # the active (original) stage ids
        self.epoch = 0
        self.released = False
        self.last_moved_bytes = 0
        self._timing = timing
        self._link: Optional[JobLink] = None
        # replan.apply_due_plan's; picked once the coordinator's lead is known
        self._agreement: Agreement = BoundaryAgreement()
        self.parts: Optional[ModelParts] = None
        # From here on this rank's error ends every rank (failure.py): the
        # others may already wait in a collective of the steps below.
        self.failure = JobFailure()
        try:
            self._construct(model, a)
        except BaseException as e:
            if self.parts is not None:
                self.parts.restore()
            self.close(error=e, abort=False)
            raise

    def _construct(self, model: nn.Module, a: Arguments) -> None:
        """The constructor's steps after its checks (see the module doc)."""
        g = a.given
        fsdp2 = self.data_parallel == "fsdp2"
        self.topology = Topology(g["pp"], g["dp"], a.v,
                                 "v" if self.schedule_name in V_STYLE else "loop",
                                 replica_groups=fsdp2)
        # The coordinator first: a refused job or an unreachable coordinator
        # fails before the user's model is touched.
        if g["coordinator"]:
            self._link = JobLink.connect(
                g["coordinator"], job=g["job"], stages=self.local_stage_ids,
                num_stages=a.stages, dp=g["dp"], dp_rank=self.topology.dp_rank,
                num_layers=self.layout.num_layers, boundaries=self.boundaries,
                microbatches=self.n_microbatches, schedule=agent_schedule(self.schedule_name),
                device_index=self.device.index or 0, group=self.topology.control_group,
                policy=g["policy"] or {}, flags=g["coordinator_flags"],
                token_file=g["token_file"], tls_ca=g["tls_ca"],
                planned_iterations=g["planned_iterations"],
                connect_timeout_s=g["connect_timeout_s"])
            self.failure.on_peer_failure.append(self._link.stop_coordinator)
            self._agreement = agreement_for(g["plan_agreement"], self._link.plan_lead)
        held = [i for s in self.topology.local_stages() for i in self._range(s)]
        self.parts = ModelParts(model, self.layout, held, self.device)
        self._mesh = replica_mesh(self.topology.dp_group, self.device) if fsdp2 else None
        if self._mesh is not None:
            # Sharded copies: a failure from here on leaves the user's layers whole.
            for layer in list(self.parts.held):
                self.parts.replace_held(layer, sharded_copy(self.parts.held[layer], self._mesh))
        self.optimizer = g["optimizer"](_distinct(self.parts.parameters()))
        self.lr_scheduler = g["lr_scheduler"](self.optimizer) if g["lr_scheduler"] else None
        # A parameter two layers share (tied embeddings) stays one parameter
        # wherever the layers go (tied.py): each rank keeps its copy, the
        # copies' gradients are summed before every optimizer step.
        self._tied = TiedGradients(a.ties) if a.ties else None
        if self._tied is not None:
            self._regroup_ties()
            self.optimizer.register_step_pre_hook(
                lambda opt, args, kwargs: self._tied.sum(self.parts.held))
        self.meter = CostMeter(self.device, self.n_microbatches, g["measure_activations"])
        self._build()
        self._warm_job_group()
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
        plan = apply_due_plan(self, iteration)
        self.meter.begin(iteration)
        self._step_s = 0.0
        return plan

    def end_iteration(self, iteration: int) -> None:
        """Reports per-layer costs (after optimizer.step): this iteration's
        on the CPU, the newest the device has finished on a GPU
        (``iteration_report.report_costs``)."""
        report_costs(self, iteration)

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
        return gather_summary(self, loss, elapsed_s)

    def close(self, barrier: bool = True, error: Optional[BaseException] = None,
              abort: bool = True) -> str:
        """Flushes and stops the agents, then the embedded coordinator.
        Collective with ``barrier``: a barrier over the job's CPU control
        group, bounded by ``migration_timeout_s`` (a rank that never arrives
        is named in the error instead of a hang). After an error on this
        rank pass it as ``error``: every other rank is told and ends within
        seconds (failure.py), this rank's process groups are aborted (unless
        ``abort`` is False), nothing waits on a peer, and the one line to
        print is returned — the first failure's, "rank R failed: ..."."""
        if error is not None:
            self._agreement.drop()  # the next boundary's, in flight: never read
            line = self.failure.announce(error)
            self.failure.stop()  # announced: the watcher has nothing left to do
            if self._link is not None:
                self._link.close(flush_s=0.5)
                self._link.stop_coordinator()
            if abort:
                abort_process_groups()
            return line
        if self._link is not None:
            self._link.close()
        timeout = datetime.timedelta(seconds=self.migration_timeout_s)
        self._agreement.settle(timeout)  # the next boundary's, never read
        if barrier and dist.get_world_size() > 1 and not self.released:
            # The watcher still runs: a rank failing meanwhile ends this one.
            dist.monitored_barrier(group=self.topology.control_group, timeout=timeout)
        self.failure.stop()
        if self._link is not None:
            self._link.stop_coordinator()
        return ""

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
        return execute_plan(self, plan)

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


def _distinct(params: List[nn.Parameter]) -> List[nn.Parameter]:
    """``params`` without repeats (a tied parameter a rank holds in two layers)."""
    seen = set()
    return [p for p in params if id(p) not in seen and not seen.add(id(p))]
