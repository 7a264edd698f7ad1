"""The decision core from Python: ``plan``, ``simulate`` and ``replay``.

They run the same C++ as the ``dynmo-plan`` and ``dynmo-sim`` programs
(coordinator/tools/plan_command.h, sim_command.h): keyword arguments become
the programs' flags and a problem becomes the JSON text they read, so the
validation and its one-line messages are the programs' own (a bad problem
raises ``InvalidArgumentError``, a ValueError, with dynmo-plan's message).
Results come back as dataclasses with every key the programs print, plus the
whole JSON object as ``raw``. Pure computation; thread-safe (the GIL is
released while the core computes).
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from dynmo import _core
from dynmo.types import LayerMove

Problem = Union[str, Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``dynmo-plan`` prints: the new boundaries and what they cost.

    Re-packing adds ``active_stages``, ``released_stages``, ``comm_split`` and
    ``reference_bottleneck``; diffusion adds ``diffusion_rounds`` and
    ``diffusion_converged``; first-fit gives ``layer_owner`` and
    ``contiguous`` instead of boundaries and loads. ``layout_formats`` adds
    the boundaries as torchtitan's ``module_fqns_per_model_part``, Megatron's
    ``pipeline_model_parallel_layout`` and DeepSpeed's ``parts``.
    """

    method: str
    migrations: List[LayerMove]
    moved_bytes: int
    boundaries: Optional[List[int]] = None
    loads: Optional[List[float]] = None
    bottleneck: Optional[float] = None
    imbalance: Optional[float] = None
    lower_bound: Optional[float] = None
    memory_bytes: Optional[List[int]] = None
    migration_rounds: Optional[int] = None
    active_stages: Optional[List[int]] = None
    released_stages: Optional[List[int]] = None
    comm_split: Optional[List[Dict[str, int]]] = None
    reference_bottleneck: Optional[float] = None
    diffusion_rounds: Optional[int] = None
    diffusion_converged: Optional[bool] = None
    layer_owner: Optional[List[int]] = None
    contiguous: Optional[bool] = None
    module_fqns_per_model_part: Optional[List[List[str]]] = None
    pipeline_model_parallel_layout: Optional[str] = None
    parts: Optional[List[int]] = None
    raw: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)


@dataclasses.dataclass(frozen=True)
class SimResult:
    """One iteration of a schedule: its time, bubble ratio and idle per stage.

    ``gantt_svg`` is the timeline as an SVG chart when asked for."""

    iteration_time: float
    bubble_ratio: float
    stage_idle: List[float]
    gantt_svg: Optional[str] = dataclasses.field(default=None, repr=False)
    raw: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)


def _flag(name: str, value: Any) -> List[str]:
    if value is None or value is False:
        return []
    if value is True:
        return [f"--{name}"]
    return [f"--{name}={value}"]


def _problem_text(problem: Problem) -> str:
    if isinstance(problem, str):
        return problem
    # NaN and infinities are written as the tokens json.dumps uses, which no
    # JSON parser accepts: the problem is refused like the same file would be.
    return json.dumps(problem)


def _current_flag(current: Any) -> List[str]:
    if current is None:
        return []
    # A string is a Megatron layout, comma-separated boundaries or JSON text;
    # anything else (boundaries, torchtitan's FQN lists) is written as JSON.
    return ["--current=" + (current if isinstance(current, str) else json.dumps(current))]


def plan(problem: Problem, *, method: str = "optimal", rounds: Optional[int] = None,
         repack: bool = False, tolerance: Optional[float] = None,
         repack_method: Optional[str] = None,
         target_stages: Optional[int] = None, current: Any = None,
         layout_formats: Union[None, str, Sequence[str]] = None) -> Decision:
    """Partitions (and with ``repack`` re-packs) a pipeline, like dynmo-plan.

    ``problem`` is the JSON object dynmo-plan reads (a dict, or its text):
    {"stages": S, "layers": [{"time": T, "params": P, "mem_bytes": M}, ...],
    "capacity_bytes": [...], "speed": [...], "current": [b0, ..., bS], ...}.
    ``current`` (dynmo-plan's ``--current``) replaces the problem's current
    split: boundaries, a Megatron layout string or torchtitan's
    ``module_fqns_per_model_part``. ``layout_formats`` ("torchtitan",
    "megatron", "deepspeed", or a list of them) also returns the decided
    split in those formats (docs/plan-formats.md).
    """
    if layout_formats is not None and not isinstance(layout_formats, str):
        layout_formats = ",".join(layout_formats)
    flags = (_flag("method", method) + _flag("rounds", rounds) + _flag("repack", repack)
             + _flag("tolerance", tolerance) + _flag("repack-method", repack_method)
             + _flag("target-stages", target_stages) + _current_flag(current)
             + _flag("layout-format", layout_formats))
    raw = json.loads(_core.plan_json(_problem_text(problem), flags))
    fields = {k: v for k, v in raw.items() if k in Decision.__dataclass_fields__}
    fields["migrations"] = [
        LayerMove(m["layer"], m["from"], m["to"], m["bytes"], m["round"])
        for m in raw["migrations"]]
    return Decision(raw=raw, **fields)


