#!/usr/bin/env python3
"""Lists every place DynMo's own code makes the host wait for the device.

A host sync stalls the CPU until the GPU has caught up, so in the steady
state of an iteration each one costs the pipeline its overlap. The script
scans trainer/ (*.cc, *.h) and python/dynmo/ (*.py) for every blocking
pattern:

    synchronize   torch.cuda / Event / Stream .synchronize(), c10's
                  SynchronizeDevice / synchronizeDevice, cuda*Synchronize
    item          .item(), .item<T>()
    tolist        .tolist()
    cpu           .cpu()
    numpy         .numpy()
    to cpu        .to("cpu"), .to(torch.device("cpu")), .to(torch::kCPU), ...
    blocking copy non_blocking=False, /*non_blocking=*/false
    masked_select masked_select(...)        (its size is data-dependent)
    nonzero       nonzero(...)              (likewise)
    elapsed time  elapsed_time(), elapsedTime() (waits for both events)
    world collective  the trainer's Transport::AllReduceSumWorld /
                  AllGatherWorld: they carry host values, which NCCL stages
                  through the device and copies back, blocking

(Event.query() never waits, so it is not one.) Every site must carry a
comment on its line or above it, at most three code lines away (comment
lines are free and continue the reason), `//` in C++ and `#` in Python:

    host-sync(steady): <runs every steady-state iteration: why, and its
                        measured cost ("cost: ...")>
    host-sync(event): <the event it happens at: a plan, a pruning step, a
                       probe, once at start>
    host-sync(cpu): <the tensor is always on the CPU>
    host-sync(model): <the dynamic model's own arithmetic (trainer/model/):
                       a data-dependent shape that a run of the same model
                       without DynMo waits for alike>

It prints every site as file:line: pattern: reason, grouped by kind under
a summary line per kind, and exits 1 when a site has no such comment (a
new sync must say why it is there), or when a "model" site lies outside
trainer/model/ (DynMo's own code cannot call its waits the model's).

    python3 scripts/host-syncs.py [ROOT] [--steady]

--steady prints only the steady-state entries (and still fails on an
unexplained one).
"""
import argparse
import io
import os
import re
import sys
import tokenize

PATTERNS = [
    (re.compile(r"(?i)synchroni[sz]e\w*\s*\("), "synchronize"),
    (re.compile(r"\.item\s*(<[^>]*>\s*)?\("), "item"),
    (re.compile(r"\.tolist\s*\("), "tolist"),
    (re.compile(r"\.cpu\s*\("), "cpu"),
    (re.compile(r"\.numpy\s*\("), "numpy"),
    (re.compile(r"(\.|->)to\(\s*(device\s*=\s*)?(['\"]cpu['\"]|torch\.device\(\s*['\"]cpu['\"]"
                r"|(torch|at|c10)::(Device\(\s*(torch|at|c10)::)?kCPU\b)"), "to cpu"),
    (re.compile(r"non_blocking\s*=\s*(\*/\s*)?(false|False)\b"), "blocking copy"),
    (re.compile(r"\bmasked_select\s*\("), "masked_select"),
    (re.compile(r"\bnonzero\s*\("), "nonzero"),
    (re.compile(r"\belapsed_?[tT]ime\s*\("), "elapsed time"),
    (re.compile(r"\bAll(ReduceSum|Gather)World\s*\("), "world collective"),
]
NOTE = re.compile(r"host-sync\((steady|event|cpu|model)\):\s*(\S.*)")
KINDS = ("steady", "model", "event", "cpu")
# Where the dynamic models' own arithmetic lives: the only place a "model" site may be.
MODEL_TREE = "trainer/model/"
TREES = (("trainer", (".cc", ".h"), "//"), (os.path.join("python", "dynmo"), (".py",), "#"))
# Where a pattern is defined, not called.
DEFINITIONS = {
    "trainer/comm/device.h": {"synchronize"},
    "trainer/comm/device.cc": {"synchronize"},
    "trainer/comm/transport.h": {"world collective"},
    "trainer/comm/process_group_transport.cc": {"world collective"},
}


