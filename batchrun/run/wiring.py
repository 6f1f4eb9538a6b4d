"""The one wiring of a run that `submit`, the benchmarks and the tests share: a
`Runner` over a `Client` of a `Target` and a `Pacer` over a ledger."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchrun.api.client import Client
from batchrun.core.clock import Clock
from batchrun.core.events import EventSink, RunTally
from batchrun.core.identity import Identity
from batchrun.core.limits import LimitKey, Rule
from batchrun.pacing.ledger import Ledger
from batchrun.pacing.pacer import Pacer
from batchrun.run.runner import Runner
from batchrun.run.settings import Settings, connections
from batchrun.run.settlement import Recorder


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where requests go: the client's base URL, through `transport` if given
    (the in-process sandbox, a test double), else over the network.

    Raises:
        ValueError: an identity with no base URL (a target sends somewhere).
    """

    identity: Identity
    timeout: float
    transport: Any = None
    ca_bundle: Path | None = None

    def __post_init__(self) -> None:
        if self.identity.base_url is None:
            msg = "a Target needs its identity's base URL"
            raise ValueError(msg)

    @property
    def base_url(self) -> str:
        """The identity's base URL (checked when built)."""
        return self.identity.base_url or ""


@contextlib.asynccontextmanager
async def open_run(
    target: Target,
    *,
    rules: Mapping[LimitKey, Rule],
    settings: Settings,
    ledger: Ledger,
    clock: Clock,
    sink: EventSink,
    recorder: Recorder,
    scope: str,
    rng: random.Random | None = None,
    tally: RunTally | None = None,
) -> AsyncIterator[Runner]:
    """A Runner wired to a Client of `target` and a Pacer over `ledger`: the one
    wiring that `submit`, the benchmarks and the tests share.

    `scope` names the jobs file in each job's Idempotency-Key; `tally`, the
    run's counts, is one its view reads too (`Runner`'s own if not given).
    """
    client = Client(
        base_url=target.base_url,
        token=target.identity.token,
        scope=scope,
        timeout=target.timeout,
        connections=connections(settings),
        waits={key: rule.longest for key, rule in rules.items()},
        retry_after_cap=settings.retry_after_cap,
        transport=target.transport,
        ca_bundle=target.ca_bundle,
    )
    pacer = Pacer(
        rules=rules,
        ledger=ledger,
        clock=clock,
        pace=settings.pace,
        sink=sink,
    )
    async with client:
        yield Runner(
            sender=client,
            pacer=pacer,
            clock=clock,
            sink=sink,
            recorder=recorder,
            settings=settings,
            rng=rng,
            tally=tally,
        )
