"""The pacer: the pure slot rule, a simulation against it, and the async FIFO pacer."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import anyio
import anyio.lowlevel
import pytest
import trio.testing
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from batchrun.core.clock import LoopClock
from batchrun.core.events import SlotWait
from batchrun.core.limits import LimitKey, Pace, Rule, Window, parse_rule
from batchrun.pacing.arrival import Trip
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import make_limiter
from batchrun.pacing.pacer import Pacer
from batchrun.pacing.slots import (
    Grant,
    Usage,
    earliest_slot,
    eta,
    paced,
    reach,
    spread_interval,
)

KEY = LimitKey.RUN_QUERY
# `end + WINDOW - WINDOW` may differ from `end` in the last bit; the simulation's
# checks allow for that, and nothing physical happens in a nanosecond.
EPSILON = 1e-9


def test_empty_history_allows_now():
    """With no history, the first request may leave at once."""
    assert earliest_slot(Usage(0, []), parse_rule("2/1s")) == -math.inf


def test_full_window_waits_for_count_th_newest_answer():
    """With COUNT answers in the window, the slot opens WINDOW after the oldest."""
    slot = earliest_slot(Usage(0, [10.0, 10.5]), parse_rule("2/1s"))
    assert slot == pytest.approx(11.0)


def test_in_flight_counts_as_newest():
    """An in-flight request counts as the newest: one answer + one in flight fill 2."""
    assert earliest_slot(Usage(1, [10.0, 10.5]), parse_rule("2/1s")) == 11.5


def test_in_flight_filling_a_window_waits_for_an_answer():
    """When in-flight requests alone fill a window, only an answer can open a slot."""
    assert earliest_slot(Usage(2, [1.0]), parse_rule("2/1s")) is None


def test_every_window_holds():
    """The slot is the latest over the windows of a rule."""
    rule = parse_rule("2/1s+3/10s")
    assert earliest_slot(Usage(0, [0.0, 5.0, 5.5]), rule) == pytest.approx(10.0)


def test_spread_spaces_starts_by_the_binding_interval_and_1_percent():
    """`spread` keeps starts `max(WINDOW/COUNT)` and 1 % apart: 15/1m+500/1h
    gives 7.2 s + 72 ms."""
    rule = parse_rule("15/1m+500/1h")
    slot = earliest_slot(Usage(0, [100.0], 100.0), rule, Pace.SPREAD)
    assert slot == pytest.approx(107.272)


@pytest.mark.parametrize(
    ("rule", "interval"),
    [
        pytest.param("15/1s", 1 / 15 + 0.005, id="5ms-over-1-percent"),
        pytest.param("1/100ms", 0.105, id="5ms"),
        pytest.param("2/1s", 0.505, id="equal"),
        pytest.param("1/1s", 1.01, id="1-percent"),
    ],
)
def test_spread_margin_is_1_percent_or_5_ms_whichever_is_larger(rule, interval):
    """Arrivals a millisecond early must not reach a no-burst bucket early."""
    assert spread_interval(parse_rule(rule)) == pytest.approx(interval)


def test_eta_matches_batches_of_a_single_window():
    """120 requests at 30/2s leave in four batches: the last at 6 s."""
    assert eta(120, parse_rule("30/2s"), now=0.0) == pytest.approx(6.0)


def test_eta_counts_recent_history():
    """Requests sent a moment ago still occupy the window."""
    assert eta(1, parse_rule("2/1s"), now=5.0, recent=[4.5, 4.8]) == pytest.approx(5.5)


def test_eta_extrapolates_huge_counts_at_the_long_run_rate():
    """Past the simulated part, each further request adds one interval."""
    rule = parse_rule("1/1s")
    assert eta(6000, rule, now=0.0) == pytest.approx(5999.0)


# --- A discrete-event simulation of one key, checked against the rule's definition.


@dataclass
class Sent:
    ready: float
    start: float
    end: float


def simulate(rule: Rule, pace: Pace, ready: list[float], latency: list[float]):
    """Grant every job FIFO through a MemoryLedger, as early as it allows."""
    ledger = MemoryLedger()
    answers: list[tuple[float, int]] = []
    sent: list[Sent] = []
    moment = -math.inf
    for job_ready, job_latency in zip(ready, latency, strict=True):
        moment = max(moment, job_ready)
        while True:
            while answers and answers[0][0] <= moment:
                end, ticket = heapq.heappop(answers)
                ledger.release(ticket, end)
            result = ledger.reserve(KEY, rule, pace, moment)
            if isinstance(result, Grant):
                heapq.heappush(answers, (moment + job_latency, result.ticket))
                sent.append(Sent(job_ready, moment, moment + job_latency))
                break
            moment = answers[0][0] if result.until is None else result.until
    return sent


def allowed(rule: Rule, pace: Pace, earlier: list[Sent], moment: float) -> bool:
    """DESIGN.md's rule, by brute force: fewer than COUNT answers after s - WINDOW."""
    for window in rule.windows:
        edge = moment - window.seconds + EPSILON
        recent = sum(1 for s in earlier if s.end > edge)
        if recent >= window.count:
            return False
    if pace is Pace.SPREAD and earlier:
        return moment >= earlier[-1].start + spread_interval(rule) - EPSILON
    return True


