"""``dynmo.Agent``: one training rank's side of DynMo, from Python.

    agent = dynmo.Agent("127.0.0.1:50051", job="gpt", rank=r,
                        pipeline_rank=r, pipeline_size=2, num_layers=10,
                        boundaries=[0, 7, 10])
    each iteration k:
        plan = agent.plan_to_apply_at(k)       # a dynmo.Plan or None
        if plan: ...agree in-band, migrate...; agent.acknowledge(plan.epoch, True)
        ...train iteration k...
        agent.report(k, [dynmo.LayerCost(layer, fwd_s, bwd_s, ...), ...])

A background C++ thread (agent/agent.h) owns the connection: it registers,
streams reports, reconnects with backoff and runs the agent half of the
two-phase plan protocol (docs/protocol.md). ``report`` never blocks on the
network. Every method releases the GIL while it is in C++; any thread may
call any method. Errors raise ``dynmo.DynmoError`` subclasses carrying the
agent's or the coordinator's message.
"""
from __future__ import annotations

import socket
from typing import Iterable, Optional, Sequence, Union

from dynmo import _core
from dynmo.errors import UnavailableError
from dynmo.types import AgentStats, LayerCost, Plan

LayerLike = Union[LayerCost, Sequence]


def _layer_tuple(layer: LayerLike):
    if isinstance(layer, LayerCost):
        return layer.as_tuple()
    if isinstance(layer, dict):
        return LayerCost(**layer).as_tuple()
    return LayerCost(*layer).as_tuple()


