"""The server models against brute-force readings of their definitions, and known cases.

Arrival times are multiples of 1/8 s and windows powers of two, so the float sums of
the models are exact and a brute-force reading can be compared decision by decision.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchrun.core.limits import LimitKey, Rule, Window, parse_rule
from batchrun.pacing.limiters import LimiterKind, make_limiter
from batchrun.sandbox.app import Sandbox

_windows = st.builds(Window, st.integers(1, 5), st.sampled_from([0.5, 1.0, 2.0, 4.0]))
rules = st.lists(_windows, min_size=1, max_size=2).map(lambda ws: Rule(tuple(ws)))
arrivals = st.lists(st.integers(0, 160), max_size=40).map(
    lambda ks: [k / 8 for k in sorted(ks)]
)

Accepts = Callable[[list[float], float], bool]


def replay(kind: str, rule: Rule, times: list[float], accepts: Accepts, **options):
    """Feed `times` to the model; check each decision, and each wait, by `accepts`
    over the arrivals the definition counts so far."""
    limiter = make_limiter(kind, rule, **options)
    counted: list[float] = []
    for now in times:
        wait = limiter.admit("c", "k", now)
        assert (wait is None) == accepts(counted, now)
        if wait is not None:
            assert wait > 0
            assert accepts(counted, now + wait)
        if wait is None or options.get("count_refused"):
            counted.append(now)


def sliding_accepts(rule: Rule) -> Accepts:
    def accepts(log: list[float], t: float) -> bool:
        return all(sum(a + w.seconds > t for a in log) < w.count for w in rule.windows)

    return accepts


def fixed_accepts(rule: Rule, origin: float) -> Accepts:
    def accepts(log: list[float], t: float) -> bool:
        def index(x: float, w: Window) -> int:
            return math.floor((x - origin) / w.seconds)

        return all(
            sum(index(a, w) == index(t, w) for a in log) < w.count for w in rule.windows
        )

    return accepts


def weighted_accepts(rule: Rule) -> Accepts:
    def accepts(log: list[float], t: float) -> bool:
        for w in rule.windows:
            k = math.floor(t / w.seconds)
            previous = sum(math.floor(a / w.seconds) == k - 1 for a in log)
            current = sum(math.floor(a / w.seconds) == k for a in log)
            elapsed = (t - k * w.seconds) / w.seconds
            if previous * (1 - elapsed) + current >= w.count:
                return False
        return True

    return accepts


@given(rules, arrivals)
def test_sliding_log_matches_its_definition(rule, times):
    """A sliding log accepts exactly when every (t - W, t] holds < COUNT accepted."""
    replay(LimiterKind.SLIDING, rule, times, sliding_accepts(rule))


@given(rules, arrivals)
def test_sliding_log_counting_refused_matches_its_definition(rule, times):
    """With count_refused (a Redis sorted set that adds before it counts), every
    arrival counts in every (t - W, t], refused or not."""
    accepts = sliding_accepts(rule)
    replay(LimiterKind.SLIDING, rule, times, accepts, count_refused=True)


@given(rules, arrivals, st.integers(0, 7).map(lambda k: k / 8))
def test_fixed_window_matches_its_definition(rule, times, origin):
    """Fixed windows accept exactly when each aligned window counted < COUNT."""
    replay(LimiterKind.FIXED, rule, times, fixed_accepts(rule, origin), origin=origin)


@given(rules, arrivals)
def test_fixed_window_counting_refused_matches_its_definition(rule, times):
    """With count_refused, every arrival counts in its aligned windows."""
    limiter = make_limiter(LimiterKind.FIXED, rule, count_refused=True)
    accepts, seen = fixed_accepts(rule, 0.0), list[float]()
    for now in times:
        assert (limiter.admit("c", "k", now) is None) == accepts(seen, now)
        seen.append(now)


@given(rules, arrivals)
def test_weighted_counter_matches_its_definition(rule, times):
    """A weighted counter accepts exactly while each estimate stays below COUNT."""
    limiter = make_limiter(LimiterKind.WEIGHTED, rule)
    accepts, counted = weighted_accepts(rule), list[float]()
    for now in times:
        wait = limiter.admit("c", "k", now)
        assert (wait is None) == accepts(counted, now)
        if wait is None:
            counted.append(now)
        else:
            assert accepts(counted, now + wait + 1e-6)
            assert wait < 1e-6 or not accepts(counted, now + wait - 1e-6)


def gcra_accepts(per_second: int, burst: int) -> Callable[[list[int], int], bool]:
    """GCRA by virtual scheduling, in exact fractions, on millisecond ticks."""
    step = Fraction(1000, per_second)

    def accepts(accepted: list[int], tick: int) -> bool:
        due = None
        for a in accepted:
            due = a + step if due is None else max(Fraction(a), due) + step
        return due is None or tick >= due - burst * step

    return accepts


@given(
    st.integers(1, 40),
    st.integers(0, 3),
    st.lists(st.integers(0, 3000), max_size=40),
    st.floats(0.1, 0.9),
)
def test_leaky_bucket_is_gcra_on_milliseconds(per_second, burst, ticks, within):
    """nginx's bucket is GCRA on whole milliseconds; its wait names the first tick."""
    rule = Rule((Window(per_second, 1.0),))
    limiter = make_limiter(LimiterKind.LEAKY, rule, burst=burst)
    accepts, accepted = gcra_accepts(per_second, burst), list[int]()
    for tick in sorted(ticks):
        now = (tick + within) / 1000
        wait = limiter.admit("c", "k", now)
        assert (wait is None) == accepts(accepted, tick)
        if wait is None:
            accepted.append(tick)
        else:
            first = round((now + wait) * 1000)
            assert accepts(accepted, first)
            assert not accepts(accepted, first - 1)


