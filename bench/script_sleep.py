"""What a user writes instead of batchrun with no library: a plain sleep loop.

Reads the jobs CSV (id,type,team_id,payload) and POSTs each run-query job with the
bearer token in API_TOKEN, one after another, sleeping SECONDS/COUNT before each
send (so never more than COUNT in any SECONDS). On a 429 it waits Retry-After, or
an exponential backoff with jitter if there is none, and sends again. Bounded: at
most 20 tries a job, --deadline seconds in all. Exit 0 if every job was accepted,
else 1.

    API_TOKEN=... python -m bench.script_sleep JOBS --base-url URL --count 30 \
        --seconds 60
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import time

import httpx

TRIES = 20


def backoff(response: httpx.Response, attempt: int) -> float:
    """Retry-After if the server sent it, else 0.5 s doubling with full jitter."""
    header = response.headers.get("Retry-After", "")
    if header.isdigit():
        return float(header)
    return random.uniform(0, min(8.0, 0.5 * 2**attempt))


def send(http: httpx.Client, pause: float, job: dict[str, str]) -> bool:
    url = f"/teams/{job['team_id']}/data/run-query"
    body = json.loads(job.get("payload") or "{}")
    for attempt in range(TRIES):
        time.sleep(pause)
        try:
            answer = http.post(url, json=body, headers={"Idempotency-Key": job["id"]})
        except httpx.TransportError:
            continue
        if answer.status_code != 429:
            return answer.is_success
        time.sleep(backoff(answer, attempt))
    return False


def run(jobs: list[dict[str, str]], args: argparse.Namespace) -> bool:
    pause = args.seconds / args.count
    token = {"Authorization": f"Bearer {os.environ['API_TOKEN']}"}
    stop = time.monotonic() + args.deadline
    done = []
    with httpx.Client(base_url=args.base_url, headers=token) as http:
        for job in jobs:
            if time.monotonic() > stop:
                return False
            done.append(send(http, pause, job))
    return all(done)


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
    raise SystemExit(0 if run(jobs, args) else 1)
