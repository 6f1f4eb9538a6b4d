"""The work of one limit key: its fresh jobs in file order and its retries by due
time, and the attempt of a job that moves between them."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from batchrun.jobs.job import Job


@dataclass(slots=True)
class Attempt:
    """A job on its way: how often it was sent and failed, and when last sent."""

    job: Job
    attempts: int = 0
    failures: int = 0
    sent_at: float = -math.inf


@dataclass(slots=True)
class KeyQueue:
    """One key's work: fresh jobs in file order, and retries by due time."""

    fresh: Iterator[Job]
    retries: list[tuple[float, int, Attempt]] = field(default_factory=list)
    rate_limited_streak: int = 0
    # A worker is waiting for this key's next slot; the others leave the key alone.
    claimed: bool = False
    _ahead: Job | None = None

    def due(self) -> float | None:
        """When an attempt is next ready: -inf if a fresh job is, None if none left."""
        if self._ahead is None:
            self._ahead = next(self.fresh, None)
        if self._ahead is not None:
            return -math.inf
        return self.retries[0][0] if self.retries else None

    def pop(self, now: float) -> Attempt:
        """The next attempt: a retry that is due, else the next fresh job (else the
        soonest retry, should the clock have stepped back since `due`)."""
        if self.retries and (self.retries[0][0] <= now or self._ahead is None):
            return heapq.heappop(self.retries)[2]
        job, self._ahead = self._ahead, None
        assert job is not None
        return Attempt(job)
