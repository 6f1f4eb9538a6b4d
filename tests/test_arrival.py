"""The arrival bound: how late a request can have been counted by the server, its
answer less the key's floor (`pacing.arrival`), and what the pacer does with it."""

from __future__ import annotations

import math

import pytest

from batchrun.api.client import Client, asgi_transport
from batchrun.api.outcome import Kind
from batchrun.core.limits import LimitKey, Pace, limit_table, parse_rule
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job
from batchrun.ledgers.redis_ledger import RedisLedger
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.arrival import ArrivalBound, Trip
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.log import KeyLog, Sent, arrived, latest
from batchrun.pacing.pacer import Pacer
from batchrun.pacing.slots import Grant, Wait
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running

KEY = LimitKey.RUN_QUERY


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.moment = 0.0

    def now(self) -> float:
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += seconds

    def set(self, moment: float) -> None:
        self.moment = moment


def answer(bound: ArrivalBound, key: str, trip: Trip, at: float) -> float:
    """One exchange of `key` answered `at`, as the pacer takes it: learn from
    it, then say until when it counts."""
    bound.observe(key, trip, at)
    return bound.counted_by(key, trip, at)


def accepted(written: float) -> Trip:
    return Trip(written=written, accepted=True)


def test_nothing_seen_means_no_bound():
    """Without a round trip seen there is no bound: a request counts until its
    answer, as it always did."""
    bound = ArrivalBound()
    assert answer(bound, "k", accepted(9.9), 10.0) == 10.0
    assert answer(bound, "k", accepted(10.9), 11.0) == 11.0
    assert (bound.bound, bound.floor("k")) == (None, None)


def test_a_connect_trace_sets_the_bound_as_tcp_does():
    """The first round trip R gives RFC 6298's first timeout, R + 4 * R/2 = 3R.
    A key's first three exchanges count until their answers (the first may
    have waited alone, a server waking up); a fourth as quick counts until its
    send plus 3R."""
    bound = ArrivalBound()
    trip = Trip(written=1.0, round_trip=0.010, accepted=True)
    assert answer(bound, "k", trip, 1.2) == 1.2
    assert bound.bound == pytest.approx(0.030)
    assert bound.floor("k") is None
    for sent in (2.0, 3.0):
        assert answer(bound, "k", accepted(sent), sent + 0.2) == sent + 0.2
    assert answer(bound, "k", accepted(4.0), 4.2) == pytest.approx(4.030)
    assert bound.floor("k") == pytest.approx(0.170)


def test_a_request_that_waited_before_its_count_counts_that_much_longer():
    """A busy server: a request waits 50 ms before its limiter counts it, then
    works 100 ms like the others. Its answer comes 50 ms later, and so does the
    moment it counts until: never before the count (the network's bound alone,
    its send plus D, would have been 50 ms too soon)."""
    bound = ArrivalBound()
    bound.observe("k", Trip(written=0.0, round_trip=0.002), answered=0.0)
    for sent in (0.0, 0.2, 0.4, 0.6):  # no queue, four times
        answer(bound, "k", accepted(sent), sent + 0.102)
    assert bound.bound is not None
    counted = 1.0 + 0.001 + 0.050  # its way out, then the queue
    by = answer(bound, "k", accepted(1.0), counted + 0.101)
    assert counted <= by < counted + 0.101
    assert by > 1.0 + bound.bound + 0.049


def test_the_floor_allows_for_a_queue_in_the_quickest_exchange():
    """The gap from the quickest exchange to the fourth quickest is taken off
    the floor too: what a queue may have hidden even in the quickest. Which
    exchange came when does not matter, only the four quickest."""
    bound = ArrivalBound()
    bound.observe("k", Trip(written=0.0, round_trip=0.002), answered=0.0)
    d = bound.bound
    assert d is not None
    for exchange in (0.120, 0.100, 0.300, 0.110, 0.105):
        answer(bound, "k", accepted(0.0), exchange)
    assert bound.floor("k") == pytest.approx(0.100 - d - (0.120 - 0.100))


