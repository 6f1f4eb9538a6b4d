"""What reaches the terminal: lines on stdout, messages on stderr (stamped off a
terminal), the jobs piped on stdin, the exit code of every error, and what each
exit code means (`MEANINGS`, the words for `errors.Exit`'s table).

Every `BatchrunError` is caught once, in `reported`, printed on stderr without a
traceback, and turned into its exit code; anything else is a bug (`internal_error`,
`Exit.INTERNAL`). What a run tells on the way is said by `telling`, how it
ended by `said_ending`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from batchrun.core.errors import (
    PRECEDENCE,
    BatchrunError,
    Exit,
    UsageError,
    foremost,
    leaves,
)
from batchrun.store.paths import StatePaths

if TYPE_CHECKING:
    from batchrun.run.exit_code import Ending
    from batchrun.run.news import News


def interrupted() -> NoReturn:
    to_stderr("Interrupted.")
    sys.exit(Exit.INTERRUPTED)


def internal_error(exc: BaseException) -> NoReturn:
    """Report a bug in one line per exception and exit `Exit.INTERNAL` (never
    `Exit.FAILED`, which means "some jobs failed")."""
    if os.environ.get("BATCHRUN_DEBUG"):
        raise exc
    # No traceback: its frames could hold the token. BATCHRUN_DEBUG=1 shows it.
    for leaf in leaves(exc):
        to_stderr(f"batchrun: internal error: {type(leaf).__name__}: {leaf}")
    to_stderr("Please report this (rerun with BATCHRUN_DEBUG=1 for details).")
    sys.exit(Exit.INTERNAL)


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
    carries the time, the process and the jobs file, as the plain progress does."""
    from batchrun.cli.plain_log import log_tag, stamped

    tag = log_tag(jobs_file)

    def say(text: str) -> None:
        if sys.stderr.isatty():
            to_stderr(text)
        else:
            to_stderr(stamped(text, tag=tag, wall=datetime.now))

    return say


def telling(say: Callable[[str], None]) -> Callable[[News], None]:
    """How a run's news reaches `say`: as its sentence (`news.spoken`); a
    warning (invites sent again on a --restart) is set apart, as `warning`
    writes it."""
    from batchrun.cli.news import spoken
    from batchrun.store.runs import InvitesAgain

    def tell(news: News) -> None:
        if isinstance(news, InvitesAgain):
            warning(spoken(news))
        else:
            say(spoken(news))

    return tell


@contextmanager
def reported(say: Callable[[str], None] = to_stderr) -> Iterator[None]:
    """Print a BatchrunError's message on stderr and exit with its code, also one
    raised in a run's task group (inside an ExceptionGroup). A group that holds
    another exception too goes on to `main`, which reports a bug."""
    try:
        yield
    except* BatchrunError as group:
        exc = foremost([e for e in leaves(group) if isinstance(e, BatchrunError)])
        say(f"{exc.label}{exc.message}")
        raise SystemExit(exc.exit_code) from None


_RESUME = "run the same command to resume."
# After the breaker, whose message names the cause and its fix.
_FIX_THEN_RESUME = "once that is fixed, run the same command to send them."


def said_ending(end: Ending, say: Callable[[str], None]) -> int:
    """Say what a submission left undone (jobs unknown, jobs left and why), and
    return its exit code."""
    from batchrun.cli.news import why_text
    from batchrun.run.exit_code import Cause

    if end.unknown:
        say(
            f"{end.unknown} invite(s) may or may not have been sent (a timeout, a "
            "server error or a run that died mid-request): check them, then "
            "--retry-unknown to resend."
        )
    if end.left:
        stop = end.stop
        halted = None if stop is None else stop.reason(Cause.HALT)
        why = "" if halted is None else f"Halted: {why_text(halted)}. "
        tripped = stop is not None and stop.cause is Cause.BREAKER
        then = _FIX_THEN_RESUME if tripped else _RESUME
        say(f"{why}Stopped early with {end.left} job(s) left: {then}")
    return end.code


@dataclass(frozen=True, slots=True)
class Meaning:
    """What an exit code means, as `submit --help` (`brief`), the README's table
    (`meaning`) and the troubleshooting page's heading say (None: not there)."""

    brief: str | None
    meaning: str
    heading: str | None


# Every exit code's meaning, in the order `submit --help` lists them.
MEANINGS: dict[Exit, Meaning] = {
    Exit.OK: Meaning("all done", "every job done", None),
    Exit.FAILED: Meaning(
        "some jobs failed or are unknown",
        "some jobs failed or are unknown (the results file and `status` say why)",
        "some jobs failed or are unknown",
    ),
    Exit.USAGE: Meaning(
        "bad usage or jobs file, nothing sent",
        "bad usage or a bad jobs file: nothing was sent",
        "bad usage or a bad jobs file",
    ),
    Exit.LOCKED: Meaning(
        "another run holds this file",
        "another run is already working on this jobs file",
        "another run is working on this file",
    ),
    Exit.STATE: Meaning(
        "state folder or ledger unusable",
        "the state folder or the ledger cannot be read or written (damaged, full, "
        "no permission, Redis unreachable)",
        "the state folder or the ledger cannot be used",
    ),
    Exit.UNAVAILABLE: Meaning(
        "stopped early, every request failing the same way (the token, TLS, a "
        "proxy, or the server unreachable)",
        "stopped early: 5 requests in a row met the same fault (the token refused, "
        "TLS, a proxy, the server unreachable); the jobs are left: fix it, run again",
        "stopped early, every request failing the same way",
    ),
    Exit.INTERNAL: Meaning(
        None,
        "an internal error: a bug in batchrun, please report it (`BATCHRUN_DEBUG=1` "
        "shows the traceback)",
        "an internal error",
    ),
    Exit.STOPPED: Meaning(
        "stopped early (deadline, ledger lost), resume by running again",
        "stopped early (deadline, Redis ledger lost) with jobs left and none failed: "
        "run again to resume",
        "stopped early with jobs left",
    ),
    Exit.INTERRUPTED: Meaning(
        "Ctrl-C",
        "stopped by Ctrl-C (SIGINT): requests in flight finished; run again to resume",
        "stopped by a signal",
    ),
    Exit.TERMINATED: Meaning(
        "SIGTERM", "stopped by SIGTERM: likewise", "stopped by a signal"
    ),
}


def precedence() -> str:
    """Which code wins when several apply, in words, from `errors.PRECEDENCE`."""
    signals, *rest = reversed(PRECEDENCE[1:])
    assert set(signals) == {Exit.INTERRUPTED, Exit.TERMINATED}
    return "a signal's code wins, " + ", ".join(
        f"then {code}" for tier in rest for code in tier
    )


def exit_codes_epilog() -> str:
    """The exit codes as `submit --help` ends with them."""
    listed = "; ".join(
        f"{code} {meaning.brief}"
        for code, meaning in MEANINGS.items()
        if meaning.brief is not None
    )
    wins = precedence()
    return (
        f"Exit codes: {listed}. {wins[0].upper()}{wins[1:]}. --halt-after stops "
        f"with {Exit.FAILED}, the jobs left for a resume."
    )
