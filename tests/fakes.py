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
    """A results recorder that keeps every result in a list."""

    def __init__(self) -> None:
        self.results: list[JobResult] = []

    def write(self, result: JobResult) -> None:
        self.results.append(result)
