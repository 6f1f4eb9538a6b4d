"""Fixtures shared by every test: a clean environment, the anyio backend, and a
real redis-server of the tests' own on loopback (no fakes for the Redis ledger)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import redis
import trustme

from batchrun.core.limits import limit_table
from batchrun.sandbox.app import Sandbox, create_app
from batchrun.sandbox.serving import running

# Read at import: `clean_environ` strips BATCHRUN_* from every test.
REQUIRE_REDIS = os.environ.get("BATCHRUN_REQUIRE_REDIS") == "1"
REDIS_PASSWORD = "s3cret-ledger-pw"


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No BATCHRUN_* setting or user config file leaks into a test, and state stays
    in its tmp_path."""
    for name in list(os.environ):
        if name.startswith("BATCHRUN_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BATCHRUN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user-config"))


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio unless a module asks for trio's virtual clock."""
    return "asyncio"


@dataclass(frozen=True)
class RedisServer:
    """A running redis-server: its port and URL (with the password in it)."""

    port: int
    # The server's process, when the test owns it (to kill it).
    process: subprocess.Popen[bytes] | None = field(default=None, compare=False)
    # The CA that signed its certificate, when it speaks TLS only.
    ca: Path | None = None

    @property
    def url(self) -> str:
        if self.ca is None:
            return f"redis://:{REDIS_PASSWORD}@127.0.0.1:{self.port}/0"
        where = f"127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"
        return f"rediss://:{REDIS_PASSWORD}@{where}"

    def connect(self) -> Any:
        # Any: redis-py types a sync client's replies as `Awaitable | Any`.
        tls: dict[str, Any] = {}
        if self.ca is not None:
            tls = {"ssl": True, "ssl_ca_certs": str(self.ca)}
        return redis.Redis("127.0.0.1", self.port, password=REDIS_PASSWORD, **tls)


def free_port() -> int:
    """A loopback port nothing listens on (free when asked)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _no_redis(reason: str) -> None:
    message = f"REDIS TESTS NOT RUN: {reason} (apt-get install redis-server)"
    if REQUIRE_REDIS:
        pytest.fail(f"{message}; BATCHRUN_REQUIRE_REDIS=1 makes that a failure")
    pytest.skip(message)


def _tls_args(folder: Path, port: int) -> tuple[list[str], Path]:
    """Arguments for TLS only on `port`, with a certificate for 127.0.0.1 signed
    by a CA made here (trustme); and that CA's file."""
    ca, files = trustme.CA(), {n: folder / f"{n}.pem" for n in ("ca", "cert", "key")}
    issued = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(files["ca"]))
    issued.cert_chain_pems[0].write_to_path(str(files["cert"]))
    issued.private_key_pem.write_to_path(str(files["key"]))
    args = ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
    for name, option in (("cert", "cert"), ("key", "key"), ("ca", "ca-cert")):
        args += [f"--tls-{option}-file", str(files[name])]
    return args, files["ca"]


def _started(folder: Path, *, tls: bool) -> tuple[subprocess.Popen[bytes], RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        _no_redis("no redis-server binary on PATH")
    server = RedisServer(free_port())
    args = ["--port", str(server.port)]
    if tls:
        args, ca = _tls_args(folder, server.port)
        server = replace(server, ca=ca)
    # No persistence, loopback only: nothing outlives the test session.
    args += ["--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--dir", str(folder)]
    args += ["--requirepass", REDIS_PASSWORD]
    process = subprocess.Popen([str(binary), *args], stdout=subprocess.DEVNULL)
    return process, replace(server, process=process)


def _wait_ready(server: RedisServer) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            server.connect().ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextmanager
def redis_process(folder: Path, *, tls: bool = False) -> Iterator[RedisServer]:
    """A redis-server of its own on a free loopback port (TLS only if `tls`),
    stopped on leaving."""
    folder.mkdir(parents=True, exist_ok=True)
    process, server = _started(folder, tls=tls)
    try:
        _wait_ready(server)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server for the whole session (tests that need none skip it)."""
    with redis_process(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis, emptied for this test."""
    redis_server.connect().flushall()
    return redis_server.url


@pytest.fixture
def api() -> Iterator[tuple[str, Sandbox]]:
    """The sandbox served on loopback: its URL and what it saw."""
    server = create_app(rules=limit_table())
    with running(server) as url:
        yield url, server.state.sandbox
