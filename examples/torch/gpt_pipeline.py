"""A small GPT trained pipeline-parallel over torch.distributed, balanced
live by DynMo.

    torchrun --nproc-per-node 2 examples/torch/gpt_pipeline.py \
        --steps 40 --log_json out/torch-dynmo.jsonl

One stage per rank (Gloo on the CPU, NCCL on GPUs), GPipe schedule: every
micro-batch's forward through the pipeline (activations sent to the next
stage with point-to-point send/recv), then every micro-batch's backward
(gradients sent back), then one AdamW step per stage. Stage s holds layers
[b[s], b[s+1]) of the 10-layer GPT (gpt_model.py); ``--boundaries`` starts
it skewed (default on 2 ranks 0,7,10: the embedding and 6 blocks on stage 0).

With ``--coordinator embedded`` (the default) rank 0 starts a
``dynmo-coordinator`` on a loopback port (``--coordinator HOST:PORT`` or
$DYNMO_COORDINATOR uses a running one, as under deploy/slurm and
deploy/kubernetes, and sets the job's --trigger; ``none`` trains static). Every rank reports its layers'
measured costs (``dynmo.torch.LayerTimer``) through ``dynmo.Agent``; at each
iteration boundary the ranks agree in-band on the committed plan due, move
layers with their AdamW state (``dynmo.torch.apply_plan``) and acknowledge
it. Placement changes nothing in the arithmetic: with the same seed the
losses are bit-identical to a static run (one intra-op thread per rank,
deterministic algorithms, float32).

Rank 0 prints one line per iteration and, with ``--log_json``, writes one
JSON record per iteration: iter, loss, boundaries, epoch (the plan in
force), moved_bytes, stage_times.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dynmo  # noqa: E402
import dynmo.torch as dt  # noqa: E402
from gpt_data import corpus, micro_batch  # noqa: E402
from gpt_model import GptConfig, build_layer  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--boundaries", default=None,
                   help="initial layout b0,...,bP over the blocks+2 layers "
                        "(default: skewed, 70%% of the layers on stage 0; 0,7,10 on 2 ranks)")
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seq_len", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--micro_batch", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--coordinator", default=os.environ.get("DYNMO_COORDINATOR", "embedded"),
                   help="embedded | none | HOST:PORT of a running dynmo-coordinator "
                        "(default: $DYNMO_COORDINATOR, else embedded)")
    p.add_argument("--job", default=os.environ.get("DYNMO_JOB", "torch-gpt"),
                   help="the job's name at the coordinator (default: $DYNMO_JOB)")
    p.add_argument("--trigger", default="every:5",
                   help="the job's rebalance trigger (every:N, auto, on-event, manual)")
    p.add_argument("--plan_lead_iterations", type=int, default=3,
                   help="embedded coordinator: how far ahead a plan applies")
    p.add_argument("--token_file", default=None, help="coordinator bearer token file")
    p.add_argument("--tls_ca", default=None, help="PEM CA of a TLS coordinator")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--log_json", default=None)
    p.add_argument("--backend", default="auto",
                   help="auto (nccl on cuda, gloo on cpu) | gloo | nccl | nccl-double "
                        "(NCCL's completion semantics on CPU ranks: dynmo.nccl_double)")
    return p.parse_args(argv)


class Pipeline:
    """This rank's stage: its layers, optimizer, timer and the GPipe step."""

    def __init__(self, args, config: GptConfig, boundaries: List[int], device) -> None:
        self.args = args
        self.config = config
        self.device = device
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        first, last = boundaries[self.rank], boundaries[self.rank + 1]
        self.layers = dt.StageLayers(self.rank, first,
                                     (self.build(i) for i in range(first, last)))
        self.optimizer = torch.optim.AdamW(self.layers.modules.parameters(), lr=args.lr)
        self.timer = dt.LayerTimer(device)
        self.timer.attach(self.layers.by_id())
        self.data = corpus()

    def build(self, layer: int):
        return build_layer(self.config, layer).to(self.device)

    @property
    def first_stage(self) -> bool:
        return self.rank == 0

    @property
    def last_stage(self) -> bool:
        return self.rank == self.world - 1

    def activation_shape(self):
        return (self.args.micro_batch, self.config.seq_len, self.config.hidden)

    def step(self, iteration: int) -> float:
        """One GPipe iteration; returns the mean micro-batch loss (last stage)."""
        a = self.args
        outputs, inputs, losses = [], [], []
        for m in range(a.microbatches):
            tokens, targets = micro_batch(self.data, a.seed, iteration, m, a.micro_batch,
                                          self.config.seq_len)
            if self.first_stage:
                x = tokens.to(self.device)
            else:
                x = torch.empty(self.activation_shape(), device=self.device)
                dist.recv(x, self.rank - 1)
                x.requires_grad_()
            inputs.append(x)
            for module in self.layers.modules:
                x = module(x)
            if self.last_stage:
                loss = F.cross_entropy(x.reshape(-1, self.config.vocab),
                                       targets.to(self.device).reshape(-1))
                losses.append(loss)
                outputs.append(loss / a.microbatches)
            else:
                dist.send(x.detach().contiguous(), self.rank + 1)
                outputs.append(x)
        for m in range(a.microbatches):
            if self.last_stage:
                outputs[m].backward()
            else:
                grad = torch.empty(self.activation_shape(), device=self.device)
                dist.recv(grad, self.rank + 1)
                outputs[m].backward(grad)
            if not self.first_stage:
                dist.send(inputs[m].grad.contiguous(), self.rank - 1)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return sum(l.item() for l in losses) / a.microbatches if losses else 0.0

    def costs(self) -> List[dynmo.LayerCost]:
        return dt.layer_costs(self.timer.collect(), self.layers.by_id(), self.optimizer,
                              self.args.microbatches)


