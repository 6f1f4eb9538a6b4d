"""A minimal ASGI server for throughput: answers every request at once.

Run as `python -m bench.fastserver`: it binds 127.0.0.1 on a free port, prints the
port on its first line, and serves under uvicorn until killed. `GET /stats` answers
{"count", "first", "last"} (wall-clock seconds of the first and last request since
the previous /stats) and starts counting afresh.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import uvicorn

_BODY = json.dumps({"success": True, "data": {"request_id": 1}}).encode()
_HEADERS = [(b"content-type", b"application/json")]
_stats: dict[str, Any] = {"count": 0, "first": None, "last": None}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Read the body, count the request, answer 200 (or the stats)."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = _BODY if scope["path"] != "/stats" else _take_stats()
    headers = [*_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _take_stats() -> bytes:
    global _stats
    taken, _stats = _stats, {"count": 0, "first": None, "last": None}
    return json.dumps(taken).encode()


def _count() -> None:
    now = time.time()
    _stats["count"] += 1
    _stats["first"] = _stats["first"] or now
    _stats["last"] = now


async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """`app`, counting every request but /stats."""
    if scope["type"] == "http" and scope["path"] != "/stats":
        _count()
    await app(scope, receive, send)


def main() -> None:
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that name it,
    # and without it each answer's second write waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is announced: early connections wait in the backlog.
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(
        counted, log_level="warning", access_log=False, lifespan="off"
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
