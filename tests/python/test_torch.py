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
    assert dt.layer_memory(m) == (15, 60)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    assert dt.layer_memory(m, opt) == (15, 120)  # + grads
    opt.step()
    opt.zero_grad(set_to_none=True)
    # params + exp_avg + exp_avg_sq + two float32 steps
    assert dt.layer_memory(m, opt) == (15, 60 * 3 + 8)


def test_honest_gpu_memory_matches_the_trainers_arithmetic():
    from dynmo.torch.memory import device_memory, honest_rank_memory, ranks_sharing_device
    gib = 1 << 30
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


def test_layer_costs_are_per_micro_batch():
    m = {3: nn.Linear(2, 2)}
    timings = {3: dt.timing.LayerTiming(fwd_s=0.4, bwd_s=0.8, calls=4, activation_bytes=64)}
    [c] = dt.layer_costs(timings, m, microbatches=4)
    assert c == dynmo.LayerCost(layer=3, fwd_s=0.1, bwd_s=0.2, params=6, resident_bytes=24,
                                activation_bytes=16)
    [c] = dt.layer_costs({}, m)
    assert c.fwd_s == 0 and c.params == 6
    with pytest.raises(ValueError, match="microbatches"):
        dt.layer_costs({}, m, microbatches=0)


def test_migration_is_bit_exact_with_adamw_state(tmp_path):
    spawn(torch_workers.migrate_one_layer, tmp_path)


def test_agreement_and_applying_a_plan(tmp_path):
    spawn(torch_workers.apply_a_plan, tmp_path)


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
