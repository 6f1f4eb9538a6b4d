"""What one answer means: classification, Retry-After, bodies, dropped connections."""

from __future__ import annotations

import email.utils
import socket
import ssl
from typing import Any

import httpx
import pytest

from batchrun.api.client import (
    BODY_LIMIT,
    Client,
    asgi_transport,
    classify,
    idempotency_key,
    parse_retry_after,
    tls_context,
)
from batchrun.api.hints import RETRY_AFTER_CAP
from batchrun.api.outcome import Kind
from batchrun.core.errors import UsageError
from batchrun.core.limits import limit_table
from batchrun.jobs.endpoints import JobType, Method
from batchrun.jobs.job import Job
from batchrun.sandbox.app import create_app
from batchrun.sandbox.faults import Faults


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


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        pytest.param({"X-RateLimit-Remaining": "0"}, None, id="none-remaining"),
        pytest.param(
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"},
            30.0,
            id="none-remaining-reset",
        ),
        pytest.param({"Retry-After": "60"}, 60.0, id="retry-after"),
        pytest.param({"RateLimit": "default;r=0;t=5"}, 5.0, id="draft-ratelimit"),
    ],
)
def test_a_403_that_says_it_is_a_rate_limit_waits_like_a_429(headers, delay):
    """GitHub answers some rate limits with 403 and a spent quota or a
    Retry-After: that is the server asking to wait, not a refused token."""
    outcome = classify(httpx.Response(403, headers=headers))
    assert (outcome.kind, outcome.retry_after) == (Kind.RATE_LIMITED, delay)
    assert outcome.error == "HTTP 403 (a rate limit)"
    assert not outcome.maybe_processed


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="bare"),
        pytest.param({"X-RateLimit-Remaining": "12"}, id="quota-left"),
        pytest.param({"Retry-After": "soon"}, id="unreadable-retry-after"),
    ],
)
def test_a_403_without_rate_limit_evidence_is_a_token_fault(headers):
    """A 403 that names no wait and no spent quota is a refusal of the token:
    a configuration fault (the breaker counts it), not processed, not the job's."""
    outcome = classify(httpx.Response(403, headers=headers))
    assert (outcome.kind, outcome.error) == (Kind.TRANSIENT, "HTTP 403 Forbidden")
    assert (outcome.fault, outcome.maybe_processed) == ("token", False)


def test_a_401_is_a_token_fault():
    """A 401 is the token's fault, every request's alike: no job fails of it."""
    outcome = classify(httpx.Response(401))
    assert (outcome.kind, outcome.error) == (Kind.TRANSIENT, "HTTP 401 Unauthorized")
    assert (outcome.fault, outcome.maybe_processed) == ("token", False)


def answering(answer: httpx.Response, **options: Any) -> Client:
    """A client whose every request gets `answer`."""
    transport = httpx.MockTransport(lambda request: answer)
    return Client(
        base_url="https://api.test",
        token=None,
        scope="s",
        transport=transport,
        **options,
    )


async def test_a_key_with_a_long_window_honours_a_long_retry_after():
    """A 500/1h key told to wait 40 min waits 40 min: its cap is its longest
    window, not the 15 min every other key keeps."""
    answer = httpx.Response(429, headers={"Retry-After": "2400"})
    waits = {Job("q", JobType.RUN_QUERY, "t").key: 3600.0}
    async with answering(answer, waits=waits) as client:
        long = await client.send(Job("q", JobType.RUN_QUERY, "t"))
        short = await client.send(Job("a", JobType.AVATAR))
    assert (long.retry_after, long.note) == (2400.0, None)
    assert short.retry_after == RETRY_AFTER_CAP


async def test_the_retry_after_cap_is_the_one_given():
    """Under --time-scale 30 the cap is 30 s, not 15 min: a scaled sandbox's
    day-long Retry-After waits as long as a real one's would, scaled."""
    answer = httpx.Response(429, headers={"Retry-After": "86400"})
    async with answering(answer, retry_after_cap=30.0) as client:
        outcome = await client.send(Job("a", JobType.AVATAR))
    assert outcome.retry_after == 30.0
    assert "capped" in (outcome.note or "")


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


