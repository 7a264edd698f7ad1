"""A Llama-style model trained with torch.distributed.pipelining, its layer
split re-balanced live by DynMo (dynmo.pipelining).

    torchrun --standalone --nproc-per-node 2 examples/torch/llama_pipelining.py \
        --schedule 1F1B --pp 2 --steps 60 --initial_boundaries 0,8,10 \
        --dynamism freezing --log_json out/llama.jsonl

The model (llama_model.py) is written in torchtitan's layout; the loop is
torchtitan's: ``schedule.step`` on the stages, ``optimizer.step``,
``lr_scheduler.step``, ``zero_grad``. The lines marked ``# DynMo`` are all
that connect it to a coordinator: build the pipeline through
``DynamicPipeline``, apply a plan at the iteration boundary, report after
the step. ``--coordinator none`` trains the same pipeline statically (the
adapter still builds it, so both runs share every line of arithmetic and
the losses are bit-identical: one intra-op thread per rank, deterministic
algorithms, float32).

Rank 0 prints one line per iteration and, with ``--log_json``, writes one
JSON object per iteration: iteration (and iter), loss, tokens_per_s,
iteration_s, boundaries, epoch (the plan in force), moved_bytes and
stage_times (per stage: its layers' measured forward + backward seconds),
which ``scripts/dynmo-report`` reads.

``--backend``: ``auto`` (NCCL on a GPU, Gloo on the CPU) or any
``torch.distributed`` backend; ``nccl-double`` runs CPU ranks under NCCL's
completion semantics (``dynmo.nccl_double``: a receive reads poison until
its work is waited on), which is how CI proves the GPU path's ordering.
Bad flags are refused before any process group starts: one line, exit
status 2 (a constructor refusal, ``dynmo.InvalidArgumentError``, too). A
rank that raises ends every rank within seconds with one line naming it
and its error (``pipe.close(error=e)``, dynmo/pipelining/failure.py), exit
status 1; a rank that dies or falls silent mid-migration ends every
survivor with one line (``MigrationError``, within
``--migration_timeout_s``) and exit status 3. Started with ``python -m
dynmo.torchrun`` instead of ``torchrun`` (the same flags and launcher),
a failed run ends with one more line, how each rank ended, instead of
torchrun's report, and exits with the first rank's status.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, NoReturn, Optional

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import llama_model as lm  # noqa: E402
from gpt_data import corpus, micro_batch  # noqa: E402
from gpt_pipeline import init_distributed, resolve_device  # noqa: E402
from dynmo import InvalidArgumentError, plan_formats  # noqa: E402
from dynmo.pipelining import DynamicPipeline, MigrationError  # noqa: E402  # DynMo
from dynmo.pipelining.failure import one_line  # noqa: E402


def refuse(message: str) -> NoReturn:
    """One line on rank 0 (every rank refuses alike), exit status 2."""
    if os.environ.get("RANK", "0") == "0":
        print(f"llama_pipelining: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        refuse(message)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coordinator", default=os.environ.get("DYNMO_COORDINATOR", "embedded"),
                   help="none | embedded | HOST:PORT (default: $DYNMO_COORDINATOR, else "
                        "embedded)")
    p.add_argument("--schedule", default="1F1B",
                   help="GPipe | 1F1B | Interleaved1F1B | LoopedBFS | InterleavedZeroBubble "
                        "| ZBVZeroBubble (NCCL only) (torch's names)")
    p.add_argument("--pp", type=int, default=None, help="pipeline ranks (default: world / dp)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    p.add_argument("--data_parallel", default="ddp", choices=("ddp", "fsdp2"),
                   help="how the replicas share a stage: DDP copies or FSDP2 shards")
    p.add_argument("--stages_per_rank", type=int, default=2,
                   help="virtual stages per rank for multi-stage schedules")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--initial_boundaries", default=None,
                   help="b0,...,bS over the n_layers+2 pipeline layers (default: even)")
    p.add_argument("--dynamism", default="none",
                   choices=["none", "freezing", "early-exit", "both"])
    p.add_argument("--layers", type=int, default=8, help="transformer blocks")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv_heads", type=int, default=2)
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--micro_batch", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", default=os.environ.get("DYNMO_JOB", "llama-pipelining"))
    p.add_argument("--trigger", default="auto",
                   help="the job's rebalance trigger: auto, every:N, on-change:X, manual")
    p.add_argument("--repack", action="store_true",
                   help="let the coordinator pack the layers onto fewer ranks")
    p.add_argument("--no_timing", action="store_true",
                   help="static only: no per-layer timing hooks (the overhead A/B)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--log_json", default=None)
    p.add_argument("--backend", default="auto",
                   help="auto (nccl on cuda, gloo on cpu) | gloo | nccl | nccl-double")
    p.add_argument("--migration_timeout_s", type=float, default=60.0,
                   help="bound on every wait of a migration (a dead peer: one line, exit 3)")
    p.add_argument("--connect_timeout_s", type=float, default=20.0,
                   help="how long a rank waits for the coordinator (unreachable: one line)")
    p.add_argument("--plan_agreement", default="auto", choices=("auto", "early", "boundary"),
                   help="when the ranks agree on the plan due: auto (early under the "
                        "embedded coordinator), early (a boundary ahead), boundary")
    args = p.parse_args(argv)
    check_flags(args)
    return args


def check_flags(args: argparse.Namespace) -> None:
    """Refuses (``refuse``) what would fail once the ranks have started."""
    for name in ("dp", "layers", "dim", "heads", "kv_heads", "seq_len", "microbatches",
                 "micro_batch", "stages_per_rank"):
        if getattr(args, name) < 1:
            refuse(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.pp is not None and args.pp < 1:
        refuse(f"--pp must be >= 1, got {args.pp}")
    if args.steps < 0:
        refuse(f"--steps must be >= 0, got {args.steps}")
    for name in ("migration_timeout_s", "connect_timeout_s"):
        if not getattr(args, name) > 0:
            refuse(f"--{name} must be > 0, got {getattr(args, name)}")
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        refuse(f"--heads {args.heads} must divide --dim {args.dim} into even head sizes")
    if args.heads % args.kv_heads:
        refuse(f"--kv_heads {args.kv_heads} must divide --heads {args.heads}")
    if args.seq_len > corpus().numel() - 2:
        refuse(f"--seq_len {args.seq_len} is longer than the corpus allows "
               f"({corpus().numel() - 2})")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pp = args.pp or world // args.dp
    if pp * args.dp != world:
        refuse(f"--pp {pp} x --dp {args.dp} must equal the world size {world}")
    if args.initial_boundaries is not None:
        try:
            [int(x) for x in args.initial_boundaries.split(",")]
        except ValueError:
            refuse(f"--initial_boundaries must be integers b0,...,bS, got "
                   f"{args.initial_boundaries!r}")
    if args.log_json:
        folder = os.path.dirname(os.path.abspath(args.log_json))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            refuse(f"--log_json {args.log_json}: cannot write in {folder}")
    if args.no_timing and args.coordinator != "none":
        refuse("--no_timing needs --coordinator none (DynMo decides from the timings)")


def iteration_record(pipe: DynamicPipeline, summary: dict, step: int, plan, tokens: int,
                     microbatches: int) -> dict:
    """The iteration's JSON record (see the module doc) from
    ``pipe.iteration_summary``; ``tokens``: the job's tokens per iteration."""
    return {"iteration": step, "iter": step, "loss": summary["loss"],
            "tokens_per_s": tokens / summary["iteration_s"],
            "iteration_s": summary["iteration_s"],
            "boundaries": pipe.boundaries, "epoch": pipe.epoch,
            "moved_bytes": summary["moved_bytes"], "stage_times": summary["stage_times"],
            "microbatches": microbatches,
            "layer_forward_s": summary["layer_forward_s"],
            "layer_backward_s": summary["layer_backward_s"],
            "layer_weight_grad_s": summary["layer_weight_grad_s"],
            "plan": plan.reason if plan is not None else None}


