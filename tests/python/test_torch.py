"""dynmo.torch: layer timing and memory, bit-exact migration with AdamW
state between two Gloo ranks, in-band agreement and applying a plan."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import dynmo  # noqa: E402
import dynmo.torch as dt  # noqa: E402
import torch_workers  # noqa: E402
from conftest import spawn_ranks  # noqa: E402


def spawn(fn, tmp_path):
    spawn_ranks(fn, lambda attempt: (2, str(tmp_path / f"init{attempt}")), 2)


def test_layer_timer_counts_every_micro_batch():
    torch.manual_seed(0)
    layers = {i: nn.Linear(8, 8) for i in range(3)}
    timer = dt.LayerTimer()
    timer.attach(layers)
    for _ in range(2):
        x = torch.randn(4, 8, requires_grad=True)
        for i in range(3):
            x = layers[i](x)
        x.sum().backward()
    t = timer.collect()
    assert sorted(t) == [0, 1, 2]
    for timing in t.values():
        assert timing.calls == 2 and timing.fwd_s >= 0 and timing.bwd_s >= 0
        assert timing.activation_bytes >= 2 * 4 * 8 * 4  # at least each input, twice
    assert timer.collect() == {}
    timer.detach()
    layers[0](torch.randn(1, 8))
    assert timer.collect() == {}


def test_layer_timer_ignores_no_grad_activations():
    m = nn.Linear(4, 4)
    timer = dt.LayerTimer()
    timer.attach({0: m})
    with torch.no_grad():
        m(torch.randn(2, 4))
    t = timer.collect()[0]
    assert t.calls == 1 and t.activation_bytes == 0


def test_layer_memory_counts_params_grads_and_adamw_state():
    m = nn.Linear(4, 3)  # 15 parameters in two tensors
    # The gradient counts before the first backward allocates it: the peak holds it.
    assert dt.layer_memory(m) == (15, 120)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    assert dt.layer_memory(m, opt) == (15, 120)
    opt.step()
    opt.zero_grad(set_to_none=True)
    # params + grads (freed, back at the next backward) + exp_avg + exp_avg_sq
    # + two float32 steps
    assert dt.layer_memory(m, opt) == (15, 60 * 4 + 8)


def test_resident_bytes_counts_one_gradient_per_trainable_parameter_and_tied_ones_once():
    from dynmo.torch.memory import resident_bytes
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(3, 3)  # 60 + 48 bytes of parameters
    bn = nn.BatchNorm1d(3)  # 24 bytes of weight and bias, 24 + 8 of buffers
    bn.weight.requires_grad_(False)  # frozen: no gradient
    opt = torch.optim.AdamW(list(a.parameters()) + list(b.parameters()) + [bn.bias])
    bn(b(a(torch.randn(2, 4)))).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)  # every .grad is None now
    assert all(p.grad is None for m in (a, b, bn) for p in m.parameters())
    adam = 2 * (60 + 48 + 12) + 4 * 5  # exp_avg, exp_avg_sq; a float32 step per tensor
    assert resident_bytes([a, b, bn], opt) == (60 + 48) * 2 + 24 + 12 + 32 + adam
    # Without the optimizer, in the cost meter's argument order.
    assert resident_bytes([a, b], None) == (60 + 48) * 2
    # A parameter tied between two modules is held once.
    tied = nn.Linear(4, 4, bias=False)
    head = nn.Linear(4, 4, bias=False)
    head.weight = tied.weight
    assert resident_bytes([tied, head]) == 64 * 2


def test_honest_gpu_memory_matches_the_trainers_arithmetic():
    from dynmo.torch.memory import device_memory, honest_rank_memory, ranks_sharing_device
    gib = 1 << 30
    # The round-robin fallback (no process group to exchange UUIDs over).
    assert ranks_sharing_device(8, 8, 3) == 1
    assert ranks_sharing_device(4, 1, 0) == 4
    assert ranks_sharing_device(5, 2, 0) == 3
    assert ranks_sharing_device(5, 2, 1) == 2
    assert ranks_sharing_device(0, 0, 0) == 1
    # The trainer's DeviceShareTest case: 80 GiB, 2 ranks, 30 reserved
    # (peak 32) each, 8 GiB outside any allocator.
    assert honest_rank_memory(80 * gib, 12 * gib, 30 * gib, 32 * gib, 2) == \
        (36 * gib, 40 * gib)
    assert honest_rank_memory(80 * gib, 70 * gib, 9 * gib, 9 * gib, 2) == (9 * gib, 40 * gib)
    assert device_memory(torch.device("cpu")) == (0, 0)


def test_ranks_on_same_device_counts_the_ranks_with_this_ranks_uuid():
    from dynmo.torch.memory import ranks_on_same_device
    # Slurm's --gpus-per-task=1: four ranks, each sees its own GPU as cuda:0.
    slurm = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
    assert [ranks_on_same_device(slurm, r) for r in range(4)] == [1, 1, 1, 1]
    assert [ranks_on_same_device(["GPU-a", "GPU-a"], r) for r in range(2)] == [2, 2]
    # Two nodes: 3 ranks on one GPU, 1 alone, 2 on another; CPU ranks ("").
    mixed = ["GPU-a", "GPU-a", "GPU-b", "GPU-a", "GPU-c", "GPU-c", "", ""]
    assert [ranks_on_same_device(mixed, r) for r in range(8)] == [3, 3, 1, 3, 2, 2, 1, 1]
    assert ranks_on_same_device([], 0) == 1
    assert ranks_on_same_device(["GPU-a"], 3) == 1


def test_device_uuids_are_exchanged_through_the_store_by_every_rank():
    import datetime
    import threading
    import torch.distributed as dist
    from dynmo.torch.memory import exchange_device_uuids, ranks_on_same_device
    store = dist.PrefixStore("default_pg", dist.HashStore())  # as init_process_group's
    uuids = ["GPU-a", "GPU-b", "GPU-b", "GPU-c"]
    seen = {}

    def rank(r):
        seen[r] = exchange_device_uuids(store, r, 4, uuids[r], datetime.timedelta(seconds=30))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (3, 1, 0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {r: uuids for r in range(4)}
    assert [ranks_on_same_device(seen[r], r) for r in range(4)] == [1, 2, 2, 1]
    # A rank that never publishes is a store timeout, not a hang.
    with pytest.raises(dist.DistStoreError):
        exchange_device_uuids(dist.HashStore(), 0, 2, "GPU-a", datetime.timedelta(seconds=0.2))


def _fake_cuda(monkeypatch, uuid, visible):
    import types
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: types.SimpleNamespace(uuid=uuid))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)


def test_device_sharing_by_uuid_under_per_task_binding_is_learned_once(monkeypatch):
    import torch.distributed as dist
    from dynmo.torch import memory
    monkeypatch.setattr(memory, "_sharing", {})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    # Rank 1 of 2 on one node, each bound to its own GPU, both seeing it as
    # cuda:0: round robin would say 2 ranks share cuda:0; the UUIDs say 1.
    store = dist.HashStore()
    store.set("dynmo/device_uuid/0", "GPU-a")
    monkeypatch.setattr(memory, "_default_store", lambda: (store, 1, 2))
    _fake_cuda(monkeypatch, "GPU-b", visible=1)
    assert memory.ranks_sharing_device(2, 1, 0) == 2
    assert memory.device_sharing(0) == 1
    assert store.get("dynmo/device_uuid/1") == b"GPU-b"
    # Learned once: no second exchange.
    monkeypatch.setattr(memory, "_default_store", lambda: pytest.fail("exchanged twice"))
    assert memory.device_sharing(0) == 1
    # Two ranks on one GPU.
    monkeypatch.setattr(memory, "_sharing", {})
    monkeypatch.setattr(memory, "_default_store", lambda: (store, 1, 2))
    _fake_cuda(monkeypatch, "GPU-a", visible=1)
    assert memory.device_sharing(0) == 2


def test_device_sharing_without_a_process_group_falls_back_to_round_robin_warning_once(
        monkeypatch, caplog):
    from dynmo.torch import memory
    monkeypatch.setattr(memory, "_sharing", {})
    monkeypatch.setattr(memory, "_warned_fallback", False)
    monkeypatch.setattr(memory, "_default_store", lambda: None)
    _fake_cuda(monkeypatch, "GPU-a", visible=2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "5")
    with caplog.at_level("WARNING", logger="dynmo.torch.memory"):
        assert memory.device_sharing(0) == 3  # local ranks 0, 2, 4
        assert memory.device_sharing(1, local_world_size=4) == 2
    assert sum("round-robin" in r.getMessage() for r in caplog.records) == 1


def test_the_default_process_groups_store_carries_the_exchange(tmp_path):
    import datetime
    import torch.distributed as dist
    from dynmo.torch import memory
    assert memory._default_store() is None
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0,
                            world_size=1)
    try:
        store, rank, world = memory._default_store()
        assert (rank, world) == (0, 1)
        assert memory.exchange_device_uuids(store, 0, 1, "GPU-a",
                                            datetime.timedelta(seconds=10)) == ["GPU-a"]
    finally:
        dist.destroy_process_group()


def test_layer_costs_are_per_micro_batch():
    m = {3: nn.Linear(2, 2)}
    timings = {3: dt.timing.LayerTiming(fwd_s=0.4, bwd_s=0.8, calls=4, activation_bytes=64)}
    [c] = dt.layer_costs(timings, m, microbatches=4)
    # resident: 6 float32 parameters and their gradients
    assert c == dynmo.LayerCost(layer=3, fwd_s=0.1, bwd_s=0.2, params=6, resident_bytes=48,
                                activation_bytes=16)
    [c] = dt.layer_costs({}, m)
    assert c.fwd_s == 0 and c.params == 6
    with pytest.raises(ValueError, match="microbatches"):
        dt.layer_costs({}, m, microbatches=0)


def test_migration_is_bit_exact_with_adamw_state(tmp_path):
    spawn(torch_workers.migrate_one_layer, tmp_path)


def test_agreement_and_applying_a_plan(tmp_path):
    spawn(torch_workers.apply_a_plan, tmp_path)


def test_the_early_agreement_is_started_a_boundary_before(tmp_path):
    spawn(torch_workers.early_agreement, tmp_path)


@pytest.mark.parametrize("mode,lead,picked", [
    ("auto", 5, "early"), ("auto", 3, "early"), ("auto", 2, "boundary"),
    ("auto", 0, "boundary"), ("early", 0, "early"), ("early", 10, "early"),
    ("boundary", 10, "boundary"), ("boundary", 2, "boundary"),
])
def test_the_agreement_picked_follows_the_plan_lead(mode, lead, picked):
    from dynmo.pipelining.plan_agreement import agreement_for
    assert agreement_for(mode, lead).mode == picked


def test_an_early_agreement_a_plan_lead_of_2_would_starve_is_refused():
    from dynmo.pipelining.plan_agreement import agreement_for
    with pytest.raises(ValueError, match="needs the coordinator's plan lead >= 3"):
        agreement_for("early", 2)
    with pytest.raises(ValueError, match="one of auto, early, boundary, got 'lagged'"):
        agreement_for("lagged", 5)


def test_the_plan_lead_is_the_last_flag_given():
    from dynmo.pipelining.plan_agreement import plan_lead_of
    assert plan_lead_of([]) == 0
    assert plan_lead_of(["--plan_lead_iterations=5", "--trigger=auto"]) == 5
    assert plan_lead_of(["--plan_lead_iterations=5", "--plan_lead_iterations=2"]) == 2
    assert plan_lead_of(["--plan_lead_iterations=5", "--plan_lead_iterations", "7"]) == 7
    assert plan_lead_of(["-plan_lead_iterations=4"]) == 4
    assert plan_lead_of(["--plan_lead_iterations=x"]) == 0
    assert plan_lead_of(["--plan_lead_iterations_x=9"]) == 0


def plan(**kw):
    fields = dict(job="t", epoch=1, apply_iteration=1, boundaries=[0, 2, 4],
                  active_stages=[0, 1], released_stages=[], migrations=[], split=[],
                  migration_bytes=0, predicted_bottleneck_s=0, previous_bottleneck_s=0,
                  reason="", decided_unix_nanos=0, commit_with_prepare=False)
    fields.update(kw)
    return dynmo.Plan(**fields)


def test_apply_plan_refuses_plans_it_cannot_carry_out():
    stage = dt.StageLayers(0, 0, [nn.Linear(1, 1) for _ in range(3)])
    with pytest.raises(ValueError, match="re-packing is not supported"):
        dt.apply_plan(plan(released_stages=[1]), stage, None, lambda i: nn.Linear(1, 1))
    with pytest.raises(RuntimeError, match="which does not hold it"):
        dt.apply_plan(plan(migrations=[dynmo.LayerMove(3, 0, 1, 0, 0)]), stage, None,
                      lambda i: nn.Linear(1, 1))
    with pytest.raises(RuntimeError, match=r"holds layers \[0, 1, 2\] after its moves"):
        dt.apply_plan(plan(), stage, None, lambda i: nn.Linear(1, 1))


def test_agreement_runs_on_the_device_the_group_backend_takes():
    from dynmo.torch.plan import _device_for_backend
    assert _device_for_backend("gloo") == torch.device("cpu")
    assert _device_for_backend("cpu:gloo,cuda:nccl") == torch.device("cpu")
    if torch.cuda.is_available():
        assert _device_for_backend("nccl") == torch.device("cuda", torch.cuda.current_device())
    else:
        assert _device_for_backend("nccl") == torch.device("cpu")
