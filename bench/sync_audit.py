"""Lists every host sync a CUDA training script makes, by the line that made it.

Runs SCRIPT (e.g. examples/torch/llama_pipelining.py) in this process under
``torch.cuda.set_sync_debug_mode("warn")``, which makes PyTorch warn at each
synchronizing CUDA call (a device-to-host copy, ``item``, ``tolist``,
``nonzero``, ``torch.cuda.synchronize``, ...). Each warning is counted
under three frames of its stack: the innermost of DynMo's own code
(``dynmo/``), the innermost of the script, and the innermost of all (the
line that synced: PyTorch's own when DynMo only called into it). A line
counted about once per iteration is a steady-state sync. DynMo's own
event reads are also checked without a GPU: scripts/host-syncs.py
(tools.HostSyncsScannerTest) and python.Pipelining's steady-state test.

    python bench/sync_audit.py [--json=FILE] SCRIPT [ARGS...]

One rank, no torchrun needed (RANK/WORLD_SIZE/MASTER_* default to a
single-process group). Not a test: it needs a GPU (bench/gpu_overhead.sh
runs it as its section 4).
"""
import collections
import json
import os
import runpy
import sys
import traceback
import warnings


def main(argv):
    out = None
    if argv and argv[0].startswith("--json="):
        out = argv.pop(0).split("=", 1)[1]
    if not argv:
        print("usage: sync_audit.py [--json=FILE] SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = os.path.abspath(argv[0])
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                 ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29511")):
        os.environ.setdefault(k, v)
    import torch
    if not torch.cuda.is_available():
        print("sync_audit: no CUDA device: nothing to audit", file=sys.stderr)
        return 2

    counts = collections.Counter()
    first_stack = {}

    def where(stack, pred):
        for f in reversed(stack):
            if pred(f.filename):
                return f"{os.path.relpath(f.filename)}:{f.lineno} ({f.name})"
        return "-"

    def hook(message, category, filename, lineno, file=None, line=None):
        if "synchronizing CUDA operation" not in str(message):
            return original(message, category, filename, lineno, file, line)
        stack = traceback.extract_stack()[:-1]
        ours = where(stack, lambda p: f"{os.sep}dynmo{os.sep}" in p)
        mine = where(stack, lambda p: p == script)
        at = where(stack, lambda p: True)
        key = (ours, mine, at)
        counts[key] += 1
        first_stack.setdefault(key, "".join(traceback.format_list(stack[-8:])))

    original = warnings.showwarning
    warnings.showwarning = hook
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    sys.argv = argv
    rc = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    print(f"\nhost syncs (torch.cuda sync debug mode), {sum(counts.values())} in all:")
    print(f"  {'count':>6}  {'DynMo frame':<58} {'script frame':<48} innermost frame")
    rows = []
    for key, n in counts.most_common():
        ours, mine, at = key
        print(f"  {n:>6}  {ours:<58} {mine:<48} {at}")
        rows.append({"count": n, "dynmo": ours, "script": mine, "innermost": at,
                     "stack": first_stack[key]})
    ours_total = sum(n for (o, _, _), n in counts.items() if o != "-")
    print(f"  under DynMo's code: {ours_total} sync(s) at "
          f"{len({o for (o, _, _) in counts if o != '-'})} line(s)")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