class Agent:
    """A rank's agent. Starts at once; ``connect_timeout_s`` makes it wait.

    ``address`` is the coordinator's "host:port". ``token`` is the bearer
    token (or ``token_file``, read like the C++ tools do); ``tls_ca`` (a PEM
    file) turns on TLS, with ``tls_cert``/``tls_key`` for mutual TLS.
    ``pipeline_rank`` (this rank's stage) defaults to ``rank``, i.e. one
    replica. ``boundaries`` is the initial layout (empty: uniform).
    ``planned_iterations`` is how many iterations the run trains in all (0:
    unknown): the coordinator then pays for no move the run would end
    before repaying. With
    ``connect_timeout_s`` the constructor waits for the session and raises
    ``UnavailableError`` (with the coordinator's message, e.g. why it refused
    the registration) when there is none in time.
    """

    def __init__(self, address: str, job: str, rank: int, *,
                 pipeline_rank: Optional[int] = None, pipeline_size: int = 1,
                 data_parallel_rank: int = 0, data_parallel_size: int = 1,
                 num_layers: int = 1, boundaries: Iterable[int] = (),
                 microbatches: int = 1, schedule: str = "1f1b",
                 planned_iterations: int = 0,
                 model_fingerprint: str = "", host: Optional[str] = None,
                 device: int = 0, memory_capacity_bytes: int = 0,
                 token: Optional[str] = None, token_file: Optional[str] = None,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, tls_server_name: Optional[str] = None,
                 queue_capacity: int = 64, initial_backoff_s: float = 0.05,
                 max_backoff_s: float = 5.0, rpc_timeout_s: float = 5.0,
                 connect_timeout_s: Optional[float] = None) -> None:
        c = _core.AgentConfig()
        c.coordinator = address
        c.job = job
        c.rank = rank
        c.pipeline_rank = rank if pipeline_rank is None else pipeline_rank
        c.pipeline_size = pipeline_size
        c.data_parallel_rank = data_parallel_rank
        c.data_parallel_size = data_parallel_size
        c.num_layers = num_layers
        c.boundaries = list(boundaries)
        c.microbatches = microbatches
        c.schedule = schedule
        if planned_iterations < 0:
            raise ValueError(f"planned_iterations must be >= 0, got {planned_iterations}")
        c.planned_iterations = planned_iterations
        c.model_fingerprint = model_fingerprint
        c.host = socket.gethostname() if host is None else host
        c.device = device
        c.memory_capacity_bytes = memory_capacity_bytes
        if token is not None and token_file is not None:
            raise ValueError("give token or token_file, not both")
        c.token = _core.read_token(token_file) if token_file else (token or "")
        c.tls_ca = tls_ca or ""
        c.tls_cert = tls_cert or ""
        c.tls_key = tls_key or ""
        c.tls_server_name = tls_server_name or ""
        c.queue_capacity = queue_capacity
        c.initial_backoff_s = initial_backoff_s
        c.max_backoff_s = max_backoff_s
        c.rpc_timeout_s = rpc_timeout_s
        self.address = address
        self.job = job
        self.rank = rank
        self._agent = _core.Agent(c)
        if connect_timeout_s is not None and not self.wait_connected(connect_timeout_s):
            stats = self.stats()
            why = stats.last_error
            self.stop()
            if stats.gave_up:  # refused for good (a malformed request, a bad
                # token): said at once, not after the timeout
                raise UnavailableError(
                    f"the DynMo coordinator at {address} refused rank {rank}: {why}")
            raise UnavailableError(
                f"cannot reach the DynMo coordinator at {address} within "
                f"{connect_timeout_s} s" + (f": {why}" if why else ""))

    def report(self, iteration: int, layers: Iterable[LayerLike], *,
               memory_used_bytes: int = 0, memory_capacity_bytes: int = 0,
               neighbour_wait_s: float = 0.0, model_changed: bool = False,
               probe_s: float = 0.0, exchange_s: float = 0.0,
               iteration_s: float = 0.0) -> None:
        """Queues one iteration's per-layer costs (validated; never blocks).

        ``probe_s``: seconds this rank took for the speed probe
        (``dynmo.torch.speed_probe``), timed like its layers; 0 = not probed.
        The coordinator tells a slow rank from a heavy layer by it.
        ``exchange_s``: this iteration's seconds outside the layers (sending
        and receiving activations and gradients, and waiting for them), all
        micro-batches; 0 = not measured. The coordinator prices each stage's
        exchanges by the rank that waits least.
        ``iteration_s``: the iteration's wall seconds on this rank (host
        clock); 0 = not measured. Each plan's realized gain is read from it.
        """
        self._agent.report(iteration, [_layer_tuple(l) for l in layers],
                           memory_used_bytes, memory_capacity_bytes,
                           neighbour_wait_s, model_changed, probe_s, exchange_s,
                           iteration_s)

    def plan_to_apply_at(self, iteration: int) -> Optional[Plan]:
        """The committed plan due before ``iteration``, or None."""
        d = self._agent.plan_to_apply_at(iteration)
        return None if d is None else Plan.from_dict(d)

    def latest_committed_plan(self) -> Optional[Plan]:
        """The newest committed plan (waiting or applied), or None."""
        d = self._agent.latest_committed_plan()
        return None if d is None else Plan.from_dict(d)

    def acknowledge(self, epoch: int, applied: bool, detail: str = "") -> None:
        """Settles the plan of ``epoch``; FailedPreconditionError if not pending."""
        self._agent.acknowledge(epoch, applied, detail)

    def stats(self) -> AgentStats:
        return AgentStats(**self._agent.stats())

    def wait_connected(self, timeout_s: float) -> bool:
        """True once a session is open; False when ``timeout_s`` passed."""
        return self._agent.wait_connected(timeout_s)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """True once every queued acknowledgement has been written."""
        return self._agent.flush(timeout_s)

    def stop(self) -> None:
        """Closes the session and stops the thread. Idempotent."""
        self._agent.stop()

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def set_policy(address: str, job: str, *, balancer: str = "", trigger: str = "",
               repack: bool = False, repack_tolerance: float = 0.0, elastic: str = "",
               token: Optional[str] = None, tls_ca: Optional[str] = None,
               tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
               tls_server_name: Optional[str] = None, patience_s: float = 2.0) -> None:
    """Sets a job's balancer, trigger ("every:N", "on-event", "auto",
    "manual"), re-packing and what it does with freed GPUs (``elastic``:
    "release" or "reshape"; empty keeps the job's); waits up to ``patience_s`` for the job to
    register. Raises InvalidArgumentError with the coordinator's message."""
    _core.set_policy(address, job, balancer, trigger, repack, repack_tolerance, elastic,
                     token or "", tls_ca or "", tls_cert or "", tls_key or "",
                     tls_server_name or "", patience_s)
