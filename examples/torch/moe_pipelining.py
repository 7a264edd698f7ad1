"""torchtitan's own Qwen3 MoE model trained with torch.distributed.pipelining,
its layer split re-balanced live by DynMo, with a router skewed per block.

    torchrun --standalone --nproc-per-node 2 examples/torch/moe_pipelining.py \\
        --steps 40 --initial_boundaries 0,9,10 --hot_blocks 4,5,6,7 \\
        --log_json out/moe.jsonl

The model is ``torchtitan.models.qwen3.Qwen3Model`` with ``moe_enabled``
(torchtitan 0.2.2, scripts/install-torch.sh), built as its users build it
and passed to ``DynamicPipeline`` as it is. ``--hot_blocks``: the blocks
whose router sends every token to ``--top_k`` experts (their
``expert_bias``, torchtitan's own routing bias, raised for those experts);
the others route as their gates say. On a CPU a block whose tokens all go
to a few experts runs a few large matrix products instead of many thin
ones; what that costs is measured, not assumed (docs/benchmarks.md).

Two things a CPU run needs that a GPU run does not:
``torch.histc`` on int64 (torchtitan counts tokens per expert with it;
torch's CPU kernels lack it: ``allow_integer_histc_on_cpu``), and
``use_grouped_mm=False`` (torchtitan's grouped GEMM path needs Triton).

One JSON object per iteration on rank 0 (``--log_json``), as
llama_pipelining.py writes, plus ``hot_share``: per block, the share of its
tokens its busiest expert took (all ranks' blocks, gathered). ``--coordinator
none`` trains the same pipeline statically: the losses are bit-identical.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpt_data import corpus, micro_batch  # noqa: E402
from gpt_pipeline import init_distributed  # noqa: E402
from llama_pipelining import iteration_record, print_iteration  # noqa: E402
from dynmo.pipelining import DynamicPipeline  # noqa: E402  # DynMo

VOCAB = 256  # byte tokens


def allow_integer_histc_on_cpu() -> None:
    """Lets ``torch.histc`` count int64 values on the CPU, as it does on
    CUDA: torchtitan's router counts expert indices with it. Counted in
    float32 (exact below 2**24 per bin) and returned as the input's dtype.
    Process-wide; idempotent."""
    if getattr(torch.histc, "_dynmo_integer", False):
        return
    histc = torch.histc

    def integer_histc(input, bins=100, min=0, max=0, *, out=None):
        if input.is_floating_point() or input.device.type != "cpu" or out is not None:
            return histc(input, bins, min, max, out=out)
        return histc(input.float(), bins, min, max).to(input.dtype)

    integer_histc._dynmo_integer = True
    torch.histc = integer_histc


def build_qwen3_moe(layers: int, dim: int, experts: int, top_k: int, seq_len: int,
                    hidden: int) -> torch.nn.Module:
    """torchtitan's Qwen3 MoE at a debug size, initialised as torchtitan does."""
    from torchtitan.models.moe import MoEArgs
    from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
    from torchtitan.models.qwen3.model.model import Qwen3Model
    allow_integer_histc_on_cpu()
    args = Qwen3ModelArgs(
        dim=dim, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=dim // 4,
        vocab_size=VOCAB, hidden_dim=hidden, max_seq_len=seq_len, moe_enabled=True,
        moe_inter_dim=hidden,
        moe_args=MoEArgs(num_experts=experts, num_shared_experts=0, top_k=top_k,
                         score_func="softmax", route_norm=True, use_grouped_mm=False))
    model = Qwen3Model(args)
    with torch.no_grad():  # torchtitan's initialisation writes into leaves
        model.init_weights()
    return model


def skew_router(model: torch.nn.Module, hot_blocks: List[int], hot_experts: int) -> None:
    """Blocks ``hot_blocks`` send every token to their first ``hot_experts``
    experts: their ``expert_bias`` (added to the router's scores for the
    choice only, not to the gate values) is raised past any score."""
    with torch.no_grad():
        for b in hot_blocks:
            model.layers[str(b)].moe.expert_bias[:hot_experts] = 2.0


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coordinator", default="embedded", help="none | embedded | HOST:PORT")
    p.add_argument("--schedule", default="1F1B")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--initial_boundaries", default=None,
                   help="b0,b1,b2 over the layers+2 pipeline layers (default: even)")
    p.add_argument("--layers", type=int, default=8, help="MoE blocks")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128, help="each expert's hidden size")
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top_k", type=int, default=2)
    p.add_argument("--hot_blocks", default="", help="block ids routed to top_k experts only")
    p.add_argument("--seq_len", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--micro_batch", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--trigger", default="auto")
    p.add_argument("--log_json", default=None)
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    init_distributed("gloo", torch.device("cpu"))
    torch.manual_seed(0)
    model = build_qwen3_moe(args.layers, args.dim, args.experts, args.top_k, args.seq_len,
                            args.hidden)
    skew_router(model, [int(b) for b in args.hot_blocks.split(",") if b], args.top_k)
    pipe = DynamicPipeline(  # DynMo
        model, schedule=args.schedule, n_microbatches=args.microbatches,  # DynMo
        loss_fn=loss_fn, pp=dist.get_world_size(),  # DynMo
        boundaries=([int(x) for x in args.initial_boundaries.split(",")]  # DynMo
                    if args.initial_boundaries else None),  # DynMo
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=args.lr),  # DynMo
        coordinator=None if args.coordinator == "none" else args.coordinator,  # DynMo
        job="moe-pipelining", policy={"trigger": args.trigger},  # DynMo
        planned_iterations=args.steps)  # DynMo
    data = corpus()
    rows = args.micro_batch * args.microbatches
    n = pipe.layout.num_layers
    log = open(args.log_json, "w") if args.log_json and pipe.is_reporter else None
    for step in range(args.steps):
        start = time.perf_counter()
        plan = pipe.begin_iteration(step)  # DynMo
        tokens, targets = [torch.cat(t) for t in zip(*(
            micro_batch(data, 0, step, m, args.micro_batch, args.seq_len)
            for m in range(args.microbatches)))]
        losses: List[torch.Tensor] = []
        pipe.step(tokens, target=targets, losses=losses)
        pipe.optimizer.step()
        pipe.optimizer.zero_grad(set_to_none=True)
        pipe.end_iteration(step)  # DynMo
        elapsed = time.perf_counter() - start
        summary = pipe.iteration_summary(torch.stack(losses).mean().item() if losses else None,
                                         elapsed)
        # Each block's busiest expert's share of its tokens, from the rank
        # holding it (DynMo's read of torchtitan's counters).
        share = torch.zeros(n, dtype=torch.float64)
        for layer, counts in pipe.tokens_per_expert.items():
            share[layer] = max(counts) / max(1, sum(counts))
        dist.all_reduce(share, op=dist.ReduceOp.MAX, group=pipe.topology.control_group)
        if pipe.is_reporter:
            record = iteration_record(pipe, summary, step, plan, rows * args.seq_len,
                                      args.microbatches)
            record["hot_share"] = [round(float(x), 3) for x in share[1:n - 1]]
            print_iteration("moe_pipelining", record, plan)
            if log:
                log.write(json.dumps(record) + "\n")
    if log:
        log.close()
    pipe.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
