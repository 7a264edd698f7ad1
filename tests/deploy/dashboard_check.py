#!/usr/bin/env python3
"""Structural check of a Grafana dashboard, and the panel queries it runs.

    dashboard_check.py check DASHBOARD.json
        Asserts what Grafana needs to render every panel: unique integer ids,
        a complete gridPos inside the 24-column grid with no two panels
        overlapping, a Prometheus datasource on every panel and target,
        non-empty targets whose refIds are unique and whose expr is set,
        and every $variable used defined in templating (or a Grafana
        built-in). With promtool on PATH it also parses every expression
        (variables substituted) as PromQL, through a throwaway rules file.

    dashboard_check.py queries DASHBOARD.json VAR=VALUE...
        Prints one line per target: "panel-id<TAB>refId<TAB>title<TAB>expr"
        with the variables substituted; the live test feeds these to
        Prometheus.

Standard library only; exits non-zero with one line per problem.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h",
            "__range_s": "3600", "__interval_ms": "15000"}
VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def all_panels(dash):
    """Yields every panel, descending into rows' collapsed panels."""
    for p in dash.get("panels", []):
        yield p
        for q in p.get("panels", []) or []:
            yield q


def variables_used(expr):
    return {a or b for a, b in VAR_RE.findall(expr)}


def substitute(expr, values):
    def repl(m):
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(name)
        return values[name]
    return VAR_RE.sub(repl, expr)


def check(dash):
    errors = []
    for key in ("title", "uid", "schemaVersion", "panels", "templating"):
        if key not in dash:
            errors.append(f"dashboard: missing top-level '{key}'")
    if not isinstance(dash.get("schemaVersion"), int):
        errors.append("dashboard: schemaVersion must be an integer")
    defined = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    for v in dash.get("templating", {}).get("list", []):
        if not v.get("name") or not v.get("type"):
            errors.append(f"variable {v!r}: needs name and type")
    if "job" not in defined:
        errors.append("dashboard: no 'job' template variable")
    else:
        job = next(v for v in dash["templating"]["list"] if v["name"] == "job")
        q = job.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        if not re.fullmatch(r"label_values\(\s*\w+\s*,\s*job\s*\)", q):
            errors.append(f"variable job: query {q!r} is not label_values(METRIC, job)")

    ids = set()
    rects = []
    panels = list(all_panels(dash))
    if not panels:
        errors.append("dashboard: no panels")
    for p in panels:
        title = p.get("title", "?")
        where = f"panel {p.get('id')!r} ({title})"
        pid = p.get("id")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            errors.append(f"{where}: id must be a positive integer")
        elif pid in ids:
            errors.append(f"{where}: duplicate id")
        ids.add(pid)
        if not p.get("type") or not p.get("title"):
            errors.append(f"{where}: needs type and title")
        g = p.get("gridPos")
        if not isinstance(g, dict) or any(
                not isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
            errors.append(f"{where}: gridPos needs integer h, w, x, y")
        else:
            if g["w"] < 1 or g["h"] < 1 or g["x"] < 0 or g["y"] < 0 or g["x"] + g["w"] > 24:
                errors.append(f"{where}: gridPos {g} outside the 24-column grid")
            for other, og in rects:
                if (g["x"] < og["x"] + og["w"] and og["x"] < g["x"] + g["w"] and
                        g["y"] < og["y"] + og["h"] and og["y"] < g["y"] + g["h"]):
                    errors.append(f"{where}: gridPos overlaps panel {other}")
            rects.append((pid, g))
        if p.get("type") == "row":
            continue
        ds = p.get("datasource")
        if not isinstance(ds, dict) or ds.get("type") != "prometheus" or not ds.get("uid"):
            errors.append(f"{where}: datasource must be {{type: prometheus, uid: ...}}")
        targets = p.get("targets")
        if not isinstance(targets, list) or not targets:
            errors.append(f"{where}: no targets")
            continue
        refs = set()
        for t in targets:
            ref = t.get("refId")
            if not ref or ref in refs:
                errors.append(f"{where}: target refId {ref!r} missing or repeated")
            refs.add(ref)
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                errors.append(f"{where} {ref}: empty expr")
                continue
            tds = t.get("datasource", ds)
            if not isinstance(tds, dict) or tds.get("type") != "prometheus":
                errors.append(f"{where} {ref}: target datasource is not Prometheus")
            for name in variables_used(expr):
                if name not in defined and name not in BUILTINS:
                    errors.append(f"{where} {ref}: undefined variable ${name}")
    return errors


def queries(dash, values):
    values = {**BUILTINS, **values}
    for p in all_panels(dash):
        for t in p.get("targets", []) or []:
            yield p["id"], t["refId"], p["title"], substitute(t["expr"], values)


def promql_parses(exprs):
    """Parses expressions with promtool via a rules file; returns errors."""
    promtool = shutil.which("promtool")
    if promtool is None:
        print("dashboard_check: promtool not found, PromQL parse check skipped")
        return []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "panels.rules.yml")
        # JSON is YAML: no YAML library needed to write a rules file.
        rules = [{"record": f"dashboard:panel_{pid}_{ref}", "expr": e}
                 for pid, ref, _, e in exprs]
        with open(path, "w") as f:
            json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
        r = subprocess.run([promtool, "check", "rules", path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return [f"promtool check rules on the panel queries failed:\n{r.stdout}{r.stderr}"]
    return []


def main(argv):
    if len(argv) < 3 or argv[1] not in ("check", "queries"):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[2], encoding="utf-8") as f:
        dash = json.load(f)
    if argv[1] == "queries":
        values = dict(a.split("=", 1) for a in argv[3:])
        for pid, ref, title, expr in queries(dash, values):
            print(f"{pid}\t{ref}\t{title}\t{expr}")
        return 0
    errors = check(dash)
    if not errors:
        errors = promql_parses(list(queries(dash, {"job": "example", "datasource": "prometheus"})))
    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    if errors:
        return 1
    n = sum(len(p.get("targets", [])) for p in all_panels(dash))
    print(f"dashboard_check: {argv[2]}: {len(list(all_panels(dash)))} panels, {n} queries OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
