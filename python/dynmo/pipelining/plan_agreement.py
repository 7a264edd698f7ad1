"""The in-band agreement on the plan due, started one boundary early.

Every rank must switch layouts at the same iteration or none may: at each
iteration boundary the ranks all-reduce (held, epoch, epoch²) over the CPU
control group (``dynmo.torch.agree_on_plan``). Done at the boundary itself
that collective is a barrier on every iteration's critical path: each rank
waits for the slowest to arrive and for the round trips (on the 2-core CPU
bench about 1–2 ms of a 195 ms iteration; with thousands of ranks, a Gloo
all-reduce over all of them).

``LaggedAgreement`` starts the agreement on the plan due at iteration k+1
at boundary k, asynchronously, and reads it at boundary k+1, by when the
iteration's pipeline traffic has long carried it: no boundary waits on it.
The one change in meaning: a rank must hold the plan committed one
iteration before its apply iteration (the coordinator's plan lead is 5
iterations under the embedded coordinator, 10 under the daemon); a plan
whose COMMIT arrives later is failed by the agent (``RankState::DueAt``)
and the coordinator decides again, as for any late commit.

The first boundary, and any boundary not reached from the one before
(iterations not consecutive, a resumed run), agrees synchronously, as
before. Not thread-safe: the training thread; every rank of the group
calls ``agree`` at the same boundaries, in the same order.
"""
from __future__ import annotations

import datetime
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist

from dynmo.torch.plan import agree_on_plan
from dynmo.types import Plan


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


class LaggedAgreement:
    """The agreement for the next boundary, in flight between two."""

    def __init__(self) -> None:
        # (iteration, plan held for it, the all-reduce's work, its tensor, world)
        self._next: Optional[Tuple[int, Optional[Plan], object, torch.Tensor, int]] = None

    def agree(self, iteration: int, plan_due: Callable[[int], Optional[Plan]],
              group: dist.ProcessGroup) -> Tuple[Optional[Plan], bool]:
        """The plan due at ``iteration`` as this rank held it and whether
        every rank of the group held the same epoch; collective. Reads the
        agreement started at the boundary before when there is one for this
        iteration, else agrees now."""
        started, self._next = self._next, None
        if started is not None:
            at, plan, work, t, world = started
            work.wait()  # started a boundary ago: done (or its error raised here)
            if at == iteration:
                return plan, _agreed(plan, t, world)
        plan = plan_due(iteration)
        return plan, agree_on_plan(plan, group=group, device=torch.device("cpu"))

    def start_next(self, iteration: int, plan_due: Callable[[int], Optional[Plan]],
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