def skewed_boundaries(layers: int, stages: int) -> List[int]:
    """Stage 0 holds ~70% of the layers, the others share the rest."""
    if stages == 1:
        return [0, layers]
    rest = max(stages - 1, (layers * 3) // 10)
    first = layers - rest
    return [0] + [first + rest * s // (stages - 1) for s in range(stages - 1)] + [layers]


def initial_boundaries(text: Optional[str], layers: int, stages: int) -> List[int]:
    """--boundaries, checked (one stage per rank); SystemExit with one line."""
    try:
        b = [int(x) for x in text.split(",")] if text else skewed_boundaries(layers, stages)
    except ValueError:
        b = []
    if (len(b) != stages + 1 or b[0] != 0 or b[-1] != layers
            or any(x >= y for x, y in zip(b, b[1:]))):
        raise SystemExit(f"gpt_pipeline: --boundaries {text or ','.join(map(str, b))} must be "
                         f"0 < ... < {layers}, {stages + 1} integers (one stage per rank)")
    return b


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) %
                            max(torch.cuda.device_count(), 1))
    return torch.device(name)


def init_distributed(backend: str, device: torch.device) -> None:
    """``init_process_group`` from torchrun's environment with ``backend``:
    "auto" is NCCL on a GPU and Gloo on the CPU; "nccl-double" registers
    DynMo's NCCL completion double first (dynmo.nccl_double)."""
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl-double":
        from dynmo import nccl_double
        nccl_double.register()
    dist.init_process_group(backend)


def connect(args, config: GptConfig, boundaries: List[int], device):
    """(agent, local coordinator) for this rank; (None, None) for 'none'."""
    if args.coordinator == "none":
        return None, None
    local = None
    address = args.coordinator
    if args.coordinator == "embedded":
        port = torch.zeros(1, dtype=torch.int64, device=device)
        if dist.get_rank() == 0:
            local = dynmo.LocalCoordinator([
                f"--trigger={args.trigger}",
                f"--plan_lead_iterations={args.plan_lead_iterations}"])
            port[0] = local.port
        dist.broadcast(port, 0)
        address = f"127.0.0.1:{int(port.item())}"
    agent = dynmo.Agent(
        address, args.job, dist.get_rank(), pipeline_size=dist.get_world_size(),
        num_layers=config.num_layers, boundaries=boundaries,
        microbatches=args.microbatches, schedule="gpipe",
        model_fingerprint=f"torch-gpt:blocks={config.blocks},hidden={config.hidden}",
        host=socket.gethostname(), device=device.index or 0,
        token_file=args.token_file, tls_ca=args.tls_ca, connect_timeout_s=20)
    if dist.get_rank() == 0 and args.coordinator != "embedded":
        token = dynmo._core.read_token(args.token_file) if args.token_file else None
        dynmo.set_policy(address, args.job, trigger=args.trigger, token=token,
                         tls_ca=args.tls_ca)
    return agent, local


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed(args.backend, device)
    rank, world = dist.get_rank(), dist.get_world_size()
    config = GptConfig(seq_len=args.seq_len, hidden=args.hidden, blocks=args.blocks,
                       seed=args.seed)
    boundaries = initial_boundaries(args.boundaries, config.num_layers, world)
    pipe = Pipeline(args, config, boundaries, device)
    agent, local = connect(args, config, boundaries, device)
    log = open(args.log_json, "w") if args.log_json and rank == 0 else None
    epoch = 0
    try:
        for k in range(args.steps):
            moved = 0
            if agent is not None:
                plan = agent.plan_to_apply_at(k)
                if dt.agree_on_plan(plan, device=device):
                    moved = dt.apply_plan(plan, pipe.layers, pipe.optimizer, pipe.build)
                    pipe.timer.attach(pipe.layers.by_id())
                    agent.acknowledge(plan.epoch, True)
                    boundaries, epoch = list(plan.boundaries), plan.epoch
                    if rank == 0:
                        print(f"gpt_pipeline: iteration {k}: applied plan epoch {epoch} "
                              f"({plan.reason}), boundaries -> "
                              f"{','.join(map(str, boundaries))}", flush=True)
                elif plan is not None:
                    agent.acknowledge(plan.epoch, False, "not every rank holds this epoch")
            start = time.perf_counter()
            loss = pipe.step(k)
            stage_time = time.perf_counter() - start
            costs = pipe.costs()
            if agent is not None:
                agent.report(k, costs, memory_used_bytes=sum(c.resident_bytes for c in costs))
            summary = torch.tensor([loss, stage_time, float(moved)], dtype=torch.float64,
                                   device=device)
            gathered = [torch.zeros_like(summary) for _ in range(world)]
            dist.all_gather(gathered, summary)
            if rank == 0:
                loss = gathered[-1][0].item()
                record = {"iter": k, "loss": loss, "boundaries": boundaries, "epoch": epoch,
                          "moved_bytes": int(sum(g[2].item() for g in gathered)),
                          "stage_times": [g[1].item() for g in gathered]}
                print(f"gpt_pipeline: iter {k} loss {loss:.6f} boundaries "
                      f"{','.join(map(str, boundaries))} stage_s "
                      + " ".join(f"{t:.4f}" for t in record["stage_times"]), flush=True)
                if log:
                    log.write(json.dumps(record) + "\n")
    finally:
        if log:
            log.close()
        if agent is not None:
            agent.flush(5.0)
            agent.stop()
        dist.barrier()
        if local is not None:
            local.stop()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