def most_in_any_window(times: list[float], seconds: float) -> int:
    """The most moments within any half-open interval (t - seconds, t]."""
    times = sorted(times)
    best, low = 0, 0
    for high, moment in enumerate(times):
        while times[low] <= moment - seconds + EPSILON:
            low += 1
        best = max(best, high - low + 1)
    return best


windows = st.builds(
    Window,
    count=st.integers(1, 8),
    seconds=st.floats(0.05, 20, allow_nan=False).map(lambda x: round(x, 3)),
)
rules = st.lists(windows, min_size=1, max_size=3).map(lambda w: Rule(tuple(w)))


@st.composite
def workloads(draw):
    count = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.floats(0, 3), min_size=count, max_size=count))
    latency = draw(st.lists(st.floats(0, 2), min_size=count, max_size=count))
    where = draw(st.lists(st.floats(0, 1), min_size=count, max_size=count))
    ready = [round(sum(gaps[: i + 1]), 6) for i in range(count)]
    return ready, latency, where


@settings(max_examples=300, deadline=None)
@given(rule=rules, pace=st.sampled_from(Pace), workload=workloads())
def test_no_window_is_ever_exceeded_and_every_grant_is_earliest(rule, pace, workload):
    """Random rules, latencies and arrivals: safe for any arrival, and earliest."""
    ready, latency, where = workload
    sent = simulate(rule, pace, ready, latency)
    # The server may count a request at any moment between its send and its answer.
    arrivals = [
        s.start + f * (s.end - s.start) for s, f in zip(sent, where, strict=True)
    ]
    for window in rule.windows:
        for reading in (arrivals, [s.start for s in sent], [s.end for s in sent]):
            assert most_in_any_window(reading, window.seconds) <= window.count
    for k, job in enumerate(sent):
        assert allowed(rule, pace, sent[:k], job.start)
        floor = max(job.ready, sent[k - 1].start if k else -math.inf)
        if job.start > floor:
            assert not allowed(rule, pace, sent[:k], job.start - 1e-6)


# --- The async pacer on trio's virtual clock.


@pytest.fixture
def anyio_backend():
    """Run these tests on trio, whose MockClock jumps over sleeps instantly."""
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


class Events:
    def __init__(self):
        self.seen = []

    def emit(self, event):
        self.seen.append(event)


def make_pacer(rule: str, *, pace=Pace.EXACT, sink=None) -> Pacer:
    return Pacer(
        rules={KEY: parse_rule(rule)},
        ledger=MemoryLedger(),
        clock=LoopClock(),
        pace=pace,
        sink=sink,
    )


async def send_all(pacer: Pacer, count: int, latency: float) -> list[float]:
    """Acquire `count` slots in order, each request answered after `latency`."""
    starts: list[float] = []

    async def one() -> None:
        ticket = await pacer.acquire(KEY)
        starts.append(anyio.current_time())
        await anyio.sleep(latency)
        pacer.release(KEY, ticket)

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
            await anyio.lowlevel.checkpoint()
    return starts


async def test_pacer_grants_batches_one_window_after_the_answers():
    """At 3/1s with 0.1 s latency, batches leave at 0, 1.1 and 2.2 s."""
    t0 = anyio.current_time()
    starts = [s - t0 for s in await send_all(make_pacer("3/1s"), 9, 0.1)]
    assert starts == pytest.approx([0, 0, 0, 1.1, 1.1, 1.1, 2.2, 2.2, 2.2])


