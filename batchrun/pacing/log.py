"""This process's log of one key's requests (`KeyLog`): when each left, its
answer, what the server was seen to accept, and the probe gate."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from batchrun.core.limits import Rule

# Requests older than the longest candidate window cannot bear on a lesson; past
# this many the oldest are dropped, which bounds the log's memory.
_KEPT = 2000


@dataclass(slots=True)
class Sent:
    """One request of the key: when it left, when its answer came, and whether that
    answer was a 429 (None while unanswered)."""

    start: float
    end: float | None = None
    refused: bool | None = None
    # The Retry-After of a refusal, if the server gave one.
    wait: float | None = None
    # It left past what the server had been seen to accept (`KeyLog.beyond`).
    probe: bool = False
    # The latest moment it can have arrived by the network's bound (its send
    # plus D: `arrival.ArrivalBound.latest`), when that is before its answer;
    # None: by its answer. An estimate for the readings; the pacer counts it
    # longer (the key's floor), allowing for a queue at the server.
    by: float | None = None


@dataclass(slots=True)
class _Accepted:
    """Accepted arrivals (ascending), and the most of them seen within each window
    asked for (`most`), kept up to date as more come."""

    arrivals: list[float] = field(default_factory=list)
    peaks: dict[float, int] = field(default_factory=dict)

    def add(self, moment: float) -> None:
        _bounded_insort(self.arrivals, moment)
        for seconds, count in self.peaks.items():
            within = count_within(self.arrivals, moment, seconds)
            self.peaks[seconds] = max(count, within)

    def most(self, seconds: float) -> int:
        """The most arrivals within any `seconds`: counted from the list the
        first time it is asked for, and kept up to date by `add` from then on."""
        if seconds not in self.peaks:
            self.peaks[seconds] = _most(self.arrivals, seconds)
        return self.peaks[seconds]

    def clear(self) -> None:
        self.arrivals.clear()
        self.peaks.clear()


@dataclass(slots=True)
class KeyLog:
    """This process's recent requests of one key, in the order they left, and what
    the server has been seen to let through.

    `proven(W)` is the most accepted requests seen within any W: in this process
    since the last lesson (`accepted`), or by earlier runs and processes
    (`record`, kept in the ledger). A request that leaves while some window
    already holds that many is a probe. Probes reach the server a few at a
    time (`gated`): no more may be on their way (sent, and neither answered nor
    surely arrived by the network's bound) than the rule's rate fills in that
    time, one at least. So a server stricter than the rule refuses the probes
    of one round, one or two, not a window of them; and probes still go at the
    rule's rate however long the way or the server's work (one at a time, a
    key whose rate is more than one a round never reached its rule: 2.0 x the
    ideal where answers took 0.1 s over 10-50 ms of network).
    """

    sent: deque[Sent] = field(default_factory=lambda: deque(maxlen=_KEPT))
    ends: list[float] = field(default_factory=list)
    accepted: _Accepted = field(default_factory=_Accepted)
    seen: _Accepted = field(default_factory=_Accepted)
    record: dict[float, int] = field(default_factory=dict)
    unanswered: int = 0
    # Probes in flight, in the order they left.
    flying: list[Sent] = field(default_factory=list)

    def started(self, at: float, *, probe: bool = False) -> Sent:
        """Log a request that leaves at `at`; `answered` fills in its answer."""
        entry = Sent(at, probe=probe)
        self.sent.append(entry)
        self.unanswered += 1
        if probe:
            self.flying.append(entry)
        return entry

    def answered(
        self, entry: Sent, at: float, refused: bool | None, by: float | None = None
    ) -> None:
        """Record the answer of `entry` (`refused` None: no answer, e.g. a
        timeout; `by`: the latest moment it can have arrived, if before `at`)."""
        entry.end, entry.refused = at, refused
        entry.by = None if by is None else min(max(by, entry.start), at)
        self.unanswered -= 1
        if entry.probe:
            self.flying.remove(entry)
        _bounded_insort(self.ends, at)
        if refused is False:
            self.accepted.add(arrived(entry))
            self.seen.add(arrived(entry))

    def proven(self, seconds: float) -> int:
        """The most accepted requests the server was seen to let through in W."""
        return max(self.record.get(seconds, 0), self.accepted.most(seconds))

    def beyond(self, lengths: Iterable[float], now: float) -> bool:
        """Whether a window of one of `lengths` already holds as many requests
        as the server has been seen to accept in it: the next one is a probe."""
        for seconds in lengths:
            used = self.unanswered + len(self.ends)
            used -= bisect.bisect_right(self.ends, now - seconds)
            if used >= self.proven(seconds):
                return True
        return False

    def gated(
        self,
        lengths: Iterable[float],
        now: float,
        reach: float | None,
        at_once: int = 1,
    ) -> float | None:
        """When the next request may leave, if it would be a probe while
        `at_once` probes may not have arrived yet: when the first of them surely
        has, `reach` after it left (the network's bound on a request's way to
        the server, from its send), or at its answer (`math.inf`: no bound
        known). None: it may leave now."""
        if reach is None:
            ways = [math.inf for _ in self.flying]
        else:
            ways = [s.start + reach for s in self.flying if s.start + reach > now]
        if len(ways) < at_once or not self.beyond(lengths, now):
            return None
        return min(ways)

    def rearm(self, rule: Rule, lengths: Iterable[float]) -> None:
        """After a lesson the server's state is in doubt: what it was seen to
        accept in each of `lengths` is kept only up to what `rule` (the
        lesson's) lets through in that length."""
        self.record = {
            seconds: min(_allowed(rule, seconds), self.proven(seconds))
            for seconds in lengths
        }
        self.accepted.clear()

    def doubt(self, lengths: Iterable[float], now: float) -> None:
        """A refusal answered `now`: what the server was seen to accept in each
        of `lengths` is proven only up to what the window held then, those it
        accepted and those on their way (it let that many through, not one
        more), until acceptances show more."""
        for seconds in lengths:
            held = self.unanswered + count_within(self.seen.arrivals, now, seconds)
            self.record[seconds] = min(self.proven(seconds), held)
        self.accepted.clear()

    def settled(self, since: float) -> bool:
        """Whether every request that left at or before `since` has its answer."""
        return all(s.end is not None for s in self.sent if s.start <= since)


def _allowed(rule: Rule, seconds: float) -> int:
    """The most requests `rule` lets through within `seconds`."""
    return min(w.count * max(1, math.ceil(seconds / w.seconds)) for w in rule.windows)


def _most(arrivals: list[float], seconds: float) -> int:
    """The most of `arrivals` (ascending) within any `seconds`."""
    return max((count_within(arrivals, m, seconds) for m in arrivals), default=0)


def count_within(arrivals: list[float], moment: float, seconds: float) -> int:
    """How many of `arrivals` (ascending) fall in (moment - seconds, moment]."""
    later = bisect.bisect_right(arrivals, moment)
    return later - bisect.bisect_right(arrivals, moment - seconds)


def _bounded_insort(values: list[float], value: float) -> None:
    bisect.insort(values, value)
    if len(values) > 2 * _KEPT:
        del values[:_KEPT]


def arrived(entry: Sent) -> float:
    """Where a request's arrival is estimated: midway between its send and the
    latest moment it can have arrived (`Sent.by`)."""
    return (entry.start + latest(entry)) / 2


def latest(entry: Sent) -> float:
    """The latest moment `entry` can have arrived: `by`, else its answer, else
    (unanswered) its send."""
    if entry.by is not None:
        return entry.by
    return entry.start if entry.end is None else entry.end
