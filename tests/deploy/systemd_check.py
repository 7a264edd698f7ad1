#!/usr/bin/env python3
"""Checks deploy/systemd: the coordinator unit and its secure.conf drop-in.

    systemd_check.py SOURCE_DIR [COORDINATOR_BINARY]

Always (standard library only): parses the unit and the drop-in and asserts
the state directory, the hardened [Service] section, and that ExecStart
passes --state_dir=${STATE_DIRECTORY} and only flags the coordinator has
(with COORDINATOR_BINARY given and present: the flags its --helpfull lists).
The drop-in must reset ExecStart and pass the token and TLS files from
systemd credentials.

Where `systemd-analyze` exists it also runs `systemd-analyze verify` on the
unit plus drop-in (ExecStart pointed at an existing executable; warnings
about either file fail the test) and `systemd-analyze security --offline`,
whose overall exposure must stay below 2.5 ("OK").
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

KNOWN_FLAGS = {"listen", "metrics_listen", "state_dir", "balancer", "trigger", "repack",
               "repack_tolerance", "tls_cert", "tls_key", "tls_client_ca", "token_file"}
HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
    "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes", "ProtectControlGroups": "yes", "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes", "LockPersonality": "yes", "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
}


def parse_unit(path):
    """Returns {section: [(key, value), ...]}, continuation lines joined."""
    sections, current, pending = {}, None, ""
    with open(path) as f:
        for raw in f:
            line = pending + raw.rstrip("\n")
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            s = line.strip()
            if not s or s[0] in "#;":
                continue
            m = re.fullmatch(r"\[(\w+)\]", s)
            if m:
                current = sections.setdefault(m.group(1), [])
                continue
            if current is None or "=" not in s:
                raise ValueError(f"{path}: cannot parse {s!r}")
            k, v = s.split("=", 1)
            current.append((k.strip(), " ".join(v.split())))
    return sections


def values(section, key):
    return [v for k, v in section if k == key]


def exec_flags(cmdline):
    return {w[2:].split("=", 1)[0] for w in cmdline.split() if w.startswith("--")}


def main(argv):
    src = argv[1]
    binary = argv[2] if len(argv) > 2 else ""
    unit_path = os.path.join(src, "deploy", "systemd", "dynmo-coordinator.service")
    dropin_path = os.path.join(src, "deploy", "systemd", "secure.conf")
    errors = []

    def expect(cond, msg):
        if not cond:
            errors.append(msg)

    known = set(KNOWN_FLAGS)
    if binary and os.access(binary, os.X_OK):
        r = subprocess.run([binary, "--helpfull"], capture_output=True, text=True)
        known = set(re.findall(r"^\s+--(\w+)", r.stdout + r.stderr, re.M)) or known
        print(f"systemd_check: flags taken from {binary} --helpfull ({len(known)})")

    unit = parse_unit(unit_path)
    for s in ("Unit", "Service", "Install"):
        expect(s in unit, f"unit: no [{s}] section")
    svc = unit.get("Service", [])
    execs = values(svc, "ExecStart")
    expect(len(execs) == 1, "unit: exactly one ExecStart")
    cmd = execs[0] if execs else ""
    expect(cmd.startswith("/") and cmd.split()[0].endswith("/dynmo-coordinator"),
           "unit: ExecStart must run dynmo-coordinator by absolute path")
    expect("--state_dir=${STATE_DIRECTORY}" in cmd.split(),
           "unit: ExecStart must pass --state_dir=${STATE_DIRECTORY}")
    unknown = exec_flags(cmd) - known
    expect(not unknown, f"unit: ExecStart uses unknown flags {sorted(unknown)}")
    expect(values(svc, "StateDirectory") == ["dynmo"], "unit: StateDirectory=dynmo")
    expect(values(svc, "DynamicUser") == ["yes"] or values(svc, "User"),
           "unit: needs DynamicUser=yes or a dedicated User=")
    for k, v in HARDENING.items():
        expect(v in values(svc, k), f"unit: [Service] needs {k}={v}")
    families = " ".join(values(svc, "RestrictAddressFamilies")).split()
    expect(families and set(families) <= {"AF_INET", "AF_INET6", "AF_UNIX"},
           f"unit: RestrictAddressFamilies too wide or missing: {families}")
    expect("@system-service" in values(svc, "SystemCallFilter"),
           "unit: SystemCallFilter=@system-service")
    expect(values(unit.get("Install", []), "WantedBy") == ["multi-user.target"],
           "unit: WantedBy=multi-user.target")

    dropin = parse_unit(dropin_path).get("Service", [])
    dexec = values(dropin, "ExecStart")
    expect(len(dexec) == 2 and dexec[0] == "", "secure.conf: must reset ExecStart, then set it")
    if len(dexec) == 2:
        words = dexec[1].split()
        for f in ("token_file", "tls_cert", "tls_key"):
            expect(any(w.startswith(f"--{f}=${{CREDENTIALS_DIRECTORY}}/") for w in words),
                   f"secure.conf: --{f} must come from ${{CREDENTIALS_DIRECTORY}}")
        unknown = exec_flags(dexec[1]) - known
        expect(not unknown, f"secure.conf: unknown flags {sorted(unknown)}")
        creds = {v.split(":", 1)[0] for v in values(dropin, "LoadCredential")}
        expect(creds == {"token", "tls.crt", "tls.key"}, f"secure.conf: LoadCredential {creds}")

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("systemd_check: systemd-analyze not found; verify and security skipped")
    else:
        exe = os.path.abspath(binary) if binary and os.access(binary, os.X_OK) else shutil.which("true")
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "dynmo-coordinator.service.d"))
            for s, dst in ((unit_path, "dynmo-coordinator.service"),
                           (dropin_path, "dynmo-coordinator.service.d/secure.conf")):
                with open(s) as f:
                    text = f.read().replace("/usr/local/bin/dynmo-coordinator", exe)
                    # Credentials must exist for verify; point them at the unit.
                    text = re.sub(r"LoadCredential=([\w.]+):\S+",
                                  rf"LoadCredential=\1:{d}/dynmo-coordinator.service", text)
                with open(os.path.join(d, dst), "w") as f:
                    f.write(text)
            env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{d}:", SYSTEMD_LOG_LEVEL="notice")
            r = subprocess.run([analyze, "verify", "dynmo-coordinator.service"], cwd=d,
                               env=env, capture_output=True, text=True)
            out = r.stdout + r.stderr
            noisy = [l for l in out.splitlines() if "dynmo-coordinator" in l or "secure.conf" in l]
            expect(r.returncode == 0 and not noisy, f"systemd-analyze verify:\n{out}")
            print(f"systemd_check: systemd-analyze verify rc={r.returncode}, "
                  f"{len(noisy)} warnings about the unit")
            r = subprocess.run([analyze, "security", "--offline=yes",
                                os.path.join(d, "dynmo-coordinator.service")],
                               env=env, capture_output=True, text=True)
            m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
            if m:
                print(f"systemd_check: systemd-analyze security exposure {m.group(1)}")
                expect(float(m.group(1)) < 2.5, f"exposure {m.group(1)} is not below 2.5")
            else:
                print("systemd_check: systemd-analyze security --offline unsupported here; skipped")

    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    if not errors:
        print("systemd_check: unit and drop-in OK")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
