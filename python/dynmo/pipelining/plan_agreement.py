"""The in-band agreement on the plan due: at the boundary itself, or
started one boundary early where the coordinator's plan lead allows it.

Every rank must switch layouts at the same iteration or none may: at each
iteration boundary the ranks all-reduce (held, epoch, epoch²) over the CPU
control group (``dynmo.torch.agree_on_plan``).

- ``BoundaryAgreement`` agrees at the boundary itself. Any plan lead works
  (the coordinator's ``--plan_lead_iterations`` >= 2), but the collective is
  a barrier on every iteration's critical path: each rank waits for the
  slowest to arrive and for the round trips (on the 2-core CPU bench about
  1–2 ms of a 195 ms iteration; with thousands of ranks, a Gloo all-reduce
  over all of them).
- ``EarlyAgreement`` starts the agreement on the plan due at iteration k+1
  at boundary k, asynchronously, and reads it at boundary k+1, by when the
  iteration's pipeline traffic has long carried it: no boundary waits on
  it. The price: a rank must hold the plan committed one iteration before
  its apply iteration. A plan whose COMMIT arrives later is failed by the
  agent (``RankState::DueAt``, asked one boundary early) and the
  coordinator decides again, as for any late commit. With a plan lead of 2
  that is every plan (the report of iteration n goes out at the end of n,
  and the boundary that starts the agreement for n + 2 follows at once), so
  it needs a lead of at least ``EARLY_MIN_LEAD``.

``agreement_for`` picks one from the constructor's ``plan_agreement``
("auto": early when the coordinator's plan lead is known to be at least
``EARLY_MIN_LEAD`` — the embedded coordinator's, decided by global rank 0
and broadcast with its port, so every rank picks the same — and at the
boundary otherwise). The first boundary, and any boundary not reached from
the one before (iterations not consecutive, a resumed run), agrees at the
boundary in either. Not thread-safe: the training thread; every rank of the
group calls ``agree`` at the same boundaries, in the same order.
"""
from __future__ import annotations

import datetime
from typing import Callable, Optional, Tuple, Union

import torch
import torch.distributed as dist

from dynmo.torch.plan import agree_on_plan
from dynmo.types import Plan

MODES = ("auto", "early", "boundary")
# The least plan lead (iterations from the report a plan is decided on to
# its apply iteration) at which the early agreement leaves the two-phase
# round trip a whole iteration: report at the end of n, plan issued during
# n + 1, COMMIT held by boundary n + 2, the agreement for n + 3 started there.
EARLY_MIN_LEAD = 3

PlanDue = Callable[[int], Optional[Plan]]


def _held(plan: Optional[Plan]) -> torch.Tensor:
    e = float(plan.epoch) if plan is not None else 0.0
    return torch.tensor([1.0 if plan is not None else 0.0, e, e * e], dtype=torch.float64)


def _agreed(plan: Optional[Plan], t: torch.Tensor, world: int) -> bool:
    e = float(plan.epoch) if plan is not None else 0.0
    # host-sync(cpu): the control group's CPU tensor, its all-reduce done
    # (waited at the boundary after the one that started it).
    held, total, squares = t.tolist()
    w = float(world)
    return plan is not None and held == w and total == w * e and squares == w * e * e


class BoundaryAgreement:
    """Agrees on the plan due at the boundary itself."""

    mode = "boundary"

    def agree(self, iteration: int, plan_due: PlanDue,
              group: dist.ProcessGroup) -> Tuple[Optional[Plan], bool]:
        """The plan due at ``iteration`` as this rank holds it and whether
        every rank of the group holds the same epoch; collective."""
        plan = plan_due(iteration)
        return plan, agree_on_plan(plan, group=group, device=torch.device("cpu"))

    def start_next(self, iteration: int, plan_due: PlanDue,
                   group: dist.ProcessGroup) -> None:
        """Nothing: the next boundary agrees when it comes."""

    def settle(self, timeout: datetime.timedelta) -> None:
        """Nothing in flight."""

    def drop(self) -> None:
        """Nothing in flight."""


class EarlyAgreement(BoundaryAgreement):
    """The agreement for the next boundary, in flight between two."""

    mode = "early"

    def __init__(self) -> None:
        # (iteration, plan held for it, the all-reduce's work, its tensor, world)
        self._next: Optional[Tuple[int, Optional[Plan], object, torch.Tensor, int]] = None

    def agree(self, iteration: int, plan_due: PlanDue,
              group: dist.ProcessGroup) -> Tuple[Optional[Plan], bool]:
        """As ``BoundaryAgreement.agree``, read from the agreement started at
        the boundary before when there is one for this iteration."""
        started, self._next = self._next, None
        if started is not None:
            at, plan, work, t, world = started
            work.wait()  # started a boundary ago: done (or its error raised here)
            if at == iteration:
                return plan, _agreed(plan, t, world)
        return super().agree(iteration, plan_due, group)

    def start_next(self, iteration: int, plan_due: PlanDue,
                   group: dist.ProcessGroup) -> None:
        """Starts the agreement on the plan due at ``iteration`` (the next
        boundary's), on the group in force after this boundary's plan;
        collective, asynchronous."""
        plan = plan_due(iteration)
        t = _held(plan)
        work = dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group, async_op=True)
        self._next = (iteration, plan, work, t, dist.get_world_size(group))

    def settle(self, timeout: datetime.timedelta) -> None:
        """Waits for the agreement in flight, if any (at most ``timeout``),
        and forgets it: at a normal close, so that no Gloo thread holds the
        last reference to its tensor while Python shuts down."""
        started, self._next = self._next, None
        if started is not None:
            started[2].wait(timeout)

    def drop(self) -> None:
        """Forgets the agreement in flight without waiting (after an error:
        the process groups are aborted, a peer may never answer)."""
        self._next = None


Agreement = Union[BoundaryAgreement, EarlyAgreement]


def agreement_for(mode: str, plan_lead: int) -> Agreement:
    """The agreement ``mode`` ("auto", "early", "boundary") names, given the
    coordinator's plan lead (0: unknown). "early" with a known lead under
    ``EARLY_MIN_LEAD`` is a ``ValueError``: no plan would ever apply."""
    if mode not in MODES:
        raise ValueError(f"plan_agreement must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "early" and 0 < plan_lead < EARLY_MIN_LEAD:
        raise ValueError(f"plan_agreement 'early' needs the coordinator's plan lead >= "
                         f"{EARLY_MIN_LEAD}, got --plan_lead_iterations={plan_lead}")
    early = mode == "early" or (mode == "auto" and plan_lead >= EARLY_MIN_LEAD)
    return EarlyAgreement() if early else BoundaryAgreement()


def plan_lead_of(flags) -> int:
    """The plan lead a ``dynmo-coordinator`` started with ``flags`` uses
    (the last ``--plan_lead_iterations`` wins, as absl's flags do); 0 when
    none is given or it does not parse (the coordinator refuses it then)."""
    lead = 0
    it = iter(flags)
    for f in it:
        for name in ("--plan_lead_iterations", "-plan_lead_iterations"):
            if f == name:
                f = f"{name}={next(it, '')}"
            if f.startswith(name + "="):
                try:
                    lead = int(f[len(name) + 1:])
                except ValueError:
                    lead = 0
    return lead
