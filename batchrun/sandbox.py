"""A local copy of the reporting API that enforces its limits exactly.

Invariant: for every client (by Authorization header), key and window of the key's
rule, the sandbox accepts at most COUNT requests within any half-open interval
(t - WINDOW, t]. Over-limit requests get the API's 429 body with a Retry-After.
It can also inject faults (429s, 5xx, dropped connections, slow answers) and records
every arrival, so tests and benchmarks can check what a client really did.
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
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from batchrun.errors import UsageError
from batchrun.limits import LimitKey, Rule

TOO_MANY = {
    "success": False,
    "error": {
        "code": "TOO_MANY_REQUESTS",
        "message": "Too many requests. Please slow down and retry later.",
    },
}
_FAULT_NAMES = {
    "429": "rate_429",
    "5xx": "rate_5xx",
    "drop": "rate_drop",
    "slow": "rate_slow",
}


@dataclass(frozen=True, slots=True)
class Faults:
    """Fractions of accepted requests answered badly on purpose."""

    rate_429: float = 0.0
    rate_5xx: float = 0.0
    rate_drop: float = 0.0
    rate_slow: float = 0.0
    slow_seconds: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        rates = (self.rate_429, self.rate_5xx, self.rate_drop, self.rate_slow)
        if any(not 0 <= rate <= 1 for rate in rates) or sum(rates) > 1:
            msg = "fault rates must each be within 0..1 and add up to at most 1"
            raise UsageError(msg)
        if self.slow_seconds < 0:
            msg = "slow-seconds must not be negative"
            raise UsageError(msg)


def parse_faults(specs: Iterable[str]) -> Faults:
    """Read `--inject` values: 429=0.05, 5xx=0.1, drop=0.05, slow=0.1, slow-seconds=2,
    seed=7."""
    values: dict[str, float | int] = {}
    for spec in specs:
        name, _, text = spec.partition("=")
        field_name = _FAULT_NAMES.get(name.strip()) or {
            "slow-seconds": "slow_seconds",
            "seed": "seed",
        }.get(name.strip())
        try:
            number = int(text) if field_name == "seed" else float(text)
        except ValueError:
            number = math.nan
        if field_name is None or math.isnan(number):
            msg = (
                f"bad --inject {spec!r}: expected NAME=NUMBER with NAME one of "
                "429, 5xx, drop, slow, slow-seconds, seed (e.g. 429=0.05)"
            )
            raise UsageError(msg)
        values[field_name] = number
    return Faults(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request the sandbox saw, and what it answered (0: connection dropped)."""

    at: float
    client: str
    key: LimitKey
    status: int
    idempotency_key: str | None


class Dropped(Exception):
    """Raised inside the app to drop a connection mid-answer, on purpose."""


@dataclass
class Sandbox:
    """The state behind one app: accepted-request logs per client and key, arrivals."""

    rules: Mapping[LimitKey, Rule]
    faults: Faults = field(default_factory=Faults)
    clock: Callable[[], float] = time.monotonic
    arrivals: list[Arrival] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._accepted: defaultdict[tuple[str, LimitKey], deque[float]] = defaultdict(
            deque
        )
        self._lock = threading.Lock()
        self._random = random.Random(self.faults.seed)
        self._served = 0

    def rule(self, key: LimitKey) -> Rule:
        return self.rules.get(key) or self.rules[LimitKey.GLOBAL]

    def admit(self, client: str, key: LimitKey) -> tuple[float, float | None]:
        """Record an arrival now; return (now, None) if accepted, else the delay."""
        with self._lock:
            now = self.clock()
            log = self._accepted[(client, key)]
            rule = self.rule(key)
            while log and log[0] <= now - rule.longest:
                log.popleft()
            delay = _over_limit(log, rule, now)
            if delay is None:
                log.append(now)
            return now, delay

    def fault(self) -> str | None:
        """Draw which injected fault, if any, answers this accepted request."""
        draw = self._random.random()
        f = self.faults
        for name, rate in (
            ("429", f.rate_429),
            ("5xx", f.rate_5xx),
            ("drop", f.rate_drop),
            ("slow", f.rate_slow),
        ):
            if draw < rate:
                return name
            draw -= rate
        return None

    def record(self, arrival: Arrival) -> None:
        with self._lock:
            self.arrivals.append(arrival)
            self._served += 1

    def max_in_window(
        self, key: LimitKey, seconds: float, *, statuses: Container[int] | None = None
    ) -> int:
        """The most arrivals of `key` within any half-open interval of `seconds`."""
        times = sorted(
            a.at
            for a in self.arrivals
            if a.key is key and (statuses is None or a.status in statuses)
        )
        return most_in_window(times, seconds)