def test_a_floor_is_kept_per_key_and_only_for_acceptances():
    """A quick key's exchanges do not lower a slow key's floor; a refusal or an
    error, with no work to take off, counts until its answer."""
    bound = ArrivalBound()
    bound.observe("k", Trip(written=0.0, round_trip=0.002), answered=0.0)
    for _ in range(4):
        answer(bound, "slow", accepted(0.0), 0.100)
        answer(bound, "quick", accepted(0.0), 0.003)
    assert bound.floor("slow") == pytest.approx(0.100 - 0.006)
    assert bound.floor("quick") == 0.0
    refusal = Trip(written=1.0, refused=True)
    assert bound.counted_by("slow", refusal, 1.004) == 1.004
    assert answer(bound, "slow", Trip(written=2.0), 2.2) == 2.2
    assert bound.floor("slow") == pytest.approx(0.100 - 0.006)


def test_steady_round_trips_narrow_the_bound_toward_them():
    """Round trips that keep to one value shrink the deviation: the bound nears
    the round trip itself, never below it."""
    bound = ArrivalBound()
    for _ in range(40):
        bound.observe("k", Trip(written=0.0, round_trip=0.010), answered=0.5)
    assert bound.bound == pytest.approx(0.010, abs=1e-4)
    assert bound.bound is not None
    assert bound.bound >= 0.010


def test_an_answer_with_work_in_it_is_no_sample():
    """An accepted answer holds the server's work: it teaches nothing of the
    network, however quick or slow."""
    bound = ArrivalBound()
    bound.observe("k", Trip(written=0.0), answered=0.100)
    assert bound.bound is None


def test_a_refusal_is_a_round_trip_of_the_network():
    """A 429 is refused before any work: its whole trip is a sample."""
    bound = ArrivalBound()
    bound.observe("k", Trip(written=2.0, refused=True), answered=2.004)
    assert bound.bound == pytest.approx(0.012)


def test_a_slower_round_trip_widens_the_bound():
    """A round trip slower than the ones before raises the bound above both."""
    bound = ArrivalBound()
    for _ in range(40):
        bound.observe("k", Trip(written=0.0, round_trip=0.010), answered=0.5)
    bound.observe("k", Trip(written=0.0, round_trip=0.030), answered=0.5)
    assert bound.bound is not None
    assert bound.bound > 0.030


def test_a_refusal_doubles_the_bound_once_per_episode():
    """A refusal says the bound was too tight: it doubles; refusals of requests
    that left before that doubling (the same burst) do not double it again."""
    bound = ArrivalBound()
    bound.observe("k", Trip(written=0.0, round_trip=0.010), answered=0.5)
    assert bound.widen(Trip(written=1.0, refused=True), now=1.1)
    assert bound.bound == pytest.approx(0.060)
    assert not bound.widen(Trip(written=1.05, refused=True), now=1.2)
    assert bound.widen(Trip(written=1.3, refused=True), now=1.4)
    assert bound.bound == pytest.approx(0.120)


def test_a_doubling_is_undone_two_windows_after_the_last_refusal():
    """Under 5/1s, D doubled twice by refusals at 1.1 and 1.4 halves once
    two windows pass after the last (an answer at 3.4 finds it doubled twice
    still, one at 3.5 once), and again two windows later; never below D."""
    bound, rule = ArrivalBound(), parse_rule("5/1s")
    bound.observe("k", Trip(written=0.0, round_trip=0.010), answered=0.5)
    bound.widen(Trip(written=1.0, refused=True), now=1.1)
    bound.widen(Trip(written=1.3, refused=True), now=1.4)
    seen = []
    for ticket, now in enumerate((3.4, 3.5, 5.4, 5.6, 9.0)):
        bound.counts_until("k", ticket, None, now, rule)
        seen.append(bound.bound)
    assert seen == pytest.approx([0.120, 0.060, 0.060, 0.030, 0.030])


