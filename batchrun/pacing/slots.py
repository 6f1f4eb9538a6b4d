"""The slot rule as pure math: when may the next request of a key leave?

The rule that keeps every reading of the limits safe (fixed or sliding windows,
counted at arrival, whatever the network latency):

    A request of key K may be sent at time s only if fewer than COUNT earlier
    requests of K are still in flight or count until after s - WINDOW,
    for every window of K's rule.

A request counts until its answer, or, when the server's work on it is taken to
last at least F, until F before its answer (`arrival`: the key's floor, and the
assumptions it rests on); either way no earlier than the server counted it. On
such a key, one still in flight counts as in flight until its lease lapses, then
until that moment (`ledger`: a lease per request).

Why: two requests that fall in one server window arrived less than WINDOW apart; the
earlier one counted until no earlier than its arrival, so the later one counted it.
Hence the earliest send time is `the COUNT-th most recent "counts until" + WINDOW`
(in-flight requests count as the most recent), over all windows. Every request sent
counts, whatever its answer: a 429 may count on the server too. A "completion" below
is that "counts until" moment.

`earliest_slot` is that computation as a pure function of a key's `History`;
`eta` simulates it forward. Ledgers and the pacer build on these values and never
the other way round.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from batchrun.core.limits import Pace, Rule, Window

# Past this many requests, `eta` extrapolates at the long-run rate instead of
# simulating each one; the greedy schedule is periodic long before that.
_ETA_SIMULATED = 5000
# `spread` keeps starts the larger of 1 % and 5 ms more than the interval apart:
# a server that decides on its own clock with no burst allowance (nginx's leaky
# bucket, in whole milliseconds) refuses an arrival that transit jitter, or its
# rounding, brought a millisecond early. The 5 ms are real time, never scaled.
SPREAD_MARGIN = 0.01
SPREAD_MARGIN_SECONDS = 0.005
# A bucket's reading (`paced`) counts on answers, so transit jitter cannot bring
# an arrival early; its margin covers the server's clock: nginx floors to the
# millisecond and drains whole thousandths of a request.
_LEAK_MARGIN_SECONDS = 0.002


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
    `spread_interval(rule)` apart, start to start.
    """
    slot = -math.inf
    finished, in_flight = usage.finished, usage.in_flight
    for window in paced(rule):
        needed = window.count - in_flight
        if needed <= 0:
            return None
        if len(finished) >= needed:
            slot = max(slot, finished[-needed] + window.seconds)
    if pace is Pace.SPREAD and usage.last_start is not None:
        slot = max(slot, usage.last_start + spread_interval(rule))
    return slot


def spread_interval(rule: Rule) -> float:
    """Seconds from one start to the next at `spread`: the rule's binding interval
    and a margin (`SPREAD_MARGIN`, at least `SPREAD_MARGIN_SECONDS`)."""
    return rule.interval + max(rule.interval * SPREAD_MARGIN, SPREAD_MARGIN_SECONDS)


@functools.cache
def paced(rule: Rule) -> tuple[Window, ...]:
    """The windows the slot rule keeps for `rule`: its own, and for a leaky bucket's
    `burst` B, with T the interval of its shortest window (COUNT/W) made 1 %
    longer and m = 2 ms, the windows B + k per k * T + m, for k = 1 ..
    COUNT - B - 1, and COUNT per COUNT * T + m.

    Kept like any window (sent after the answer of the (B + k)-th latest, plus k
    intervals), they hold any n arrivals in a row at least (n - B - 1) * T
    apart, plus m, whatever the latency: a bucket that drains one per T, and let
    B + 1 through at once, has room for each, with the margins for its rounding
    (nginx floors its clock to the millisecond, its rate to whole thousandths a
    second, and what drains to whole thousandths of a request).
    """
    if rule.burst is None:
        return rule.windows
    base, step, more = rule.shortest, _drain(rule), _LEAK_MARGIN_SECONDS
    last = base.count - rule.burst
    leak = [Window(rule.burst + k, k * step + more) for k in range(1, last)]
    return (*leak, Window(base.count, base.count * step + more), *rule.windows)


def _drain(rule: Rule) -> float:
    """A bucket reading's interval T: its shortest window's, made 1 % longer."""
    base = rule.shortest
    return base.seconds / base.count * (1 + SPREAD_MARGIN)


def reach(rule: Rule) -> float:
    """How far back the slot rule looks for `rule`: its longest paced window."""
    return max(w.seconds for w in paced(rule))


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
    # A bucket's reading holds a window per request of its burst's window.
    simulated = _ETA_SIMULATED * len(rule.windows) // len(paced(rule))
    for _ in range(min(count, simulated)):
        slot = earliest_slot(Usage(0, history, last), rule, pace)
        moment = max(moment, slot if slot is not None else moment)
        history.append(moment)
        last = moment
    step = spread_interval(rule) if pace is Pace.SPREAD else rule.interval
    if rule.burst is not None:
        # The long-run pace of `paced`'s COUNT per COUNT * T + m.
        step = max(step, _drain(rule) + _LEAK_MARGIN_SECONDS / rule.shortest.count)
    return moment + max(0, count - simulated) * step
