"""Whole runs against a server model, on trio's virtual clock: `simulate`.

The real `Runner`, `Pacer` and `MemoryLedger` send jobs to `_Server`, a fake Sender:
each request travels a seeded random latency, arrives somewhere in between, is judged
there by a `batchrun.pacing.limiters` model, and comes back done (200) or refused (429,
with a whole-seconds Retry-After as the sandbox sends, or none). `simulate` returns
every arrival, the makespan, the 429s per key and the ideal makespan under the SERVER's
counting, so a figure or a property ("for random stricter servers the run finishes with
bounded 429s") is one call.

Beyond its limiter, a `Server` may be disturbed (stray 429s, an outage, another
consumer), change its rule mid-run, count the requests it refuses, state its
limits in rate-limit header fields (read by the client's own reader, as over
HTTP), and take a spread of time over each accepted request. Every such option
is off by default. `sender` opens a `_Server` for any client on the same clock
(`support/script_client.py`'s reference script).

Invariant: one seed gives one run (trio's scheduler and every random draw are seeded),
and no real time passes.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import httpx
import trio
import trio.testing

from batchrun.api.client import classify
from batchrun.api.outcome import Kind, Outcome
from batchrun.core.clock import LoopClock
from batchrun.core.events import Status, Tally
from batchrun.core.limits import LimitKey, Pace, Rule, parse_rule
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job
from batchrun.pacing.kept import RECORD_SUFFIX
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import (
    LeakyBucket,
    Limiter,
    LimiterKind,
    Quota,
    make_limiter,
)
from batchrun.pacing.pacer import Pacer
from batchrun.run.runner import Runner
from batchrun.run.settings import Settings
from batchrun.sandbox.faults import NOISE_DIGITS
from batchrun.sandbox.policy_headers import HeaderStyle, policy_headers
from support.doubles import ListRecorder, ListSink

KEY = LimitKey.RUN_QUERY
# Past this many simulated seconds the run is stopped and counted as not finished.
BOUND = 1800.0
# The models whose refused requests may count (`limiters`' `count_refused`).
_COUNTING = frozenset({LimiterKind.SLIDING, LimiterKind.FIXED})
# The API's documented 429 body (docs/reference/contract.md#the-api).
_TOO_MANY = {"success": False, "error": {"code": "TOO_MANY_REQUESTS"}}


@dataclass(frozen=True, slots=True)
class Server:
    """A server model to build afresh for each run: kind, rule, model options."""

    kind: LimiterKind
    rule: Rule
    options: Mapping[str, Any] = field(default_factory=dict)
    retry_after: bool = True
    # Seconds the server works on an accepted request before it answers (an
    # expensive query); a refusal is answered at once.
    work: float = 0.0
    # Stray 429s: this share of the requests it accepts (and counts) answered 429
    # with no Retry-After, from `stray_from` for `stray_for` seconds of the run
    # (an overloaded gateway).
    stray: float = 0.0
    stray_from: float = 0.0
    stray_for: float = math.inf
    # Another consumer of the same budget: one request every `rival_every`
    # seconds, from `rival_from` for `rival_for` seconds (0: none).
    rival_every: float = 0.0
    rival_from: float = 0.0
    rival_for: float = 0.0
    # An outage: every request arriving from `outage_from` for `outage_for`
    # seconds is answered 429 at once, before the limiter sees it (so it is not
    # counted), with a Retry-After of the outage's whole seconds left when
    # `outage_retry_after`, else none (a gateway in front of the service).
    outage_from: float = 0.0
    outage_for: float = 0.0
    outage_retry_after: bool = False
    # A rule change: from `change_at` seconds into the run the limiter enforces
    # `change_to` (the operator edits the limit), keeping what it has counted; a
    # leaky bucket starts empty at its new rate. No Retry-After says so.
    change_to: Rule | None = None
    change_at: float = 0.0
    # Refused requests count against the limit too (`limiters`' `count_refused`:
    # a sliding log or fixed window only); an `options` entry says the same.
    count_refused: bool = False
    # The rate-limit header fields every answer the limiter decides states (the
    # sandbox's `policy_headers`, quotas read right after the arrival); stray
    # 429s state them too, an outage's do not. The client's own reader
    # (`api.client.classify`) turns them into the Outcome's `hints`.
    headers: HeaderStyle = HeaderStyle.NONE
    # Answer-time spread: an accepted request's `work` is drawn uniformly from
    # [work, work + work_spread] (a query that takes longer on some data).
    work_spread: float = 0.0

    def limiter(self) -> Limiter:
        """A fresh model of this server's counting (with its rule change)."""
        options = dict(self.options)
        if self.count_refused:
            if self.kind not in _COUNTING:
                msg = f"a {self.kind.value} model has no count_refused"
                raise ValueError(msg)
            options["count_refused"] = True
        limiter = make_limiter(self.kind, self.rule, **options)
        if self.change_to is None:
            return limiter
        return _Changing(limiter, self.change_at, self.change_to)

    def outage(self, at: float) -> bool:
        """Whether a request arriving `at` meets the outage."""
        return self.outage_from <= at < self.outage_from + self.outage_for

    def __str__(self) -> str:
        told = "Retry-After" if self.retry_after else "no Retry-After"
        return f"{self.limiter().policy}, {told}"


