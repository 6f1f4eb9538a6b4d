"""The sandbox as a case's server: every request logged, answers held, faults timed.

`serving` puts the sandbox app (`batchrun.sandbox.app.create_app`, the API's
documented 429s) on a loopback port with uvicorn, wrapped in `Recorder`, an ASGI
middleware that adds what a case needs and the sandbox does not have:

- `latency`: an accepted request is answered that many seconds after it arrived
  (an expensive query). The sandbox admits and counts it on arrival, as a server
  counts a request; a refused one is answered at once (a 429 costs no work);
- `retry_after=False`: the Retry-After field is taken off every answer;
- `faults_for`: the sandbox's injected faults (`Faults`, e.g. 5 % of accepted
  requests answered 429) stop that many seconds after they start, `faults_from`
  seconds after the first arrival (a gateway's outage: every request answered
  429 for 0.2 s).

`Recorder.log` holds every request as the server saw it (wall clock, Unix seconds):
its arrival, when its answer was sent, its status (0: no answer) and its
Idempotency-Key.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchrun.core.limits import LimitKey, Rule
from batchrun.sandbox.app import create_app
from batchrun.sandbox.faults import Faults
from batchrun.sandbox.policy_headers import HeaderStyle
from batchrun.sandbox.serving import running


@dataclass(frozen=True, slots=True)
class Served:
    """One request as the server saw it."""

    at: float
    answered: float
    status: int
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What the wrapper adds to the sandbox's answers."""

    latency: float = 0.0
    retry_after: bool = True
    faults_for: float | None = None
    faults_from: float = 0.0


class Recorder:
    """ASGI middleware: logs every request, holds accepted answers, times faults."""

    def __init__(self, app: ASGIApp, sandbox: Any, behaviour: Behaviour) -> None:
        self.app = app
        self.sandbox = sandbox
        self.behaviour = behaviour
        self.log: list[Served] = []
        self.url = ""
        self._first: float | None = None
        # The faults to inject while their time lasts (a stock server has none).
        self._faults = Faults() if sandbox is None else sandbox.faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        at = time.time()
        self._time_faults(at)
        status = 0
        logged = False
        key = dict(scope["headers"]).get(b"idempotency-key")

        def log() -> None:
            nonlocal logged
            if not logged:
                logged = True
                self.log.append(Served(at, time.time(), status, key and key.decode()))

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status != 429:
                    await anyio.sleep(
                        max(0.0, at + self.behaviour.latency - time.time())
                    )
                if not self.behaviour.retry_after:
                    message = {**message, "headers": _without_retry_after(message)}
            elif not message.get("more_body", False):
                log()  # before the client can read the answer
            await send(message)

        try:
            await self.app(scope, receive, answer)
        finally:
            log()

    def _time_faults(self, at: float) -> None:
        if self._first is None:
            self._first = at
        if self.sandbox is None:
            return
        since = at - self._first - self.behaviour.faults_from
        limit = self.behaviour.faults_for
        on = since >= 0 and (limit is None or since < limit)
        self.sandbox.faults = self._faults if on else Faults()


def _without_retry_after(message: Message) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in message["headers"] if k.lower() != b"retry-after"]


@contextlib.contextmanager
def serving(
    rules: Mapping[LimitKey, Rule],
    behaviour: Behaviour,
    *,
    faults: Faults | None = None,
    headers: HeaderStyle = HeaderStyle.NONE,
) -> Iterator[Recorder]:
    """The wrapped sandbox on a free loopback port; its `url` is set while open."""
    app = create_app(rules=rules, faults=faults, headers=headers)
    recorder = Recorder(app, app.state.sandbox, behaviour)
    with running(recorder) as url:
        recorder.url = url
        yield recorder
