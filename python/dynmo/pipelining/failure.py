"""``JobFailure``: one rank's error ends every rank of the job within
seconds, each with one line naming the rank that failed and its error.

    failure = JobFailure()            # after init_process_group; starts a watcher
    ...
    line = failure.announce(error)    # this rank failed: tell the others
    failure.stop()                    # normal end: stop watching

Why: after a rank raises, its peers are blocked in a receive or a
collective that will never complete (Gloo waits its 30-minute timeout,
NCCL longer). So the failing rank writes "rank R failed: <error>" under
``dynmo/failed`` in the job's rendezvous store (the first failure wins:
a peer's consequent error never overwrites it), and every other rank's
watcher thread, which polls that key every ``poll_s``, runs its
``on_peer_failure`` callbacks (the embedded coordinator is stopped),
prints the line and ends its process with ``PEER_FAILED_STATUS`` — whatever
it was blocked in, on any backend, under torchrun or started by hand. The
flag stays set: a process group that failed is not trained in again.
``announce`` then waits (at most ``grace_s``) until the peers have read it
and says it is done; a peer that hosts the store (rank 0 started by hand)
waits for that before it ends, so that no rank's store call meets a dead
store. ``abort_process_groups`` ends this rank's own groups without a
collective.

Thread-safety: ``announce`` and ``stop`` are called from the training
thread; the watcher thread uses its own store connection and only reads,
except the ``dynmo/failed/seen`` counter it adds to before it exits.
"""
from __future__ import annotations

import datetime
import logging
import os
import sys
import threading
import time
from typing import Callable, List, Optional

import torch.distributed as dist

_log = logging.getLogger("dynmo.pipelining")

FAILED_KEY = "dynmo/failed"
SEEN_KEY = "dynmo/failed/seen"
DONE_KEY = "dynmo/failed/done"
PEER_FAILED_STATUS = 1


def one_line(error: BaseException, limit: int = 300) -> str:
    """``error`` as "Type: its first non-empty line", followed by its root
    cause's when it wraps one (torch's "[Stage 1] failed to run forward:"
    says where, its cause what), at most ``limit`` characters."""
    def line_of(e: BaseException) -> str:
        text = next((l.strip() for l in str(e).splitlines() if l.strip()), "")
        return f"{type(e).__name__}: {text}" if text else type(e).__name__

    root = error
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    line = line_of(error)
    if root is not error and str(root).strip() not in line:
        line = f"{line.rstrip(':')}: {line_of(root)}"
    return line if len(line) <= limit else line[:limit - 3] + "..."


class JobFailure:
    """The job-wide failure flag of this rank's process group (see the
    module doc). Without a store that can be cloned it does nothing."""

    def __init__(self, *, poll_s: float = 0.5, grace_s: float = 3.0,
                 store_timeout_s: float = 5.0) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.grace_s = grace_s
        self.on_peer_failure: List[Callable[[], None]] = []
        self._failing = False  # this rank announced (its own thread ends it)
        # env:// and tcp:// rendezvous put the store in rank 0; torchrun's
        # agent keeps it in its own process.
        self._hosts_store = self.rank == 0 and \
            os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        self._stop = threading.Event()
        # Which thread ends this rank: the training thread (its own error,
        # ``announce``) or the watcher (another rank's); the first to take it.
        self._lock = threading.Lock()
        self._ending_by_watcher = False
        self._store = self._connect(store_timeout_s)
        self._watcher_store = self._connect(store_timeout_s) if self.world > 1 else None
        self._thread: Optional[threading.Thread] = None
        if self._watcher_store is not None:
            self._thread = threading.Thread(target=self._watch, args=(poll_s,),
                                            name="dynmo-failure-watch", daemon=True)
            self._thread.start()

    @staticmethod
    def _connect(timeout_s: float):
        try:
            store = dist.distributed_c10d._get_default_store().clone()
            store.set_timeout(datetime.timedelta(seconds=timeout_s))
            return store
        except Exception as e:  # a store that cannot be cloned: no job-wide flag
            _log.warning("dynmo.pipelining: no failure flag (%s)", e)
            return None

    def announce(self, error: BaseException) -> str:
        """Marks the job failed by ``error`` on this rank (unless a rank
        failed first), waits at most ``grace_s`` for the peers to read it,
        and returns the one line to print: the first failure's. Blocks at
        most the store's timeout plus ``grace_s`` — unless the watcher is
        already ending this process for another rank's failure: then it
        waits for that (a second line would say it twice)."""
        with self._lock:
            self._failing = True
            by_watcher = self._ending_by_watcher
        if by_watcher:
            threading.Event().wait()  # the watcher's os._exit, within grace_s
        mine = f"rank {self.rank} failed: {one_line(error)}"
        if self._store is None or self.world == 1:
            return mine
        try:
            first = self._store.compare_set(FAILED_KEY, "", mine).decode(errors="replace")
        except Exception:  # the store's host is gone: say our own error
            return mine
        if first != mine:  # a consequence of another rank's failure
            self._seen(self._store)
            return f"{first} (rank {self.rank} stops)"
        deadline = time.monotonic() + self.grace_s
        try:
            while self._store.add(SEEN_KEY, 0) < self.world - 1 and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            self._store.set(DONE_KEY, "1")  # the store's host may end now
        except Exception:
            pass
        return mine

    def stop(self) -> None:
        """Stops the watcher and lets go of the store clones (a normal end,
        or this rank's own failure once announced; idempotent). The clones
        end here, on this thread, not in the interpreter's teardown, where a
        clone whose host has gone could still run its own thread."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():  # still in a store call: leave it its clone
                self._thread = None
                return
        self._thread = None
        self._store = None
        self._watcher_store = None

    def _watch(self, poll_s: float) -> None:
        store = self._watcher_store
        while not self._stop.wait(poll_s):
            try:
                if not store.check([FAILED_KEY]):
                    continue
                line = store.get(FAILED_KEY).decode(errors="replace")
            except Exception:
                return  # the store's host ended (a normal end elsewhere): stop
            if self._stop.is_set():
                return
            self._end(store, line)
            return  # this rank is ending through its own error

    def _end(self, store, line: str) -> None:
        """Ends this process because another rank failed (returns only when
        the training thread is already ending through its own error)."""
        with self._lock:
            if self._failing:
                return
            self._ending_by_watcher = True
        for callback in self.on_peer_failure:
            try:
                callback()
            except Exception:
                pass
        print(f"dynmo.pipelining: {line} (rank {self.rank} stops)", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        self._seen(store)
        os._exit(PEER_FAILED_STATUS)


    def _seen(self, store) -> None:
        """Tells the failing rank this one has read its failure; the
        store's host then waits (``grace_s`` at most) until it is done."""
        try:
            store.add(SEEN_KEY, 1)
            deadline = time.monotonic() + self.grace_s
            while self._hosts_store and not store.check([DONE_KEY]) and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
        except Exception:
            pass


def abort_process_groups() -> None:
    """Ends every process group of this rank without a collective (no
    barrier, no wait on a peer): after a failure. Idempotent."""
    if not dist.is_initialized():
        return
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception as e:  # a backend that cannot abort: drop the groups
        _log.debug("dynmo.pipelining: abort: %s", e)
        try:
            dist.destroy_process_group()
        except Exception:
            pass
