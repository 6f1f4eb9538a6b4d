"""What `status` and `plan` report: a run's standing, and how long what is left takes.

Both read the run store and the client's ledger; neither sends anything. Durations
come from the limits (`slots.eta` over the jobs left and the ledger's recent use),
the same rule the pacer grants by.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from batchrun.jobs import read_jobs
from batchrun.learning import Lesson, recalled
from batchrun.ledger import Ledger
from batchrun.limits import LimitKey, Rule, read_keys, read_table
from batchrun.paths import StatePaths
from batchrun.shared_ledger import open_shared_ledger
from batchrun.slots import Pace, eta
from batchrun.state import Failure, JobState, RunStore

_SETTLED = {JobState.DONE, JobState.FAILED, JobState.UNKNOWN}


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """One endpoint: jobs left, the rule in force, the budget in use now, and the
    time left; `learned` says why, if the rule was learned from the server."""

    key: LimitKey
    jobs: int
    rule: Rule
    used: list[tuple[str, int]]
    seconds: float
    learned: str | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """Where a jobs file's latest run stands."""

    store: Path | None
    states: dict[LimitKey, dict[JobState, int]] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    keys: list[KeyPlan] = field(default_factory=list)


def status(
    jobs_file: Path,
    paths: StatePaths,
    client: str | None,
    *,
    ledger_url: str | None = None,
) -> Status:
    """The latest run of `jobs_file` (for `client`, if given); the budget in use is
    read from the ledger at `ledger_url` (None: SQLite in `paths`)."""
    found = _store_path(paths, jobs_file, client)
    if found is None:
        return Status(None)
    with RunStore(found, read_only=True) as store:
        states: dict[LimitKey, dict[JobState, int]] = {}
        for (key, state), n in sorted(store.counts().items()):
            states.setdefault(key, {})[state] = n
        rules = read_table(store.get_meta("rules") or "{}")
        pace = Pace(store.get_meta("pace") or Pace.EXACT)
        told = read_keys(store.get_meta("told") or "")
        fallback = read_table(store.get_meta("fallback") or "{}")
        failures = store.failures()
    pending = {
        k: s.get(JobState.PENDING, 0) + s.get(JobState.IN_FLIGHT, 0)
        for k, s in states.items()
    }
    budget = _Budget(paths, found.stem, ledger_url, told, fallback)
    keys = _plans(pending, rules, pace, budget)
    return Status(found, states, failures, keys)


def plan(
    jobs_file: Path,
    rules: dict[LimitKey, Rule],
    pace: Pace,
    paths: StatePaths,
    client: str,
    *,
    ledger_url: str | None = None,
    told: frozenset[LimitKey] = frozenset(),
    fallback: dict[LimitKey, Rule] | None = None,
) -> list[KeyPlan]:
    """How long the jobs of `jobs_file` not yet settled take under `rules` now,
    or under what was learned of a key's limit unless its rule was `told`."""
    jobs = read_jobs(jobs_file)
    settled: set[str] = set()
    found = _store_path(paths, jobs_file, client)
    if found is not None:
        with RunStore(found, read_only=True) as store:
            settled = store.ids_in(_SETTLED)
    left = Counter(job.key for job in jobs if job.id not in settled)
    budget = _Budget(paths, client, ledger_url, told, fallback or {})
    return _plans(dict(left), rules, pace, budget)


@dataclass(frozen=True, slots=True)
class _Budget:
    """Where a client's budget in use, and what was learned of its limits, are
    read: its ledger; `told` keys keep the rule they were given."""

    paths: StatePaths
    client: str
    ledger_url: str | None = field(repr=False)  # may hold a password
    told: frozenset[LimitKey] = frozenset()
    # --profile auto: the rule a key is planned by until the server settles it.
    fallback: dict[LimitKey, Rule] = field(default_factory=dict)


def _plans(
    left: dict[LimitKey, int],
    rules: dict[LimitKey, Rule],
    pace: Pace,
    budget: _Budget,
) -> list[KeyPlan]:
    now = time.time()
    with _ledger(budget, now) as ledger:
        return [
            _plan(key, n, _in_force(key, rules[key], ledger, budget), pace, ledger, now)
            for key, n in sorted(left.items())
            if n and key in rules
        ]


@contextmanager
def _ledger(
    budget: _Budget, now: float | None = None, *, read_only: bool = True
) -> Iterator[Ledger]:
    """The client's ledger, read at `now` (default: the time it is opened)."""
    at = time.time() if now is None else now
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


def _in_force(key: LimitKey, rule: Rule, ledger: Ledger, budget: _Budget) -> Lesson:
    """The rule a run of `key` would pace by: what was learned of it, if anything
    (and not overridden), else `rule` (as a lesson of no evidence)."""
    if key not in budget.told:
        lesson = recalled(rule, ledger.recall(key.value), time_scale=1.0)
        if lesson is not None:
            return lesson
    return Lesson(budget.fallback.get(key, rule), "")


def _plan(
    key: LimitKey, jobs: int, force: Lesson, pace: Pace, ledger: Ledger, now: float
) -> KeyPlan:
    rule = force.rule
    pace = Pace.SPREAD if force.spread else pace
    usage = ledger.usage(key.value, rule)
    used = [
        (
            str(w),
            usage.in_flight + sum(1 for t in usage.finished if t > now - w.seconds),
        )
        for w in rule.windows
    ]
    moment = eta(jobs, rule, now=now, pace=pace, recent=usage.finished)
    learned = force.evidence or None
    return KeyPlan(key, jobs, rule, used, max(0.0, moment - now), learned)


def _store_path(paths: StatePaths, jobs_file: Path, client: str | None) -> Path | None:
    folder = paths.run_folder(jobs_file)
    if client is not None:
        path = folder / f"{client}.db"
        return path if path.exists() else None
    stores = sorted(folder.glob("*.db"), key=lambda p: p.stat().st_mtime)
    return stores[-1] if stores else None


@dataclass(frozen=True, slots=True)
class KeyLimit:
    """One key's limit for a client: the rule given (profile or --limit), the rule
    a run paces by, and, if that was learned from the server, when and why."""

    key: LimitKey
    given: Rule
    rule: Rule
    spread: bool
    learned: str | None


def limits(
    rules: dict[LimitKey, Rule],
    paths: StatePaths,
    client: str,
    *,
    ledger_url: str | None = None,
    told: frozenset[LimitKey] = frozenset(),
    fallback: dict[LimitKey, Rule] | None = None,
) -> list[KeyLimit]:
    """Each key's limit for `client`, as the next run would pace it (or plan it,
    under --profile auto until the server settles which statement holds)."""
    budget = _Budget(paths, client, ledger_url, told, fallback or {})
    rules = {key: rules[key] for key in LimitKey if key in rules}
    with _ledger(budget) as ledger:
        found = [
            (key, _in_force(key, rule, ledger, budget)) for key, rule in rules.items()
        ]
    return [
        KeyLimit(key, rules[key], force.rule, force.spread, force.evidence or None)
        for key, force in found
    ]


def forget(
    keys: list[LimitKey], paths: StatePaths, client: str, *, ledger_url: str | None
) -> None:
    """Forget what was learned of `keys`' limits for `client`: the next run starts
    from the rule given again."""
    with _ledger(_Budget(paths, client, ledger_url), read_only=False) as ledger:
        for key in keys:
            ledger.remember(key.value, "{}")
