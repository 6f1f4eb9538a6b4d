"""The one exception tree of batchrun, each error carrying its process exit code.

    BatchrunError            exit 1
    ├── UsageError           exit 2  (a bad flag, limit rule or setting)
    ├── JobsFileError        exit 2  (a jobs file with bad rows; nothing was sent)
    ├── RunLocked            exit 3  (another run holds this jobs file)
    ├── StateError           exit 74 (the state folder or the ledger cannot be used)
    │   ├── DiskFull         exit 74 (no space left: mid-run, the run stops, 75)
    │   └── LedgerLost       exit 74 (the ledger went away mid-run: the run stops, 75)
    └── StoppedEarly         exit 75 (deadline, ledger lost), 130 (Ctrl-C) or
                             143 (SIGTERM), jobs left to resume

`cli.py` converts these to a message on stderr and the exit code, once, at the edge,
also when one comes out of a run's task group inside an ExceptionGroup. Any other
exception is a bug: exit 70.
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_OK = 0
EXIT_SOME_FAILED = 1
EXIT_INTERNAL = 70  # EX_SOFTWARE from sysexits.h: a bug, never "jobs failed".
# EX_UNAVAILABLE from sysexits.h: every request failed the same way (401/403, or
# the server unreachable), so the circuit breaker stopped the run.
EXIT_UNAVAILABLE = 69
EXIT_STOPPED = 75  # EX_TEMPFAIL from sysexits.h: "try again later".
# 128 + the signal's number, as a shell reports a process the signal killed, so
# that a shell loop around batchrun stops on Ctrl-C as it would around `sleep`.
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class BatchrunError(Exception):
    """Base of every error batchrun reports to its user."""

    exit_code = 1
    # How the CLI introduces the message on stderr.
    label = "Error: "

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(BatchrunError):
    """Raised when a flag, a limit rule or a setting is malformed."""

    exit_code = 2


class JobsFileError(BatchrunError):
    """Raised when a jobs file cannot be read or holds invalid rows.

    `problems` holds `(line, reason)` pairs; line 0 means the file as a whole.
    """

    exit_code = 2
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

    exit_code = 3


class StateError(BatchrunError):
    """Raised when the state folder or the ledger cannot be read or written."""

    exit_code = 74  # EX_IOERR from sysexits.h.


class DiskFull(StateError):
    """Raised when a state file cannot be written because the disk is full.

    Mid-run, the runner turns it into a stop, like a deadline: no new requests,
    those in flight finished and recorded where possible, exit 75, so that a
    rerun after space is freed resumes.
    """


class LedgerLost(StateError):
    """Raised when a shared ledger that worked stops answering during a run.

    The runner turns it into a stop: no new requests, those in flight finished,
    exit 75, so that a rerun resumes once the ledger is back.
    """


class StoppedEarly(BatchrunError):
    """Raised when a run stops on a deadline or signal with jobs left to resume."""

    exit_code = EXIT_STOPPED
    label = ""  # not an error: the next run resumes

    def __init__(self, message: str, *, exit_code: int = EXIT_STOPPED) -> None:
        super().__init__(message)
        self.exit_code = exit_code
