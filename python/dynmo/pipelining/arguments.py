"""``check_arguments``: every ``DynamicPipeline`` argument checked before
anything is built or touched — types (an integer is an ``int``, never a
``bool``, a float or a string), ranges, the combinations a schedule
refuses, the model's form and the initial split. A refusal is one
``dynmo.InvalidArgumentError`` (a ``ValueError``) naming the argument, raised
alike on every rank before any collective, and the user's model stays as
it was. Pure: reads the model and the process group's size, changes
nothing; thread-safe.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from dynmo.errors import InvalidArgumentError
from dynmo.pipelining.plan_agreement import agreement_for, plan_lead_of
from dynmo.pipelining.layout import ModelLayout
from dynmo.pipelining.schedules import SPLIT_BACKWARD, V_STYLE, canonical_name, schedule_class
from dynmo.pipelining.tied import find_ties

_JOB_NAME = re.compile(r"[A-Za-z0-9._-]+")
_W_ACTIONS = "use GPipe, 1F1B, Interleaved1F1B or LoopedBFS"


@dataclass
class Arguments:
    """The constructor's arguments as given (``given``) and what checking
    them found: the schedule, virtual stages per rank (``v``), the device,
    the model's layout, the initial split and the tied parameters."""
    given: Dict[str, Any]
    schedule_cls: Any
    schedule_name: str
    v: int
    stages: int
    device: torch.device
    layout: ModelLayout
    boundaries: List[int]
    ties: Any


def refusal(message: str) -> InvalidArgumentError:
    """The error for a refused argument: "dynmo.pipelining: <message>"."""
    e = InvalidArgumentError(f"dynmo.pipelining: {message}")
    e.code = "INVALID_ARGUMENT"
    return e


def check_arguments(given: Dict[str, Any]) -> Arguments:
    """``given``: the constructor's keyword arguments by name (with
    ``model``). Returns them checked; raises ``InvalidArgumentError``."""
    g = given
    for name in ("n_microbatches", "pp", "dp", "stages_per_rank"):
        _integer(name, g[name], 1)
    for name in ("speed_probe_every", "speed_probe_steady_every", "planned_iterations"):
        _integer(name, g[name], 0, " (0: never)" if name == "speed_probe_every" else
                 " (0: unknown)" if name == "planned_iterations" else "")
    for name in ("migration_timeout_s", "connect_timeout_s"):
        _positive(name, g[name])
    _callable("optimizer", g["optimizer"])
    for name in ("loss_fn", "lr_scheduler"):  # loss_fn None: forward only
        if g[name] is not None:
            _callable(name, g[name])
    for name in ("measure_activations", "timing"):
        if not isinstance(g[name], bool):
            raise refusal(f"{name} must be True or False, got {g[name]!r}")
    for name in ("job", "blocks", "token_file", "tls_ca"):
        if not (g[name] is None and name != "job") and not isinstance(g[name], str):
            raise refusal(f"{name} must be a string, got {type(g[name]).__name__}")
    if not _JOB_NAME.fullmatch(g["job"]):
        raise refusal(f"job {g['job']!r} must be a name of [A-Za-z0-9._-] (the "
                      f"coordinator's rule)")
    for name in ("first", "last", "coordinator_flags"):
        _strings(name, g[name])
    if g["policy"] is not None and not isinstance(g["policy"], dict):
        raise refusal(f"policy must be a dict of dynmo.set_policy keywords, got "
                      f"{type(g['policy']).__name__}")
    _coordinator(g["coordinator"])
    if g["coordinator"] and not g["timing"]:
        raise refusal("timing=False leaves the coordinator nothing to decide from")
    if g["speed_probe_every"] > 0 and g["speed_probe_steady_every"] < g["speed_probe_every"]:
        raise refusal(f"speed_probe_steady_every must be >= speed_probe_every "
                      f"({g['speed_probe_every']}), got {g['speed_probe_steady_every']}")
    _plan_agreement(g)
    if g["data_parallel"] not in ("ddp", "fsdp2"):
        raise refusal(f"data_parallel must be 'ddp' or 'fsdp2', got {g['data_parallel']!r}")
    world = dist.get_world_size()
    if g["pp"] * g["dp"] != world:
        raise refusal(f"pp {g['pp']} x dp {g['dp']} must equal the world size {world}")
    schedule_cls, name, v = _schedule(g)
    device = _device(g["device"])
    try:
        layout = ModelLayout(g["model"], g["blocks"], g["first"], g["last"])
    except (TypeError, ValueError) as e:
        raise refusal(f"model: {_text(e)}") from None
    stages = g["pp"] * v
    if stages > layout.num_layers:
        raise refusal(f"{stages} stages for {layout.num_layers} layers: a stage needs at "
                      f"least one")
    boundaries = _boundaries(g["boundaries"], layout, stages)
    ties = find_ties({i: [g["model"].get_submodule(f) for f in layout.fqns(i)]
                      for i in range(layout.num_layers)})
    if ties and g["data_parallel"] == "fsdp2":
        # A tie's copies would be DTensors of two FSDP units; summing their
        # gradients (tied.py) is written for plain tensors.
        raise refusal("tied parameters (tied embeddings) with data_parallel 'fsdp2' are "
                      "not supported yet; untie them or use 'ddp'")
    return Arguments(given=dict(g), schedule_cls=schedule_cls, schedule_name=name, v=v,
                     stages=stages, device=device, layout=layout, boundaries=boundaries,
                     ties=ties)