def test_widening_without_a_bound_does_nothing():
    """No bound, nothing to widen: requests count until their answers."""
    bound = ArrivalBound()
    assert not bound.widen(Trip(written=1.0, refused=True), now=1.1)
    assert bound.bound is None


# --- the pacer counts a request until its bounded arrival --------------------


def pacer(rule: str = "2/1s") -> tuple[Pacer, MemoryLedger, FakeClock]:
    clock = FakeClock()
    ledger = MemoryLedger()
    made = Pacer(rules={KEY: parse_rule(rule)}, ledger=ledger, clock=clock)
    return made, ledger, clock


def grant(made: Pacer, ledger: MemoryLedger, clock: FakeClock) -> int:
    result = ledger.reserve(KEY.value, made.rules[KEY], made.pace(KEY), clock.now())
    assert isinstance(result, Grant)
    return result.ticket


def test_a_slow_answer_counts_until_its_bounded_arrival():
    """Four requests that left at 0 on a network of 10 ms round trips, answered
    after 100 ms of work: the first three count until their answers, the
    fourth, as quick, until 0.030 (its answer less the floor: 0.1 - 3R), not
    0.1."""
    made, ledger, clock = pacer("4/1s")
    tickets = [grant(made, ledger, clock) for _ in range(4)]
    clock.advance(0.1)
    connect = Trip(written=0.0, round_trip=0.010, accepted=True)
    made.release(KEY, tickets[0], trip=connect)
    for ticket in tickets[1:]:
        made.release(KEY, ticket, trip=Trip(written=0.0, accepted=True))
    assert list(ledger.usage(KEY.value, made.rules[KEY]).finished) == [
        pytest.approx(0.030),
        0.1,
        0.1,
        0.1,
    ]


def answered_after(
    quickest: tuple[float, ...], connect: float, then: float
) -> tuple[Pacer, float, float]:
    """A 30/2s key whose four exchanges took `quickest` (the first over a new
    connection of `connect`), then one that took `then`: the pacer, when that
    one left, and until when it counts."""
    made, ledger, clock = pacer("30/2s")
    for spent in quickest:
        ticket = grant(made, ledger, clock)
        sent = clock.now()
        clock.advance(spent)
        trip = Trip(written=sent, round_trip=connect, accepted=True)
        made.release(KEY, ticket, trip=trip)
    sent = clock.now()
    ticket = grant(made, ledger, clock)
    clock.advance(then)
    made.release(KEY, ticket, trip=Trip(written=sent, accepted=True))
    last = list(ledger.usage(KEY.value, made.rules[KEY]).finished)[-1]
    return made, sent, last


def test_a_slow_answer_counts_no_longer_than_its_send_plus_d_and_the_allowance():
    """Answers that vary: the quickest four took 0.20-0.21 s, then one takes
    0.8 s. Its answer less the floor (0.8 - 0.19) would hold its slot 0.61 s
    past its send; it counts until its send plus D plus a twentieth of the
    rule's shortest window (the wait before its count allowed for), 0.1 s of
    2 s, and no longer."""
    made, sent, last = answered_after((0.200, 0.205, 0.207, 0.210), 0.010, 0.8)
    d = made.arrival.bound
    assert d is not None
    assert last == pytest.approx(sent + d + 0.1)


def test_where_answers_hold_no_work_a_late_one_counts_until_its_answer():
    """The quickest four took 5-6 ms (no work: a floor near 0), then one takes
    0.15 s: it waited in a queue (a loopback server sharing the client's CPU),
    so it counts until its answer, not its send plus D plus the allowance."""
    made, sent, last = answered_after((0.005, 0.0052, 0.0055, 0.006), 0.004, 0.15)
    floor = made.arrival.floor(KEY.value)
    assert floor is not None
    assert floor < 0.05
    assert last == pytest.approx(sent + 0.15 - floor)


