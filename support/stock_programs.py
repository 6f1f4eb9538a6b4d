"""Stock server-side limiters on loopback, in front of the API's three endpoints.

Each context manager starts one real limiter on a free 127.0.0.1 port, yields a
`Server` (base URL, arrival log), and stops it on exit, every step bounded in time:

- `nginx_server(rate="15r/s", burst=10, nodelay=True)`: nginx `limit_req` (a leaky
  bucket counted in milliseconds), a non-daemon child with a generated config in a
  temporary folder; accepted requests get `return 200` JSON, refused ones
  `limit_req_status 429` and an `error_page` with the API's JSON body; the arrival
  log is its access log (`$msec $request_time $status`).
- `express_server(window_ms=2000, limit=10, standard_headers="draft-7")`:
  express-rate-limit's default MemoryStore (support/express/server.js, its packages
  installed by `npm ci` on first use); the log is its `GET /__arrivals`.
- `limits_server(rule, strategy=..., headers=...)`: Python `limits` behind
  Starlette, from support/stock.py (the e2e tests use it without the bench extra).

Invariant: every request the limiter answered is in `Server.arrivals()`, with its
arrival and answer times (Unix seconds) and status, whatever the answer. Each
endpoint is limited on its own, all three by the same parameters. A limiter whose
program is missing raises `Unavailable`, saying what to install.
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx

from support.stock import TOO_MANY, Arrival, Server, limits_server

__all__ = ["Arrival", "Server", "Unavailable", "express_server", "limits_server"]

HERE = Path(__file__).resolve().parent
EXPRESS = HERE / "express"
Draft = Literal["draft-6", "draft-7", "draft-8"] | Literal[False]
_START_SECONDS = 10.0
_STOP_SECONDS = 5.0
_NPM_SECONDS = 180.0


class Unavailable(RuntimeError):
    """Raised when a stock limiter's program is not installed here."""


def _free_port() -> int:
    # nginx needs a port number in its config; the gap between closing this socket
    # and nginx binding it is a race only another local process could win.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _await_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            msg = f"nginx exited at start: {log.read_text(errors='replace')[-500:]}"
            raise RuntimeError(msg)
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), 0.2),
        ):
            return
        time.sleep(0.01)
    msg = f"nginx did not listen on {port} within {_START_SECONDS} s"
    raise RuntimeError(msg)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it lingers: a stock server never outlives its run."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(_STOP_SECONDS)


_NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    log_format arrivals '$msec $request_time $status $http_idempotency_key';
    access_log {dir}/access.log arrivals;
    default_type application/json;
    limit_req_status 429;
    {zones}
    server {{
        listen 127.0.0.1:{port};
        root {dir}/empty;
        error_page 429 @too_many;
        location @too_many {{ return 429 '{too_many}'; }}
        # `return` runs in the rewrite phase, before limit_req (preaccess): the
        # accepted answer comes from a named location that try_files reaches after.
        location @accepted {{ return 200 '{{"success": true, "data": {{}}}}'; }}
        {locations}
    }}
}}
"""
_NGINX_PATHS = {
    "run_query": "~ ^/teams/[^/]+/data/run-query$",
    "invite": "~ ^/teams/[^/]+/members/invite$",
    "avatar": "= /users/me/avatar",
}


def nginx_config(folder: Path, port: int, rate: str, burst: int, nodelay: bool) -> str:
    """The whole nginx.conf: one `limit_req_zone` per endpoint, keyed by address."""
    zones = " ".join(
        f"limit_req_zone $binary_remote_addr zone={zone}:1m rate={rate};"
        for zone in _NGINX_PATHS
    )
    # nginx refuses `burst=0`: no burst allowance is written by leaving it out.
    delay = (f" burst={burst}" if burst else "") + (" nodelay" if nodelay else "")
    locations = " ".join(
        f"location {match} {{ limit_req zone={zone}{delay}; "
        "try_files /__none @accepted; }"
        for zone, match in _NGINX_PATHS.items()
    )
    return _NGINX_CONF.format(
        dir=folder,
        port=port,
        zones=zones,
        locations=locations,
        too_many=json.dumps(TOO_MANY),
    )


def _nginx_arrivals(log: Path) -> list[Arrival]:
    """The access log: `$msec $request_time $status $http_idempotency_key`."""
    arrivals = []
    for line in log.read_text().splitlines():
        msec, took, status, key = line.split(" ", 3)
        answered = float(msec)
        arrivals.append(
            Arrival(
                answered - float(took),
                int(status),
                answered,
                None if key == "-" else key,
            )
        )
    return sorted(arrivals, key=lambda a: a.at)


@contextlib.contextmanager
def nginx_server(
    *, rate: str = "15r/s", burst: int = 10, nodelay: bool = True
) -> Iterator[Server]:
    """nginx `limit_req` with `rate` (`15r/s`, `30r/m`), `burst`, and `nodelay`."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        msg = "nginx is not installed: apt-get update && apt-get install -y nginx-light"
        raise Unavailable(msg)
    with tempfile.TemporaryDirectory(prefix="stock-nginx-") as name:
        folder = Path(name)
        (folder / "empty").mkdir()
        port = _free_port()
        conf = folder / "nginx.conf"
        conf.write_text(nginx_config(folder, port, rate, burst, nodelay))
        (folder / "access.log").touch()
        command = [binary, "-p", name, "-c", str(conf), "-e", str(folder / "error.log")]
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _await_port(port, process, folder / "error.log")
            what = f"nginx limit_req rate={rate} burst={burst}" + (
                " nodelay" if nodelay else ""
            )
            yield Server(
                f"http://127.0.0.1:{port}",
                lambda: _nginx_arrivals(folder / "access.log"),
                what,
            )
        finally:
            _stop(process)


def _npm_ci() -> None:
    """Install express and express-rate-limit from the committed lock file, once."""
    if (EXPRESS / "node_modules" / "express-rate-limit").is_dir():
        return
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        msg = "express-rate-limit needs node and npm: apt-get install -y nodejs npm"
        raise Unavailable(msg)
    command = [npm, "ci", "--no-audit", "--no-fund", "--silent"]
    subprocess.run(command, cwd=EXPRESS, check=True, timeout=_NPM_SECONDS)


def _announced_port(process: subprocess.Popen[bytes]) -> int:
    """The `{"port": N}` line server.js prints once it listens."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], _START_SECONDS)
    line = process.stdout.readline() if ready else b""
    if not line:
        msg = f"express-rate-limit did not start within {_START_SECONDS} s"
        raise RuntimeError(msg)
    port: int = json.loads(line)["port"]
    return port


def _express_arrivals(url: str) -> list[Arrival]:
    rows = httpx.get(f"{url}/__arrivals", timeout=_START_SECONDS).json()
    return sorted((Arrival(*row) for row in rows), key=lambda a: a.at)


@contextlib.contextmanager
def express_server(
    *, window_ms: int = 2000, limit: int = 10, standard_headers: Draft = "draft-7"
) -> Iterator[Server]:
    """express-rate-limit 7 (MemoryStore): `windowMs`, `limit`, `standardHeaders`."""
    _npm_ci()
    options = {
        "windowMs": window_ms,
        "limit": limit,
        "standardHeaders": standard_headers,
    }
    command = ["node", str(EXPRESS / "server.js"), json.dumps(options)]
    pipe = subprocess.PIPE
    # Popen as a context closes the stdout pipe once the child is gone.
    with subprocess.Popen(command, stdout=pipe, stderr=subprocess.DEVNULL) as process:
        try:
            url = f"http://127.0.0.1:{_announced_port(process)}"
            what = f"express-rate-limit {limit}/{window_ms}ms {standard_headers}"
            yield Server(url, lambda: _express_arrivals(url), what)
        finally:
            _stop(process)
