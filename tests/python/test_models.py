"""The models people train, as they are, under dynmo.pipelining: torchtitan's
own Llama 3 and Qwen3 MoE and transformers' causal LMs passed to
DynamicPipeline with no wrapper (the real classes of the pinned packages,
scripts/install-torch.sh), and the layer timer under every calling convention a block may have.

Multi-rank runs go over Gloo on the CPU from a skewed start and compare a
run with plans applied against the static run of the same model and data:
the losses of every micro-batch and the final weights of every layer must
be bit-identical wherever the layers went."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from conftest import run_ranks  # noqa: E402
from dynmo.pipelining import ModelLayout  # noqa: E402
from dynmo.pipelining.layout import ModelParts  # noqa: E402
from dynmo.torch.timing import LayerTimer  # noqa: E402


# ---- the layer timer under each calling convention ------------------------

class Block(nn.Module):
    """A block that takes its hidden states by position or keyword and
    returns them as a tensor, a tuple or a dict (a ModelOutput is one)."""

    def __init__(self, returns="tensor"):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.returns = returns

    def forward(self, hidden_states, scale=None):
        h = torch.tanh(self.linear(hidden_states))
        if self.returns == "tuple":
            return h, None
        if self.returns == "dict":
            return {"last_hidden_state": h}
        return h


def _time_one_pass(call):
    block = Block(call)
    timer = LayerTimer()
    timer.attach({1: block})
    x = torch.randn(4, 8, requires_grad=True)
    scale = torch.ones(1)
    out = {"positional": lambda: block(x, scale),
           "keyword": lambda: block(hidden_states=x, scale=scale),
           "tuple": lambda: block(x)[0],
           "dict": lambda: block(hidden_states=x)["last_hidden_state"]}[call]()
    out.sum().backward()
    return timer.collect()[1]


@pytest.mark.parametrize("call", ["positional", "keyword", "tuple", "dict"])
def test_a_block_gets_backward_time_whatever_its_calling_convention(call):
    # layer(h), layer(hidden_states=h, ...), and outputs that are tuples or
    # dicts: the hooks find the input and output tensors in each, so the
    # block's backward is measured (it read 0 s for keyword calls before).
    t = _time_one_pass(call)
    assert t.calls == 1
    assert t.fwd_s > 0
    assert t.bwd_s > 0


# ---- layouts recognised, chunks that run as the model does ------------------

HF_FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text"]


def _hf_model(family, attention):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  max_position_embeddings=32, tie_word_embeddings=False,
                  attn_implementation=attention)
    window = dict(sliding_window=5)
    built = {
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)),
        "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            use_sliding_window=True, max_window_layers=2, **window, **common)),
        "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common)),
        "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
            **window, **common)),
        "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(**common)),
        "gemma2": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            final_logit_softcapping=3.0, **window, **common)),
        "gemma3_text": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            final_logit_softcapping=3.0, **window, **common)),
    }
    torch.manual_seed(0)
    return built[family]()


@pytest.mark.parametrize("family", HF_FAMILIES)
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_transformers_chunks_run_as_the_models_own_forward(family, attention):
    # Each family's layout is recognised, and two chunks [0, 3) and [3, N+2)
    # run one after the other give the model's own logits bit for bit:
    # embedding scale, rotary embeddings, causal (and sliding-window) masks
    # per layer type and the logit soft-cap are those of its forward.
    if family == "gemma2" and attention == "sdpa":
        pytest.skip("Gemma 2 has no sdpa attention (its soft-capped scores)")
    model = _hf_model(family, attention)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(tokens).logits
    keys = set(model.state_dict())
    layout = ModelLayout(model)
    assert layout.family.name == f"transformers {type(model).__name__}"
    assert layout.fqns(0) == ["model.embed_tokens"]
    assert layout.fqns(2) == ["model.layers.1"]
    assert layout.fqns(layout.num_layers - 1) == ["model.norm", "lm_head"]
    parts = ModelParts(model, layout, range(layout.num_layers), torch.device("cpu"))
    front, back = parts.chunk(0, 3), parts.chunk(3, layout.num_layers)
    with torch.no_grad():
        assert torch.equal(back(front(tokens)), expected)
    # The chunks keep the model's own names (checkpoints keep their keys).
    assert set(front.state_dict()) | set(back.state_dict()) == keys


def _titan_llama3(monkeypatch):
    titan = pytest.importorskip("torchtitan.models.llama3")
    torch.manual_seed(0)
    model = titan.Transformer(titan.TransformerModelArgs(
        dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16))
    with torch.no_grad():
        model.init_weights()
    return model


def _titan_moe(monkeypatch):
    """torchtitan's Qwen3 MoE, tiny, block 1 routing every token to experts
    0 and 1 (the CPU's integer histc undone after the test)."""
    pytest.importorskip("torchtitan.models.qwen3")
    import pipelining_workers  # noqa: F401  (puts examples/torch on the path)
    from moe_pipelining import build_qwen3_moe, skew_router
    monkeypatch.setattr(torch, "histc", torch.histc)
    torch.manual_seed(0)
    model = build_qwen3_moe(layers=3, dim=32, experts=4, top_k=2, seq_len=16, hidden=32)
    skew_router(model, [1], hot_experts=2)
    return model


@pytest.mark.parametrize("build", [_titan_llama3, _titan_moe], ids=["llama3", "qwen3-moe"])
def test_torchtitan_models_are_recognised_and_their_chunks_run_as_they_do(build, monkeypatch):
    model = build(monkeypatch)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(tokens)
    layout = ModelLayout(model)
    n = layout.num_layers
    assert layout.family.name == "torchtitan"
    assert (layout.first, layout.last, n) == (("tok_embeddings",), ("norm", "output"),
                                              len(model.layers) + 2)
    parts = ModelParts(model, layout, range(n), torch.device("cpu"))
    with torch.no_grad():
        assert torch.equal(parts.chunk(2, n)(parts.chunk(0, 2)(tokens)), expected)


def test_expert_counts_are_the_steps_trained_tokens_whatever_the_model_does_to_its_counters(
        monkeypatch):
    # Counted around each schedule step: tokens of forwards with autograd
    # only (not the no-grad forward torch's shape inference runs after a
    # rebuild), unaffected by what the model's counters held before or by a
    # hook zeroing them at the optimizer step (torchtitan's load balancing);
    # several steps add up.
    from dynmo.pipelining.routing import ExpertCounts
    model = _titan_moe(monkeypatch)
    blocks = {1 + i: [model.layers[str(i)]] for i in range(3)}
    counts = ExpertCounts()
    counts.attach(blocks)
    assert counts.layers == [1, 2, 3]
    h = torch.randn(2, 8, 32, requires_grad=True)
    for block in model.layers.values():
        block.moe.tokens_per_expert.fill_(7.0)  # left from before
    for _ in range(2):  # two steps in one iteration
        counts.step_begins()
        with torch.no_grad():
            model.layers["0"](h, model.rope_cache, None)  # shape inference's
        out = h
        for block in model.layers.values():
            out = block(out, model.rope_cache, None)
        out.sum().backward()
        counts.step_ends()
        for block in model.layers.values():  # a load-balancing hook, at optimizer.step
            block.moe.tokens_per_expert.zero_()
    seen = ExpertCounts.read(counts.take())
    assert sorted(seen) == [1, 2, 3]
    assert all(sum(c) == 2 * 16 * 2 for c in seen.values())  # 2 steps, 16 tokens, top 2
    assert seen[2] == (32, 32, 0, 0)
    assert counts.take() is None  # taken: nothing since


def test_expert_counts_are_read_with_the_times_of_their_iteration(monkeypatch):
    # A clock that completes marks one iteration late, as CUDA events do:
    # the counts reach pipe.tokens_per_expert with the layer times of the
    # same (measured) iteration, and nothing waits for the device.
    from pipelining_workers import LaggingClock
    from dynmo.pipelining.cost_meter import CostMeter
    model = _titan_moe(monkeypatch)
    clock = LaggingClock()
    meter = CostMeter(torch.device("cpu"), microbatches=1, clock=clock)
    meter.attach({1 + i: [model.layers[str(i)]] for i in range(3)})
    seen = []
    for iteration, rows in enumerate((1, 2, 3)):
        clock.iteration = iteration
        meter.begin(iteration)
        meter.routing.step_begins()
        out = torch.randn(rows, 8, 32, requires_grad=True)
        for block in model.layers.values():
            out = block(out, model.rope_cache, None)
        out.sum().backward()
        meter.routing.step_ends()
        fresh = meter.end()
        seen.append((fresh, meter.measured_iteration,
                     {layer: sum(c) for layer, c in meter.tokens_per_expert.items()},
                     sorted(meter.layer_seconds)))
    tokens = {1: 16, 2: 32}  # rows x 8 tokens x top 2, per block
    assert seen == [(False, -1, {}, []),
                    (True, 0, {1: tokens[1], 2: tokens[1], 3: tokens[1]}, [1, 2, 3]),
                    (True, 1, {1: tokens[2], 2: tokens[2], 3: tokens[2]}, [1, 2, 3])]
    assert clock.violations == []


class ListModel(nn.Module):
    """A model of the user's own: blocks in an nn.ModuleList under a dotted
    path, a forward that skips the pieces that are None."""

    def __init__(self):
        super().__init__()
        self.body = nn.Module()
        self.body.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, x):
        h = self.embed(x) if self.embed is not None else x
        for block in self.body.blocks:
            h = torch.relu(block(h))
        return self.head(h) if self.head is not None else h