@pytest.mark.parametrize("kind", list(LimiterKind))
@given(rule=rules, times=arrivals)
def test_the_sandbox_counts_with_the_model_it_is_told(kind, rule, times):
    """A sandbox told to count with `kind` decides and waits as that model does."""
    limiter = make_limiter(kind, rule)
    clock = iter(times)
    sandbox = Sandbox(
        {LimitKey.RUN_QUERY: rule}, clock=lambda: next(clock), counting=kind
    )
    for now in times:
        admission = sandbox.admit("c", LimitKey.RUN_QUERY)
        assert limiter.admit("c", "run-query", now) == admission.wait
        assert limiter.quotas("c", "run-query", now) == admission.quotas


@pytest.mark.parametrize("kind", list(LimiterKind))
@given(rule=rules, times=arrivals, later=st.integers(0, 16).map(lambda k: k / 8))
def test_quotas_say_how_many_more_fit_and_when(kind, rule, times, later):
    """`remaining` more requests at `now` are accepted one after another, and the
    next is not (`room` says the least of them); with none left, the latest
    reset is the wait admit gives."""
    limiter = make_limiter(kind, rule)
    for now in times:
        limiter.admit("c", "k", now)
    now = (times[-1] if times else 0.0) + later
    quotas = limiter.quotas("c", "k", now)
    assert quotas == limiter.quotas("c", "k", now)  # reading changes nothing
    left = min(q.remaining for q in quotas)
    assert limiter.room("c", "k", now) == left  # the same, without the resets
    trial = copy.deepcopy(limiter)
    assert all(trial.admit("c", "k", now) is None for _ in range(left))
    wait = trial.admit("c", "k", now)
    assert wait is not None
    if left == 0:
        spent = max(q.reset for q in quotas if q.remaining == 0)
        assert spent == pytest.approx(wait, abs=1e-9)


@given(
    st.sampled_from(["7/1m", "10/1m", "15/1m", "500/1h", "166/1s"]),
    st.integers(0, 3),
    st.integers(0, 999),
    st.lists(st.tuples(st.booleans(), st.integers(1, 2000)), max_size=40),
)
def test_a_client_keeping_the_leaky_quota_is_never_refused(rule, burst, start, gaps):
    """Arrivals that a sliding log of the bucket's stated window accepts are all
    accepted by the bucket, its rate rounded down and its millisecond clock included.
    Each gap is a few microseconds, or the window and a few microseconds."""
    bucket = make_limiter(LimiterKind.LEAKY, parse_rule(rule), burst=burst)
    [quota] = bucket.quotas("c", "k", 0.0)
    keeper = make_limiter(LimiterKind.SLIDING, Rule((quota.window,)))
    now = start / 10**6
    for whole, micros in gaps:
        now += (quota.window.seconds if whole else 0.0) + micros / 10**6
        if keeper.admit("c", "k", now) is None:
            assert bucket.admit("c", "k", now) is None


