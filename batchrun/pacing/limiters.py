"""The server side of a limit: the ways real servers count requests, as models.

Each model is built from a `Rule` (all its windows hold at once) and answers
`admit(client, key, now)`: None when the request is accepted (and counted), else the
seconds until one would be (what the server puts in Retry-After). State is kept per
client and key. The models, and their invariants:

- `SlidingLog`: at most COUNT accepted arrivals in any half-open (t - W, t];
  refused ones do not count (the sandbox's model), unless `count_refused` (a Redis
  sorted set that adds each arrival before it counts them).
- `FixedWindow`: at most COUNT counted arrivals per window aligned to `origin` + k W;
  `count_refused` counts refused ones too (express-rate-limit's memory store).
- `WeightedCounter`: refuses while previous window's count x (1 - elapsed
  fraction) + current window's count >= COUNT (Cloudflare, API gateways).
- `LeakyBucket`: nginx `limit_req ... nodelay`, a GCRA at COUNT/W per second with
  `burst` extra, decided in whole milliseconds as nginx does.

`quotas(client, key, now)` reads a model's state without changing it: one `Quota`
per stated window (for a leaky bucket, the window its burst amounts to), with the
requests it would still accept now and the seconds until it regains one (with none
left: until one more is accepted, the wait `admit` gives). The sandbox states these
in rate-limit header fields.

Pure and stdlib only, so tests, benches and the sandbox can all drive them.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from batchrun.core.limits import Rule, Window

# nginx counts the bucket in thousandths of a request, on a millisecond clock.
_MILLI = 1000


class LimiterKind(StrEnum):
    """How a server counts: the models `make_limiter` builds."""

    SLIDING = "sliding"
    FIXED = "fixed"
    WEIGHTED = "weighted"
    LEAKY = "leaky"


@dataclass(frozen=True, slots=True)
class Quota:
    """One stated window's state for a client and key (see the module docstring).

    `remaining` requests would be accepted now, one after another; `reset` is the
    seconds until the window regains one, or with none left, until one more fits.
    """

    window: Window
    remaining: int
    reset: float


class Limiter(Protocol):
    """A server's limit on every client and key (see the module docstring)."""

    @property
    def policy(self) -> str:
        """How it counts, in words, e.g. `fixed windows 10/2s (refused count)`."""
        ...

    def admit(self, client: str, key: str, now: float) -> float | None:
        """None if a request arriving `now` is accepted, else seconds until it is."""
        ...

    def quotas(self, client: str, key: str, now: float) -> tuple[Quota, ...]:
        """Each stated window's state `now`; changes nothing."""
        ...

    def replay(self, client: str, key: str, now: float, *, accepted: bool) -> bool:
        """Whether the model would accept an arrival `now`; then count it as the
        real server did: `accepted`, or refused (counted only where the model
        counts refusals). A learner replays a log of answers this way."""
        ...

    def room(self, client: str, key: str, now: float) -> int:
        """How many more requests it would accept now: the least `remaining`
        of `quotas`, read without the resets."""
        ...


@dataclass(slots=True, kw_only=True)
class SlidingLog:
    """At most COUNT counted arrivals within any (t - W, t]: accepted ones, and with
    `count_refused` refused ones too (a Redis sorted set that adds before it counts).

    An arrival at `a` counts while `a + W > t`, summed in floats as the pacer sums
    its slots.
    """

    rule: Rule
    count_refused: bool = False
    _logs: defaultdict[tuple[str, str], deque[float]] = field(
        default_factory=lambda: defaultdict(deque), init=False, repr=False
    )

    @property
    def policy(self) -> str:
        refused = ", refused count" if self.count_refused else ""
        return f"sliding log {self.rule}{refused}"

    def admit(self, client: str, key: str, now: float) -> float | None:
        log = self._logs[(client, key)]
        while log and log[0] + self.rule.longest <= now:
            log.popleft()
        wait = _sliding_wait(log, self.rule, now)
        if wait is None or self.count_refused:
            bisect.insort(log, now)  # at the end, unless told of an earlier one
        return wait

    def replay(self, client: str, key: str, now: float, *, accepted: bool) -> bool:
        log = self._logs[(client, key)]
        while log and log[0] + self.rule.longest <= now:
            log.popleft()
        fits = _sliding_wait(log, self.rule, now) is None
        if accepted or self.count_refused:
            bisect.insort(log, now)
        return fits

    def room(self, client: str, key: str, now: float) -> int:
        log = self._logs.get((client, key), deque())
        left = [
            w.count - len(log) + _first_inside(log, w, now) for w in self.rule.windows
        ]
        return max(0, min(left))

    def quotas(self, client: str, key: str, now: float) -> tuple[Quota, ...]:
        log = self._logs.get((client, key), deque())
        quotas = []
        for window in self.rule.windows:
            first = _first_inside(log, window, now)
            inside = len(log) - first
            left = max(0, window.count - inside)
            # The oldest arrival that holds room leaves first; with none left,
            # the count-th newest.
            oldest = log[first + max(0, inside - window.count)] if inside else now
            quotas.append(Quota(window, left, max(0.0, oldest + window.seconds - now)))
        return tuple(quotas)


