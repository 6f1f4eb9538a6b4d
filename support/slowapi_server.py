"""slowapi as a case's server: the stock Starlette/FastAPI limiter on loopback.

`serving(rule, behaviour)` puts a Starlette app on a free loopback port whose
`POST /teams/{team_id}/data/run-query` is limited as the slowapi documentation
shows: `Limiter(key_func=get_remote_address, strategy="moving-window")`, the
endpoint decorated with `@limiter.limit(...)`, and slowapi's own
`_rate_limit_exceeded_handler` for the 429 (its JSON body, no Retry-After:
slowapi's default `headers_enabled=False`). slowapi counts with the `limits`
library, in memory, fresh for each server.

The app is wrapped in `case_server.Recorder`, as the sandbox is for the other
cases: every request logged with its arrival and the moment its answer was sent,
and an accepted answer held until `behaviour.latency` after the arrival (the
endpoint's work); a 429 is answered at once. Injected faults are the sandbox's and
are not available here.

The only module that imports slowapi.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from batchrun.core.limits import parse_rule
from batchrun.sandbox.serving import running
from support.case_server import Behaviour, Recorder

PATH = "/teams/{team_id}/data/run-query"


def limit_text(rule: str) -> str:
    """`15/4s+60/20s` in slowapi's notation, `15/4 second;60/20 second`."""
    parts = []
    for window in parse_rule(rule).windows:
        if window.seconds != int(window.seconds):
            msg = f"slowapi takes whole seconds, not {window.seconds:g} s"
            raise ValueError(msg)
        parts.append(f"{window.count}/{int(window.seconds)} second")
    return ";".join(parts)


def _too_many(request: Request, exc: Exception) -> Response:
    """slowapi's own 429 handler, typed as Starlette registers a handler."""
    assert isinstance(exc, RateLimitExceeded)
    # A typed name: without slowapi installed, mypy sees its handler as Any.
    response: Response = _rate_limit_exceeded_handler(request, exc)
    return response


def create_app(rule: str) -> Starlette:
    """The run-query endpoint behind slowapi's moving window enforcing `rule`."""
    limiter = Limiter(key_func=get_remote_address, strategy="moving-window")

    async def run_query(request: Request) -> JSONResponse:
        return JSONResponse({"success": True, "data": {"endpoint": "run-query"}})

    # Applied by a call, not as a decorator: an untyped decorator (slowapi not
    # installed where CI type-checks) would make the function untyped.
    limited = limiter.limit(limit_text(rule))(run_query)
    app = Starlette(routes=[Route(PATH, limited, methods=["POST"])])
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _too_many)
    return app


@contextlib.contextmanager
def serving(rule: str, behaviour: Behaviour) -> Iterator[Recorder]:
    """The recorded slowapi app on a free loopback port; its `url` is set while
    open."""
    if behaviour.faults_for is not None:
        msg = "injected faults are the sandbox's: slowapi has none"
        raise ValueError(msg)
    recorder = Recorder(create_app(rule), None, behaviour)
    with running(recorder) as url:
        recorder.url = url
        yield recorder
