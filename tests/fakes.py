"""Test doubles shared by several test modules."""

from __future__ import annotations

from batchrun.events import Event
from batchrun.results import JobResult


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