class _Changing:
    """A limiters model whose rule becomes `rule` at `at` s; what it counted stays
    (a leaky bucket, whose rate nginx fixes per zone, starts over empty)."""

    def __init__(self, limiter: Limiter, at: float, rule: Rule) -> None:
        self._limiter, self._at, self._rule = limiter, at, rule
        self._before = limiter.policy
        self._changed = False

    @property
    def policy(self) -> str:
        return f"{self._before}, {self._rule} from {self._at:g} s"

    def _change(self, now: float) -> Limiter:
        if not self._changed and now >= self._at:
            self._changed = True
            limiter: Any = self._limiter
            if isinstance(limiter, LeakyBucket):
                self._limiter = replace(limiter, rule=self._rule)
            else:
                limiter.rule = self._rule
        return self._limiter

    def admit(self, client: str, key: str, now: float) -> float | None:
        return self._change(now).admit(client, key, now)

    def quotas(self, client: str, key: str, now: float) -> tuple[Quota, ...]:
        return self._change(now).quotas(client, key, now)

    def replay(self, client: str, key: str, now: float, *, accepted: bool) -> bool:
        return self._change(now).replay(client, key, now, accepted=accepted)

    def room(self, client: str, key: str, now: float) -> int:
        return self._change(now).room(client, key, now)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as the server saw it: when it left, arrived, and the answer."""

    sent: float
    at: float
    key: str
    job: str
    status: int


@dataclass(frozen=True, slots=True)
class Simulated:
    """What one simulated run came to; times in seconds from its start."""

    arrivals: tuple[Arrival, ...]
    makespan: float
    ideal: float
    tally: Tally
    ended: Mapping[str, tuple[Status, ...]]
    bound: float
    # The wall-clock moment the run ended: a next run that follows at once
    # starts there (`simulate(wall=...)`), so what the ledger keeps ages as
    # the virtual time passed.
    wall_end: float = 0.0
    # When each answer reached the client (s from the start), and what it said.
    answers: tuple[tuple[float, Outcome], ...] = ()

    @property
    def rate_limited(self) -> Counter[str]:
        """429s per key."""
        return Counter(a.key for a in self.arrivals if a.status == 429)

    @property
    def accepted(self) -> Counter[str]:
        """How often the server accepted each job."""
        return Counter(a.job for a in self.arrivals if a.status == 200)

    @property
    def finished(self) -> bool:
        """Every job ended within the bound."""
        return self.tally.left == 0 and self.makespan <= self.bound

    @property
    def ratio(self) -> float:
        """Makespan over the ideal under the server's own counting."""
        return self.makespan / self.ideal if self.ideal > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Network:
    """What the simulated server and transport do beyond the round trip: `work`
    seconds between an accepted request's arrival and its answer (a 429 is
    answered at once), and, with `traced`, a transport that says when each
    request left and measures a round trip on each of `connections` new
    connections (httpx's trace), so the arrival bound applies. `queue`: a busy
    server, where a share `queued` of the requests waits up to that long (a
    uniform draw) after it arrives before the limiter counts it."""

    work: float = 0.0
    traced: bool = False
    connections: int = 8
    queue: float = 0.0
    queued: float = 1.0


