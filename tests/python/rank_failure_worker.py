"""One rank of a 2-rank dynmo.pipelining job in which rank FAILING raises
at POINT; test_rank_failure.py starts it by hand (env:// rendezvous from
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, as Slurm's srun does) or
under torchrun.

    python rank_failure_worker.py POINT FAILING [COORDINATOR]

POINT: construction (the optimizer factory raises), coordinator (the
embedded coordinator refuses its flags on rank 0 while rank 1 waits for
its port), forward (a block's forward), backward (a weight's gradient
hook), migration (a migration's exchange), logging (the reporter's log
write: /dev/full), job (every rank: a job name the coordinator refuses),
kill (SIGKILL, as the OOM killer sends). The failure comes in iteration 1, after one whole
iteration. The loop is the example's: the error goes to
``pipe.close(error=e)`` and its line to stderr, exit status 1; the peer is
ended by its watcher (``dynmo.pipelining.failure``). "injecting <unix
time>" on stdout marks the moment of the failure.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pipelining_workers as w  # noqa: E402
from dynmo.pipelining import DynamicPipeline  # noqa: E402
from dynmo.pipelining.failure import one_line  # noqa: E402
import dynmo.torch.migration as migration  # noqa: E402


def injected(point):
    print(f"injecting {time.time()}", flush=True)
    return RuntimeError(f"injected at {point}")


def fail_in_forward(pipe, point):
    def hook(*_):
        raise injected(point)
    layer = min(pipe.held_layers())
    pipe.held_layers()[layer][0].register_forward_pre_hook(hook)


def fail_in_backward(pipe, point):
    def hook(grad):
        raise injected(point)
    layer = min(pipe.held_layers())
    next(p for m in pipe.held_layers()[layer] for p in m.parameters()).register_hook(hook)


def fail_in_migration(point):
    def batch(ops):
        raise injected(point)
    migration.dist.batch_isend_irecv = batch


def build(point, failing, rank, coordinator):
    torch.manual_seed(0)
    c = w.lm.LlamaConfig(dim=32, n_layers=6, n_heads=4, n_kv_heads=2, ffn_hidden=64,
                         seq_len=16)

    def optimizer(params):
        if point == "construction" and rank == failing:
            raise injected(point)
        return torch.optim.AdamW(params, lr=1e-3)

    flags = ["--no_such_flag=1"] if point == "coordinator" else []
    if point == "coordinator":
        print(f"injecting {time.time()}", flush=True)
    if point == "job":
        print(f"injecting {time.time()}", flush=True)
    return DynamicPipeline(w.lm.Transformer(c), schedule="1F1B", n_microbatches=2,
                           loss_fn=w.lm.loss_fn, pp=2, optimizer=optimizer,
                           job="bad/name" if point == "job" else "rank-failure",
                           coordinator=coordinator, coordinator_flags=flags,
                           policy={"trigger": "manual"} if coordinator else None,
                           migration_timeout_s=60), c


def main():
    point, failing = sys.argv[1], int(sys.argv[2])
    coordinator = sys.argv[3] if len(sys.argv) > 3 else None
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        pipe, c = build(point, failing, rank, coordinator)
    except Exception as e:
        print(f"rank_failure_worker: rank {rank} failed: {one_line(e)}", file=sys.stderr,
              flush=True)
        return 1
    try:
        for step in range(3):
            if step == 1 and rank == failing:
                if point == "forward":
                    fail_in_forward(pipe, point)
                elif point == "backward":
                    fail_in_backward(pipe, point)
                elif point == "migration":
                    fail_in_migration(point)
                elif point == "kill":
                    print(f"injecting {time.time()}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            if step == 1 and point == "migration":
                pipe.apply_plan(w.make_plan(1, pipe.boundaries, [0, 2, 8]))
            pipe.begin_iteration(step)
            x, y = w.batch(step, 4, c.seq_len, c.vocab)
            pipe.step(x, target=y)
            pipe.optimizer.step()
            pipe.optimizer.zero_grad()
            pipe.end_iteration(step)
            if step == 1 and point == "logging" and rank == failing:
                with open("/dev/full", "w") as log:
                    print(f"injecting {time.time()}", flush=True)
                    log.write("iteration 1\n")
    except Exception as e:
        print(f"rank_failure_worker: {pipe.close(error=e)}", file=sys.stderr, flush=True)
        return 1
    pipe.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
