"""Where send times live: the `Ledger` protocol, and the in-memory ledger.

A ledger records every request of a key from the moment its slot is granted until its
answer arrives, and grants a slot only if `slots.earliest_slot` allows it now. Check
and record happen in one step (`reserve`), so that every sender drawing on one ledger
shares one budget. `MemoryLedger` serves one process; `sqlite_ledger.SqliteLedger`
every process of a client on the machine.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from batchrun.core.limits import Pace, Rule
from batchrun.pacing.slots import Grant, Usage, Wait, earliest_slot


class Ledger(Protocol):
    """The send log of one client, shared by everything that sends for it."""

    def reserve(self, key: str, rule: Rule, pace: Pace, now: float) -> Grant | Wait:
        """Atomically grant and record a slot for `key` at `now`, or say when."""
        ...

    def release(self, ticket: int, now: float, *, sent: bool = True) -> None:
        """Record that the request of `ticket` ended: it counts until `now` (its
        answer, or the latest moment it can have arrived, which may be past);
        `sent=False`: it never reached the server (no connection was made), so it
        takes no room in any window, as if never granted.

        A shared ledger may write it with its next reserve, or at `close`.
        """
        ...

    def close(self) -> None:
        """Write what is not yet written; the ledger is not used after."""
        ...

    def usage(self, key: str, rule: Rule) -> Usage:
        """The key's history as the pacer sees it (for status and plans)."""
        ...

    def recall(self, key: str) -> str | None:
        """The text last remembered for `key` (a learned limit), if any."""
        ...

    def remember(self, key: str, text: str) -> None:
        """Keep an opaque text for `key` for later runs (at least 30 days)."""
        ...


@dataclass(slots=True)
class _KeyLog:
    """One key's history in memory: a `slots.History`."""

    finished: list[float] = field(default_factory=list)
    in_flight: int = 0
    last_start: float | None = None


class MemoryLedger:
    """One process's ledger: per key, the newest completions and the in-flight count.

    Only the last `rule.deepest` completions can bind; it keeps twice that, as
    a key's rule changes as the learner decides (every rule it paces by keeps
    the given rule's windows, or stricter ones).
    """

    def __init__(self) -> None:
        self._logs: defaultdict[str, _KeyLog] = defaultdict(_KeyLog)
        self._tickets: dict[int, str] = {}
        self._last_ticket = 0
        self._learned: dict[str, str] = {}

    def reserve(self, key: str, rule: Rule, pace: Pace, now: float) -> Grant | Wait:
        log = self._logs[key]
        if len(log.finished) > 2 * rule.deepest:
            del log.finished[: -2 * rule.deepest]
        slot = earliest_slot(log, rule, pace)
        if slot is None or slot > now:
            return Wait(slot)
        log.in_flight += 1
        log.last_start = now
        self._last_ticket = ticket = self._last_ticket + 1
        self._tickets[ticket] = key
        return Grant(ticket)

    def release(self, ticket: int, now: float, *, sent: bool = True) -> None:
        log = self._logs[self._tickets.pop(ticket)]
        log.in_flight -= 1
        if not sent:
            return
        # Completions arrive in time order, unless the clock stepped back.
        if log.finished and now < log.finished[-1]:
            bisect.insort(log.finished, now)
        else:
            log.finished.append(now)

    def usage(self, key: str, rule: Rule) -> Usage:
        log = self._logs[key]
        return Usage(log.in_flight, log.finished, log.last_start)

    def recall(self, key: str) -> str | None:
        return self._learned.get(key)

    def remember(self, key: str, text: str) -> None:
        self._learned[key] = text

    def close(self) -> None:
        pass