def test_retry_after_date_in_the_minus_0000_zone_is_utc():
    """The date email.utils.formatdate writes by default (zone -0000) is honoured
    as UTC, not ignored as malformed."""
    when = email.utils.formatdate(1_000_030)
    assert when.endswith("-0000")
    assert parse_retry_after(when, now=1_000_000.0) == (30.0, None)


@pytest.mark.parametrize(
    "value",
    [
        "soon",
        "-5",
        "nan",
        "inf",
        "Mon, 99 Foo 2026",
        "",
    ],
)
def test_malformed_retry_after_is_ignored_with_a_note(value):
    """A Retry-After that means nothing is ignored (backoff applies) and noted."""
    delay, note = parse_retry_after(value)
    assert delay is None
    assert "Retry-After" in (note or "")
    assert "ignored" in (note or "")


def test_absurd_retry_after_is_capped_with_a_note():
    """A Retry-After of a day is capped at 15 minutes, and the cap is noted."""
    delay, note = parse_retry_after("86400")
    assert delay == RETRY_AFTER_CAP == 900
    assert "capped" in (note or "")


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
    assert f"{BODY_LIMIT + 10} bytes truncated" in (outcome.note or "")


def test_strict_json_body_is_kept_parsed():
    """A JSON body, fractions and nesting included, is kept as parsed JSON."""
    body = {"mean": 1.5, "rows": [[1, "a"], None, True]}
    assert classify(httpx.Response(200, json=body)).body == body


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
    assert "RemoteProtocolError" in (outcome.error or "")


def test_a_429_keeps_both_its_notes():
    """A capped Retry-After and a truncated body are both noted on a 429."""
    response = httpx.Response(
        429, headers={"Retry-After": "86400"}, content=b"x" * (BODY_LIMIT + 1)
    )
    note = classify(response).note
    assert "capped at 900 s" in (note or "")
    assert "truncated" in (note or "")


async def test_token_is_scrubbed_from_connection_errors():
    """A connection error whose text holds the token is recorded without it."""
    token = "tok-7f3a-client-SECRET"

    def refuse(request):
        msg = f"proxy refused {request.headers['Authorization']}"
        raise httpx.ConnectError(msg, request=request)

    async with Client(
        base_url="https://api.test",
        token=token,
        scope="s",
        transport=httpx.MockTransport(refuse),
    ) as client:
        outcome = await client.send(Job("a", JobType.AVATAR))
    assert outcome.kind is Kind.TRANSIENT
    assert outcome.error == (
        "cannot connect to https://api.test/: ConnectError: proxy refused Bearer [token]"
    )