async def test_pacer_waits_for_answers_when_in_flight_fills_the_window():
    """Slow answers hold the window: the next batch waits for them, then WINDOW."""
    t0 = anyio.current_time()
    starts = [s - t0 for s in await send_all(make_pacer("2/1s"), 4, 5.0)]
    assert starts == pytest.approx([0, 0, 6.0, 6.0])


async def test_pacer_spread_spaces_evenly():
    """`spread` at 4/2s sends one request every 0.505 s (0.5 s and 1 %), the exact
    rule still holding."""
    t0 = anyio.current_time()
    pacer = make_pacer("4/2s", pace=Pace.SPREAD)
    starts = [s - t0 for s in await send_all(pacer, 5, 0.01)]
    # The fifth is 0.505 s after the fourth, past the first answer (0.01 s) + 2 s.
    assert starts == pytest.approx([0, 0.505, 1.01, 1.515, 2.02])


async def test_cool_down_holds_the_key():
    """After a cool-down, no slot is granted before it ends."""
    pacer = make_pacer("100/1s")
    t0 = anyio.current_time()
    pacer.cool_down(KEY, t0 + 7.0)
    starts = await send_all(pacer, 2, 0.0)
    assert [s - t0 for s in starts] == pytest.approx([7.0, 7.0])


async def test_after_a_cool_down_one_probe_goes_alone():
    """After a cool-down the key is half-open: one request leaves, and the next
    only once its answer has come."""
    pacer = make_pacer("100/1s")
    t0 = anyio.current_time()
    pacer.cool_down(KEY, t0 + 5.0)
    starts = await send_all(pacer, 3, 2.0)
    assert [s - t0 for s in starts] == pytest.approx([5.0, 7.0, 7.0])


async def test_waits_are_reported_as_events():
    """Each wait emits a SlotWait: first for an answer, then for the window."""
    sink = Events()
    t0 = anyio.current_time()
    await send_all(make_pacer("1/1s", sink=sink), 2, 0.5)
    waits = [e.until for e in sink.seen if isinstance(e, SlotWait)]
    assert waits[0] is None
    assert waits[1] is not None
    assert waits[1] - t0 == pytest.approx(1.5)


async def test_pace_by_does_not_shorten_a_wait_the_server_asked_for():
    """A backoff guess ends when the key is paced by a new rule; a hold until
    the server's stated reset (or a Retry-After) does not."""
    pacer = Pacer(
        rules={KEY: parse_rule("30/2s")}, ledger=MemoryLedger(), clock=LoopClock()
    )
    now = anyio.current_time()
    pacer.hold(KEY, now + 5.0)
    pacer.pace_by(KEY, parse_rule("10/2s"), Pace.EXACT)
    assert pacer.cooling(KEY)[1] == now + 5.0


async def test_pace_by_ends_a_backoff_guess():
    pacer = Pacer(
        rules={KEY: parse_rule("30/2s")}, ledger=MemoryLedger(), clock=LoopClock()
    )
    now = anyio.current_time()
    pacer.cool_down(KEY, now + 9.0)
    pacer.pace_by(KEY, parse_rule("5/2s"), Pace.SPREAD)
    assert pacer.cooling(KEY)[1] == now
    assert (pacer.rules[KEY], pacer.pace(KEY)) == (parse_rule("5/2s"), Pace.SPREAD)
    pacer.cool_down(KEY, now + 3.0, asked=True)  # a Retry-After
    pacer.pace_by(KEY, parse_rule("4/2s"), Pace.EXACT)
    assert pacer.cooling(KEY)[1] == now + 3.0


@pytest.mark.parametrize(
    ("quickest", "gaps"),
    [
        pytest.param(0.2, [1.11, 1.11], id="work-lapses-at-grant-2D-allowance"),
        pytest.param(0.01, [2.5, 2.5], id="no-work-counts-until-the-answer"),
    ],
)
async def test_a_request_in_flight_lapses_where_the_server_works(quickest, gaps):
    """At 1/1s, over a network of 10 ms round trips (D = 30 ms), a key whose
    quickest four exchanges took `quickest`, requests answered 1.5 s after
    they leave. Where the floor shows work (0.17 s), one in flight counts as
    answered at its grant plus two D plus the queue allowance (50 ms), and
    the next leaves a window after that, its answer still to come; where it
    shows none, each counts until its answer, and the next waits a window
    more."""
    pacer = make_pacer("1/1s")
    began = anyio.current_time()
    pacer.arrival.observe(KEY.value, Trip(0.0, round_trip=0.010), answered=0.010)
    for _ in range(4):
        pacer.arrival.observe(KEY.value, Trip(0.0, accepted=True), answered=quickest)
    starts: list[float] = []

    async def one() -> None:
        ticket = await pacer.acquire(KEY)
        starts.append(anyio.current_time())
        await anyio.sleep(1.5)
        pacer.release(KEY, ticket, trip=Trip(starts[-1], accepted=True))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(one)
            await anyio.lowlevel.checkpoint()
    assert starts[0] == began
    assert [b - a for a, b in itertools.pairwise(starts)] == pytest.approx(gaps)


