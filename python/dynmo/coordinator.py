"""``LocalCoordinator``: a ``dynmo-coordinator`` daemon as a child process.

For a single node, a test or an example: rank 0 starts the daemon on a
loopback port the kernel picks (``--listen 127.0.0.1:0 --port_file F``) and
hands ``address`` to every rank. The binary is ``binary`` if given, else
$DYNMO_COORDINATOR, else ``dynmo-coordinator`` in $DYNMO_BIN_DIR, the one
``pip install`` put inside the package (dynmo/bin), the build tree's when
the package runs from build/python (build/bin), or the one on PATH.
``stop()`` (or leaving the ``with`` block) sends SIGTERM and waits.

The daemon's output (its event log: plans issued and applied, rank speed
changes) goes to ``log_path`` if given, else to the file
$DYNMO_COORDINATOR_LOG names (kept after ``stop()``: how to read what an
embedded coordinator decided, e.g. under ``dynmo.pipelining``), else to a
temporary file removed by ``stop()``. Not thread-safe: owned by one thread.

The daemon never outlives the process that started it: on Linux the
kernel sends it SIGTERM when the starting thread ends, however it ends
(``PR_SET_PDEATHSIG``: a SIGKILL, ``os._exit``, a crash), and an ``atexit``
hook stops it on a normal exit elsewhere. Start it from the thread that
lives as long as the job (the main thread).
"""
from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence

from dynmo.errors import NotFoundError, UnavailableError


def find_coordinator_binary() -> str:
    """The dynmo-coordinator to run; NotFoundError when there is none."""
    candidates: List[str] = []
    if os.environ.get("DYNMO_COORDINATOR"):
        candidates.append(os.environ["DYNMO_COORDINATOR"])
    if os.environ.get("DYNMO_BIN_DIR"):
        candidates.append(os.path.join(os.environ["DYNMO_BIN_DIR"], "dynmo-coordinator"))
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "bin", "dynmo-coordinator"))
    candidates.append(os.path.join(here, "..", "..", "bin", "dynmo-coordinator"))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    on_path = shutil.which("dynmo-coordinator")
    if on_path:
        return on_path
    raise NotFoundError("dynmo-coordinator not found: set DYNMO_COORDINATOR or "
                        "DYNMO_BIN_DIR, or put it on PATH")


def _die_with_parent(parent: int):
    """The child's pre-exec step on Linux: SIGTERM when the parent thread
    ends (and at once if it already has); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None

    def step() -> None:
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return step


class LocalCoordinator:
    """A coordinator daemon on 127.0.0.1; ``address`` is "127.0.0.1:PORT"."""

    def __init__(self, flags: Sequence[str] = (), *, binary: Optional[str] = None,
                 start_timeout_s: float = 20.0, log_path: Optional[str] = None) -> None:
        self._dir = tempfile.mkdtemp(prefix="dynmo-coordinator-")
        port_file = os.path.join(self._dir, "port")
        argv = [binary or find_coordinator_binary(), "--listen=127.0.0.1:0",
                f"--port_file={port_file}", *flags]
        log_path = log_path or os.environ.get("DYNMO_COORDINATOR_LOG") or os.path.join(
            self._dir, "log")
        try:
            self._log = open(log_path, "wb")
        except OSError as e:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise ValueError(f"dynmo-coordinator log {log_path}: {e.strerror}") from None
        self._proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                      preexec_fn=_die_with_parent(os.getpid()))
        atexit.register(self.stop)
        deadline = time.monotonic() + start_timeout_s
        port = ""
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if os.path.exists(port_file):
                with open(port_file) as f:
                    port = f.read().strip()
                if port:
                    break
            time.sleep(0.02)
        if not port:
            exited = self._proc.poll() is not None
            why = self.log_tail(1) if exited else "no port file"
            self.stop()
            raise UnavailableError(
                f"dynmo-coordinator exited at its start: {why}" if exited else
                f"dynmo-coordinator did not start within {start_timeout_s} s: {why}")
        self.port = int(port)
        self.address = f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 5) -> str:
        """The daemon's last output lines (for error messages)."""
        self._log.flush()
        try:
            with open(self._log.name, "rb") as f:
                text = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL after 10 s). Idempotent."""
        atexit.unregister(self.stop)
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "LocalCoordinator":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
