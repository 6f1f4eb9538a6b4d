"""Capture the rate-limit headers that stock slowapi sends, for tests/test_hints.py.

Not run by CI. To refresh the fixture (from the repository root, in the dev venv):
    .venv/bin/pip install slowapi
    .venv/bin/python tests/data/capture_headers_slowapi.py \
        > tests/data/ratelimit_headers_slowapi.json
It serves on 127.0.0.1 (a free port) with uvicorn, sends 3 requests per
configuration to a limiter allowing 2 per minute, and records the 1st (200) and
the 3rd (429).
"""

import importlib.metadata
import json
import socket
import sys
import threading
import time

import httpx
import uvicorn
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.middleware import SlowAPIMiddleware
from slowapi.util import get_remote_address
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

CONFIGS = [["2/minute"], ["2/minute", "100/hour"]]
DROP = {"date", "server", "content-length", "content-type"}


def _too_many(request: Request, exc: Exception) -> Response:
    # slowapi's handler, typed as Starlette registers one (mypy strict).
    assert isinstance(exc, RateLimitExceeded)
    return _rate_limit_exceeded_handler(request, exc)


def _app(limits: list[str]) -> Starlette:
    async def ok(request: object) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", ok)])
    app.state.limiter = Limiter(
        key_func=get_remote_address, default_limits=[*limits], headers_enabled=True
    )
    app.add_exception_handler(RateLimitExceeded, _too_many)
    app.add_middleware(SlowAPIMiddleware)
    return app


def _capture(limits: list[str]) -> list[dict[str, object]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        _app(limits), host="127.0.0.1", port=port, log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    version = " + ".join(
        f"{name} {importlib.metadata.version(name)}" for name in ("slowapi", "limits")
    )
    fixtures: list[dict[str, object]] = []
    try:
        for n in (1, 2, 3):
            response = httpx.get(f"http://127.0.0.1:{port}/")
            if n == 2:
                continue
            headers = {k: v for k, v in response.headers.items() if k not in DROP}
            fixtures.append(
                {
                    "server": version,
                    "config": f"default_limits={limits}, headers_enabled=True",
                    "request": n,
                    "status": response.status_code,
                    "now": time.time(),
                    "headers": headers,
                }
            )
    finally:
        server.should_exit = True
        thread.join()
    return fixtures


if __name__ == "__main__":
    everything = [fixture for limits in CONFIGS for fixture in _capture(limits)]
    json.dump(everything, sys.stdout, indent=2)
    sys.stdout.write("\n")