def _plan_agreement(g: Dict[str, Any]) -> None:
    """``plan_agreement`` one of the modes, and "early" not under an
    embedded coordinator whose plan lead leaves it no plan to apply."""
    lead = 0
    if g["coordinator"] == "embedded":
        lead = plan_lead_of(["--plan_lead_iterations=5"] + list(g["coordinator_flags"]))
    try:
        agreement_for(g["plan_agreement"], lead)
    except ValueError as e:
        raise refusal(_text(e)) from None


def _schedule(g: Dict[str, Any]):
    """(class, canonical name, virtual stages per rank) of the schedule."""
    if not isinstance(g["schedule"], str):
        raise refusal(f"schedule must be a schedule's name, got "
                      f"{type(g['schedule']).__name__}")
    try:
        cls = schedule_class(g["schedule"])
    except ValueError as e:
        raise refusal(_text(e)) from None
    name = canonical_name(cls)
    v = 1 if issubclass(cls, PipelineScheduleSingle) else g["stages_per_rank"]
    if name in V_STYLE and v != 2:
        raise refusal(f"{name} needs exactly 2 stages per rank, got {v}")
    if name in V_STYLE and dist.get_backend() == "gloo":
        # torch 2.11 opens each stage's links with a send to its neighbour's
        # rank; under "v" placement two neighbours share a rank and Gloo
        # cannot send to itself ("Pair is not connected").
        raise refusal(f"{name} cannot run over Gloo in torch 2.11 (its stages send to their "
                      f"own rank); use NCCL or InterleavedZeroBubble")
    if name in SPLIT_BACKWARD and g["data_parallel"] == "fsdp2":
        raise refusal(f"{name} with data_parallel 'fsdp2' is not supported yet (its W "
                      f"actions' gradient reduction under FSDP2 is untested); {_W_ACTIONS}")
    if name in SPLIT_BACKWARD and g["dp"] > 1:
        # Measured here: under DDP the W actions' weight gradients are not
        # averaged (DDP's reducer never sees them), so the replicas of every
        # stage but the first drift apart.
        raise refusal(f"{name} with dp {g['dp']}: DDP does not average the gradients its W "
                      f"actions compute in torch 2.11 (the replicas would drift apart); "
                      f"{_W_ACTIONS} with dp > 1")
    return cls, name, v


def _boundaries(boundaries: Optional[Sequence[int]], layout: ModelLayout,
                stages: int) -> List[int]:
    n = layout.num_layers
    if boundaries is None:
        return [n * s // stages for s in range(stages + 1)]
    if isinstance(boundaries, (str, bytes)) or not isinstance(boundaries, Sequence):
        raise refusal(f"boundaries must be a list of integers, got "
                      f"{type(boundaries).__name__}")
    for b in boundaries:
        if isinstance(b, bool) or not isinstance(b, numbers.Integral):
            raise refusal(f"boundaries must be integers, got {b!r} "
                          f"({type(b).__name__}) in {list(boundaries)!r}")
    try:
        return layout.check_boundaries(boundaries, stages)
    except ValueError as e:
        raise refusal(_text(e)) from None


def _coordinator(address: Any) -> None:
    if address is None or address == "embedded":
        return
    if not isinstance(address, str):
        raise refusal(f"coordinator must be None, 'embedded' or 'HOST:PORT', got "
                      f"{type(address).__name__}")
    if address.startswith("unix:"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise refusal(f"coordinator must be None, 'embedded' or 'HOST:PORT', got {address!r}")


def _device(device: Any) -> torch.device:
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise refusal(f"device must be a torch.device or its name, got "
                      f"{type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise refusal(f"device {device!r}: {_text(e)}") from None


def _integer(name: str, value: Any, low: int, meaning: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refusal(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < low:
        raise refusal(f"{name} must be >= {low}{meaning}, got {value}")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            not (math.isfinite(value) and value > 0):
        raise refusal(f"{name} must be > 0, got {value!r}")


def _callable(name: str, value: Any) -> None:
    if not callable(value):
        raise refusal(f"{name} must be callable, got {type(value).__name__}")


def _strings(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or \
            not all(isinstance(x, str) for x in value):
        raise refusal(f"{name} must be a list of strings, got {value!r}")


def _text(e: BaseException) -> str:
    """``e``'s message without a "dynmo.pipelining: " prefix."""
    text = str(e)
    prefix = "dynmo.pipelining: "
    return text[len(prefix):] if text.startswith(prefix) else text


__all__ = ["Arguments", "check_arguments", "refusal"]
