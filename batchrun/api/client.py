"""One request per job, and what its answer means: the only module that uses httpx.

`Client.send` never raises for anything the network or the server does: every
answer, timeout, broken connection or refused certificate becomes an `Outcome` the
runner can act on. Whatever the server sends, an Outcome stays small and safe to
store: at most `BODY_LIMIT` bytes of body are read, a body is kept as JSON only if it
is strict, storable JSON (else as text), and the token never appears in it.
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self, TypeVar, cast

import anyio
import httpx

from batchrun import __version__
from batchrun.api.hints import RETRY_AFTER_CAP, Hints, read_hints
from batchrun.api.outcome import Kind, Outcome, rate_limited_wait, says_rate_limited
from batchrun.api.trace import ExchangeTrace
from batchrun.core import strict_json
from batchrun.core.errors import UsageError
from batchrun.core.limits import LimitKey
from batchrun.jobs.job import Job

# Bodies longer than this are kept truncated in the results, with a note; the rest
# is not read, so a huge answer costs no memory.
BODY_LIMIT = 64 * 1024
# A token shorter than this would match ordinary text, so it is not searched for.
_SHORTEST_SECRET = 8
_REDACTED = "[token]"
_E = TypeVar("_E", bound=BaseException)
# Escape sequences in a server's message must not drive the user's terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def idempotency_key(scope: str, job_id: str) -> str:
    """A key stable for one jobs file and job id, so every attempt carries the same."""
    digest = hashlib.sha256(f"{scope}\0{job_id}".encode()).hexdigest()
    return f"batchrun-{digest[:32]}"


def asgi_transport(app: Any) -> httpx.AsyncBaseTransport:
    """A transport that calls an ASGI app in process (the built-in sandbox)."""
    return _InProcess(app=app)


class _InProcess(httpx.ASGITransport):
    """An app that breaks off its answer looks like a dropped connection."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except Exception as exc:
            msg = f"connection dropped ({type(exc).__name__})"
            raise httpx.RemoteProtocolError(msg, request=request) from exc


def tls_context(ca_bundle: Path | None) -> ssl.SSLContext:
    """The certificates a client trusts: httpx's default store, plus `ca_bundle`.

    Raises:
        UsageError: when the bundle is missing, unreadable or holds no certificate.
    """
    # httpx's own default (certifi, or SSL_CERT_FILE/SSL_CERT_DIR), so adding a
    # bundle never drops a CA that a run without one would trust.
    context = httpx.create_ssl_context()
    if ca_bundle is not None:
        try:
            context.load_verify_locations(cafile=ca_bundle)
        except ssl.SSLError as exc:
            msg = (
                f"cannot use CA bundle {ca_bundle}: it holds no PEM certificate "
                f"({exc.reason}). --ca-bundle takes a PEM file of CA certificates."
            )
            raise UsageError(msg) from None
        except OSError as exc:
            msg = (
                f"cannot use CA bundle {ca_bundle}: {exc.strerror or exc}. "
                "--ca-bundle takes a readable PEM file of CA certificates."
            )
            raise UsageError(msg) from None
    return context


