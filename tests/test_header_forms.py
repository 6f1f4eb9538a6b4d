"""The rate-limit answers real APIs send, beyond the 429 of the API description:
`Retry-After-Ms`, decimal counts, RFC 3339 resets, draft 11's fields, a 403 that
says it is a rate limit, and a Retry-After longer than 15 minutes.

Runner-level tests script the server with respx on trio's virtual clock.
"""

from __future__ import annotations

import httpx
import pytest
import respx
import trio.testing

from batchrun.api.hints import Hints, read_hints
from batchrun.core.events import JobRequeued, JobSent, Status
from batchrun.core.limits import LimitKey, Window, parse_rule
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job
from batchrun.store.results import JobResult
from support.doubles import ListSink
from tests.fakes import BASE, make_runner

NOW = 1_795_429_376.0  # 2026-11-23 10:22:56 UTC
CAP = 900.0
QUERY = f"{BASE}/teams/t1/data/run-query"


@pytest.fixture
def anyio_backend():
    """Virtual time: a 40-minute Retry-After costs nothing."""
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


def hints(**headers: str) -> Hints:
    """`read_hints` of `headers`, written with `_` for `-`."""
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return read_hints(named, now=NOW, cap=CAP)


# --- the forms real APIs send ----------------------------------------------------


def test_retry_after_ms_is_milliseconds_and_comes_first():
    """OpenAI's and Azure's Retry-After-Ms gives the wait in milliseconds, finer
    than the Retry-After beside it, so it is the one followed."""
    found = hints(retry_after_ms="1500", retry_after="2")
    assert (found.retry_after, found.notes) == (1.5, ())


def test_retry_after_ms_malformed_falls_back_to_retry_after_with_a_note():
    """A Retry-After-Ms that is no number is named, and Retry-After is followed."""
    found = hints(retry_after_ms="soon", retry_after="2")
    assert found.retry_after == 2.0
    assert found.notes == (
        "Retry-After-Ms 'soon' ignored: not a number of milliseconds",
    )


@pytest.mark.parametrize(
    ("value", "remaining"),
    [
        pytest.param("3.0", 3, id="decimal-whole"),
        pytest.param("2.5", 2, id="decimal-rounded-down"),
        pytest.param("0.0", 0, id="decimal-zero"),
    ],
)
def test_decimal_remaining_counts_are_read(value, remaining):
    """A remaining count written as a decimal ("3.0") is read, rounded down."""
    assert hints(x_ratelimit_remaining=value).remaining == remaining
    assert hints(ratelimit=f"default;r={value};t=5").remaining == remaining


@pytest.mark.parametrize(
    "reset",
    [
        pytest.param("2026-11-23T10:23:26Z", id="utc-z"),
        pytest.param("2026-11-23T10:23:26.000Z", id="fraction"),
        pytest.param("2026-11-23T11:23:26+01:00", id="offset"),
        pytest.param("2026-11-23 10:23:26Z", id="space"),
    ],
)
def test_rfc3339_resets_are_read(reset):
    """A reset written as an RFC 3339 date-time (as Anthropic's API writes it)
    is the seconds until that moment."""
    found = hints(x_ratelimit_remaining="0", x_ratelimit_reset=reset)
    assert found.reset == pytest.approx(30.0)
    assert found.notes == ()


def test_rfc3339_reset_that_is_no_date_is_ignored_with_a_note():
    """A date-time shape with a 30th of February is no date: ignored and named."""
    found = hints(x_ratelimit_remaining="0", x_ratelimit_reset="2026-02-30T00:00:00Z")
    assert found.reset is None
    assert found.notes[0].endswith("not a number of seconds of 0 or more")


def test_draft_11_token_policy_and_ratelimit_are_read():
    """Draft 11 names a policy with a token, `qu` defaults to request, and the
    RateLimit item of that name gives its remaining and reset."""
    found = hints(
        ratelimit_policy='default;q=100;w=60;pk=:cHJvamVjdA==:, "day";q=5000;w=86400',
        ratelimit="default;r=0;t=30",
    )
    assert found.policy == (Window(100, 60), Window(5000, 86400))
    assert (found.remaining, found.reset, found.notes) == (0, 30.0, ())


def test_draft_11_policy_without_window_states_no_rule():
    """Draft 11 makes `w` optional: a policy without it states no window to keep."""
    found = hints(ratelimit_policy="default;q=100")
    assert found.policy == ()


class _Kept:
    """A recorder that only keeps the results."""

    def __init__(self) -> None:
        self.results: list[JobResult] = []

    def started(self, job, attempt: int) -> None:
        pass

    def requeued(self, job, *, maybe_processed: bool) -> None:
        pass

    def finished(self, result: JobResult) -> None:
        self.results.append(result)


async def run_rule(router, rule: str):
    """Run one run-query job under `rule`; (its result, the sink)."""
    sink, recorder = ListSink(), _Kept()
    rules = {LimitKey.RUN_QUERY: parse_rule(rule)}
    async with make_runner(router, rules, sink, recorder=recorder) as runner:
        job = Job("a", JobType.RUN_QUERY, "t1", {"q": 1})
        await runner.run({LimitKey.RUN_QUERY: [job]}, {LimitKey.RUN_QUERY: 1})
    [result] = recorder.results
    return result, sink


# -- Rate limits in other clothes ---------------------------------------------------


async def test_a_rate_limit_403_waits_and_the_job_ends_done():
    """A 403 with `X-RateLimit-Remaining: 0` waits for the reset like a 429,
    and the retry ends the job done instead of failing it."""
    router = respx.Router()
    spent = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "7"}
    router.post(QUERY).side_effect = [
        httpx.Response(403, headers=spent),
        httpx.Response(200, json={"ok": 1}),
    ]
    result, sink = await run_rule(router, "100/1s")
    assert (result.status, result.attempts) == (Status.DONE, 2)
    [requeued] = sink.of(JobRequeued)
    assert (requeued.rate_limited, requeued.delay) == (True, 7.0)


async def test_a_retry_after_is_honoured_up_to_the_keys_longest_window():
    """A 500/1h key told to wait 40 min tries again after 40 min, not at the
    15 min cap of keys with shorter windows."""
    router = respx.Router()
    router.post(QUERY).side_effect = [
        httpx.Response(429, headers={"Retry-After": "2400"}),
        httpx.Response(200, json={"ok": 1}),
    ]
    result, sink = await run_rule(router, "500/1h")
    assert result.status is Status.DONE
    [requeued] = sink.of(JobRequeued)
    assert requeued.delay == 2400.0
    first, second = (event.at for event in sink.of(JobSent))
    assert second - first >= 2400.0