def _first_inside(log: deque[float], window: Window, now: float) -> int:
    """The index of the oldest arrival of `log` (ascending) still inside
    `window` at `now` (`t + W > now`, the sum the pacer makes; monotone in t)."""
    return bisect.bisect_right(log, now, key=lambda t: t + window.seconds)


def _sliding_wait(log: deque[float], rule: Rule, now: float) -> float | None:
    """None if one more request fits every window now, else seconds until it does."""
    wait = None
    for window in rule.windows:
        inside = len(log) - _first_inside(log, window, now)
        if inside >= window.count:
            # It fits once the count-th newest arrival has left the window.
            leaves = log[len(log) - window.count] + window.seconds - now
            wait = max(wait or 0.0, leaves)
    return wait


def _index(window: Window, origin: float, now: float) -> int:
    """Which aligned window `now` falls in: k for [origin + k W, origin + (k+1) W)."""
    return math.floor((now - origin) / window.seconds)


@dataclass(slots=True, kw_only=True)
class FixedWindow:
    """At most COUNT counted arrivals per aligned window, for every window of the rule.

    Windows start at `origin` + k W. With `count_refused`, every arrival counts
    (express-rate-limit increments before it checks); otherwise only accepted ones.
    """

    rule: Rule
    origin: float = 0.0
    count_refused: bool = False
    # (client, key, window position) -> (aligned index, count in it)
    _counts: dict[tuple[str, str, int], tuple[int, int]] = field(
        default_factory=dict, init=False, repr=False
    )

    @property
    def policy(self) -> str:
        refused = ", refused count" if self.count_refused else ""
        return f"fixed windows {self.rule} (from {self.origin:g}{refused})"

    def admit(self, client: str, key: str, now: float) -> float | None:
        wait, slots = self._judge(client, key, now)
        if wait is None or self.count_refused:
            self._count(slots)
        return wait

    def replay(self, client: str, key: str, now: float, *, accepted: bool) -> bool:
        wait, slots = self._judge(client, key, now)
        if accepted or self.count_refused:
            self._count(slots)
        return wait is None

    def _judge(
        self, client: str, key: str, now: float
    ) -> tuple[float | None, list[tuple[tuple[str, str, int], int, int]]]:
        wait = None
        slots = []
        for position, window in enumerate(self.rule.windows):
            index = _index(window, self.origin, now)
            slot = (client, key, position)
            seen, count = self._counts.get(slot, (index, 0))
            count = count if seen == index else 0
            slots.append((slot, index, count))
            if count >= window.count:
                ends = self.origin + (index + 1) * window.seconds
                wait = max(wait or 0.0, ends - now)
        return wait, slots

    def _count(self, slots: list[tuple[tuple[str, str, int], int, int]]) -> None:
        for slot, index, count in slots:
            self._counts[slot] = (index, count + 1)

    def room(self, client: str, key: str, now: float) -> int:
        left = []
        for position, window in enumerate(self.rule.windows):
            index = _index(window, self.origin, now)
            seen, count = self._counts.get((client, key, position), (index, 0))
            left.append(window.count - (count if seen == index else 0))
        return max(0, min(left))

    def quotas(self, client: str, key: str, now: float) -> tuple[Quota, ...]:
        quotas = []
        for position, window in enumerate(self.rule.windows):
            index = _index(window, self.origin, now)
            seen, count = self._counts.get((client, key, position), (index, 0))
            left = window.count - (count if seen == index else 0)
            ends = self.origin + (index + 1) * window.seconds
            quotas.append(Quota(window, max(0, left), ends - now))
        return tuple(quotas)


