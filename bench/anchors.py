"""The anchors: each rival limiter behind one `async acquire()`, built from a Rule.

Every anchor gets every window of the rule, as far as its API allows:

- aiolimiter: one `AsyncLimiter(count, seconds)` (a leaky bucket) per window,
  acquired one after the other (nested);
- pyrate-limiter: one `Limiter` over the list of `Rate(count, ms)`, its default
  in-memory bucket and sliding-window-log algorithm, `try_acquire_async` (blocking);
- limits: `MovingWindowRateLimiter(MemoryStorage())`, one `RateLimitItemPerSecond`
  per window; a slot is taken when `test` passes for every window, then `hit` on
  each; otherwise sleep until the earliest `reset_time` of a full window;
- aiometer: only `max_per_second` (even spacing), set to the binding long-run rate
  (the `spread` rate: max over windows of WINDOW/COUNT); it is driven by
  `aiometer.run_on_each`, so it has no `acquire` here (see bench.pacing).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import aiolimiter
import anyio
import limits
import limits.storage
import limits.strategies
import pyrate_limiter

from batchrun.core.limits import Rule

Acquire = Callable[[], Awaitable[None]]
KEY = "run-query"


def aiolimiter_acquire(rule: Rule) -> Acquire:
    """Nested leaky buckets, one per window."""
    buckets = [aiolimiter.AsyncLimiter(w.count, w.seconds) for w in rule.windows]

    async def acquire() -> None:
        for bucket in buckets:
            await bucket.acquire()

    return acquire


def pyrate_limiter_of(rule: Rule) -> pyrate_limiter.Limiter:
    """One limiter holding every window as a `Rate` (its native multi-rate form)."""
    rates = [
        pyrate_limiter.Rate(w.count, round(w.seconds * 1000)) for w in rule.windows
    ]
    return pyrate_limiter.Limiter(rates)


def pyrate_acquire(limiter: pyrate_limiter.Limiter) -> Acquire:
    """`try_acquire_async`, blocking until the bucket admits the item."""

    async def acquire() -> None:
        if not await limiter.try_acquire_async(KEY):
            msg = "pyrate-limiter refused an item"
            raise RuntimeError(msg)

    return acquire


def limits_items(rule: Rule) -> list[limits.RateLimitItem]:
    """One moving-window item per window (limits takes whole seconds only)."""
    for window in rule.windows:
        if not float(window.seconds).is_integer():
            msg = f"limits needs whole-second windows, got {window}"
            raise ValueError(msg)
    return [
        limits.RateLimitItemPerSecond(w.count, int(w.seconds)) for w in rule.windows
    ]


def limits_acquire(rule: Rule) -> Acquire:
    """Test every window, then hit each; else sleep until a full window resets."""
    limiter = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())
    items = limits_items(rule)

    async def acquire() -> None:
        while True:
            full = [item for item in items if not limiter.test(item, KEY)]
            if not full:
                for item in items:
                    limiter.hit(item, KEY)
                return
            reset = max(limiter.get_window_stats(i, KEY).reset_time for i in full)
            await anyio.sleep(max(0.0, reset - time.time()))

    return acquire


def aiometer_rate(rule: Rule) -> float:
    """aiometer's `max_per_second`: the binding long-run rate of the rule."""
    return 1.0 / rule.interval
