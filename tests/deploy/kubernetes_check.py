#!/usr/bin/env python3
"""Schema-level check of DynMo's Kubernetes manifests, offline.

    kubernetes_check.py SOURCE_DIR

Reads every resource a kustomization under deploy/kubernetes lists (the
kustomizations themselves are followed by hand, so no kubectl is needed) and,
when `kubectl` is on PATH, also the output of `kubectl kustomize` for the
top folder and each overlay, and asserts on each set of objects:

  * every object has apiVersion, kind and metadata.name, with the apiVersion
    the kind belongs to;
  * every container has a name and an image, unique names, valid and unique
    env names, and every port a probe or Service targets is one of the
    container's ports (by number or name);
  * a Deployment's selector matches its template's labels, a Service's
    selector matches some workload's template labels, volume mounts name
    declared volumes, and PVC claims exist;
  * the coordinator: one replica, Recreate, gRPC liveness and readiness
    probes on the port --listen names, Prometheus annotations on the port
    --metrics_listen names, --state_dir on the PVC mount;
  * the trainer: an Indexed Job with RANK from the completion index,
    WORLD_SIZE equal to completions and parallelism, MASTER_ADDR naming
    index 0 through the Job's headless Service, MASTER_PORT a container port;
  * the Grafana ConfigMap: label grafana_dashboard "1", and its dashboard
    equal to dashboards/dynmo.json (the copy the generator reads is compared
    byte for byte).

Needs python3-yaml. Prints one line per problem and exits 1 on any.
"""
import json
import os
import re
import shutil
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("kubernetes_check: python3-yaml is required (apt-get install python3-yaml)",
          file=sys.stderr)
    sys.exit(1)

API_VERSIONS = {
    "Namespace": "v1", "Service": "v1", "ConfigMap": "v1", "Secret": "v1",
    "PersistentVolumeClaim": "v1", "ServiceAccount": "v1",
    "Deployment": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1",
}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class Checker:
    def __init__(self, label):
        self.label = label
        self.errors = []

    def fail(self, msg):
        self.errors.append(f"{self.label}: {msg}")

    def expect(self, cond, msg):
        if not cond:
            self.fail(msg)
        return cond


