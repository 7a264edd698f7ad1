"""torchrun, with one line when a rank fails.

    python -m dynmo.torchrun --nproc-per-node=2 train.py --steps 100

takes torchrun's own flags and runs torchrun's own launcher
(``torch.distributed.run``: its parser, its rendezvous, its elastic agent,
restarts included); only the end of a failed run differs. Plain torchrun
follows a failed rank with its own report: the agent's log lines for each
worker it stops, then a Python traceback of torchrun itself and the
``ChildFailedError`` box, some 45 to 80 lines after the rank's own one
line (``DynamicPipeline.close(error=e)`` prints it, naming the rank that
failed and its error). Here the run ends after the ranks' own lines with
one line of its own:

    dynmo.torchrun: train.py failed: ranks 0, 1 exited with status 1

saying how each rank ended (those torchrun stopped after the first
failure last; which rank caused it, the ranks' own lines say), and exits
with the status of the first rank to end of its own accord (128 + N for
a rank killed by signal N), so ``$?`` still tells a refusal (2) from a
failure (1) or a dead peer (3) as the example documents them.
``DYNMO_TORCHRUN_VERBOSE=1`` keeps torchrun's report (the same as
running torchrun). A worker that wrote torchrun's error file
(``@record``) has that error's first line in the summary. A bad torchrun
flag is torchrun's parser's own error, a value torchrun refuses later
one line; both exit 2.

Not thread-safe; the process's main thread.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from typing import List, Optional

_PROG = "dynmo.torchrun"

# The agent's records that only restate, at length, a worker failure this
# module sums up in its own line.
_FAILURE_RECORDS = ("failed (exitcode", "Sending process", "Worker group FAILED",
                    "Received ", "Rendezvous's torchelastic_")


class _WorkerFailureRecords(logging.Filter):
    """Drops the elastic agent's log records about stopping failed workers."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format: keep it as it is
            return True
        return not any(part in text for part in _FAILURE_RECORDS)


def _status(exitcode: int) -> int:
    """A process exit status from a worker's exit code (negative: killed by
    that signal, as subprocess reports it)."""
    if exitcode < 0:
        return 128 + (-exitcode)
    return exitcode if 0 < exitcode < 256 else 1


def _describe(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def _ranks(ranks: list) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))}"


def summary_line(name: str, failures: dict) -> tuple:
    """(the one line, the exit status) for torchrun's ``failures`` (global
    rank -> ``ProcessFailure``) of the script ``name``: the ranks grouped
    by how they ended, those torchrun stopped (SIGTERM, after the first
    failure) last; the status is the first rank's to end of its own
    accord. Which rank *caused* the failure the ranks' own lines say
    (``DynamicPipeline`` ends the others with status 1 within seconds,
    sometimes before the failing rank itself exits)."""
    own = {r: f for r, f in failures.items() if f.exitcode != -signal.SIGTERM}
    stopped = sorted(r for r in failures if r not in own)
    first = min((own or failures).items(), key=lambda kv: (kv[1].timestamp, kv[0]))[1]
    groups: dict = {}
    for rank, f in sorted(own.items(), key=lambda kv: (kv[1].timestamp, kv[0])):
        groups.setdefault(f.exitcode, []).append(rank)
    parts = [f"{_ranks(ranks)} {_describe(code)}" for code, ranks in groups.items()]
    if stopped:
        parts.append(f"torchrun stopped {_ranks(stopped)}" if own else
                     f"{_ranks(stopped)} {_describe(-signal.SIGTERM)}")
    line = f"{_PROG}: {os.path.basename(str(name))} failed: {'; '.join(parts)}"
    message = first.message
    if isinstance(message, dict):
        message = message.get("message", "")
    said = str(message or "").strip().splitlines()
    if first.error_file and os.path.exists(str(first.error_file)) and said:
        line += f": {said[0]}"
    return line, _status(first.exitcode)


def main(argv: Optional[List[str]] = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(sys.argv[1:] if argv is None else argv)
    verbose = os.environ.get("DYNMO_TORCHRUN_VERBOSE", "") not in ("", "0")
    if not verbose:
        _quiet_failure_records()
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        if verbose:
            raise
        line, status = summary_line(args.training_script, e.failures)
        print(line, file=sys.stderr, flush=True)
        return status
    except ValueError as e:  # a flag's value torchrun refuses (--nproc-per-node=x)
        if verbose:
            raise
        print(f"{_PROG}: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


def _quiet_failure_records() -> None:
    """Puts _WorkerFailureRecords on every torch.distributed logger created
    so far (a logger's filter sees the records it emits) and on the
    handlers of torch's logger and the root (which see those of loggers
    created later, as they propagate)."""
    quiet = _WorkerFailureRecords()
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.startswith("torch.distributed"):
            logger.addFilter(quiet)
    for logger in (logging.getLogger("torch"), logging.getLogger()):
        for handler in logger.handlers:
            handler.addFilter(quiet)


if __name__ == "__main__":
    sys.exit(main())