class _Server:
    """A fake Sender: latency out, the model's decision at arrival, latency back."""

    def __init__(
        self,
        server: Server,
        *,
        latency: tuple[float, float],
        rng: random.Random,
        network: Network = Network(),
    ) -> None:
        self._server = server
        self._limiter = server.limiter()
        self._latency = latency
        self._rng = rng
        self._network = network
        self._opened = 0
        self._start = anyio.current_time()
        self._strays = random.Random(rng.random())
        # Drawn only with a spread, so a run without one draws as it always has.
        self._spread = random.Random(rng.random()) if server.work_spread else None
        self.arrivals: list[Arrival] = []
        # When each answer reached the client, with what it said.
        self.answers: list[tuple[float, Outcome]] = []

    async def send(self, job: Job) -> Outcome:
        sent = anyio.current_time() - self._start
        trip = self._rng.uniform(*self._latency)
        out = trip * self._rng.random()
        await anyio.sleep(out)
        if self._network.queue > 0 and self._rng.random() < self._network.queued:
            await anyio.sleep(self._rng.uniform(0.0, self._network.queue))
        at = anyio.current_time() - self._start
        if self._server.outage(at):
            self.arrivals.append(Arrival(sent, at, job.key, job.id, 429))
            await anyio.sleep(trip - out)
            return self._answered(self._traced(self._outage(at)))
        wait = self._limiter.admit("client", job.key, at)
        stray = wait is None and self._stray(at)
        status = 200 if wait is None and not stray else 429
        self.arrivals.append(Arrival(sent, at, job.key, job.id, status))
        outcome = self._outcome(wait, stray=stray, stated=self._stated(job, at))
        await anyio.sleep((self._work() if status == 200 else 0.0) + trip - out)
        return self._answered(self._traced(outcome))

    def _work(self) -> float:
        """Seconds between an accepted request's arrival and its answer."""
        spread = 0.0 if self._spread is None else self._spread.random()
        return (
            self._server.work + spread * self._server.work_spread + (self._network.work)
        )

    def _answered(self, outcome: Outcome) -> Outcome:
        self.answers.append((anyio.current_time() - self._start, outcome))
        return outcome

    def _traced(self, outcome: Outcome) -> Outcome:
        """The outcome as a traced transport reports it: written at once, and a
        connect's round trip (a fresh draw) on each new connection."""
        if not self._network.traced:
            return outcome
        connect = None
        if self._opened < self._network.connections:
            self._opened += 1
            connect = self._rng.uniform(*self._latency)
        return replace(outcome, written=0.0, round_trip=connect)

    def _stray(self, at: float) -> bool:
        server = self._server
        during = server.stray_from <= at < server.stray_from + server.stray_for
        return during and self._strays.random() < server.stray

    def _stated(self, job: Job, at: float) -> dict[str, str] | None:
        """The policy header fields of the answer (None: the server sends none)."""
        if self._server.headers is HeaderStyle.NONE:
            return None
        quotas = self._limiter.quotas("client", job.key, at)
        return policy_headers(self._server.headers, quotas)

    async def rival(self) -> None:
        """Another consumer of the client's budget (`Server.rival_every`); the
        outage refuses its requests too, uncounted."""
        server = self._server
        if server.rival_every <= 0:
            return
        await anyio.sleep(server.rival_from)
        for _ in range(int(server.rival_for / server.rival_every)):
            at = anyio.current_time() - self._start
            if not server.outage(at):
                self._limiter.admit("client", KEY, at)
            await anyio.sleep(server.rival_every)

    def _outage(self, at: float) -> Outcome:
        server = self._server
        left = server.outage_from + server.outage_for - at
        told = max(1, math.ceil(round(left, NOISE_DIGITS)))
        if server.headers is not HeaderStyle.NONE:
            stated = {"Retry-After": str(told)} if server.outage_retry_after else {}
            return _classified(429, stated)
        if not server.outage_retry_after:
            return Outcome(Kind.RATE_LIMITED, 429, error="429 (outage)")
        return Outcome(Kind.RATE_LIMITED, 429, retry_after=told, error="429 (outage)")

    def _outcome(
        self,
        wait: float | None,
        *,
        stray: bool = False,
        stated: dict[str, str] | None = None,
    ) -> Outcome:
        # Whole seconds (RFC 9110 delay-seconds), as the sandbox tells it.
        told = None
        if wait is not None and self._server.retry_after:
            told = max(1, math.ceil(round(wait, NOISE_DIGITS)))
        if stated is not None:
            after = {} if told is None else {"Retry-After": str(told)}
            return _classified(
                200 if wait is None and not stray else 429, {**stated, **after}
            )
        if stray:
            return Outcome(Kind.RATE_LIMITED, 429, error="429 (stray)")
        if wait is None:
            return Outcome(Kind.DONE, 200, {"ok": True})
        if told is None:
            return Outcome(Kind.RATE_LIMITED, 429, error="429 (rate limited)")
        return Outcome(Kind.RATE_LIMITED, 429, retry_after=told, error="429")