def code_of_python(text):
    """Each line with its comments and triple-quoted strings blanked out."""
    lines = text.split("\n")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return [line.split("#", 1)[0] for line in lines]
    chars = [list(line) for line in lines]
    for tok in tokens:
        if tok.type == tokenize.COMMENT or (
                tok.type == tokenize.STRING and tok.string.lstrip("rbuRBUfF")[:3] in ('"""', "'''")):
            (r0, c0), (r1, c1) = tok.start, tok.end
            for r in range(r0 - 1, r1):
                lo = c0 if r == r0 - 1 else 0
                hi = c1 if r == r1 - 1 else len(chars[r])
                chars[r][lo:hi] = " " * (hi - lo)
    return ["".join(c) for c in chars]


def scan_file(path, rel, comment):
    """(sites, missing) of one file: sites as (kind, rel, line, pattern, reason)."""
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    code = code_of_python(text) if comment == "#" else [l.split("//", 1)[0] for l in lines]
    defined_here = DEFINITIONS.get(rel.replace(os.sep, "/"), set())
    sites, missing = [], []
    for i, line in enumerate(code):
        for pattern, what in PATTERNS:
            if what in defined_here or not pattern.search(line):
                continue
            note = None
            code_lines = 0  # code lines passed going up (comment lines are free)
            for j in range(i, -1, -1):
                note = NOTE.search(lines[j])
                if note:
                    break
                if j < i and not lines[j].lstrip().startswith(comment):
                    code_lines += 1
                    if code_lines > 3:
                        break
            if note is None:
                missing.append((rel, i + 1, what))
                continue
            why = note.group(2).strip()
            for k in range(j + 1, i):  # the comment's continuation lines
                more = lines[k].strip()
                if not more.startswith(comment):
                    break
                why += " " + more.lstrip(comment).strip()
            sites.append((note.group(1), rel, i + 1, what, why))
    return sites, missing


def scan(root):
    sites, missing = [], []
    for tree, suffixes, comment in TREES:
        for dirpath, dirnames, files in os.walk(os.path.join(root, tree)):
            dirnames.sort()
            for name in sorted(files):
                if name.endswith(suffixes):
                    path = os.path.join(dirpath, name)
                    more, lacking = scan_file(path, os.path.relpath(path, root), comment)
                    sites += more
                    missing += lacking
    return sites, missing


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--steady", action="store_true", help="print only the steady entries")
    args = parser.parse_args(argv)
    sites, missing = scan(args.root)
    misplaced = [s for s in sites
                 if s[0] == "model" and not s[1].replace(os.sep, "/").startswith(MODEL_TREE)]
    for kind in ("steady",) if args.steady else KINDS:
        mine = [s for s in sites if s[0] == kind]
        note = ""
        if kind == "steady":
            uncosted = sum(1 for s in mine if "cost" not in s[4])
            note = f" ({uncosted} without a stated cost)" if uncosted else ""
        elif kind == "model":
            note = " (the dynamic models' own arithmetic: a run without DynMo waits alike)"
        print(f"host syncs ({kind}): {len(mine)}{note}")
        for _, rel, line, what, why in mine:
            print(f"  {rel}:{line}: {what}: {why}")
    if missing:
        print(f"host syncs (unexplained): {len(missing)}")
        for rel, line, what in missing:
            print(f"  {rel}:{line}: {what}: no host-sync(kind): reason comment")
        print(f"host-syncs: {len(missing)} host syncs without a host-sync(kind): reason comment",
              file=sys.stderr)
    for _, rel, line, what, _ in misplaced:
        print(f"host-syncs: {rel}:{line}: {what}: host-sync(model) outside {MODEL_TREE}",
              file=sys.stderr)
    return 1 if missing or misplaced else 0


if __name__ == "__main__":
    sys.exit(main())
