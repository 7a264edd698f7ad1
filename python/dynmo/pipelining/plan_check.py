"""Whether a committed plan can apply to a running pipeline, as a pure
function of the plan and the job's layout (every rank reaches the same
answer, so a refused plan is refused everywhere and changes nothing).

    why = plan_problem(plan, stage_ids=[0, 1], boundaries=[0, 4, 8],
                       num_layers=8, stages_per_rank=1, schedule="1F1B")
    # "" when it applies, else one line saying why not

Stage ids are the job's original ones (``stage_ids``: the active ones in
order, ``boundaries`` over them), as the plan names them.
"""
from __future__ import annotations

from typing import Sequence

from dynmo.types import Plan


def plan_problem(plan: Plan, *, stage_ids: Sequence[int], boundaries: Sequence[int],
                 num_layers: int, stages_per_rank: int, schedule: str) -> str:
    """Why ``plan`` cannot apply ("" when it can)."""
    if plan.reshape:
        return (f"re-shaping to pp {plan.reshape['pipeline_size']} x dp "
                f"{plan.reshape['data_parallel_size']} needs a restart under "
                f"torch.distributed.pipelining (docs/python.md)")
    L = num_layers
    active = list(plan.active_stages)
    if not active or any(s not in stage_ids for s in active):
        return f"active stages {active} are not stages of this job {list(stage_ids)}"
    b = list(plan.boundaries)
    if len(b) != len(active) + 1 or b[0] != 0 or b[-1] != L or \
            any(x >= y for x, y in zip(b, b[1:])):
        return f"boundaries {b} are not {len(active) + 1} increasing layer ids from 0 to {L}"
    for move in plan.migrations:
        if not 0 <= move.layer < L:
            return f"it moves layer {move.layer}, which the model lacks (0..{L - 1})"
        if move.from_stage not in stage_ids or move.to_stage not in stage_ids:
            return f"it moves layer {move.layer} between unknown stages"
    if plan.released_stages:
        if stages_per_rank != 1:
            return (f"re-packing is offered for one stage per rank; {schedule} runs "
                    f"{stages_per_rank}")
        if sorted(set(active) | set(plan.released_stages)) != sorted(stage_ids):
            return "active and released stages do not cover the job's stages"
    # The moves must turn today's layout into the plan's.
    owner = {i: s for k, s in enumerate(stage_ids)
             for i in range(boundaries[k], boundaries[k + 1])}
    for move in plan.migrations:
        if owner.get(move.layer) != move.from_stage:
            return (f"it moves layer {move.layer} from stage {move.from_stage}, which does "
                    f"not hold it")
        owner[move.layer] = move.to_stage
    for k, s in enumerate(active):
        for layer in range(b[k], b[k + 1]):
            if owner[layer] != s:
                return f"after its moves layer {layer} is not on stage {s}"
    return ""
