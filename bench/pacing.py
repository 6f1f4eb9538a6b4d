"""Measurement 1: pacing accuracy against the sandbox over loopback.

For each shape and tool: a fresh sandbox (`running(create_app(...))`), the same
run-query jobs, then from the sandbox's `arrivals` (its own monotonic clock):
the most requests seen in any sliding window of each of the rule's windows (every
arrival counts, whatever its answer), the number of 429s, and the makespan over the
ideal `eta(count, rule, now=0)`. The ideal runs from the first send to the last at
zero latency, so the makespan runs from the first arrival to the last 2xx arrival;
`startup_s` (driver start to first arrival) is kept apart.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from batchrun.core.limits import LimitKey, Rule, limit_table, parse_override
from batchrun.pacing.slots import eta
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running
from bench import anchors, drivers
from support.oracles import most_in_window

Driver = Callable[[str, dict[LimitKey, Rule], int, int], Awaitable[int]]
CONCURRENCY = 8


async def _aiolimiter(url: str, rules: dict[LimitKey, Rule], n: int, c: int) -> int:
    acquire = anchors.aiolimiter_acquire(rules[LimitKey.RUN_QUERY])
    return await drivers.drive_loop(url, acquire, n, c)


async def _pyrate(url: str, rules: dict[LimitKey, Rule], n: int, c: int) -> int:
    with anchors.pyrate_limiter_of(rules[LimitKey.RUN_QUERY]) as limiter:
        return await drivers.drive_loop(url, anchors.pyrate_acquire(limiter), n, c)


async def _limits(url: str, rules: dict[LimitKey, Rule], n: int, c: int) -> int:
    acquire = anchors.limits_acquire(rules[LimitKey.RUN_QUERY])
    return await drivers.drive_loop(url, acquire, n, c)


async def _aiometer(url: str, rules: dict[LimitKey, Rule], n: int, c: int) -> int:
    return await drivers.drive_aiometer(url, rules[LimitKey.RUN_QUERY], n, c)


TOOLS: dict[str, Driver] = {
    "batchrun": drivers.drive_batchrun,
    "aiolimiter": _aiolimiter,
    "pyrate-limiter": _pyrate,
    "limits": _limits,
    "aiometer": _aiometer,
}


@dataclass(frozen=True, slots=True)
class Run:
    """One tool's run of one shape, as the sandbox saw it."""

    tool: str
    shape: str
    jobs: int
    start: float
    arrivals: list[tuple[float, int]]
    retried_errors: int


def run_once(tool: str, shape: str, count: int) -> Run:
    """Drive `count` jobs of `shape` through `tool` against a fresh sandbox,
    served by `batchrun.sandbox.app.running`."""
    rules = limit_table(overrides=[parse_override(f"run-query={shape}")])
    app = create_app(rules=rules)
    with running(app) as url:
        start = time.monotonic()
        errors = anyio.run(TOOLS[tool], url, rules, count, CONCURRENCY)
    seen = [(a.at, a.status) for a in app.state.sandbox.arrivals]
    return Run(tool, shape, count, start, sorted(seen), errors)


def summarize(run: Run) -> dict[str, Any]:
    """The figures of one run: per-window peaks, 429s, makespan against ideal."""
    rule = limit_table(overrides=[parse_override(f"run-query={run.shape}")])[
        LimitKey.RUN_QUERY
    ]
    times = [at for at, _ in run.arrivals]
    done = [at for at, status in run.arrivals if 200 <= status < 300]
    ideal = eta(run.jobs, rule, now=0.0)
    makespan = max(done) - times[0]
    windows: list[dict[str, Any]] = [
        {"window": str(w), "limit": w.count, "most": most_in_window(times, w.seconds)}
        for w in rule.windows
    ]
    return {
        "tool": run.tool,
        "shape": run.shape,
        "jobs": run.jobs,
        "done": len(done),
        "requests": len(times),
        "windows": windows,
        "exceeded_by": max(w["most"] - w["limit"] for w in windows),
        "http_429": sum(status == 429 for _, status in run.arrivals),
        "connection_errors_retried": run.retried_errors,
        "startup_s": round(times[0] - run.start, 4),
        "makespan_s": round(makespan, 4),
        "ideal_s": ideal,
        "makespan_ratio": round(makespan / ideal, 4),
        "arrivals": [(round(at - run.start, 5), st) for at, st in run.arrivals],
    }


def _say(result: dict[str, Any], say: Callable[[str], None]) -> None:
    say(
        f"pacing {result['shape']} {result['tool']}: "
        f"most {[w['most'] for w in result['windows']]}, "
        f"429s {result['http_429']}, ratio {result['makespan_ratio']}"
    )


def measure(shapes: dict[str, int], say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every tool on every shape, one after the other."""
    results = []
    for shape, count in shapes.items():
        for tool in TOOLS:
            result = summarize(run_once(tool, shape, count))
            _say(result, say)
            results.append(result)
    return results
