"""One rank of a 2-rank dynmo.pipelining job (CPU, Gloo) that moves layers
every few iterations, saves a checkpoint every few, resumes from the
newest complete one, and may be told to SIGKILL itself at a chosen point;
kill_restart.py starts it by hand (env:// rendezvous from RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT, as Slurm's srun does).

    python kill_restart_worker.py CONFIG_JSON

CONFIG_JSON: root (checkpoints), out (this rank writes out/rank<r>.jsonl),
steps, save_every, plan_every, splits (the split each plan moves to, by
plan number), initial (the first launch's split), boundaries (a resume's
split; default: the checkpoint's), timeout_s (every bounded wait), and
kill (optional): {rank, iteration, where, call}, where one of

    boundary        at the start of the iteration
    forward         at the call-th forward of a held layer in it
    migration       at the call-th batched send/recv of its plan
    save_begin      on entering torch.distributed.checkpoint's save
    save_written    after this rank's DCP write, before the sidecar
    save_sidecar    (rank 0) after the sidecar, before the rename

Each line of the output is one event, flushed at once so a killed rank
leaves every line it reached: {"loaded": path|null, "split": [...],
"first": k}, {"it": k, "losses": [...]} per iteration (the last stage),
{"saved": path}, and {"weights": {layer: sum}} at the end.
"""
import datetime
import json
import os
import signal
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pipelining_workers as w  # noqa: E402
import dynmo.torch.migration as migration  # noqa: E402
from dynmo.pipelining import DynamicPipeline, checkpoint  # noqa: E402

def die():
    os.kill(os.getpid(), signal.SIGKILL)


class Killer:
    """Arms the chosen kill point of this rank (a no-op on the others)."""

    def __init__(self, kill, rank):
        self.kill = kill if kill and kill["rank"] == rank else None
        self.armed = False
        self.calls = 0
        self.hooked = set()

    def at(self, points, iteration):
        """Arms the chosen point when it is one of ``points`` at ``iteration``."""
        k = self.kill
        self.armed = k is not None and k["where"] in points and k["iteration"] == iteration
        self.calls = 0
        if self.armed and k["where"] == "boundary":
            die()

    def tick(self, where):
        if self.armed and self.kill["where"] == where:
            self.calls += 1
            if self.calls >= self.kill.get("call", 1):
                die()

    def install(self, pipe):
        inner_batch = migration.dist.batch_isend_irecv

        def batch(ops):
            self.tick("migration")
            return inner_batch(ops)

        migration.dist.batch_isend_irecv = batch
        inner_save = checkpoint.dcp.save

        def save(*args, **kwargs):
            self.tick("save_begin")
            out = inner_save(*args, **kwargs)
            self.tick("save_written")
            return out

        checkpoint.dcp.save = save
        inner_sidecar = checkpoint._write_durably

        def sidecar(*args):
            inner_sidecar(*args)
            self.tick("save_sidecar")

        checkpoint._write_durably = sidecar
        self.hook_layers(pipe)

    def hook_layers(self, pipe):
        """A forward pre-hook on every held layer's first module (again
        after a plan: received layers are new modules)."""
        for mods in pipe.held_layers().values():
            if id(mods[0]) not in self.hooked:
                self.hooked.add(id(mods[0]))
                mods[0].register_forward_pre_hook(lambda m, a: self.tick("forward"))


def main():
    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    timeout = datetime.timedelta(seconds=cfg["timeout_s"])
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    out = open(os.path.join(cfg["out"], f"rank{rank}.jsonl"), "a", buffering=1)

    def emit(**record):
        out.write(json.dumps(record) + "\n")
        out.flush()
        os.fsync(out.fileno())

    torch.manual_seed(0)
    c = w.lm.LlamaConfig(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=64,
                         seq_len=16)
    path = checkpoint.latest(cfg["root"])
    split = cfg.get("boundaries") or (checkpoint.saved_split(path) if path else cfg["initial"])
    pipe = DynamicPipeline(
        w.lm.Transformer(c), schedule="1F1B", n_microbatches=2, loss_fn=w.lm.loss_fn, pp=2,
        boundaries=split, optimizer=lambda ps: torch.optim.AdamW(ps, lr=3e-3),
        lr_scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1 / (1 + 0.1 * k)),
        migration_timeout_s=cfg["timeout_s"])
    first = checkpoint.load(pipe, path) + 1 if path else 0
    emit(loaded=path, split=list(pipe.boundaries), first=first)
    killer = Killer(cfg.get("kill"), rank)
    killer.install(pipe)
    splits = cfg["splits"]
    for step in range(first, cfg["steps"]):
        killer.at(("boundary",), step)
        if step > 0 and step % cfg["plan_every"] == 0:
            target = splits[(step // cfg["plan_every"]) % len(splits)]
            if target != pipe.boundaries:
                killer.at(("migration",), step)
                # The epoch names the plan's messages: one per plan iteration,
                # the same in every launch.
                pipe.apply_plan(w.make_plan(step, pipe.boundaries, target))
                killer.hook_layers(pipe)
        killer.at(("forward",), step)
        x, y = w.batch(step, 4, c.seq_len, c.vocab)
        losses = []
        pipe.step(x, target=y, losses=losses)
        pipe.optimizer.step()
        pipe.lr_scheduler.step()
        pipe.optimizer.zero_grad(set_to_none=True)
        if losses:
            emit(it=step, losses=[float(l.detach()) for l in losses])
        if (step + 1) % cfg["save_every"] == 0:
            killer.at(("save_begin", "save_written", "save_sidecar"), step)
            emit(saved=checkpoint.save(pipe, cfg["root"], step))
    emit(weights={layer: sum(float(p.detach().double().sum()) for m in mods
                             for p in m.parameters())
                  for layer, mods in pipe.held_layers().items()})
    pipe.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
