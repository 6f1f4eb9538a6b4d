"""The simulation harness: whole runs of today's runner against server models."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchrun.core.clock import wall_time
from batchrun.core.events import Status
from batchrun.core.limits import Rule, Window, parse_rule
from batchrun.pacing.kept import KEPT_FOR, read_record, record_text
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.slots import eta
from support.script_client import script
from support.simulation import Server, carried, ideal, scenarios, simulate

SCENARIOS = scenarios()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_job_is_accepted_and_ends_done_exactly_once(scenario):
    """Against every server model, each job is accepted once and ends done once."""
    run = simulate(client=scenario.client, server=scenario.server)
    assert run.finished
    assert set(run.accepted.values()) == {1}
    assert len(run.accepted) == 60
    assert set(run.ended.values()) == {(Status.DONE,)}
    assert len(run.ended) == 60


@pytest.mark.parametrize("scenario", SCENARIOS[:4], ids=[s.name for s in SCENARIOS[:4]])
def test_harness_counts_what_the_runner_counts(scenario):
    """The arrivals' 429s are the runner's, and each job arrived once per 429 plus one."""
    run = simulate(client=scenario.client, server=scenario.server)
    assert sum(run.rate_limited.values()) == run.tally.rate_limited
    assert len(run.arrivals) == 60 + run.tally.rate_limited
    assert all(a.sent <= a.at <= run.makespan for a in run.arrivals)


def test_a_seed_gives_one_run():
    """Two runs with one seed see the same arrivals; another seed differs."""
    server = SCENARIOS[4].server  # weighted, with Retry-After
    first, again = (simulate(client="30/2s", server=server, seed=3) for _ in "ab")
    assert first.arrivals == again.arrivals
    assert simulate(client="30/2s", server=server, seed=4).arrivals != first.arrivals


def test_ideal_under_a_sliding_log_is_the_pacers_eta():
    """For a sliding log, the greedy ideal is `slots.eta` under the server's rule."""
    rule = parse_rule("15/1m+20/2m")
    server = Server(LimiterKind.SLIDING, rule)
    assert ideal(server, 60) == pytest.approx(eta(60, rule, now=0.0))


def test_a_server_with_the_clients_rule_and_count_sends_no_429():
    """Client and sliding server at 10/2s: no 429, within 10 % of the ideal."""
    server = Server(LimiterKind.SLIDING, parse_rule("10/2s"))
    run = simulate(client="10/2s", server=server)
    assert run.tally.rate_limited == 0
    assert 1.0 < run.ratio < 1.1


def test_a_run_past_the_bound_stops_and_is_not_finished():
    """A run cut off by its bound ends no job twice and reports itself unfinished."""
    server = Server(LimiterKind.SLIDING, parse_rule("10/2s"))
    run = simulate(client="10/2s", server=server, bound=5.0)
    assert not run.finished
    assert 10 <= run.tally.done < 60
    assert set(run.ended.values()) == {(Status.DONE,)}


@settings(max_examples=12, deadline=None)
@given(
    kind=st.sampled_from([LimiterKind.SLIDING, LimiterKind.FIXED]),
    count=st.integers(3, 25),
    seconds=st.sampled_from([1.0, 2.0]),
    retry_after=st.booleans(),
    seed=st.integers(0, 3),
)
def test_any_stricter_server_is_learned_with_few_429s(
    kind, count, seconds, retry_after, seed
):
    """For random sliding or fixed server rules stricter than the client's 30/2s,
    the run finishes, every job is accepted once, and it gets at most
    max(4, the reference script's) 429s (issue 36's figure for a first run)."""
    server = Server(kind, Rule((Window(count, seconds),)), retry_after=retry_after)
    run = simulate(client="30/2s", server=server, count=40, seed=seed)
    scripted = script(client="30/2s", server=server, count=40, seed=seed)
    assert run.finished
    assert set(run.accepted.values()) == {1}
    assert run.tally.rate_limited <= max(4, scripted.tally.rate_limited)


@pytest.mark.parametrize("origin", [0.0, 13.0, 41.0])
def test_auto_starts_from_b_and_a_fixed_window_b_holds(origin):
    """--profile auto paces by B first, for a lifetime; against a fixed-window
    B (16 let through within seconds across its boundary) the run finishes
    with few 429s (the re-tests of A), and a rerun right after, under B
    confirmed again, sends none."""
    b = parse_rule("15/1m+500/1h")
    server = Server(LimiterKind.FIXED, b, {"origin": origin})
    first = MemoryLedger()
    run = simulate(client="30/1m", server=server, count=60, fallback=b, ledger=first)
    assert run.finished
    assert run.tally.rate_limited <= 4
    again = simulate(
        client="30/1m",
        server=server,
        count=30,
        fallback=b,
        ledger=carried(first),
        wall=run.wall_end,
    )
    assert again.tally.rate_limited == 0


def test_a_rerun_starts_at_full_speed_from_the_accepted_record():
    """A fresh key proves its budget one request at a time past what the server
    was seen to accept; the ledger keeps that record, so a rerun (or a second
    process) sends up to it at full speed from its first request."""
    server = Server(LimiterKind.SLIDING, parse_rule("30/2s"), work=0.1)
    first = MemoryLedger()
    run = simulate(client="30/2s", server=server, count=30, ledger=first)
    again = simulate(client="30/2s", server=server, count=30, ledger=carried(first))

    def early(sim) -> int:
        return sum(1 for a in sim.arrivals if a.sent < 0.1)

    assert early(run) <= 2
    assert early(again) == 8  # --concurrency's worth at once
    assert again.tally.rate_limited == 0
    assert again.makespan < run.makespan


def test_the_accepted_record_is_kept_only_for_its_rule():
    """The record reads back capped at the rule's count, for that rule only, and
    not when damaged or older than lessons are kept."""
    rule = parse_rule("30/2s")
    now = wall_time()

    def back(text: str, given: Rule = rule) -> dict[float, int]:
        return read_record(text, given=given, now=now)

    text = record_text({2.0: 40, 10.0: 7}, given=rule, at=now)
    assert back(text) == {2.0: 30, 10.0: 7}
    assert back(text, parse_rule("20/2s")) == {}
    assert back("{not json") == {}
    old = record_text({2.0: 5}, given=rule, at=now - KEPT_FOR - 60)
    assert back(old) == {}
    scaled = record_text({0.2: 5}, given=rule.scaled(10), at=now)
    assert back(scaled) == {}
    assert back(scaled, rule.scaled(10)) == {0.2: 5}
