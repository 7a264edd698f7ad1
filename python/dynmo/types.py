"""Plain values the agent exchanges with the coordinator.

``LayerCost`` is what a rank reports per layer and micro-batch; ``Plan`` is a
layer-to-stage assignment the coordinator committed (proto ``dynmo.v1.Plan``,
docs/protocol.md), with its ``LayerMove`` list and ``CommSplit``; ``AgentStats``
is what an agent says about itself. Immutable dataclasses; thread-safe.

Stage ids are ORIGINAL pipeline ranks; ``boundaries`` are over
``active_stages``: active_stages[i] holds layers [boundaries[i], boundaries[i+1]).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """One layer's measured cost for one micro-batch (seconds, bytes)."""

    layer: int
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    wgrad_s: float = 0.0
    params: int = 0
    resident_bytes: int = 0  # weights + grads + optimizer state
    activation_bytes: int = 0  # stashed activations per micro-batch

    def as_tuple(self) -> Tuple[int, float, float, float, int, int, int]:
        return (self.layer, self.fwd_s, self.bwd_s, self.wgrad_s, self.params,
                self.resident_bytes, self.activation_bytes)


@dataclasses.dataclass(frozen=True)
class LayerMove:
    """Move one layer's state from one stage to another in ``round``."""

    layer: int
    from_stage: int
    to_stage: int
    bytes: int
    round: int


@dataclasses.dataclass(frozen=True)
class CommSplit:
    """How a stage's ranks join the communicator after the plan (-1: released)."""

    stage: int
    color: int
    key: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """A committed layout the job switches to before ``apply_iteration``."""

    job: str
    epoch: int
    apply_iteration: int
    boundaries: List[int]
    active_stages: List[int]
    released_stages: List[int]
    migrations: List[LayerMove]
    split: List[CommSplit]
    migration_bytes: int
    predicted_bottleneck_s: float
    previous_bottleneck_s: float
    reason: str
    decided_unix_nanos: int
    commit_with_prepare: bool
    # Set only by a re-shaping plan: {"pipeline_size", "data_parallel_size",
    # "copy_bytes"} (proto dynmo.v1.Reshape); None otherwise.
    reshape: Optional[Dict[str, int]] = None

    @staticmethod
    def from_dict(d: Dict[str, Any]) -> "Plan":
        fields = dict(d)
        fields["migrations"] = [LayerMove(**m) for m in d["migrations"]]
        fields["split"] = [CommSplit(**c) for c in d["split"]]
        return Plan(**fields)

    def layers_of(self, stage: int) -> range:
        """The layers ``stage`` (an original stage id) holds under this plan."""
        if stage not in self.active_stages:
            return range(0)
        i = self.active_stages.index(stage)
        return range(self.boundaries[i], self.boundaries[i + 1])


@dataclasses.dataclass(frozen=True)
class AgentStats:
    """What an agent says about itself (agent::AgentStats)."""

    connected: bool
    applied_epoch: int
    boundaries: List[int]
    active_stages: List[int]
    released: bool
    reports_sent: int
    samples_dropped: int
    connects: int
    plans_prepared: int
    plans_applied: int
    plans_failed: int
    last_commit_epoch: int
    last_commit_unix_nanos: int
    last_prepare_epoch: int
    last_prepare_unix_nanos: int
    last_error: str
    gave_up: bool = False  # the coordinator refused the registration for good
