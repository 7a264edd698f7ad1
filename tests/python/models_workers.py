"""Process bodies for test_models.py: each runs on one Gloo rank
(torch.multiprocessing.spawn), trains one library's own model class passed
to DynamicPipeline as it is, first statically and then with plans applied,
and writes both runs to a JSON file per rank."""
import hashlib
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipelining_workers import batch, make_plan
from dynmo.pipelining import DynamicPipeline

VOCAB = 128
SEQ = 16
HOT_BLOCKS = [1]  # the MoE model's blocks whose router sends every token to 2 experts


def build(kind):
    """A tiny model of ``kind``, built as a user of the library builds it."""
    if kind == "torchtitan-llama3":
        from torchtitan.models.llama3 import Transformer, TransformerModelArgs
        model = Transformer(TransformerModelArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2,
                                                 vocab_size=VOCAB, max_seq_len=SEQ))
        with torch.no_grad():  # torchtitan's initialisation writes into leaves
            model.init_weights()
        return model
    if kind == "torchtitan-qwen3-moe":
        from moe_pipelining import build_qwen3_moe, skew_router
        model = build_qwen3_moe(layers=4, dim=32, experts=4, top_k=2, seq_len=SEQ, hidden=32)
        skew_router(model, HOT_BLOCKS, hot_experts=2)
        return model
    import transformers
    kinds = {"hf-llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, "eager"),
             "hf-qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, "sdpa"),
             "hf-qwen2-tied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, "sdpa")}
    config_cls, model_cls, attention = kinds[kind]
    tied = kind.endswith("-tied")
    config = config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=SEQ, tie_word_embeddings=tied,
                        attn_implementation=attention)
    return model_cls(config)


def loss_fn(logits, target):
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))


def train(rank, world, init_file, out_dir, cfg):
    """cfg: model, schedule, boundaries, plans {iteration: [old, new]}, steps."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    record = {}
    for run, plans in (("static", {}), ("moved", cfg["plans"])):
        torch.manual_seed(0)
        pipe = DynamicPipeline(build(cfg["model"]), schedule=cfg["schedule"], n_microbatches=4,
                               loss_fn=loss_fn, pp=2, boundaries=cfg["boundaries"],
                               optimizer=lambda ps: torch.optim.AdamW(ps, lr=3e-3))
        seen = {"losses": [], "boundaries": [], "backward_timed": []}
        for step in range(cfg["steps"]):
            if str(step) in plans:
                pipe.apply_plan(make_plan(step, *plans[str(step)]))
            pipe.begin_iteration(step)
            x, y = batch(step, 8, SEQ, VOCAB)
            losses = []
            pipe.step(x, target=y, losses=losses)
            pipe.optimizer.step()
            pipe.optimizer.zero_grad(set_to_none=True)
            pipe.end_iteration(step)
            if losses:
                seen["losses"].append([step, [float(l.detach()) for l in losses]])
            seen["boundaries"].append(list(pipe.boundaries))
        # The layers whose backward was timed in the last iteration.
        seen["backward_timed"] = sorted(
            i for i, s in pipe.layer_seconds.items() if s > pipe.meter.forward_seconds[i])
        seen["held"] = sorted(pipe.held_layers())
        seen["weights"] = {layer: sum(float(p.detach().double().sum())
                                      for m in mods for p in m.parameters())
                           for layer, mods in pipe.held_layers().items()}
        seen["layers"] = pipe.layout.num_layers
        held = pipe.held_layers()  # the tied matrix's copies here, by bytes
        ends = [held[0][0]] if 0 in held else []
        ends += [held[seen["layers"] - 1][-1]] if seen["layers"] - 1 in held else []
        seen["tied"] = [hashlib.sha1(m.weight.detach().numpy().tobytes()).hexdigest()
                        for m in ends] if cfg["model"].endswith("-tied") else []
        seen["family"] = pipe.layout.family.name
        # The last iteration's tokens per expert, per MoE layer held here.
        seen["tokens_per_expert"] = {str(k): list(v) for k, v in pipe.tokens_per_expert.items()}
        pipe.close()
        record[run] = seen
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()