def test_a_quick_answer_counts_until_its_answer():
    """An answer sooner than the bound is the better bound: it is kept."""
    made, ledger, clock = pacer("1/1s")
    ticket = grant(made, ledger, clock)
    clock.advance(0.005)
    made.release(KEY, ticket, trip=Trip(written=0.0, round_trip=0.010, accepted=True))
    assert list(ledger.usage(KEY.value, made.rules[KEY]).finished) == [0.005]


def test_without_a_trip_a_request_counts_until_its_answer():
    """A transport that says nothing of the exchange (in process) leaves the
    rule as it was: until the answer."""
    made, ledger, clock = pacer("1/1s")
    made.arrival.observe(KEY.value, Trip(written=0.0, round_trip=0.010), answered=0.0)
    ticket = grant(made, ledger, clock)
    clock.advance(0.1)
    made.release(KEY, ticket)
    assert list(ledger.usage(KEY.value, made.rules[KEY]).finished) == [0.1]


@pytest.mark.parametrize(
    ("sent", "refused_at", "factor"),
    [
        pytest.param(5, 1.05, 2, id="a-slot-only-a-floor-opened"),
        pytest.param(4, 1.05, 1, id="a-slot-open-without-the-floor"),
        pytest.param(5, 10.0, 1, id="long-after"),
    ],
)
@pytest.mark.anyio
async def test_a_refusal_widens_the_bound_where_only_a_floor_opened_its_slot(
    sent, refused_at, factor
):
    """Under 5/1s, `sent` requests leave at 0 and are answered at 0.1; the
    fourth and fifth count until 0.03 (the floor). A 429 at 1.05 doubles the
    bound when its slot was open only as the floor shortened those counts (five
    sent: until their answers they fill the window until 1.1); not when the
    window had room anyway (four sent), nor long after. Otherwise it only adds
    its round trip as a sample."""
    made, _, clock = pacer("5/1s")
    first, *floored = [await made.acquire(KEY) for _ in range(sent)]
    clock.advance(0.1)
    connect = Trip(written=0.0, round_trip=0.010, accepted=True)
    made.release(KEY, first, trip=connect)
    for ticket in floored:
        made.release(KEY, ticket, trip=Trip(written=0.0, accepted=True))
    clock.set(refused_at)
    second = await made.acquire(KEY)
    clock.advance(0.001)
    refusal = Trip(written=refused_at, refused=True)
    made.release(KEY, second, trip=refusal)
    alone = ArrivalBound()  # the same samples, never widened
    alone.observe(KEY.value, connect, answered=0.1)
    alone.observe(KEY.value, refusal, answered=refused_at + 0.001)
    assert alone.bound is not None
    assert made.arrival.bound == pytest.approx(alone.bound * factor)


def test_without_the_floor_a_count_ends_at_its_answer_and_another_process_is_unknown():
    """`unfloored` puts back at its answer each count this process shortened;
    a count within reach that this process did not make (another process's,
    whose answer it cannot know) makes it say nothing (None: assume the floor
    may have opened the slot)."""
    bound, rule = ArrivalBound(), parse_rule("5/1s")
    connect = Trip(written=0.0, round_trip=0.010, accepted=True)
    quick = Trip(written=0.0, accepted=True)
    ends = [
        bound.counts_until(KEY.value, ticket, trip, 0.1, rule)
        for ticket, trip in enumerate([connect, quick, quick, quick])
    ]
    assert ends[:3] == [0.1, 0.1, 0.1]
    assert ends[3] is not None
    assert ends[3] < 0.1  # the fourth is counted short by the floor
    assert bound.shortened(KEY.value, 1.05)
    assert not bound.shortened(KEY.value, 1.2)
    finished = sorted(end for end in ends if end is not None)
    assert bound.unfloored(KEY.value, finished, 1.05) == ([0.1] * 4, 0)
    assert bound.unfloored(KEY.value, [*finished, 0.5], 1.05) is None
    assert bound.unfloored(KEY.value, [-1.0, *finished], 1.05) == (
        [-1.0, *[0.1] * 4],
        0,
    )


