"""Where the read commands find a client's budget in use and what was learned of
its limits: its ledger (SQLite in the state folder, or Redis), opened to read
(to write only for `limits --forget`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from batchrun.core.clock import MachineClock, wall_time
from batchrun.core.limits import LimitKey, Pace, Rule
from batchrun.ledgers.shared_ledger import open_shared_ledger
from batchrun.pacing.kept import Kept, learned_when, read_lesson
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


@dataclass(frozen=True, slots=True)
class InForce:
    """The rule a run of a key would pace by, evenly or not, and, if it was
    learned of the server, why and its lifetime (`kept`)."""

    rule: Rule
    spread: bool = False
    evidence: str = ""
    kept: Kept | None = None


def in_force(key: LimitKey, rule: Rule, text: str | None, budget: Budget) -> InForce:
    """The rule a run of `key` would pace by: what was learned of it (`text`, as
    kept) while it lives, if learned under this very rule; else `rule` (or the
    safer one --profile auto starts from)."""
    now = wall_time()
    kept = read_lesson(text, given=rule, time_scale=budget.time_scale, now=now)
    if kept is None or kept.expired(now):
        return InForce(budget.fallback.get(key, rule))
    candidate = kept.candidate
    spread = candidate.pace is Pace.SPREAD
    why = f"learned {learned_when(kept)}: {kept.why}"
    return InForce(candidate.rule, spread, why, kept)
