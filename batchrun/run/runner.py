"""The orchestration of a run: `concurrency` workers over one queue per limit key.

A worker takes a key with an attempt due (a retry that is due, else a fresh job),
waits for the key's pacer slot, and sends. Outcomes
(CONTRACT.md section 4) are settled as they come: done and failed jobs are recorded,
429s requeue the job and cool the key down, transient errors retry with backoff.
Every job sent is released back to the pacer, whatever happens to its request.
A ledger lost mid-run (`LedgerLost` from a slot), or a state file that cannot be
written (`StateError`, e.g. a full disk, from a slot or the recorder) stops the run
as `stop` does: no new requests, those in flight answered and recorded where
possible; `halted` says why.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from batchrun.api.breaker import Breaker
from batchrun.api.hints import Hints
from batchrun.api.outcome import Kind, Outcome
from batchrun.core.clock import Clock, wall_time
from batchrun.core.errors import StateError
from batchrun.core.events import (
    Event,
    EventSink,
    JobFinished,
    JobRequeued,
    JobSent,
    RuleLearned,
    RunFinished,
    RunStarted,
    Status,
    Tally,
)
from batchrun.core.limits import LimitKey, Pace, Rule
from batchrun.jobs.job import Job
from batchrun.pacing.learning import Fallback, Lesson, Sent, adopt
from batchrun.pacing.pacer import Pacer
from batchrun.store.results import JobResult

# 2 ** 64 seconds outlasts any cap; a float step stays far from overflowing.
_LARGEST_EXPONENT = 64


class Sender(Protocol):
    """Makes one attempt of a job (batchrun.api.client.Client)."""

    async def send(self, job: Job) -> Outcome: ...


class Recorder(Protocol):
    """Keeps where each job stands (batchrun.run.journal.Journal): told before a request
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
    pace: Pace = Pace.EXACT
    # Windows are divided by this (demos, tests): so are the windows a 429 may be
    # explained by.
    time_scale: float = 1.0
    # The safer rule a key falls back to if the server shows its rule is too
    # loose (--profile auto: run-query's statement B), until that is settled.
    fallback: Mapping[LimitKey, Rule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("concurrency", "max_attempts"):
            if getattr(self, name) < 1:
                msg = f"{name.replace('_', '-')} must be at least 1"
                raise ValueError(msg)


@dataclass(slots=True)
class _Try:
    job: Job
    attempts: int = 0
    failures: int = 0
    sent_at: float = -math.inf


@dataclass(slots=True)
class _Queue:
    """One key's work: fresh jobs in file order, and retries by due time."""

    fresh: Iterator[Job]
    retries: list[tuple[float, int, _Try]] = field(default_factory=list)
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

    def pop(self, now: float) -> _Try:
        """The next attempt: a retry that is due, else the next fresh job (else the
        soonest retry, should the clock have stepped back since `due`)."""
        if self.retries and (self.retries[0][0] <= now or self._ahead is None):
            return heapq.heappop(self.retries)[2]
        job, self._ahead = self._ahead, None
        assert job is not None
        return _Try(job)


class Runner:
    """Sends every job through the pacer and settles each outcome.

    `concurrency` workers each take the next attempt of a key with work due, wait
    for its slot, send it and settle the answer, then go again. At most one worker
    waits on a key's slot; the others take other keys or wait for a change (an
    answer, a retry falling due). A worker that gets its slot at once goes straight
    on to send: a free-running run never hands work between tasks.
    """

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
        self._learner = pacer.learner
        self._recalled = pacer.recall(list(pacer.rules))
        # What an earlier run learned of a key settles its fallback too.
        settled = {key for key, _ in self._recalled}
        self._fallback = {
            key: Fallback(Lesson(rule, f"the safer statement {rule}"), stated=True)
            for key, rule in settings.fallback.items()
            if key in pacer.rules and key not in settled
        }
        # A faster reading kept in doubt is still in doubt.
        for key, lesson in self._recalled:
            if lesson.fallback is not None:
                self._fallback[key] = Fallback(lesson.fallback)
        self._order = itertools.count()
        self._tally = Tally()
        self._queues: list[tuple[LimitKey, _Queue]] = []
        self._turn = 0
        self._in_flight = 0
        self._idle = 0
        self._changed = anyio.Event()
        self._waits: set[anyio.CancelScope] = set()
        self._stop_requested = False
        # Why the run stopped on its own: the ledger lost, a state file unwritable.
        self.halted: StateError | None = None
        self.breaker = Breaker()

    async def run(
        self, jobs: Mapping[LimitKey, Iterable[Job]], totals: Mapping[LimitKey, int]
    ) -> Tally:
        """Send every job; return when all ended, or when `stop` was called."""
        self._tally.total = sum(totals.values())
        self._queues = [(key, _Queue(iter(key_jobs))) for key, key_jobs in jobs.items()]
        rules = dict(self._pacer.rules)
        used = {key: self._pacer.used(key) for key in totals if key in rules}
        at = self._clock.now()
        self._emit(RunStarted(at, totals, rules, self._settings.pace, used))
        for key, lesson in self._recalled:
            spread = self._pacer.pace(key) is Pace.SPREAD
            at = self._clock.now()
            self._emit(
                RuleLearned(at, key, lesson.rule, spread, lesson.evidence, kept=True)
            )
        async with anyio.create_task_group() as workers:
            for _ in range(self._settings.concurrency):
                workers.start_soon(self._work)
        self._emit(self._finished())
        return self._tally

    def stop(self) -> None:
        """Start no more requests; `run` returns once those in flight are answered."""
        self._stop_requested = True
        for scope in self._waits:
            scope.cancel()

    async def _work(self) -> None:
        while (turn := await self._take()) is not None:
            await self._attempt(*turn)

    async def _take(self) -> tuple[LimitKey, _Queue, _Try, int] | None:
        """The next attempt with its slot granted, or None once no work is left."""
        while not self._stop_requested:
            now = self._clock.now()
            soonest = math.inf
            count = len(self._queues)
            for step in range(count):
                key, queue = self._queues[(self._turn + step) % count]
                due = None if queue.claimed else queue.due()
                if due is not None and due <= now:
                    self._turn = (self._turn + step + 1) % count
                    return await self._slot(key, queue)
                if due is not None:
                    soonest = min(soonest, due)
            if soonest == math.inf and self._in_flight == 0 and not self._claimed():
                self._notify()  # wake the other idle workers: they are done too
                return None
            await self._wait_for_change(soonest - now)
        return None

    async def _slot(
        self, key: LimitKey, queue: _Queue
    ) -> tuple[LimitKey, _Queue, _Try, int] | None:
        queue.claimed = True
        try:
            with self._stoppable():
                try:
                    ticket = await self._pacer.acquire(key)
                except StateError as lost:
                    # No budget to draw on: send nothing more; answers still come.
                    self._halt(lost)
                    return None
                attempt = queue.pop(self._clock.now())
                self._in_flight += 1
                return key, queue, attempt, ticket
            return None  # stopped while waiting
        finally:
            queue.claimed = False
            if self._idle:
                self._notify()  # the key is free for another worker

    def _halt(self, why: StateError) -> None:
        if self.halted is None:
            self.halted = why
        self.stop()

    def _claimed(self) -> bool:
        return any(queue.claimed for _, queue in self._queues)

    async def _wait_for_change(self, delay: float) -> None:
        self._idle += 1
        try:
            with self._stoppable(), anyio.move_on_after(delay):
                await self._changed.wait()
        finally:
            self._idle -= 1

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    @contextlib.contextmanager
    def _stoppable(self) -> Iterator[None]:
        """A wait that `stop` cuts short."""
        with anyio.CancelScope() as scope:
            self._waits.add(scope)
            try:
                yield
            finally:
                self._waits.discard(scope)

    async def _attempt(
        self, key: LimitKey, queue: _Queue, attempt: _Try, ticket: int
    ) -> None:
        attempt.attempts += 1
        attempt.sent_at = self._clock.now()
        try:
            self._recorder.started(attempt.job, attempt.attempts)
        except StateError as exc:
            # Not recorded as in flight, so not sent: the store still has it to send.
            self._pacer.release(key, ticket, sent=False)
            self._in_flight -= 1
            self._halt(exc)
            return
        probe = self._pacer.probe(key)
        sent = self._learner.sent(key, attempt.sent_at, probe=probe)
        self._emit(JobSent(self._clock.now(), key, attempt.job.id, attempt.attempts))
        outcome: Outcome | None = None
        try:
            outcome = await self._sender.send(attempt.job)
        finally:
            # A request that never reached the server spends no budget.
            reached = outcome is None or outcome.reached
            self._pacer.release(key, ticket, sent=reached)
            self._in_flight -= 1
        # Only an answer says whether the server's limiter let the request through.
        refused = None if outcome.status is None else outcome.kind is Kind.RATE_LIMITED
        self._learner.answered(
            key, sent, self._clock.now(), refused=refused, wait=outcome.retry_after
        )
        if refused is False:
            self._pacer.keep_record(key)
        try:
            self._settle(key, queue, attempt, outcome)
        except StateError as exc:
            # The answer could not be recorded: the store still says in flight,
            # so the next run resends the job if safe, else leaves it unknown.
            self._halt(exc)
        if self.breaker.answered(outcome) is not None:
            self.stop()
        self._heed(key, outcome.hints, sent if refused is False else None)
        self._review(key)
        if refused is False and key in self._fallback:
            self._rule_out(key)
        if self._idle:
            self._notify()  # an answer may free a slot, or end the run

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
        """One cool-down per episode: a 429 for a request sent before the key's
        current cool-down began was part of the burst that caused it, and only waits
        for that cool-down to end; a later 429 (the probe's) starts a longer one."""
        self._tally.rate_limited += 1
        now = self._clock.now()
        began, until = self._pacer.cooling(key)
        if attempt.sent_at <= began:
            delay = max(0.0, until - now)
        else:
            queue.rate_limited_streak += 1
            # Without Retry-After, never longer than the key's longest window: by
            # then every window the server could be counting in has room again.
            cap = self._pacer.rules[key].longest
            asked = outcome.retry_after
            streak = queue.rate_limited_streak
            delay = self._backoff(streak, cap=cap) if asked is None else asked
            # The whole key waits: its other jobs would only collect 429s too.
            self._pacer.cool_down(key, now + delay, asked=asked is not None)
            self._learner.episode(key, self._pacer.cooling(key)[0])
        self._requeue(key, queue, attempt, delay, outcome, rate_limited=True)

    def _heed(self, key: LimitKey, hints: Hints | None, accepted: Sent | None) -> None:
        """Follow what an answer's headers say: a stated policy stricter than the
        rule is adopted before it costs a 429; a spent budget waits for its reset.

        A spent budget that the ledger accounts for is only our own count: the rule
        waits it out to the moment (a reset is often rounded up to whole seconds).
        One that it does not (the server counts stricter, another client of the
        token, an earlier run) is held until the stated reset, and if the server
        let this request (`accepted`) through and states no policy (which would
        explain it), it teaches the count as a 429 would.
        """
        if hints is None:
            return
        if hints.policy:
            lesson = adopt(self._pacer.rules[key], hints.policy, "rate-limit headers")
            if lesson is not None:
                self._learned(key, lesson)
        if hints.remaining != 0 or self._pacer.full(key):
            return
        if accepted is not None and not hints.policy:
            # A stated policy explains its own "none remaining": the rule holds
            # to it already (a request's answer can come after the server
            # counted the next one), and the count is no news.
            self._learner.spent(key, accepted)
        if hints.reset:
            self._pacer.hold(key, self._clock.now() + hints.reset)

    def _review(self, key: LimitKey) -> None:
        """Once a 429 episode of `key` has settled, pace by what it taught."""
        spread = self._pacer.pace(key) is Pace.SPREAD
        safer = self._fallback.get(key)
        rule = self._pacer.rules[key]
        lesson = self._learner.review(key, rule, spread=spread, safer=safer)
        if lesson is not None:
            self._learned(key, lesson)

    def _rule_out(self, key: LimitKey) -> None:
        """Drop `key`'s fallback once the server let through more than it allows."""
        given = self._pacer.rules[key]
        lesson = self._fallback[key].ruled_out(self._learner, key, given)
        if lesson is not None:
            self._learned(key, lesson, ruled_out=True)

    def _learned(
        self, key: LimitKey, lesson: Lesson, *, ruled_out: bool = False
    ) -> None:
        # A lesson settles a fallback, unless it is the first to only space the
        # same rule evenly (the count is still in question): one that rules the
        # fallback out drops it; any other (a tighter rule, a refusal past what
        # the fallback allows, 429s that still come when spread) takes it.
        given = self._pacer.rules[key]
        spread = self._pacer.pace(key) is Pace.SPREAD
        first_spread = lesson.spread and lesson.rule == given and not spread
        fallback = None if first_spread else self._fallback.pop(key, None)
        if fallback is not None and not ruled_out:
            lesson = fallback.taken(lesson, given)
        if lesson.fallback is not None:
            self._fallback[key] = Fallback(lesson.fallback)
        # Later runs start from a faster reading with the safer one behind it,
        # as this one goes on; while a safer rule stands that is no reading of
        # the log (--profile auto's B), from the lesson joined with it.
        standing = None if lesson.fallback else self._fallback.get(key)
        kept = None if standing is None else standing.kept(lesson)
        self._pacer.learn(key, lesson, kept=kept)
        at = self._clock.now()
        spread = self._pacer.pace(key) is Pace.SPREAD
        self._emit(RuleLearned(at, key, lesson.rule, spread, lesson.evidence))

    def _transient(
        self, key: LimitKey, queue: _Queue, attempt: _Try, outcome: Outcome
    ) -> None:
        if outcome.maybe_processed and not attempt.job.endpoint.safe_to_repeat:
            # Sending it again could do it twice (two invites): only the user,
            # who can check, may ask for that (--retry-unknown).
            self._finish(key, attempt, outcome, status=Status.UNKNOWN)
            return
        attempt.failures += 1
        if attempt.failures >= self._settings.max_attempts:
            self._finish(key, attempt, outcome)
            return
        self._tally.retried += 1
        delay = self._backoff(attempt.failures, cap=self._settings.backoff_cap)
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
        attempt: _Try,
        outcome: Outcome,
        *,
        status: Status | None = None,
    ) -> None:
        now = self._clock.now()
        # The results file is for people: its date is the wall clock's.
        result = JobResult.of(
            attempt.job, attempt.attempts, outcome, wall_time(), status=status
        )
        if result.status is Status.DONE:
            self._tally.done += 1
        elif result.status is Status.UNKNOWN:
            self._tally.unknown += 1
        else:
            self._tally.failed += 1
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

    def _backoff(self, failures: int, *, cap: float) -> float:
        """Exponential backoff with "equal jitter": between half and all of the step.

        The exponent stops growing once the step passes any cap, so a server that
        answers 429 for ever cannot overflow it.
        """
        exponent = min(failures - 1, _LARGEST_EXPONENT)
        step = min(cap, self._settings.backoff * 2**exponent)
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
            unknown=t.unknown,
        )

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)
