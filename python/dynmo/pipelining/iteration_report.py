"""What one rank says after an iteration: its layers' costs, parameters
and memory to the coordinator (``report_costs``, with the speed probe on
its cadence; on a GPU the newest iteration the device has finished, never
a wait) and the job's summary for the log (``gather_summary``: one
all-gather over the CPU control group). Functions over a
``DynamicPipeline``; not thread-safe: the training thread.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from dynmo.torch.memory import device_memory
from dynmo.torch.speed_probe import launch_probe


def report_costs(pipe, iteration: int) -> None:
    """``pipe.end_iteration``: this rank's layers' costs to the coordinator."""
    # The schedule's time outside this rank's layers: its sends, receives
    # and the waits for them (and the schedule's own work), all
    # micro-batches. On CPU the layers' clock is the same wall clock; on
    # a GPU the layers' events and the host's clock do not subtract
    # (kernels run behind the host), so nothing is measured there.
    fresh = pipe.meter.end()
    layers_s = sum(pipe.meter.layer_seconds.values())
    pipe.last_exchange_s = (max(0.0, pipe._step_s - layers_s)
                            if pipe.device.type == "cpu" and pipe._step_s > 0 else 0.0)
    if pipe._link is None or pipe.released:
        return
    # Every few iterations the speed probe, timed like the layers: the
    # coordinator tells a slow rank from heavy layers by it. Often while
    # the rank is watched (its start, a move in its layers' time), seldom
    # otherwise (ProbeCadence). On a GPU it is read once the device has
    # run it, with a later iteration's report.
    held = frozenset(pipe.parts.held)
    changed = pipe._probed_layers is not None and held != pipe._probed_layers
    pipe._probed_layers = held
    if pipe._pending_probe is None and \
            pipe._probe_cadence.should_probe(iteration, layers_s, changed):
        pipe._pending_probe = launch_probe(pipe.device)
    if not fresh:
        return  # the device has not finished a newer iteration yet
    probe_s = pipe._pending_probe.seconds() if pipe._pending_probe is not None else None
    if probe_s is not None:
        pipe._pending_probe = None
    # On a GPU: the reserved peak since the last report plus this rank's
    # share of the context and NCCL, and its share of the device (once
    # per iteration, for every local stage; allocator counters, no wait);
    # (0, 0) on a CPU.
    gpu_used, gpu_capacity = device_memory(pipe.device)
    measured = pipe.meter.measured_iteration
    for stage in pipe._link.agents:
        costs = pipe.meter.costs(pipe._range(stage), pipe.parts.held, pipe.optimizer)
        used = gpu_used if pipe.device.type == "cuda" else pipe.meter.memory_used(costs)
        pipe._link.report(stage, measured, costs, used, probe_s=probe_s or 0.0,
                          memory_capacity_bytes=gpu_capacity,
                          exchange_s=pipe.last_exchange_s,
                          # The newest step's host time: on a GPU the
                          # host keeps pace with the device within
                          # MAX_LAG iterations, so it is the device's
                          # step time in the steady state.
                          iteration_s=pipe._step_s)


def gather_summary(pipe, loss: Optional[float], elapsed_s: float) -> Dict[str, Any]:
    """``pipe.iteration_summary``: one row per rank (loss, time, moved
    bytes, stage and layer seconds), gathered over the CPU control group and
    reduced to the job's (collective over the ranks still in the job)."""
    stages = len(pipe.stage_ids)
    n = pipe.layout.num_layers
    head = 4 + stages
    row = torch.zeros(head + 3 * n, dtype=torch.float64)
    if loss is not None:
        row[0], row[1] = loss, 1.0
    row[2], row[3] = elapsed_s, float(pipe.last_moved_bytes)
    for stage in pipe.local_stage_ids:
        row[4 + pipe._position(stage)] = sum(pipe.layer_seconds.get(i, 0.0)
                                             for i in pipe._range(stage))
    w = pipe.weight_gradient_seconds
    for layer, seconds in pipe.layer_seconds.items():
        if 0 <= layer < n:
            fwd = pipe.meter.forward_seconds.get(layer, 0.0)
            row[head + layer] = fwd
            row[head + n + layer] = seconds - fwd
            row[head + 2 * n + layer] = w.get(layer, 0.0)
    group = pipe.topology.control_group  # CPU: no wait on a GPU
    rows = [torch.zeros_like(row) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, row, group=group)
    table = torch.stack(rows)
    held = table[:, 1] > 0
    slowest = table.max(dim=0).values
    return {"loss": float(table[held, 0].mean()) if bool(held.any()) else float("nan"),
            "iteration_s": float(table[:, 2].max()),
            "moved_bytes": int(table[:, 3].sum()),
            "stage_times": [float(x) for x in slowest[4:head]],
            "layer_forward_s": [float(x) for x in slowest[head:head + n]],
            "layer_backward_s": [float(x) for x in slowest[head + n:head + 2 * n]],
            "layer_weight_grad_s": [float(x) for x in slowest[head + 2 * n:]]}