class Client:
    """Sends jobs to one base URL with one token, over a bounded connection pool.

    TLS certificates are always verified; `ca_bundle` adds CAs to trust (a private
    CA). `timeout` bounds each whole exchange, from sending to the last body byte.
    `waits` maps a limit key to its longest window: the longest server-named
    wait honoured for its jobs, when longer than `retry_after_cap` (by default
    `RETRY_AFTER_CAP`; shorter under --time-scale).
    """

    def __init__(
        self,
        *,
        base_url: str,
        token: str | None,
        scope: str,
        timeout: float = 30.0,
        connections: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
        ca_bundle: Path | None = None,
        waits: Mapping[LimitKey, float] | None = None,
        retry_after_cap: float = RETRY_AFTER_CAP,
    ) -> None:
        headers = {"User-Agent": f"batchrun/{__version__}"}
        self._waits = dict(waits or {})
        self._cap = retry_after_cap
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._secret = token if token and len(token) >= _SHORTEST_SECRET else None
        self._scope = scope
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            # True is httpx's default store, the same as tls_context(None).
            verify=True if ca_bundle is None else tls_context(ca_bundle),
            limits=httpx.Limits(max_connections=connections),
            follow_redirects=False,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()

    async def send(self, job: Job) -> Outcome:
        """Make the job's request once and classify the answer; say, when the
        transport reports it, when the request left and the connect's round trip."""
        trace = ExchangeTrace()
        headers = {"Idempotency-Key": idempotency_key(self._scope, job.id)}
        request = self._http.build_request(
            job.endpoint.method,
            job.path,
            json=job.body,
            headers=headers,
            extensions={"trace": trace},
        )
        if not _under(request.url, self._http.base_url):
            # The jobs reader refuses such paths; this keeps the token home
            # even if one got through.
            error = f"{job.path!r} is not under the base URL: not sent"
            return Outcome(Kind.FAILED, error=error, maybe_processed=False)
        try:
            # httpx times each phase (connect, each read); a server dripping its
            # answer byte by byte must still end within the timeout, as a whole.
            with anyio.fail_after(self._timeout):
                response, raw, cut = await self._exchange(request)
        except httpx.ConnectTimeout:
            error = f"cannot connect to {_origin(request)}: timed out"
            return Outcome(
                Kind.TRANSIENT, error=error, maybe_processed=False, reached=False
            )
        except TimeoutError:
            error = f"timeout (no complete answer within {self._timeout:g} s)"
            return Outcome(Kind.TRANSIENT, error=error)
        except httpx.TimeoutException as exc:
            error = f"timeout ({type(exc).__name__})"
            return Outcome(
                Kind.TRANSIENT, error=error, maybe_processed=not _unsent(exc)
            )
        except httpx.TransportError as exc:
            return _transport_failure(exc, request, self._secret)
        cap = max(self._cap, self._waits.get(job.key, 0.0))
        outcome = _classify(response, raw, cut=cut, secret=self._secret, cap=cap)
        return replace(outcome, written=trace.written, round_trip=trace.round_trip)

    async def _exchange(
        self, request: httpx.Request
    ) -> tuple[httpx.Response, bytes, bool]:
        """Send; stop reading the answer once past BODY_LIMIT; say if it was cut."""
        response = await self._http.send(request, stream=True)
        chunks: list[bytes] = []
        size = 0
        stream = cast(AsyncGenerator[bytes, None], response.aiter_bytes())
        try:
            async for chunk in stream:
                chunks.append(chunk)
                size += len(chunk)
                if size > BODY_LIMIT:
                    break
        finally:
            # Shielded: a timeout must still close the stream. An answer left
            # unread closes its connection rather than returning it to the pool.
            with anyio.CancelScope(shield=True):
                await stream.aclose()
                await response.aclose()
        return response, b"".join(chunks), size > BODY_LIMIT


def _under(url: httpx.URL, base: httpx.URL) -> bool:
    """Whether `url` is the base URL's scheme, host and port, and under its path."""
    prefix = base.raw_path.split(b"?")[0].rstrip(b"/") + b"/"
    return (url.scheme, url.host, url.port) == (
        base.scheme,
        base.host,
        base.port,
    ) and url.raw_path.startswith(prefix)


def classify(response: httpx.Response) -> Outcome:
    """Turn an answer into an Outcome: 2xx done, 429 (or a 403 that says it is a
    rate limit) requeue, 5xx retry, else fail."""
    return _classify(
        response, response.content, cut=False, secret=None, cap=RETRY_AFTER_CAP
    )


