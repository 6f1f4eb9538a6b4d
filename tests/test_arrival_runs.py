"""The slot rule with bounded arrivals, checked where it matters: at the server,
which counts arrivals (a property over random rules and delays within the bound),
and over whole runs on the virtual clock."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchrun.core.limits import LimitKey, Pace, Rule, parse_rule
from batchrun.pacing.learning.learner import Learner
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.slots import Grant
from tests.simulation import Network, Server, Simulated, simulate
from tests.test_pacer import most_in_any_window, rules

KEY = LimitKey.RUN_QUERY


# --- the slot rule with bounded arrivals, checked at the server -----------------


@dataclass
class Exchange:
    start: float
    arrival: float
    answer: float


def paced_with_bound(
    rule: Rule, ready: list[float], trips: list[tuple[float, float]], bound: float
) -> list[Exchange]:
    """Grant every job FIFO through a MemoryLedger, as early as it allows, each
    counted until min(its answer, start + bound); `trips` are (one-way delay,
    the rest of the exchange: the server's work and the way back)."""
    ledger = MemoryLedger()
    answers: list[tuple[float, int, float]] = []
    sent: list[Exchange] = []
    moment = -math.inf
    for job_ready, (forward, rest) in zip(ready, trips, strict=True):
        moment = max(moment, job_ready)
        while True:
            while answers and answers[0][0] <= moment:
                end, ticket, until = heapq.heappop(answers)
                ledger.release(ticket, min(end, until))
            result = ledger.reserve(KEY.value, rule, Pace.EXACT, moment)
            if isinstance(result, Grant):
                end = moment + forward + rest
                heapq.heappush(answers, (end, result.ticket, moment + bound))
                sent.append(Exchange(moment, moment + forward, end))
                break
            moment = answers[0][0] if result.until is None else result.until
    return sent


@st.composite
def bounded_workloads(draw):
    count = draw(st.integers(1, 60))
    bound = draw(st.floats(0, 0.5))
    gaps = draw(st.lists(st.floats(0, 3), min_size=count, max_size=count))
    # The true one-way delay is within the bound: a share of it.
    shares = draw(st.lists(st.floats(0, 1), min_size=count, max_size=count))
    rests = draw(st.lists(st.floats(0, 3), min_size=count, max_size=count))
    ready = [round(sum(gaps[: i + 1]), 6) for i in range(count)]
    trips = [(share * bound, rest) for share, rest in zip(shares, rests, strict=True)]
    return ready, trips, bound


@settings(max_examples=300, deadline=None)
@given(rule=rules, workload=bounded_workloads())
def test_no_server_window_is_exceeded_when_the_delay_is_within_the_bound(
    rule, workload
):
    """Random rules, one-way delays within the bound, and server work of any
    length: counted until min(answer, start + bound), no window at the server
    (which counts arrivals) ever holds more than COUNT."""
    ready, trips, bound = workload
    sent = paced_with_bound(rule, ready, trips, bound)
    arrivals = [exchange.arrival for exchange in sent]
    for window in rule.windows:
        assert most_in_any_window(arrivals, window.seconds) <= window.count


def test_a_one_way_delay_past_the_bound_can_overflow_a_window():
    """The bound is what makes it safe: a first request slower than the bound,
    and a next one as quick as can be, land in one server window."""
    rule = parse_rule("1/1s")
    sent = paced_with_bound(rule, [0.0, 0.0], [(0.3, 0.0), (0.0, 0.0)], bound=0.1)
    assert sent[1].start == pytest.approx(1.1)
    assert sent[1].arrival - sent[0].arrival < 1.0


# --- whole runs on the virtual clock ------------------------------------------


@pytest.mark.parametrize("latency", [(1e-4, 1e-4), (0.005, 0.05)], ids=["lan", "wan"])
def test_slow_answers_cost_no_round_trip_per_window_once_traced(monkeypatch, latency):
    """120 jobs at 30/2s against a server that answers 100 ms after each
    arrival: traced, each window opens from the bounded arrivals, not from the
    answers, so the run ends sooner, with no 429 (serial start off, as the
    learner's proof of the count is not what this measures)."""
    monkeypatch.setattr(Learner, "gated", lambda self, key, windows, now, reach: None)
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


def _slow_run(server: Server, traced: bool, latency: tuple[float, float]) -> Simulated:
    """120 jobs at 30/2s, each accepted request answered 100 ms after it arrived."""
    network = Network(work=0.1, traced=traced)
    return simulate(
        client="30/2s", server=server, count=120, latency=latency, network=network
    )


@pytest.mark.parametrize("latency", [(1e-4, 1e-4), (0.002, 0.01)], ids=["lan", "wan"])
def test_probes_do_not_wait_for_slow_answers_once_traced(latency):
    """With no accepted record, requests past it are probes that reach the
    server one at a time. Untraced, each waits for the last one's answer, so a
    window never holds more than its length over 100 ms; traced, each waits
    only until the last has surely arrived (twice the arrival bound after it
    left), so the first window fills as fast as 8 requests in flight allow:
    the right rule at 1.085 x on a LAN, with no 429."""
    server = Server(LimiterKind.SLIDING, parse_rule("30/2s"))
    answers, bounded = (_slow_run(server, t, latency) for t in (False, True))
    assert answers.tally.rate_limited == bounded.tally.rate_limited == 0
    assert answers.ratio > 1.8
    assert bounded.ratio < (1.1 if latency[1] < 1e-3 else 1.25)


@pytest.mark.parametrize("seed", range(3))
def test_probes_reach_a_stricter_slow_server_one_at_a_time(seed):
    """Told 30/2s, the server allows 10/2s and answers 100 ms after each
    arrival: probes leave before the answers, yet reach the server in order,
    so the first refusal is read against every arrival before it: a 429 or
    two (not the window's worth a burst of probes would get), every job
    accepted once, near the ideal under 10/2s."""
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
    assert run.tally.rate_limited <= 2
    assert run.ratio < 1.1
