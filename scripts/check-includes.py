#!/usr/bin/env python3
"""Fails when a source file includes something its folder may not.

The directions are the ones each top-level folder's README states: the
decision core depends on nothing of ours, the service never on the agent, the
relay or the trainer, the agent never on the relay, the agent / relay /
trainer / clients never on the service, nothing on the trainer or the
launcher (but python/torch_src/ on the trainer's comm/, for the NCCL test
double it binds), and LibTorch only in the trainer, in python/torch_src/
(and in tests and benchmarks).
Inside the trainer it checks the floors trainer/README.md lists: a floor
includes itself and the floors below it, never one above, and the bottom
floors stay free of LibTorch. It also fails on include cycles between
modules (a module is a .h/.cc pair; a .cc including another module's header
is an edge).

    python3 scripts/check-includes.py [ROOT]     # exit 0: clean, 1: findings
"""
import os
import re
import sys

# Folder -> the repository folders its files may include (its own included).
# "dynmo/v1" is the generated protobuf/gRPC code of proto/.
ALLOWED = {
    "cli": {"cli"},
    "storage": {"storage"},
    "core": {"core"},
    "formats": {"core", "formats"},
    # dynmo-sim replays through the coordinator's own job machine.
    "coordinator/tools": {"core", "formats", "coordinator/tools",
                          "coordinator/job", "dynmo/v1", "cli", "wire"},
    # The pure job machine: no daemon, no logger, no metrics.
    "coordinator/job": {"core", "coordinator/job", "dynmo/v1", "wire"},
    # The one codec between the core's structs and the dynmo.v1 messages.
    "wire": {"wire", "core", "dynmo/v1"},
    "coordinator/service": {"core", "formats", "coordinator/job",
                            "coordinator/service", "dynmo/v1", "cli", "rpc", "wire", "storage"},
    # The agent reads the --coordinator_* flags' struct (client_credentials.h).
    "agent": {"agent", "core", "dynmo/v1", "cli", "rpc", "wire"},
    # The node relay: a server for the agents, a client of the coordinator.
    "relay": {"relay", "agent", "dynmo/v1", "rpc", "wire"},
    "rpc": {"rpc"},
    "clients": {"clients", "agent", "relay", "core", "formats",
                "dynmo/v1", "cli", "rpc", "wire"},
    "launcher": {"launcher", "agent", "relay", "coordinator/service", "coordinator/job",
                 "core",
                 "dynmo/v1", "cli", "rpc", "wire"},
    "kernels": {"kernels"},
    # trainer/ itself holds no sources, only its floors (TRAINER_FLOORS).
    "trainer": set(),
    # The Python binding (dynmo._core): the agent and the tools' decision code.
    "python": {"python", "agent", "core", "formats",
               "coordinator/tools", "coordinator/job", "dynmo/v1", "wire"},
    # dynmo._nccl_double: the trainer's NCCL test double (trainer/comm/
    # nccl_double.h) bound as a torch.distributed backend, with LibTorch and
    # torch's pybind11; nothing else of ours.
    "python/torch_src": {"python/torch_src", "trainer/comm"},
}
# The trainer's floors, bottom to top (trainer/README.md): each may include
# itself, the floors below it and the folders outside trainer/ that the
# trainer may use; an include of a floor above it is an upward arrow.
TRAINER_FLOORS = ["data", "layout", "config", "comm", "model", "state", "dynamism",
                  "stage", "elastic", "run"]
TRAINER_USES = {"agent", "core", "formats", "kernels", "dynmo/v1",
                "cli", "wire", "storage"}
for _i, _floor in enumerate(TRAINER_FLOORS):
    ALLOWED["trainer/" + _floor] = TRAINER_USES | {"trainer/" + f
                                                   for f in TRAINER_FLOORS[:_i + 1]}
