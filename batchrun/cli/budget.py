"""Where the read commands find a client's budget in use and what was learned of
its limits: its ledger (SQLite in the state folder, or Redis), opened to read
(to write only for `limits --forget`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from batchrun.core.clock import MachineClock, wall_time
from batchrun.core.limits import LimitKey, Rule
from batchrun.ledgers.shared_ledger import open_shared_ledger
from batchrun.pacing.learning.lessons import Lesson
from batchrun.pacing.learning.storage import recalled
from batchrun.pacing.ledger import Ledger
from batchrun.store.paths import StatePaths


@dataclass(frozen=True, slots=True)
class Budget:
    """Where a client's budget in use, and what was learned of its limits, are
    read: its ledger."""

    paths: StatePaths
    client: str
    ledger_url: str | None = field(repr=False)  # may hold a password
    # --profile auto: the rule a key is planned by until the server settles it.
    fallback: dict[LimitKey, Rule] = field(default_factory=dict)
    # --time-scale: the windows the rules were divided by (lessons are kept
    # unscaled, and read back scaled alike).
    time_scale: float = 1.0


@contextmanager
def opened(
    budget: Budget, now: float | None = None, *, read_only: bool = True
) -> Iterator[Ledger]:
    """The client's ledger, read at `now` (default: the time it is opened)."""
    at = MachineClock().now() if now is None else now
    ledger = open_shared_ledger(
        budget.ledger_url,
        state=budget.paths,
        client=budget.client,
        hold=0.0,
        now=lambda: at,
        read_only=read_only,
    )
    try:
        yield ledger
    finally:
        ledger.close()


def in_force(key: LimitKey, rule: Rule, text: str | None, budget: Budget) -> Lesson:
    """The rule a run of `key` would pace by: what was learned of it (`text`, as
    kept), if anything under this very rule, else `rule` (no evidence)."""
    lesson = recalled(rule, text, time_scale=budget.time_scale, now=wall_time())
    if lesson is not None:
        return lesson
    return Lesson(budget.fallback.get(key, rule), "")
