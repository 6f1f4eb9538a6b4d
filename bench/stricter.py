"""Issue 10's table: a client whose rule is looser than the server's real one.

60 run-query jobs, the client told `30/2s` (profile a's shape, 60 s scaled to 2 s),
against stock server-side limiters (support/stock_programs.py) that enforce something
stricter or count differently. Drivers: `batchrun submit` in a subprocess (a fresh
state folder, then a rerun with `--restart` on the same folder and server, after
the server's windows have emptied), and 8 workers around aiolimiter,
pyrate-limiter and limits (bench/anchors.py) with the retry loop their docs
suggest: on 429 sleep Retry-After if sent, else exponential backoff with full
jitter, then acquire and send again. Every driver gets a fresh server and a bound
(`--timeout`): a run that hits it is recorded as stalled.

Figures come from the server's own arrival log, cut to the driver's run: whether
each job was accepted exactly once (its Idempotency-Key on one 2xx), 429s, the
makespan (first arrival to last accepted answer) and the server-ideal makespan
(support/oracles.py: the best any client could do under the server's real rule).
`python -m bench.stricter` runs it alone; `python -m bench --only stricter`
merges it into results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import anyio
import httpx

from batchrun.core.limits import parse_rule
from bench import anchors
from bench.progress import say
from support import oracles
from support.stock_programs import (
    Arrival,
    Server,
    express_server,
    limits_server,
    nginx_server,
)

JOBS = 60
CLIENT_RULE = "30/2s"
CONCURRENCY = 8
TIMEOUT = 60.0
# Two of the servers' 2 s windows: every stock limiter here has then forgotten the
# run before (a weighted counter still weighs the previous window), so the rerun
# starts against an empty server; the 500/120s window holds 60 + 60, far below 500.
SETTLE = 4.0
PATH = "/teams/acme/data/run-query"
# Exponential backoff with full jitter (AWS Architecture Blog, "Exponential
# Backoff And Jitter"), as tenacity's wait_random_exponential: 0.5 s doubling, cap.
_BACKOFF_BASE = 0.5
_BACKOFF_CAP = 8.0
_STOP_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """A stock server and the oracle model of its real rule."""

    name: str
    server: Callable[[], contextlib.AbstractContextManager[Server]]
    model: Callable[[int], oracles.Model]  # from the first arrival, Unix ms


def _limits(rule: str, strategy: Any, headers: bool = False) -> Any:
    return lambda: limits_server(rule, strategy=strategy, headers=headers)


SCENARIOS = (
    Scenario(
        "10/2s limits moving window (sliding log)",
        _limits("10/2s", "moving-window"),
        lambda _: oracles.SlidingLog([(10, 2000)]),
    ),
    Scenario(
        "10/2s limits moving window + slowapi headers",
        _limits("10/2s", "moving-window", headers=True),
        lambda _: oracles.SlidingLog([(10, 2000)]),
    ),
    Scenario(
        "10/2s limits fixed window",
        _limits("10/2s", "fixed-window"),
        lambda _: oracles.FixedFromFirst(10, 2000),
    ),
    Scenario(
        "10/2s limits sliding-window counter (weighted)",
        _limits("10/2s", "sliding-window-counter"),
        lambda first: oracles.WeightedCounter(10, 2000, first),
    ),
    Scenario(
        "15/2s+500/120s limits moving window (profile b shape)",
        _limits("15/2s+500/120s", "moving-window"),
        lambda _: oracles.SlidingLog([(15, 2000), (500, 120_000)]),
    ),
    Scenario(
        "nginx limit_req 15r/s burst=10 nodelay",
        lambda: nginx_server(rate="15r/s", burst=10, nodelay=True),
        lambda _: oracles.LeakyBucket(15, 10, nodelay=True),
    ),
    # Stricter than told and silent on when it has room: a bucket a third as
    # fast, and a window half as long, as the rule's.
    Scenario(
        "nginx limit_req 5r/s burst=4 nodelay",
        lambda: nginx_server(rate="5r/s", burst=4, nodelay=True),
        lambda _: oracles.LeakyBucket(5, 4, nodelay=True),
    ),
    Scenario(
        "5/1s limits moving window (a shorter window)",
        _limits("5/1s", "moving-window"),
        lambda _: oracles.SlidingLog([(5, 1000)]),
    ),
    Scenario(
        "nginx limit_req 15r/s burst=10 (delay)",
        lambda: nginx_server(rate="15r/s", burst=10, nodelay=False),
        lambda _: oracles.LeakyBucket(15, 10, nodelay=False),
    ),
    Scenario(
        "10/2s express-rate-limit draft-7",
        lambda: express_server(window_ms=2000, limit=10, standard_headers="draft-7"),
        lambda _: oracles.FixedFromFirst(10, 2000),
    ),
    Scenario(
        "10/2s express-rate-limit draft-8",
        lambda: express_server(window_ms=2000, limit=10, standard_headers="draft-8"),
        lambda _: oracles.FixedFromFirst(10, 2000),
    ),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One driver's run as the driver saw it (wall clock, Unix seconds)."""

    started: float
    ended: float
    stalled: bool
    exit_code: int | None = None


