"""The slot rule with bounded arrivals, checked where it matters: at the server,
which counts a request when its limiter sees it (a property over random rules,
delays and queues), and over whole runs on the virtual clock."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchrun.core.limits import LimitKey, Pace, Rule, parse_rule
from batchrun.pacing.learner import Learner
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.slots import Grant
from support.simulation import Network, Server, Simulated, simulate
from tests.test_pacer import most_in_any_window, rules

KEY = LimitKey.RUN_QUERY


# --- the slot rule with bounded arrivals, checked at the server -----------------


@dataclass
class Exchange:
    start: float
    arrival: float
    answer: float


def paced_with_floor(
    rule: Rule, ready: list[float], trips: list[tuple[float, float]], bound: float
) -> list[Exchange]:
    """Grant every job FIFO through a MemoryLedger, as early as it allows, each
    counted until its answer less the floor (`arrival`: the quickest exchange
    answered so far, less `bound`; none for the first answer); `trips` are (the way to the server's count:
    the network and any queue before the limiter, the rest: work and the way
    back)."""
    ledger = MemoryLedger()
    answers: list[tuple[float, int, float]] = []
    sent: list[Exchange] = []
    moment, quickest = -math.inf, math.inf
    for job_ready, (way, rest) in zip(ready, trips, strict=True):
        moment = max(moment, job_ready)
        while True:
            while answers and answers[0][0] <= moment:
                end, ticket, start = heapq.heappop(answers)
                # The first answer counts until itself: a floor takes two.
                floor = 0.0 if math.isinf(quickest) else None
                quickest = min(quickest, end - start)
                floor = max(quickest - bound, 0.0) if floor is None else floor
                ledger.release(ticket, end - floor)
            result = ledger.reserve(KEY.value, rule, Pace.EXACT, moment)
            if isinstance(result, Grant):
                end = moment + way + rest
                heapq.heappush(answers, (end, result.ticket, moment))
                sent.append(Exchange(moment, moment + way, end))
                break
            moment = answers[0][0] if result.until is None else result.until
    return sent


@st.composite
def bounded_workloads(draw):
    """Random jobs, a bound D and a least work H; the first request reaches the
    count within D and takes H after it; every other may wait any time in a
    queue before its count, and takes H or more after it."""
    count = draw(st.integers(1, 60))
    bound = draw(st.floats(0, 0.5))
    least = draw(st.floats(0, 1))
    gaps = draw(st.lists(st.floats(0, 3), min_size=count, max_size=count))
    shares = draw(st.lists(st.floats(0, 1), min_size=count, max_size=count))
    queues = draw(st.lists(st.floats(0, 2), min_size=count, max_size=count))
    extras = draw(st.lists(st.floats(0, 3), min_size=count, max_size=count))
    queues[0] = extras[0] = 0.0
    ready = [round(sum(gaps[: i + 1]), 6) for i in range(count)]
    trips = [
        (share * bound + queue, least + extra)
        for share, queue, extra in zip(shares, queues, extras, strict=True)
    ]
    return ready, trips, bound


@settings(max_examples=300, deadline=None)
@given(rule=rules, workload=bounded_workloads())
def test_no_server_window_is_exceeded_whatever_waits_before_the_count(rule, workload):
    """The model (`arrival`'s rule, re-implemented in `paced_with_floor`, the
    deviations left out) under its assumption: random rules, round trips within
    the bound, queues before the count and work of any length, the quickest
    request unqueued. Counted until the answer less the floor, no window at the
    server (which counts when its limiter sees a request) holds over COUNT."""
    ready, trips, bound = workload
    sent = paced_with_floor(rule, ready, trips, bound)
    arrivals = [exchange.arrival for exchange in sent]
    for window in rule.windows:
        assert most_in_any_window(arrivals, window.seconds) <= window.count


def test_a_quickest_exchange_slower_than_the_bound_can_overflow_a_window():
    """What makes it safe is that the quickest exchange reached the count within
    the bound: two first requests that both waited 0.3 s past a 0.1 s bound,
    and a next one as quick as can be, land in one server window."""
    rule = parse_rule("2/1s")
    trips = [(0.3, 0.0), (0.3, 0.0), (0.0, 0.0)]
    sent = paced_with_floor(rule, [0.0, 0.0, 0.0], trips, bound=0.1)
    assert sent[2].start == pytest.approx(1.1)
    assert sent[2].arrival - sent[0].arrival < 1.0


# --- whole runs on the virtual clock ------------------------------------------


@pytest.mark.parametrize("latency", [(1e-4, 1e-4), (0.040, 0.042)], ids=["lan", "wan"])
def test_slow_answers_cost_no_round_trip_per_window_once_traced(monkeypatch, latency):
    """120 jobs at 30/2s against a server that answers 100 ms after each
    arrival: traced, each window opens from the bounded arrivals, not from the
    answers, so the run ends sooner, with no 429 (serial start off, as the
    learner's proof of the count is not what this measures)."""
    monkeypatch.setattr(Learner, "opens", lambda self, key, now, reach, round_: None)
    server = Server(LimiterKind.SLIDING, parse_rule("30/2s"))

    def run(traced: bool) -> Simulated:
        network = Network(work=0.1, traced=traced, connections=32)
        return simulate(
            client="30/2s",
            server=server,
            count=120,
            concurrency=32,
            latency=latency,
            network=network,
        )

    answers, bounded = run(traced=False), run(traced=True)
    assert sum(bounded.rate_limited.values()) == 0
    # Three windows each open up to 100 ms sooner, less the bound.
    assert bounded.makespan < answers.makespan - 0.1


@pytest.mark.parametrize("queued", [0.1, 1.0], ids=["one-in-ten", "every"])
def test_a_server_that_counts_requests_late_is_not_overrun(queued):
    """A busy server (or a loopback sandbox sharing the client's CPU): one
    request in ten, or every one, waits up to 20 ms after it arrives before the
    limiter counts it, far past the network's bound (a 0.1 ms LAN), then is
    answered 100 ms later. A request that waited is answered that much later
    and counts that much longer, and a key's first exchange (which may have
    waited alone) counts until its answer: no window is overrun in ten seeds,
    near the speed of a server that queues nothing (1.036 x)."""
    server = Server(LimiterKind.SLIDING, parse_rule("30/2s"))
    network = Network(work=0.1, traced=True, connections=32, queue=0.02, queued=queued)
    for seed in range(10):
        run = simulate(
            client="30/2s",
            server=server,
            count=120,
            concurrency=32,
            seed=seed,
            latency=(1e-4, 1e-4),
            network=network,
        )
        assert run.finished
        assert run.tally.rate_limited == 0, seed
        assert run.ratio < 1.07


def _slow_run(server: Server, traced: bool, latency: tuple[float, float]) -> Simulated:
    """120 jobs at 30/2s, each accepted request answered 100 ms after it arrived."""
    network = Network(work=0.1, traced=traced)
    return simulate(
        client="30/2s", server=server, count=120, latency=latency, network=network
    )


@pytest.mark.parametrize("latency", [(1e-4, 1e-4), (0.002, 0.01)], ids=["lan", "wan"])
def test_probes_do_not_wait_for_slow_answers_once_traced(latency):
    """With no accepted record, requests past it are probes that reach the
    server a few at a time. Untraced, each waits for the last one's answer, so
    a window never holds more than its length over 100 ms; traced, as many may
    be on their way as the rule's rate fills until one has surely arrived
    (twice the arrival bound after it left), so the first window fills as fast
    as 8 requests in flight allow: the right rule at 1.085 x on a LAN, with
    no 429."""
    server = Server(LimiterKind.SLIDING, parse_rule("30/2s"))
    answers, bounded = (_slow_run(server, t, latency) for t in (False, True))
    assert answers.tally.rate_limited == bounded.tally.rate_limited == 0
    assert answers.ratio > 1.8
    assert bounded.ratio < (1.1 if latency[1] < 1e-3 else 1.25)


@pytest.mark.parametrize("seed", range(3))
def test_probes_reach_a_stricter_slow_server_one_at_a_time(seed):
    """Told 30/2s, the server allows 10/2s and answers 100 ms after each
    arrival: probes leave before the answers, yet reach the server in order,
    so the first refusal is read against every arrival before it: a few
    429s (issue 36: at most 4 where the server is stricter, not the window's
    worth a burst of probes would get), every job accepted once, near the
    ideal under 10/2s."""
    server = Server(LimiterKind.SLIDING, parse_rule("10/2s"), work=0.1)
    network = Network(traced=True)
    run = simulate(
        client="30/2s",
        server=server,
        count=60,
        seed=seed,
        latency=(1e-4, 1e-3),
        network=network,
    )
    assert run.finished
    assert set(run.accepted.values()) == {1}
    assert run.tally.rate_limited <= 4
    assert run.ratio < 1.1


# --- answers that vary: the floor from the quickest four ------------------------


# Each example is a whole run of up to 120 jobs: 12 of them (100 were run by
# hand, hypothesis seeds 1-3) under the suite's time limit, with room to spare.
@pytest.mark.timeout(180)
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 10_000),
    queue=st.sampled_from([0.0, 0.005, 0.02, 0.05]),
    queued=st.sampled_from([0.1, 1.0]),
    work=st.floats(0.02, 0.2),
    spread=st.floats(0.0, 0.6),
    count=st.sampled_from(["10/1s", "30/2s"]),
)
def test_no_server_window_is_exceeded_when_answers_vary_and_requests_queue(
    monkeypatch, seed, queue, queued, work, spread, count
):
    """On the virtual clock, a server that counts on arrival after a queue of
    up to `queue` s (for a share `queued` of the requests), then works `work`
    to `work + spread` s on each: counted until the answer less the floor
    (the quickest exchange less D less its gap to the fourth quickest), and no
    later than the send plus D plus a twentieth of the window (a queue of up
    to 50 ms is within it), no window the server keeps holds more than one
    request past its count, and it refuses at most one. One: where a request
    works less than the quickest exchange did by more than the gap (the
    floor's stated risk), it may count until just before its count (10/1s,
    0.125-0.19 s of work, 20 ms queues for one request in ten: one run in 300
    seeds).
    Probes are not gated, so windows fill as fast as the floor allows."""
    monkeypatch.setattr(Learner, "opens", lambda self, key, now, reach, round_: None)
    rule = parse_rule(count)
    server = Server(LimiterKind.SLIDING, rule, work=work, work_spread=spread)
    network = Network(traced=True, connections=32, queue=queue, queued=queued)
    run = simulate(
        client=rule,
        server=server,
        count=4 * rule.windows[0].count,
        concurrency=32,
        seed=seed,
        latency=(1e-4, 2e-3),
        network=network,
    )
    assert run.finished
    assert run.tally.rate_limited <= 1
    arrivals = [a.at for a in run.arrivals]
    window = rule.windows[0]
    assert most_in_any_window(arrivals, window.seconds) <= window.count + 1


