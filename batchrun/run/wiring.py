"""The one wiring of a run that `submit`, the benchmarks and the tests share: a
`Runner` over a `Client` of a `Target` and a `Pacer` over a ledger."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchrun.api.client import Client
from batchrun.core.clock import Clock
from batchrun.core.events import EventSink
from batchrun.core.limits import LimitKey, Rule
from batchrun.pacing.ledger import Ledger
from batchrun.pacing.pacer import Pacer
from batchrun.run.runner import Runner
from batchrun.run.settings import Settings, connections
from batchrun.run.settlement import Recorder
from batchrun.store.paths import budget_fingerprint, client_fingerprint


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where requests go: a base URL, or the in-process sandbox (`transport`)."""

    base_url: str
    # Kept out of repr, so no message that shows a Target can show the token.
    token: str | None = field(repr=False)
    timeout: float
    transport: Any = None
    ca_bundle: Path | None = None
    # --budget-key: the budget's name, shared by every token that gives it.
    budget_key: str | None = None

    @property
    def client(self) -> str:
        """Whose budget the requests draw on: the budget key's, else the base
        URL's and token's."""
        if self.budget_key is not None:
            return budget_fingerprint(self.budget_key)
        return client_fingerprint(self.base_url, self.token)

    @property
    def is_sandbox(self) -> bool:
        return self.transport is not None


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
) -> AsyncIterator[Runner]:
    """A Runner wired to a Client of `target` and a Pacer over `ledger`: the one
    wiring that `submit`, the benchmarks and the tests share.

    `scope` names the jobs file in each job's Idempotency-Key.
    """
    client = Client(
        base_url=target.base_url,
        token=target.token,
        scope=scope,
        timeout=target.timeout,
        connections=connections(settings),
        waits={key: rule.longest for key, rule in rules.items()},
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
        )