# --- what the client reports of an exchange ---------------------------------


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_the_client_reports_the_connect_and_when_the_request_left():
    """Over loopback, httpx's trace gives the TCP connect's round trip on the
    request that opened the connection, and on every request the moment its last
    byte left, before its answer; a reused connection measures no new connect."""
    app = create_app(rules=limit_table())
    with running(app) as url:
        async with Client(base_url=url, token="t", scope="s") as client:
            first = await client.send(Job("a", JobType.AVATAR))
            second = await client.send(Job("b", JobType.AVATAR))
    assert (first.kind, second.kind) == (Kind.DONE, Kind.DONE)
    assert first.round_trip is not None
    assert 0 < first.round_trip < 1.0
    assert second.round_trip is None
    for outcome in (first, second):
        assert outcome.written is not None
        assert 0 <= outcome.written < 1.0


async def test_an_in_process_transport_reports_nothing():
    """The in-process sandbox has no network: no trace, so no bound, and its
    requests count until their answers."""
    app = create_app(rules=limit_table())
    async with Client(
        base_url="http://sandbox", token="t", scope="s", transport=asgi_transport(app)
    ) as client:
        outcome = await client.send(Job("a", JobType.AVATAR))
    assert (outcome.written, outcome.round_trip) == (None, None)


# --- every process reads the same "counts until" --------------------------------


def test_another_process_counts_a_request_until_its_bounded_arrival(tmp_path):
    """A SQLite ledger keeps the moment a request counts until, not its answer:
    another process on the machine opens its next slot a window after it."""
    rule, now = parse_rule("1/10s"), [0.0]
    path = tmp_path / "ledger.db"
    sender = SqliteLedger(path, client="c", hold=30.0, now=lambda: now[0])
    other = SqliteLedger(path, client="c", hold=30.0, now=lambda: now[0])
    granted = sender.reserve("k", rule, Pace.EXACT, 0.0)
    assert isinstance(granted, Grant)
    now[0] = 0.5  # answered at 0.5; it arrived by 0.1
    sender.release(granted.ticket, 0.1)
    sender.close()
    wait = other.reserve("k", rule, Pace.EXACT, 0.5)
    assert isinstance(wait, Wait)
    assert wait.until == pytest.approx(10.1)
    other.close()


def test_another_host_counts_a_request_until_its_bounded_arrival(redis_url):
    """A Redis ledger keeps the moment a request counts until: another host
    opens its next slot a window after it, not a window after the answer."""
    rule, clock = parse_rule("1/10s"), [0.0]
    sender, other = (
        RedisLedger(
            redis_url,
            client="c",
            hold=30.0,
            now=lambda: clock[0],
            server_clock=lambda: clock[0],
        )
        for _ in range(2)
    )
    granted = sender.reserve("k", rule, Pace.EXACT, 0.0)
    assert isinstance(granted, Grant)
    clock[0] = 0.5
    sender.release(granted.ticket, 0.1)
    sender.close()
    wait = other.reserve("k", rule, Pace.EXACT, 0.5)
    assert isinstance(wait, Wait)
    assert wait.until == pytest.approx(10.1)
    other.close()


# --- the probe gate and arrival estimates of the learner's log -----------------


def _log_with_probe() -> tuple[KeyLog, Sent]:
    """A key's log with nothing accepted yet and one probe in flight since 1.0."""
    log = KeyLog()
    return log, log.started(1.0, probe=True)


def test_a_probe_waits_for_the_last_ones_answer_without_a_bound():
    log, _ = _log_with_probe()
    assert log.gated([2.0], 1.5, None) == math.inf


def test_a_probe_waits_until_the_last_one_has_surely_arrived():
    """With a bound on the way to the server, the next probe may leave `reach`
    after the last left, answered or not."""
    log, _ = _log_with_probe()
    windows = [2.0]
    assert log.gated(windows, 1.001, 0.004) == pytest.approx(1.004)
    assert log.gated(windows, 1.004, 0.004) is None


