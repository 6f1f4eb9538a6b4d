"""The same workload driven by batchrun and by small loops around the anchors.

Each driver sends `count` run-query jobs to `base_url` with at most `concurrency`
requests in flight, and returns when every job got a non-429 answer. A 429 is
retried after its Retry-After: batchrun by its runner (which also cools the key
down), the anchor loops by sleeping and acquiring the limiter again (aiometer has no
acquire, so its retry goes out unpaced).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiometer
import anyio
import httpx

from batchrun.core.clock import MachineClock
from batchrun.core.events import JobFinished, JobRequeued, JobSent
from batchrun.core.identity import Identity
from batchrun.core.limits import LimitKey, Rule
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.ledger import MemoryLedger
from batchrun.run.journal import Journal
from batchrun.run.settings import Settings
from batchrun.run.wiring import Target, open_run
from batchrun.store.results import ResultsFile
from batchrun.store.state import RunStore
from bench.anchors import Acquire, aiometer_rate

PATH = "/teams/acme/data/run-query"
PAYLOAD = {"query": "select 1"}


class NullSink:
    """Drops every event (no progress view in a benchmark)."""

    def emit(self, event: object) -> None:
        pass


class InFlight:
    """Counts batchrun's requests in flight at each send, from its own events."""

    def __init__(self) -> None:
        self.now = 0
        self.sends = 0
        self.total = 0

    def emit(self, event: object) -> None:
        if isinstance(event, JobSent):
            self.now += 1
            self.sends += 1
            self.total += self.now
        elif isinstance(event, JobFinished | JobRequeued):
            self.now -= 1

    @property
    def mean(self) -> float:
        return self.total / max(1, self.sends)


class NullRecorder:
    """Keeps no state (the CLI's SQLite journal is measured separately)."""

    def started(self, job: Job, attempt: int) -> None:
        pass

    def requeued(self, job: Job, *, maybe_processed: bool) -> None:
        pass

    def finished(self, result: Any) -> None:
        pass


def jobs(count: int) -> Iterator[Job]:
    """`count` run-query jobs for team acme."""
    for number in range(count):
        yield Job(f"q-{number}", JobType.RUN_QUERY, "acme", dict(PAYLOAD))


async def drive_batchrun(
    base_url: str,
    rules: dict[LimitKey, Rule],
    count: int,
    concurrency: int,
    sink: Any = None,
    *,
    state: str = "memory",
) -> int:
    """batchrun's Runner + Client + Pacer, wired as in the CLI.

    `state` is what the run keeps: "memory" (a MemoryLedger, job records dropped),
    "ledger" (the shared SqliteLedger instead) or "durable" (that ledger, and the
    run store and results file of `batchrun submit`, in a temporary folder).
    Returns the number of retries after transient errors (the runner's own count).
    """
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        ledger: Any = MemoryLedger()
        recorder: Any = NullRecorder()
        source: Iterable[Job] = jobs(count)
        if state in ("ledger", "durable"):
            ledger = SqliteLedger(
                Path(folder) / "ledger.db",
                client="bench",
                hold=30.0,
                now=MachineClock().now,
            )
            stack.callback(ledger.close)
        if state == "durable":
            store = stack.enter_context(RunStore(Path(folder) / "run.db"))
            numbered = (replace(job, line=n) for n, job in enumerate(source, 2))
            store.sync(numbered, path="bench", restart=False)
            results = stack.enter_context(ResultsFile(Path(folder) / "results.jsonl"))
            recorder = Journal(store, results)
            source = store.pending(LimitKey.RUN_QUERY)
        target = Target(identity=Identity(base_url=base_url), timeout=30.0)
        async with open_run(
            target,
            rules=rules,
            settings=Settings(concurrency=concurrency),
            ledger=ledger,
            clock=MachineClock(),
            sink=sink or NullSink(),
            recorder=recorder,
            scope="bench",
        ) as runner:
            tally = await runner.run(
                {LimitKey.RUN_QUERY: source}, {LimitKey.RUN_QUERY: count}
            )
    return tally.retried


def _http(base_url: str, concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency)
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0)


async def _send(http: httpx.AsyncClient, acquire: Acquire | None) -> int:
    """One job: acquire a slot (if paced), send, and retry after any 429.

    A connection error (e.g. a kept-alive connection the server just closed) is
    retried at once, through the limiter again; returns how many there were.
    """
    errors = 0
    while True:
        if acquire is not None:
            await acquire()
        try:
            response = await http.post(PATH, json=PAYLOAD)
        except httpx.TransportError:
            errors += 1
            continue
        if response.status_code != 429:
            return errors
        await anyio.sleep(float(response.headers.get("Retry-After", "1")))


async def drive_loop(
    base_url: str, acquire: Acquire | None, count: int, concurrency: int
) -> int:
    """`concurrency` workers share the jobs; each acquires, then sends.

    Returns the number of connection errors retried.
    """
    remaining = iter(range(count))
    errors = [0]

    async def worker() -> None:
        for _ in remaining:
            errors[0] += await _send(http, acquire)

    async with _http(base_url, concurrency) as http, anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return errors[0]


async def drive_aiometer(
    base_url: str, rule: Rule, count: int, concurrency: int
) -> int:
    """`aiometer.run_on_each` at the rule's long-run rate; returns connection errors."""
    errors = [0]
    async with _http(base_url, concurrency) as http:

        async def one(_: int) -> None:
            errors[0] += await _send(http, None)

        await aiometer.run_on_each(
            one,
            range(count),
            max_at_once=concurrency,
            max_per_second=aiometer_rate(rule),
        )
    return errors[0]