def _classify(
    response: httpx.Response, raw: bytes, *, cut: bool, secret: str | None, cap: float
) -> Outcome:
    headers = {name.lower(): value for name, value in response.headers.items()}
    size = _full_size(raw, cut=cut, stated=headers.get("content-length"))
    body, note = _body(raw, size=size, secret=secret)
    hints = read_hints(headers, now=time.time(), cap=cap)
    note = _joined(*hints.notes, note)
    kept = _Kept(body, headers.get("content-type"), size)
    outcome = _verdict(response, body, note, hints)
    return replace(outcome, **kept.shown) if kept.shown else outcome


def _verdict(
    response: httpx.Response, body: Any, note: str | None, hints: Hints
) -> Outcome:
    status = response.status_code
    if 200 <= status < 300:
        return Outcome(Kind.DONE, status, body, note=note, hints=hints)
    if status == 429 or (status == 403 and says_rate_limited(hints)):
        error = "HTTP 429" if status == 429 else "HTTP 403 (a rate limit)"
        return Outcome(
            Kind.RATE_LIMITED,
            status,
            body,
            rate_limited_wait(hints),
            error,
            note,
            hints=hints,
            maybe_processed=False,
        )
    error = f"HTTP {status} {response.reason_phrase}".strip()
    if status in (401, 403):
        # The token is missing, wrong or lacks the rights: every request would be
        # refused alike, and none was processed.
        return Outcome(
            Kind.TRANSIENT,
            status,
            body,
            error=error,
            note=note,
            hints=hints,
            maybe_processed=False,
            fault="token",
        )
    if status in (404, 405):
        error = _joined(error, _server_message(body)) or error
    kind = Kind.TRANSIENT if status >= 500 or status == 408 else Kind.FAILED
    # A 503 that says when to come back is the server turning the request away
    # unprocessed (RFC 9110 section 15.6.4); any other 5xx may have done the work.
    declined = status == 503 and hints.retry_after is not None
    return Outcome(
        kind,
        status,
        body,
        error=error,
        note=note,
        hints=hints,
        maybe_processed=not declined,
    )