def test_as_many_probes_go_at_once_as_the_rule_fills_in_a_round():
    """Three may be on their way at once: a fourth waits until the first has
    surely arrived; answered ones, and ones surely arrived, hold none back."""
    log = KeyLog()
    first = log.started(1.0, probe=True)
    log.started(1.01, probe=True)
    log.started(1.02, probe=True)
    assert log.gated([2.0], 1.02, 0.05, at_once=3) == pytest.approx(1.05)
    assert log.gated([2.0], 1.02, 0.05, at_once=4) is None
    assert log.gated([2.0], 1.051, 0.05, at_once=3) is None
    log.answered(first, 1.03, False)
    assert log.gated([2.0], 1.03, None, at_once=3) is None
    assert log.gated([2.0], 1.03, None, at_once=2) == math.inf


def test_no_gate_once_answered_or_within_what_the_server_accepted():
    log, entry = _log_with_probe()
    log.answered(entry, 1.1, False)
    assert log.gated([2.0], 1.1, None) is None
    # Within the accepted record a request is no probe, whatever is in flight.
    log.record = {2.0: 30}
    log.started(1.2, probe=True)
    assert log.gated([2.0], 1.2, None) is None


def test_a_refusal_caps_the_record_at_what_the_server_let_through():
    """Thirty sent in a window, ten accepted and nineteen refused, then one
    more refused: the server let ten through, not one more, so the record is
    ten and the next request is a probe. Counting every request the window
    held, refused ones too, made it 29: the pacer sent 19 more as proven, and
    a tightening cost 38 429s (26 now)."""
    log = KeyLog()
    log.record = {2.0: 30}
    for n in range(30):
        entry = log.started(0.01 * n)
        log.answered(entry, 0.01 * n + 0.005, refused=n >= 10)
    log.doubt([2.0], 0.3)
    assert log.record[2.0] == 10
    assert log.beyond([2.0], 0.31)


def test_an_arrival_is_estimated_within_its_bound_not_its_answer():
    """Answered 100 ms after it left, but known to have arrived within 2 ms:
    the estimate and its latest arrival come from the bound."""
    log, entry = _log_with_probe()
    log.answered(entry, 1.1, False, by=1.002)
    assert (arrived(entry), latest(entry)) == pytest.approx((1.001, 1.002))
    # No bound: anywhere between the send and the answer, as before.
    plain = Sent(1.0, 1.1, False)
    assert (arrived(plain), latest(plain)) == pytest.approx((1.05, 1.1))


def test_work_that_varies_leaves_a_floor_near_the_least_work():
    """Accepted answers 0.2-0.8 s after they left (server work, no queue),
    ten of them spread over it: the floor is the quickest, less D, less its
    gap to the fourth quickest, near the least work (0.2 s); four mean
    deviations of the exchange times (about 0.6 s) would leave none."""
    bound = ArrivalBound()
    bound.observe("k", Trip(written=0.0, round_trip=0.002), answered=0.0)
    d = bound.bound
    assert d is not None
    for exchange in (0.8, 0.2, 0.5, 0.74, 0.23, 0.62, 0.26, 0.41, 0.29, 0.68):
        answer(bound, "k", accepted(0.0), exchange)
    assert bound.floor("k") == pytest.approx(0.2 - d - (0.29 - 0.2))


def test_a_floor_takes_four_acceptances():
    """Three acceptances give no floor: the gap to the fourth quickest is what
    allows for a queue hidden in the quickest; the fourth gives one."""
    bound = ArrivalBound()
    bound.observe("k", Trip(written=0.0, round_trip=0.002), answered=0.0)
    for exchange in (0.12, 0.10, 0.11):
        assert answer(bound, "k", accepted(0.0), exchange) == exchange
    assert bound.floor("k") is None
    answer(bound, "k", accepted(0.0), 0.13)
    assert bound.floor("k") == pytest.approx(0.10 - 0.006 - 0.03)
