"""A local copy of the reporting API that enforces its limits exactly.

Holds `Faults` (what to break on purpose), `Arrival` (one request seen), `Sandbox`
(the limit logs and arrival record behind one app), `create_app`, and `running` /
`serve`, which put an app on a socket.

Invariant: for every client (a hash of the Authorization header), key and window
(COUNT, W) of the key's rule, at most COUNT requests are accepted within any
half-open interval (t - W, t]: an accepted arrival at `a` counts while `a + W > t`,
summed in floats as the pacer sums its slots. Over-limit requests get the API's 429
body and a Retry-After, and do not count. Every request lands in `arrivals`.

A dropped connection starts an answer and then breaks it off. Over a socket,
uvicorn closes the connection mid-answer and the client sees a protocol error
(httpx.RemoteProtocolError). In process, through httpx.ASGITransport, the
`Dropped` exception comes out of the transport instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import random
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import TypeVar

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from batchrun.errors import UsageError
from batchrun.limits import LimitKey, Rule

# The API's documented 429 body (reporting-api-rate-limits.md, section 7).
_TOO_MANY = {
    "success": False,
    "error": {
        "code": "TOO_MANY_REQUESTS",
        "message": "Too many requests. Please slow down and retry later.",
    },
}
_ROUTES = (
    ("/teams/{team_id}/data/run-query", "POST", LimitKey.RUN_QUERY),
    ("/teams/{team_id}/members/invite", "POST", LimitKey.INVITE),
    ("/users/me/avatar", "PUT", LimitKey.AVATAR),
)
_SERVER_ERRORS = {
    500: "INTERNAL_SERVER_ERROR",
    502: "BAD_GATEWAY",
    503: "SERVICE_UNAVAILABLE",
}
_FAULT_FIELDS = {
    "429": "rate_429",
    "5xx": "rate_5xx",
    "drop": "rate_drop",
    "slow": "rate_slow",
    "slow-seconds": "slow_seconds",
}
_FAULT_HINT = (
    "expected NAME=NUMBER, NAME one of 429, 5xx, drop, slow, slow-seconds, seed "
    "(rates are fractions: 429=0.05; slow-seconds=2; seed=7)"
)
# Retry-After and the sum of fault rates are rounded to this many digits first, so
# float noise (8.000000000000002, 1.0000000000000002) does not round up.
_NOISE_DIGITS = 6
# Longest wait for the server thread to start, or to stop.
_THREAD_SECONDS = 10.0
_N = TypeVar("_N", int, float)


class _Fault(StrEnum):
    """The ways an accepted request can be answered badly on purpose."""

    TOO_MANY = "429"
    SERVER_ERROR = "5xx"
    DROP = "drop"
    SLOW = "slow"


@dataclass(frozen=True, slots=True)
class Faults:
    """Fractions of accepted requests answered badly on purpose, drawn in this order."""

    rate_429: float = 0.0
    rate_5xx: float = 0.0
    rate_drop: float = 0.0
    rate_slow: float = 0.0
    slow_seconds: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        rates = self.rates()
        total = round(math.fsum(rates.values()), _NOISE_DIGITS)
        if not all(0 <= r <= 1 for r in rates.values()) or total > 1:
            shown = ", ".join(f"{name}={r:g}" for name, r in rates.items() if r)
            msg = (
                f"fault rates must each be within 0..1 and add up to at most 1: {shown}"
            )
            raise UsageError(msg)
        if not (math.isfinite(self.slow_seconds) and self.slow_seconds >= 0):
            msg = f"slow-seconds must be a number >= 0, got {self.slow_seconds:g}"
            raise UsageError(msg)

    def rates(self) -> dict[str, float]:
        """Each fault's rate, by its `--inject` name, in the order they are drawn."""
        return {
            _Fault.TOO_MANY: self.rate_429,
            _Fault.SERVER_ERROR: self.rate_5xx,
            _Fault.DROP: self.rate_drop,
            _Fault.SLOW: self.rate_slow,
        }


