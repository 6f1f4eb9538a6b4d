"""What one answer means: classification, Retry-After, bodies, dropped connections."""

from __future__ import annotations

import email.utils

import httpx
import pytest

from batchrun.client import (
    BODY_LIMIT,
    RETRY_AFTER_CAP,
    Client,
    Kind,
    asgi_transport,
    classify,
    idempotency_key,
    parse_retry_after,
)
from batchrun.jobs import Job, JobType
from batchrun.limits import limit_table
from batchrun.sandbox import Faults, create_app


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        pytest.param(200, Kind.DONE, id="200"),
        pytest.param(204, Kind.DONE, id="204"),
        pytest.param(429, Kind.RATE_LIMITED, id="429"),
        pytest.param(500, Kind.TRANSIENT, id="500"),
        pytest.param(503, Kind.TRANSIENT, id="503"),
        pytest.param(408, Kind.TRANSIENT, id="408"),
        pytest.param(400, Kind.FAILED, id="400"),
        pytest.param(404, Kind.FAILED, id="404"),
        pytest.param(302, Kind.FAILED, id="redirect"),
    ],
)
def test_status_decides_the_outcome(status, kind):
    """2xx done, 429 rate limited, 5xx/408 transient, anything else failed."""
    assert classify(httpx.Response(status)).kind is kind


def test_retry_after_in_seconds():
    """Retry-After: 12 means wait 12 s."""
    outcome = classify(httpx.Response(429, headers={"Retry-After": "12"}))
    assert (outcome.retry_after, outcome.note) == (12.0, None)


def test_retry_after_as_an_http_date():
    """Retry-After as an HTTP date is the time until that date."""
    when = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(when, now=1_000_000) == (30.0, None)


def test_retry_after_date_in_the_past_means_now():
    """A date already past means no wait."""
    when = email.utils.formatdate(999_000, usegmt=True)
    assert parse_retry_after(when, now=1_000_000) == (0.0, None)


@pytest.mark.parametrize("value", ["soon", "-5", "nan", "inf", "Mon, 99 Foo 2026", ""])
def test_malformed_retry_after_is_ignored_with_a_note(value):
    """A Retry-After that means nothing is ignored (backoff applies) and noted."""
    delay, note = parse_retry_after(value)
    assert delay is None
    assert "malformed Retry-After" in note


def test_absurd_retry_after_is_capped_with_a_note():
    """A Retry-After of a day is capped at 15 minutes, and the cap is noted."""
    delay, note = parse_retry_after("86400")
    assert delay == RETRY_AFTER_CAP == 900
    assert "capped" in note


def test_429_without_json_body_is_still_rate_limited():
    """A 429 with an HTML body is a 429 all the same."""
    outcome = classify(httpx.Response(429, text="<html>slow down</html>"))
    assert outcome.kind is Kind.RATE_LIMITED
    assert outcome.body == "<html>slow down</html>"


def test_2xx_with_a_non_json_body_keeps_the_text():
    """A 2xx whose body is not JSON is done, with the body kept as text."""
    outcome = classify(httpx.Response(200, text="OK"))
    assert (outcome.kind, outcome.body) == (Kind.DONE, "OK")


def test_huge_body_is_truncated_with_a_note():
    """A body over 64 KiB is kept truncated, with a note saying so."""
    outcome = classify(httpx.Response(200, content=b"x" * (BODY_LIMIT + 10)))
    assert len(outcome.body) == BODY_LIMIT
    assert f"{BODY_LIMIT + 10} bytes truncated" in outcome.note


def test_empty_body_is_none():
    """An empty body is kept as null."""
    assert classify(httpx.Response(204)).body is None


def test_idempotency_key_is_stable_per_file_and_job():
    """The same file and id give the same key; another id or file, another key."""
    key = idempotency_key("/data/jobs.csv", "j1")
    assert key == idempotency_key("/data/jobs.csv", "j1")
    assert key != idempotency_key("/data/jobs.csv", "j2")
    assert key != idempotency_key("/other/jobs.csv", "j1")


async def test_dropped_connection_in_process_is_transient():
    """The sandbox dropping a connection in process reads as a transient error."""
    app = create_app(rules=limit_table(), faults=Faults(rate_drop=1.0))
    job = Job("a", JobType.AVATAR)
    async with Client(
        base_url="http://sandbox", token="t", scope="s", transport=asgi_transport(app)
    ) as client:
        outcome = await client.send(job)
    assert outcome.kind is Kind.TRANSIENT
    assert "RemoteProtocolError" in outcome.error
