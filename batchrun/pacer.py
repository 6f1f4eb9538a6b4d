"""The exact sliding-window pacer: when may the next request of a key leave?

The rule that keeps every reading of the limits safe (fixed or sliding windows,
counted at arrival, whatever the network latency):

    A request of key K may be sent at time s only if fewer than COUNT earlier
    requests of K are still in flight or got their answer after s - WINDOW,
    for every window of K's rule.

Why: two requests that fall in one server window arrived less than WINDOW apart; the
earlier one arrived before its answer came back, so the later one counted it. Hence
the earliest send time is `completion of the COUNT-th most recent request + WINDOW`
(in-flight requests count as the most recent), over all windows. Every request sent
counts, whatever its answer: a 429 may count on the server too.

`earliest_slot` is that computation as a pure function. `Pacer` grants slots to
waiting senders in FIFO order per key, sleeping (never polling) until the next slot.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

import anyio

from batchrun.clock import Clock
from batchrun.events import EventSink, SlotWait
from batchrun.limits import LimitKey, Rule

if TYPE_CHECKING:
    from batchrun.ledger import Ledger

# Past this many requests, `eta` extrapolates at the long-run rate instead of
# simulating each one; the greedy schedule is periodic long before that.
_ETA_SIMULATED = 5000


class Pace(StrEnum):
    """`exact`: as early as the windows allow; `spread`: evenly at the long-run rate."""

    EXACT = "exact"
    SPREAD = "spread"


class History(Protocol):
    """A key's recent requests, as the pacer reads them (`Usage` is one).

    `finished` holds completion moments in ascending order; only the last
    `rule.deepest` of them matter. `last_start` is the newest send, for `spread`.
    """

    @property
    def in_flight(self) -> int: ...

    @property
    def finished(self) -> Sequence[float]: ...

    @property
    def last_start(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Usage:
    """A key's recent requests as values (see `History`)."""

    in_flight: int
    finished: Sequence[float]
    last_start: float | None = None


@dataclass(slots=True)
class Grant:
    """A slot was granted and recorded as in flight; `release(ticket)` ends it."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Wait:
    """No slot yet: try again at `until`, or after an answer when `until` is None."""

    until: float | None


def earliest_slot(usage: History, rule: Rule, pace: Pace = Pace.EXACT) -> float | None:
    """The earliest moment the next request may leave; None until an answer arrives.

    A moment in the past means "now". With `spread`, requests are also kept
    `rule.interval` apart, start to start.
    """
    slot = -math.inf
    finished, in_flight = usage.finished, usage.in_flight
    for window in rule.windows:
        needed = window.count - in_flight
        if needed <= 0:
            return None
        if len(finished) >= needed:
            slot = max(slot, finished[-needed] + window.seconds)
    if pace is Pace.SPREAD and usage.last_start is not None:
        slot = max(slot, usage.last_start + rule.interval)
    return slot


def eta(
    count: int,
    rule: Rule,
    *,
    now: float,
    pace: Pace = Pace.EXACT,
    recent: Sequence[float] = (),
) -> float:
    """When the last of `count` more requests may leave, at zero latency.

    `recent` holds the send moments of earlier requests (ascending), which still
    occupy the windows. Used for progress ETAs and as the ideal in tests and benches.
    """
    history: deque[float] = deque(recent, maxlen=rule.deepest)
    moment = now
    last = history[-1] if history else None
    for _ in range(min(count, _ETA_SIMULATED)):
        slot = earliest_slot(Usage(0, history, last), rule, pace)
        moment = max(moment, slot if slot is not None else moment)
        history.append(moment)
        last = moment
    return moment + max(0, count - _ETA_SIMULATED) * rule.interval


class Pacer:
    """Grants send slots per key, first come first served, as early as the rule allows.

    Waiting is one sleep until the computed slot, or until an answer of the key
    arrives when in-flight requests fill a window; never polling.
    """

    def __init__(
        self,
        *,
        rules: Mapping[LimitKey, Rule],
        ledger: Ledger,
        clock: Clock,
        pace: Pace = Pace.EXACT,
        sink: EventSink | None = None,
    ) -> None:
        self._rules = dict(rules)
        self._ledger = ledger
        self._clock = clock
        self._pace = pace
        self._sink = sink
        # fast_acquire: an uncontended turn costs no trip through the event loop.
        self._turns = {key: anyio.Lock(fast_acquire=True) for key in self._rules}
        # Made only while a sender sleeps on the key (at most one: turns are FIFO).
        self._answers: dict[LimitKey, anyio.Event] = {}
        self._cool_until = dict.fromkeys(self._rules, -math.inf)

    @property
    def rules(self) -> Mapping[LimitKey, Rule]:
        """The rule of every key this pacer grants slots for."""
        return self._rules

    async def acquire(self, key: LimitKey) -> int:
        """Wait for the next slot of `key`; return the ticket to `release` later."""
        async with self._turns[key]:
            while True:
                wait = self._try(key)
                if isinstance(wait, Grant):
                    return wait.ticket
                self._emit(SlotWait(self._clock.now(), key, wait.until))
                await self._sleep(key, wait.until)

    def release(self, key: LimitKey, ticket: int) -> None:
        """Record the answer of a granted request, waking a sender waiting on it."""
        self._ledger.release(ticket, self._clock.now())
        answer = self._answers.pop(key, None)
        if answer is not None:
            answer.set()

    def cool_down(self, key: LimitKey, until: float) -> None:
        """Grant no slot of `key` before `until` (after a 429 from the server)."""
        self._cool_until[key] = max(self._cool_until[key], until)

    def _try(self, key: LimitKey) -> Grant | Wait:
        now = self._clock.now()
        if now < self._cool_until[key]:
            return Wait(self._cool_until[key])
        return self._ledger.reserve(key, self._rules[key], self._pace, now)

    async def _sleep(self, key: LimitKey, until: float | None) -> None:
        # An answer of this key may open a slot sooner (or the ledger may name a
        # moment only as a bound, e.g. another process's request timing out).
        delay = math.inf if until is None else until - self._clock.now()
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = anyio.Event()
        with anyio.move_on_after(delay):
            await answer.wait()

    def _emit(self, event: SlotWait) -> None:
        if self._sink is not None:
            self._sink.emit(event)
