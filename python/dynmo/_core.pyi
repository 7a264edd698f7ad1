# Type stubs for dynmo._core, the pybind11 binding (python/src). Use the
# dynmo package's wrappers (dynmo.Agent, dynmo.plan, ...) rather than these.
from typing import Any, Dict, List, Optional, Sequence, Tuple

__version__: str

class DynmoError(Exception):
    code: str

class InvalidArgumentError(DynmoError, ValueError): ...
class FailedPreconditionError(DynmoError, RuntimeError): ...
class NotFoundError(DynmoError, LookupError): ...
class UnavailableError(DynmoError, ConnectionError): ...
class PermissionDeniedError(DynmoError, PermissionError): ...

class AgentConfig:
    coordinator: str
    token: str
    job: str
    rank: int
    pipeline_rank: int
    data_parallel_rank: int
    pipeline_size: int
    data_parallel_size: int
    host: str
    device: int
    memory_capacity_bytes: int
    num_layers: int
    boundaries: List[int]
    model_fingerprint: str
    microbatches: int
    schedule: str
    queue_capacity: int
    tls_ca: str
    tls_cert: str
    tls_key: str
    tls_server_name: str
    initial_backoff_s: float
    max_backoff_s: float
    rpc_timeout_s: float
    def __init__(self) -> None: ...

# (layer, fwd_s, bwd_s, wgrad_s, params, resident_bytes, activation_bytes)
LayerTuple = Tuple[int, float, float, float, int, int, int]

class Agent:
    def __init__(self, config: AgentConfig) -> None: ...
    def report(self, iteration: int, layers: Sequence[LayerTuple],
               memory_used_bytes: int = 0, memory_capacity_bytes: int = 0,
               neighbour_wait_s: float = 0.0, model_changed: bool = False) -> None: ...
    def plan_to_apply_at(self, iteration: int) -> Optional[Dict[str, Any]]: ...
    def latest_committed_plan(self) -> Optional[Dict[str, Any]]: ...
    def acknowledge(self, epoch: int, applied: bool, detail: str = "") -> None: ...
    def stats(self) -> Dict[str, Any]: ...
    def wait_connected(self, timeout_s: float) -> bool: ...
    def flush(self, timeout_s: float) -> bool: ...
    def stop(self) -> None: ...

def set_policy(address: str, job: str, balancer: str = "", trigger: str = "",
               repack: bool = False, repack_tolerance: float = 0.0, elastic: str = "",
               token: str = "",
               tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
               tls_server_name: str = "", patience_s: float = 2.0) -> None: ...
def read_token(path: str) -> str: ...
def plan_json(problem_json: str, flags: List[str]) -> str: ...
def simulate_json(flags: List[str], gantt: bool = False) -> Tuple[str, Optional[str]]: ...
def replay_json(flags: List[str]) -> str: ...
