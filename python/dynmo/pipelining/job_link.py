"""``JobLink``: one rank's connection to the DynMo coordinator, one
``dynmo.Agent`` per pipeline stage the rank runs (the coordinator sees an
interleaved job's virtual stages as its stages; an agent's rank id is
stage * dp + replica).

    link = JobLink.connect("embedded" | "HOST:PORT", job=..., stages=[0, 2], ...)
    plan = link.plan_due(k)            # the committed plan every local agent holds
    link.acknowledge(plan, True, "")
    link.report(stage, k, costs, memory_used_bytes)
    link.close()

"embedded" starts a ``dynmo-coordinator`` on global rank 0 (loopback, a
port the kernel picks, broadcast to every rank with its plan lead,
``link.plan_lead``): a collective. The agents
never block training on the network (agent/agent.h); a coordinator that
vanishes leaves ``plan_due`` returning None. Not thread-safe: the training
thread.
"""
from __future__ import annotations

import logging
import socket
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from dynmo.pipelining.plan_agreement import plan_lead_of
from dynmo.types import LayerCost, Plan

_log = logging.getLogger("dynmo.pipelining")


class JobLink:
    def __init__(self, agents: Dict[int, Any], local_coordinator: Any = None,
                 plan_lead: int = 0) -> None:
        self.agents = agents
        self.local_coordinator = local_coordinator
        # The coordinator's --plan_lead_iterations where this rank knows it
        # (the embedded one's, from global rank 0), else 0.
        self.plan_lead = plan_lead

    @staticmethod
    def connect(coordinator: str, *, job: str, stages: Sequence[int], num_stages: int,
                dp: int, dp_rank: int, num_layers: int, boundaries: Sequence[int],
                microbatches: int, schedule: str, device_index: int,
                group: Optional[dist.ProcessGroup], policy: Dict[str, Any], flags: Sequence[str] = (),
                token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                planned_iterations: int = 0, connect_timeout_s: float = 20.0) -> "JobLink":
        """The agents of ``stages``, connected (``connect_timeout_s`` each);
        a failure stops what it started (the embedded coordinator too)."""
        import dynmo  # the C++ agent: only needed with a coordinator
        address, local, lead = coordinator, None, 0
        if coordinator == "embedded":
            # (port, plan lead) over the CPU control group
            port = torch.zeros(2, dtype=torch.int64)
            if dist.get_rank() == 0:
                # A plan applies 5 iterations after the report it was decided
                # on, as under dynmo-train's embedded coordinator: its agents
                # are on this host, the daemon's 10 are for a remote one.
                # The user's coordinator_flags come last and win.
                extra = ["--plan_lead_iterations=5",
                         f"--trigger={policy.get('trigger', 'every:5')}"]
                if policy.get("repack"):
                    extra.append("--repack=true")
                local = dynmo.LocalCoordinator(extra + list(flags))
                port[0] = local.port
                port[1] = plan_lead_of(extra + list(flags))
            dist.broadcast(port, 0, group=group)
            # host-sync(cpu): the control group's CPU tensor, once at start.
            got, lead = port.tolist()
            address = f"127.0.0.1:{int(got)}"
        agents: Dict[int, Any] = {}
        try:
            for k, stage in enumerate(stages):
                agents[stage] = dynmo.Agent(
                    address, job, stage * dp + dp_rank, pipeline_rank=stage,
                    pipeline_size=num_stages, data_parallel_rank=dp_rank,
                    data_parallel_size=dp, num_layers=num_layers, boundaries=list(boundaries),
                    microbatches=microbatches, schedule=schedule,
                    planned_iterations=planned_iterations,
                    model_fingerprint=f"pipelining:{num_layers}", host=socket.gethostname(),
                    device=device_index * len(stages) + k, token_file=token_file,
                    tls_ca=tls_ca, connect_timeout_s=connect_timeout_s)
            if dist.get_rank() == 0 and coordinator != "embedded" and policy:
                token = dynmo._core.read_token(token_file) if token_file else None
                dynmo.set_policy(address, job, token=token, tls_ca=tls_ca, **policy)
        except BaseException:
            JobLink(agents, local).close(flush_s=0.0)
            if local is not None:
                local.stop()
            raise
        return JobLink(agents, local, plan_lead=int(lead))

    def plan_due(self, iteration: int) -> Optional[Plan]:
        """The committed plan due at ``iteration`` when every local agent
        holds the same epoch, else None."""
        if not self.agents:
            return None
        plans = [a.plan_to_apply_at(iteration) for a in self.agents.values()]
        first = plans[0]
        return first if all(p is not None and p.epoch == first.epoch for p in plans) else None

    def acknowledge(self, plan: Plan, applied: bool, detail: str) -> None:
        for a in self.agents.values():
            try:
                a.acknowledge(plan.epoch, applied, detail)
            except Exception as e:  # an old epoch or a lost session: say it, go on
                _log.warning("dynmo.pipelining: acknowledge epoch %d: %s", plan.epoch, e)

    def report(self, stage: int, iteration: int, costs: List[LayerCost],
               memory_used_bytes: int, probe_s: float = 0.0,
               memory_capacity_bytes: int = 0, exchange_s: float = 0.0,
               iteration_s: float = 0.0) -> None:
        self.agents[stage].report(iteration, costs, memory_used_bytes=memory_used_bytes,
                                  memory_capacity_bytes=memory_capacity_bytes,
                                  probe_s=probe_s, exchange_s=exchange_s,
                                  iteration_s=iteration_s)

    def close(self, flush_s: float = 5.0) -> None:
        """Flushes (at most ``flush_s`` each) and stops the agents (the
        coordinator: ``stop_coordinator``)."""
        for a in self.agents.values():
            if flush_s > 0:
                a.flush(flush_s)
            a.stop()
        self.agents = {}

    def stop_coordinator(self) -> None:
        if self.local_coordinator is not None:
            self.local_coordinator.stop()
            self.local_coordinator = None
