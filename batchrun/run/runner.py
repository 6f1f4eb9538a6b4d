"""The orchestration of a run: `concurrency` workers over one queue per limit key.

A worker takes a key with an attempt due (a retry that is due, else a fresh job),
waits for the key's pacer slot, and sends. Outcomes are settled as they come
(`settlement`), and what the answers teach goes to the pacer (`lessons`).
Every job sent is released back to the pacer, whatever happens to its request.
A ledger lost mid-run (`LedgerLost` from a slot), or a state file that cannot be
written (`StateError`, e.g. a full disk, from a slot or the recorder) stops the run
as `stop` does: no new requests, those in flight answered and recorded where
possible; `halted` says why.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

import anyio

from batchrun.api.breaker import Breaker
from batchrun.api.outcome import Kind, Outcome
from batchrun.core.clock import Clock
from batchrun.core.errors import StateError
from batchrun.core.events import (
    Event,
    EventSink,
    JobAnswered,
    JobSent,
    RunStarted,
    Tally,
)
from batchrun.core.limits import LimitKey, Rule
from batchrun.jobs.job import Job
from batchrun.pacing.arrival import Trip
from batchrun.pacing.pacer import Pacer
from batchrun.pacing.slots import eta
from batchrun.run.lessons import Lessons
from batchrun.run.queues import Attempt, KeyQueue
from batchrun.run.settings import Settings
from batchrun.run.settlement import Recorder, Settlement


class Sender(Protocol):
    """Makes one attempt of a job (batchrun.api.client.Client)."""

    async def send(self, job: Job) -> Outcome: ...


class Runner:
    """Sends every job through the pacer and settles each outcome.

    `concurrency` workers each take the next attempt of a key with work due (the
    key whose jobs take longest under its rule first), wait for its slot, send
    it and settle the answer, then go again. At most one worker
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
        self._learner = pacer.learner
        self._lessons = Lessons(
            pacer=pacer, clock=clock, sink=sink, fallback=settings.fallback
        )
        self._settlement = Settlement(
            pacer=pacer,
            clock=clock,
            sink=sink,
            recorder=recorder,
            settings=settings,
            rng=rng or random.Random(),
        )
        self._tally = self._settlement.tally
        self._queues: list[tuple[LimitKey, KeyQueue]] = []
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
        rules = dict(self._pacer.rules)
        self._queues = sorted(
            ((key, KeyQueue(iter(key_jobs))) for key, key_jobs in jobs.items()),
            key=lambda item: -self._ideal(item[0], totals.get(item[0], 0), rules),
        )
        used = {key: self._pacer.used(key) for key in totals if key in rules}
        at = self._clock.now()
        self._emit(RunStarted(at, totals, rules, self._settings.pace, used))
        self._lessons.recalled()
        async with anyio.create_task_group() as workers:
            for _ in range(self._settings.concurrency):
                workers.start_soon(self._work)
        self._emit(self._settlement.finished())
        return self._tally

    def _ideal(
        self, key: LimitKey, count: int, rules: Mapping[LimitKey, Rule]
    ) -> float:
        """How long `count` jobs of `key` take under its rule, at zero latency."""
        rule = rules.get(key)
        if rule is None or not count:
            return 0.0
        return eta(count, rule, now=0.0, pace=self._settings.pace)

    def stop(self) -> None:
        """Start no more requests; `run` returns once those in flight are answered."""
        self._stop_requested = True
        for scope in self._waits:
            scope.cancel()

    async def _work(self) -> None:
        while (turn := await self._take()) is not None:
            await self._attempt(*turn)

    async def _take(self) -> tuple[LimitKey, KeyQueue, Attempt, int] | None:
        """The next attempt with its slot granted, or None once no work is left."""
        while not self._stop_requested:
            now = self._clock.now()
            soonest = math.inf
            # Keys by their ideal time, longest first: the key that bounds the
            # run gets its first window's sends out before the keys with slack.
            for key, queue in self._queues:
                due = None if queue.claimed else queue.due()
                if due is not None and due <= now:
                    return await self._slot(key, queue)
                if due is not None:
                    soonest = min(soonest, due)
            if soonest == math.inf and self._in_flight == 0 and not self._claimed():
                self._notify()  # wake the other idle workers: they are done too
                return None
            await self._wait_for_change(soonest - now)
        return None

    async def _slot(
        self, key: LimitKey, queue: KeyQueue
    ) -> tuple[LimitKey, KeyQueue, Attempt, int] | None:
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
        self, key: LimitKey, queue: KeyQueue, attempt: Attempt, ticket: int
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
        outcome, by, explained = await self._send(key, ticket, attempt.job)
        now = self._clock.now()
        job_id, latency = attempt.job.id, now - attempt.sent_at
        self._emit(JobAnswered(now, key, job_id, outcome.status, latency))
        # A refusal the pacer explains (`room`) is no news of the rule's count.
        refused = None if explained else _refused(outcome)
        wait = outcome.retry_after
        self._learner.answered(key, sent, now, refused=refused, wait=wait, by=by)
        if refused is False:
            self._pacer.keep_record(key)
        try:
            self._settlement.settle(key, queue, attempt, outcome, explained=explained)
        except StateError as exc:
            # The answer could not be recorded: the store still says in flight,
            # so the next run resends the job if safe, else leaves it unknown.
            self._halt(exc)
        if self.breaker.answered(outcome) is not None:
            self.stop()
        self._lessons.heed(key, outcome.hints, sent if refused is False else None)
        self._lessons.review(key)
        if refused is False:
            self._lessons.rule_out(key)
            self._lessons.retest(key)
        if self._idle:
            self._notify()  # an answer may free a slot, or end the run

    async def _send(
        self, key: LimitKey, ticket: int, job: Job
    ) -> tuple[Outcome, float | None, bool]:
        """Send `job`, and release its slot whatever happens to the request; with
        its outcome, where the learner places its arrival at the latest: by the
        network's bound (`ArrivalBound.latest`), None: by its answer; and whether
        the pacer explains a refusal (`Pacer.release`)."""
        outcome: Outcome | None = None
        explained = False
        began = self._clock.now()
        try:
            outcome = await self._sender.send(job)
        finally:
            # A request that never reached the server spends no budget.
            reached = outcome is None or outcome.reached
            trip = _trip(began, outcome)
            explained = self._pacer.release(
                key, ticket, sent=reached, trip=trip, refused=_refused(outcome)
            )
            self._in_flight -= 1
        by = None if trip is None else self._pacer.arrival.latest(trip.written)
        return outcome, by, explained

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)


def _refused(outcome: Outcome | None) -> bool | None:
    """Whether the server's limiter refused the request (a 429); None when no
    answer says so (only an answer says whether it let the request through)."""
    if outcome is None or outcome.status is None:
        return None
    return outcome.kind is Kind.RATE_LIMITED


def _trip(began: float, outcome: Outcome | None) -> Trip | None:
    """What the client saw of an answered exchange that began at `began`, for the
    pacer's arrival bound; None when the transport did not say when it left."""
    if outcome is None or outcome.written is None:
        return None
    refused, accepted = outcome.kind is Kind.RATE_LIMITED, outcome.kind is Kind.DONE
    written = began + outcome.written
    return Trip(written, outcome.round_trip, refused=refused, accepted=accepted)
