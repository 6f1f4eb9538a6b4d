"""Serving an ASGI app on a loopback socket with uvicorn: the only uvicorn user.

`running` serves in a background thread for tests and benchmarks (the URL is known
and connectable when it yields); `serve` serves in the foreground until Ctrl-C (the
`batchrun sandbox` command). An app drops a connection on purpose by raising
`Dropped` after its answer has started; that is not logged as an error.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from batchrun.core.errors import UsageError

# Longest wait for the server thread to start, or to stop.
_THREAD_SECONDS = 10.0


class Dropped(Exception):
    """Raised inside the app, after an answer has started, to drop the connection."""


class _QuietDrops(logging.Filter):
    """Keeps uvicorn from logging a traceback for each connection dropped on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Dropped))


_QUIET_DROPS = _QuietDrops()


def _server(app: Any, host: str, port: int, level: str) -> uvicorn.Server:
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


def serve(app: Any, *, host: str, port: int, announce: Callable[[str], None]) -> None:
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
def running(app: Any, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
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
