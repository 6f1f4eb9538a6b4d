"""Measurement 4: a 1,000,000-row jobs file.

The file (CSV, 8 run-query : 1 invite : 1 avatar, one JSON payload each) is written
to a temporary folder. Each reader runs in its own subprocess, timed inside it, with
its peak RSS from `os.wait4`: `read_jobs` (validates and keeps every Job),
`scan` (validates, streaming), and `batchrun validate` (wall time of the command).
Time until the first request of `batchrun submit` on the same file is measured
against bench.fastserver when `first_request` is on, capped by `cap` seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.throughput import batchrun_command, fast_server, stats

_READ = """
import sys, time
from pathlib import Path
from batchrun.jobs.job import read_jobs
started = time.perf_counter()
jobs = read_jobs(Path(sys.argv[1]))
print(len(jobs), time.perf_counter() - started)
"""
_SCAN = """
import sys, time
from pathlib import Path
from batchrun.jobs.jobfile import Problem
from batchrun.jobs.job import scan
started = time.perf_counter()
count = sum(not isinstance(item, Problem) for item in scan(Path(sys.argv[1])))
print(count, time.perf_counter() - started)
"""
_ROW = {
    0: 'inv-{n},invite,team-{t},"{{""email"": ""user{n}@acme.example""}}"\n',
    1: 'av-{n},avatar,,"{{""image_url"": ""https://cdn.example/{n}.png""}}"\n',
}
_QUERY = 'q-{n},run-query,team-{t},"{{""query"": ""select {n}""}}"\n'


def write_jobs(path: Path, rows: int) -> int:
    """Write `rows` valid jobs; return the file's size in bytes."""
    with path.open("w", encoding="utf-8") as file:
        file.write("id,type,team_id,payload\n")
        for n in range(rows):
            file.write(_ROW.get(n % 10, _QUERY).format(n=n, t=n % 97))
    return path.stat().st_size


def _child(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run to the end; wall seconds, peak RSS in MiB, exit code, last stdout line."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall_s": round(time.perf_counter() - started, 3),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "exit": process.returncode,
        "output": out.strip().splitlines()[-1] if out.strip() else "",
    }


def _inner(result: dict[str, Any]) -> dict[str, Any]:
    """Add the in-process time a _READ/_SCAN child printed."""
    count, seconds = result["output"].split()
    return result | {"jobs": int(count), "seconds": round(float(seconds), 3)}


def _first_request(jobs: Path, folder: Path, cap: float) -> dict[str, Any]:
    """Seconds from starting `batchrun submit` to the server's first request: a
    fresh run, then (stopped by SIGTERM) its resume, which finds the file
    unchanged and skips the re-import."""
    result: dict[str, Any] = {"cap_s": cap}
    with fast_server() as url:
        for run in ("seconds", "resume_seconds"):
            result[run] = _until_first(jobs, folder, url, cap)
    return result


def _until_first(jobs: Path, folder: Path, url: str, cap: float) -> float | None:
    command = [batchrun_command(), "submit", str(jobs), "--base-url", url]
    command += ["--limit", "run-query=100000/1s", "--concurrency", "32"]
    env = os.environ | {"BATCHRUN_STATE_DIR": str(folder / "state")}
    stats(url)
    started = time.time()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    first = _await_first(url, process, started + cap)
    _stop(process)
    return None if first is None else round(first - started, 3)


def _await_first(
    url: str, process: subprocess.Popen[bytes], deadline: float
) -> float | None:
    while time.time() < deadline and process.poll() is None:
        seen = stats(url)
        if seen["count"]:
            return float(seen["first"])
        time.sleep(0.1)
    return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (batchrun stops starting requests), then SIGKILL if it lingers."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def measure(
    rows: int, first_request_cap: float | None, say: Callable[[str], None]
) -> dict[str, Any]:
    """Generate the file, then time each reader in its own subprocess."""
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        jobs = folder / "jobs.csv"
        size = write_jobs(jobs, rows)
        result: dict[str, Any] = {"rows": rows, "bytes": size}
        result["read_jobs"] = _inner(_child([sys.executable, "-c", _READ, str(jobs)]))
        say(f"big file read_jobs: {result['read_jobs']}")
        result["scan"] = _inner(_child([sys.executable, "-c", _SCAN, str(jobs)]))
        say(f"big file scan: {result['scan']}")
        result["validate"] = _child([batchrun_command(), "validate", str(jobs)])
        say(f"big file batchrun validate: {result['validate']}")
        if first_request_cap is not None:
            result["first_request"] = _first_request(jobs, folder, first_request_cap)
            say(f"big file submit, first request: {result['first_request']}")
    return result
