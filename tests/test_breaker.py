"""The circuit breaker: requests that all fail the same way stop the run early."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from batchrun.api.breaker import TRIP_AFTER, Breaker
from batchrun.api.outcome import Kind, Outcome
from batchrun.cli.commands import app
from batchrun.sandbox.serving import running

runner = CliRunner()
UNAUTHORIZED = Outcome(
    Kind.TRANSIENT,
    401,
    error="HTTP 401 Unauthorized",
    maybe_processed=False,
    fault="token",
)
UNREACHED = Outcome(
    Kind.TRANSIENT,
    error="cannot connect to http://127.0.0.1:9/: connection refused",
    maybe_processed=False,
    reached=False,
    fault="network",
)
UNTRUSTED = Outcome(
    Kind.TRANSIENT,
    error="the TLS certificate of https://127.0.0.1:9/ is not trusted: self-signed",
    maybe_processed=False,
    reached=False,
    fault="tls",
)


def queries(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "jobs.csv"
    rows = "".join(f"q{i},run-query,t1,\n" for i in range(n))
    path.write_text("id,type,team_id,payload\n" + rows)
    return path


@pytest.mark.parametrize(
    "outcome", [UNAUTHORIZED, UNREACHED, UNTRUSTED], ids=["401", "down", "tls"]
)
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
    forbidden = Outcome(Kind.TRANSIENT, 403, error="HTTP 403 Forbidden", fault="token")
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
    """An API that answers 401 unless the request carries `token`, counting the
    requests and the ids of those it accepted; each answer takes `delay` seconds,
    so that several are in flight at once."""

    def __init__(self, token: str = "right-token", delay: float = 0.0) -> None:
        self.token = token
        self.delay = delay
        self.seen = 0
        self.done: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await anyio.sleep(self.delay)
        headers = dict(scope["headers"])
        ok = headers.get(b"authorization") == f"Bearer {self.token}".encode()
        if ok:
            key = headers[b"idempotency-key"].decode()
            self.done.append(key)
        status = 200 if ok else 401
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b'{"error":"no"}'})


def test_a_run_answered_401_stops_early_with_exit_69(tmp_path):
    """40 jobs, every answer 401: the run stops after a handful, exit 69, saying
    why and one thing to do, which is true."""
    api = _Counting()
    with running(api) as url:
        args = ["--base-url", url, "--token", "wrong-token", "--concurrency", "1"]
        result = runner.invoke(app, ["submit", str(queries(tmp_path)), *args])
    assert result.exit_code == 69, result.stderr
    assert api.seen == TRIP_AFTER
    assert "Circuit breaker: the last 5 requests were refused" in result.stderr
    assert "--retry-failed" not in result.stderr
    assert "run the same command" in result.stderr
    assert result.stderr.count("run ") == 1
    assert "wrong-token" not in result.stdout + result.stderr


def _states(jobs: Path, url: str) -> dict[str, int]:
    shown = runner.invoke(app, ["status", str(jobs), "--base-url", url, "--json"])
    assert shown.exit_code == 0, shown.stderr
    states: dict[str, int] = json.loads(shown.stdout)["states"]["run-query"]
    return states


def test_a_401_leaves_every_job_pending_and_the_fixed_rerun_sends_them(tmp_path):
    """20 jobs, 4 in flight at a time, a wrong token: the breaker trips, and no
    job is failed, not even those in flight when it tripped; no result line. The
    same command with the right token (no other flag) sends all 20."""
    api = _Counting(delay=0.05)
    jobs = queries(tmp_path, 20)
    results = tmp_path / "jobs.results.jsonl"
    fast = ["--limit", "run-query=1000/1s", "--concurrency", "4"]
    with running(api) as url:
        first = runner.invoke(
            app, ["submit", str(jobs), "--base-url", url, "--token", "wrong", *fast]
        )
        assert first.exit_code == 69, first.stderr
        assert api.seen > TRIP_AFTER  # some were in flight when it tripped
        assert _states(jobs, url) == {"pending": 20}
        assert not results.exists() or results.read_text() == ""
        again = ["submit", str(jobs), "--base-url", url, "--token", "right-token"]
        second = runner.invoke(app, [*again, *fast])
        assert second.exit_code == 0, second.stderr
        assert _states(jobs, url) == {"done": 20}
    assert len(set(api.done)) == 20
    assert len(results.read_text().splitlines()) == 20


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
    assert f"cannot connect to {url}/: connection refused" in result.stderr
    assert "ConnectError" not in result.stderr
    assert "run the same command to send them" in result.stderr


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


@pytest.fixture
def https_api(tmp_path):
    """An API on loopback over HTTPS with a certificate of a CA of our own
    (trustme), that no client trusts unless told: its URL, CA file and app."""
    import threading
    import time

    import trustme
    import uvicorn

    ca = trustme.CA()
    bundle, cert, key = (tmp_path / f"{n}.pem" for n in ("ca", "cert", "key"))
    ca.cert_pem.write_to_path(bundle)
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(cert)
    issued.private_key_pem.write_to_path(key)
    api = _Counting(token="t0ken-of-the-api")
    config = uvicorn.Config(
        api,
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        log_level="critical",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        yield f"https://127.0.0.1:{sock.getsockname()[1]}", bundle, api
        server.should_exit = True
        thread.join(10)


def test_an_untrusted_certificate_leaves_every_job_for_the_fixed_rerun(
    tmp_path, https_api, monkeypatch
):
    """20 jobs against a server whose CA is not trusted: the breaker trips (exit
    69) naming the server and --ca-bundle, no job failed; the same command with
    --ca-bundle (no other flag) sends all 20."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    url, bundle, api = https_api
    jobs = queries(tmp_path, 20)
    args = ["submit", str(jobs), "--base-url", url, "--token", "t0ken-of-the-api"]
    fast = ["--limit", "run-query=1000/1s", "--concurrency", "4"]
    first = runner.invoke(app, [*args, *fast])
    assert first.exit_code == 69, first.stderr
    assert f"the TLS certificate of {url}/ is not trusted" in first.stderr
    assert "--ca-bundle" in first.stderr
    assert "failed" not in first.stderr.split("Circuit breaker")[0]
    assert api.seen == 0
    assert _states(jobs, url) == {"pending": 20}
    second = runner.invoke(app, [*args, *fast, "--ca-bundle", str(bundle)])
    assert second.exit_code == 0, second.stderr
    assert _states(jobs, url) == {"done": 20}
    assert len(set(api.done)) == 20