def _classified(status: int, headers: Mapping[str, str]) -> Outcome:
    """The Outcome the client's own `classify` makes of an answer with `headers`."""
    body = {"ok": True} if status == 200 else _TOO_MANY
    return classify(httpx.Response(status, headers=dict(headers), json=body))


def sender(
    server: Server,
    *,
    latency: tuple[float, float],
    seed: int,
    network: Network = Network(),
) -> _Server:
    """A `_Server` for any client, started now on the running (virtual) clock."""
    return _Server(server, latency=latency, rng=random.Random(seed), network=network)


def ideal(server: Server, count: int, told: Rule | None = None) -> float:
    """When the last of `count` requests is accepted at the earliest, at zero latency.

    Greedy: each request arrives the moment the model would accept it (asked again
    after each exact wait). For every model here an earlier acceptance never delays a
    later one (a sliding log, a fixed or weighted count, a GCRA all only weigh past
    arrivals less as they age), so greedy is the optimum. For a sliding log it is
    `slots.eta` under the server's rule.

    The ideal client is never refused, so whether refusals count does not matter
    (and asking again would count them): the model leaves them out. Under a rule
    change (`Server.change_to`) it asks again at the change, where a wait told
    before it may no longer hold; an earlier acceptance still never delays a later
    one, so greedy remains the optimum under the changing rule. With `told`, the
    client also keeps the told rule as a sliding log (the contract's promise), a
    constraint of the same kind: greedy under both is the optimum under both.
    """
    options = {k: v for k, v in server.options.items() if k != "count_refused"}
    honest = replace(server, options=options, count_refused=False)
    limiter, now = honest.limiter(), 0.0
    change = math.inf if server.change_to is None else server.change_at
    sent: list[float] = []
    for _ in range(count):
        while True:
            wait = None if told is None else _told_wait(told, sent, now)
            if wait is None and (wait := limiter.admit("ideal", KEY, now)) is None:
                break
            # A wait told before a rule change holds only until the change.
            step = change - now if now < change < now + wait else wait
            now += max(step, 1e-9)  # a weighted count's wait is an infimum
        sent.append(now)
    return now


def _told_wait(rule: Rule, sent: list[float], now: float) -> float | None:
    """None if one more send `now` keeps every window of `rule`, else the wait."""
    waits = [
        sent[-w.count] + w.seconds - now
        for w in rule.windows
        if len(sent) >= w.count and sent[-w.count] + w.seconds > now
    ]
    return max(waits) if waits else None


def jobs(count: int) -> list[Job]:
    """`count` run-query jobs."""
    return [Job(f"q-{n:04}", JobType.RUN_QUERY, "t1", {}) for n in range(count)]


def carried(run: MemoryLedger, *, record: bool = True) -> MemoryLedger:
    """A fresh ledger with only what `run` kept of the key for the next run: its
    lesson and, with `record`, what it was seen to accept (the sends themselves
    are on the last run's virtual clock)."""
    ledger = MemoryLedger()
    names = [KEY.value]
    names += [KEY.value + RECORD_SUFFIX] if record else []
    for name in names:
        text = run.recall(name)
        if text is not None:
            ledger.remember(name, text)
    return ledger


