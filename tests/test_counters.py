"""Reading an aligned counter (a fixed window, a weighted counter) from a log."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from batchrun.core.limits import Rule, Window
from batchrun.pacing.learning.counters import (
    Counting,
    Request,
    _fits,
    _Log,
    _State,
    read,
)
from batchrun.pacing.limiters import FixedWindow, WeightedCounter

# A fixed 4/2s server whose windows start at odd seconds: 4 of a burst of 8 were
# counted in [-1, 1), 4 in [1, 3); the 9th was refused, and so was a request
# that a sliding log of 8/2s let go at 2.55.
STRADDLED = [
    *(Request(t, False) for t in (0.5, 0.6, 0.7, 0.8, 1.1, 1.2, 1.3, 1.4)),
    Request(1.5, True),
    Request(2.55, True),
]


def test_a_burst_that_straddled_a_fixed_reset_reads_a_lower_count():
    """Windows starting anywhere from just past 0.55 s to 1.1 s explain the log,
    with counts from 7 down to 4: the highest is read (a count read too high
    costs one more 429 to correct, one too low is never corrected)."""
    counter = read(STRADDLED, Window(8, 2.0))
    assert counter is not None
    assert (counter.counting, counter.window) == (Counting.FIXED, Window(7, 2.0))
    assert counter.phase == pytest.approx(0.56)


def test_acceptances_after_a_refusal_in_one_window_read_a_weighted_counter():
    """Refused at 2.2 s, then 3.0 s and 3.1 s accepted and 3.2 s refused: no
    fixed window explains that (a reset must fall between 2.2 s and 3.0 s, and
    the window after it refused at 2), a weighted counter does."""
    log = [
        *(Request(t, False) for t in (1.0, 1.2, 1.4, 1.6, 2.1)),
        Request(2.2, True),
        Request(3.0, False),
        Request(3.1, False),
        Request(3.2, True),
    ]
    counter = read(log, Window(8, 2.0))
    assert counter is not None
    assert counter.counting is Counting.WEIGHTED
    assert counter.window == Window(5, 2.0)


def test_a_retry_after_no_counter_of_the_window_gives_rules_it_out():
    """A counter of 2 s has room again within two windows: a Retry-After of 30 s
    is no such counter's."""
    log = [*STRADDLED[:-1], Request(2.55, True, wait=30.0)]
    assert read(log, Window(8, 2.0)) is None


@pytest.mark.parametrize(
    ("wait", "fits", "misfits"), [(2.0, 1.8, 0.9), (1.0, 0.9, 1.8)]
)
def test_a_retry_after_names_when_the_window_resets(wait, fits, misfits):
    """Refused after 4 at once, at 0.5 s: a fixed window that resets at 1.8 s
    has room in 1.3 s (a Retry-After of 2, rounded up), one that resets at
    0.9 s in 0.4 s (1). The other reading is ruled out."""
    log = [*(Request(t, False) for t in (0.1, 0.2, 0.3, 0.4)), Request(0.5, True, wait)]
    assert _Log(log, 2.0, fits, Counting.FIXED, -math.inf).count(8) == 4
    assert _Log(log, 2.0, misfits, Counting.FIXED, -math.inf).count(8) is None


def test_a_request_whose_round_trip_spans_a_reset_may_count_on_either_side():
    """A fixed 10/2s server whose windows start at 0.1 s: 8 accepted before the
    reset, 10 after it, then refused. The first after it arrived just past the
    reset, but its answer was quick and its send early: the estimate (halfway,
    0.0949 s) falls before the reset. Read by the estimate alone, the window
    after held 9 at the refusal: 9/2s, for good. Its round trip spans the
    reset, so it may count on either side: 10 stays."""
    before = [Request(-1.0 + 0.1 * n, False, within=0.005) for n in range(8)]
    after = [Request(0.0949, False, within=0.02)]
    after += [Request(0.2 + 0.1 * n, False, within=0.005) for n in range(9)]
    log = [*before, *after, Request(1.2, True, within=0.005)]
    tight = [Request(r.at, r.refused, r.wait) for r in log]
    assert _Log(tight, 2.0, 0.1, Counting.FIXED, -math.inf).count(12) == 9
    assert _Log(log, 2.0, 0.1, Counting.FIXED, -math.inf).count(12) == 10


def test_only_the_last_windows_before_the_latest_refusal_are_read():
    """A refusal 10 windows back, at a count no later window agrees with, is
    not read (the server may have changed, another client may have spent the
    budget); nor is one whose window began before the first request kept."""
    old = [Request(0.0, False), Request(0.1, True)]
    recent = [Request(20.0 + 0.1 * n, False) for n in range(4)]
    counter = read([*old, *recent, Request(20.5, True)], Window(8, 2.0))
    assert counter is not None
    assert counter.window == Window(4, 2.0)


def test_nothing_refused_reads_nothing():
    assert read([Request(0.1, False), Request(0.2, False)], Window(8, 2.0)) is None


