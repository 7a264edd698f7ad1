"""How fast ``dynmo.torch.migration.migrate`` moves one layer between two
ranks, next to a plain send of the same bytes over the same backend; and,
in one process, the copies a device can make of those bytes (the ceilings
a migration on that device is measured against).

    # two ranks: the migration path (NCCL on two GPUs; Gloo on the CPU)
    torchrun --standalone --nproc-per-node 2 bench/migration_bandwidth.py \
        --backend nccl --device cuda [--dim 2048] [--reps 5] [--json FILE]
    # one process: device-to-device, device-to-host and host-to-device copies
    python bench/migration_bandwidth.py --copy --device cuda [--dim 2048]

The layer is a Llama block's tensors (torchtitan's names: attention wq, wk,
wv, wo with grouped-query K/V at a quarter of ``--dim``; SwiGLU w1, w2, w3
of ``dim * 11 // 4``; two RMSNorm weights) with AdamW's state after one
step: at ``--dim 2048``, 45 M parameters, 541 MB moved (parameters, exp_avg,
exp_avg_sq; the step travels in the header).

Two ranks pass the layer back and forth: each repetition is one call of
``migrate`` by both ranks (headers, one ``batch_isend_irecv``, the group's
confirmation, the optimizer hand-over), timed from a barrier to both ranks
holding the result (CUDA synchronised), the slower rank's time; then a
plain ``isend``/``irecv`` of one uint8 tensor of the same byte count, timed
alike. The first repetition of each (communicator set-up) is left out;
figures are medians. GB/s is 10^9 bytes per second, bytes moved one way.

What cannot run is refused with one line and exit status 2:
- Gloo with CUDA tensors: Gloo's send/recv hand the tensor's pointer to
  its TCP transport, which reads host memory; DynMo's Python path sends a
  layer on its own device, so a CUDA layer needs NCCL;
- NCCL with two ranks on one GPU: NCCL refuses a second rank on a device.
On a single GPU the copies of ``--copy`` are what can be measured.

Each measurement prints one line and, with ``--json FILE``, appends one
JSON object to FILE (rank 0 only).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

REFUSED = 2


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto", help="auto (nccl on cuda, gloo on cpu) | gloo | nccl")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--dim", type=int, default=2048, help="the block's model dimension")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (after one warm-up)")
    p.add_argument("--copy", action="store_true",
                   help="one process: the device's own copies of the layer's bytes")
    p.add_argument("--json", default=None, help="append one JSON object per measurement")
    p.add_argument("--timeout_s", type=float, default=120.0, help="bound on every migration wait")
    return p.parse_args(argv)


def llama_block(dim: int, device: torch.device) -> nn.Module:
    """A Llama block's parameters in torchtitan's names (no forward: only its
    tensors travel)."""
    kv, ffn = dim // 4, dim * 11 // 4
    with device:  # built where it lives (on "meta", nothing is allocated)
        block = nn.Module()
        block.attention = nn.ModuleDict({
            "wq": nn.Linear(dim, dim, bias=False), "wk": nn.Linear(dim, kv, bias=False),
            "wv": nn.Linear(dim, kv, bias=False), "wo": nn.Linear(dim, dim, bias=False)})
        block.feed_forward = nn.ModuleDict({
            "w1": nn.Linear(dim, ffn, bias=False), "w2": nn.Linear(ffn, dim, bias=False),
            "w3": nn.Linear(dim, ffn, bias=False)})
        block.attention_norm = nn.Module()
        block.attention_norm.weight = nn.Parameter(torch.ones(dim))
        block.ffn_norm = nn.Module()
        block.ffn_norm.weight = nn.Parameter(torch.ones(dim))
    return block


def payload_bytes(dim: int) -> int:
    """Parameters plus AdamW's two moments, in bytes (float32)."""
    params = sum(p.numel() for p in llama_block(dim, torch.device("meta")).parameters())
    return 3 * 4 * params


