"""The ``torch.distributed.pipelining`` schedules a running DynMo job can be
built and rebuilt into: the class for a name, which place their stages in a
V (two per rank, first and last on rank 0), which split the backward into
input and weight gradients, and the coordinator's name for each (its bubble
model). Pure functions over torch's schedule registry.
"""
from __future__ import annotations

from torch.distributed.pipelining.schedules import get_schedule_class

# Schedules a running job can be rebuilt into, with their stage placement.
V_STYLE = {"ZBVZeroBubble", "DualPipeV"}
SPLIT_BACKWARD = {"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}
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
    why = _REFUSED.get(cls.__name__)
    if why:
        raise ValueError(f"dynmo.pipelining: schedule '{name}' cannot run a job: {why}")
    return cls


def canonical_name(cls) -> str:
    """The schedule's name without torch's "Schedule" prefix ("1F1B")."""
    return cls.__name__[len("Schedule"):] if cls.__name__.startswith("Schedule") else \
        cls.__name__


def agent_schedule(name: str) -> str:
    """The coordinator's schedule name for the bubble model."""
    if name == "GPipe":
        return "gpipe"
    return "zb-h1" if name in SPLIT_BACKWARD else "1f1b"