def read_kustomization(folder, objects, generated, seen=None):
    """Collects the objects a kustomization's resources hold, recursively."""
    seen = seen or set()
    folder = os.path.realpath(folder)
    if folder in seen:
        raise ValueError(f"kustomization cycle at {folder}")
    seen.add(folder)
    with open(os.path.join(folder, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    for r in k.get("resources", []):
        path = os.path.join(folder, r)
        if os.path.isdir(path):
            read_kustomization(path, objects, generated, seen)
        else:
            with open(path) as f:
                objects.extend(d for d in yaml.safe_load_all(f) if d)
    for g in k.get("configMapGenerator", []):
        generated.append((folder, g))
    return k


def container_ports(c):
    ports = {}
    for p in c.get("ports", []) or []:
        ports[p.get("containerPort")] = p
        if p.get("name"):
            ports[p["name"]] = p
    return ports


def flag(args, name):
    for a in args or []:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def port_of(address):
    return int(address.rsplit(":", 1)[1]) if address and ":" in address else None


def check_objects(ck, objs):
    by_kind = {}
    for o in objs:
        kind = o.get("kind")
        name = (o.get("metadata") or {}).get("name")
        if not ck.expect(kind and o.get("apiVersion") and name,
                         f"object without apiVersion/kind/metadata.name: {str(o)[:80]}"):
            continue
        ck.expect(NAME.match(name) is not None, f"{kind}/{name}: invalid name")
        if kind in API_VERSIONS:
            ck.expect(o["apiVersion"] == API_VERSIONS[kind],
                      f"{kind}/{name}: apiVersion {o['apiVersion']} (want {API_VERSIONS[kind]})")
        else:
            ck.fail(f"{kind}/{name}: unexpected kind")
        by_kind.setdefault(kind, {})[name] = o

    templates = {}  # workload name -> pod template
    for kind in ("Deployment", "Job", "StatefulSet"):
        for name, o in by_kind.get(kind, {}).items():
            templates[f"{kind}/{name}"] = o["spec"]["template"]

    pvcs = set(by_kind.get("PersistentVolumeClaim", {}))
    for wname, tpl in templates.items():
        spec = tpl.get("spec", {})
        containers = spec.get("containers") or []
        ck.expect(containers, f"{wname}: no containers")
        names = [c.get("name") for c in containers]
        ck.expect(len(set(names)) == len(names) and all(names), f"{wname}: container names missing or repeated")
        volumes = {v.get("name"): v for v in spec.get("volumes", []) or []}
        for v in volumes.values():
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is not None:
                ck.expect(claim in pvcs, f"{wname}: volume {v['name']} claims unknown PVC {claim}")
        for c in containers:
            where = f"{wname} container {c.get('name')}"
            image = c.get("image", "")
            ck.expect(isinstance(image, str) and image and not re.search(r"\s", image),
                      f"{where}: missing or malformed image {image!r}")
            env = [e.get("name") for e in c.get("env", []) or []]
            ck.expect(all(n and ENV_NAME.match(n) for n in env), f"{where}: invalid env name in {env}")
            ck.expect(len(set(env)) == len(env), f"{where}: repeated env names {env}")
            ports = container_ports(c)
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                p = c.get(probe)
                if not p:
                    continue
                handlers = [h for h in ("grpc", "httpGet", "tcpSocket", "exec") if h in p]
                ck.expect(len(handlers) == 1, f"{where}: {probe} needs exactly one handler")
                for h in handlers:
                    if h != "exec":
                        ck.expect(p[h].get("port") in ports,
                                  f"{where}: {probe} port {p[h].get('port')} is not a container port")
                if "grpc" in p:
                    ck.expect(isinstance(p["grpc"].get("port"), int),
                              f"{where}: {probe}.grpc.port must be a number")
            for m in c.get("volumeMounts", []) or []:
                ck.expect(m.get("name") in volumes, f"{where}: mount of undeclared volume {m.get('name')}")
        ann = tpl.get("metadata", {}).get("annotations", {}) or {}
        if ann.get("prometheus.io/scrape") == "true":
            port = ann.get("prometheus.io/port", "")
            ck.expect(port.isdigit() and any(int(port) in container_ports(c) for c in containers),
                      f"{wname}: prometheus.io/port {port!r} is not a container port")

    for name, o in by_kind.get("Deployment", {}).items():
        sel = o["spec"].get("selector", {}).get("matchLabels", {})
        labels = o["spec"]["template"].get("metadata", {}).get("labels", {})
        ck.expect(sel and all(labels.get(k) == v for k, v in sel.items()),
                  f"Deployment/{name}: selector {sel} does not match template labels {labels}")

    for name, o in by_kind.get("Service", {}).items():
        sel = o["spec"].get("selector", {})
        matches = []
        for wname, tpl in templates.items():
            labels = dict(tpl.get("metadata", {}).get("labels", {}) or {})
            if wname.startswith("Job/"):  # the Job controller adds these
                labels.setdefault("batch.kubernetes.io/job-name", wname.split("/", 1)[1])
                labels.setdefault("job-name", wname.split("/", 1)[1])
            if sel and all(labels.get(k) == v for k, v in sel.items()):
                matches.append((wname, tpl))
        if not ck.expect(matches, f"Service/{name}: selector {sel} matches no workload"):
            continue
        for p in o["spec"].get("ports", []):
            target = p.get("targetPort", p.get("port"))
            ck.expect(any(target in container_ports(c) for _, tpl in matches
                          for c in tpl["spec"]["containers"]),
                      f"Service/{name}: targetPort {target} is not a container port")

    check_coordinator(ck, by_kind)
    check_trainer(ck, by_kind)
    return by_kind


def check_coordinator(ck, by_kind):
    d = by_kind.get("Deployment", {}).get("dynmo-coordinator")
    if not ck.expect(d is not None, "no Deployment dynmo-coordinator"):
        return
    ck.expect(d["spec"].get("replicas") == 1, "coordinator: replicas must be 1 (one writer of the state dir)")
    ck.expect(d["spec"].get("strategy", {}).get("type") == "Recreate",
              "coordinator: strategy must be Recreate (never two writers)")
    spec = d["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = c.get("args", [])
    ports = container_ports(c)
    grpc_port = port_of(flag(args, "listen"))
    metrics_port = port_of(flag(args, "metrics_listen"))
    ck.expect(grpc_port in ports, f"coordinator: --listen port {grpc_port} is not a container port")
    ck.expect(metrics_port in ports, f"coordinator: --metrics_listen port {metrics_port} is not a container port")
    for probe in ("livenessProbe", "readinessProbe"):
        p = c.get(probe, {})
        handler = p.get("grpc") or p.get("tcpSocket")
        ck.expect(handler is not None and handler.get("port") in (grpc_port, "grpc"),
                  f"coordinator: {probe} must check the gRPC port {grpc_port}")
    ann = d["spec"]["template"]["metadata"].get("annotations", {})
    ck.expect(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(metrics_port),
              f"coordinator: prometheus.io annotations must point at {metrics_port}")
    state_dir = flag(args, "state_dir")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    vol = {v["name"]: v for v in spec.get("volumes", [])}.get(mounts.get(state_dir), {})
    ck.expect("persistentVolumeClaim" in vol, f"coordinator: --state_dir {state_dir} is not on a PVC mount")
    for a in args:
        if a.startswith("--"):
            ck.expect(a[2:].split("=", 1)[0] in (
                "listen", "metrics_listen", "state_dir", "balancer", "trigger", "repack",
                "repack_tolerance", "tls_cert", "tls_key", "tls_client_ca", "token_file"),
                f"coordinator: unknown flag {a}")
    svc = by_kind.get("Service", {}).get("dynmo-coordinator")
    if ck.expect(svc is not None, "no Service dynmo-coordinator"):
        ck.expect(any(p.get("port") == grpc_port for p in svc["spec"]["ports"]),
                  "Service dynmo-coordinator does not expose the gRPC port")


def check_trainer(ck, by_kind):
    j = by_kind.get("Job", {}).get("dynmo-trainer")
    if not ck.expect(j is not None, "no Job dynmo-trainer"):
        return
    s = j["spec"]
    ck.expect(s.get("completionMode") == "Indexed", "trainer: completionMode must be Indexed")
    tpl = s["template"]["spec"]
    c = tpl["containers"][0]
    env = {e["name"]: e for e in c.get("env", [])}
    for n in TORCHRUN_ENV:
        ck.expect(n in env, f"trainer: env {n} missing")
    if any(n not in env for n in TORCHRUN_ENV):
        return
    rank = env["RANK"]
    ck.expect(rank.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") ==
              "metadata.annotations['batch.kubernetes.io/job-completion-index']"
              or rank.get("value") == "$(JOB_COMPLETION_INDEX)",
              "trainer: RANK must come from the job completion index")
    world = env["WORLD_SIZE"].get("value")
    ck.expect(world == str(s.get("completions")) == str(s.get("parallelism")),
              f"trainer: WORLD_SIZE {world} must equal completions and parallelism")
    sub = tpl.get("subdomain")
    ck.expect(sub and env["MASTER_ADDR"].get("value", "").startswith(f"{j['metadata']['name']}-0.{sub}"),
              "trainer: MASTER_ADDR must name index 0 through the Job's subdomain")
    ck.expect(sub in by_kind.get("Service", {}) and
              by_kind["Service"][sub]["spec"].get("clusterIP") == "None",
              f"trainer: subdomain {sub} needs a headless Service")
    ck.expect(int(env["MASTER_PORT"].get("value", "0")) in container_ports(c),
              "trainer: MASTER_PORT is not a container port")
    ck.expect(tpl.get("restartPolicy") in ("Never", "OnFailure"), "trainer: restartPolicy")


def check_dashboard_configmap(ck, cm, dashboard):
    if not ck.expect(cm is not None, "no ConfigMap dynmo-grafana-dashboard"):
        return
    ck.expect(cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1",
              "dashboard ConfigMap lacks label grafana_dashboard: \"1\"")
    data = cm.get("data", {})
    ck.expect(list(data) == ["dynmo.json"], f"dashboard ConfigMap keys {list(data)}")
    if "dynmo.json" in data:
        ck.expect(json.loads(data["dynmo.json"]) == dashboard,
                  "dashboard ConfigMap differs from dashboards/dynmo.json")


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = argv[1]
    kdir = os.path.join(src, "deploy", "kubernetes")
    dash_path = os.path.join(src, "dashboards", "dynmo.json")
    with open(dash_path) as f:
        dashboard = json.load(f)
    errors = []
    overlays = [kdir] + sorted(
        os.path.join(kdir, d) for d in os.listdir(kdir)
        if os.path.isfile(os.path.join(kdir, d, "kustomization.yaml")))

    # Offline: the raw resources, with the dashboard generator read by hand.
    ck = Checker("manifests")
    objs, gens = [], []
    read_kustomization(kdir, objs, gens)
    check_objects(ck, objs)
    for folder, g in gens:
        for entry in g.get("files", []):
            key, _, rel = entry.partition("=")
            rel = rel or key
            with open(os.path.join(folder, rel), "rb") as a, open(dash_path, "rb") as b:
                ck.expect(a.read() == b.read(),
                          f"{os.path.join(folder, rel)} is not a copy of dashboards/dynmo.json "
                          "(cp dashboards/dynmo.json there)")
        ck.expect(g.get("options", {}).get("labels", {}).get("grafana_dashboard") == "1",
                  f"configMapGenerator {g.get('name')}: label grafana_dashboard \"1\" missing")
    errors += ck.errors
    print(f"kubernetes_check: {len(objs)} raw objects checked")

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("kubernetes_check: kubectl not found; `kubectl kustomize` rendering skipped")
    for folder in overlays if kubectl else []:
        r = subprocess.run([kubectl, "kustomize", folder], capture_output=True, text=True)
        label = f"kubectl kustomize {os.path.relpath(folder, src)}"
        if r.returncode != 0:
            errors.append(f"{label}: {r.stderr.strip()}")
            continue
        ck = Checker(label)
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
        by_kind = check_objects(ck, rendered)
        check_dashboard_configmap(ck, by_kind.get("ConfigMap", {}).get("dynmo-grafana-dashboard"), dashboard)
        ns = {o["metadata"].get("namespace") for o in rendered if o["kind"] != "Namespace"}
        ck.expect(ns == {"dynmo"}, f"objects outside namespace dynmo: {ns}")
        errors += ck.errors
        print(f"kubernetes_check: {label}: {len(rendered)} objects checked")

    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
