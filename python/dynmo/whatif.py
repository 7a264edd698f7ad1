"""What DynMo would give my job: a recorded run replayed at another scale.

``dynmo-train --log_json RUN.jsonl`` records every iteration's per-layer
forward, backward and weight-gradient seconds (summed over the iteration's
micro-batches) and each layer's resident bytes. This turns those records
into a trace (one record per iteration: per micro-batch times and bytes, the
format ``dynmo-sim --trace`` reads), optionally repeated or scaled to another
depth (``layers``: the recorded layers resampled by depth, keeping the first
and last) and replays it on ``stages`` stages x ``dp`` replicas through the
coordinator's own job machine, static against DynMo (``dynmo.replay``).

    python -m dynmo.whatif RUN.jsonl --stages 24 --layers 48 [--dp 30]
        [--elastic none|release|reshape] [--bandwidth 25e9] [--trace-out T.jsonl]

prints the replay's summary (speed-up, GPU-hours, plans). Both dynmo-train's
log and the pipelining adapter's example's (``examples/torch/
llama_pipelining.py --log_json``) carry per-layer times; a log without them
is refused with one line.
"""
import argparse
import json
import sys
from typing import Any, Dict, Iterable, List


def trace_from_log(records: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The trace records of a --log_json run (per micro-batch seconds)."""
    trace = []
    for r in records:
        fwd = r.get("layer_forward_s")
        bwd = r.get("layer_backward_s")
        if not fwd or not bwd:
            raise ValueError(f"iteration {r.get('iter', r.get('iteration'))} has no per-layer "
                             f"times (layer_forward_s / layer_backward_s): record the run "
                             f"with dynmo-train --log_json or the pipelining example's "
                             f"--log_json")
        m = float(r.get("microbatches") or 1)
        wgrad = r.get("layer_weight_grad_s") or [0.0] * len(fwd)
        mem = r.get("layer_memory_bytes") or [0] * len(fwd)
        layers = []
        for l in range(len(fwd)):
            # backward_s holds input and weight gradient; the trace splits them.
            w = float(wgrad[l])
            layers.append({"fwd": float(fwd[l]) / m, "bwd": max(0.0, float(bwd[l]) - w) / m,
                           "wgrad": w / m, "mem_bytes": int(mem[l])})
        trace.append({"iter": int(r.get("iter", r.get("iteration"))), "layers": layers})
    if not trace:
        raise ValueError("no iteration records")
    return trace


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m dynmo.whatif",
                                description="a recorded run replayed at another scale")
    p.add_argument("log")
    p.add_argument("--stages", type=int, required=True)
    p.add_argument("--layers", type=int)
    p.add_argument("--dp", type=int)
    p.add_argument("--elastic")
    p.add_argument("--bandwidth", type=float)
    p.add_argument("--trigger")
    p.add_argument("--trace-out", help="also write the converted trace here")
    a = p.parse_args(argv)
    try:
        with open(a.log) as f:
            trace = trace_from_log(json.loads(line) for line in f if line.strip())
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"dynmo.whatif: {a.log}: {e}", file=sys.stderr)
        return 2
    if a.trace_out:
        with open(a.trace_out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in trace)
    import dynmo  # the native module: only once the log is known to be good
    try:
        summary = dynmo.replay(trace=trace, stages=a.stages, layers=a.layers, dp=a.dp,
                               elastic=a.elastic, bandwidth=a.bandwidth, trigger=a.trigger,
                               oracle=True)
    except Exception as e:  # the native module's one-line errors
        print(f"dynmo.whatif: {e}", file=sys.stderr)
        return 2
    summary["source"] = f"log:{a.log}"
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