def test_dotted_names_and_module_lists_are_taken():
    model = ListModel()
    tokens = torch.randint(0, 16, (2, 5))
    with torch.no_grad():
        expected = model(tokens)
    layout = ModelLayout(model, blocks="body.blocks", first=("embed",), last=("head",))
    assert [layout.fqns(i) for i in range(5)] == [["embed"], ["body.blocks.0"],
                                                  ["body.blocks.1"], ["body.blocks.2"],
                                                  ["head"]]
    parts = ModelParts(model, layout, range(5), torch.device("cpu"))
    front, back = parts.chunk(0, 2), parts.chunk(2, 5)
    with torch.no_grad():
        assert torch.equal(back(front(tokens)), expected)
    assert set(back.state_dict()) == {"body.blocks.1.weight", "body.blocks.1.bias",
                                      "body.blocks.2.weight", "body.blocks.2.bias",
                                      "head.weight", "head.bias"}
    # transformers' names given by hand are its recognised names.
    hf = _hf_model("llama", "eager")
    named = ModelLayout(hf, blocks="model.layers", first=("model.embed_tokens",),
                        last=("model.norm", "lm_head"))
    assert named.family.name == "transformers LlamaForCausalLM"
    assert named.fqns(1) == ["model.layers.0"]


def _refusal(model, **names):
    with pytest.raises((TypeError, ValueError)) as e:
        ModelLayout(model, **names)
    text = str(e.value)
    assert "\n" not in text
    return text


