"""Time as a parameter: the `Clock` protocol and its two implementations.

Pacing reads `now()` and waits with `sleep_until()`; nothing else in batchrun reads
time directly, so tests can run the pacer and the runner on a virtual clock.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    """A source of the current time in seconds and a way to wait until a moment."""

    def now(self) -> float: ...

    async def sleep_until(self, moment: float) -> None: ...


class SystemClock:
    """Wall-clock seconds since the epoch, so several processes share one timeline."""

    def now(self) -> float:
        return time.time()

    async def sleep_until(self, moment: float) -> None:
        await anyio.sleep(max(0.0, moment - time.time()))


class LoopClock:
    """The event loop's own clock: virtual under trio's MockClock in tests."""

    def now(self) -> float:
        return anyio.current_time()

    async def sleep_until(self, moment: float) -> None:
        await anyio.sleep_until(moment)