@settings(max_examples=400, deadline=None)
# A reset between two arrivals closer than the phases tried are apart.
@example(FixedWindow, 2, 1.984375, [0.0, 0.0078125, 0.0078125, 0.0, 0.0])
# A reset just after requests that arrived at 0 (the phase tried just after an
# arrival must stay after it in the window arithmetic).
@example(FixedWindow, 2, 1.984375, [0.0, 0.0, 0.0, 0.0, 0.015625])
# A weighted count between two phases tried.
@example(
    WeightedCounter,
    5,
    0.890625,
    [
        *(0.125, 0.15625, 0.1953125, 0.19921875, 0.15625, 0.09375, 0.1015625),
        *(0.0859375, 0.125, 0.125, 0.09375, 0.046875),
    ],
)
@given(
    st.sampled_from([FixedWindow, WeightedCounter]),
    st.integers(2, 12),
    st.floats(0.0, 1.99),
    st.lists(st.floats(0.0, 0.2) | st.floats(0.0, 0.01), min_size=5, max_size=60),
)
def test_the_servers_own_count_is_never_ruled_out(model, count, origin, gaps):
    """Whatever a fixed or weighted server of COUNT/2s answered (with its
    Retry-After), a reading explains it, with a count no lower than COUNT."""
    server = model(rule=Rule((Window(count, 2.0),)), origin=-origin)
    log, now = [], 0.0
    for gap in gaps:
        now += gap
        wait = server.admit("c", "k", now)
        told = None if wait is None else float(max(1, math.ceil(wait)))
        log.append(Request(now, wait is not None, told))
    counter = read(log, Window(count, 2.0))
    if any(r.refused for r in log):
        assert counter is not None
        assert counter.window.count == count


def test_a_refusal_whose_round_trip_spans_a_reset_still_bounds_the_count():
    """15 accepted, then one refused: on whichever side of a reset it came, a
    window of 30 would have let it through. A round trip of 2 ms that could
    span a reset must not leave the refusal unread (30/2s, then lowered by one
    a 429 at a time)."""
    log = [Request(0.05 * n, False, within=0.001) for n in range(15)]
    counter = read([*log, Request(0.75, True, within=0.001)], Window(30, 2.0))
    assert counter is not None
    assert counter.window == Window(15, 2.0)


def test_a_request_estimated_after_a_refusal_may_have_come_before_it():
    """A fixed 2/2s server: accepted at 0.1 s and 0.2715 s, refused at 0.2739 s.
    The second acceptance's slow round trip puts its estimate (0.3347 s) after
    the refusal's (0.2696 s): read in that order, a reset between them gives
    1/2s, for good. Its round trip overlaps the refusal's: it may have come
    first, so the refusal may have come at 2."""
    log = [
        Request(0.1, False, within=0.01),
        Request(0.2696, True, within=0.01),
        Request(0.3347, False, within=0.149),
    ]
    counter = read(log, Window(8, 2.0))
    assert counter is not None
    assert counter.window == Window(2, 2.0)


def test_a_weighted_refusal_is_read_at_the_earliest_it_may_have_come():
    """A weighted 4/2s server (windows from 0): 4 accepted in the first window;
    at 2.2 s one more (weight 3.6); refused at 2.3 s (4.4), whose slow answer
    puts the estimate at 2.9 s, where the weight would be 3.2. Read at the
    estimate alone, the server's own count is ruled out."""
    log = [Request(t, False, within=0.01) for t in (1.0, 1.1, 1.2, 1.3)]
    log += [Request(2.2, False, within=0.01), Request(2.9, True, within=0.6)]
    assert _Log(log, 2.0, 0.0, Counting.WEIGHTED, -math.inf).count(4) == 4
    tight = [Request(r.at, r.refused) for r in log]
    assert _Log(tight, 2.0, 0.0, Counting.WEIGHTED, -math.inf).count(4) is None


def test_a_refusal_whose_window_lost_requests_to_the_span_is_not_read():
    """A fixed 9/2s server from 0: 9 accepted by 0.9 s, refused at 1.0 s; 9 more
    from 8.0 s, refused at 8.9 s. Only the last four windows are read: 0.1-0.8 s
    are left out, so the refusal at 1.0 s would seem to come at 1 (9/2s read
    as 1/2s); it is not read."""
    first = [Request(0.1 * n, False) for n in range(1, 10)]
    later = [Request(8.0 + 0.1 * n, False) for n in range(9)]
    log = [*first, Request(1.0, True), *later, Request(8.9, True)]
    counter = read(log, Window(12, 2.0))
    assert counter is not None
    assert counter.window == Window(9, 2.0)


def refused_at(
    *, current: int, elapsed: float, within: float, weighted: bool
) -> _State:
    """A counter's state as a refusal found it: `current` counted in its window,
    `elapsed` (a share) into it, give or take `within` (a share)."""
    count = float(current)
    return _State(count, 0.0, 0.0, 0, elapsed, within, 0, current, weighted)


def test_a_weighted_counter_past_its_count_has_room_later_in_the_next_window():
    """10 counted in a window of 10 s where the count is 5 (it once allowed
    more): in the next window the weight of 10 drops below 5 halfway through,
    6 s after a refusal 0.9 into this one; a Retry-After of 6 fits that, and
    not a fixed window's reset (1 s)."""
    weighted = refused_at(current=10, elapsed=0.9, within=0.0, weighted=True)
    fixed = refused_at(current=10, elapsed=0.9, within=0.0, weighted=False)
    assert _fits(6.0, weighted, 10.0, 5)
    assert not _fits(6.0, fixed, 10.0, 5)


def test_a_slow_round_trip_widens_what_a_retry_after_may_name():
    """A fixed window of 2 s, refused halfway through: room in 1 s. A
    Retry-After of 3 is too late for that, unless the refusal may have come a
    second earlier (a round trip of 2 s)."""
    sure = refused_at(current=10, elapsed=0.5, within=0.0, weighted=False)
    slow = refused_at(current=10, elapsed=0.5, within=0.5, weighted=False)
    assert not _fits(3.0, sure, 2.0, 10)
    assert _fits(3.0, slow, 2.0, 10)
