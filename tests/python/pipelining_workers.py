"""Process bodies for test_pipelining.py: each runs on one Gloo rank
(torch.multiprocessing.spawn) and writes what it saw to a JSON file per rank;
the test compares runs."""
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from conftest import SOURCE_DIR

sys.path.insert(0, os.path.join(SOURCE_DIR, "examples", "torch"))

import llama_model as lm  # noqa: E402
from dynmo.pipelining import DynamicPipeline  # noqa: E402
from dynmo.types import LayerMove, Plan  # noqa: E402


def owners(boundaries, stages):
    return {i: s for k, s in enumerate(stages)
            for i in range(boundaries[k], boundaries[k + 1])}


def make_plan(epoch, old, new, stages=None, active=None, released=(), reshape=None):
    """The plan that turns layout ``old`` (over ``stages``) into ``new``
    (over ``active``), moving every layer whose owner changes."""
    stages = list(stages if stages is not None else range(len(old) - 1))
    active = list(active if active is not None else stages)
    before, after = owners(old, stages), owners(new, active)
    moves = [LayerMove(layer=i, from_stage=before[i], to_stage=after[i], bytes=0, round=0)
             for i in sorted(before) if before[i] != after[i]]
    return Plan(job="t", epoch=epoch, apply_iteration=0, boundaries=list(new),
                active_stages=active, released_stages=list(released), migrations=moves,
                split=[], migration_bytes=0, predicted_bottleneck_s=0.0,
                previous_bottleneck_s=0.0, reason="test", decided_unix_nanos=0,
                commit_with_prepare=False, reshape=reshape)


class LaggingClock:
    """A device clock for the CPU that completes marks as CUDA events do: a
    mark taken in iteration k is done only once iteration k + 1 has begun
    (the device runs behind the host). Reading an undone mark (seconds) or
    waiting for one (wait: a host sync) is recorded as a violation."""

    def __init__(self):
        self.iteration = 0
        self.violations = []

    def mark(self):
        return (self.iteration, time.perf_counter_ns())

    def done(self, mark):
        return mark[0] < self.iteration

    def wait(self, mark):
        self.violations.append(f"wait at iteration {self.iteration}")

    def seconds(self, pairs):
        if any(not self.done(b) for _, b in pairs):
            self.violations.append(f"read of an undone mark at iteration {self.iteration}")
        return [(b[1] - a[1]) * 1e-9 for a, b in pairs]


class BlockingReads:
    """Records every blocking read (item, tolist, cpu, numpy, a CUDA
    synchronize) that DynMo's own code (python/dynmo) makes while on."""

    METHODS = ("item", "tolist", "cpu", "numpy")

    def __init__(self):
        import dynmo
        self.root = os.path.dirname(os.path.abspath(dynmo.__file__)) + os.sep
        self.on = False
        self.sites = []
        for name in self.METHODS:
            setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name), name))
        torch.cuda.synchronize = self._wrap(torch.cuda.synchronize, "synchronize")

    def _wrap(self, inner, name):
        def call(*args, **kwargs):
            if self.on:
                caller = sys._getframe(1)
                path = os.path.abspath(caller.f_code.co_filename)
                if path.startswith(self.root):
                    rel = os.path.relpath(path, os.path.dirname(self.root.rstrip(os.sep)))
                    self.sites.append([rel, caller.f_lineno, name])
            return inner(*args, **kwargs)
        return call


