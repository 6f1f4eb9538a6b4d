"""The simulation harness: whole runs of today's runner against server models."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchrun.core.clock import wall_time
from batchrun.core.events import Status
from batchrun.core.limits import Rule, Window, parse_rule
from batchrun.pacing.learning import retest
from batchrun.pacing.learning.storage import (
    KEPT_FOR,
    accepted_record,
    recalled_record,
)
from batchrun.pacing.learning.storage import recalled as recalled_lesson
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.slots import eta
from tests.simulation import KEY, Server, carried, ideal, scenarios, simulate


def recalled(rule: Rule, text: str | None) -> str | None:
    """The rule a kept text gives `rule` now, as text (None: nothing kept)."""
    lesson = recalled_lesson(rule, text, time_scale=1.0, now=wall_time())
    return None if lesson is None else str(lesson.rule)


@contextlib.contextmanager
def learning_only() -> Iterator[None]:
    """No re-test within the run (`retest.RUN_WINDOWS` out of reach): the tests
    that use it pin what learning a server costs; `test_retest` pins what the
    re-tests within a run add (one 429 each, ever rarer)."""
    kept = retest.RUN_WINDOWS
    retest.RUN_WINDOWS = math.inf
    try:
        yield
    finally:
        retest.RUN_WINDOWS = kept


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
    the run finishes, every job is accepted once, and a key gets at most 3 429s."""
    server = Server(kind, Rule((Window(count, seconds),)), retry_after=retry_after)
    with learning_only():
        run = simulate(client="30/2s", server=server, count=40, seed=seed)
    assert run.finished
    assert set(run.accepted.values()) == {1}
    assert max(run.rate_limited.values(), default=0) <= 3


@pytest.mark.parametrize("seed", range(3))
def test_a_shorter_server_window_is_learned_from_retry_after(seed):
    """A burst fits any window longer than it lasted: 5/1s and 5/2s explain the
    first refusal alike, and a leaky bucket too. The bucket is tried first; its
    refusal's Retry-After (1 s) fits 5/1s and not 5/2s, so 5/1s is learned and
    the run goes at its ideal speed."""
    server = Server(LimiterKind.SLIDING, parse_rule("5/1s"), retry_after=True)
    run = simulate(client="30/2s", server=server, count=40, seed=seed)
    assert run.finished
    assert max(run.rate_limited.values()) <= 2
    assert run.ratio <= 1.25


@pytest.mark.parametrize("seed", range(3))
def test_without_retry_after_a_shorter_window_is_tried_before_the_rules_own(seed):
    """A burst fits a leaky bucket, 5/1s and 5/2s alike; each is tried fastest
    first, and a wrong one costs one 429. A 5/1s server that says nothing of
    when it has room refuses the bucket's reading and keeps to 5/1s, which is
    kept: the run and the next go at its speed, not at the safe reading's
    half (before, 5/2s was kept: 1.6 to 2.2 x)."""
    server = Server(LimiterKind.SLIDING, parse_rule("5/1s"), retry_after=False)
    ledger = MemoryLedger()
    with learning_only():
        run = simulate(
            client="30/2s", server=server, count=40, seed=seed, ledger=ledger
        )
    assert run.finished
    assert max(run.rate_limited.values()) <= 2
    assert run.ratio <= 1.15
    # Settled: nothing is kept in doubt.
    kept = json.loads(ledger.recall(KEY.value) or "{}")
    assert (kept["windows"], "safer" in kept) == ([[5, 1.0], [30, 2.0]], False)


@pytest.mark.parametrize("seed", range(2))
def test_a_much_shorter_window_is_learned_without_retry_after(seed):
    """Issue 10's example: a 10/10s server under profile A's 30/1m, saying
    nothing of when it has room. Read as the rule's own minute, 10/1m would pace
    the run 6 x too slow; behind the bucket's reading, 10/10s is tried, and kept."""
    server = Server(LimiterKind.SLIDING, parse_rule("10/10s"), retry_after=False)
    ledger = MemoryLedger()
    run = simulate(client="30/1m", server=server, count=60, seed=seed, ledger=ledger)
    assert run.finished
    assert max(run.rate_limited.values()) <= 3
    kept = json.loads(ledger.recall(KEY.value) or "{}")
    assert kept["windows"] == [[10, 10.0], [30, 60.0]]
    # The rerun goes at the ideal under both rules (the first run's 429s took
    # two of the minute's 30 slots: its last two jobs wait for the next minute).
    again = simulate(
        client="30/1m", server=server, seed=seed, ledger=rerun_from(ledger)
    )
    assert again.tally.rate_limited == 0
    assert again.makespan <= 1.05 * eta(60, parse_rule("10/10s+30/1m"), now=0.0)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("retry_after", [True, False])