# A leaky bucket's reading: `paced` adds windows for its burst.


def paced_schedule(
    rule: Rule, latencies: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Greedy sends by the slot rule, each request out and back over its latency
    pair (out, back); its (send, arrival) moments, in the order they left."""
    moments: list[tuple[float, float]] = []
    answers: list[float] = []  # completions not yet seen
    finished: list[float] = []
    now = 0.0
    for out, back in latencies:
        while True:
            seen = [a for a in answers if a <= now]
            finished = sorted([*finished, *seen])
            answers = [a for a in answers if a > now]
            slot = earliest_slot(Usage(len(answers), finished), rule)
            if slot is not None and slot <= now:
                break
            later = [a for a in answers if slot is None or a < slot]
            now = min(later) if later else max(now, slot or now)
        moments.append((now, now + out))
        answers.append(now + out + back)
    return moments


@settings(max_examples=100, deadline=None)
@given(
    st.integers(2, 40),
    st.sampled_from([0.5, 1.0, 2.0, 3.0, 60.0]),
    st.data(),
)
def test_a_burst_reading_never_overflows_the_bucket_it_reads(count, seconds, data):
    """Whatever the latencies, a rule read as a leaky bucket with burst B (nginx
    `limit_req burst=B nodelay`, on its millisecond clock, draining whole
    thousandths) sends nothing that bucket refuses, and runs near its rate: B + 1
    at once, then one per interval and margin."""
    # nginx floors its rate to whole thousandths a second: below 100 of them
    # that is slower than the rule by more than the 1 % margin.
    assume(count * 1000 / seconds >= 100)
    burst = data.draw(st.integers(0, count - 2))
    rule = Rule((Window(count, seconds),), burst)
    trips = st.tuples(st.floats(0.0, 0.02), st.floats(0.0, 0.02))
    latencies = data.draw(st.lists(trips, min_size=1, max_size=3 * count))
    bucket = make_limiter("leaky", Rule((Window(count, seconds),)), burst=burst)
    moments = paced_schedule(rule, latencies)
    for _, arrival in sorted(moments, key=lambda m: m[1]):
        assert bucket.admit("c", "k", 100.0 + arrival) is None
    # No slower than the bucket and the window together allow at zero latency,
    # but for the margin and the round trips.
    ideal = bucket_ideal(len(moments), Window(count, seconds), burst)
    assert moments[-1][0] <= ideal * 1.01 + 0.05 * len(moments) + 0.01


def bucket_ideal(n: int, window: Window, burst: int) -> float:
    """When the last of `n` requests may arrive at the earliest under `window` and
    a bucket of `burst` draining one per its interval (GCRA's theoretical arrival
    time)."""
    step = window.seconds / window.count
    moments: list[float] = []
    due = 0.0
    for k in range(n):
        moment = max(moments[-1] if moments else 0.0, due - burst * step)
        if k >= window.count:
            moment = max(moment, moments[k - window.count] + window.seconds)
        moments.append(moment)
        due = max(due, moment) + step
    return moments[-1]


def test_a_burst_reading_is_the_rule_plus_a_window_per_step():
    rule = Rule((Window(6, 1.2),), 2)
    assert [w.count for w in paced(rule)] == [3, 4, 5, 6, 6]
    seconds = [w.seconds for w in paced(rule)]
    assert seconds == pytest.approx([0.204, 0.406, 0.608, 1.214, 1.2])
    assert paced(Rule((Window(6, 1.2),))) == (Window(6, 1.2),)


def test_the_slot_rule_looks_back_as_far_as_a_bucket_reading_reaches():
    """A ledger keeps answers that long (Redis prunes by it): past the rule's
    own window when the bucket's margins add up."""
    rule = Rule((Window(30, 0.02),), 0)
    assert reach(rule) > rule.longest
    assert reach(parse_rule("15/1m+500/1h")) == 3600.0
