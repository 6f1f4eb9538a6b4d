"""How the outcome of an attempt is settled (docs/reference/contract.md#the-outcomes):
a done or failed job is recorded; a 429 requeues the job and cools its key down, one
cool-down per episode; a transient error retries with backoff, unless resending
could do the job twice (then it ends unknown).
"""

from __future__ import annotations

import heapq
import itertools
import random
from typing import Protocol

from batchrun.api.breaker import TRIP_AFTER
from batchrun.api.outcome import Kind, Outcome
from batchrun.core.clock import Clock, wall_time
from batchrun.core.events import (
    Event,
    EventSink,
    JobFinished,
    JobRequeued,
    Status,
)
from batchrun.core.limits import LimitKey
from batchrun.jobs.job import Job
from batchrun.pacing.pacer import Pacer
from batchrun.run.queues import Attempt, KeyQueue
from batchrun.run.settings import Settings
from batchrun.store.results import JobResult

# 2 ** 64 seconds outlasts any cap; a float step stays far from overflowing.
_LARGEST_EXPONENT = 64


class Recorder(Protocol):
    """Keeps where each job stands (batchrun.run.journal.Journal): told before a request
    leaves, when a job is requeued, and when it reaches its end."""

    def started(self, job: Job, attempt: int) -> None: ...

    def requeued(self, job: Job, *, maybe_processed: bool) -> None: ...

    def finished(self, result: JobResult) -> None: ...


class Settlement:
    """Settles each outcome; its `recorder` is told of every requeue and every
    end before the event is emitted (which the run's tally counts)."""

    def __init__(
        self,
        *,
        pacer: Pacer,
        clock: Clock,
        sink: EventSink,
        recorder: Recorder,
        settings: Settings,
        rng: random.Random,
    ) -> None:
        self._pacer = pacer
        self._clock = clock
        self._sink = sink
        self._recorder = recorder
        self._settings = settings
        self._rng = rng
        self._order = itertools.count()

    def settle(
        self,
        key: LimitKey,
        queue: KeyQueue,
        attempt: Attempt,
        outcome: Outcome,
        *,
        held: bool = False,
    ) -> None:
        """Finish `attempt` or send it again later; `held`: the breaker stopped
        the run, so a configuration fault or a request that never reached the
        server leaves its job to send, whatever its count."""
        if held and (outcome.fault is not None or not outcome.reached):
            self._requeue(key, queue, attempt, 0.0, outcome, rate_limited=False)
        elif outcome.kind is Kind.RATE_LIMITED:
            self._rate_limited(key, queue, attempt, outcome)
        elif outcome.kind is Kind.TRANSIENT:
            self._transient(key, queue, attempt, outcome)
        else:
            queue.rate_limited_streak = 0
            self._finish(key, attempt, outcome)

    def _rate_limited(
        self, key: LimitKey, queue: KeyQueue, attempt: Attempt, outcome: Outcome
    ) -> None:
        """One cool-down per episode: a 429 for a request sent before the key's
        current cool-down began was part of the burst that caused it, and only waits
        for that cool-down to end; a later 429 (the probe's) starts a longer one."""
        now = self._clock.now()
        began, until = self._pacer.cooling(key)
        if attempt.sent_at < began:
            delay = max(0.0, until - now)
        else:
            queue.rate_limited_streak += 1
            delay = self._cool_down(key, queue.rate_limited_streak, outcome)
            asked = outcome.retry_after
            # The whole key waits: its other jobs would only collect 429s too.
            self._pacer.cool_down(key, now + delay, asked=asked is not None)
        self._requeue(key, queue, attempt, delay, outcome, rate_limited=True)

    def _cool_down(self, key: LimitKey, streak: int, outcome: Outcome) -> float:
        """How long the key waits after the `streak`-th 429 in a row: as long as
        the server asked (Retry-After); else nothing after a lone one (the
        learner reads it; a lone 429 never changes the pace), then from the
        rule's interval, doubling, never longer than its longest window (by
        then every window the server could count in has room again)."""
        if outcome.retry_after is not None:
            return outcome.retry_after
        if streak == 1:
            return 0.0
        rule = self._pacer.rule(key)
        return self._backoff(streak - 1, cap=rule.longest, base=rule.interval)

    def _transient(
        self, key: LimitKey, queue: KeyQueue, attempt: Attempt, outcome: Outcome
    ) -> None:
        if outcome.maybe_processed and not attempt.job.endpoint.safe_to_repeat:
            # Sending it again could do it twice (two invites): only the user,
            # who can check, may ask for that (--retry-unknown).
            self._finish(key, attempt, outcome, status=Status.UNKNOWN)
            return
        attempt.failures += 1
        # A fault every request meets trips the breaker first: only one that
        # others do not meet (a 403 for one team) ends its job.
        floor = TRIP_AFTER if outcome.fault is not None else 0
        if attempt.failures >= max(self._settings.max_attempts, floor):
            self._finish(key, attempt, outcome)
            return
        cap, base = self._settings.backoff_cap, self._settings.backoff
        delay = self._backoff(attempt.failures, cap=cap, base=base)
        self._requeue(key, queue, attempt, delay, outcome, rate_limited=False)

    def _requeue(
        self,
        key: LimitKey,
        queue: KeyQueue,
        attempt: Attempt,
        delay: float,
        outcome: Outcome,
        *,
        rate_limited: bool,
    ) -> None:
        now = self._clock.now()
        # A 429 was not processed, nor a request that never reached the server;
        # after a 5xx or a timeout the server may have.
        maybe = outcome.maybe_processed and outcome.reached
        self._recorder.requeued(attempt.job, maybe_processed=maybe)
        entry = (now + delay, next(self._order), attempt)
        heapq.heappush(queue.retries, entry)
        reason = "; ".join(filter(None, [outcome.error, outcome.note])) or "retry"
        self._emit(JobRequeued(now, key, attempt.job.id, delay, rate_limited, reason))

    def _finish(
        self,
        key: LimitKey,
        attempt: Attempt,
        outcome: Outcome,
        *,
        status: Status | None = None,
    ) -> None:
        now = self._clock.now()
        # The results file is for people: its date is the wall clock's.
        result = JobResult.of(
            attempt.job, attempt.attempts, outcome, wall_time(), status=status
        )
        self._recorder.finished(result)
        self._emit(
            JobFinished(
                now,
                key,
                result.id,
                result.status,
                result.attempts,
                result.http_status,
                result.error,
            )
        )

    def _backoff(self, failures: int, *, cap: float, base: float) -> float:
        """Exponential backoff from `base` with "equal jitter": between half and
        all of the step.

        The exponent stops growing once the step passes any cap, so a server that
        answers 429 for ever cannot overflow it.
        """
        exponent = min(failures - 1, _LARGEST_EXPONENT)
        step = min(cap, base * 2**exponent)
        return self._rng.uniform(step / 2, step)

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)
