"""What `status` and `plan` report: a run's standing, and how long what is left takes.

Both read the run store and the client's ledger; neither sends anything. Durations
come from the limits (`slots.eta` over the jobs left and the ledger's recent use),
the same rule the pacer grants by.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from batchrun.jobs import read_jobs
from batchrun.ledger import Ledger
from batchrun.limits import LimitKey, Rule, read_table
from batchrun.paths import StatePaths
from batchrun.shared_ledger import open_shared_ledger
from batchrun.slots import Pace, eta
from batchrun.state import Failure, JobState, RunStore

_SETTLED = {JobState.DONE, JobState.FAILED, JobState.UNKNOWN}


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """One endpoint: jobs left, its rule, the budget in use now, and the time left."""

    key: LimitKey
    jobs: int
    rule: Rule
    used: list[tuple[str, int]]
    seconds: float


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
    with RunStore(found) as store:
        states: dict[LimitKey, dict[JobState, int]] = {}
        for (key, state), n in sorted(store.counts().items()):
            states.setdefault(key, {})[state] = n
        rules = read_table(store.get_meta("rules") or "{}")
        pace = Pace(store.get_meta("pace") or Pace.EXACT)
        failures = store.failures()
    pending = {
        k: s.get(JobState.PENDING, 0) + s.get(JobState.IN_FLIGHT, 0)
        for k, s in states.items()
    }
    keys = _plans(pending, rules, pace, _Budget(paths, found.stem, ledger_url))
    return Status(found, states, failures, keys)


def plan(
    jobs_file: Path,
    rules: dict[LimitKey, Rule],
    pace: Pace,
    paths: StatePaths,
    client: str,
    *,
    ledger_url: str | None = None,
) -> list[KeyPlan]:
    """How long the jobs of `jobs_file` not yet settled take under `rules` now."""
    jobs = read_jobs(jobs_file)
    settled: set[str] = set()
    found = _store_path(paths, jobs_file, client)
    if found is not None:
        with RunStore(found) as store:
            settled = store.ids_in(_SETTLED)
    left = Counter(job.key for job in jobs if job.id not in settled)
    return _plans(dict(left), rules, pace, _Budget(paths, client, ledger_url))


@dataclass(frozen=True, slots=True)
class _Budget:
    """Where a client's budget in use is read: its ledger."""

    paths: StatePaths
    client: str
    ledger_url: str | None = field(repr=False)  # may hold a password


def _plans(
    left: dict[LimitKey, int],
    rules: dict[LimitKey, Rule],
    pace: Pace,
    budget: _Budget,
) -> list[KeyPlan]:
    now = time.time()
    ledger = open_shared_ledger(
        budget.ledger_url,
        state=budget.paths,
        client=budget.client,
        hold=0.0,
        now=lambda: now,
    )
    try:
        return [
            _plan(key, n, rules[key], pace, ledger, now)
            for key, n in sorted(left.items())
            if n and key in rules
        ]
    finally:
        ledger.close()


def _plan(
    key: LimitKey, jobs: int, rule: Rule, pace: Pace, ledger: Ledger, now: float
) -> KeyPlan:
    usage = ledger.usage(key.value, rule)
    used = [
        (
            str(w),
            usage.in_flight + sum(1 for t in usage.finished if t > now - w.seconds),
        )
        for w in rule.windows
    ]
    moment = eta(jobs, rule, now=now, pace=pace, recent=usage.finished)
    return KeyPlan(key, jobs, rule, used, max(0.0, moment - now))


def _store_path(paths: StatePaths, jobs_file: Path, client: str | None) -> Path | None:
    folder = paths.run_folder(jobs_file)
    if client is not None:
        path = folder / f"{client}.db"
        return path if path.exists() else None
    stores = sorted(folder.glob("*.db"), key=lambda p: p.stat().st_mtime)
    return stores[-1] if stores else None
