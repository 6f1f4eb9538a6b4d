"""Test doubles shared by several test modules."""

from __future__ import annotations

import random

import httpx

from batchrun.client import Client
from batchrun.clock import LoopClock
from batchrun.events import Event
from batchrun.ledger import MemoryLedger
from batchrun.pacer import Pacer
from batchrun.results import JobResult
from batchrun.runner import Runner, Settings

BASE = "https://api.example.test"


class ListSink:
    """An event sink that keeps every event, for assertions."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


class ListRecorder:
    """A recorder that keeps every result, and every start and requeue, in lists."""

    def __init__(self) -> None:
        self.results: list[JobResult] = []
        self.log: list[tuple[str, str]] = []

    def started(self, job, attempt: int) -> None:
        self.log.append(("started", job.id))

    def requeued(self, job, *, maybe_processed: bool) -> None:
        self.log.append(("requeued", job.id))

    def finished(self, result: JobResult) -> None:
        self.log.append(("finished", result.id))
        self.results.append(result)


def make_runner(
    router, rules, sink, *, recorder=None, token=None, timeout=30.0, **settings
):
    """A Runner and its Client over a respx router, on the test's (virtual) clock."""
    clock = LoopClock()
    pacer = Pacer(rules=rules, ledger=MemoryLedger(), clock=clock, sink=sink)
    transport = httpx.MockTransport(router.async_handler)
    client = Client(
        base_url=BASE, token=token, scope="f", timeout=timeout, transport=transport
    )
    runner = Runner(
        sender=client,
        pacer=pacer,
        clock=clock,
        sink=sink,
        recorder=recorder or ListRecorder(),
        settings=Settings(**settings),
        rng=random.Random(1),
    )
    return client, runner