def simulate(
    *,
    client: Rule | str,
    server: Server,
    count: int = 60,
    concurrency: int | None = 8,
    pace: Pace = Pace.EXACT,
    latency: tuple[float, float] = (0.005, 0.05),
    seed: int = 0,
    bound: float = BOUND,
    ledger: MemoryLedger | None = None,
    fallback: Rule | None = None,
    network: Network = Network(),
    wall: float | None = None,
) -> Simulated:
    """One run of `count` jobs at `client`'s rule against `server`, in virtual time;
    `wall`: the wall-clock moment it starts (default: now), which the learner's
    kept lessons are dated by as virtual time passes."""
    rule = parse_rule(client) if isinstance(client, str) else client
    # Under Hypothesis, trio shuffles ready tasks with this generator; seed it so a
    # seed gives one run either way.
    trio._core._run._r.seed(seed)
    kept = MemoryLedger() if ledger is None else ledger  # a rerun passes the last's
    run = _Run(
        rule,
        server,
        count,
        concurrency,
        pace,
        latency,
        seed,
        bound,
        kept,
        fallback,
        network,
        time.time() if wall is None else wall,
    )
    clock = trio.testing.MockClock(autojump_threshold=0)
    result: Simulated = anyio.run(
        run.main, backend="trio", backend_options={"clock": clock}
    )
    return result


@dataclass(frozen=True, slots=True)
class _Run:
    rule: Rule
    server: Server
    count: int
    concurrency: int | None
    pace: Pace
    latency: tuple[float, float]
    seed: int
    bound: float
    ledger: MemoryLedger
    # --profile auto: the rule the key falls back to (statement B).
    fallback: Rule | None
    network: Network
    wall: float

    async def main(self) -> Simulated:
        rng = random.Random(self.seed)
        sender = _Server(
            self.server, latency=self.latency, rng=rng, network=self.network
        )
        recorder = ListRecorder()
        runner = self._runner(sender, recorder, rng)
        start = anyio.current_time()
        async with anyio.create_task_group() as watch:
            watch.start_soon(_stop_after, runner, self.bound)
            watch.start_soon(sender.rival)
            tally = await runner.run({KEY: jobs(self.count)}, {KEY: self.count})
            watch.cancel_scope.cancel()
        ended: dict[str, tuple[Status, ...]] = {}
        for result in recorder.results:
            ended[result.id] = (*ended.get(result.id, ()), result.status)
        return Simulated(
            arrivals=tuple(sender.arrivals),
            makespan=anyio.current_time() - start,
            ideal=ideal(self.server, self.count),
            tally=tally,
            ended=ended,
            bound=self.bound,
            wall_end=self.wall + anyio.current_time() - start,
            answers=tuple(sender.answers),
        )

    def _runner(
        self, sender: _Server, recorder: ListRecorder, rng: random.Random
    ) -> Runner:
        clock = LoopClock()
        pacer = Pacer(
            rules={KEY: self.rule}, ledger=self.ledger, clock=clock, pace=self.pace
        )
        fallback = {} if self.fallback is None else {KEY: self.fallback}
        settings = Settings(
            concurrency=self.concurrency, pace=self.pace, fallback=fallback
        )
        start = anyio.current_time()
        return Runner(
            sender=sender,
            pacer=pacer,
            clock=clock,
            sink=ListSink(),
            recorder=recorder,
            settings=settings,
            rng=rng,
            wall=lambda: self.wall + anyio.current_time() - start,
        )


async def _stop_after(runner: Runner, bound: float) -> None:
    await anyio.sleep(bound)
    runner.stop()


@dataclass(frozen=True, slots=True)
class Scenario:
    """A client rule against a server model (issue 10's cases)."""

    name: str
    client: str
    server: Server


def scenarios() -> list[Scenario]:
    """Issue 10's cases, each with and without Retry-After."""
    cases = [
        ("30/2s vs sliding 10/2s", "30/2s", LimiterKind.SLIDING, "10/2s", {}),
        ("30/2s vs fixed 10/2s", "30/2s", LimiterKind.FIXED, "10/2s", {}),
        ("30/2s vs weighted 10/2s", "30/2s", LimiterKind.WEIGHTED, "10/2s", {}),
        ("30/2s vs weighted 30/2s", "30/2s", LimiterKind.WEIGHTED, "30/2s", {}),
        ("a 30/1m vs sliding b", "30/1m", LimiterKind.SLIDING, "15/1m+500/1h", {}),
        ("30/2s vs leaky 15/s b10", "30/2s", LimiterKind.LEAKY, "15/1s", {"burst": 10}),
    ]
    return [
        Scenario(
            f"{name}{'' if told else ', no R-A'}",
            client,
            Server(kind, parse_rule(rule), options, retry_after=told),
        )
        for name, client, kind, rule, options in cases
        for told in (True, False)
    ]
