"""Where the stages of a pp x dp pipeline live, and their process groups.

Ranks are laid out as torchtitan's device mesh ["pp", "dp"] lays them out:
global rank = pp_rank * dp + dp_rank, so replica ``r`` of pipeline stage
position ``p`` is rank ``p * dp + r`` (the same as dynmo-train's
``rank = stage * dp + replica``).

With ``v`` stages per rank (interleaved schedules) there are ``S = pp * v``
stages. "loop" placement puts stage ``s`` on pipeline rank ``s % pp``
(Interleaved1F1B, LoopedBFS, InterleavedZeroBubble); "v" placement puts
stages ``r`` and ``2pp-1-r`` on pipeline rank ``r`` (ZBVZeroBubble,
DualPipeV) — what ``torch.distributed.pipelining`` expects of each.

``Topology`` also makes the groups: per replica the pipeline group its
``PipelineStage`` objects talk over, per stage position the data-parallel
group DDP averages over (FSDP2 shards over; built for dp 1 too when
``replica_groups``), the job group every rank of the job migrates in,
and its CPU twin, the control group (Gloo): the per-iteration agreement on
a plan and the logs' gathers run there, so they never wait on a GPU (the
job group itself when the backend already takes CPU tensors).
``dist.new_group`` is collective over the world, so every rank builds every
group in the same order. Not thread-safe: the training thread.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch.distributed as dist

from dynmo.torch.plan import takes_cpu_tensors


def stage_to_pp_rank(stage: int, pp: int, v: int, style: str) -> int:
    """The pipeline rank that runs ``stage`` of ``pp * v``."""
    if style == "v":
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def stages_of_pp_rank(pp_rank: int, pp: int, v: int, style: str) -> List[int]:
    return [s for s in range(pp * v) if stage_to_pp_rank(s, pp, v, style) == pp_rank]


class Topology:
    """This rank's place in pp x dp and the groups it communicates in."""

    def __init__(self, pp: int, dp: int, v: int, style: str,
                 replica_groups: bool = False) -> None:
        world = dist.get_world_size()
        if pp < 1 or dp < 1 or pp * dp != world:
            raise ValueError(f"dynmo.pipelining: pp {pp} x dp {dp} must equal the world "
                             f"size {world}")
        self.pp, self.dp, self.v, self.style = pp, dp, v, style
        self.rank = dist.get_rank()
        self.pp_rank, self.dp_rank = divmod(self.rank, dp)
        # The pipeline ranks still in the job (all, until a re-pack).
        self.active_pp_ranks: List[int] = list(range(pp))
        self.pp_group: Optional[dist.ProcessGroup] = None
        self.dp_group: Optional[dist.ProcessGroup] = None
        self.job_group: Optional[dist.ProcessGroup] = None
        self.control_group: Optional[dist.ProcessGroup] = None
        self._cpu_backend = takes_cpu_tensors(str(dist.get_backend()))
        self._replica_groups = replica_groups or dp > 1
        self._build_groups(first=True)

    @property
    def num_stages(self) -> int:
        return len(self.active_pp_ranks) * self.v

    def global_rank(self, pp_rank: int, dp_rank: Optional[int] = None) -> int:
        return pp_rank * self.dp + (self.dp_rank if dp_rank is None else dp_rank)

    def pp_rank_of_stage(self, stage: int) -> int:
        """The (original) pipeline rank running the stage at position
        ``stage`` among the active ones."""
        position = stage_to_pp_rank(stage, len(self.active_pp_ranks), self.v, self.style)
        return self.active_pp_ranks[position]

    def rank_of_stage(self, stage: int) -> int:
        """The global rank of this replica's copy of the stage at position
        ``stage`` among the active ones."""
        return self.global_rank(self.pp_rank_of_stage(stage))

    def local_stages(self) -> List[int]:
        """The stage ids this rank runs (ascending); empty once released."""
        if self.pp_rank not in self.active_pp_ranks:
            return []
        position = self.active_pp_ranks.index(self.pp_rank)
        return stages_of_pp_rank(position, len(self.active_pp_ranks), self.v, self.style)

    def shrink(self, active_pp_ranks: Sequence[int]) -> None:
        """Keeps only these pipeline ranks (a re-pack); collective over the world."""
        self.active_pp_ranks = sorted(active_pp_ranks)
        self._build_groups(first=False)

    def _build_groups(self, first: bool) -> None:
        pp, dp = self.pp, self.dp
        active = self.active_pp_ranks
        if dp == 1 and first:
            self.pp_group = None  # the world
        else:
            for r in range(dp):
                ranks = [self.global_rank(p, r) for p in active]
                g = dist.new_group(ranks)
                if r == self.dp_rank and self.pp_rank in active:
                    self.pp_group = g
        if first:
            if self._replica_groups:
                for p in range(pp):
                    g = dist.new_group([self.global_rank(p, r) for r in range(dp)])
                    if p == self.pp_rank:
                        self.dp_group = g
            self.job_group = None
            self.control_group = None if self._cpu_backend else dist.new_group(backend="gloo")
        else:
            ranks = [self.global_rank(p, r) for p in active for r in range(dp)]
            g = dist.new_group(ranks)
            self.job_group = g if self.pp_rank in active else None
            c = g if self._cpu_backend else dist.new_group(ranks, backend="gloo")
            self.control_group = c if self.pp_rank in active else None

