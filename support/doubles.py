"""Test doubles the simulation uses, and the tests beside it: an event sink and a
result recorder that keep everything in lists."""

from __future__ import annotations

from typing import Any

from batchrun.core.events import Event
from batchrun.jobs.job import Job
from batchrun.store.results import JobResult


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

    def started(self, job: Job, attempt: int) -> None:
        self.log.append(("started", job.id))

    def requeued(self, job: Job, *, maybe_processed: bool) -> None:
        self.log.append(("requeued", job.id))
        self.maybe_processed.append(maybe_processed)

    def finished(self, result: JobResult) -> None:
        self.log.append(("finished", result.id))
        self.results.append(result)