def test_a_leaky_bucket_with_a_burst_is_paced_near_its_ideal(seed, retry_after):
    """nginx `limit_req` at the client's rate with a burst of a third of its count:
    read as a leaky bucket after one 429, paced near its ideal (the client's own
    30/2s and the refused request, which it counts, cost the rest); a rerun from
    the ledger sends none and runs at the ideal. A Retry-After of one second (a
    drain, rounded up) fits a 1 s window as a sliding window's too, but the
    bucket is faster and is tried first (the 1 s window was taken, and its
    reruns, sending 12 at once, ran at 1.5 x over a traced loopback)."""
    server = Server(
        LimiterKind.LEAKY, parse_rule("15/1s"), {"burst": 10}, retry_after=retry_after
    )
    first = MemoryLedger()
    run = simulate(client="30/2s", server=server, seed=seed, ledger=first)
    assert run.finished
    assert set(run.accepted.values()) == {1}
    assert run.tally.rate_limited <= 2
    assert run.ratio <= 1.3
    kept = recalled(parse_rule("30/2s"), first.recall(KEY.value))
    assert kept is not None
    assert re.fullmatch(r"30/2s, bursts of \d+", kept)
    second = rerun_from(first)
    again = simulate(client="30/2s", server=server, seed=seed, ledger=second)
    # Without a Retry-After, one refusal and acceptances past the window behind
    # it are weak evidence (a stray 429 reads the same): the next run re-tests
    # the bucket (one 429, 1.26-1.27 x), which confirms it; the run after
    # sends none.
    assert again.tally.rate_limited == (0 if retry_after else 1)
    assert again.ratio <= (1.1 if retry_after else 1.3)
    third = simulate(
        client="30/2s", server=server, seed=seed, ledger=rerun_from(second)
    )
    assert third.tally.rate_limited == 0
    assert third.ratio <= 1.1


@pytest.mark.parametrize(
    ("server_rule", "retry_after", "most", "within"),
    [("30/1m", True, 1, 1.1), ("10/1m", True, 1, 1.25), ("15/1m", False, 3, 1.1)],
)
def test_a_bucket_with_no_burst_under_profile_a_is_read_from_its_pace(
    server_rule, retry_after, most, within
):
    """nginx `limit_req rate=30r/m` (no burst) refuses the second request of
    any burst and asks for 2 s: one per 2 s is learned from that, with the
    minute behind it. It was read as one per second, refused, then as one a
    minute: 15 x its ideal, stopped by the simulation's half-hour bound.
    Without a Retry-After, the shortest gap the server let between two
    requests names the window (`15r/m` cost 12 x 429 and 1.46 x; now 3, the
    first refusal only a trial until the second). A rerun starts from it."""
    server = Server(LimiterKind.LEAKY, parse_rule(server_rule), retry_after=retry_after)
    ledger = MemoryLedger()
    with learning_only():
        run = simulate(client="30/1m", server=server, seed=0, ledger=ledger)
    assert run.finished
    assert run.tally.rate_limited <= most
    assert run.ratio <= within
    second = rerun_from(ledger)
    again = simulate(client="30/1m", server=server, seed=0, ledger=second)
    # Without a Retry-After, the lesson is weak: the next run re-tests it.
    assert again.tally.rate_limited == (0 if retry_after else 1)
    assert again.ratio <= within
    third = simulate(client="30/1m", server=server, seed=0, ledger=rerun_from(second))
    assert third.tally.rate_limited == 0
    assert third.ratio <= within


def test_a_bucket_slower_than_the_rule_drains_as_its_retry_after_says():
    """nginx `limit_req rate=15r/m burst=5` under profile A: 6 through at once,
    then a Retry-After of one drain (4 s), twice the rule's. Read as a bucket
    that drains one per 4 s (15/1m, bursts of 6), not as 6 a minute (2.5 x)."""
    server = Server(LimiterKind.LEAKY, parse_rule("15/1m"), {"burst": 5})
    ledger = MemoryLedger()
    with learning_only():
        run = simulate(client="30/1m", server=server, seed=0, ledger=ledger)
    assert run.finished
    assert run.tally.rate_limited <= 1
    assert run.ratio <= 1.2
    assert recalled(parse_rule("30/1m"), ledger.recall(KEY.value)) == (
        "15/1m, bursts of 6"
    )
    again = simulate(client="30/1m", server=server, seed=0, ledger=rerun_from(ledger))
    assert again.tally.rate_limited == 0
    assert again.ratio <= 1.1


