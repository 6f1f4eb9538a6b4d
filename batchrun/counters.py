"""Reading a server's counter from what it accepted and refused: `read`.

A server that counts in aligned windows (a fixed window: at most COUNT per
[phase + k W, phase + (k+1) W); a weighted counter: the previous window's count
times the share of it still in view, plus the current one, below COUNT) refuses
requests that a sliding log of a count read from a burst lets through: the burst
straddled a reset, so it counted up to twice. Its phase is not known, but the log
narrows it: at each phase a window could start at, the counts the server accepted
and refused at bound COUNT from both sides, a Retry-After names when the count
drops below COUNT again, and a phase that none fits is not the server's.

A sliding log of COUNT/W holds a fixed window of COUNT/W at any phase, so a fixed
reading is paced exactly; a weighted counter also refuses a sliding log at its
window starts, so its reading is spaced evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from batchrun.limits import Window

# The phases tried, besides the one just after each arrival: this many per window.
_GRID = 100


class Counting(Enum):
    """How an aligned-window server counts."""

    FIXED = "fixed window"
    WEIGHTED = "weighted counter"


@dataclass(frozen=True, slots=True)
class Request:
    """What the server did with one request: when it arrived, whether it was
    refused, and the refusal's Retry-After (None if not given)."""

    at: float
    refused: bool
    wait: float | None = None


@dataclass(frozen=True, slots=True)
class Counter:
    """A reading: the server counts `window` this way, its windows starting at
    `phase` (seconds, modulo the window's length)."""

    counting: Counting
    window: Window
    phase: float


def read(requests: Sequence[Request], window: Window) -> Counter | None:
    """The reading of an aligned counter of `window`'s length, with a count no
    higher than `window`'s, that explains every request of `requests` (ascending
    arrivals): of the phases and countings that do, the one with the highest
    count, a fixed window's if both are as high. (A count read too high costs one
    more 429 to correct; one read too low is never corrected.) None if none
    explains them, or nothing was refused."""
    if not any(r.refused for r in requests):
        return None
    seconds = window.seconds
    # Just after an arrival, a fixed window's partition of the log changes.
    phases = {k * seconds / _GRID for k in range(_GRID)}
    phases |= {math.nextafter(r.at % seconds, math.inf) for r in requests}
    best: Counter | None = None
    for counting in Counting:
        for phase in sorted(phases):
            count = _count(requests, window, phase, counting)
            if count is not None and (best is None or count > best.window.count):
                best = Counter(counting, Window(count, seconds), phase % seconds)
    return best


def _count(
    requests: Sequence[Request], window: Window, phase: float, counting: Counting
) -> int | None:
    """The highest count, up to `window`'s, that explains `requests` if windows
    start at `phase`; None if none does. An acceptance seen at a count (what the
    server had counted before it) says COUNT is above it; a refusal, that it is
    not, and its Retry-After when the count drops below COUNT."""
    seen = _seen(requests, window.seconds, phase, counting)
    low, high = 1, window.count
    for request, state in zip(requests, seen, strict=True):
        # Between two phases tried, a weighted count moves by up to this much.
        slack = state.previous / _GRID
        if request.refused:
            high = min(high, math.floor(state.count + slack))
        else:
            low = max(low, math.floor(state.count - slack) + 1)
        if high < low:
            return None
    told = [(r, s) for r, s in zip(requests, seen, strict=True) if r.refused and r.wait]
    for count in range(high, low - 1, -1):
        if all(_fits(r.wait, s, window.seconds, count) for r, s in told):
            return count
    return None


@dataclass(frozen=True, slots=True)
class _State:
    """What a counter had counted when a request came (`count`), at how far into
    its window (`elapsed`, a share of it), from the previous and current
    windows' accepted requests."""

    count: float
    elapsed: float
    previous: int
    current: int


def _seen(
    requests: Sequence[Request], seconds: float, phase: float, counting: Counting
) -> list[_State]:
    """The counter's state as each request came."""
    counts: dict[int, int] = {}
    seen = []
    for r in requests:
        index = math.floor((r.at - phase) / seconds)
        previous, current = counts.get(index - 1, 0), counts.get(index, 0)
        elapsed = (r.at - phase) / seconds - index
        count = float(current)
        if counting is Counting.WEIGHTED:
            count += previous * (1 - elapsed)
        else:
            previous = 0  # a fixed window forgets the previous one
        seen.append(_State(count, elapsed, previous, current))
        if not r.refused:
            counts[index] = current + 1
    return seen


def _fits(wait: float | None, state: _State, seconds: float, count: int) -> bool:
    """Whether a refusal's Retry-After (`wait`) names about when a counter of
    `count` in `state` has room again: servers round it up to whole seconds, and
    arrivals are estimates, hence the slack."""
    if wait is None:
        return True
    if state.current >= count:
        room = 1.0  # the next window (accepted, the current one held at most count)
    else:  # a weighted counter, whose previous window's weight drops below
        room = 1 - (count - state.current) / state.previous
    predicted = (room - state.elapsed) * seconds
    slack = 0.05 + 0.1 * seconds
    return wait - 1 - slack <= predicted <= wait + slack