def accepted(kind: str, rule: str, times: list[float], **options) -> int:
    limiter = make_limiter(kind, parse_rule(rule), **options)
    return sum(limiter.admit("c", "k", t) is None for t in times)


def test_fixed_window_allows_twice_the_count_across_a_boundary():
    """10/2s fixed windows take 10 at 1.9 s and 10 more at 2.0 s."""
    times = [1.9] * 10 + [2.0] * 10
    assert accepted(LimiterKind.FIXED, "10/2s", times) == 20
    assert accepted(LimiterKind.SLIDING, "10/2s", times) == 10


def test_weighted_counter_refuses_a_burst_a_sliding_log_allows():
    """After 10 at 1 s, a 10/2s sliding log takes 10 at 3.1 s; a weighted counter 6."""
    times = [1.0] * 10 + [3.1] * 10
    assert accepted(LimiterKind.SLIDING, "10/2s", times) == 20
    assert accepted(LimiterKind.WEIGHTED, "10/2s", times) == 16


def test_leaky_bucket_without_burst_refuses_one_millisecond_early():
    """At 10/s with no burst, 99 ms after a request is refused for 1 ms; 100 ms is not."""
    limiter = make_limiter(LimiterKind.LEAKY, parse_rule("10/1s"))
    assert limiter.admit("c", "k", 0.0) is None
    assert limiter.admit("c", "k", 0.0999) == pytest.approx(0.0001)
    assert limiter.admit("c", "k", 0.1) is None


def test_express_counts_refused_requests_against_longer_windows():
    """With count_refused, a refusal in a 1 s window uses up the 3/10s window."""
    times = [0.0, 0.5, 1.0, 2.0]
    rule = "1/1s+3/10s"
    assert accepted(LimiterKind.FIXED, rule, times) == 3
    assert accepted(LimiterKind.FIXED, rule, times, count_refused=True) == 2


def test_clients_and_keys_are_counted_apart():
    """Each client and key has its own budget."""
    limiter = make_limiter(LimiterKind.SLIDING, parse_rule("1/1s"))
    answers = [
        limiter.admit(c, k, 0.0) for c, k in [("a", "x"), ("b", "x"), ("a", "y")]
    ]
    assert answers == [None, None, None]
    assert limiter.admit("a", "x", 0.5) == 0.5


@pytest.mark.parametrize(
    ("kind", "options", "policy"),
    [
        ("sliding", {}, "sliding log 10/2s"),
        ("sliding", {"count_refused": True}, "sliding log 10/2s, refused count"),
        (
            "fixed",
            {"count_refused": True},
            "fixed windows 10/2s (from 0, refused count)",
        ),
        ("weighted", {}, "weighted counter 10/2s (from 0)"),
        ("leaky", {"burst": 3}, "leaky bucket 5/s burst 3 (nginx, ms clock)"),
    ],
)
def test_policy_says_how_it_counts(kind, options, policy):
    """Each model describes its counting in words."""
    assert make_limiter(kind, parse_rule("10/2s"), **options).policy == policy


def test_unknown_kind_and_bad_options_are_refused():
    """An unknown kind, an option of another model or a negative burst is an error."""
    rule = parse_rule("10/2s")
    with pytest.raises(ValueError, match="'token'"):
        make_limiter("token", rule)
    with pytest.raises(TypeError):
        make_limiter("sliding", rule, burst=1)
    with pytest.raises(ValueError, match="burst"):
        make_limiter("leaky", rule, burst=-1)
    with pytest.raises(ValueError, match="rate"):
        make_limiter("leaky", parse_rule("1/1h"))