def parse_retry_after(
    value: str | None, *, now: float | None = None
) -> tuple[float | None, str | None]:
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP date).

    Returns `(None, note)` for a malformed value, and caps absurd ones with a note.
    """
    if value is None:
        return None, None
    moment = time.time() if now is None else now
    hints = read_hints({"retry-after": value}, now=moment, cap=RETRY_AFTER_CAP)
    return hints.retry_after, _joined(*hints.notes)


def _full_size(raw: bytes, *, cut: bool, stated: str | None) -> int | None:
    """The body's whole size in bytes: as read, or for a body cut short, as its
    Content-Length states (None: not stated, or not a number)."""
    if not cut:
        return len(raw)
    if stated is not None and stated.strip().isdigit():
        return int(stated)
    return None


@dataclass(frozen=True, slots=True)
class _Kept:
    """What a results line says of a body kept as text: its content type, and
    its whole size when only part of it is kept."""

    body: Any
    content_type: str | None
    size: int | None

    @property
    def shown(self) -> dict[str, Any]:
        if not isinstance(self.body, str):
            return {}
        cut = self.size is not None and self.size > BODY_LIMIT
        return {
            "content_type": self.content_type or "(not stated)",
            "size": self.size if cut else None,
        }


def _server_message(body: Any) -> str | None:
    """The message of an error body in the API's shape, or a short text body:
    one line, without control characters (it reaches the terminal)."""
    text = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = str(error["message"])
        elif isinstance(error, str):
            text = error
    elif isinstance(body, str):
        text = body
    if text is None:
        return None
    return " ".join(_CONTROL.sub(" ", text).split())[:200] or None


def _body(
    raw: bytes, *, size: int | None, secret: str | None
) -> tuple[Any, str | None]:
    """The body to keep: strict JSON parsed, else text; never the token."""
    notes: list[str] = []
    if secret and secret.encode() in raw:
        raw = raw.replace(secret.encode(), _REDACTED.encode())
        notes.append("the token was echoed in the body and is replaced by [token]")
    if size is None or len(raw) > BODY_LIMIT:
        whole = f"more than {BODY_LIMIT}" if size is None else str(size)
        notes.append(f"body of {whole} bytes truncated to {BODY_LIMIT}")
        return raw[:BODY_LIMIT].decode("utf-8", "replace"), _joined(*notes)
    if not raw:
        return None, _joined(*notes)
    try:
        return _strict_json(raw), _joined(*notes)
    except (ValueError, RecursionError):
        return raw.decode("utf-8", "replace"), _joined(*notes)


def _strict_json(raw: bytes) -> Any:
    """JSON that any reader of the results file accepts, or ValueError (a body
    that is not UTF-8 included); RecursionError when nested too deeply."""
    text = raw.decode("utf-8")
    value = strict_json.loads(text)
    if not strict_json.surely_encodable(text):
        strict_json.check_encodable(value)
    return value


def _transport_failure(
    exc: httpx.TransportError, request: httpx.Request, secret: str | None
) -> Outcome:
    """A connection error is retried; one every request would meet alike (a
    certificate or handshake refused, a proxy refusing, no such name, a refused
    connection) is a configuration fault, which the breaker counts."""
    origin = _origin(request)
    certificate = _in_chain(exc, ssl.SSLCertVerificationError)
    handshake = _in_chain(exc, ssl.SSLError)
    if certificate is not None:
        why = certificate.verify_message or certificate.reason or "rejected"
        error = (
            f"the TLS certificate of {origin} is not trusted: {why}. If the API "
            "uses a private CA, pass it with --ca-bundle."
        )
        return _unreached(error, "tls")
    if handshake is not None:
        why = handshake.reason or str(handshake)
        return _unreached(f"TLS handshake with {origin} failed: {why}", "tls")
    if isinstance(exc, httpx.ProxyError):
        detail = _describe(exc, secret)
        error = (
            f"the proxy refused to reach {origin} ({detail}): check HTTPS_PROXY, "
            "HTTP_PROXY and NO_PROXY."
        )
        return _unreached(error, "proxy")
    if isinstance(exc, httpx.ConnectError):
        why = _why_not(exc, secret)
        return _unreached(f"cannot connect to {origin}: {why}", "network")
    unsent = _unsent(exc)
    error = _describe(exc, secret)
    return Outcome(Kind.TRANSIENT, error=error, maybe_processed=not unsent)


def _unreached(error: str, fault: str) -> Outcome:
    """A request the server never saw, for a fault every request would meet."""
    return Outcome(
        Kind.TRANSIENT, error=error, maybe_processed=False, reached=False, fault=fault
    )


def _origin(request: httpx.Request) -> str:
    """The server a request went to, as a user gives it: scheme, host and port."""
    url = request.url
    return f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}/"


def _why_not(exc: httpx.ConnectError, secret: str | None) -> str:
    """Why no connection was made, in a user's words."""
    if _in_chain(exc, socket.gaierror) is not None:
        return "name not found"
    if _in_chain(exc, ConnectionRefusedError) is not None:
        return "connection refused"
    if _in_chain(exc, TimeoutError) is not None:
        return "timed out"
    return _describe(exc, secret)


def _unsent(exc: httpx.TransportError) -> bool:
    """True when the request provably never left: no connection was made, or no
    pooled connection came free, so not a byte of it reached the server."""
    return isinstance(
        exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout
    )


def _in_chain(exc: BaseException, kind: type[_E]) -> _E | None:
    """The first exception of `kind` among `exc` and its causes, if any."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, kind):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _describe(exc: httpx.TransportError, secret: str | None) -> str:
    detail = str(exc).strip()
    if secret:
        detail = detail.replace(secret, _REDACTED)
    name = type(exc).__name__
    return f"{name}: {detail}" if detail else name


def _joined(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None