# --- batchrun submit, a subprocess ------------------------------------------------


def _jobs_file(folder: Path, jobs: int) -> Path:
    path = folder / "jobs.csv"
    rows = [f"q{i:04d},run-query,acme," for i in range(jobs)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def _submit(url: str, folder: Path, timeout: float, *extra: str) -> Outcome:
    """`batchrun submit` with the client rule; SIGTERM at `timeout` (it exits 75)."""
    command = [sys.executable, "-m", "batchrun", "submit", str(folder / "jobs.csv")]
    command += ["--base-url", url, "--limit", f"run-query={CLIENT_RULE}"]
    command += ["--state-dir", str(folder / "state"), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    with (folder / "submit.log").open("a") as log:
        started = time.time()
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        try:
            code = process.wait(timeout)
            return Outcome(started, time.time(), False, code)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            return Outcome(started, time.time(), True, code)


# --- the anchors' retry loops -----------------------------------------------------


def retry_delay(response: httpx.Response, attempt: int) -> float:
    """Retry-After in seconds if the server sent it, else full-jitter backoff."""
    header = response.headers.get("Retry-After", "")
    if header.strip().isdigit():
        return float(header)
    return random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt))


async def _one_job(
    http: httpx.AsyncClient, acquire: anchors.Acquire, number: int
) -> None:
    """Acquire, send; on 429 wait as the docs say, then acquire again."""
    headers = {"Idempotency-Key": f"job-{number}"}
    attempt = 0
    while True:
        await acquire()
        try:
            response = await http.post(PATH, json={}, headers=headers)
        except httpx.TransportError:
            continue  # a kept-alive connection the server closed: send again
        if response.status_code != 429:
            return
        await anyio.sleep(retry_delay(response, attempt))
        attempt += 1


async def _drive(url: str, acquire: anchors.Acquire, jobs: int) -> None:
    remaining = iter(range(jobs))

    async def worker() -> None:
        for number in remaining:
            await _one_job(http, acquire, number)

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with (
        httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as http,
        anyio.create_task_group() as group,
    ):
        for _ in range(CONCURRENCY):
            group.start_soon(worker)


def _anchor_run(
    make: Callable[[], contextlib.AbstractContextManager[anchors.Acquire]],
) -> Callable[[str, Path, float], Outcome]:
    def run(url: str, folder: Path, timeout: float) -> Outcome:
        async def bounded() -> bool:
            with make() as acquire, anyio.move_on_after(timeout) as scope:
                await _drive(url, acquire, JOBS)
            return scope.cancelled_caught

        started = time.time()
        stalled = anyio.run(bounded)
        return Outcome(started, time.time(), stalled)

    return run


@contextlib.contextmanager
def _aiolimiter() -> Iterator[anchors.Acquire]:
    yield anchors.aiolimiter_acquire(parse_rule(CLIENT_RULE))


@contextlib.contextmanager
def _pyrate() -> Iterator[anchors.Acquire]:
    with anchors.pyrate_limiter_of(parse_rule(CLIENT_RULE)) as limiter:
        yield anchors.pyrate_acquire(limiter)


@contextlib.contextmanager
def _limits_client() -> Iterator[anchors.Acquire]:
    yield anchors.limits_acquire(parse_rule(CLIENT_RULE))


Driver = Callable[[str, Path, float], Outcome]
# Each group runs against one fresh server, its runs SETTLE seconds apart.
DRIVERS: tuple[tuple[tuple[str, Driver], ...], ...] = (
    (
        ("batchrun", lambda u, f, t: _submit(u, f, t)),
        ("batchrun rerun", lambda u, f, t: _submit(u, f, t, "--restart")),
    ),
    (("aiolimiter", _anchor_run(_aiolimiter)),),
    (("pyrate-limiter", _anchor_run(_pyrate)),),
    (("limits", _anchor_run(_limits_client)),),
)


# --- the figures -------------------------------------------------------------------