@pytest.mark.parametrize(("queue", "queued"), [(1.0, 0.1), (0.3, 0.3)])
def test_a_queue_past_the_allowance_costs_a_few_429s_not_one_a_window(queue, queued):
    """A request counts no longer than its send plus D plus a twentieth of the
    shortest window (0.1 s of 2 s): a server that holds some requests up to
    0.3-1 s before its limiter counts them (answers 0.2-0.8 s after) may refuse
    one that the bound let through. The refusal's whole trip holds the queue
    and raises D, and its 429 doubles D for two windows: 600 jobs (20
    windows) cost a few 429s, not one a window (2-6 in five seeds of each;
    1-4 with D doubled for the whole run; 1-8 without either)."""
    server = Server(LimiterKind.SLIDING, parse_rule("30/2s"), work=0.2, work_spread=0.6)
    network = Network(traced=True, connections=32, queue=queue, queued=queued)
    for seed in range(5):
        run = simulate(
            client="30/2s",
            server=server,
            count=600,
            seed=seed,
            latency=(0.002, 0.01),
            network=network,
        )
        assert run.finished
        assert run.tally.rate_limited <= 6, seed


def test_answers_of_0_2_to_0_8_s_keep_most_of_the_least_work(monkeypatch):
    """Issue 36, item 4: answers that take 0.2-0.8 s of a 2 s window, with no
    queue. Four deviations of the exchange times (the floor before) took all
    of it off (about 0.6 s); the gap to the fourth quickest keeps most of the
    least work, so each window opens sooner, with no 429 (virtual clock, probes
    not gated, 32 in flight: 1.42-1.50 x before, 1.34-1.42 x with the gap);
    and a request counting no longer than its send plus D and a twentieth of
    the window keeps its own work above the least out too (1.18-1.21 x)."""
    monkeypatch.setattr(Learner, "opens", lambda self, key, now, reach, round_: None)
    server = Server(LimiterKind.SLIDING, parse_rule("30/2s"), work=0.2, work_spread=0.6)
    ratios = []
    for seed in range(3):
        run = simulate(
            client="30/2s",
            server=server,
            count=120,
            concurrency=32,
            seed=seed,
            latency=(0.002, 0.01),
            network=Network(traced=True, connections=32),
        )
        assert run.tally.rate_limited == 0
        ratios.append(run.ratio)
    assert max(ratios) < 1.30
