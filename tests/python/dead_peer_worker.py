"""One rank of a 2-rank dynmo.pipelining job whose rank 1 dies (or falls
silent) in the middle of a migration; test_dead_peer.py starts it by hand
(env:// rendezvous from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, as
Slurm's srun does) or under torchrun.

    python dead_peer_worker.py die|hang TIMEOUT_S

Rank 1 leaves at its first data round of the migration (after the
headers): ``die`` exits with status 9, ``hang`` sleeps. Rank 0 must raise
``MigrationError`` within TIMEOUT_S and exit 3 with that one line on
stderr."""
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pipelining_workers as w  # noqa: E402
from dynmo.pipelining import DynamicPipeline, MigrationError  # noqa: E402
import dynmo.torch.migration as migration  # noqa: E402


def leave_at_the_data_round(mode):
    inner = migration.dist.batch_isend_irecv
    calls = []

    def batch(ops):
        calls.append(len(ops))
        if len(calls) == 3:  # header sizes, headers, then the layers' tensors
            if mode == "die":
                os._exit(9)
            time.sleep(600)
        return inner(ops)

    migration.dist.batch_isend_irecv = batch


def main():
    mode, timeout_s = sys.argv[1], float(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    c = w.lm.LlamaConfig(dim=32, n_layers=6, n_heads=4, n_kv_heads=2, ffn_hidden=64,
                         seq_len=16)
    pipe = DynamicPipeline(w.lm.Transformer(c), schedule="1F1B", n_microbatches=2,
                           loss_fn=w.lm.loss_fn, pp=2,
                           optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                           migration_timeout_s=timeout_s)
    x, y = w.batch(0, 4, c.seq_len, c.vocab)
    pipe.step(x, target=y)
    pipe.optimizer.step()
    pipe.optimizer.zero_grad()
    if rank == 1:
        leave_at_the_data_round(mode)
    try:
        pipe.apply_plan(w.make_plan(1, pipe.boundaries, [0, 2, 8]))
    except MigrationError as e:
        print(e, file=sys.stderr, flush=True)
        os._exit(3)  # the peer is gone: no collective teardown to wait for
    print("the migration completed without its peer", file=sys.stderr, flush=True)
    os._exit(4)


if __name__ == "__main__":
    main()
