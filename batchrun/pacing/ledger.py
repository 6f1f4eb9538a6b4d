"""Where send times live: the `Ledger` protocol, and the in-memory ledger.

A ledger records every request of a key from the moment its slot is granted until its
answer arrives, and grants a slot only if `slots.earliest_slot` allows it now. Check
and record happen in one step (`reserve`), so that every sender drawing on one ledger
shares one budget. `MemoryLedger` serves one process; `sqlite_ledger.SqliteLedger`
every process of a client on the machine.

A request in flight holds a lease: past its expiry (its start plus a hold), it
counts as answered then, until its answer says when it counts until. The hold is
the request timeout, or shorter where the pacer knows the request has surely
been counted by then (`arrival.ArrivalBound.hold`). `KeyHistory` keeps one key's
requests so.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from batchrun.core.limits import Pace, Rule
from batchrun.pacing.slots import Grant, Usage, Wait, earliest_slot, reach


class Ledger(Protocol):
    """The send log of one client, shared by everything that sends for it."""

    def reserve(
        self, key: str, rule: Rule, pace: Pace, now: float, hold: float | None = None
    ) -> Grant | Wait:
        """Atomically grant and record a slot for `key` at `now`, or say when.
        `hold`: the request's lease, if shorter than the ledger's own."""
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
class KeyHistory:
    """One key's requests: a `slots.History` with leases.

    `open` maps each unanswered request to its lease's expiry; one past its
    expiry counts as answered then (`lapsed`) until its real answer, if any,
    replaces it.
    """

    open: dict[int, float] = field(default_factory=dict)
    lapsed: dict[int, float] = field(default_factory=dict)
    finished: list[float] = field(default_factory=list)
    last_start: float = -math.inf

    def sent(self, ticket: int, start: float, expires: float) -> None:
        self.open[ticket] = expires
        self.last_start = max(self.last_start, start)

    def answered(self, ticket: int, end: float) -> None:
        self.open.pop(ticket, None)
        expired = self.lapsed.pop(ticket, None)
        if expired is not None:
            at = bisect.bisect_left(self.finished, expired)
            if at < len(self.finished) and self.finished[at] == expired:
                del self.finished[at]
        bisect.insort(self.finished, end)

    def withdrawn(self, ticket: int) -> None:
        """The request of `ticket` never reached the server: it holds no room
        (unless its lease already lapsed into the history: then it stays)."""
        self.open.pop(ticket, None)
        self.lapsed.pop(ticket, None)

    def next_expiry(self) -> float | None:
        """When the next lease of a request in flight expires; None: none does."""
        expires = min(self.open.values(), default=math.inf)
        return None if math.isinf(expires) else expires

    def usage(self, rule: Rule, now: float, horizon: float | None = None) -> Usage:
        """The key's history at `now`: leases past their expiry lapse into it.
        Before a `horizon` (a history lost then), every window is read as full."""
        for ticket, expires in list(self.open.items()):
            if expires <= now:
                del self.open[ticket]
                self.lapsed[ticket] = expires
                bisect.insort(self.finished, expires)
        # Twice the depth: a key's rule changes as the learner decides, and
        # a deeper one after a shallower still finds its window's requests.
        del self.finished[: -2 * rule.deepest]
        last = self.last_start if self.last_start > -math.inf else None
        finished: list[float] = self.finished
        if horizon is not None and now < horizon + reach(rule):
            # Before the horizon the history is lost: read it as full windows.
            finished = sorted([horizon] * rule.deepest + finished)[-rule.deepest :]
        return Usage(len(self.open), finished, last)


class MemoryLedger:
    """One process's ledger: per key, its `KeyHistory`; a request's lease lasts
    as long as it is held (by default until its answer).

    Only the last `rule.deepest` completions can bind; it keeps twice that, as
    a key's rule changes as the learner decides (every rule it paces by keeps
    the given rule's windows, or stricter ones). Its clock is its callers': it
    reads a key's usage at the latest moment it was given.
    """

    def __init__(self) -> None:
        self._logs: defaultdict[str, KeyHistory] = defaultdict(KeyHistory)
        self._tickets: dict[int, str] = {}
        self._last_ticket = 0
        self._learned: dict[str, str] = {}
        self._now = -math.inf

    def reserve(
        self, key: str, rule: Rule, pace: Pace, now: float, hold: float | None = None
    ) -> Grant | Wait:
        self._now = max(self._now, now)
        log = self._logs[key]
        slot = earliest_slot(log.usage(rule, now), rule, pace)
        if slot is None:
            # Every slot waits on an answer, or on a lease's expiry.
            return Wait(log.next_expiry())
        if slot > now:
            return Wait(slot)
        self._last_ticket = ticket = self._last_ticket + 1
        self._tickets[ticket] = key
        log.sent(ticket, now, math.inf if hold is None else now + hold)
        return Grant(ticket)

    def release(self, ticket: int, now: float, *, sent: bool = True) -> None:
        log = self._logs[self._tickets.pop(ticket)]
        if sent:
            log.answered(ticket, now)
        else:
            log.withdrawn(ticket)

    def usage(self, key: str, rule: Rule) -> Usage:
        return self._logs[key].usage(rule, self._now)

    def recall(self, key: str) -> str | None:
        return self._learned.get(key)

    def remember(self, key: str, text: str) -> None:
        self._learned[key] = text

    def close(self) -> None:
        pass