def batch(step, rows, seq, vocab):
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, vocab, (rows, seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def train(rank, world, init_file, out_dir, cfg):
    """cfg: schedule, pp, dp, steps, boundaries, plans {iteration: [old, new,
    stages, active, released]}, optimizer, coordinator, dynamism, bad."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    backend = cfg.get("backend", "gloo")
    if backend == "nccl-double":
        from dynmo import nccl_double
        nccl_double.register()
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    c = lm.LlamaConfig(dim=32, n_layers=cfg.get("layers", 6), n_heads=4, n_kv_heads=2,
                       ffn_hidden=64, seq_len=16)
    model = lm.Transformer(c)
    if cfg.get("tied"):  # tie_word_embeddings: the head is the embedding
        model.output.weight = model.tok_embeddings.weight
    opt_name = cfg.get("optimizer", "adamw")

    def make_optimizer(params):
        if opt_name == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        if opt_name == "adagrad":
            return torch.optim.Adagrad(params, lr=0.05)
        if opt_name == "amsgrad":
            return torch.optim.AdamW(params, lr=3e-3, amsgrad=True)
        return torch.optim.AdamW(params, lr=3e-3)

    def make_scheduler(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1 + 0.1 * k))

    record = {"losses": [], "boundaries": [], "errors": [], "released": False,
              "moved": 0, "plans": [], "blocking": [], "lag": []}
    clock = LaggingClock() if cfg.get("lagging_clock") else None
    reads = BlockingReads() if cfg.get("lagging_clock") else None
    try:
        pipe = DynamicPipeline(
            model, schedule=cfg["schedule"], n_microbatches=cfg.get("microbatches", 4),
            loss_fn=lm.loss_fn, pp=cfg["pp"], dp=cfg.get("dp", 1),
            boundaries=cfg.get("boundaries"), optimizer=make_optimizer,
            lr_scheduler=make_scheduler, coordinator=cfg.get("coordinator"),
            policy=cfg.get("policy"), coordinator_flags=cfg.get("flags", ()),
            speed_probe_every=cfg.get("speed_probe_every", 5),
            job=cfg.get("job", "pipelining-test"),
            data_parallel=cfg.get("data_parallel", "ddp"))
        if clock is not None:
            pipe.meter.timer.clock = clock
    except (TypeError, ValueError) as e:
        record["errors"].append(f"{type(e).__name__}: {e}")
        _write(out_dir, rank, record)
        dist.destroy_process_group()
        return
    plans = {int(k): v for k, v in cfg.get("plans", {}).items()}
    record["layers"] = pipe.layout.num_layers
    epoch = 0
    first = 0
    if cfg.get("resume"):  # a restarted job: the newest complete checkpoint
        from dynmo.pipelining import checkpoint
        first = checkpoint.load(pipe, checkpoint.latest(cfg["resume"])) + 1
        epoch = 100  # plans after a restart are new epochs
    for step in range(first, cfg["steps"]):
        if step in plans:
            epoch += 1
            plan = make_plan(epoch, *plans[step])
            try:
                record["moved"] += pipe.apply_plan(plan)
            except ValueError as e:
                record["errors"].append(str(e))
        if step == cfg.get("kill_coordinator_at") and pipe._link is not None:
            pipe._link.stop_coordinator()  # the coordinator vanishes mid-run
        if clock is not None:
            clock.iteration = step
            reads.on, reads.sites = step >= 2, []  # the steady state: from iteration 2
        applied = pipe.begin_iteration(step)
        if applied is not None:
            record["plans"].append([step, list(applied.boundaries)])
        if pipe.released:
            record["released"] = True
            break
        for layer, mods in pipe.held_layers().items():
            lm.set_dynamism(cfg.get("dynamism", "none"), layer, mods, step, cfg["steps"],
                            c.n_layers)
        x, y = batch(step + 1000 * pipe.topology.dp_rank, 8, c.seq_len, c.vocab)
        losses = []
        if cfg.get("own_step"):  # the user's loop steps the schedule itself
            if pipe.has_first_stage:
                pipe.schedule.step(x, target=y if pipe.has_last_stage else None,
                                   losses=losses)
            elif pipe.has_last_stage:
                pipe.schedule.step(target=y, losses=losses)
            else:
                pipe.schedule.step()
        else:
            pipe.step(x, target=y, losses=losses)
        pipe.optimizer.step()
        pipe.lr_scheduler.step()
        pipe.optimizer.zero_grad(set_to_none=True)
        pipe.end_iteration(step)
        if reads is not None:
            reads.on = False
            if applied is None:  # a plan's iteration may sync (host-sync(event))
                record["blocking"] += reads.sites
            record["lag"].append([step, pipe.meter.measured_iteration])
        record["wgrad_layers"] = sorted(set(record.get("wgrad_layers", []))
                                        | set(pipe.weight_gradient_seconds))
        record["layer_s"] = sorted(pipe.layer_seconds)
        record["exchange_s"] = min(record.get("exchange_s", float("inf")), pipe.last_exchange_s)
        if losses:
            record["losses"].append([step, pipe.topology.dp_rank,
                                     [float(l.detach()) for l in losses]])
        record["boundaries"].append(list(pipe.boundaries))
        if step == cfg.get("save_at"):
            from dynmo.pipelining import checkpoint
            checkpoint.save(pipe, cfg["save_root"], step)
    state = {}
    for layer, mods in sorted(pipe.held_layers().items()):
        # A sharded parameter (FSDP2) is summed whole: gathered over its
        # replicas, which hold the same layers in the same order.
        state[layer] = sum(float(_whole(p).double().sum()) for m in mods for p in m.parameters())
    record["weights"] = state
    if cfg.get("tied"):  # each copy of the tied matrix this rank holds, by bytes
        held = pipe.held_layers()
        copies = []
        if 0 in held:
            copies.append(held[0][0].weight)
        if pipe.layout.num_layers - 1 in held:
            copies.append(held[pipe.layout.num_layers - 1][-1].weight)
        record["tied"] = [hashlib.sha1(t.detach().numpy().tobytes()).hexdigest()
                          for t in copies]
    record["opt_groups"] = len(pipe.optimizer.param_groups)
    if clock is not None:
        record["violations"] = clock.violations
    pipe.close()
    _write(out_dir, rank, record)
    dist.destroy_process_group()


def _whole(p):
    p = p.detach()
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def _write(out_dir, rank, record):
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def sharded_into_plain(rank, world, init_file, out_dir, cfg):
    """Rank 0 migrates an FSDP2-sharded layer to rank 1, which offers a plain
    one: both must refuse it, recoverably, with nothing changed."""
    from torch.distributed.fsdp import fully_shard
    from dynmo.pipelining.fsdp import replica_mesh
    from dynmo.torch.migration import MigrationError, Transfer, migrate
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    groups = [dist.new_group([r]) for r in range(world)]
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    if rank == 0:
        fully_shard(layer, mesh=replica_mesh(groups[0], torch.device("cpu")))
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1) if rank == 0 else None
    record = {"errors": []}
    try:
        migrate([Transfer(1, 0, 1, [layer])], opt, rank=rank, device=torch.device("cpu"))
    except MigrationError as e:
        record["errors"].append([str(e), e.recoverable])
    record["kept"] = rank == 1 or len(opt.param_groups[0]["params"]) == 2
    _write(out_dir, rank, record)
    dist.destroy_process_group()
