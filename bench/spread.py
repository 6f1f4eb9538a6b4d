"""Issue 10 point 6: `--pace spread` against a leaky bucket with no burst allowance.

The client rule equals the server's rate (`15/1s` against nginx `limit_req
rate=15r/s` without `burst`, which decides on its millisecond clock), so spread's
bare interval is the server's exact emission interval: any request that arrives a
millisecond early is refused. `slots.spread_interval` adds a margin (the larger of
1 % and 5 ms); `--no-margin` takes it away, for the figures before. Three rows, each
over several runs of 60 jobs:

- `simulated`: in virtual time (support/simulation.py) against `limiters.LeakyBucket`
  with burst 0, each request travelling a seeded random latency of 1-4 ms, so
  arrivals jitter by up to 3 ms as they do on a busy loopback;
- `nginx, pacer only`: 60 requests through batchrun's own `Pacer` (spread, a
  `MemoryLedger`, the event loop's clock) and httpx, 8 at a time, against real nginx on
  loopback (support/stock_programs.py), never retried: the 429s the spacing alone earns;
- `nginx, submit`: `batchrun submit --pace spread` in a subprocess against the same
  nginx, bounded by `--deadline`, 429s and makespan read from nginx's access log
  (always with the margin: the subprocess is the installed code).

`python -m bench.spread [--runs N] [--seeds N] [--submit N] [--no-margin]` prints
Markdown rows.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from tempfile import TemporaryDirectory

import anyio
import httpx

from batchrun.core.clock import LoopClock
from batchrun.core.limits import LimitKey, Pace, parse_rule
from batchrun.pacing import slots
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.pacer import Pacer
from support.simulation import Server as Model
from support.simulation import simulate
from support.stock_programs import Server, nginx_server

JOBS = 60
RULE = "15/1s"
NGINX_RATE = "15r/s"
_DEADLINE = "30s"
_TIMEOUT = 60.0
_LATENCY = (0.001, 0.004)


def _jobs_file(folder: Path) -> Path:
    path = folder / "jobs.csv"
    rows = [f"q{i:04d},run-query,acme," for i in range(JOBS)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def _figures(server: Server) -> tuple[int, float]:
    time.sleep(0.1)  # nginx writes its access log line after the answer
    arrivals = server.arrivals()
    refused = sum(a.status == 429 for a in arrivals)
    done = [a.answered for a in arrivals if a.status == 200]
    return refused, max(done, default=0.0) - arrivals[0].at


async def _paced(url: str) -> None:
    pacer = Pacer(
        rules={LimitKey.RUN_QUERY: parse_rule(RULE)},
        ledger=MemoryLedger(),
        clock=LoopClock(),
        pace=Pace.SPREAD,
    )
    numbers = iter(range(JOBS))

    async def worker(http: httpx.AsyncClient) -> None:
        for _ in numbers:
            ticket = await pacer.acquire(LimitKey.RUN_QUERY)
            try:
                await http.post("/teams/acme/data/run-query", json={})
            finally:
                pacer.release(LimitKey.RUN_QUERY, ticket)

    async with (
        httpx.AsyncClient(base_url=url) as http,
        anyio.create_task_group() as group,
    ):
        for _ in range(8):
            group.start_soon(worker, http)


def pacer_run() -> tuple[int, float]:
    """60 requests spaced by the pacer alone, never retried: (429s, makespan)."""
    with nginx_server(rate=NGINX_RATE, burst=0) as server:
        anyio.run(_paced, server.url)
        return _figures(server)


def nginx_run() -> tuple[int, float]:
    """One `batchrun submit --pace spread` against a fresh nginx: (429s, makespan)."""
    with nginx_server(rate=NGINX_RATE, burst=0) as server, TemporaryDirectory() as name:
        folder = Path(name)
        command = [sys.executable, "-m", "batchrun", "submit", str(_jobs_file(folder))]
        command += ["--base-url", server.url, "--limit", f"run-query={RULE}"]
        command += ["--pace", "spread", "--state-dir", str(folder / "state")]
        command += ["--deadline", _DEADLINE]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                command, env=env, capture_output=True, timeout=_TIMEOUT, check=False
            )
        return _figures(server)


def simulated_run(seed: int) -> tuple[int, float]:
    """One spread run in virtual time against a leaky bucket with burst 0."""
    server = Model(LimiterKind.LEAKY, parse_rule(RULE), {"burst": 0})
    run = simulate(
        client=RULE,
        server=server,
        count=JOBS,
        pace=Pace.SPREAD,
        latency=_LATENCY,
        seed=seed,
    )
    return sum(run.rate_limited.values()), run.makespan


def _row(name: str, runs: list[tuple[int, float]]) -> str:
    refused = [r for r, _ in runs]
    spans = [s for _, s in runs]
    return (
        f"| {name} | {len(runs)} | {sum(refused)} | {max(refused)} "
        f"| {sum(r > 0 for r in refused)} | {mean(spans):.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.spread", description=__doc__)
    parser.add_argument("--runs", type=int, default=10, help="nginx runs")
    parser.add_argument("--seeds", type=int, default=50, help="simulated runs")
    parser.add_argument("--skip-simulated", action="store_true")
    parser.add_argument("--submit", type=int, default=3, help="submit runs")
    parser.add_argument("--no-margin", action="store_true", help="bare interval")
    args = parser.parse_args()
    if args.no_margin:
        slots.SPREAD_MARGIN = slots.SPREAD_MARGIN_SECONDS = 0.0
        args.submit = 0
    print(
        "| server | runs | 429s in all | most in one run | runs with a 429 "
        "| mean makespan s |"
    )
    print("|---|---|---|---|---|---|")
    if not args.skip_simulated:
        sims = [simulated_run(seed) for seed in range(args.seeds)]
        print(_row(f"simulated leaky {RULE} burst 0", sims))
    nginx = f"nginx {NGINX_RATE} (no burst) nodelay"
    if args.runs:
        print(_row(f"{nginx}, pacer only", [pacer_run() for _ in range(args.runs)]))
    if args.submit:
        print(_row(f"{nginx}, submit", [nginx_run() for _ in range(args.submit)]))


if __name__ == "__main__":
    main()
