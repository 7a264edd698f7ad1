"""DynMo from Python: the agent a training rank embeds, the decision core,
and (in ``dynmo.torch``) what a PyTorch pipeline needs to report per-layer
costs and apply plans.

    import dynmo
    agent = dynmo.Agent(address, job="gpt", rank=r, pipeline_size=2,
                        num_layers=10, boundaries=[0, 7, 10])
    decision = dynmo.plan({"stages": 2, "layers": [{"time": 1}, ...]})

``dynmo._core`` is the C++ binding (pybind11) these wrap; see docs/python.md.
"""
from dynmo._core import __version__
from dynmo.agent import Agent, set_policy
from dynmo.coordinator import LocalCoordinator, find_coordinator_binary
from dynmo.decision import Decision, SimResult, plan, replay, simulate
from dynmo.errors import *  # noqa: F401,F403  (the exception classes)
from dynmo.errors import __all__ as _errors
from dynmo import plan_formats  # noqa: F401  (torchtitan / Megatron / DeepSpeed splits)
from dynmo.types import AgentStats, CommSplit, LayerCost, LayerMove, Plan

__all__ = [
    "Agent", "AgentStats", "CommSplit", "Decision", "LayerCost", "LayerMove",
    "LocalCoordinator", "Plan", "SimResult", "__version__", "find_coordinator_binary",
    "plan", "plan_formats", "replay", "set_policy", "simulate", *_errors,
]