def most_in_window(times: list[float], seconds: float) -> int:
    """The most of the sorted `times` within any half-open interval of `seconds`."""
    best = low = 0
    for high, moment in enumerate(times):
        while times[low] <= moment - seconds:
            low += 1
        best = max(best, high - low + 1)
    return best


def _over_limit(log: deque[float], rule: Rule, now: float) -> float | None:
    """None if one more request fits every window now, else seconds until it does."""
    delay = None
    for window in rule.windows:
        inside = [t for t in log if t > now - window.seconds]
        if len(inside) >= window.count:
            wait = inside[-window.count] + window.seconds - now
            delay = max(delay or 0.0, wait)
    return delay


_ROUTES = [
    ("/teams/{team_id}/data/run-query", "POST", LimitKey.RUN_QUERY),
    ("/teams/{team_id}/members/invite", "POST", LimitKey.INVITE),
    ("/users/me/avatar", "PUT", LimitKey.AVATAR),
]


def create_app(
    *,
    rules: Mapping[LimitKey, Rule],
    faults: Faults | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Starlette:
    """The sandbox API; its state is `app.state.sandbox` (a `Sandbox`)."""
    sandbox = Sandbox(rules, faults or Faults(), clock)
    routes = [
        Route(path, _endpoint(sandbox, key), methods=[method])
        for path, method, key in _ROUTES
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return await _answer(sandbox, request, LimitKey.GLOBAL, status)

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.state.sandbox = sandbox
    return app


def _endpoint(sandbox: Sandbox, key: LimitKey) -> Callable[[Request], object]:
    async def endpoint(request: Request) -> Response:
        return await _answer(sandbox, request, key, 200)

    return endpoint


async def _answer(
    sandbox: Sandbox, request: Request, key: LimitKey, status: int
) -> Response:
    client = hashlib.sha256(request.headers.get("authorization", "").encode())
    who = client.hexdigest()[:12]
    now, delay = sandbox.admit(who, key)
    response = await _response(sandbox, request, key, status, delay)
    sandbox.record(
        Arrival(
            now, who, key, response.status_code, request.headers.get("idempotency-key")
        )
    )
    return response


async def _response(
    sandbox: Sandbox, request: Request, key: LimitKey, status: int, delay: float | None
) -> Response:
    if delay is not None:
        retry = str(max(1, math.ceil(delay)))
        return JSONResponse(TOO_MANY, 429, headers={"Retry-After": retry})
    if status != 200:
        return _error(
            status,
            "NOT_FOUND" if status == 404 else "METHOD_NOT_ALLOWED",
            f"no {request.method} {request.url.path} here",
        )
    fault = sandbox.fault()
    if fault == "429":
        return JSONResponse(TOO_MANY, 429)
    if fault == "5xx":
        return _error(503, "UNAVAILABLE", "injected server error")
    if fault == "drop":
        return _DropResponse()
    if fault == "slow":
        await anyio.sleep(sandbox.faults.slow_seconds)
    return await _accepted(request, key)


async def _accepted(request: Request, key: LimitKey) -> Response:
    raw = await request.body()
    try:
        received = json.loads(raw) if raw else {}
    except ValueError:
        return _error(400, "BAD_REQUEST", "the body is not valid JSON")
    data = {
        "request_id": hashlib.sha256(raw + str(time.time_ns()).encode()).hexdigest()[
            :16
        ],
        "endpoint": key.value,
        "team_id": request.path_params.get("team_id"),
        "received": received,
    }
    return JSONResponse({"success": True, "data": data})


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"success": False, "error": {"code": code, "message": message}}, status
    )


class _DropResponse(Response):
    """Starts an answer, then breaks the connection (a dropped connection)."""

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


def _server(app: Starlette, host: str, port: int, level: str) -> uvicorn.Server:
    logging.getLogger("uvicorn.error").addFilter(_QuietDrops())
    config = uvicorn.Config(
        app, host=host, port=port, log_level=level, access_log=False, lifespan="off"
    )
    return uvicorn.Server(config)


def serve(app: Starlette, *, host: str, port: int) -> None:
    """Serve until Ctrl-C (the `batchrun sandbox` command)."""
    _server(app, host, port, "warning").run()


@contextlib.contextmanager
def running(app: Starlette, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` on loopback in a thread; yield its base URL; stop on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = _server(app, host, port, "error")
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True
    )
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                msg = "the sandbox server did not start"
                raise RuntimeError(msg)
            time.sleep(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
