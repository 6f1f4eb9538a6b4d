"""A second way to serve the sandbox app for the pacing runs: with TCP_NODELAY.

`batchrun.sandbox.running` binds its socket as `socket(family, SOCK_STREAM)`, with
no protocol named; asyncio sets TCP_NODELAY only on accepted sockets whose protocol
is IPPROTO_TCP, so there each answer's second write (uvicorn writes the head and the
body apart) waits for the client's delayed ACK: about 40 ms per request on a
kept-alive connection. `running_nodelay` serves the same app the same way (uvicorn
in a thread) from a socket made with IPPROTO_TCP, to show what that latency costs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

_START_SECONDS = 10.0


@contextlib.contextmanager
def running_nodelay(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` on a free port with TCP_NODELAY; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    config = uvicorn.Config(app, log_level="error", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True
    )
    with sock:
        thread.start()
        try:
            _await_start(server)
            yield f"http://{host}:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            thread.join(timeout=_START_SECONDS)


def _await_start(server: uvicorn.Server) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while not server.started:
        if time.monotonic() > deadline:
            msg = "the sandbox server did not start"
            raise RuntimeError(msg)
        time.sleep(0.005)
