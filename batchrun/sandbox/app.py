"""A local copy of the reporting API that enforces its limits, counted as told.

Holds `Arrival` (one request seen), `Admission` (what the limiter said of one),
`Sandbox` (a `limiters` model per rule, the arrival record behind one app) and
`create_app`, whose routes come from `endpoints.ENDPOINTS`. `serving` puts an app on
a socket; `faults` says what to break on purpose; `policy_headers` writes what the
sandbox states about its limits.

Invariant: for every client (a hash of the Authorization header) and key, requests
are accepted exactly as the chosen `limiters` model (`counting`, sliding log by
default) accepts them under the key's rule, or the global rule for a key without
one. With the sliding log, at most COUNT requests are accepted within any half-open
interval (t - W, t] of every window (COUNT, W) of the rule. Over-limit requests get
the API's 429 body and a Retry-After, and do not count. Any other path where the
API's paths are (under `/teams/` or `/users/me/`) is answered as the three
endpoints' are, under the global rule; a wrong method on one of the three (405)
and a path outside the API (404) count against the global rule too. With a
`headers` style, every answer but a dropped one states the key's quotas after
its request. Every request lands in `arrivals`.

A dropped connection starts an answer and then breaks it off. Over a socket,
uvicorn closes the connection mid-answer and the client sees a protocol error
(httpx.RemoteProtocolError). In process, through httpx.ASGITransport, the
`Dropped` exception comes out of the transport instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from batchrun.core.errors import UsageError
from batchrun.core.limits import LimitKey, Rule
from batchrun.jobs.endpoints import ENDPOINTS
from batchrun.pacing.limiters import LimiterKind, Quota, make_limiter
from batchrun.sandbox.faults import NOISE_DIGITS, Fault, Faults
from batchrun.sandbox.policy_headers import HeaderStyle, policy_headers
from batchrun.sandbox.serving import Dropped

# The API's documented 429 body (docs/reference/contract.md#the-api).
_TOO_MANY = {
    "success": False,
    "error": {
        "code": "TOO_MANY_REQUESTS",
        "message": "Too many requests. Please slow down and retry later.",
    },
}
_SERVER_ERRORS = {
    500: "INTERNAL_SERVER_ERROR",
    502: "BAD_GATEWAY",
    503: "SERVICE_UNAVAILABLE",
}


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request the sandbox saw, and what it answered (0: connection dropped)."""

    at: float
    client: str
    key: LimitKey
    status: int
    idempotency_key: str | None


class Admission(NamedTuple):
    """One request checked: when, the wait if refused (None: accepted and counted),
    and the key's quotas right after it (empty for a key without any rule)."""

    at: float
    wait: float | None
    quotas: tuple[Quota, ...]


@dataclass
class Sandbox:
    """The state behind one app: a limiter per rule, the arrivals, the fault draws.

    Every method takes the lock: under uvicorn the app runs in another thread than
    the test or benchmark that reads `arrivals`. A leaky bucket lets `burst`
    requests more through at once (nginx's `limit_req burst=B nodelay`).

    Raises:
        UsageError: when `counting` cannot express a rule (a leaky bucket slower
            than nginx's 0.001 request per second), or `burst` is given for
            another counting than leaky.
    """

    rules: Mapping[LimitKey, Rule]
    faults: Faults = field(default_factory=Faults)
    clock: Callable[[], float] = time.monotonic
    arrivals: list[Arrival] = field(default_factory=list)
    counting: LimiterKind = LimiterKind.SLIDING
    headers: HeaderStyle = HeaderStyle.NONE
    burst: int = 0

    def __post_init__(self) -> None:
        if self.burst and self.counting is not LimiterKind.LEAKY:
            msg = "a burst needs leaky counting (--counting or --server-counting)"
            raise UsageError(msg)
        options = {"burst": self.burst} if self.counting is LimiterKind.LEAKY else {}
        try:
            self._limiters = {
                key: make_limiter(self.counting, rule, **options)
                for key, rule in self.rules.items()
            }
        except ValueError as exc:
            msg = f"the sandbox cannot count {self.counting.value}: {exc}"
            raise UsageError(msg) from None
        self._lock = threading.Lock()
        self._random = random.Random(self.faults.seed)
        self._served = 0

    def admit(self, client: str, key: LimitKey) -> Admission:
        """Check one request now; an accepted one is counted.

        `wait` is the seconds until the limiter would accept it. A key without a
        rule of its own uses the global rule (with a budget of its own); with
        neither, no limit.
        """
        with self._lock:
            now = self.clock()
            limiter = self._limiters.get(key) or self._limiters.get(LimitKey.GLOBAL)
            if limiter is None:
                return Admission(now, None, ())
            wait = limiter.admit(client, key.value, now)
            return Admission(now, wait, limiter.quotas(client, key.value, now))

    def stated(self, admission: Admission) -> dict[str, str]:
        """The rate-limit header fields that state an admission's quotas."""
        return policy_headers(self.headers, admission.quotas)

    def draw_fault(self) -> Fault | None:
        """Which injected fault, if any, answers the accepted request at hand."""
        with self._lock:
            draw = self._random.random()
        return self.faults.drawn(draw)

    def server_error(self) -> int:
        """The status of an injected server error: 500, 502 or 503."""
        with self._lock:
            return self._random.choice(sorted(_SERVER_ERRORS))

    def next_request_id(self) -> int:
        """A number for an accepted answer: 1, 2, 3, ... per app."""
        with self._lock:
            self._served += 1
            return self._served

    def record(self, arrival: Arrival) -> None:
        """Keep one arrival, whatever it was answered."""
        with self._lock:
            self.arrivals.append(arrival)


