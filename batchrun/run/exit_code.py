"""How a run stopped (`Stop`) and the exit code a submission ends with (`exit_code`,
`ending`), from the stop and the store's counts.

Whatever stops a run before every job ended is one `Stop`: the causes met, in the
order they came, each with its reason. The supervisor adds a deadline, a signal
and `--halt-after`'s halt; the runner adds the circuit breaker and a state file
it cannot use (the ledger lost, a full disk). The code follows `errors.PRECEDENCE`:
a signal's wins (the first of two), then the breaker's, then failures, then a stop
with jobs left. What each part means to a user is `cli`'s to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from batchrun.api.breaker import Tripped
from batchrun.core.errors import Exit, LedgerLost, StateError, rank
from batchrun.core.events import Status
from batchrun.run.halt import Halted
from batchrun.store.state import RunStore


class Cause(StrEnum):
    """What stopped a run before every job ended."""

    DEADLINE = "deadline"
    SIGINT = "sigint"
    SIGTERM = "sigterm"
    # --halt-after: too many jobs of the run failed.
    HALT = "halt"
    # The circuit breaker: every request failed the same way.
    BREAKER = "breaker"
    # The shared ledger stopped answering: a stop to resume once it is back.
    LEDGER_LOST = "ledger lost"
    # A state file could not be written (a full disk): the run ends with the error.
    STATE = "state"


# Why a cause stopped a run: the halt's counts, the breaker's, or a state
# error's message ("" for none: a deadline, a signal).
Why = Halted | Tripped | str

# The code each cause alone ends a run with.
_CODE = {
    Cause.DEADLINE: Exit.STOPPED,
    Cause.SIGINT: Exit.INTERRUPTED,
    Cause.SIGTERM: Exit.TERMINATED,
    Cause.HALT: Exit.FAILED,
    Cause.BREAKER: Exit.UNAVAILABLE,
    Cause.LEDGER_LOST: Exit.STOPPED,
    Cause.STATE: Exit.STATE,
}


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a run stopped early: each cause met, first come first, with its reason
    ("" for none), and the state error that stopped it, if one did (only the
    first: the ledger lost or a state file unwritable, not both)."""

    causes: tuple[tuple[Cause, Why], ...]
    error: StateError | None = None

    @classmethod
    def of(cls, cause: Cause, why: Why = "") -> Stop:
        return cls(((cause, why),))

    @classmethod
    def failing(cls, error: StateError) -> Stop:
        """A stop because a state file or the ledger cannot be used."""
        cause = Cause.LEDGER_LOST if isinstance(error, LedgerLost) else Cause.STATE
        return cls(((cause, error.message),), error)

    def then(self, later: Stop) -> Stop:
        """This stop and `later`'s causes after it: the first reason of each cause
        kept, and the first state error."""
        if self.error is not None and later.error is not None:
            later = Stop(tuple(c for c in later.causes if c[0] not in _FAILING))
        seen = {cause for cause, _ in self.causes}
        added = tuple(c for c in later.causes if c[0] not in seen)
        return Stop(self.causes + added, self.error or later.error)

    def reason(self, cause: Cause) -> Why | None:
        """Why `cause` stopped the run; None when it did not."""
        return next((why for met, why in self.causes if met is cause), None)

    @property
    def cause(self) -> Cause:
        """The cause whose code the run ends with: by `errors.PRECEDENCE`, the
        first of a tie."""
        return max((met for met, _ in self.causes), key=lambda c: rank(_CODE[c]))

    @property
    def code(self) -> Exit:
        """The code the stop alone ends a run with."""
        return _CODE[self.cause]


_FAILING = (Cause.LEDGER_LOST, Cause.STATE)


def exit_code(stop: Stop | None, *, failed: int, left: int) -> Exit:
    """The code a run ends with, stopped by `stop` (None: it was not) with
    `failed` jobs failed or unknown and `left` to send: of the stop's, `FAILED`
    if any failed, `STOPPED` if any are left and `OK`, the one that
    `errors.PRECEDENCE` puts last."""
    codes = [
        Exit.OK,
        *([] if stop is None else [stop.code]),
        *([Exit.FAILED] if failed else []),
        *([Exit.STOPPED] if left else []),
    ]
    return max(codes, key=rank)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a submission ended: its exit code, why it stopped early (None: it did
    not), and the jobs left to send and unknown in its store."""

    code: Exit
    stop: Stop | None = None
    left: int = 0
    unknown: int = 0


def ending(store: RunStore, stop: Stop | None) -> Ending:
    """How a run stopped by `stop` ended, by the store's counts."""
    counts = store.counts()
    by_state = {s: sum(n for (_, st), n in counts.items() if st is s) for s in Status}
    left = by_state[Status.PENDING] + by_state[Status.IN_FLIGHT]
    unknown = by_state[Status.UNKNOWN]
    failed = by_state[Status.FAILED] + unknown
    code = exit_code(stop, failed=failed, left=left)
    return Ending(code, stop, left=left, unknown=unknown)
