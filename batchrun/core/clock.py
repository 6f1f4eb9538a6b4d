"""Time as a parameter: the `Clock` protocol and its two implementations.

The pacer, the runner and the progress views read `now()` from a Clock they are
given; waiting is anyio's own, relative to that clock's moments. So tests run them
on a virtual clock (trio's MockClock through `LoopClock`).

Invariant: what paces requests never reads the wall clock. `MachineClock` counts
seconds since the machine booted (CLOCK_BOOTTIME on Linux, which every process
shares and nobody can step; `time.monotonic()` elsewhere), so setting the date, NTP
or a virtual machine's resync changes no window. `boot_id` names the boot that
clock counts from, so a shared ledger can tell stamps of an earlier boot.
`wall_time` is for what people read (results, the learned limit's date) only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import anyio

# The kernel makes a new random id at every boot (see random(4)).
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class Clock(Protocol):
    """A source of the current time in seconds."""

    def now(self) -> float: ...


def _machine_seconds() -> float:
    """Seconds since boot, suspend included, on the clock no one can step."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()  # pragma: no cover - not Linux


class MachineClock:
    """Seconds since boot: one timeline for every process on the machine, never
    stepped by a change of the wall clock."""

    def now(self) -> float:
        return _machine_seconds()


class LoopClock:
    """The event loop's own clock: virtual under trio's MockClock in tests."""

    def now(self) -> float:
        return anyio.current_time()


def wall_time() -> float:
    """Seconds since the epoch, as people read dates: never for pacing."""
    return time.time()


def boot_id() -> str:
    """The id of the boot `MachineClock` counts from; "" where the system has none
    to read (then stamps of an earlier boot cannot be told apart)."""
    try:
        return _BOOT_ID.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):  # pragma: no cover - not Linux
        return ""
