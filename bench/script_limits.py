"""What a user writes instead of batchrun, around limits (moving window).

Reads the jobs CSV (id,type,team_id,payload) and POSTs each run-query job with the
bearer token in API_TOKEN, 8 at a time. Before each send it takes a hit of
`RateLimitItemPerSecond(COUNT, SECONDS)` from a `MovingWindowRateLimiter` in memory,
sleeping until the window's reset time while the hit is refused. On a 429 it waits
Retry-After, or an exponential backoff with jitter if there is none, and sends again.
Bounded: at most 20 tries a job, --deadline seconds in all. Exit 0 if every job was
accepted, else 1.

    API_TOKEN=... python -m bench.script_limits JOBS --base-url URL --count 30 \
        --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import time

import httpx
from limits import RateLimitItemPerSecond
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

WORKERS = 8
TRIES = 20


def backoff(response: httpx.Response, attempt: int) -> float:
    """Retry-After if the server sent it, else 0.5 s doubling with full jitter."""
    header = response.headers.get("Retry-After", "")
    if header.isdigit():
        return float(header)
    return random.uniform(0, min(8.0, 0.5 * 2**attempt))


class Window:
    """A moving window of COUNT hits per SECONDS, waited for before each send."""

    def __init__(self, count: int, seconds: float) -> None:
        self.limiter = MovingWindowRateLimiter(MemoryStorage())
        self.item = RateLimitItemPerSecond(count, int(seconds))

    async def acquire(self) -> None:
        while not self.limiter.hit(self.item, "run-query"):
            reset, _ = self.limiter.get_window_stats(self.item, "run-query")
            await asyncio.sleep(max(0.01, reset - time.time()))


async def send(http: httpx.AsyncClient, limiter: Window, job: dict[str, str]) -> bool:
    url = f"/teams/{job['team_id']}/data/run-query"
    body = json.loads(job.get("payload") or "{}")
    for attempt in range(TRIES):
        await limiter.acquire()
        try:
            answer = await http.post(
                url, json=body, headers={"Idempotency-Key": job["id"]}
            )
        except httpx.TransportError:
            continue
        if answer.status_code != 429:
            return answer.is_success
        await asyncio.sleep(backoff(answer, attempt))
    return False


async def run(jobs: list[dict[str, str]], args: argparse.Namespace) -> bool:
    limiter = Window(args.count, args.seconds)
    token = {"Authorization": f"Bearer {os.environ['API_TOKEN']}"}
    queue = iter(jobs)
    async with httpx.AsyncClient(base_url=args.base_url, headers=token) as http:

        async def worker() -> list[bool]:
            return [await send(http, limiter, job) for job in queue]

        workers = asyncio.gather(*(worker() for _ in range(WORKERS)))
        done = await asyncio.wait_for(workers, args.deadline)
    return all(ok for results in done for ok in results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("jobs")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--deadline", type=float, default=600)
    args = parser.parse_args()
    with open(args.jobs, newline="") as file:
        jobs = [row for row in csv.DictReader(file) if row["type"] == "run-query"]
    raise SystemExit(0 if asyncio.run(run(jobs, args)) else 1)
