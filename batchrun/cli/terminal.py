"""What reaches the terminal: lines on stdout, messages on stderr (stamped off a
terminal), the jobs piped on stdin, and the exit code of every error.

Every `BatchrunError` is caught once, in `reported`, printed on stderr without a
traceback, and turned into its exit code; anything else is a bug (`internal_error`,
exit 70).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import NoReturn

from batchrun.core.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    BatchrunError,
    StateError,
    UsageError,
)
from batchrun.store.paths import StatePaths


def interrupted() -> NoReturn:
    to_stderr("Interrupted.")
    sys.exit(EXIT_INTERRUPTED)


def internal_error(exc: BaseException) -> NoReturn:
    """Report a bug in one line per exception and exit 70 (never 1, which means
    "some jobs failed")."""
    if os.environ.get("BATCHRUN_DEBUG"):
        raise exc
    # No traceback: its frames could hold the token. BATCHRUN_DEBUG=1 shows it.
    for leaf in _leaves(exc):
        to_stderr(f"batchrun: internal error: {type(leaf).__name__}: {leaf}")
    to_stderr("Please report this (rerun with BATCHRUN_DEBUG=1 for details).")
    sys.exit(EXIT_INTERNAL)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an ExceptionGroup holds, however nested; else `exc` alone."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def echo(lines: list[str]) -> None:
    """Print on stdout; a reader that left early (`| head`) is not a failure."""
    try:
        for line in lines:
            sys.stdout.write(f"{line}\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Python's advice: point stdout at /dev/null, or the flush at exit fails
        # again, and Python would exit 120 for a command that did its work.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def from_stdin(results: Path, state: StatePaths) -> Path:
    """The jobs piped in, copied into the state folder under a name of their
    results file's, so that the same pipe run again finds its run and resumes.
    JSON Lines if the first character is `{`, else CSV."""
    stream = sys.stdin.buffer
    head = stream.read(65536)
    kind = ".jsonl" if head.lstrip().startswith(b"{") else ".csv"
    copy = state.stdin_copy(results, kind)
    try:
        with copy.open("wb") as file:
            file.write(head)
            shutil.copyfileobj(stream, file)
    except OSError as exc:
        msg = f"cannot keep the jobs read from stdin in {copy}: {exc.strerror or exc}."
        raise UsageError(msg) from None
    return copy


def to_stderr(text: str) -> None:
    """A line on stderr; on a terminal, wrapped at words to its width."""
    if sys.stderr.isatty():
        from batchrun.cli.plain_log import fitted

        text = fitted(text, shutil.get_terminal_size().columns)
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def warning(text: str) -> None:
    """A warning on stderr, set apart from the log's lines: no time or process,
    and `warning:` first."""
    to_stderr(f"warning: {text}")


def log_for(jobs_file: Path) -> Callable[[str], None]:
    """How `submit` writes on stderr: off a terminal (cron, a log file) each line
    carries the time, the process and the jobs file, as the plain progress does;
    a warning the run says ("Warning: …") is set apart, as `warning` writes it."""
    from batchrun.cli.plain_log import log_tag, stamped

    tag = log_tag(jobs_file)

    def say(text: str) -> None:
        if text.startswith(_WARNING):
            warning(text.removeprefix(_WARNING))
        elif sys.stderr.isatty():
            to_stderr(text)
        else:
            to_stderr(stamped(text, tag=tag, wall=datetime.now))

    return say


# How the run's own warnings start (store/runs.py says one before a --restart).
_WARNING = "Warning: "


@contextmanager
def reported(say: Callable[[str], None] = to_stderr) -> Iterator[None]:
    """Print a BatchrunError's message on stderr and exit with its code, also one
    raised in a run's task group (inside an ExceptionGroup). A group that holds
    another exception too goes on to `main`, which reports a bug (exit 70)."""
    try:
        yield
    except* BatchrunError as group:
        errors = [leaf for leaf in _leaves(group) if isinstance(leaf, BatchrunError)]
        # A state problem says most about what to do; else the first one raised.
        exc = min(errors, key=lambda e: not isinstance(e, StateError))
        say(f"{exc.label}{exc.message}")
        raise SystemExit(exc.exit_code) from None
