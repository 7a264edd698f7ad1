"""DynMo under ``torch.distributed.pipelining``: a running pipeline-parallel
job's layers re-split live by the coordinator (docs/python.md).

    from dynmo.pipelining import DynamicPipeline
    pipe = DynamicPipeline(model, schedule="1F1B", n_microbatches=8, loss_fn=loss_fn,
                           pp=2, optimizer=lambda ps: torch.optim.AdamW(ps, lr=3e-4),
                           coordinator="embedded")

``DynamicPipeline`` (pipeline.py) is the one entry; ``ModelLayout``
(layout.py) reads a model's pieces — torchtitan's layout and transformers
causal LMs are recognised as they are (families.py), others are named;
``send_layer`` / ``recv_layer`` (``dynmo.torch.migration``, the one
migration of both packages) move a layer with any optimizer's state; ``Topology`` (topology.py) places pp x dp ranks;
``fsdp.py`` shards the data-parallel dimension with FSDP2 (``data_parallel="fsdp2"``);
``CostMeter`` (cost_meter.py) measures the layers, ``JobLink``
(job_link.py) talks to the coordinator, ``agreement_for``
(plan_agreement.py) agrees on the plan due, at the boundary or a boundary
early, ``plan_problem`` (plan_check.py)
says whether a plan applies, ``schedule_class`` (schedules.py) which
schedules a running job can be rebuilt into, ``check_arguments``
(arguments.py) the constructor's refusals, ``JobFailure`` (failure.py) how
one rank's error ends every rank.
Importing it imports torch.
"""
from dynmo.pipelining.layout import ModelLayout
from dynmo.pipelining.pipeline import DynamicPipeline
from dynmo.pipelining.schedules import schedule_class
from dynmo.pipelining.topology import Topology
from dynmo.torch.migration import MigrationError, recv_layer, send_layer

__all__ = ["DynamicPipeline", "MigrationError", "ModelLayout", "Topology", "recv_layer",
           "schedule_class", "send_layer"]
