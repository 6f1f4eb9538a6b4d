"""Reading a server's counter from what it accepted and refused: `read`.

A server that counts in aligned windows (a fixed window: at most COUNT per
[phase + k W, phase + (k+1) W); a weighted counter: the previous window's count
times the share of it still in view, plus the current one, below COUNT) refuses
requests that a sliding log of a count read from a burst lets through: the burst
straddled a reset, so it counted up to twice. Its phase is not known, but the log
narrows it: at each phase a window could start at, the counts the server accepted
and refused at bound COUNT from both sides, a Retry-After names when the count
drops below COUNT again, and a phase that none fits is not the server's.

An arrival is only known to fall between a request's send and its answer: a
request whose round trip spans a reset may have been counted on either side,
and before or after requests whose round trips overlap its own. Each is read at
the count that explains most, and the counts around a reset are taken loosely
(by as many such requests): a count read too high costs one more 429 to
correct, one read too low is never corrected.

A sliding log of COUNT/W holds a fixed window of COUNT/W at any phase, so a fixed
reading is paced exactly; a weighted counter also refuses a sliding log at its
window starts, so its reading is spaced evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from batchrun.core.limits import Window

# The phases tried, besides the one just after each arrival: this many per window.
_GRID = 100
# The log read: the requests of the last this many windows up to the latest
# refusal, and no more than `_MOST` of them (a review waits for `read`).
_SPAN = 4
_MOST = 150


class Counting(Enum):
    """How an aligned-window server counts."""

    FIXED = "fixed window"
    WEIGHTED = "weighted counter"


@dataclass(frozen=True, slots=True)
class Request:
    """What the server did with one request: when it arrived (`at`, give or take
    `within`), whether it was refused, and the refusal's Retry-After (None if
    not given)."""

    at: float
    refused: bool
    wait: float | None = None
    within: float = 0.0


@dataclass(frozen=True, slots=True)
class Counter:
    """A reading: the server counts `window` this way, its windows starting at
    `phase` (seconds, modulo the window's length)."""

    counting: Counting
    window: Window
    phase: float


def read(requests: Sequence[Request], window: Window) -> Counter | None:
    """The reading of an aligned counter of `window`'s length, with a count no
    higher than `window`'s, that explains the requests of `requests` (ascending
    arrivals) from `_SPAN` windows before its latest refusal: of the phases and
    countings that do, the one with the highest count, a fixed window's if both
    are as high. None if none explains them, or nothing was refused."""
    seconds = window.seconds
    refused = [n for n, r in enumerate(requests) if r.refused]
    if not refused:
        return None
    latest = refused[-1]
    since = requests[latest].at - _SPAN * seconds
    kept = [r for r in requests if r.at >= since][-_MOST:]
    # A refusal whose windows began before a request left out is not read: the
    # requests that filled them are not all there.
    left_out = len(requests) - len(kept)
    cut = requests[left_out - 1].at + 2 * seconds if left_out else -math.inf
    # Just after an arrival, a fixed window's partition of the log changes
    # (at least one ulp of the window after it: just after 0, a subnormal
    # phase would be lost in `_Log._index`'s quotient, which underflows).
    phases = {k * seconds / _GRID for k in range(_GRID)}
    least = math.ulp(seconds)
    phases |= {max(math.nextafter(r.at % seconds, math.inf), least) for r in kept}
    unordered = _unordered(kept)
    best: Counter | None = None
    for counting in Counting:
        for phase in sorted(phases):
            log = _Log(kept, seconds, phase, counting, cut, unordered)
            count = log.count(window.count)
            if count is not None and (best is None or count > best.window.count):
                best = Counter(counting, Window(count, seconds), phase % seconds)
    return best


def _unordered(requests: Sequence[Request]) -> list[tuple[int, int]]:
    """For each request: how many accepted requests estimated to arrive after it
    may have come before it, and how many estimated before it may have come
    after (their round trips overlap)."""
    ahead = [0] * len(requests)
    behind = [0] * len(requests)
    reach = max((r.within for r in requests), default=0.0)
    for n, r in enumerate(requests):
        for m in range(n + 1, len(requests)):
            later = requests[m]
            if later.at - r.at > r.within + reach:
                break  # estimates ascend: none after this overlaps
            if later.at - later.within < r.at + r.within:
                ahead[n] += not later.refused
                behind[m] += not r.refused
    return list(zip(ahead, behind, strict=True))


class _Log:
    """`requests` as a counter of `seconds` starting at `phase` saw them."""

    def __init__(
        self,
        requests: Sequence[Request],
        seconds: float,
        phase: float,
        counting: Counting,
        cut: float,
        unordered: Sequence[tuple[int, int]] = (),
    ) -> None:
        self._requests = requests
        self._unordered = unordered or [(0, 0)] * len(requests)
        self._seconds = seconds
        self._phase = phase
        self._weighted = counting is Counting.WEIGHTED
        self._cut = cut
        # Accepted requests whose round trip spans the reset that opens window
        # k, by whether they were estimated to arrive after it (True) or before.
        self._loose: dict[tuple[int, bool], int] = {}
        for r in requests:
            first, last = self._index(r.at - r.within), self._index(r.at + r.within)
            if not r.refused and first != last:
                side = (last, self._index(r.at) == last)
                self._loose[side] = self._loose.get(side, 0) + 1

    def _index(self, moment: float) -> int:
        return math.floor((moment - self._phase) / self._seconds)

    def count(self, most: int) -> int | None:
        """The highest count, up to `most`, that explains the requests; None if
        none does. An acceptance seen at a count (what the server had counted
        before it) says COUNT is above it; a refusal, that it is not, and its
        Retry-After when the count drops below COUNT."""
        low, high = 1, most
        told: list[tuple[float, _State]] = []
        counts: dict[int, int] = {}
        for r, (ahead, behind) in zip(self._requests, self._unordered, strict=True):
            # It came somewhere between these two moments, perhaps in either of
            # two windows, and perhaps after (or before) requests whose round
            # trips overlap its own.
            early = self._state(r.at - r.within, counts, r.within)
            late = early
            if self._weighted or self._index(r.at + r.within) != early.index:
                late = self._state(r.at + r.within, counts, r.within)
            if not r.refused:
                seen = min(early.count - early.fewer, late.count - late.fewer)
                low = max(low, math.floor(seen - behind) + 1)
                index = self._index(r.at)
                counts[index] = counts.get(index, 0) + 1
            elif r.at >= self._cut:
                seen = max(early.count + early.more, late.count + late.more)
                high = min(high, math.floor(seen + ahead))
                if r.wait is not None and early.index == late.index:
                    told.append((r.wait, self._state(r.at, counts, r.within)))
            if high < low:
                return None
        for count in range(high, low - 1, -1):
            if all(_fits(wait, s, self._seconds, count) for wait, s in told):
                return count
        return None

    def _state(self, moment: float, counts: dict[int, int], within: float) -> _State:
        """What the counter had counted at `moment`, from `counts` (the requests
        before it, in their windows as estimated)."""
        index = self._index(moment)
        previous, current = counts.get(index - 1, 0), counts.get(index, 0)
        elapsed = (moment - self._phase) / self._seconds - index
        # Counted before the reset, though they may have come after it; or after
        # it, though they may have come before.
        more: float = self._loose.get((index, False), 0)
        fewer: float = self._loose.get((index, True), 0)
        count = float(current)
        if self._weighted:
            count += previous * (1 - elapsed)
            # The previous window's count, as loosely; and between two phases
            # tried, a weighted count moves by up to previous / _GRID.
            grid = previous / _GRID
            more += self._loose.get((index - 1, False), 0) + grid
            fewer += self._loose.get((index - 1, True), 0) + grid
        else:
            previous = 0  # a fixed window forgets the previous one
        return _State(
            count,
            more,
            fewer,
            index,
            elapsed,
            within / self._seconds,
            previous,
            current,
            self._weighted,
        )


@dataclass(frozen=True, slots=True)
class _State:
    """What a counter had counted when a request came (`count`, give or take:
    up to `more` or `fewer`), at how far into its window (`elapsed`, a share
    of it, give or take `within`), from the previous and current windows'
    accepted requests."""

    count: float
    more: float
    fewer: float
    index: int
    elapsed: float
    within: float
    previous: int
    current: int
    weighted: bool


def _fits(wait: float, state: _State, seconds: float, count: int) -> bool:
    """Whether a refusal's Retry-After (`wait`) names about when a counter of
    `count` in `state` has room again: servers round it up to whole seconds, and
    arrivals are estimates, hence the slack."""
    if state.current >= count:
        # The next window, once the current one's weight drops below COUNT.
        room = 2 - count / state.current if state.weighted else 1.0
    elif state.weighted and state.previous:
        # This window, once the previous one's weight drops below.
        room = 1 - (count - state.current) / state.previous
    else:
        return True  # refused within the slack alone: no moment to check
    predicted = (room - state.elapsed) * seconds
    slack = 0.05 + (0.1 + state.within) * seconds
    return wait - 1 - slack <= predicted <= wait + slack
