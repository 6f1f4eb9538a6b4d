"""Measurement 3: end-to-end throughput when the limits never bind.

A minimal ASGI server (bench.fastserver, its own process, so client and server
each have a core) answers at once. The same 2,000 run-query POSTs go out with N in
flight: from a bare httpx + anyio loop (N workers sharing one AsyncClient), from
batchrun's Runner path (Runner, Client, Pacer, MemoryLedger, rule
run-query=100000/1s; then with the shared SQLite ledger; then also with the run
store and results file), and from `batchrun submit` in a subprocess (all of that,
plus its progress log). Each runs at several concurrencies (N
in flight at most; httpx itself slows down as N grows). Requests per second are
counted by the server, from its first to its last request; the in-process drivers
alternate, and every driver keeps its best of `rounds`.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

from batchrun.core.limits import limit_table, parse_override
from bench import drivers

RULE = "run-query=100000/1s"
# The in-process Runner paths, and what each keeps (drivers.drive_batchrun).
RUNNER_STATES = {
    "runner": "memory",
    "runner_ledger": "ledger",
    "runner_durable": "durable",
}


@contextlib.contextmanager
def fast_server() -> Iterator[str]:
    """Start bench.fastserver; yield its base URL; stop it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.fastserver"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def stats(base_url: str) -> dict[str, Any]:
    """The server's count and first/last request times since the last call."""
    with urllib.request.urlopen(f"{base_url}/stats", timeout=10) as answer:
        return dict(json.load(answer))


def _rate(seen: dict[str, Any]) -> float:
    return float(seen["count"] / (seen["last"] - seen["first"]))


def _in_process(
    name: str, base_url: str, count: int, concurrency: int
) -> dict[str, Any]:
    """One run; `in_flight_mean`: requests in flight at each send (the bare loop
    keeps `concurrency` workers busy; batchrun's is counted from its events)."""
    stats(base_url)
    in_flight = drivers.InFlight()
    started = time.perf_counter()
    if name == "bare":
        anyio.run(drivers.drive_loop, base_url, None, count, concurrency)
    else:
        rules = limit_table(overrides=[parse_override(RULE)])
        drive = functools.partial(drivers.drive_batchrun, state=RUNNER_STATES[name])
        anyio.run(drive, base_url, rules, count, concurrency, in_flight)
    wall = time.perf_counter() - started
    seen = stats(base_url)
    mean = concurrency if name == "bare" else round(in_flight.mean, 1)
    return {
        "count": seen["count"],
        "wall_s": wall,
        "rps": _rate(seen),
        "in_flight_mean": mean,
    }


def _jobs_file(folder: Path, count: int) -> Path:
    path = folder / "jobs.csv"
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["id", "type", "team_id", "payload"])
        for job in drivers.jobs(count):
            writer.writerow([job.id, "run-query", job.team_id, json.dumps(job.payload)])
    return path


def batchrun_command() -> str:
    """The installed `batchrun` beside this interpreter."""
    return str(Path(sys.executable).with_name("batchrun"))


def _cli(base_url: str, count: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        jobs = _jobs_file(Path(folder), count)
        command = [batchrun_command(), "submit", str(jobs), "--base-url", base_url]
        command += ["--limit", RULE, "--concurrency", str(concurrency)]
        env = os.environ | {"BATCHRUN_STATE_DIR": str(Path(folder) / "state")}
        stats(base_url)
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    seen = stats(base_url)
    if done.returncode != 0 or not seen["count"]:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return {"count": seen["count"], "wall_s": wall, "rps": _rate(seen)}


def _best(
    base_url: str, count: int, concurrency: int, rounds: int, say: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """Bare loop and Runner paths alternating `rounds` times; the fastest of each."""
    runs: dict[str, list[dict[str, Any]]] = {"bare": []}
    runs |= {name: [] for name in RUNNER_STATES}
    for _ in range(rounds):
        for name, kept in runs.items():
            kept.append(_in_process(name, base_url, count, concurrency))
            say(f"throughput {name} x{concurrency}: {kept[-1]['rps']:.0f} req/s")
    return {name: max(kept, key=lambda run: run["rps"]) for name, kept in runs.items()}


def measure(
    count: int, rounds: int, concurrencies: list[int], say: Callable[[str], None]
) -> dict[str, Any]:
    """At each concurrency: bare loop vs Runner (best of `rounds`), then the CLI
    (best of `rounds`)."""
    cases = []
    with fast_server() as url:
        for concurrency in concurrencies:
            best = _best(url, count, concurrency, rounds, say)
            clis = []
            for _ in range(rounds):
                clis.append(_cli(url, count, concurrency))
                say(f"throughput batchrun submit x{concurrency}: {clis[-1]}")
            cli = max(clis, key=lambda run: run.get("rps", 0.0))
            cases.append({"concurrency": concurrency, **best, "cli_submit": cli})
    return {"requests": count, "rule": RULE, "rounds": rounds, "cases": cases}
