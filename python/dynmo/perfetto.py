"""A training run's log as a timeline Perfetto opens (chrome trace-event JSON).

``dynmo-train --log_json`` and the pipelining adapter's example
(``examples/torch/llama_pipelining.py --log_json``) write one JSON record per
iteration. This turns a window of them into ``{"traceEvents": [...]}`` that
https://ui.perfetto.dev (or chrome://tracing) opens:

- a track "iterations" with one slice per iteration, as long as it took;
- a track per pipeline stage: with per-layer clocks (dynmo-train, and the
  adapter's example since it logs them), one slice per layer for its
  forward and one for its backward, each the layer's measured time summed
  over the iteration's micro-batches, laid end to end from the iteration's
  start (the clocks measured these durations; their interleaving across
  micro-batches is not in the log, so the slices show where a stage's time
  went, not when each micro-batch ran); without them (older adapter logs),
  one slice per stage of its measured time;
- instant events where a plan was applied (the epoch changed: its
  boundaries), where the model changed, and where the adapter's record names
  a plan.

    python -m dynmo.perfetto RUN.jsonl OUT.json [--first K] [--count N]

Pure Python, no torch.
"""
import argparse
import json
import sys
from typing import Any, Dict, List, Sequence

_US = 1e6


def _meta(pid: int, tid: int, name: str, value: Any) -> Dict[str, Any]:
    key = "sort_index" if name == "thread_sort_index" else "name"
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": {key: value}}


def timeline(records: Sequence[Dict[str, Any]], *, title: str = "DynMo run") -> Dict[str, Any]:
    """The chrome trace of ``records`` (iteration records, in order)."""
    if not records:
        raise ValueError("dynmo.perfetto: no iteration records")
    stages = max(len(r.get("boundaries", [0, 0])) - 1 for r in records)
    events: List[Dict[str, Any]] = [_meta(0, 0, "process_name", title),
                                    _meta(0, 0, "thread_name", "iterations"),
                                    _meta(0, 0, "thread_sort_index", 0)]
    for s in range(stages):
        events += [_meta(0, s + 1, "thread_name", f"stage {s}"),
                   _meta(0, s + 1, "thread_sort_index", s + 1)]
    t = 0.0
    last_epoch = records[0].get("epoch")
    for r in records:
        it = r.get("iter", r.get("iteration"))
        dur = float(r.get("iteration_s", 0.0))
        if not dur > 0:
            raise ValueError(f"dynmo.perfetto: iteration {it} has no iteration_s")
        b = r.get("boundaries", [])
        events.append({"ph": "X", "pid": 0, "tid": 0, "name": f"iteration {it}",
                       "ts": t * _US, "dur": dur * _US,
                       "args": {"loss": r.get("loss"), "tokens_per_s": r.get("tokens_per_s"),
                                "boundaries": b, "epoch": r.get("epoch")}})
        fwd, bwd = r.get("layer_forward_s"), r.get("layer_backward_s")
        for s in range(len(b) - 1):
            at = t
            if fwd and bwd:
                layers = list(range(b[s], b[s + 1]))
                for kind, times, order in (("F", fwd, layers), ("B", bwd, layers[::-1])):
                    for layer in order:
                        d = float(times[layer])
                        events.append({"ph": "X", "pid": 0, "tid": s + 1,
                                       "name": f"L{layer} {kind}", "cat": kind,
                                       "ts": at * _US, "dur": d * _US,
                                       "args": {"layer": layer, "iteration": it,
                                                "summed_over_microbatches":
                                                    r.get("microbatches")}})
                        at += d
            elif r.get("stage_times"):
                d = float(r["stage_times"][s])
                events.append({"ph": "X", "pid": 0, "tid": s + 1, "name": f"stage {s}",
                               "ts": at * _US, "dur": d * _US, "args": {"iteration": it}})
        marks = []
        if r.get("epoch") != last_epoch:
            marks.append((f"plan applied (epoch {r.get('epoch')})", {"boundaries": b}))
            last_epoch = r.get("epoch")
        if r.get("model_changed"):
            marks.append(("model changed", {}))
        if r.get("plan"):
            marks.append(("plan", {"plan": r["plan"]}))
        for name, args in marks:
            events.append({"ph": "i", "s": "g", "pid": 0, "tid": 0, "name": name,
                           "ts": t * _US, "args": args})
        t += dur
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def main(argv: Sequence[str] = ()) -> int:
    p = argparse.ArgumentParser(prog="python -m dynmo.perfetto",
                                description="a --log_json run as a Perfetto timeline")
    p.add_argument("log")
    p.add_argument("out")
    p.add_argument("--first", type=int, default=0, help="first iteration record (0-based)")
    p.add_argument("--count", type=int, default=50, help="records in the window (default 50)")
    a = p.parse_args(list(argv) or None)
    if a.first < 0 or a.count < 1:
        print("dynmo.perfetto: --first must be >= 0 and --count >= 1", file=sys.stderr)
        return 2
    try:
        with open(a.log) as f:
            records = [json.loads(line) for line in f if line.strip()]
        trace = timeline(records[a.first:a.first + a.count], title=a.log)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"dynmo.perfetto: {a.log}: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(trace, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