# The floors under the layers are plain C++: the job's data, grid and
# configuration, without LibTorch.
TRAINER_PLAIN = {"trainer/data", "trainer/layout", "trainer/config"}
# Folders whose own code may include any of ours (they test or measure it).
ANYTHING = {"tests", "bench", "examples"}
OURS = ["cli", "storage", "rpc", "core", "formats", "coordinator/tools",
        "coordinator/job", "coordinator/service", "agent", "relay", "clients", "launcher", "kernels",
        "trainer", "python", "dynmo/v1", "wire", "tests", "bench"] + [
            "trainer/" + f for f in TRAINER_FLOORS]
TORCH = ("torch/", "ATen/", "c10/", "caffe2/")
TORCH_ALLOWED = ({"trainer/" + f for f in TRAINER_FLOORS} - TRAINER_PLAIN) | ANYTHING | {
    "python/torch_src"}
# External libraries the pure layers must not see.
NO_IO = {
    "cli": ("grpc", "grpcpp/", "google/protobuf/", "nlohmann/"),
    "core": ("grpc", "grpcpp/", "google/protobuf/", "nlohmann/", "prometheus/"),
    "formats": ("grpc", "grpcpp/", "google/protobuf/", "prometheus/"),
    "kernels": ("grpc", "grpcpp/", "google/protobuf/", "nlohmann/"),
    "storage": ("grpc", "grpcpp/", "google/protobuf/", "nlohmann/", "prometheus/", "spdlog/"),
    # The job machine speaks protobuf messages and nothing else of the wire.
    "coordinator/job": ("grpc", "grpcpp/", "nlohmann/", "prometheus/", "spdlog/"),
    "wire": ("grpc", "grpcpp/", "nlohmann/", "prometheus/", "spdlog/"),
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
SOURCES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")


def folder_of(rel):
    for f in sorted(ALLOWED, key=len, reverse=True):
        if rel.startswith(f + "/"):
            return f
    top = rel.split("/", 1)[0]
    return top if top in ANYTHING else None


def ours(path):
    for f in sorted(OURS, key=len, reverse=True):
        if path.startswith(f + "/"):
            return f
    return None


def module(path):
    return os.path.splitext(path)[0]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    findings = []
    edges = {}
    for top in sorted(set(f.split("/")[0] for f in ALLOWED)):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                folder = folder_of(rel)
                if folder is None:
                    continue
                if folder == "trainer":
                    findings.append(f"{rel}: the trainer's sources live in its floors "
                                    f"(trainer/{{{','.join(TRAINER_FLOORS)}}}/)")
                with open(full, encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        where = f"{rel}:{n}: includes {inc}"
                        target = ours(inc)
                        if target and folder not in ANYTHING and target not in ALLOWED[folder]:
                            if (folder.startswith("trainer/") and target.startswith("trainer/")
                                    and target[8:] in TRAINER_FLOORS):
                                findings.append(f"{where}: an upward arrow, {folder}/ sits "
                                                f"below {target}/ (trainer/README.md)")
                            else:
                                findings.append(f"{where}, but {folder}/ may not include {target}/")
                        if inc.startswith(TORCH) and folder not in TORCH_ALLOWED:
                            findings.append(f"{where}: LibTorch outside the trainer's "
                                            f"LibTorch floors")
                        for bad in NO_IO.get(folder, ()):
                            if inc.startswith(bad):
                                findings.append(f"{where}: {folder}/ stays free of {bad.rstrip('/')}")
                        if target and target != "dynmo/v1" and module(inc) != module(rel):
                            edges.setdefault(module(rel), set()).add(module(inc))
    # Module-level cycles (Tarjan's strongly connected components).
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []
    counter = [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            connect(v)
    for scc in sccs:
        findings.append("include cycle between modules: " + " <-> ".join(scc))
    for f in findings:
        print(f)
    if findings:
        print(f"check-includes: {len(findings)} finding(s)", file=sys.stderr)
        return 1
    print("check-includes: every include points an allowed way, no cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