@pytest.mark.parametrize("burst", [0, 3, 10])
def test_a_leaky_bucket_of_any_burst_is_learned_without_stalling(burst):
    """Before the leaky reading, a bucket with no burst ran 15 times too slow."""
    options = {"burst": burst}
    server = Server(LimiterKind.LEAKY, parse_rule("15/1s"), options, retry_after=False)
    with learning_only():
        run = simulate(client="30/2s", server=server, seed=1)
    assert run.finished
    assert run.tally.rate_limited <= 2
    assert run.ratio <= 1.8


@pytest.mark.parametrize("seed", range(3))
def test_the_safer_reading_is_taken_when_the_faster_one_is_refused(seed):
    """Against a 5/2s server the bucket's reading and the 5/1s one cost one
    more 429 each, then 5/2s."""
    server = Server(LimiterKind.SLIDING, parse_rule("5/2s"), retry_after=False)
    with learning_only():
        run = simulate(client="30/2s", server=server, count=40, seed=seed)
    assert run.finished
    assert max(run.rate_limited.values()) <= 3
    assert run.ratio <= 1.25


@pytest.mark.parametrize("seed", range(3))
def test_a_weighted_counter_refusing_a_spread_reading_takes_the_safer_one(seed):
    """A weighted 3/2s counter still refuses 3/1s spaced evenly: the 3/2s
    reading is taken, and the 429s stop."""
    server = Server(LimiterKind.WEIGHTED, parse_rule("3/2s"), retry_after=True)
    run = simulate(client="30/2s", server=server, count=40, seed=seed)
    assert run.finished
    assert max(run.rate_limited.values()) <= 3


def rerun_from(run_ledger: MemoryLedger) -> MemoryLedger:
    """A fresh ledger holding only what the last run learned: its lesson, not
    what the server was seen to accept."""
    return carried(run_ledger, record=False)


@pytest.mark.parametrize("phase", range(10))
@pytest.mark.parametrize("retry_after", [True, False], ids=["RA", "no-RA"])
@pytest.mark.parametrize("kind", [LimiterKind.FIXED, LimiterKind.WEIGHTED])
def test_fixed_and_weighted_counters_at_every_phase(kind, retry_after, phase):
    """Where a 10/2s counter's windows fall decides how many of the first burst
    it lets through: up to 16 when a reset comes in the middle of it (the last
    phase here). That count is read, then lowered to what the server accepts
    when the server's windows are read (`counters.read`) or spaced evenly
    (`alternatives.lowered`). Under a 30/2s client, at every phase: every job
    accepted once, at most 5 429s (a burst fits a bucket and 10/1s too, each
    tried first as faster, for one 429 each; 7 where it straddled a reset of a
    weighted counter that sends no Retry-After: each reading of a refusal
    there is a trial until a second refusal; 3 at every phase against a
    fixed window that sends Retry-After: its rounded Retry-After fits a bucket
    too, tried first), and a rerun from the ledger sends
    at most one (a weakly confirmed lesson's re-test, or a weighted counter
    whose first run gave no sign it needed spacing; two against a weighted
    counter without Retry-After) and ends within 1.25 x the ideal under
    10/2s; the run after that sends none against a fixed window."""
    server = Server(
        kind, parse_rule("10/2s"), {"origin": -0.2 * phase}, retry_after=retry_after
    )
    ledger = MemoryLedger()
    with learning_only():
        run = simulate(client="30/2s", server=server, seed=0, ledger=ledger)
    ideal = eta(60, parse_rule("10/2s"), now=0.0)
    assert run.finished
    assert set(run.accepted.values()) == {1}
    # With Retry-After, a fixed window's phase is read at the third refusal
    # (the second is the test of a bucket, which the rounded Retry-After fits).
    told_fixed = retry_after and kind is LimiterKind.FIXED
    # A weighted counter without Retry-After whose first burst straddled a
    # reset: each reading there is a trial until a second refusal.
    straddled = kind is LimiterKind.WEIGHTED and not retry_after and phase == 9
    assert run.tally.rate_limited <= (3 if told_fixed else 7 if straddled else 5)
    assert run.makespan <= 1.35 * ideal
    second = rerun_from(ledger)
    again = simulate(client="30/2s", server=server, seed=0, ledger=second)
    weighted_untold = kind is LimiterKind.WEIGHTED and not retry_after
    assert again.tally.rate_limited <= (2 if weighted_untold else 1)
    assert again.makespan <= 1.25 * ideal
    # Whatever the rerun re-tested, it confirmed: the run after sends none.
    third = simulate(client="30/2s", server=server, seed=0, ledger=rerun_from(second))
    assert third.tally.rate_limited <= (0 if kind is LimiterKind.FIXED else 1)


