"""The orchestration of a run: workers over one queue per limit key, at most
`concurrency` requests in flight, or with none given as many as the limits need
(`settings.in_flight_cap`: each key's rate times its answer times).

A worker takes a key with an attempt due (a retry that is due, else a fresh job),
waits for the key's pacer slot, and sends. Outcomes are settled as they come
(`settlement`), and what the answers teach goes to the pacer (`lessons`).
Every job sent is released back to the pacer, whatever happens to its request.
A ledger lost mid-run (`LedgerLost` from a slot), or a state file that cannot be
written (`StateError`, e.g. a full disk, from a slot or the recorder) stops the run
as `stop` does, and so does the circuit breaker: no new requests, those in flight
answered and recorded where possible; `stopped` says why.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
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
    InFlightCapped,
    JobAnswered,
    JobSent,
    RunFinished,
    RunStarted,
    RunTally,
    Tally,
    Tee,
)
from batchrun.core.limits import LimitKey, Rule
from batchrun.jobs.job import Job
from batchrun.pacing.arrival import Trip
from batchrun.pacing.learner import Learner
from batchrun.pacing.pacer import Pacer
from batchrun.pacing.slots import eta
from batchrun.run.exit_code import Cause, Stop
from batchrun.run.queues import Attempt, KeyQueue
from batchrun.run.settings import IN_FLIGHT_CEILING, Settings, in_flight_cap
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
        wall: Callable[[], float] = wall_time,
        tally: RunTally | None = None,
    ) -> None:
        self._sender = sender
        self._pacer = pacer
        self._clock = clock
        # The run's counts (`tally`, if given: one its view reads too) hear
        # each event first, so that every listener reads them counted.
        self.tally = RunTally() if tally is None else tally
        sink = Tee(self.tally, sink)
        self._sink = sink
        self._recorder = recorder
        self._settings = settings
        self._learner = Learner(
            pacer=pacer,
            clock=clock,
            sink=sink,
            usual=settings.usual,
            fallback=settings.fallback,
            wall=wall,
        )
        self._recalled = self._learner.recall(list(pacer.rules))
        self._settlement = Settlement(
            pacer=pacer,
            clock=clock,
            sink=sink,
            recorder=recorder,
            settings=settings,
            rng=rng or random.Random(),
        )
        self._queues: list[tuple[LimitKey, KeyQueue]] = []
        self._in_flight = 0
        self._idle = 0
        self._changed = anyio.Event()
        self._waits: set[anyio.CancelScope] = set()
        self._stop_requested = False
        # Workers taking a slot, and the slow end of each key's answer times
        # (for the cap with no --concurrency).
        self._claiming = 0
        self._answers: dict[LimitKey, _AnswerTimes] = {}
        # Since when a key had a request due and room in its limit, but the cap
        # on requests in flight held it back (None: not now).
        self._capped_since: float | None = None
        # Why the run stopped early: told by `stop`, or its own (the ledger lost,
        # a state file unwritable, the breaker); None while it has not.
        self.stopped: Stop | None = None
        self.breaker = Breaker()

    async def run(
        self, jobs: Mapping[LimitKey, Iterable[Job]], totals: Mapping[LimitKey, int]
    ) -> Tally:
        """Send every job; return when all ended, or when `stop` was called,
        with the run's counts."""
        rules = dict(self._pacer.rules)
        self._queues = sorted(
            ((key, KeyQueue(iter(key_jobs))) for key, key_jobs in jobs.items()),
            key=lambda item: -self._ideal(item[0], totals.get(item[0], 0), rules),
        )
        used = {key: self._pacer.used(key) for key in totals if key in rules}
        at = self._clock.now()
        self._emit(RunStarted(at, totals, rules, self._settings.pace, used))
        for learned in self._recalled:
            self._emit(learned)
        given = self._settings.concurrency
        # One worker more than the cap: it sees when the cap, not the limit,
        # holds a request back (`_hold`).
        most = IN_FLIGHT_CEILING if given is None else given
        async with anyio.create_task_group() as workers:
            for _ in range(most + 1):
                workers.start_soon(self._work)
        self._uncap()
        counts = self.tally.whole()
        self._emit(RunFinished(self._clock.now(), stopped=counts.left > 0))
        return counts

    def _ideal(
        self, key: LimitKey, count: int, rules: Mapping[LimitKey, Rule]
    ) -> float:
        """How long `count` jobs of `key` take under its rule, at zero latency."""
        rule = rules.get(key)
        if rule is None or not count:
            return 0.0
        return eta(count, rule, now=0.0, pace=self._settings.pace)

    def stop(self, why: Stop | None = None) -> None:
        """Start no more requests; `run` returns once those in flight are answered.
        `why` joins the causes of `stopped` (none given: as a deadline)."""
        why = why or Stop.of(Cause.DEADLINE)
        self.stopped = why if self.stopped is None else self.stopped.then(why)
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
                    if self._hold(key):
                        soonest = math.nan  # held by the cap: until an answer
                        break
                    return await self._slot(key, queue)
                if due is not None:
                    soonest = min(soonest, due)
            if soonest == math.inf and not self._claimed():
                self._uncap()  # nothing is due: the cap holds nothing back
                if self._in_flight == 0:
                    self._notify()  # wake the other idle workers: they are done too
                    return None
            held = math.isnan(soonest)
            await self._wait_for_change(math.inf if held else soonest - now)
        return None

    def cap(self) -> int:
        """The most requests in flight now: --concurrency, else as the limits
        need (`in_flight_cap`)."""
        if self._settings.concurrency is not None:
            return self._settings.concurrency
        answers = {key: times.slow for key, times in self._answers.items()}
        return in_flight_cap(self._pacer.rules, answers)

    def _hold(self, key: LimitKey) -> bool:
        """Whether the cap on requests in flight holds back a request of `key`
        that is due; if its limit has room, the cap sets the pace (said once
        an episode, `InFlightCapped`; the limit holding a slot ends it, in
        `_slot`)."""
        cap = self.cap()
        if self._in_flight + self._claiming < cap:
            return False
        if self._capped_since is None and not self._pacer.full(key):
            self._capped_since = now = self._clock.now()
            given = self._settings.concurrency is not None
            self._emit(InFlightCapped(now, cap, given=given))
        return True

    def _uncap(self) -> None:
        """The cap no longer sets the pace: say for how long it did."""
        if self._capped_since is None:
            return
        now, since = self._clock.now(), self._capped_since
        self._capped_since = None
        given = self._settings.concurrency is not None
        self._emit(InFlightCapped(now, self.cap(), given=given, lasted=now - since))

    async def _slot(
        self, key: LimitKey, queue: KeyQueue
    ) -> tuple[LimitKey, KeyQueue, Attempt, int] | None:
        queue.claimed = True
        self._claiming += 1
        try:
            with self._stoppable():
                try:
                    if self._pacer.full(key):
                        self._uncap()  # the limit holds it: the limit sets the pace
                    ticket = await self._pacer.acquire(key)
                except StateError as lost:
                    # No budget to draw on: send nothing more; answers still come.
                    self.stop(Stop.failing(lost))
                    return None
                attempt = queue.pop(self._clock.now())
                self._in_flight += 1
                return key, queue, attempt, ticket
            return None  # stopped while waiting
        finally:
            queue.claimed = False
            self._claiming -= 1
            if self._idle:
                self._notify()  # the key is free for another worker

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
    def _stopping(self) -> Iterator[None]:
        """A state file or the ledger that fails inside stops the run, as a lost
        slot does, instead of ending it with the error at once."""
        try:
            yield
        except StateError as exc:
            self.stop(Stop.failing(exc))

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
            self.stop(Stop.failing(exc))
            return
        sent = self._learner.sent(key, attempt.sent_at)
        self._emit(JobSent(self._clock.now(), key, attempt.job.id, attempt.attempts))
        outcome, by = await self._send(key, ticket, attempt.job)
        now = self._clock.now()
        job_id, latency = attempt.job.id, now - attempt.sent_at
        self._emit(JobAnswered(now, key, job_id, outcome.status, latency))
        refused = _refused(outcome)
        if outcome.kind is Kind.DONE:
            self._answers.setdefault(key, _AnswerTimes(latency)).sample(latency)
        wait = outcome.retry_after
        hints = outcome.hints
        spent = None
        if hints is not None and hints.remaining == 0:
            spent = hints.reset or 0.0
        with self._stopping():
            # The learner keeps what it learned in the ledger, which may fail.
            self._learner.answered(
                key, sent, now, refused=refused, wait=wait, by=by, spent=spent
            )
        tripped = self.breaker.answered(outcome)
        if tripped is not None:
            self.stop(Stop.of(Cause.BREAKER, tripped))
        held = self.breaker.tripped is not None
        try:
            self._settlement.settle(key, queue, attempt, outcome, held=held)
        except StateError as exc:
            # The answer could not be recorded: the store still says in flight,
            # so the next run resends the job if safe, else leaves it unknown.
            self.stop(Stop.failing(exc))
        with self._stopping():
            self._heed(key, outcome.hints, latency)
        if self._idle:
            self._notify()  # an answer may free a slot, or end the run

    async def _send(
        self, key: LimitKey, ticket: int, job: Job
    ) -> tuple[Outcome, float | None]:
        """Send `job`, and release its slot whatever happens to the request; with
        its outcome, where the learner places its arrival at the latest: by the
        network's bound (`ArrivalBound.latest`), None: by its answer."""
        outcome: Outcome | None = None
        began = self._clock.now()
        try:
            outcome = await self._sender.send(job)
        finally:
            # A request that never reached the server spends no budget.
            reached = outcome is None or outcome.reached
            trip = _trip(began, outcome)
            self._pacer.release(key, ticket, sent=reached, trip=trip)
            self._in_flight -= 1
        by = None if trip is None else self._pacer.arrival.latest(trip.written)
        return outcome, by

    def _heed(self, key: LimitKey, hints: Hints | None, latency: float) -> None:
        """Follow what an answer's headers say: a stated policy or limit is the
        learner's (`Learner.stated`); a spent budget waits for its reset, unless
        the client's own record already waits (a reset is often rounded up)."""
        if hints is None:
            return
        self._learner.stated(
            key, hints.policy, limit=hints.limit, reset=hints.reset, trip=latency
        )
        if hints.remaining == 0 and hints.reset and not self._pacer.full(key):
            self._pacer.hold(key, self._clock.now() + hints.reset)

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)


class _AnswerTimes:
    """A key's answer times, send to answer, as RFC 6298 smooths round trips:
    the mean (gain 1/8) and its mean deviation (gain 1/4, half the first
    sample at first); `slow`, their mean plus four deviations."""

    __slots__ = ("deviation", "mean")

    def __init__(self, first: float) -> None:
        self.mean, self.deviation = first, first / 2

    def sample(self, value: float) -> None:
        self.deviation = 0.75 * self.deviation + 0.25 * abs(self.mean - value)
        self.mean = 0.875 * self.mean + 0.125 * value

    @property
    def slow(self) -> float:
        return self.mean + 4 * self.deviation


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