# -- TLS -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory):
    """A CA of our own, and its certificate as a PEM file."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(path)
    return ca, path


@pytest.fixture(scope="module")
def https_sandbox(private_ca, tmp_path_factory):
    """The sandbox served over HTTPS on loopback, with a certificate of the private CA."""
    import socket
    import threading
    import time

    import uvicorn

    ca, _ = private_ca
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(cert)
    issued.private_key_pem.write_to_path(key)
    config = uvicorn.Config(
        create_app(rules=limit_table()),
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
        yield f"https://127.0.0.1:{sock.getsockname()[1]}"
        server.should_exit = True
        thread.join(10)


async def send_over_tls(url, **options):
    async with Client(base_url=url, token="t", scope="s", **options) as client:
        return await client.send(Job("a", JobType.AVATAR))


async def test_an_untrusted_certificate_is_a_tls_fault_with_a_hint(https_sandbox):
    """A certificate no trusted CA signed is refused: a configuration fault (the
    breaker counts it; the job stays to send), naming the server, with a hint."""
    outcome = await send_over_tls(https_sandbox)
    assert (outcome.kind, outcome.fault) == (Kind.TRANSIENT, "tls")
    assert not outcome.reached
    assert not outcome.maybe_processed
    assert outcome.error.startswith(
        f"the TLS certificate of {https_sandbox}/ is not trusted: "
    )
    assert "--ca-bundle" in outcome.error


async def test_a_ca_bundle_adds_a_trusted_ca(https_sandbox, private_ca):
    """With the private CA's bundle, the same server's answer is accepted."""
    _, bundle = private_ca
    outcome = await send_over_tls(https_sandbox, ca_bundle=bundle)
    assert (outcome.kind, outcome.status) == (Kind.DONE, 200)


def test_a_ca_bundle_keeps_the_default_cas(private_ca, monkeypatch):
    """Adding a bundle adds its CA to the default store, dropping none."""
    # A CA folder's certificates are not listed until used; count certifi's file.
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    _, bundle = private_ca
    default = len(tls_context(None).get_ca_certs())
    assert default > 0
    assert len(tls_context(bundle).get_ca_certs()) == default + 1


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda p: p / "missing.pem", "No such file", id="missing"),
        pytest.param(lambda p: p, "Is a directory", id="folder"),
        pytest.param(
            lambda p: (p / "x.pem", (p / "x.pem").write_text("hello"))[0],
            "holds no PEM certificate",
            id="not-pem",
        ),
    ],
)
def test_an_unusable_ca_bundle_is_a_usage_error(tmp_path, make, reason):
    """A CA bundle that is missing, a folder or not PEM is refused, naming it."""
    path = make(tmp_path)
    with pytest.raises(UsageError) as info:
        Client(base_url="https://api.test", token=None, scope="s", ca_bundle=path)
    assert info.value.exit_code == 2
    assert f"cannot use CA bundle {path}: " in info.value.message
    assert reason in info.value.message


def _raising(error: Exception):
    def handler(request):
        msg = "All connection attempts failed"
        raise httpx.ConnectError(msg, request=request) from error

    return handler


@pytest.mark.parametrize(
    ("handler", "said"),
    [
        pytest.param(
            _raising(ConnectionRefusedError(111, "refused")),
            "connection refused",
            id="refused",
        ),
        pytest.param(
            _raising(socket.gaierror(-2, "Name or service not known")),
            "name not found",
            id="no-name",
        ),
        pytest.param(_raising(TimeoutError("timed out")), "timed out", id="timed-out"),
    ],
)
async def test_an_unreachable_server_is_named(handler, said):
    """No connection made: the message names the server and why, in a user's
    words, as a configuration fault the breaker counts."""
    async with Client(
        base_url="http://127.0.0.1:9/v1",
        token=None,
        scope="s",
        transport=httpx.MockTransport(handler),
    ) as client:
        outcome = await client.send(Job("a", JobType.AVATAR))
    assert outcome.error == f"cannot connect to http://127.0.0.1:9/: {said}"
    assert (outcome.reached, outcome.fault) == (False, "network")


async def test_a_connect_timeout_names_the_server():
    """No connection within the timeout: "cannot connect to URL: timed out"."""

    def handler(request):
        msg = "timed out"
        raise httpx.ConnectTimeout(msg, request=request)

    async with Client(
        base_url="http://10.255.255.1:8080",
        token=None,
        scope="s",
        transport=httpx.MockTransport(handler),
    ) as client:
        outcome = await client.send(Job("a", JobType.AVATAR))
    assert outcome.error == "cannot connect to http://10.255.255.1:8080/: timed out"
    assert not outcome.reached


@pytest.mark.parametrize(
    ("error", "fault", "said"),
    [
        pytest.param(
            httpx.ProxyError("403 Forbidden"),
            "proxy",
            "the proxy refused to reach https://api.test/ (ProxyError: 403 Forbidden)",
            id="proxy",
        ),
        pytest.param(
            httpx.ConnectError("handshake"),
            "tls",
            "TLS handshake with https://api.test/ failed: WRONG_VERSION_NUMBER",
            id="handshake",
        ),
    ],
)
async def test_a_proxy_or_handshake_refusal_is_a_fault(error, fault, said):
    """A proxy refusing, or a TLS handshake refused, is a fault every request
    meets: the breaker counts it, and no job fails of it."""

    def handler(request):
        if fault == "tls":
            cause = ssl.SSLError(1, "wrong version")
            cause.reason = "WRONG_VERSION_NUMBER"
            raise error from cause
        raise error

    async with Client(
        base_url="https://api.test",
        token=None,
        scope="s",
        transport=httpx.MockTransport(handler),
    ) as client:
        outcome = await client.send(Job("a", JobType.AVATAR))
    assert (outcome.error or "").startswith(said)
    assert (outcome.kind, outcome.fault, outcome.reached) == (
        Kind.TRANSIENT,
        fault,
        False,
    )


# Request jobs and answers of any kind (issue 37)


def sent_through(job: Job, answer: httpx.Response | None = None):
    """Send `job` through a mock transport; return the requests it saw and the
    outcome."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer or httpx.Response(200, json={"ok": True})

    async def send():
        transport = httpx.MockTransport(handle)
        async with Client(
            base_url="https://api.example/v2", token="t", scope="s", transport=transport
        ) as client:
            return await client.send(job)

    return seen, send


