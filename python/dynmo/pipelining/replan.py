"""How one rank carries out a committed plan: ``apply_due_plan`` (every
rank agrees in-band on the plan due, at the boundary or started a boundary
early (plan_agreement.py); it is checked, applied and
acknowledged), ``execute_plan`` (the moves through
``dynmo.torch.migration.migrate``, then the plan's layout adopted, the
groups shrunk for a re-pack and the pipeline rebuilt) and ``release`` (a
re-pack gave this rank back). Functions over a ``DynamicPipeline``; not
thread-safe: the training thread.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from dynmo.torch.migration import MigrationError, Transfer, migrate
from dynmo.types import Plan

_log = logging.getLogger("dynmo.pipelining")


def apply_due_plan(pipe, iteration: int) -> Optional[Plan]:
    """The committed plan due at ``iteration``, applied when every rank
    holds it and it passes its checks (else None), and acknowledged; then,
    with the early agreement, the one on the next boundary's plan is
    started (plan_agreement.py)."""
    if pipe._link is None or pipe.released:
        return None
    link = pipe._link
    plan, agreed = pipe._agreement.agree(iteration, link.plan_due,
                                         pipe.topology.control_group)
    applied = _apply_agreed(pipe, plan, agreed)
    if not pipe.released:
        pipe._agreement.start_next(iteration + 1, link.plan_due,
                                   pipe.topology.control_group)
    return applied


def _apply_agreed(pipe, plan: Optional[Plan], agreed: bool) -> Optional[Plan]:
    if not agreed:
        if plan is not None:
            pipe._link.acknowledge(plan, False, "not every rank holds this epoch")
        return None
    why = pipe.check_plan(plan)
    if why:
        _log.warning("dynmo.pipelining: plan epoch %d not applied: %s", plan.epoch, why)
        pipe._link.acknowledge(plan, False, why)
        return None
    try:
        pipe.apply_plan(plan)
    except MigrationError as e:
        pipe._link.acknowledge(plan, False, str(e))
        if not e.recoverable:
            raise
        _log.warning("%s", e)
        return None
    pipe._link.acknowledge(plan, True, "")
    return plan


def execute_plan(pipe, plan: Plan) -> int:
    """``pipe.apply_plan``: checks ``plan``, runs its moves on this rank,
    adopts its layout and rebuilds the pipeline; the bytes moved here."""
    why = pipe.check_plan(plan)
    if why:
        raise ValueError(f"dynmo.pipelining: plan epoch {plan.epoch}: {why}")
    topo = pipe.topology
    mine = set(pipe.local_stage_ids)
    transfers = []
    for move in plan.migrations:
        # Stage ids are original ids; the topology places positions
        # among the stages active before this plan.
        src = topo.rank_of_stage(pipe._position(move.from_stage))
        dst = topo.rank_of_stage(pipe._position(move.to_stage))
        if move.from_stage in mine and move.to_stage in mine:
            continue  # both stages run here: the module stays where it is
        if move.from_stage in mine:
            transfers.append(Transfer(move.layer, src, dst, pipe.parts.held[move.layer],
                                      move.round))
        elif move.to_stage in mine:
            transfers.append(Transfer(move.layer, src, dst, pipe._empty_layer(move.layer),
                                      move.round))
    done = migrate(transfers, pipe.optimizer, rank=topo.rank, device=pipe._wire,
                   group=topo.job_group, epoch=plan.epoch,
                   timeout_s=pipe.migration_timeout_s, lr_scheduler=pipe.lr_scheduler)
    for t in transfers:
        if t.src == topo.rank:
            pipe.parts.held.pop(t.layer)
    pipe.parts.held.update(done.received)
    moved = done.bytes
    released = set(plan.released_stages)
    # The pipeline ranks that stay, placed by today's stage positions.
    keep = sorted({topo.pp_rank_of_stage(pipe._position(s)) for s in plan.active_stages})
    pipe.stage_ids = list(plan.active_stages)
    pipe.boundaries = list(plan.boundaries)
    pipe.epoch = plan.epoch
    pipe.last_moved_bytes = moved
    if released:
        topo.shrink(keep)
    pipe._regroup_ties()  # collective: released ranks take part too
    if released:
        was_here = bool(mine & released)
        if was_here:
            release(pipe)
            return moved
        pipe._warm_job_group()
    pipe._build()
    return moved


def release(pipe) -> None:
    """A re-pack released this rank: drop its layers, state and agents."""
    pipe.released = True
    pipe.meter.detach()
    pipe.parts.held.clear()
    pipe.optimizer.state.clear()
    for g in pipe.optimizer.param_groups:
        g["params"] = []
    pipe.pipeline_stages = []
    pipe.stage_modules = []
    pipe._schedule = None
    if pipe.device.type == "cuda":
        torch.cuda.empty_cache()
    _log.info("dynmo.pipelining: rank %d released at epoch %d", pipe.topology.rank,
              pipe.epoch)