@dataclass(slots=True, kw_only=True)
class WeightedCounter:
    """Refuses while, for some window, previous count x (1 - elapsed fraction of the
    current aligned window) + current count >= COUNT; refused ones not counted.

    The estimate never rises between arrivals, and is continuous across a window's
    end, so the wait is exact: when every window's estimate drops below COUNT.
    """

    rule: Rule
    origin: float = 0.0
    # (client, key, window position) -> {aligned index: accepted count}
    _counts: defaultdict[tuple[str, str, int], dict[int, int]] = field(
        default_factory=lambda: defaultdict(dict), init=False, repr=False
    )

    @property
    def policy(self) -> str:
        return f"weighted counter {self.rule} (from {self.origin:g})"

    def admit(self, client: str, key: str, now: float) -> float | None:
        wait = self._judge(client, key, now)
        if wait is None:
            self._count(client, key, now)
        return wait

    def replay(self, client: str, key: str, now: float, *, accepted: bool) -> bool:
        wait = self._judge(client, key, now)
        if accepted:
            self._count(client, key, now)
        return wait is None

    def _judge(self, client: str, key: str, now: float) -> float | None:
        wait = None
        for position, window in enumerate(self.rule.windows):
            counts = self._counts[(client, key, position)]
            index = _index(window, self.origin, now)
            start = self.origin + index * window.seconds
            previous, current = counts.get(index - 1, 0), counts.get(index, 0)
            elapsed = (now - start) / window.seconds
            if previous * (1 - elapsed) + current >= window.count:
                below = _weighted_below(window, start, previous, current)
                wait = max(wait or 0.0, below - now)
        return wait

    def _count(self, client: str, key: str, now: float) -> None:
        for position, window in enumerate(self.rule.windows):
            counts = self._counts[(client, key, position)]
            index = _index(window, self.origin, now)
            counts[index] = counts.get(index, 0) + 1
            for old in [i for i in counts if i < index - 1]:
                del counts[old]

    def _estimate(
        self, client: str, key: str, position: int, now: float
    ) -> tuple[float, float, int, int]:
        """A window's estimate at `now`: it, the aligned window's start, and
        the previous and current windows' counts."""
        window = self.rule.windows[position]
        counts = self._counts.get((client, key, position), {})
        index = _index(window, self.origin, now)
        start = self.origin + index * window.seconds
        previous, current = counts.get(index - 1, 0), counts.get(index, 0)
        estimate = previous * (1 - (now - start) / window.seconds) + current
        return estimate, start, previous, current

    def room(self, client: str, key: str, now: float) -> int:
        left = [
            math.ceil(window.count - self._estimate(client, key, position, now)[0])
            for position, window in enumerate(self.rule.windows)
        ]
        return max(0, min(left))

    def quotas(self, client: str, key: str, now: float) -> tuple[Quota, ...]:
        quotas = []
        for position, window in enumerate(self.rule.windows):
            estimate, start, previous, current = self._estimate(
                client, key, position, now
            )
            # Accepted while estimate + k < COUNT, for the k-th more request.
            left = max(0, math.ceil(window.count - estimate))
            reset = 0.0
            if left < window.count:
                # One more left: the estimate is below COUNT - left.
                target = Window(window.count - left, window.seconds)
                below = _weighted_below(target, start, previous, current)
                reset = max(0.0, below - now)
            quotas.append(Quota(window, left, reset))
        return tuple(quotas)


def _weighted_below(window: Window, start: float, previous: int, current: int) -> float:
    """From when on (with no more arrivals) a refusing estimate is below COUNT.

    Below COUNT in the current window, only the previous window's weight refuses,
    so `previous` > 0 there.
    """
    if current >= window.count:
        # Only in the next window, once this window's weight has decayed enough.
        return start + window.seconds * (2 - window.count / current)
    room = window.count - current
    return start + window.seconds * (1 - room / previous)


