"""Test doubles shared by several test modules."""

from __future__ import annotations

import random

import anyio
import httpx

from batchrun.core.clock import LoopClock
from batchrun.core.identity import Identity
from batchrun.pacing.ledger import MemoryLedger
from batchrun.run.settings import Settings
from batchrun.run.wiring import Target, open_run
from support.doubles import ListRecorder

BASE = "https://api.example.test"


def make_runner(
    router,
    rules,
    sink,
    *,
    recorder=None,
    token=None,
    timeout=30.0,
    ledger=None,
    tally=None,
    **settings,
):
    """An async context of a Runner (`wiring.open_run`) over a respx router,
    on the test's (virtual) clock."""
    target = Target(
        identity=Identity(base_url=BASE, token=token),
        timeout=timeout,
        transport=httpx.MockTransport(router.async_handler),
    )
    return open_run(
        target,
        rules=rules,
        settings=Settings(**settings),
        ledger=ledger or MemoryLedger(),
        clock=LoopClock(),
        sink=sink,
        recorder=recorder or ListRecorder(),
        scope="f",
        rng=random.Random(1),
        tally=tally,
    )


class Latency(httpx.AsyncBaseTransport):
    """Half a round trip before the server sees a request, half after it answers,
    so that requests overlap in flight as they do over a network."""

    def __init__(self, inner: httpx.AsyncBaseTransport, rtt: float) -> None:
        self._inner, self._half = inner, rtt / 2

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await anyio.sleep(self._half)
        response = await self._inner.handle_async_request(request)
        await anyio.sleep(self._half)
        return response