def summarize(
    scenario: Scenario, tool: str, outcome: Outcome, arrivals: list[Arrival]
) -> dict[str, Any]:
    """One row: exactly-once, 429s, makespan and the server-ideal makespan."""
    seen = [a for a in arrivals if outcome.started <= a.at <= outcome.ended]
    done = [a for a in seen if 200 <= a.status < 300]
    keys = Counter(a.key for a in done)
    first = seen[0].at if seen else outcome.started
    ideal = oracles.makespan(scenario.model(round(first * 1000)), JOBS)
    makespan = max((a.answered for a in done), default=first) - first
    return {
        "scenario": scenario.name,
        "tool": tool,
        "jobs": JOBS,
        "accepted": len(done),
        "exactly_once": len(done) == JOBS == len(keys) and None not in keys,
        "requests": len(seen),
        "http_429": sum(a.status == 429 for a in seen),
        "other": sum(not (200 <= a.status < 300 or a.status == 429) for a in seen),
        "stalled": outcome.stalled,
        "run_s": round(outcome.ended - outcome.started, 1),
        "exit_code": outcome.exit_code,
        "makespan_s": round(makespan, 3),
        "ideal_s": ideal,
        "ratio": round(makespan / ideal, 2),
        "arrivals": [(round(a.at - first, 4), a.status) for a in seen],
    }


def _groups(reruns: int) -> tuple[tuple[tuple[str, Driver], ...], ...]:
    """The driver groups, batchrun's with `reruns` reruns on the same state."""
    first, *rest = DRIVERS
    (name, run), again = first[0], first[1][1]
    names = (
        ["batchrun rerun"]
        if reruns == 1
        else [f"batchrun rerun {i + 1}" for i in range(reruns)]
    )
    return (((name, run), *[(n, again) for n in names]), *rest)


def run_scenario(
    scenario: Scenario,
    timeout: float,
    say: Callable[[str], None],
    tools: list[str] | None = None,
    reruns: int = 1,
) -> list[dict[str, Any]]:
    """Every driver group (or those with one of `tools`) against its own fresh
    server of `scenario`; batchrun's reruns `reruns` times on the same state."""
    rows = []
    for group in _groups(reruns):
        if tools is not None and not any(tool in tools for tool, _ in group):
            continue
        with scenario.server() as server, TemporaryDirectory() as name:
            folder = Path(name)
            _jobs_file(folder, JOBS)
            for index, (tool, driver) in enumerate(group):
                if index:
                    time.sleep(SETTLE)
                outcome = driver(server.url, folder, timeout)
                rows.append(summarize(scenario, tool, outcome, server.arrivals()))
                say(_line(rows[-1]))
    return rows


def _line(row: dict[str, Any]) -> str:
    state = "STALLED" if row["stalled"] else f"{row['makespan_s']:.2f} s"
    return (
        f"stricter {row['scenario']} / {row['tool']}: {state}, "
        f"{row['accepted']}/{row['jobs']} accepted, {row['http_429']} 429s, "
        f"ideal {row['ideal_s']:.2f} s"
    )


def measure(
    timeout: float,
    say: Callable[[str], None],
    only: list[str] | None = None,
    tools: list[str] | None = None,
    reruns: int = 1,
) -> list[dict[str, Any]]:
    """Every scenario (or those whose name holds one of `only`), one after another."""
    rows = []
    for scenario in SCENARIOS:
        if only is None or any(word in scenario.name for word in only):
            rows += run_scenario(scenario, timeout, say, tools, reruns)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of issue 10."""
    lines = [
        "| server (real rule) | client 30/2s driven by | accepted exactly once "
        "| 429s | makespan s | server-ideal s | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stalled = f"stalled (> {r['run_s']:.0f} s)" if r["stalled"] else ""
        once = "yes" if r["exactly_once"] else f"no ({r['accepted']}/{r['jobs']})"
        span = stalled or f"{r['makespan_s']:.2f}"
        ratio = "-" if r["stalled"] else f"{r['ratio']:.2f}"
        lines.append(
            f"| {r['scenario']} | {r['tool']} | {once} | {r['http_429']} "
            f"| {span} | {r['ideal_s']:.2f} | {ratio} |"
        )
    return "\n".join(lines)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stricter", description=__doc__
    )
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT, help="seconds a run may take"
    )
    parser.add_argument(
        "--scenario", nargs="+", help="only scenarios whose name holds one of these"
    )
    parser.add_argument(
        "--tool", nargs="+", help="only the driver groups with one of these tools"
    )
    parser.add_argument(
        "--reruns", type=int, default=1, help="batchrun's reruns on the same state"
    )
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    rows = measure(args.timeout, say, args.scenario, args.tool, args.reruns)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
