"""Requests in flight as the limits need (issue 36, item 5): with no
--concurrency, each key's rate times its answer times, from 8 up to a ceiling;
a --concurrency given is a hard cap, and the run says when it set the pace."""

from __future__ import annotations

from batchrun.core.events import Event, InFlightCapped, JobAnswered, JobSent
from batchrun.core.limits import LimitKey, parse_rule
from batchrun.pacing.limiters import LimiterKind
from batchrun.run.settings import IN_FLIGHT_CEILING, IN_FLIGHT_LEAST, in_flight_cap
from support import simulation
from support.doubles import ListSink
from support.simulation import Network, Server, Simulated, simulate

KEY = LimitKey.RUN_QUERY
# 30/1m with run-queries answered in 20 s, at 30 x: 30/2s, answers of 2/3 s.
SLOW = Server(LimiterKind.SLIDING, parse_rule("30/2s"), work=2 / 3)


def test_the_cap_is_the_rate_times_the_slow_end_of_the_answer_times():
    """Little's law: 30/1m (one every 2 s) answered within 20 s needs 10 in
    flight, and one more waiting for its slot; never fewer than 8, never more
    than the ceiling; keys add up."""
    rule = parse_rule("30/1m")
    assert in_flight_cap({KEY: rule}, {KEY: 20.0}) == 11
    assert in_flight_cap({KEY: rule}, {}) == IN_FLIGHT_LEAST
    assert in_flight_cap({KEY: rule}, {KEY: 0.5}) == IN_FLIGHT_LEAST
    assert in_flight_cap({KEY: rule}, {KEY: 3600.0}) == IN_FLIGHT_CEILING
    both = {KEY: rule, LimitKey.AVATAR: parse_rule("10/10s")}
    assert in_flight_cap(both, {KEY: 20.0, LimitKey.AVATAR: 5.0}) == 11 + 6


def _run(monkeypatch, concurrency: int | None) -> tuple[Simulated, list[Event]]:
    """240 slow run-queries at 30/2s on the virtual clock, with every event."""
    events: list[Event] = []

    class Kept(ListSink):
        def emit(self, event: Event) -> None:
            events.append(event)
            super().emit(event)

    monkeypatch.setattr(simulation, "ListSink", Kept)
    run = simulate(
        client="30/2s",
        server=SLOW,
        count=240,
        concurrency=concurrency,
        latency=(0.002, 0.01),
        network=Network(traced=True, connections=64),
    )
    return run, events


def _most_in_flight(events: list[Event]) -> int:
    flying = most = 0
    for event in events:
        if isinstance(event, JobSent):
            flying += 1
            most = max(most, flying)
        elif isinstance(event, JobAnswered):
            flying -= 1
    return most


def test_with_no_concurrency_a_slow_run_query_keeps_the_limit_busy(monkeypatch):
    """Answers of 20 s under 30/1m (scaled): 8 in flight send 24 a minute,
    1.50 x the ideal; with no --concurrency the cap follows the answer times
    (10 or more in flight) and the limit sets the pace: 1.22 x, no 429."""
    run, events = _run(monkeypatch, None)
    assert run.finished
    assert run.tally.rate_limited == 0
    assert _most_in_flight(events) >= 10
    assert run.ratio < 1.3


def test_a_given_concurrency_is_a_hard_cap_and_says_it_set_the_pace(monkeypatch):
    """--concurrency 8 on the same run: never more than 8 in flight, and the
    run says, as it starts to and with how long in all, that the cap held
    requests the limit had room for."""
    run, events = _run(monkeypatch, 8)
    assert run.finished
    assert _most_in_flight(events) == 8
    capped = [e for e in events if isinstance(e, InFlightCapped)]
    assert capped
    assert capped[0].lasted is None
    assert all(e.cap == 8 and e.given for e in capped)
    lasted = sum(e.lasted or 0.0 for e in capped)
    assert lasted > 0.5 * run.makespan


def test_quick_answers_leave_the_limit_in_charge(monkeypatch):
    """Quick answers (no work, 2-10 ms round trips): the limit, not the cap,
    sets the pace, and the run says nothing of concurrency for long."""
    events: list[Event] = []

    class Kept(ListSink):
        def emit(self, event: Event) -> None:
            events.append(event)
            super().emit(event)

    monkeypatch.setattr(simulation, "ListSink", Kept)
    quick = Server(LimiterKind.SLIDING, parse_rule("30/2s"))
    run = simulate(
        client="30/2s",
        server=quick,
        count=120,
        concurrency=None,
        latency=(0.002, 0.01),
        network=Network(traced=True),
    )
    capped = [e for e in events if isinstance(e, InFlightCapped)]
    assert sum(e.lasted or 0.0 for e in capped) < 0.05 * run.makespan
    assert run.ratio < 1.3