def create_app(
    *,
    rules: Mapping[LimitKey, Rule],
    faults: Faults | None = None,
    clock: Callable[[], float] = time.monotonic,
    counting: LimiterKind = LimiterKind.SLIDING,
    headers: HeaderStyle = HeaderStyle.NONE,
    burst: int = 0,
) -> Starlette:
    """The sandbox API as an ASGI app; its state is `app.state.sandbox` (a `Sandbox`).

    `rules` come already time-scaled (`cli.arguments.scaled`); `clock` is read
    once per request, so tests can move time by hand. `counting` picks the
    `limiters` model (a leaky bucket with `burst`), `headers` the rate-limit
    header fields every answer states.
    """
    sandbox = Sandbox(
        rules,
        faults or Faults(),
        clock,
        counting=counting,
        headers=headers,
        burst=burst,
    )
    routes = [
        Route(end.path, _endpoint(sandbox, end.key), methods=[end.method])
        for end in ENDPOINTS.values()
    ]
    elsewhere = partial(_elsewhere, sandbox)
    app = Starlette(routes=routes, exception_handlers={404: elsewhere, 405: elsewhere})
    app.state.sandbox = sandbox
    return app


def _endpoint(
    sandbox: Sandbox, key: LimitKey
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await _answer(
            sandbox, request, key, partial(_serve, sandbox, request, key)
        )

    return endpoint


# Where the API's paths are (docs/reference/contract.md#the-api).
_API_PATHS = ("/teams/", "/users/me/")


async def _elsewhere(sandbox: Sandbox, request: Request, exc: Exception) -> Response:
    """Every other endpoint of the API, counted against `global`: any other path
    under `/teams/` or `/users/me/` is answered as the three are, with an echo;
    a wrong method on one of the three is a 405, and a path outside the API
    (a base URL with a wrong prefix) a 404."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    if status == 404 and request.url.path.startswith(_API_PATHS):
        serve = partial(_serve, sandbox, request, LimitKey.GLOBAL)
        return await _answer(sandbox, request, LimitKey.GLOBAL, serve)
    headers = exc.headers if isinstance(exc, HTTPException) else None
    code = "NOT_FOUND" if status == 404 else "METHOD_NOT_ALLOWED"
    message = f"no {request.method} {request.url.path} here"

    async def refusal() -> Response:
        return _error(status, code, message, headers)

    return await _answer(sandbox, request, LimitKey.GLOBAL, refusal)


async def _answer(
    sandbox: Sandbox,
    request: Request,
    key: LimitKey,
    accepted: Callable[[], Awaitable[Response]],
) -> Response:
    """Admit the request, answer it, and record it even if answering is cancelled."""
    who = hashlib.sha256(request.headers.get("authorization", "").encode())
    client = who.hexdigest()[:12]
    admission = sandbox.admit(client, key)
    wait = admission.wait
    status = 0
    try:
        response = _too_many(wait) if wait is not None else await accepted()
        if not isinstance(response, _DropResponse):
            status = response.status_code
            response.headers.update(sandbox.stated(admission))
        return response
    finally:
        idempotency_key = request.headers.get("idempotency-key")
        sandbox.record(Arrival(admission.at, client, key, status, idempotency_key))


def _too_many(wait: float) -> Response:
    retry_after = max(1, math.ceil(round(wait, NOISE_DIGITS)))
    return JSONResponse(_TOO_MANY, 429, headers={"Retry-After": str(retry_after)})


async def _serve(sandbox: Sandbox, request: Request, key: LimitKey) -> Response:
    """An accepted request: an injected fault if one is drawn, else the echo."""
    # Read the whole request first: a socket closed with unread input is reset,
    # and a drop must reach the client as a broken answer, whatever the timing.
    raw = await request.body()
    fault = sandbox.draw_fault()
    if fault is Fault.TOO_MANY:
        return JSONResponse(_TOO_MANY, 429)
    if fault is Fault.SERVER_ERROR:
        status = sandbox.server_error()
        return _error(status, _SERVER_ERRORS[status], "injected server error")
    if fault is Fault.DROP:
        return _DropResponse()
    if fault is Fault.SLOW:
        await anyio.sleep(sandbox.faults.slow_seconds)
    return _echo(sandbox, request, key, raw)


def _echo(sandbox: Sandbox, request: Request, key: LimitKey, raw: bytes) -> Response:
    try:
        received = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        return _error(400, "BAD_REQUEST", "the body is not valid JSON")
    data = {
        "request_id": sandbox.next_request_id(),
        "endpoint": key.value,
        "team_id": request.path_params.get("team_id") or _team(request.url.path),
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
        "received": received,
    }
    return JSONResponse({"success": True, "data": data})


def _team(path: str) -> str | None:
    """The team a path under `/teams/{team_id}/` names, as the server reads it."""
    steps = path.split("/")
    return steps[2] or None if len(steps) > 2 and steps[1] == "teams" else None


def _error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = {"success": False, "error": {"code": code, "message": message}}
    return JSONResponse(body, status, headers=headers)


class _DropResponse(Response):
    """Starts an answer, then breaks the connection off (a dropped connection)."""

    def __init__(self) -> None:
        super().__init__(status_code=200)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", b"64"), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{", "more_body": True})
        raise Dropped
