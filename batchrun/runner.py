"""The orchestration of a run: one dispatcher per limit key, sends in a task group.

Each key's dispatcher takes its next job (a retry that is due, else a fresh one),
waits for a concurrency permit and a pacer slot, and starts the send. Outcomes
(CONTRACT.md section 4) are settled as they come: done and failed jobs are recorded,
429s requeue the job and cool the key down, transient errors retry with backoff.
Every job sent is released back to the pacer, whatever happens to its task.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import anyio
from anyio.abc import TaskGroup

from batchrun.client import Kind, Outcome
from batchrun.clock import Clock
from batchrun.events import (
    Event,
    EventSink,
    JobFinished,
    JobRequeued,
    JobSent,
    RunFinished,
    RunStarted,
    Status,
)
from batchrun.jobs import Job
from batchrun.limits import LimitKey
from batchrun.pacer import Pacer
from batchrun.results import JobResult


class Sender(Protocol):
    """Makes one attempt of a job (batchrun.client.Client)."""

    async def send(self, job: Job) -> Outcome: ...


class Recorder(Protocol):
    """Keeps where each job stands (batchrun.state.Journal): told before a request
    leaves, when a job is requeued, and when it reaches its end."""

    def started(self, job: Job, attempt: int) -> None: ...

    def requeued(self, job: Job, *, maybe_processed: bool) -> None: ...

    def finished(self, result: JobResult) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How hard a run pushes and how it retries; checked when built."""

    concurrency: int = 8
    max_attempts: int = 5
    backoff: float = 1.0
    backoff_cap: float = 60.0
    pace: str = "exact"

    def __post_init__(self) -> None:
        for name in ("concurrency", "max_attempts"):
            if getattr(self, name) < 1:
                msg = f"{name.replace('_', '-')} must be at least 1"
                raise ValueError(msg)


@dataclass(slots=True)
class Tally:
    """What a run achieved, as counts."""

    done: int = 0
    failed: int = 0
    rate_limited: int = 0
    retried: int = 0
    total: int = 0

    @property
    def left(self) -> int:
        return self.total - self.done - self.failed


@dataclass(slots=True)
class _Try:
    job: Job
    attempts: int = 0
    failures: int = 0