def print_iteration(name: str, record: dict, plan) -> None:
    print(f"{name}: iter {record['iteration']} loss {record['loss']:.6f} "
          f"tokens/s {record['tokens_per_s']:.0f} boundaries "
          f"{','.join(map(str, record['boundaries']))}"
          + (f" (plan epoch {plan.epoch} applied)" if plan is not None else ""), flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed(args.backend, device)
    rank, world = dist.get_rank(), dist.get_world_size()
    pp = args.pp or world // args.dp
    config = lm.LlamaConfig(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                            n_kv_heads=args.kv_heads, ffn_hidden=args.dim * 11 // 4,
                            seq_len=args.seq_len)
    torch.manual_seed(args.seed)
    model = lm.Transformer(config)
    try:
        pipe = DynamicPipeline(  # DynMo
            model, schedule=args.schedule, n_microbatches=args.microbatches,  # DynMo
            loss_fn=lm.loss_fn, pp=pp, dp=args.dp, device=device,  # DynMo
            stages_per_rank=args.stages_per_rank,  # DynMo
            boundaries=([int(x) for x in args.initial_boundaries.split(",")]  # DynMo
                        if args.initial_boundaries else None),  # DynMo
            optimizer=lambda ps: torch.optim.AdamW(ps, lr=args.lr),  # DynMo
            lr_scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(  # DynMo
                o, lambda k: min(1.0, (k + 1) / 10)),  # DynMo
            coordinator=None if args.coordinator == "none" else args.coordinator,  # DynMo
            job=args.job, policy={"trigger": args.trigger, "repack": args.repack},  # DynMo
            timing=not args.no_timing, planned_iterations=args.steps,  # DynMo
            migration_timeout_s=args.migration_timeout_s,  # DynMo
            connect_timeout_s=args.connect_timeout_s,  # DynMo
            data_parallel=args.data_parallel,  # DynMo
            plan_agreement=args.plan_agreement)  # DynMo
    except InvalidArgumentError as e:  # refused alike on every rank
        if rank == 0:
            print(f"llama_pipelining: {e}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return 2
    except Exception as e:  # this rank failed: the others were told and end
        print(f"llama_pipelining: rank {rank} failed: {one_line(e)}", file=sys.stderr,
              flush=True)
        return 1
    data = corpus()
    log = None
    rows = args.micro_batch * args.microbatches
    try:
        for step in range(args.steps):
            start = time.perf_counter()
            plan = pipe.begin_iteration(step)  # DynMo
            if pipe.released:  # DynMo: a re-pack gave this rank back
                print(f"llama_pipelining: rank {rank} released at iteration {step}",
                      flush=True)
                break
            for layer, modules in pipe.held_layers().items():
                lm.set_dynamism(args.dynamism, layer, modules, step, args.steps, args.layers)
            tokens, targets = [torch.cat(t) for t in zip(*(
                micro_batch(data, args.seed + 7919 * pipe.topology.dp_rank, step, m,
                            args.micro_batch, args.seq_len)
                for m in range(args.microbatches)))]
            losses: List[torch.Tensor] = []
            if pipe.has_first_stage:
                pipe.schedule.step(tokens.to(device),
                                   target=targets.to(device) if pipe.has_last_stage else None,
                                   losses=losses)
            elif pipe.has_last_stage:
                pipe.schedule.step(target=targets.to(device), losses=losses)
            else:
                pipe.schedule.step()
            pipe.optimizer.step()
            pipe.lr_scheduler.step()
            pipe.optimizer.zero_grad(set_to_none=True)
            pipe.end_iteration(step)  # DynMo
            elapsed = time.perf_counter() - start
            summary = pipe.iteration_summary(  # gathers loss, time, stage times
                torch.stack(losses).mean().item() if losses else None, elapsed)
            if pipe.is_reporter:
                if args.log_json and log is None:
                    log = open(args.log_json, "w")
                record = iteration_record(pipe, summary, step, plan,
                                          rows * args.seq_len * args.dp, args.microbatches)
                print_iteration("llama_pipelining", record, plan)
                if log:
                    log.write(json.dumps(record) + "\n")
                    log.flush()  # a write error (a full disk) fails this iteration
        if pipe.is_reporter:
            # The split to carry into a job that never runs DynMo.
            b = pipe.boundaries
            print(f"llama_pipelining: final split {','.join(map(str, b))}; torchtitan "
                  f"module_fqns_per_model_part={json.dumps(plan_formats.to_torchtitan(b))}; "
                  f"Megatron pipeline_model_parallel_layout="
                  f"{plan_formats.to_megatron(b)!r}; DeepSpeed parts="
                  f"{plan_formats.to_deepspeed(b)}", flush=True)
        if log:
            log.close()
        pipe.close()  # DynMo: collective; a rank failing meanwhile ends this one
    except Exception as e:  # DynMo: this rank failed (a MigrationError: a peer died)
        if log and not log.closed:
            try:
                log.close()
            except OSError:
                pass
        # Every other rank is told and ends; nothing here waits on them.
        print(f"llama_pipelining: {pipe.close(error=e)}", file=sys.stderr, flush=True)  # DynMo
        return 3 if isinstance(e, MigrationError) else 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
