"""One request per job, and what its answer means: the only module that uses httpx.

`Client.send` never raises for anything the network or the server does: every
answer, timeout or broken connection becomes an `Outcome` the runner can act on.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import math
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Self

import httpx

from batchrun import __version__
from batchrun.jobs import Job

# Longest Retry-After honoured; a server asking for more is capped, with a note.
RETRY_AFTER_CAP = 900.0
# Bodies longer than this are kept truncated in the results, with a note.
BODY_LIMIT = 64 * 1024


class Kind(StrEnum):
    """What an answer means for its job (CONTRACT.md section 4)."""

    DONE = "done"
    RATE_LIMITED = "rate-limited"
    TRANSIENT = "transient"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The meaning of one attempt: its kind, HTTP status, body and any server delay."""

    kind: Kind
    status: int | None = None
    body: Any = None
    retry_after: float | None = None
    error: str | None = None
    note: str | None = None


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


class Client:
    """Sends jobs to one base URL with one token, over a bounded connection pool."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str | None,
        scope: str,
        timeout: float = 30.0,
        connections: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"User-Agent": f"batchrun/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._scope = scope
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            limits=httpx.Limits(max_connections=connections),
            follow_redirects=False,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()

    async def send(self, job: Job) -> Outcome:
        """Make the job's request once and classify the answer."""
        headers = {"Idempotency-Key": idempotency_key(self._scope, job.id)}
        try:
            response = await self._http.request(
                job.endpoint.method, job.path, json=job.payload, headers=headers
            )
        except httpx.TimeoutException as exc:
            return Outcome(Kind.TRANSIENT, error=f"timeout ({type(exc).__name__})")
        except httpx.TransportError as exc:
            return Outcome(Kind.TRANSIENT, error=_describe(exc))
        return classify(response)


def classify(response: httpx.Response) -> Outcome:
    """Turn an answer into an Outcome: 2xx done, 429 requeue, 5xx retry, else fail."""
    body, note = _body(response)
    status = response.status_code
    if 200 <= status < 300:
        return Outcome(Kind.DONE, status, body, note=note)
    if status == 429:
        delay, delay_note = parse_retry_after(response.headers.get("Retry-After"))
        return Outcome(Kind.RATE_LIMITED, status, body, delay, "HTTP 429", delay_note)
    error = f"HTTP {status} {response.reason_phrase}".strip()
    kind = Kind.TRANSIENT if status >= 500 or status == 408 else Kind.FAILED
    return Outcome(kind, status, body, error=error, note=note)


def parse_retry_after(
    value: str | None, *, now: float | None = None
) -> tuple[float | None, str | None]:
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP date).

    Returns `(None, note)` for a malformed value, and caps absurd ones with a note.
    """
    if value is None:
        return None, None
    seconds = _retry_after_seconds(value.strip(), now)
    if seconds is None:
        return None, f"ignored malformed Retry-After {value[:40]!r}"
    if seconds > RETRY_AFTER_CAP:
        note = f"Retry-After of {seconds:.0f} s capped at {RETRY_AFTER_CAP:.0f} s"
        return RETRY_AFTER_CAP, note
    return max(0.0, seconds), None


def _retry_after_seconds(value: str, now: float | None) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return _seconds_until_date(value, now)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _seconds_until_date(value: str, now: float | None) -> float | None:
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp() - (time.time() if now is None else now)


def _body(response: httpx.Response) -> tuple[Any, str | None]:
    raw = response.content
    note = None
    if len(raw) > BODY_LIMIT:
        note = f"body of {len(raw)} bytes truncated to {BODY_LIMIT}"
        return raw[:BODY_LIMIT].decode("utf-8", "replace"), note
    if not raw:
        return None, None
    try:
        return json.loads(raw), None
    except ValueError:
        return raw.decode("utf-8", "replace"), None


def _describe(exc: httpx.TransportError) -> str:
    detail = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {detail}" if detail else name