@dataclass(slots=True)
class _Queue:
    fresh: Iterator[Job]
    retries: list[tuple[float, int, _Try]] = field(default_factory=list)
    in_flight: int = 0
    rate_limited_streak: int = 0
    changed: anyio.Event = field(default_factory=anyio.Event)

    def wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class Runner:
    """Sends every job through the pacer and settles each outcome."""

    def __init__(
        self,
        *,
        sender: Sender,
        pacer: Pacer,
        clock: Clock,
        sink: EventSink,
        recorder: Recorder,
        settings: Settings,
        rng: random.Random | None = None,
    ) -> None:
        self._sender = sender
        self._pacer = pacer
        self._clock = clock
        self._sink = sink
        self._recorder = recorder
        self._settings = settings
        self._rng = rng or random.Random()
        self._permits = anyio.Semaphore(settings.concurrency)
        self._order = itertools.count()
        self._tally = Tally()
        self._dispatching: anyio.CancelScope | None = None
        self._stop_requested = False

    async def run(
        self, jobs: Mapping[LimitKey, Iterable[Job]], totals: Mapping[LimitKey, int]
    ) -> Tally:
        """Send every job; return when all ended, or when `stop` was called."""
        self._tally.total = sum(totals.values())
        self._emit(
            RunStarted(
                self._clock.now(), totals, self._pacer.rules, self._settings.pace
            )
        )
        async with anyio.create_task_group() as sends:
            with anyio.CancelScope() as self._dispatching:
                if self._stop_requested:
                    self._dispatching.cancel()
                async with anyio.create_task_group() as keys:
                    for key, key_jobs in jobs.items():
                        queue = _Queue(iter(key_jobs))
                        keys.start_soon(self._dispatch, key, queue, sends)
        self._emit(self._finished())
        return self._tally

    def stop(self) -> None:
        """Start no more requests; `run` returns once those in flight are answered."""
        self._stop_requested = True
        if self._dispatching is not None:
            self._dispatching.cancel()

    async def _dispatch(self, key: LimitKey, queue: _Queue, sends: TaskGroup) -> None:
        while (attempt := await self._next(queue)) is not None:
            async with _held(self._permits) as permit:
                ticket = await self._pacer.acquire(key)
                permit.keep()
            queue.in_flight += 1
            sends.start_soon(self._attempt, key, queue, attempt, ticket)

    async def _next(self, queue: _Queue) -> _Try | None:
        while True:
            now = self._clock.now()
            if queue.retries and queue.retries[0][0] <= now:
                return heapq.heappop(queue.retries)[2]
            job = next(queue.fresh, None)
            if job is not None:
                return _Try(job)
            if not queue.retries and queue.in_flight == 0:
                return None
            due = queue.retries[0][0] - now if queue.retries else math.inf
            with anyio.move_on_after(due):
                await queue.changed.wait()

    async def _attempt(
        self, key: LimitKey, queue: _Queue, attempt: _Try, ticket: int
    ) -> None:
        attempt.attempts += 1
        self._recorder.started(attempt.job, attempt.attempts)
        self._emit(JobSent(self._clock.now(), key, attempt.job.id, attempt.attempts))
        try:
            outcome = await self._sender.send(attempt.job)
        finally:
            self._pacer.release(key, ticket)
            self._permits.release()
            queue.in_flight -= 1
            queue.wake()
        self._settle(key, queue, attempt, outcome)

    def _settle(
        self, key: LimitKey, queue: _Queue, attempt: _Try, outcome: Outcome
    ) -> None:
        if outcome.kind is Kind.RATE_LIMITED:
            self._rate_limited(key, queue, attempt, outcome)
        elif outcome.kind is Kind.TRANSIENT:
            self._transient(key, queue, attempt, outcome)
        else:
            queue.rate_limited_streak = 0
            self._finish(key, attempt, outcome)

    def _rate_limited(
        self, key: LimitKey, queue: _Queue, attempt: _Try, outcome: Outcome
    ) -> None:
        self._tally.rate_limited += 1
        queue.rate_limited_streak += 1
        delay = outcome.retry_after
        if delay is None:
            delay = self._backoff(queue.rate_limited_streak)
        # The whole key waits: its other jobs would only collect 429s too.
        self._pacer.cool_down(key, self._clock.now() + delay)
        self._requeue(key, queue, attempt, delay, outcome, rate_limited=True)

    def _transient(
        self, key: LimitKey, queue: _Queue, attempt: _Try, outcome: Outcome
    ) -> None:
        attempt.failures += 1
        if attempt.failures >= self._settings.max_attempts:
            self._finish(key, attempt, outcome)
            return
        self._tally.retried += 1
        delay = self._backoff(attempt.failures)
        self._requeue(key, queue, attempt, delay, outcome, rate_limited=False)

    def _requeue(
        self,
        key: LimitKey,
        queue: _Queue,
        attempt: _Try,
        delay: float,
        outcome: Outcome,
        *,
        rate_limited: bool,
    ) -> None:
        now = self._clock.now()
        # A 429 was not processed; after a 5xx or a timeout the server may have.
        self._recorder.requeued(attempt.job, maybe_processed=not rate_limited)
        entry = (now + delay, next(self._order), attempt)
        heapq.heappush(queue.retries, entry)
        reason = "; ".join(filter(None, [outcome.error, outcome.note])) or "retry"
        self._emit(JobRequeued(now, key, attempt.job.id, delay, rate_limited, reason))

    def _finish(self, key: LimitKey, attempt: _Try, outcome: Outcome) -> None:
        done = outcome.kind is Kind.DONE
        status = Status.DONE if done else Status.FAILED
        if done:
            self._tally.done += 1
        else:
            self._tally.failed += 1
        now = self._clock.now()
        job = attempt.job
        self._recorder.finished(
            JobResult(
                id=job.id,
                type=job.type.value,
                status=status,
                attempts=attempt.attempts,
                http_status=outcome.status,
                response=outcome.body,
                error=outcome.error,
                note=outcome.note,
                finished_at=now,
            )
        )
        self._emit(
            JobFinished(
                now,
                key,
                job.id,
                status,
                attempt.attempts,
                outcome.status,
                outcome.error,
            )
        )

    def _backoff(self, failures: int) -> float:
        """Exponential backoff with "equal jitter": between half and all of the step."""
        step = min(
            self._settings.backoff_cap, self._settings.backoff * 2 ** (failures - 1)
        )
        return self._rng.uniform(step / 2, step)

    def _finished(self) -> RunFinished:
        t = self._tally
        return RunFinished(
            self._clock.now(),
            t.done,
            t.failed,
            t.left,
            t.rate_limited,
            t.retried,
            stopped=t.left > 0,
        )

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)


class _held:
    """Hold a semaphore permit unless `keep()` passes it on before the block ends."""

    def __init__(self, semaphore: anyio.Semaphore) -> None:
        self._semaphore = semaphore
        self._kept = False

    async def __aenter__(self) -> _held:
        await self._semaphore.acquire()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if not self._kept:
            self._semaphore.release()

    def keep(self) -> None:
        self._kept = True
