"""Test doubles shared by several test modules."""

from __future__ import annotations

import random
from typing import Any

import anyio
import httpx

from batchrun.core.clock import LoopClock
from batchrun.core.events import Event
from batchrun.core.identity import Identity
from batchrun.pacing.ledger import MemoryLedger
from batchrun.run.settings import Settings
from batchrun.run.wiring import Target, open_run
from batchrun.store.results import JobResult

BASE = "https://api.example.test"


class ListSink:
    """An event sink that keeps every event, for assertions."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class ListRecorder:
    """A recorder that keeps every result, and every start and requeue, in lists."""

    def __init__(self) -> None:
        self.results: list[JobResult] = []
        self.log: list[tuple[str, str]] = []
        # The `maybe_processed` of each requeue, in order.
        self.maybe_processed: list[bool] = []

    def started(self, job, attempt: int) -> None:
        self.log.append(("started", job.id))

    def requeued(self, job, *, maybe_processed: bool) -> None:
        self.log.append(("requeued", job.id))
        self.maybe_processed.append(maybe_processed)

    def finished(self, result: JobResult) -> None:
        self.log.append(("finished", result.id))
        self.results.append(result)


def make_runner(
    router,
    rules,
    sink,
    *,
    recorder=None,
    token=None,
    timeout=30.0,
    ledger=None,
    **settings,
):
    """An async context of a Runner (`wiring.open_run`) over a respx router,
    on the test's (virtual) clock."""
    target = Target(
        identity=Identity(base_url=BASE, token=token),
        timeout=timeout,
        transport=httpx.MockTransport(router.async_handler),
    )
    return open_run(
        target,
        rules=rules,
        settings=Settings(**settings),
        ledger=ledger or MemoryLedger(),
        clock=LoopClock(),
        sink=sink,
        recorder=recorder or ListRecorder(),
        scope="f",
        rng=random.Random(1),
    )


class Latency(httpx.AsyncBaseTransport):
    """Half a round trip before the server sees a request, half after it answers,
    so that requests overlap in flight as they do over a network."""

    def __init__(self, inner: httpx.AsyncBaseTransport, rtt: float) -> None:
        self._inner, self._half = inner, rtt / 2

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await anyio.sleep(self._half)
        response = await self._inner.handle_async_request(request)
        await anyio.sleep(self._half)
        return response