def request_job(method: str, target: str, payload=None, team="acme") -> Job:
    return Job("r1", JobType.REQUEST, team, payload or {}, 2, Method(method), target)


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_get_or_delete_request_is_sent_without_a_body(method):
    """GET and DELETE go out with their query string and no body at all."""
    seen, send = sent_through(request_job(method, "/teams/{team_id}/r?day=1&n=2"))
    outcome = await send()
    [request] = seen
    assert (request.method, str(request.url)) == (
        method,
        "https://api.example/v2/teams/acme/r?day=1&n=2",
    )
    assert request.content == b""
    assert "content-type" not in request.headers
    assert outcome.kind is Kind.DONE


async def test_a_post_request_carries_its_body_and_an_idempotency_key():
    """POST sends the payload as JSON, with the job's stable Idempotency-Key."""
    seen, send = sent_through(request_job("POST", "/users/me/notes", {"a": 1}))
    await send()
    [request] = seen
    assert request.content == b'{"a":1}'
    assert request.headers["idempotency-key"] == idempotency_key("s", "r1")


@pytest.mark.parametrize("target", ["/../admin", "https://evil.example/steal"])
async def test_a_path_out_of_the_base_url_is_never_sent(target):
    """A path that got past the reader and leaves the base URL fails unsent."""
    seen, send = sent_through(request_job("GET", target))
    outcome = await send()
    assert seen == []
    assert (outcome.kind, outcome.maybe_processed) == (Kind.FAILED, False)
    assert "not under the base URL" in (outcome.error or "")


def test_a_text_body_is_kept_with_its_content_type():
    """A body that is not JSON is kept as text, with the Content-Type it came with."""
    answer = httpx.Response(
        200, text="id,name\n1,a\n", headers={"Content-Type": "text/csv"}
    )
    outcome = classify(answer)
    assert (outcome.body, outcome.content_type, outcome.size) == (
        "id,name\n1,a\n",
        "text/csv",
        None,
    )


def test_a_json_body_has_no_content_type_noted():
    """A JSON body needs no more than itself."""
    outcome = classify(httpx.Response(200, json={"a": 1}))
    assert (outcome.content_type, outcome.size) == (None, None)


async def test_a_huge_body_is_kept_in_part_with_its_full_size():
    """A body over the limit keeps its first 64 KiB and notes its stated size."""
    whole = BODY_LIMIT * 5
    answer = httpx.Response(
        200,
        content=b"y" * whole,
        headers={"Content-Type": "application/octet-stream"},
    )
    _, send = sent_through(request_job("GET", "/export"), answer)
    outcome = await send()
    assert len(outcome.body) == BODY_LIMIT
    assert (outcome.size, outcome.content_type) == (whole, "application/octet-stream")
    assert f"body of {whole} bytes truncated to {BODY_LIMIT}" in (outcome.note or "")


def test_a_404_message_reaches_the_error_without_control_characters():
    """A server's message is one line, its escape sequences blanked."""
    body = {"error": {"message": "no \x1b[31mteam\x1b[0m\nhere"}}
    outcome = classify(httpx.Response(404, json=body))
    assert outcome.error == "HTTP 404 Not Found; no [31mteam [0m here"


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        pytest.param(
            404,
            {"success": False, "error": {"code": "NOT_FOUND", "message": "no team"}},
            "HTTP 404 Not Found; no team",
            id="404-api-shape",
        ),
        pytest.param(
            405,
            "<h1>Method Not Allowed</h1>\n",
            "HTTP 405 Method Not Allowed; <h1>Method Not Allowed</h1>",
            id="405-text",
        ),
    ],
)
def test_a_404_or_405_fails_with_the_servers_message(status, body, error):
    """A missing endpoint or wrong method fails at once, saying what the server said."""
    if isinstance(body, dict):
        answer = httpx.Response(status, json=body)
    else:
        answer = httpx.Response(status, text=body or "")
    outcome = classify(answer)
    assert (outcome.kind, outcome.error) == (Kind.FAILED, error)
