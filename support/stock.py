"""A stock server-side limiter on loopback: Python `limits` on a tiny Starlette app.

`limits_server(rule, strategy=...)` serves the reporting API's three endpoints on a
free 127.0.0.1 port, in a thread, and stops it on exit. Each endpoint has its own
counters. The server is what an API built on slowapi runs: every window of the rule
is hit in order and the first refusal answers 429 with the API's JSON body (so a
refused request still counts against the windows hit before it); with
`headers=True` it also sends slowapi's `X-RateLimit-*` and `Retry-After` on every
answer. Invariant: every request the app answered is in `arrivals()`, with the
wall-clock time it arrived and its status, whatever the answer.

support/stock_programs.py holds the other stock limiters (nginx, express-rate-limit),
which share `Arrival` and `Server`; this one needs only the test extra (`limits`), so
the e2e tests use it without the bench extra.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import limits
import limits.storage
import limits.strategies
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from batchrun.sandbox.serving import running

Strategy = Literal["moving-window", "fixed-window", "sliding-window-counter"]
TOO_MANY = {
    "success": False,
    "error": {
        "code": "TOO_MANY_REQUESTS",
        "message": "Too many requests: slow down and retry later.",
    },
}
# The API's three endpoints: (method, Starlette path, endpoint key).
ENDPOINTS = (
    ("POST", "/teams/{team_id}/data/run-query", "run-query"),
    ("POST", "/teams/{team_id}/members/invite", "invite"),
    ("PUT", "/users/me/avatar", "avatar"),
)
_STRATEGIES: dict[str, type[limits.strategies.RateLimiter]] = {
    "moving-window": limits.strategies.MovingWindowRateLimiter,
    "fixed-window": limits.strategies.FixedWindowRateLimiter,
    "sliding-window-counter": limits.strategies.SlidingWindowCounterRateLimiter,
}


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request a stock server answered: when it arrived and was answered
    (wall clock, Unix seconds), its status, and its Idempotency-Key header."""

    at: float
    status: int
    answered: float
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Server:
    """A running stock limiter: its base URL and a way to read its arrival log."""

    url: str
    arrivals: Callable[[], list[Arrival]]
    what: str = ""


@dataclass
class _Log:
    """Arrivals, appended from the server's thread and read from the caller's."""

    seen: list[Arrival] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, arrival: Arrival) -> None:
        with self.lock:
            self.seen.append(arrival)

    def read(self) -> list[Arrival]:
        with self.lock:
            return sorted(self.seen, key=lambda a: a.at)


def rate_items(rule: str) -> list[limits.RateLimitItem]:
    """`10/2s+500/120s` as limits items (whole seconds only, as limits takes them)."""
    items: list[limits.RateLimitItem] = []
    for part in rule.split("+"):
        match = re.fullmatch(r"(\d+)/(\d+)s", part.strip())
        if match is None:
            msg = f"bad rule {rule!r}: write COUNT/Ns joined by '+', e.g. 10/2s"
            raise ValueError(msg)
        count, seconds = map(int, match.groups())
        items.append(limits.RateLimitItemPerSecond(count, seconds))
    return items


def _headers(
    limiter: limits.strategies.RateLimiter, item: limits.RateLimitItem, key: str
) -> dict[str, str]:
    """slowapi's headers (headers_enabled=True) for the limit last evaluated."""
    reset, remaining = limiter.get_window_stats(item, key)
    reset_in = 1 + reset
    return {
        "X-RateLimit-Limit": str(item.amount),
        "X-RateLimit-Remaining": str(remaining),
        "X-RateLimit-Reset": str(reset_in),
        "Retry-After": str(int(reset_in - time.time())),
    }


def _decide(
    limiter: limits.strategies.RateLimiter,
    items: list[limits.RateLimitItem],
    key: str,
) -> tuple[bool, limits.RateLimitItem]:
    """slowapi's order: hit each window in turn; the first refusal wins."""
    for item in items:
        if not limiter.hit(item, key):
            return False, item
    return True, items[-1]


def create_app(rule: str, *, strategy: Strategy, headers: bool, log: _Log) -> Starlette:
    """The three endpoints behind one `limits` strategy, each with its own key."""
    limiter = _STRATEGIES[strategy](limits.storage.MemoryStorage())
    items = rate_items(rule)

    def endpoint(name: str) -> Callable[[Request], object]:
        async def answer(request: Request) -> Response:
            arrived = time.time()
            await request.body()
            accepted, item = _decide(limiter, items, name)
            extra = _headers(limiter, item, name) if headers else {}
            body = {"success": True, "data": {"endpoint": name}}
            response = JSONResponse(
                body if accepted else TOO_MANY, 200 if accepted else 429, headers=extra
            )
            key = request.headers.get("idempotency-key")
            log.add(Arrival(arrived, response.status_code, time.time(), key))
            return response

        return answer

    routes = [Route(path, endpoint(name), methods=[m]) for m, path, name in ENDPOINTS]
    return Starlette(routes=routes)


@contextlib.contextmanager
def limits_server(
    rule: str, *, strategy: Strategy = "moving-window", headers: bool = False
) -> Iterator[Server]:
    """A `limits` strategy enforcing `rule` (e.g. `10/2s`) on each endpoint."""
    log = _Log()
    app = create_app(rule, strategy=strategy, headers=headers, log=log)
    with running(app) as url:
        what = f"limits {strategy} {rule}" + (" + slowapi headers" if headers else "")
        yield Server(url, log.read, what)
