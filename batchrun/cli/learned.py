"""What `batchrun limits` reports and forgets: each key's rule for a client, and
what was learned of its server (a lesson, and whether it counts its 429s).

It reads the client's ledger, where runs keep both; nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchrun.cli.budget import Budget, in_force, opened
from batchrun.core.clock import wall_time
from batchrun.core.limits import LimitKey, Pace, Rule
from batchrun.pacing import room
from batchrun.pacing.learning.retest import cadence
from batchrun.store.paths import StatePaths


@dataclass(frozen=True, slots=True)
class KeyLimit:
    """One key's limit for a client: the rule given (profile or --limit), the rule
    a run paces by, and, if that was learned from the server, when and why."""

    key: LimitKey
    given: Rule
    rule: Rule
    spread: bool
    learned: str | None
    # Wall-clock seconds: when the server last confirmed the lesson, and when
    # the next run to start re-tests it (`retest.cadence`); None if none.
    confirmed: float | None = None
    retest: float | None = None
    # Whether the server counts the requests it refuses (`room`), and when that
    # was seen (wall clock); None: not seen (a run takes it that they count).
    refusals: tuple[bool, float] | None = None

    @property
    def refusals_free(self) -> bool:
        """Whether a run leaves the key's 429s out of its windows: the server
        was seen not to count them, and the rule in force is paced exactly."""
        pace = Pace.SPREAD if self.spread else Pace.EXACT
        seen_free = self.refusals is not None and not self.refusals[0]
        return seen_free and room.lifts(self.rule, pace)


def limits(
    rules: dict[LimitKey, Rule],
    paths: StatePaths,
    client: str,
    *,
    ledger_url: str | None = None,
    fallback: dict[LimitKey, Rule] | None = None,
) -> list[KeyLimit]:
    """Each key's limit for `client`, as the next run would pace it (or plan it,
    under --profile auto until the server settles which statement holds)."""
    budget = Budget(paths, client, ledger_url, fallback or {})
    rules = {key: rules[key] for key in LimitKey if key in rules}
    found = []
    with opened(budget) as ledger:
        for key, rule in rules.items():
            text = ledger.recall(key.value)
            force = in_force(key, rule, text, budget)
            kept = cadence(text) if force.evidence else None
            confirmed, retest = (None, None) if kept is None else kept
            why = force.evidence or None
            refusals = room.seen(ledger, key.value, now=wall_time())
            found.append(
                KeyLimit(
                    key,
                    rule,
                    force.rule,
                    force.spread,
                    why,
                    confirmed,
                    retest,
                    refusals,
                )
            )
    return found


def forget(
    keys: list[LimitKey], paths: StatePaths, client: str, *, ledger_url: str | None
) -> list[LimitKey]:
    """Forget what was learned of `keys`' limits for `client`, whether the server
    counts refusals too: the next run starts from the rule given; return the keys
    that had anything learned."""
    forgotten = []
    with opened(Budget(paths, client, ledger_url), read_only=False) as ledger:
        for key in keys:
            had = room.forget(ledger, key.value, now=wall_time())
            if ledger.recall(key.value) not in (None, "{}"):
                ledger.remember(key.value, "{}")
                had = True
            if had:
                forgotten.append(key)
    return forgotten