def parse_faults(specs: Iterable[str]) -> Faults:
    """Read `--inject` values: 429=0.05, 5xx=0.1, drop=0.05, slow=0.1, slow-seconds=2,
    seed=7. Raises UsageError naming the bad value, with a hint."""
    numbers: dict[str, float] = {}
    seed: int | None = None
    for spec in specs:
        name, text = _fault_spec(spec)
        if name == "seed":
            seed = _number(spec, text, int)
        else:
            numbers[_FAULT_FIELDS[name]] = _number(spec, text, float)
    try:
        return Faults(seed=seed, **numbers)
    except UsageError as exc:
        msg = f"bad --inject values: {exc.message}"
        raise UsageError(msg) from None


def _fault_spec(spec: str) -> tuple[str, str]:
    name, sep, text = spec.partition("=")
    name = name.strip()
    if not sep or (name not in _FAULT_FIELDS and name != "seed"):
        msg = f"bad --inject {spec!r}: {_FAULT_HINT}"
        raise UsageError(msg)
    return name, text.strip()


def _number(spec: str, text: str, kind: Callable[[str], _N]) -> _N:
    try:
        return kind(text)
    except ValueError:
        msg = f"bad --inject {spec!r}: {text!r} is not a number; {_FAULT_HINT}"
        raise UsageError(msg) from None


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request the sandbox saw, and what it answered (0: connection dropped)."""

    at: float
    client: str
    key: LimitKey
    status: int
    idempotency_key: str | None


class Dropped(Exception):
    """Raised inside the app, after an answer has started, to drop the connection."""


@dataclass
class Sandbox:
    """The state behind one app: accepted-arrival logs per client and key, arrivals.

    Every method takes the lock: under uvicorn the app runs in another thread than
    the test or benchmark that reads `arrivals`.
    """

    rules: Mapping[LimitKey, Rule]
    faults: Faults = field(default_factory=Faults)
    clock: Callable[[], float] = time.monotonic
    arrivals: list[Arrival] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._accepted: defaultdict[tuple[str, LimitKey], deque[float]]
        self._accepted = defaultdict(deque)
        self._lock = threading.Lock()
        self._random = random.Random(self.faults.seed)
        self._served = 0

    def admit(self, client: str, key: LimitKey) -> tuple[float, float | None]:
        """Check one request now: (now, None) if accepted and logged, else (now, wait).

        `wait` is the seconds until the blocking accepted arrival leaves its window.
        A key without a rule of its own uses the global rule; with neither, no limit.
        """
        with self._lock:
            now = self.clock()
            rule = self.rules.get(key) or self.rules.get(LimitKey.GLOBAL)
            if rule is None:
                return now, None
            log = self._accepted[(client, key)]
            while log and log[0] + rule.longest <= now:
                log.popleft()
            wait = _wait(log, rule, now)
            if wait is None:
                log.append(now)
            return now, wait

    def draw_fault(self) -> _Fault | None:
        """Which injected fault, if any, answers the accepted request at hand."""
        with self._lock:
            draw = self._random.random()
        for fault, rate in self.faults.rates().items():
            if draw < rate:
                return _Fault(fault)
            draw -= rate
        return None

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

    def max_in_window(
        self, key: LimitKey, seconds: float, *, statuses: Container[int] | None = None
    ) -> int:
        """The most arrivals of `key` (with one of `statuses`, if given) within any
        half-open interval of `seconds`."""
        with self._lock:
            seen = list(self.arrivals)
        times = sorted(
            a.at
            for a in seen
            if a.key is key and (statuses is None or a.status in statuses)
        )
        return most_in_window(times, seconds)


def most_in_window(times: list[float], seconds: float) -> int:
    """The most of the sorted `times` within any half-open interval of `seconds`."""
    best = low = 0
    for high, moment in enumerate(times):
        while times[low] + seconds <= moment:
            low += 1
        best = max(best, high - low + 1)
    return best


def _wait(log: deque[float], rule: Rule, now: float) -> float | None:
    """None if one more request fits every window now, else seconds until it does."""
    wait = None
    for window in rule.windows:
        inside = [t for t in log if t + window.seconds > now]
        if len(inside) >= window.count:
            # The request fits once the count-th newest arrival has left the window.
            leaves = inside[-window.count] + window.seconds - now
            wait = max(wait or 0.0, leaves)
    return wait


def create_app(
    *,
    rules: Mapping[LimitKey, Rule],
    faults: Faults | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Starlette:
    """The sandbox API as an ASGI app; its state is `app.state.sandbox` (a `Sandbox`).

    `rules` come already time-scaled (`limit_table(time_scale=...)`); `clock` is read
    once per request, so tests can move time by hand.
    """
    sandbox = Sandbox(rules, faults or Faults(), clock)
    routes = [
        Route(path, _endpoint(sandbox, key), methods=[method])
        for path, method, key in _ROUTES
    ]
    refuse = partial(_refuse, sandbox)
    app = Starlette(routes=routes, exception_handlers={404: refuse, 405: refuse})
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


async def _refuse(sandbox: Sandbox, request: Request, exc: Exception) -> Response:
    """Unknown paths (404) and wrong methods (405), counted against `global`."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
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
    now, wait = sandbox.admit(client, key)
    status = 0
    try:
        response = _too_many(wait) if wait is not None else await accepted()
        status = 0 if isinstance(response, _DropResponse) else response.status_code
        return response
    finally:
        idempotency_key = request.headers.get("idempotency-key")
        sandbox.record(Arrival(now, client, key, status, idempotency_key))