def resolve(args: argparse.Namespace) -> tuple:
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    return torch.device(device), backend


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(args, record: Dict) -> None:
    gbps = record["bytes"] / record["median_s"] / 1e9 if record["median_s"] > 0 else 0.0
    record["gb_per_s"] = gbps
    runs = " ".join(f"{s * 1e3:.1f}" for s in record["seconds"])
    print(f"{record['what']:<28} {record['backend']:<6} {record['device']:<5} "
          f"{record['bytes'] / 1e6:9.1f} MB  median {record['median_s'] * 1e3:9.2f} ms  "
          f"{gbps:7.2f} GB/s  (ms: {runs})", flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")


def time_copies(args, device: torch.device) -> int:
    """One process: the layer's byte count copied device to device and
    through the host (pinned), each timed over --reps after a warm-up."""
    n = payload_bytes(args.dim)
    copies: List[tuple] = []
    if device.type == "cuda":
        a = torch.empty(n, dtype=torch.uint8, device=device)
        b = torch.empty_like(a)
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        copies = [("copy device->device", lambda: b.copy_(a)),
                  ("copy device->host (pinned)", lambda: host.copy_(a)),
                  ("copy host->device (pinned)", lambda: a.copy_(host))]
    else:
        a = torch.empty(n, dtype=torch.uint8)
        b = torch.empty_like(a)
        copies = [("copy host->host", lambda: b.copy_(a))]
    for what, copy in copies:
        seconds = []
        for rep in range(args.reps + 1):
            sync(device)
            t0 = time.perf_counter()
            copy()
            sync(device)
            if rep:
                seconds.append(time.perf_counter() - t0)
        report(args, {"what": what, "backend": "-", "device": device.type, "bytes": n,
                      "world": 1, "seconds": seconds, "median_s": statistics.median(seconds)})
    return 0


def time_migrations(args, device: torch.device, backend: str) -> int:
    """Two ranks pass one layer back and forth with ``migrate``, and a plain
    tensor of the same bytes with isend/irecv."""
    import torch.distributed as dist
    from dynmo.torch.migration import Transfer, migrate

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    refusal = None
    if world != 2:
        refusal = f"needs 2 ranks (torchrun --nproc-per-node 2), has {world}"
    elif backend == "gloo" and device.type == "cuda":
        refusal = ("Gloo sends from host memory: a CUDA layer migrates over NCCL "
                   "(or measure the host path with --device cpu)")
    elif backend == "nccl" and torch.cuda.device_count() < world:
        refusal = (f"NCCL refuses two ranks on one GPU ({torch.cuda.device_count()} "
                   f"visible); the copies of --copy are what one GPU can measure")
    if refusal:
        if rank == 0:
            print(f"migration_bandwidth: refused: {refusal}", flush=True)
        return REFUSED
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    torch.manual_seed(0)
    layer = llama_block(args.dim, device)
    optimizer = torch.optim.AdamW(
        [nn.Parameter(torch.zeros(1, device=device))], lr=1e-3)  # a group to join
    if rank == 0:
        optimizer.add_param_group({"params": list(layer.parameters())})
        for p in layer.parameters():
            p.grad = torch.full_like(p, 1e-3)
        optimizer.step()  # AdamW's state now exists and travels with the layer
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.add_param_group({"params": []})
    n = payload_bytes(args.dim)
    plain = torch.empty(n, dtype=torch.uint8, device=device)

    def timed(step: Callable[[int, int], int]) -> Callable[[int], tuple]:
        def run(rep: int) -> tuple:
            src = rep % 2  # the layer goes 0 -> 1, then back
            dist.barrier()
            sync(device)
            t0 = time.perf_counter()
            moved = step(src, rep)
            sync(device)
            dt = torch.tensor([time.perf_counter() - t0, float(moved)], dtype=torch.float64,
                              device=device if backend == "nccl" else "cpu")
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            # host-sync(cpu): a benchmark's own reading, after the timed region.
            return dt[0].item(), int(dt[1].item())
        return run

    def migrate_once(src: int, rep: int) -> int:
        moved = migrate([Transfer(0, src, 1 - src, [layer])], optimizer, rank=rank,
                        device=device, epoch=rep + 1, timeout_s=args.timeout_s)
        return moved.bytes

    def send_once(src: int, rep: int) -> int:
        op = dist.isend if rank == src else dist.irecv
        for w in dist.batch_isend_irecv([dist.P2POp(op, plain, 1 - rank)]):
            w.wait()
        return n

    runs = {"migrate (dynmo.torch)": timed(migrate_once),
            "plain send (one tensor)": timed(send_once)}
    seconds: Dict[str, List[float]] = {k: [] for k in runs}
    moved: Dict[str, int] = {}
    for rep in range(args.reps + 1):  # alternated; repetition 0 is the warm-up
        for what, run in runs.items():
            s, b = run(rep)
            if rep:
                seconds[what].append(s)
                moved[what] = b
    if rank == 0:
        for what in runs:
            report(args, {"what": what, "backend": backend, "device": device.type,
                          "bytes": moved[what], "world": world, "seconds": seconds[what],
                          "median_s": statistics.median(seconds[what])})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    device, backend = resolve(args)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("migration_bandwidth: refused: --device cuda but no GPU is visible", flush=True)
        return REFUSED
    if args.copy:
        return time_copies(args, device)
    return time_migrations(args, device, backend)


if __name__ == "__main__":
    sys.exit(main())