@pytest.mark.parametrize(
    ("rule", "kept"), [("5/1s", "5/1s+30/2s"), ("5/2s", "5/2s")], ids=["1s", "2s"]
)
def test_the_reading_kept_is_the_one_the_server_settled(rule, kept):
    """Against a 5/1s server the leaky reading is refused and the window the
    Retry-After fits is taken; against 5/2s, whose 2 s Retry-After is longer than
    a bucket's drain, the window at once: either way the ledger keeps what the
    server showed, and a rerun from it sends no 429 and runs near the ideal."""
    server = Server(LimiterKind.SLIDING, parse_rule(rule), retry_after=True)
    first = MemoryLedger()
    simulate(client="30/2s", server=server, count=40, ledger=first)
    assert str(recalled(parse_rule("30/2s"), first.recall(KEY.value))) == kept
    again = simulate(client="30/2s", server=server, count=40, ledger=rerun_from(first))
    assert again.tally.rate_limited == 0
    assert again.ratio <= 1.1


@pytest.mark.parametrize("origin", [0.0, -10.0, -20.0])
def test_auto_spaces_a_weighted_a_before_it_takes_b(origin):
    """A weighted-counter A refuses the burst that follows a full minute (its
    last minute still weighs): B explains that refusal too, but A spaced evenly
    holds, so B is taken only if 429s still come then."""
    b = parse_rule("15/1m+500/1h")
    server = Server(LimiterKind.WEIGHTED, parse_rule("30/1m"), {"origin": origin})
    run = simulate(client="30/1m", server=server, count=60, fallback=b)
    assert run.finished
    assert run.tally.rate_limited <= 2
    assert run.ratio <= 1.3


@pytest.mark.parametrize("origin", [0.0, -10.0, -30.0, -50.0])
@pytest.mark.parametrize("retry_after", [True, False], ids=["RA", "no-RA"])
@pytest.mark.parametrize("kind", [LimiterKind.FIXED, LimiterKind.WEIGHTED])
def test_profile_b_against_a_counter_of_its_minute_reads_no_hourly_limit(
    kind, retry_after, origin
):
    """Profile B (15/1m+500/1h) against a fixed or weighted 15/1m: a refusal a
    minute and a bit after a burst fits B's hour with a count of 25 (all the
    log holds), which would pace the run at 25 an hour. No such reading: the
    run ends within 2 x the server's ideal (spaced evenly where the counter
    needs it), for at most 3 429s (the first refusal is only a trial)."""
    server = Server(
        kind, parse_rule("15/1m"), {"origin": origin}, retry_after=retry_after
    )
    run = simulate(client="15/1m+500/1h", server=server, count=60, seed=0)
    assert run.finished
    assert run.tally.rate_limited <= 3
    assert run.ratio <= 2.0


@pytest.mark.parametrize("origin", [0.0, -30.0, -59.8])
@pytest.mark.parametrize("retry_after", [True, False])
def test_auto_never_takes_a_fixed_window_b_for_a(origin, retry_after):
    """A fixed-window B lets 16 through within seconds across its boundary; that
    must not rule B out. Whatever the boundary, B is taken and kept, and a rerun
    from the ledger sends no 429."""
    b = parse_rule("15/1m+500/1h")
    server = Server(LimiterKind.FIXED, b, {"origin": origin}, retry_after=retry_after)
    first = MemoryLedger()
    run = simulate(client="30/1m", server=server, count=60, fallback=b, ledger=first)
    assert run.finished
    assert run.tally.rate_limited <= 2
    assert recalled(parse_rule("30/1m"), first.recall(KEY.value)) == str(b)
    again = simulate(
        client="30/1m", server=server, count=60, fallback=b, ledger=rerun_from(first)
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
    text = accepted_record({2.0: 40, 10.0: 7}, rule, 1.0, now)
    assert recalled_record(text, rule, 1.0) == {2.0: 30, 10.0: 7}
    assert recalled_record(text, parse_rule("20/2s"), 1.0) == {}
    assert recalled_record("{not json", rule, 1.0) == {}
    old = accepted_record({2.0: 5}, rule, 1.0, now - KEPT_FOR - 60)
    assert recalled_record(old, rule, 1.0) == {}
    scaled = accepted_record({0.2: 5}, rule.scaled(10), 10.0, now)
    assert recalled_record(scaled, rule, 1.0) == {2.0: 5}