def _too_many(wait: float) -> Response:
    retry_after = max(1, math.ceil(round(wait, _NOISE_DIGITS)))
    return JSONResponse(_TOO_MANY, 429, headers={"Retry-After": str(retry_after)})


async def _serve(sandbox: Sandbox, request: Request, key: LimitKey) -> Response:
    """An accepted request: an injected fault if one is drawn, else the echo."""
    # Read the whole request first: a socket closed with unread input is reset,
    # and a drop must reach the client as a broken answer, whatever the timing.
    raw = await request.body()
    fault = sandbox.draw_fault()
    if fault is _Fault.TOO_MANY:
        return JSONResponse(_TOO_MANY, 429)
    if fault is _Fault.SERVER_ERROR:
        status = sandbox.server_error()
        return _error(status, _SERVER_ERRORS[status], "injected server error")
    if fault is _Fault.DROP:
        return _DropResponse()
    if fault is _Fault.SLOW:
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
        "team_id": request.path_params.get("team_id"),
        "received": received,
    }
    return JSONResponse({"success": True, "data": data})


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


class _QuietDrops(logging.Filter):
    """Keeps uvicorn from logging a traceback for each connection dropped on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Dropped))


_QUIET_DROPS = _QuietDrops()


def _server(app: Starlette, host: str, port: int, level: str) -> uvicorn.Server:
    # One filter instance, so adding it again (each `running`) is a no-op.
    logging.getLogger("uvicorn.error").addFilter(_QUIET_DROPS)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
    )
    return uvicorn.Server(config)


def serve(
    app: Starlette, *, host: str, port: int, announce: Callable[[str], None]
) -> None:
    """Serve until Ctrl-C (the `batchrun sandbox` command), logging warnings only.

    `announce` gets the base URL once the port is bound (port 0 picks a free one).
    Raises UsageError when the address cannot be bound (e.g. the port is in use).
    """
    try:
        sock = _bound(host, port)
    except OSError as exc:
        reason = exc.strerror or exc
        msg = f"cannot listen on {host}:{port}: {reason}. Try another --port."
        raise UsageError(msg) from None
    with sock:
        announce(_base_url(host, sock.getsockname()[1]))
        _server(app, host, port, "warning").run(sockets=[sock])


@contextlib.contextmanager
def running(app: Starlette, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` in a background thread; yield its base URL; stop it on exit.

    `port=0` picks a free port. The socket is bound before the server starts, so
    the URL is known (and connectable) as soon as this yields.
    """
    with _bound(host, port) as sock:
        server = _server(app, host, port, "error")
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        thread.start()
        try:
            _await_start(server, thread)
            yield _base_url(host, sock.getsockname()[1])
        finally:
            server.should_exit = True
            thread.join(timeout=_THREAD_SECONDS)


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Naming IPPROTO_TCP lets asyncio recognise the socket as TCP and set
    # TCP_NODELAY; without it each answer on a kept-alive connection waits ~40 ms
    # for Nagle's algorithm.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _await_start(server: uvicorn.Server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + _THREAD_SECONDS
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            msg = "the sandbox server did not start (see the log above)"
            raise RuntimeError(msg)
        time.sleep(0.005)


def _base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
