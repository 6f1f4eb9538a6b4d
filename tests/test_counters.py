"""Reading an aligned counter (a fixed window, a weighted counter) from a log."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchrun.counters import Counting, Request, read
from batchrun.limiters import FixedWindow, WeightedCounter
from batchrun.limits import Rule, Window

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


def test_a_retry_after_narrows_the_phase():
    """Refused after 4 at once with Retry-After 2 (1 to 2 s, rounded up): the
    reset is 1 to 2 s away, so windows start 1.5 to 2.5 s in; with 1 it is
    sooner."""
    log = [*(Request(t, False) for t in (0.1, 0.2, 0.3, 0.4)), Request(0.5, True)]
    for wait, phases in ((2.0, (1.25, 2.0)), (1.0, (0.5, 1.75))):
        told = [*log[:-1], Request(0.5, True, wait=wait)]
        counter = read(told, Window(8, 2.0))
        assert counter is not None
        assert counter.window == Window(4, 2.0)
        low, high = phases
        assert low <= counter.phase <= high or counter.phase <= 0.1


def test_nothing_refused_reads_nothing():
    assert read([Request(0.1, False), Request(0.2, False)], Window(8, 2.0)) is None


@given(
    st.sampled_from([FixedWindow, WeightedCounter]),
    st.integers(2, 12),
    st.floats(0.0, 1.99),
    st.lists(st.floats(0.0, 0.2), min_size=5, max_size=60),
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
