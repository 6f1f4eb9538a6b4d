"""Oracles: plain, slow readings to check fast code by. Nothing in batchrun decides
by them; the tests and the benchmarks both do.

What a server saw: `most_in_window` and `max_in_window`, the most arrivals within
any half-open window.

The server-ideal makespan: the best any client could do under the SERVER's rule.

An oracle client knows the stock limiter's real algorithm and sends each job at
the first millisecond that algorithm accepts it, at zero latency, never refused.
Its makespan runs from its first send to its last accepted answer (nginx without
`nodelay` holds an accepted request before answering it). Time is whole
milliseconds, as nginx counts it, so no float rounding decides a boundary.

Each model copies its limiter's arithmetic as read in its source:

- `SlidingLog`: limits' moving window (a log of accepted hits per window);
- `FixedFromFirst`: limits' fixed window on MemoryStorage and express-rate-limit's
  MemoryStore: a window of W opens at the first hit after the last one expired;
- `WeightedCounter`: limits' sliding-window counter: windows aligned on the Unix
  epoch, accepted if floor(previous x its remaining share + current) + 1 <= COUNT;
- `LeakyBucket`: nginx `limit_req`: `excess` in thousandths of a request, leaking
  RATE per second, refused above BURST; delayed by excess/RATE without `nodelay`.
"""

from __future__ import annotations

import math
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Protocol

from batchrun.core.limits import LimitKey
from batchrun.sandbox.app import Sandbox

_HORIZON_MS = 3_600_000


class Model(Protocol):
    """A server limiter's state: take one request at `t` ms if it would accept it."""

    def take(self, t: int) -> int | None:
        """The answer time (ms) if accepted at `t` (and counted), else None."""
        ...


@dataclass
class SlidingLog:
    """Sliding windows: fewer than COUNT accepted in (t - W, t] for every window."""

    windows: list[tuple[int, int]]  # (count, window ms)
    log: list[int] = field(default_factory=list)

    def take(self, t: int) -> int | None:
        for count, width in self.windows:
            if sum(1 for at in self.log if at > t - width) >= count:
                return None
        self.log.append(t)
        return t


@dataclass
class FixedFromFirst:
    """A fixed window that opens at the first hit after the previous one expired."""

    count: int
    width: int
    opened: int | None = None
    hits: int = 0

    def take(self, t: int) -> int | None:
        if self.opened is None or t >= self.opened + self.width:
            self.opened, self.hits = t, 0
        if self.hits >= self.count:
            return None
        self.hits += 1
        return t


@dataclass
class WeightedCounter:
    """Epoch-aligned counters, the previous one weighted by its remaining share."""

    count: int
    width: int
    phase: int  # the Unix time (ms) of t = 0, modulo nothing: windows align on it
    hits: dict[int, int] = field(default_factory=dict)

    def take(self, t: int) -> int | None:
        now = self.phase + t
        current = now // self.width
        previous = self.hits.get(current - 1, 0)
        share = (self.width - now % self.width) / self.width if previous else 0.0
        if math.floor(previous * share + self.hits.get(current, 0)) + 1 > self.count:
            return None
        self.hits[current] = self.hits.get(current, 0) + 1
        return t


@dataclass
class LeakyBucket:
    """nginx `limit_req rate=RATEr/s burst=BURST [nodelay]` (ngx_http_limit_req)."""

    rate: int  # requests per second
    burst: int
    nodelay: bool
    excess: int = 0
    last: int | None = None

    def take(self, t: int) -> int | None:
        excess = 0
        if self.last is not None:
            excess = max(0, self.excess - self.rate * (t - self.last) + 1000)
        if excess > self.burst * 1000:
            return None
        self.excess = excess
        # nginx moves `last` only when whole milliseconds passed (`if (ms)`).
        if self.last is None or t != self.last:
            self.last = t
        return t if self.nodelay else t + excess // self.rate


def makespan(model: Model, jobs: int) -> float:
    """Seconds from the oracle's first send to its last accepted answer."""
    t, last = 0, 0
    for _ in range(jobs):
        answered = model.take(t)
        while answered is None:
            t += 1
            if t > _HORIZON_MS:
                msg = "the oracle found no slot within an hour: is the model sane?"
                raise RuntimeError(msg)
            answered = model.take(t)
        last = max(last, answered)
    return last / 1000


def max_in_window(
    sandbox: Sandbox,
    key: LimitKey,
    seconds: float,
    *,
    statuses: Container[int] | None = None,
) -> int:
    """The most arrivals of `key` at `sandbox` (with one of `statuses`, if given)
    within any half-open interval of `seconds`."""
    times = sorted(
        a.at
        for a in list(sandbox.arrivals)
        if a.key is key and (statuses is None or a.status in statuses)
    )
    return most_in_window(times, seconds)


def most_in_window(times: list[float], seconds: float) -> int:
    """The most of the sorted `times` within any half-open interval of `seconds`."""
    best = low = 0
    for high, moment in enumerate(times):
        while times[low] + seconds <= moment:
            low += 1
        best = max(best, high - low + 1)
    return best
