"""Issue 12: CPU and wall time per grant, every ledger side by side in one run.

`python -m bench.ledgers [GRANTS]` starts its own redis-server on a free loopback
port (no persistence), then times reserve + release `GRANTS` times (default 5000)
under a rule that never makes anyone wait, so each number is the bookkeeping cost of
a grant alone: MemoryLedger, SqliteLedger, RedisLedger, and limits' moving window
(the `limits` package, `MovingWindowRateLimiter.hit`) on the same Redis.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import limits
import limits.storage
import limits.strategies
import redis

from batchrun.core.limits import Pace, parse_rule
from batchrun.ledgers.redis_ledger import RedisLedger
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.slots import Grant

WIDE = parse_rule("1000000/1s")


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server on loopback; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("bench.ledgers needs redis-server (apt-get install redis-server)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", folder]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        try:
            _wait(port)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=10)


def _wait(port: int) -> None:
    for _ in range(500):
        try:
            redis.Redis(port=port).ping()
            return
        except redis.ConnectionError:
            time.sleep(0.01)
    msg = "redis-server did not start"
    raise RuntimeError(msg)


def timed(grants: int, one: Callable[[], None]) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of `one`, after a warm-up of 200 calls."""
    for _ in range(200):
        one()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(grants):
        one()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / grants * 1e6, wall / grants * 1e6


def ledger_grant(ledger: Any) -> Callable[[], None]:
    def one() -> None:
        now = time.time()
        grant = ledger.reserve("k", WIDE, Pace.EXACT, now)
        if not isinstance(grant, Grant):
            raise RuntimeError(grant)
        ledger.release(grant.ticket, now)

    return one


def moving_window_hit(url: str) -> Callable[[], None]:
    limiter = limits.strategies.MovingWindowRateLimiter(
        limits.storage.RedisStorage(url)
    )
    item = limits.RateLimitItemPerSecond(1_000_000)

    def one() -> None:
        if not limiter.hit(item, "k"):
            msg = "refused"
            raise RuntimeError(msg)

    return one


def main(grants: int) -> None:
    with redis_server() as url, tempfile.TemporaryDirectory() as folder:
        sqlite = SqliteLedger(
            Path(folder) / "l.db", client="b", hold=30.0, now=time.time
        )
        rows = {
            "MemoryLedger": ledger_grant(MemoryLedger()),
            "SqliteLedger (WAL file)": ledger_grant(sqlite),
            "RedisLedger (loopback)": ledger_grant(
                RedisLedger(url, client="b", hold=30.0, now=time.time)
            ),
            "limits moving window (same Redis)": moving_window_hit(url),
        }
        print(f"{grants} grants each; µs per grant (reserve + release)")
        print(f"{'ledger':36} {'CPU':>8} {'wall':>8}")
        for name, one in rows.items():
            cpu, wall = timed(grants, one)
            print(f"{name:36} {cpu:8.1f} {wall:8.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