def test_a_model_it_cannot_take_is_refused_in_one_line():
    assert "looked for torchtitan's model.layers" in _refusal(nn.Sequential(nn.Linear(2, 2)))
    assert "found no attribute model.tok_embeddings" in _refusal(ListModel(),
                                                                 blocks="body.blocks")
    assert "blocks='model.layerz': looked for model.model.layerz" in _refusal(
        _hf_model("llama", "eager"), blocks="model.layerz")
    assert "found the base model LlamaModel (pass its *ForCausalLM)" in _refusal(
        _hf_model("llama", "eager").model)


def test_a_failed_constructor_leaves_the_model_whole(tmp_path):
    # Refused at the layout, or failing after the model was read (here the
    # optimizer factory), DynamicPipeline leaves the user's model as it was.
    import torch.distributed as dist
    from dynmo.pipelining import DynamicPipeline
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0,
                            world_size=1)
    try:
        model = _hf_model("llama", "eager")
        before = {k: v.clone() for k, v in model.state_dict().items()}
        modules = dict(model.named_modules())

        def broken_optimizer(params):
            raise RuntimeError("no optimizer")

        from dynmo import InvalidArgumentError
        for kwargs, error in ((dict(blocks="model.layerz"), InvalidArgumentError),
                              (dict(boundaries=[0, 7]), InvalidArgumentError),
                              (dict(optimizer=broken_optimizer), RuntimeError)):
            args = dict(schedule="1F1B", n_microbatches=2, loss_fn=None, pp=1,
                        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
            with pytest.raises(error):
                DynamicPipeline(model, **dict(args, **kwargs))
            assert dict(model.named_modules()) == modules
            after = model.state_dict()
            assert set(after) == set(before)
            assert all(torch.equal(after[k], v) for k, v in before.items())
    finally:
        dist.destroy_process_group()


# ---- the real classes trained under DynamicPipeline -------------------------

def run(cfg, world=2):
    import models_workers as w
    return run_ranks(w.train, cfg, world)


# From a skewed start, layers go one way, then come back the other.
ONE_STAGE_PER_RANK = dict(schedule="1F1B", boundaries=[0, 5, 6],
                          plans={"1": [[0, 5, 6], [0, 2, 6]], "2": [[0, 2, 6], [0, 4, 6]]})
TWO_STAGES_PER_RANK = dict(schedule="Interleaved1F1B", boundaries=[0, 3, 4, 5, 6],
                           plans={"1": [[0, 3, 4, 5, 6], [0, 1, 2, 4, 6]],
                                  "2": [[0, 1, 2, 4, 6], [0, 2, 3, 5, 6]]})
MODELS = [("torchtitan-llama3", "torchtitan.models.llama3", "torchtitan"),
          ("hf-llama", "transformers", "transformers LlamaForCausalLM"),
          ("hf-qwen2", "transformers", "transformers Qwen2ForCausalLM"),
          ("hf-qwen2-tied", "transformers", "transformers Qwen2ForCausalLM")]
SPLITS = [("1F1B", ONE_STAGE_PER_RANK), ("Interleaved1F1B", TWO_STAGES_PER_RANK)]
# torchtitan's Qwen3 MoE, its router skewed on one block, under both.
MOE = ("torchtitan-qwen3-moe", "torchtitan.models.qwen3", "torchtitan")
CASES = [(name, split) + m for name, split in SPLITS for m in MODELS + [MOE]]


@pytest.mark.parametrize("split_name,split,model,package,family", CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_a_model_passed_as_it_is_trains_bit_identically_through_plans(split_name, split, model,
                                                                      package, family):
    pytest.importorskip(package)
    records = run(dict(split, model=model, steps=3))
    static = [r["static"] for r in records]
    moved = [r["moved"] for r in records]
    assert all(r["family"] == family for r in static + moved)
    assert all(r["boundaries"][0] == split["boundaries"] for r in static + moved)
    assert all(r["boundaries"][-1] == split["plans"]["2"][1] for r in moved)
    # Every micro-batch's loss, and every layer's final weights, wherever
    # they ended up.
    assert [r["losses"] for r in moved] == [r["losses"] for r in static]
    assert sum(len(r["losses"]) for r in moved) == 3

    def weights(runs):
        return {int(k): v for r in runs for k, v in r["weights"].items()}

    assert weights(moved) == weights(static)
    assert sorted(weights(moved)) == list(range(moved[0]["layers"]))
    # Every layer fed hidden states had its backward timed (the embedding,
    # fed token ids, has none to time).
    timed = sorted(i for r in moved for i in r["backward_timed"])
    assert timed == list(range(1, moved[0]["layers"]))
    if model.endswith("-moe"):  # the router's counts, read by DynMo on each rank
        import models_workers as w
        counts = {int(k): v for r in moved for k, v in r["tokens_per_expert"].items()}
        assert sorted(counts) == list(range(1, moved[0]["layers"] - 1))
        routed = 8 * w.SEQ * 2  # the iteration's tokens (8 rows), top 2 experts each
        assert all(sum(c) == routed for c in counts.values()), counts
        for block in w.HOT_BLOCKS:  # all on the two experts its bias favours
            assert counts[block + 1] == [routed // 2, routed // 2, 0, 0]
    if model.endswith("-tied"):  # tie_word_embeddings: one matrix, two copies, equal
        copies = [h for r in moved for h in r["tied"]]
        assert len(copies) == 2 and len(set(copies)) == 1
