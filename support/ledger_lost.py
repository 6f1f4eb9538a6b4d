"""Two hosts on one Redis budget while Redis loses its history (issue 40): the
driver that `bench.ledger_lost` runs many times and tests/e2e/test_ledger_lost.py
runs a few times.

`run_once` runs two `batchrun submit` processes (two machines: a state folder
each) against one sandbox over loopback, sharing their budget (10/1s on both
sides) through a redis-server of its own on a free loopback port without
persistence. At the given moments Redis is restarted (stopped and started again
on the same port, empty) or flushed (FLUSHDB). A host that stops with exit 75 (it
met Redis down mid-run) is resumed, as cron would, until its jobs are done; one
started while Redis was down exits 74, and is started again. The `Outcome` holds
the windows over the rule at the server (every arrival, whatever its answer), the
refusals, the jobs accepted, the exit codes, any traceback, and how often the
hosts said the loss.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from batchrun.core.limits import LimitKey, limit_table, parse_override
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running

COUNT, WINDOW = 10, 1.0
RULE = f"run-query={COUNT}/{WINDOW:g}s"
PASSWORD = "bench-ledger-lost"
# A host is resumed at most this many times in one run (exit 75 each time).
_RESUMES = 20
_SAID = "lost its history"
_UNREACHABLE = "cannot use the ledger at"


@dataclass
class Outcome:
    """What one run of two hosts saw, and what the server saw of it."""

    kind: str
    seed: int
    moments: list[float]
    jobs: int
    arrivals: int = 0
    over: int = 0  # arrivals whose window (the WINDOW before and at it) is over
    most: int = 0  # the most arrivals in any window
    refused: int = 0
    accepted: int = 0  # distinct jobs the server accepted
    codes: list[int] = field(default_factory=list)  # every exit, resumes too
    down_at_start: int = 0  # exits 74: started while Redis was down
    tracebacks: int = 0
    said: int = 0  # "lost its history" lines, all hosts
    seconds: float = 0.0
    # Arrivals whose window is over, in seconds after the first arrival.
    late: list[float] = field(default_factory=list)
    # The last line of each exit other than 0, 75 and a start with Redis down.
    errors: list[str] = field(default_factory=list)


class Redis:
    """A redis-server of its own on one loopback port, restartable empty."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            sys.exit("bench.ledger_lost needs redis-server (apt-get install it)")
        self._binary, self._folder = binary, folder
        self.port = _free_port()
        self.url = f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"
        self.up = threading.Event()
        self._process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        args = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self._folder)]
        args += ["--requirepass", PASSWORD]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, password=PASSWORD)
        for _ in range(1000):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.005)
        self.up.set()
        return process

    def restart(self) -> None:
        """Stopped and started again: empty, as without persistence."""
        self.up.clear()
        self._process.terminate()
        self._process.wait(timeout=10)
        self._process = self._start()

    def flush(self) -> None:
        redis.Redis(port=self.port, password=PASSWORD).flushdb()

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _jobs(folder: Path, prefix: str, count: int) -> Path:
    folder.mkdir()
    path = folder / "jobs.csv"
    rows = [f"{prefix}{i:03d},run-query,team1," for i in range(count)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def _host(jobs: Path, url: str, ledger: Redis, outcome: Outcome) -> None:
    """One machine: `batchrun submit` until its jobs are done (a run that stops
    with 75 is resumed once Redis is up); every exit code and stderr kept."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    env |= {"BATCHRUN_TOKEN": "tok-shared", "BATCHRUN_LEDGER_URL": ledger.url}
    args = ["submit", str(jobs), "--base-url", url, "--limit", RULE]
    args += ["--state-dir", str(jobs.parent / "state"), "--timeout", "2"]
    for _ in range(_RESUMES):
        ledger.up.wait(timeout=30)
        ended = subprocess.run(
            [sys.executable, "-m", "batchrun", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
        err = ended.stderr.decode()
        outcome.codes.append(ended.returncode)
        outcome.tracebacks += "Traceback" in err
        outcome.said += err.count(_SAID)
        if ended.returncode == 74 and _UNREACHABLE in err:
            # Started while Redis was down (the next restart came before this
            # host was up again): refused at the start, as documented.
            outcome.down_at_start += 1
            continue
        if ended.returncode != 75:
            if ended.returncode != 0:
                outcome.errors.append(err.strip().splitlines()[-1][-300:])
            return


def _disrupt(
    ledger: Redis,
    kind: str,
    moments: list[float],
    sandbox: Any,
    hosts: list[threading.Thread],
) -> float:
    """Restart or flush at `moments` after the first arrival; return its moment
    (none if the hosts ended before sending)."""
    while not sandbox.arrivals:
        if not any(host.is_alive() for host in hosts):
            return time.monotonic()
        time.sleep(0.002)
    start = time.monotonic()
    for moment in moments:
        time.sleep(max(0.0, start + moment - time.monotonic()))
        ledger.restart() if kind == "restart" else ledger.flush()
    return start


def run_once(kind: str, seed: int, moments: list[float], jobs: int) -> Outcome:
    """Two hosts of `jobs` jobs each; Redis restarted or flushed (`kind`) at
    `moments` (seconds after the first arrival at the server)."""
    outcome = Outcome(kind, seed, moments, jobs)
    server = create_app(rules=limit_table(overrides=[parse_override(RULE)]))
    with tempfile.TemporaryDirectory() as folder, running(server) as url:
        ledger = Redis(Path(folder))
        try:
            files = [_jobs(Path(folder) / n, n, jobs) for n in ("a", "b")]
            start = time.monotonic()
            hosts = [
                threading.Thread(target=_host, args=(f, url, ledger, outcome))
                for f in files
            ]
            for host in hosts:
                host.start()
            first = _disrupt(ledger, kind, moments, server.state.sandbox, hosts)
            for host in hosts:
                host.join()
            outcome.seconds = round(time.monotonic() - start, 2)
        finally:
            ledger.stop()
        arrivals = [
            a for a in server.state.sandbox.arrivals if a.key is LimitKey.RUN_QUERY
        ]
    times = sorted(a.at for a in arrivals)
    counts = [sum(1 for u in times if at - WINDOW < u <= at) for at in times]
    outcome.late = [
        round(t - first, 3) for t, n in zip(times, counts, strict=True) if n > COUNT
    ]
    outcome.arrivals = len(times)
    outcome.most = max(counts, default=0)
    outcome.over = sum(1 for n in counts if n > COUNT)
    statuses = Counter(a.status for a in arrivals)
    outcome.refused = statuses[429]
    outcome.accepted = len({a.idempotency_key for a in arrivals if a.status == 200})
    return outcome


def moments_of(
    rng: random.Random, count: int, span: tuple[float, float]
) -> list[float]:
    """`count` seeded moments within `span`, at least one window apart."""
    low, high = span
    step = (high - low) / count
    return [
        round(low + i * step + rng.uniform(0, step - WINDOW), 3) for i in range(count)
    ]
