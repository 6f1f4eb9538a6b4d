"""Measurement 2: pacer overhead, CPU microseconds per granted slot.

The rule never makes anyone wait (1000000/1s), so this is the bookkeeping cost of a
grant alone: `time.process_time` around N grants, divided by N. Async limiters run
on anyio's asyncio backend, timed inside the event loop.
"""

from __future__ import annotations

import inspect
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import limits.storage
import limits.strategies
from aiometer._impl.meters import RateLimitMeter

from batchrun.core.clock import MachineClock
from batchrun.core.limits import LimitKey, Pace, Rule, parse_rule
from batchrun.ledgers import sqlite_ledger as ledger_module
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.pacer import Pacer
from batchrun.pacing.slots import Grant
from bench import anchors

WIDE = parse_rule("1000000/1s")
KEY = LimitKey.RUN_QUERY


def _per_grant(started: float, grants: int) -> float:
    return (time.process_time() - started) / grants * 1e6


def _ledger_loop(ledger: Any, rule: Rule, grants: int) -> float:
    """reserve + release, `grants` times; raises if a slot is ever refused."""
    started = time.process_time()
    for _ in range(grants):
        now = time.time()
        grant = ledger.reserve(KEY, rule, Pace.EXACT, now)
        if not isinstance(grant, Grant):
            msg = f"the ledger made a grant wait: {grant}"
            raise RuntimeError(msg)
        ledger.release(grant.ticket, now)
    return _per_grant(started, grants)


def memory_ledger(grants: int) -> float:
    """MemoryLedger.reserve + release."""
    return _ledger_loop(MemoryLedger(), WIDE, grants)


def sqlite_ledger_class() -> Any:
    """SqliteLedger (batchrun.ledgers.sqlite_ledger), if it has landed, else None."""
    return getattr(ledger_module, "SqliteLedger", None)


def sqlite_ledger(grants: int, rule: Rule = WIDE) -> float:
    """SqliteLedger.reserve + release in a fresh database file."""
    cls = sqlite_ledger_class()
    with tempfile.TemporaryDirectory() as folder:
        ledger = _build_sqlite(cls, Path(folder) / "ledger.sqlite3")
        try:
            return _ledger_loop(ledger, rule, grants)
        finally:
            getattr(ledger, "close", lambda: None)()


def _build_sqlite(cls: Any, path: Path) -> Any:
    """Pass whichever of client/hold/now the constructor takes."""
    offered = {"client": "bench", "hold": 30.0, "now": time.time}
    accepted = inspect.signature(cls).parameters
    return cls(path, **{k: v for k, v in offered.items() if k in accepted})


def _timed_async(grants: int, setup: Callable[[], Any]) -> float:
    """Run `await acquire()` `grants` times on asyncio; setup returns acquire."""

    async def loop() -> float:
        acquire = await _maybe_await(setup())
        started = time.process_time()
        for _ in range(grants):
            await acquire()
        return _per_grant(started, grants)

    return anyio.run(loop)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def pacer(grants: int) -> float:
    """The whole Pacer.acquire + release over a MemoryLedger, under anyio."""

    def setup() -> Callable[[], Awaitable[None]]:
        paced = Pacer(rules={KEY: WIDE}, ledger=MemoryLedger(), clock=MachineClock())

        async def acquire() -> None:
            paced.release(KEY, await paced.acquire(KEY))

        return acquire

    return _timed_async(grants, setup)


def aiolimiter(grants: int) -> float:
    """AsyncLimiter.acquire."""
    return _timed_async(grants, lambda: anchors.aiolimiter_acquire(WIDE))


def pyrate(grants: int) -> float:
    """pyrate-limiter Limiter.try_acquire_async."""
    with anchors.pyrate_limiter_of(WIDE) as limiter:
        return _timed_async(grants, lambda: anchors.pyrate_acquire(limiter))


def pyrate_sync(grants: int) -> float:
    """pyrate-limiter Limiter.try_acquire (the sync call)."""
    with anchors.pyrate_limiter_of(WIDE) as limiter:
        started = time.process_time()
        for _ in range(grants):
            limiter.try_acquire(anchors.KEY)
        return _per_grant(started, grants)


def limits_hit(grants: int) -> float:
    """limits MovingWindowRateLimiter.hit on MemoryStorage (sync)."""
    limiter = limits.strategies.MovingWindowRateLimiter(limits.storage.MemoryStorage())
    (item,) = anchors.limits_items(WIDE)
    started = time.process_time()
    for _ in range(grants):
        limiter.hit(item, anchors.KEY)
    return _per_grant(started, grants)


def aiometer_meter(grants: int) -> float:
    """aiometer's max_per_second meter (its private RateLimitMeter state)."""

    async def setup() -> Callable[[], Awaitable[None]]:
        state = await RateLimitMeter(1e6).new_state()

        async def acquire() -> None:
            await state.wait_task_can_start()
            await state.notify_task_started()

        return acquire

    return _timed_async(grants, setup)


def _cases(grants: int, sqlite_grants: list[int]) -> list[tuple[str, Any, int]]:
    cases: list[tuple[str, Any, int]] = [
        ("batchrun MemoryLedger.reserve+release", memory_ledger, grants),
        ("batchrun Pacer.acquire+release (MemoryLedger, anyio)", pacer, grants),
        ("aiolimiter AsyncLimiter.acquire", aiolimiter, grants),
        ("pyrate-limiter Limiter.try_acquire_async", pyrate, grants),
        ("pyrate-limiter Limiter.try_acquire (sync)", pyrate_sync, grants),
        ("limits MovingWindowRateLimiter.hit (sync)", limits_hit, grants),
        ("aiometer max_per_second meter", aiometer_meter, grants),
    ]
    if sqlite_ledger_class() is not None:
        name = "batchrun SqliteLedger.reserve+release"
        cases += [(name, sqlite_ledger, count) for count in sqlite_grants]
    return cases


def measure(
    grants: int, sqlite_grants: list[int], say: Callable[[str], None]
) -> dict[str, Any]:
    """Every candidate, one after the other; the SQLite ledger with fewer grants."""
    rows = []
    for name, case, count in _cases(grants, sqlite_grants):
        micros = round(case(count), 2)
        rows.append({"what": name, "grants": count, "us_per_grant": micros})
        say(f"overhead {name}, {count} grants: {micros} us")
    return {
        "rule": str(WIDE),
        "sqlite_ledger_present": sqlite_ledger_class() is not None,
        "rows": rows,
    }
