"""`--halt-after N|P%`: when a run stops starting jobs (run/halt.py)."""

from __future__ import annotations

import pytest

from batchrun.cli.news import halted_text
from batchrun.core.errors import UsageError
from batchrun.core.events import JobFinished, JobSent, RunTally, Status, Tally
from batchrun.core.limits import LimitKey
from batchrun.run.halt import MIN_ENDED, Halted, HaltPolicy, HaltWatch


def halt_said(halted: Halted | None) -> str | None:
    """What the command line says of a halt (None: none)."""
    return None if halted is None else halted_text(halted)


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        pytest.param("10", HaltPolicy(count=10), id="count"),
        pytest.param(" 1 ", HaltPolicy(count=1), id="spaces"),
        pytest.param("10%", HaltPolicy(percent=10.0), id="percent"),
        pytest.param("2.5 %", HaltPolicy(percent=2.5), id="fraction"),
        pytest.param("100%", HaltPolicy(percent=100.0), id="all"),
    ],
)
def test_a_policy_is_a_count_or_a_share(text, policy):
    """`N` counts failed jobs; `P%` is a share of the ended ones."""
    assert HaltPolicy.parse(text) == policy


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param("0", "at least 1", id="zero"),
        pytest.param("0%", "above 0%", id="zero-percent"),
        pytest.param("101%", "up to 100%", id="over-100"),
        pytest.param("ten", "bad --halt-after 'ten'", id="words"),
        pytest.param("-3", "bad --halt-after", id="negative"),
        pytest.param("", "bad --halt-after", id="empty"),
    ],
)
def test_a_bad_policy_is_a_usage_error(text, said):
    """Anything else exits 2 with an example of what works."""
    with pytest.raises(UsageError, match=said) as caught:
        HaltPolicy.parse(text)
    assert caught.value.exit_code == 2


def test_a_count_halts_at_the_nth_failure():
    """`--halt-after 3`: two failures go on, the third halts."""
    policy = HaltPolicy(count=3)
    assert policy.reason(failed=2, ended=500) is None
    assert halt_said(policy.reason(failed=3, ended=3)) == (
        "3 job(s) failed in this run (--halt-after 3)"
    )


def test_a_share_waits_for_twenty_ended_jobs():
    """`--halt-after 10%`: 1 failure of the first 2 is 50 %, but too few to judge."""
    policy = HaltPolicy(percent=10.0)
    assert policy.reason(failed=1, ended=2) is None
    assert policy.reason(failed=10, ended=MIN_ENDED - 1) is None
    assert policy.reason(failed=1, ended=MIN_ENDED) is None
    assert halt_said(policy.reason(failed=2, ended=MIN_ENDED)) == (
        "2 of 20 ended jobs failed in this run (10%, --halt-after 10%)"
    )
    assert policy.reason(failed=99, ended=1000) is None
    assert policy.reason(failed=100, ended=1000) is not None


def _finished(status: Status, n: int = 0) -> JobFinished:
    return JobFinished(float(n), LimitKey.INVITE, f"j{n}", status, 1, 400, "HTTP 400")


def _end(watch: HaltWatch, tally: RunTally, status: Status) -> None:
    """A job ends as the runner ends one: counted by the tally, then told."""
    event = _finished(status)
    tally.emit(event)
    watch.emit(event)


def test_the_watch_stops_once_with_the_reason():
    """The watch reads the run's tally (unknown jobs as failed) and stops the run
    once."""
    stops: list[Halted] = []
    tally = RunTally({LimitKey.INVITE: Tally(total=10)})
    watch = HaltWatch(HaltPolicy(count=2))
    watch.watch(tally, stops.append)
    watch.emit(JobSent(0.0, LimitKey.INVITE, "j0", 1))
    _end(watch, tally, Status.DONE)
    _end(watch, tally, Status.UNKNOWN)
    assert stops == []
    _end(watch, tally, Status.FAILED)
    _end(watch, tally, Status.FAILED)
    assert [halt_said(halted) for halted in stops] == [
        "2 job(s) failed in this run (--halt-after 2)"
    ]
    assert watch.reason == stops[0]


def test_a_watch_judges_the_tally_it_is_given():
    """A share counts the tally's ended jobs, also those ended before the watch
    heard of them."""
    stops: list[Halted] = []
    tally = RunTally({LimitKey.INVITE: Tally(total=40, done=MIN_ENDED - 2)})
    watch = HaltWatch(HaltPolicy(percent=10))
    watch.watch(tally, stops.append)
    _end(watch, tally, Status.FAILED)
    assert stops == []
    _end(watch, tally, Status.FAILED)
    assert [halt_said(halted) for halted in stops] == [
        "2 of 20 ended jobs failed in this run (10%, --halt-after 10%)"
    ]


def test_a_watch_without_its_stop_is_a_bug_said_aloud():
    """A watch nobody can act on must not pass silently."""
    watch = HaltWatch(HaltPolicy(count=1))
    with pytest.raises(RuntimeError, match="tally and stop before the run"):
        _end(watch, RunTally(), Status.FAILED)
