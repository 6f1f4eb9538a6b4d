"""The one entry point: `python -m bench` runs every measurement side by side.

It prints each section as a Markdown table, then the goals of issue 5, writes
bench/results/results.json and draws bench/results/timeline.png. `--only` runs
some sections and merges them into an existing results.json (for development;
quote full runs only); `--tables` prints the tables of an existing results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import (
    bigfile,
    chart,
    overhead,
    pacing,
    report,
    startup,
    stricter,
    throughput,
)
from bench.progress import say

HERE = Path(__file__).resolve().parent
SECTIONS = ("pacing", "overhead", "throughput", "bigfile", "startup", "stricter")
PACKAGES = (
    "batchrun",
    "aiolimiter",
    "pyrate-limiter",
    "limits",
    "aiometer",
    "httpx",
    "anyio",
    "uvicorn",
    "starlette",
    "matplotlib",
)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    add = parser.add_argument
    add("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    add("--jobs", type=int, default=300, help="jobs per pacing run of 30/2s")
    add("--jobs-b", type=int, default=300, help="jobs per pacing run of 15/1s+40/6s")
    add("--grants", type=int, default=100_000, help="grants per overhead case")
    add("--sqlite-grants", type=int, nargs="+", default=[100_000])
    add("--requests", type=int, default=2000, help="requests per throughput run")
    add("--rounds", type=int, default=3, help="throughput rounds (best is kept)")
    add(
        "--concurrency",
        type=int,
        nargs="+",
        default=[32, 8, 4],
        help="requests in flight in the throughput runs",
    )
    add("--rows", type=int, default=1_000_000, help="rows of the big jobs file")
    add(
        "--first-request-cap",
        type=float,
        default=120.0,
        help="seconds to wait for submit's first request (0: skip)",
    )
    add("--repeat", type=int, default=5, help="start-up runs per command")
    add(
        "--stricter-timeout",
        type=float,
        default=stricter.TIMEOUT,
        help="seconds a stricter-server run may take before it counts as stalled",
    )
    add(
        "--tables",
        action="store_true",
        help="print the tables of --out; measure nothing",
    )
    add("--out", type=Path, default=HERE / "results" / "results.json")
    add("--chart", type=Path, default=HERE / "results" / "timeline.png")
    return parser.parse_args()


def _cpu_model() -> str:
    with Path("/proc/cpuinfo").open() as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _tree() -> str:
    """The commit measured, and whether the working tree differed from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE)
        return done.stdout.strip()

    changed = len(git("status", "--porcelain", "--", "batchrun").splitlines())
    head = git("rev-parse", "--short", "HEAD")
    return f"{head} + {changed} changed file(s) in batchrun/"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
        "tree": _tree(),
        "packages": {name: metadata.version(name) for name in PACKAGES},
    }


def _runners(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    cap = args.first_request_cap or None
    return {
        "pacing": lambda: pacing.measure(
            {"30/2s": args.jobs, "15/1s+40/6s": args.jobs_b}, say
        ),
        "overhead": lambda: overhead.measure(args.grants, args.sqlite_grants, say),
        "throughput": lambda: throughput.measure(
            args.requests, args.rounds, args.concurrency, say
        ),
        "bigfile": lambda: bigfile.measure(args.rows, cap, say),
        "startup": lambda: startup.measure(args.repeat, say),
        "stricter": lambda: stricter.measure(args.stricter_timeout, say),
    }


def _print_tables(results: dict[str, Any]) -> None:
    titles = {
        "pacing": "1. Pacing accuracy",
        "overhead": "2. Pacer overhead",
        "throughput": "3. Throughput, limits not binding",
        "bigfile": "4. A big jobs file",
        "startup": "5. Start-up",
        "stricter": "6. Stricter server (issue 10)",
    }
    for section, title in titles.items():
        if section in results:
            print(f"\n### {title}\n")
            print(getattr(report, section)(results[section]))
    print("\n### Goals\n")
    print(report.goals_table(results))


def main() -> None:
    args = _arguments()
    if args.tables:
        _print_tables(json.loads(args.out.read_text()))
        return
    started = time.perf_counter()
    results: dict[str, Any] = {}
    if args.only and args.out.exists():
        results = json.loads(args.out.read_text())
    results["machine"] = machine()
    for section, measure in _runners(args, say).items():
        if args.only is None or section in args.only:
            results[section] = measure()
    if "pacing" in results:
        results["chart"] = chart.draw(results["pacing"], args.chart)
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["when"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    _print_tables(results)
    print(f"\n{results['seconds']} s; wrote {args.out} and {args.chart}")
