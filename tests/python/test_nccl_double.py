"""dynmo.nccl_double: the NCCL completion double registered as the
torch.distributed backend "nccl-double", on two CPU ranks — collectives,
point-to-point receives poisoned until the Work NCCL would complete is
waited on, batches that do not pair refused, new groups, object lists, DDP
and a torch.distributed.pipelining schedule."""
import datetime

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import dynmo.nccl_double  # noqa: E402
import nccl_double_workers  # noqa: E402
from conftest import spawn_ranks  # noqa: E402


def spawn(fn, tmp_path):
    spawn_ranks(fn, lambda attempt: (2, str(tmp_path / f"init{attempt}")), 2)


def test_register_is_idempotent_and_creates_a_torch_backend():
    assert dynmo.nccl_double.register() == "nccl-double"
    assert dynmo.nccl_double.register() == "nccl-double"
    assert dist.Backend("nccl-double") == "nccl-double"
    assert dist.Backend.backend_capability["nccl-double"] == ["cpu"]
    from dynmo import _nccl_double
    # A group of one over an in-process store: torch's own Backend type.
    backend = _nccl_double.create_backend(dist.HashStore(), 0, 1,
                                          datetime.timedelta(seconds=30))
    assert isinstance(backend, torch._C._distributed_c10d.Backend)
    assert backend.name() == "nccl-double"
    assert backend.supports_coalescing


def test_collectives_complete_at_their_work(tmp_path):
    spawn(nccl_double_workers.collectives, tmp_path)


def test_receives_are_poison_until_the_work_nccl_completes_is_waited_on(tmp_path):
    spawn(nccl_double_workers.point_to_point, tmp_path)


def test_new_groups_take_the_double(tmp_path):
    spawn(nccl_double_workers.groups, tmp_path)


def test_ddp_trains_replicas_like_one_model(tmp_path):
    spawn(nccl_double_workers.ddp, tmp_path)


def test_a_pipelining_schedule_matches_the_whole_model(tmp_path):
    spawn(nccl_double_workers.pipeline, tmp_path)
