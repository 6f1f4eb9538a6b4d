"""The one exception tree of batchrun, each error carrying its process exit code,
and the one table of exit codes (`Exit`) with the order they win in.

    BatchrunError            FAILED
    ├── UsageError           USAGE  (a bad flag, limit rule or setting)
    ├── JobsFileError        USAGE  (a jobs file with bad rows; nothing was sent)
    ├── RunLocked            LOCKED (another run holds this jobs file)
    └── StateError           STATE  (the state folder or the ledger cannot be used)
        ├── DiskFull         STATE  (no space left: mid-run, the run stops first)
        └── LedgerLost       STATE  (the ledger went away: mid-run, a stop, STOPPED)

A run that stops early (a deadline, a signal, `--halt-after`, the circuit breaker)
raises nothing: it ends with the code `run/exit_code` gives its stop. The command
line turns an error into a message on stderr and its exit code, once, at the edge,
also when one comes out of a run's task group inside an ExceptionGroup (`code_of`,
`foremost`). Any other exception is a bug: `Exit.INTERNAL`. What each code means, in
words, is `cli/terminal`'s to say.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum


class Exit(IntEnum):
    """Every exit code batchrun ends with; sysexits.h's where one fits."""

    OK = 0
    # Some jobs failed or are unknown; also a BatchrunError with no code of its own.
    FAILED = 1
    USAGE = 2
    LOCKED = 3
    # EX_UNAVAILABLE: every request failed the same way (401/403, or the server
    # unreachable), so the circuit breaker stopped the run.
    UNAVAILABLE = 69
    INTERNAL = 70  # EX_SOFTWARE: a bug, never "jobs failed".
    STATE = 74  # EX_IOERR: the state folder or the ledger cannot be used.
    STOPPED = 75  # EX_TEMPFAIL: "try again later", the jobs left for a resume.
    # 128 + the signal's number, as a shell reports a process the signal killed, so
    # that a shell loop around batchrun stops on Ctrl-C as it would around `sleep`.
    INTERRUPTED = 130
    TERMINATED = 143


# Which code a run ends with when several apply, the last group winning: a
# signal's (so that a shell loop stops), then the breaker's, then failures (never
# hidden by a stop), then a stop's with jobs left. Codes not here are errors'.
PRECEDENCE: tuple[tuple[Exit, ...], ...] = (
    (Exit.OK,),
    (Exit.STOPPED,),
    (Exit.FAILED,),
    (Exit.UNAVAILABLE,),
    (Exit.INTERRUPTED, Exit.TERMINATED),
)


def rank(code: Exit) -> int:
    """Where `code` stands in `PRECEDENCE` (higher wins); an error's code, 0."""
    return next((n for n, tier in enumerate(PRECEDENCE) if code in tier), 0)


class BatchrunError(Exception):
    """Base of every error batchrun reports to its user."""

    exit_code: int = Exit.FAILED
    # How the CLI introduces the message on stderr.
    label = "Error: "

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(BatchrunError):
    """Raised when a flag, a limit rule or a setting is malformed."""

    exit_code = Exit.USAGE


class JobsFileError(BatchrunError):
    """Raised when a jobs file cannot be read or holds invalid rows.

    `problems` holds `(line, reason)` pairs; line 0 means the file as a whole.
    """

    exit_code = Exit.USAGE
    shown = 20

    def __init__(
        self,
        path: str,
        problems: Sequence[tuple[int, str]],
        total: int,
        *,
        sending: bool = True,
    ) -> None:
        self.path = path
        self.problems = list(problems)
        self.total = total
        # `validate` never sends: "nothing was sent" is said only by `submit`.
        self.sending = sending
        super().__init__(self._render())

    def checked(self) -> JobsFileError:
        """The same problems, as `validate` says them: no word of sending."""
        return JobsFileError(self.path, self.problems, self.total, sending=False)

    def _render(self) -> str:
        if self.total == 1 and self.problems[0][0] == 0:
            tail = " Nothing was sent." if self.sending else ""
            return f"{self.path}: {self.problems[0][1]}.{tail}"
        sent = "; nothing was sent" if self.sending else ""
        lines = [f"{self.path}: {self.total} invalid row(s){sent}."]
        for line, reason in self.problems[: self.shown]:
            where = f"line {line}" if line else "file"
            lines.append(f"  {where}: {reason}")
        if self.total > self.shown:
            lines.append(f"  ... and {self.total - self.shown} more")
        return "\n".join(lines)


class RunLocked(BatchrunError):
    """Raised when another live process is already working on the same jobs file."""

    exit_code = Exit.LOCKED


class StateError(BatchrunError):
    """Raised when the state folder or the ledger cannot be read or written."""

    exit_code = Exit.STATE


class DiskFull(StateError):
    """Raised when a state file cannot be written because the disk is full.

    Mid-run, the runner stops first, as at a deadline: no new requests, those in
    flight finished and recorded where possible; then `Exit.STATE`, and a rerun
    after space is freed resumes.
    """


class LedgerLost(StateError):
    """Raised when a shared ledger that worked stops answering during a run.

    The runner turns it into a stop: no new requests, those in flight finished,
    `Exit.STOPPED`, so that a rerun resumes once the ledger is back.
    """


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an ExceptionGroup holds, however nested; else `exc` alone."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def foremost(errors: Sequence[BatchrunError]) -> BatchrunError:
    """The error a command reports of several raised together (in a run's task
    group): a state problem says most about what to do; else the first raised."""
    return min(errors, key=lambda e: not isinstance(e, StateError))


def code_of(exc: BaseException) -> Exit:
    """The exit code the command line ends with when `exc` escapes a command:
    a BatchrunError's own (of a group's, the `foremost`), `INTERRUPTED` for
    Ctrl-C alone, else `INTERNAL` (a bug)."""
    found = leaves(exc)
    if all(isinstance(leaf, KeyboardInterrupt) for leaf in found):
        return Exit.INTERRUPTED
    errors = [leaf for leaf in found if isinstance(leaf, BatchrunError)]
    if len(errors) < len(found):
        return Exit.INTERNAL
    return Exit(foremost(errors).exit_code)
