"""Time as a parameter: the `Clock` protocol and its two implementations.

The pacer, the runner and the progress views read `now()` from a Clock they are
given; waiting is anyio's own, relative to that clock's moments. So tests run them
on a virtual clock (trio's MockClock through `LoopClock`).
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    """A source of the current time in seconds."""

    def now(self) -> float: ...


class SystemClock:
    """Wall-clock seconds since the epoch, so several processes share one timeline."""

    def now(self) -> float:
        return time.time()


class LoopClock:
    """The event loop's own clock: virtual under trio's MockClock in tests."""

    def now(self) -> float:
        return anyio.current_time()
