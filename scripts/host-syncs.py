#!/usr/bin/env python3
"""Lists every place the trainer makes the host wait for the device.

A host sync (`.item()`, `nonzero()`, `.cpu()`, a blocking copy, an explicit
device synchronize) stalls the CPU until the GPU has caught up, so in the
steady state of an iteration each one costs the pipeline its overlap. Every
such call in trainer/ must carry a comment on its line or above it, at
most three lines of code away:

    // host-sync(steady): <why it cannot be avoided, per what>
    // host-sync(event): <the event it happens at: a pruning step, a plan...>
    // host-sync(cpu): <the tensor is always on the CPU>

The script prints every site with its kind and reason and exits 1 when one
has no such comment (a new sync must say why it is there).

    python3 scripts/host-syncs.py [ROOT]
"""
import os
import re
import sys

PATTERNS = [
    (re.compile(r"\.item\s*<|\.item\s*\(\)"), "item"),
    (re.compile(r"\bnonzero\s*\("), "nonzero"),
    (re.compile(r"\.cpu\s*\(\)"), "cpu"),
    (re.compile(r"non_blocking\s*=\s*\*/\s*false"), "blocking copy"),
    (re.compile(r"\bSynchronizeDevice\s*\(|synchronizeDevice\s*\("), "synchronize"),
]
NOTE = re.compile(r"host-sync\((steady|event|cpu)\):\s*(\S.*)")
SKIP = ("trainer/comm/device.h", "trainer/comm/device.cc")  # the definitions


def scan(root):
    sites, missing = [], []
    for dirpath, _, files in os.walk(os.path.join(root, "trainer")):
        for name in sorted(files):
            if not name.endswith((".cc", ".h")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel in SKIP:
                continue
            lines = open(path, encoding="utf-8").read().split("\n")
            for i, line in enumerate(lines):
                code = line.split("//", 1)[0]
                for pattern, what in PATTERNS:
                    if not pattern.search(code):
                        continue
                    note = None
                    code_lines = 0  # code lines passed going up (comments are free)
                    for j in range(i, -1, -1):
                        m = NOTE.search(lines[j])
                        if m:
                            note = m
                            break
                        if j < i and not lines[j].lstrip().startswith("//"):
                            code_lines += 1
                            if code_lines > 3:
                                break
                    if note is None:
                        missing.append(f"{rel}:{i + 1}: {what} without a host-sync(...) comment")
                    else:
                        why = note.group(2).strip()
                        for k in range(j + 1, i):  # the comment's continuation lines
                            more = lines[k].strip()
                            if not more.startswith("//"):
                                break
                            why += " " + more.lstrip("/").strip()
                        sites.append((note.group(1), rel, i + 1, what, why))
    return sites, missing


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    sites, missing = scan(root)
    for kind in ("steady", "event", "cpu"):
        mine = [s for s in sites if s[0] == kind]
        print(f"host syncs ({kind}): {len(mine)}")
        for _, rel, line, what, why in mine:
            print(f"  {rel}:{line}: {what}: {why}")
    if missing:
        print("host-syncs: unexplained host syncs:", file=sys.stderr)
        for m in missing:
            print("  " + m, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
