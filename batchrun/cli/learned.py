"""What `batchrun limits` reports and forgets: each key's rule for a client, and
what was learned of its server (a lesson, and until when it is kept).

It reads the client's ledger, where runs keep both; nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchrun.cli.budget import Budget, in_force, opened
from batchrun.core.limits import LimitKey, Rule
from batchrun.pacing.kept import RECORD_SUFFIX
from batchrun.store.paths import StatePaths


@dataclass(frozen=True, slots=True)
class KeyLimit:
    """One key's limit for a client: the rule given (profile or --limit), the rule
    a run paces by, and, if that was learned from the server, why and until
    when it is kept (wall clock: then runs try faster rules again)."""

    key: LimitKey
    given: Rule
    rule: Rule
    spread: bool
    learned: str | None
    until: float | None = None


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
            force = in_force(key, rule, ledger.recall(key.value), budget)
            until = None if force.kept is None else force.kept.expires
            why = force.evidence or None
            found.append(KeyLimit(key, rule, force.rule, force.spread, why, until))
    return found


def forget(
    keys: list[LimitKey], paths: StatePaths, client: str, *, ledger_url: str | None
) -> list[LimitKey]:
    """Forget what was learned of `keys`' limits for `client`, and what the
    server was seen to accept: the next run starts from the rule given; return
    the keys that had anything learned."""
    forgotten = []
    with opened(Budget(paths, client, ledger_url), read_only=False) as ledger:
        for key in keys:
            had = False
            for name in (key.value, f"{key.value}{RECORD_SUFFIX}"):
                if ledger.recall(name) not in (None, "{}"):
                    ledger.remember(name, "{}")
                    had = had or name == key.value
            if had:
                forgotten.append(key)
    return forgotten
