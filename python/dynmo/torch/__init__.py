"""DynMo for PyTorch pipelines (torch 2.11): what a stage needs to report
per-layer costs to the coordinator and to apply its plans.

- ``LayerTimer`` (timing.py): forward / backward time and stashed activation
  bytes per module, from hooks (CUDA events on a GPU, a monotonic clock on
  the CPU).
- ``layer_memory`` (memory.py): a module's parameters, gradients, buffers and
  optimizer state in bytes; ``layer_costs`` turns timings and sizes into
  the ``dynmo.LayerCost`` list ``Agent.report`` takes.
- ``migrate`` / ``send_layer`` / ``recv_layer`` (migration.py): layers'
  parameters, buffers and any optimizer's per-parameter state between ranks,
  batched per round over torch.distributed point-to-point (Gloo or NCCL),
  bit-exact, confirmed before a sender lets go, every wait bounded
  (``MigrationError``).
- ``agree_on_plan`` and ``apply_plan`` (plan.py): every rank holds the
  plan or none switches, then a stage's layers (an ``nn.ModuleList``) and
  its optimizer follow the plan's moves.
- ``speed_probe`` (speed_probe.py): a fixed kernel timed like the layers;
  its seconds in ``Agent.report(probe_s=...)`` tell the coordinator a slow
  rank from heavy layers.

Importing this module imports torch; ``import dynmo`` alone does not.
"""
from dynmo.torch.memory import layer_costs, layer_memory, tensor_bytes
from dynmo.torch.migration import MigrationError, Transfer, migrate, recv_layer, send_layer
from dynmo.torch.plan import StageLayers, agree_on_plan, apply_plan
from dynmo.torch.speed_probe import launch_probe, speed_probe
from dynmo.torch.timing import LayerTimer

__all__ = [
    "LayerTimer", "MigrationError", "StageLayers", "Transfer", "agree_on_plan", "apply_plan",
    "layer_costs", "layer_memory", "launch_probe", "migrate", "recv_layer", "send_layer",
    "speed_probe", "tensor_bytes",
]
