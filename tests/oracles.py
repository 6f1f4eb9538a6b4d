"""Test oracles: plain, slow readings of what a server saw, to check fast code by.

They live with the tests (and the benchmarks, which import them), not in the package:
nothing in batchrun decides by them.
"""

from __future__ import annotations

from collections.abc import Container

from batchrun.core.limits import LimitKey
from batchrun.sandbox.app import Sandbox


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