@dataclass(slots=True, kw_only=True)
class LeakyBucket:
    """nginx `limit_req rate=COUNT/W burst=B nodelay`, decided in whole milliseconds.

    Per client and key, nginx keeps `excess` (thousandths of a request beyond the
    rate) and the millisecond of the last accepted request. An arrival at ms `m`
    computes `excess - rate * (m - last) // 1000 + 1000`, floored at 0, and is refused
    if that exceeds `burst * 1000`. `rate` is thousandths of a request per second,
    rounded down as nginx parses `30r/m` to 500. The rule's binding window sets it.
    """

    rule: Rule
    burst: int = 0
    _rate: int = field(init=False, repr=False)
    # (client, key) -> (excess, last accepted millisecond)
    _state: dict[tuple[str, str], tuple[int, int]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.burst < 0:
            msg = f"a leaky bucket's burst must be at least 0, got {self.burst}"
            raise ValueError(msg)
        # nginx holds one rate per zone: the rule's binding long-run rate.
        rates = (w.count * _MILLI / w.seconds for w in self.rule.windows)
        self._rate = math.floor(min(rates))
        if self._rate < 1:
            msg = f"nginx cannot express a rate as slow as {self.rule}"
            raise ValueError(msg)

    @property
    def policy(self) -> str:
        rate = self._rate / _MILLI
        return f"leaky bucket {rate:g}/s burst {self.burst} (nginx, ms clock)"

    def replay(self, client: str, key: str, now: float, *, accepted: bool) -> bool:
        ms = math.floor(now * _MILLI)
        state = self._state.get((client, key))
        level = 0
        if state is not None:
            excess, last = state
            level = max(0, excess - self._rate * (ms - last) // _MILLI + _MILLI)
        if accepted:  # nginx counts only what it lets through
            self._state[(client, key)] = (level, ms)
        return level <= self.burst * _MILLI

    def admit(self, client: str, key: str, now: float) -> float | None:
        ms = math.floor(now * _MILLI)
        state = self._state.get((client, key))
        if state is None:
            self._state[(client, key)] = (0, ms)  # nginx: a new node starts empty
            return None
        excess, last = state
        level = max(0, excess - self._rate * (ms - last) // _MILLI + _MILLI)
        if level <= self.burst * _MILLI:
            self._state[(client, key)] = (level, ms)
            return None
        # The first millisecond at which enough has drained.
        need = excess + _MILLI - self.burst * _MILLI
        drained_at = last + -(-need * _MILLI // self._rate)
        return drained_at / _MILLI - now

    def room(self, client: str, key: str, now: float) -> int:
        return self.quotas(client, key, now)[0].remaining

    def quotas(self, client: str, key: str, now: float) -> tuple[Quota, ...]:
        """One quota: `burst + 1` requests per `(burst + 1) / rate` seconds rounded
        up to the millisecond, a sliding window any client that keeps it never
        overflows the bucket with (nginx drains in whole thousandths)."""
        room = self.burst + 1
        window = Window(room, -(-room * _MILLI * _MILLI // self._rate) / _MILLI)
        state = self._state.get((client, key))
        if state is None:
            return (Quota(window, room, 0.0),)
        excess, last = state
        ms = math.floor(now * _MILLI)
        level = max(0, excess - self._rate * (ms - last) // _MILLI + _MILLI)
        left = max(0, (self.burst * _MILLI - level) // _MILLI + 1)
        if left >= room:
            return (Quota(window, room, 0.0),)
        # One more left once the bucket holds at most (burst - left - 1) requests.
        need = excess - (self.burst - left - 1) * _MILLI
        drained_at = last + -(-need * _MILLI // self._rate)
        return (Quota(window, left, max(0.0, drained_at / _MILLI - now)),)


def make_limiter(kind: str, rule: Rule, **options: Any) -> Limiter:
    """A server model of `kind` (a `LimiterKind` value) enforcing `rule`.

    Options: `origin` (fixed, weighted), `count_refused` (sliding, fixed), `burst`
    (leaky).
    """
    models: dict[LimiterKind, Any] = {
        LimiterKind.SLIDING: SlidingLog,
        LimiterKind.FIXED: FixedWindow,
        LimiterKind.WEIGHTED: WeightedCounter,
        LimiterKind.LEAKY: LeakyBucket,
    }
    limiter: Limiter = models[LimiterKind(kind)](rule=rule, **options)
    return limiter