def _stage_times_flag(stage_times: Optional[Sequence[Tuple[float, float, float]]]):
    if stage_times is None:
        return []
    return ["--stage-times=" + ",".join(
        f"{float(f)!r}:{float(b)!r}:{float(w)!r}" for f, b, w in stage_times)]


def simulate(*, schedule: str, microbatches: int, stages: Optional[int] = None,
             fwd: Optional[float] = None, bwd: Optional[float] = None,
             wgrad: Optional[float] = None,
             stage_times: Optional[Sequence[Tuple[float, float, float]]] = None,
             comm: Optional[float] = None, gantt: bool = False) -> SimResult:
    """One iteration of ``schedule`` ("gpipe", "1f1b", "zb-h1"), like dynmo-sim.

    Give ``stages`` with ``fwd``/``bwd``/``wgrad`` (seconds, equal stages) or
    ``stage_times`` [(fwd, bwd, wgrad) per stage]; ``comm`` is the transfer
    time between stages.
    """
    flags = (_flag("schedule", schedule) + _flag("microbatches", microbatches)
             + _flag("stages", stages) + _flag("fwd", fwd) + _flag("bwd", bwd)
             + _flag("wgrad", wgrad) + _stage_times_flag(stage_times)
             + _flag("comm", comm))
    text, svg = _core.simulate_json(flags, gantt)
    raw = json.loads(text)
    return SimResult(raw["iteration_time"], raw["bubble_ratio"], raw["stage_idle"],
                     svg, raw)


def replay(*, stages: int, trace: Union[None, str, os.PathLike,
                                        Iterable[Mapping[str, Any]]] = None,
           scenario: Optional[str] = None, schedule: Optional[str] = None,
           microbatches: Optional[int] = None, balancer: Optional[str] = None,
           trigger: Optional[str] = None, bandwidth: Optional[float] = None,
           capacity: Optional[int] = None, iterations: Optional[int] = None,
           seed: Optional[int] = None, layers: Optional[int] = None,
           dp: Optional[int] = None, elastic: Optional[str] = None,
           repack_tolerance: Optional[float] = None, oracle: bool = False,
           units: Optional[str] = None) -> Dict[str, Any]:
    """Replays a trace static against dynamic, like ``dynmo-sim --trace``.

    ``trace`` is a JSON Lines file's path or the records themselves
    ({"iter": k, "layers": [{"fwd":..,"bwd":..,"wgrad":..,"mem_bytes":..}]});
    or give ``scenario`` ("pruning", "freezing", "sparse-attention",
    "early-exit", "moe", "mod"; ``units="halves"`` splits each block into
    its attention and MLP halves). The coordinator's triggers ("auto", the
    default, "every:N", "on-event", "manual") replay through the
    coordinator's own job machine, with ``dp`` replicas per stage and
    ``elastic`` "none", "release" (re-pack onto fewer stages, GPUs handed
    back) or "reshape" (re-group into pp' x dp'); "on-change[:T]" runs the
    trace-only replay. ``oracle=True`` adds the re-partition ceiling.
    ``layers`` repeats or scales a recorded trace to that depth. Returns the
    summary dynmo-sim prints (speedup, gpu_hours, plans, final_grid, ...).
    """
    flags = (_flag("stages", stages) + _flag("scenario", scenario)
             + _flag("schedule", schedule) + _flag("microbatches", microbatches)
             + _flag("balancer", balancer) + _flag("trigger", trigger)
             + _flag("bandwidth", bandwidth) + _flag("capacity", capacity)
             + _flag("iterations", iterations) + _flag("seed", seed)
             + _flag("layers", layers) + _flag("dp", dp) + _flag("elastic", elastic)
             + _flag("repack-tolerance", repack_tolerance) + _flag("oracle", oracle)
             + _flag("units", units))
    if trace is None or isinstance(trace, (str, os.PathLike)):
        return json.loads(_core.replay_json(flags + _flag("trace", trace and os.fspath(trace))))
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for record in trace:
            f.write(json.dumps(record) + "\n")
    try:
        summary = json.loads(_core.replay_json(flags + _flag("trace", f.name)))
    finally:
        os.unlink(f.name)
    summary["source"] = "trace:<records>"  # not the temporary file's name
    return summary
