"""The run's circuit breaker: answers that say every request will fail the same way.

`TRIP_AFTER` requests in a row that met a configuration fault (`Outcome.fault`:
the token refused with 401 or 403, a TLS certificate or handshake refused, a proxy
refusing), or that never reached the server (no such name, connection refused,
no connection within the timeout), stop the run: every other job would end the
same way, at the paced rate, using the budget. Any other answer resets the count:
a 403 that says it is a rate limit (`Kind.RATE_LIMITED`) is the server asking to
wait, as a 429 does, not a refused token. When it trips, it tells the cause, how
many requests met it and the last one's error (`Tripped`); the command line
names the fix, and what is left to send.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchrun.api.outcome import Kind, Outcome

# Consecutive requests failing the same way that stop a run.
TRIP_AFTER = 5


@dataclass(frozen=True, slots=True)
class Tripped:
    """Why the breaker tripped: the last `count` requests met `cause` (a
    configuration fault, `Outcome.fault`, or "network": they never reached the
    server); `error`, the last one's."""

    cause: str
    count: int
    error: str | None


class Breaker:
    """Counts requests in a row that failed the same way; says why when it trips."""

    def __init__(self, *, trip_after: int = TRIP_AFTER) -> None:
        self._trip_after = trip_after
        self._cause: str | None = None
        self._count = 0
        self.tripped: Tripped | None = None

    def answered(self, outcome: Outcome) -> Tripped | None:
        """Count `outcome`; why the run should stop, the first time it trips."""
        cause = _cause(outcome)
        if cause is None:
            self._cause, self._count = None, 0
            return None
        self._count = self._count + 1 if cause == self._cause else 1
        self._cause = cause
        if self._count < self._trip_after or self.tripped is not None:
            return None
        self.tripped = Tripped(cause, self._count, outcome.error)
        return self.tripped


def _cause(outcome: Outcome) -> str | None:
    if outcome.kind is Kind.RATE_LIMITED:
        return None
    if outcome.fault is not None:
        return outcome.fault
    return None if outcome.reached else "network"
