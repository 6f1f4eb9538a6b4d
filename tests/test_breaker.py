"""The circuit breaker: requests that all fail the same way stop the run early."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from batchrun.api.breaker import TRIP_AFTER, Breaker
from batchrun.api.outcome import Kind, Outcome
from batchrun.cli.commands import app
from batchrun.sandbox.serving import running

runner = CliRunner()
UNAUTHORIZED = Outcome(Kind.FAILED, 401, error="HTTP 401 Unauthorized")
UNREACHED = Outcome(Kind.TRANSIENT, error="ConnectError: refused", reached=False)


def queries(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "jobs.csv"
    rows = "".join(f"q{i},run-query,t1,\n" for i in range(n))
    path.write_text("id,type,team_id,payload\n" + rows)
    return path


@pytest.mark.parametrize("outcome", [UNAUTHORIZED, UNREACHED], ids=["401", "down"])
def test_it_trips_after_so_many_in_a_row(outcome):
    """TRIP_AFTER alike in a row trip it, once; one answer between resets it."""
    breaker = Breaker()
    for _ in range(TRIP_AFTER - 1):
        assert breaker.answered(outcome) is None
    assert breaker.answered(Outcome(Kind.DONE, 200)) is None
    for _ in range(TRIP_AFTER - 1):
        assert breaker.answered(outcome) is None
    assert breaker.answered(outcome) is not None
    assert breaker.answered(outcome) is None


def test_a_403_continues_a_run_of_401s():
    """401 and 403 are one cause: the token."""
    breaker = Breaker(trip_after=2)
    assert breaker.answered(UNAUTHORIZED) is None
    forbidden = Outcome(Kind.FAILED, 403, error="HTTP 403 Forbidden")
    assert breaker.answered(forbidden) is not None


def test_a_403_that_is_a_rate_limit_never_trips_it():
    """A 403 that says it is a rate limit (classified rate-limited) is the
    server asking to wait: it resets the count of refusals, and never trips."""
    breaker = Breaker(trip_after=2)
    limited = Outcome(Kind.RATE_LIMITED, 403, error="HTTP 403 (a rate limit)")
    assert breaker.answered(UNAUTHORIZED) is None
    for _ in range(TRIP_AFTER * 2):
        assert breaker.answered(limited) is None
    assert breaker.answered(UNAUTHORIZED) is None
    assert breaker.tripped is None


class _Counting:
    """An API that answers every request 401, counting them."""

    def __init__(self) -> None:
        self.seen = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen += 1
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b'{"error":"no"}'})


def test_a_run_answered_401_stops_early_with_exit_69(tmp_path):
    """40 jobs, every answer 401: the run stops after a handful, exit 69, saying
    why and how to go on."""
    api = _Counting()
    with running(api) as url:
        args = ["--base-url", url, "--token", "wrong-token", "--concurrency", "1"]
        result = runner.invoke(app, ["submit", str(queries(tmp_path)), *args])
    assert result.exit_code == 69, result.stderr
    assert api.seen == TRIP_AFTER
    assert "Circuit breaker: the last 5 requests were refused" in result.stderr
    assert "--retry-failed" in result.stderr
    assert "wrong-token" not in result.stdout + result.stderr


def test_a_host_that_is_down_stops_early_with_exit_69(tmp_path):
    """Nothing listens on the port: the run stops after a handful of connection
    errors instead of retrying every job at the paced rate."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = runner.invoke(app, ["submit", str(queries(tmp_path)), "--base-url", url])
    assert result.exit_code == 69, result.stderr
    assert "never reached the server" in result.stderr
    assert "run the same command to resume" in result.stderr


def test_no_token_against_a_real_api_warns(tmp_path):
    """No token for a host off loopback: a warning (here before a bad file stops
    the run, so nothing is sent anywhere); with a token, none."""
    bad = tmp_path / "bad.csv"
    bad.write_text("id,type,team_id,payload\nx,nope,,\n")
    args = ["submit", str(bad), "--base-url", "https://api.example.com"]
    warned = runner.invoke(app, args)
    assert warned.exit_code == 2
    assert "warning: no token for api.example.com" in warned.stderr
    quiet = runner.invoke(app, [*args, "--token", "some-token"])
    assert "no token" not in quiet.stderr
