"""What the read commands report, read from the run stores and the client's ledger.

The read model of `status` (where a jobs file's latest run stands), `plan` (how
long what is left takes), `show` (one job) and `limits` (each key's rule for a
client, and what was learned of its server; `--forget` forgets it). Each opens a
run store read-only and the client's ledger (SQLite in the state folder, or
Redis) to read, to write only for `limits --forget`; nothing is sent, and the
command line only renders what these return. Durations come from the limits
(`slots.eta` over the jobs left and the ledger's recent use), the same rule the
pacer grants by.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from batchrun.core.clock import MachineClock, wall_time
from batchrun.core.errors import UsageError
from batchrun.core.events import ENDED, Status
from batchrun.core.limits import LimitKey, Pace, Rule, read_table
from batchrun.core.responses import Responses
from batchrun.jobs.job import read_jobs
from batchrun.ledgers.shared_ledger import open_shared_ledger
from batchrun.pacing.kept import RECORD_SUFFIX, Kept, read_lesson
from batchrun.pacing.ledger import Ledger
from batchrun.pacing.slots import eta
from batchrun.store.paths import StatePaths
from batchrun.store.results import default_results_path, last_result
from batchrun.store.runlock import is_held
from batchrun.store.state import Failure, JobRecord, Reason, RunStore

# How many ids `status` names for each reason jobs failed (--show less or all).
_FEW = 5


@dataclass(frozen=True, slots=True)
class _Budget:
    """Where a client's budget in use, and what was learned of its limits, are
    read: its ledger."""

    paths: StatePaths
    client: str
    ledger_url: str | None = field(repr=False)  # may hold a password
    # --profile auto: the rule a key is planned by until the server settles it.
    fallback: dict[LimitKey, Rule] = field(default_factory=dict)


@contextmanager
def _opened(
    budget: _Budget, now: float | None = None, *, read_only: bool = True
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
class _InForce:
    """The rule a run of a key would pace by, evenly or not, and, if it was
    learned of the server, why and its lifetime (`kept`)."""

    rule: Rule
    spread: bool = False
    kept: Kept | None = None


def _in_force(key: LimitKey, rule: Rule, text: str | None, budget: _Budget) -> _InForce:
    """The rule a run of `key` would pace by: what was learned of it (`text`, as
    kept) while it lives, if learned under this very rule; else `rule` (or the
    safer one --profile auto starts from)."""
    now = wall_time()
    kept = read_lesson(text, given=rule, now=now)
    if kept is None or kept.expired(now):
        return _InForce(budget.fallback.get(key, rule))
    candidate = kept.candidate
    spread = candidate.pace is Pace.SPREAD
    return _InForce(candidate.rule, spread, kept)


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """One endpoint: jobs left, the rule in force, the budget in use now, and the
    time left; `learned`: the lesson kept, if the rule was learned from the
    server."""

    key: LimitKey
    jobs: int
    rule: Rule
    used: list[tuple[str, int]]
    seconds: float
    learned: Kept | None = None
    # How many of `jobs` are request jobs (the others are of the key's type).
    requests: int = 0


@dataclass(frozen=True, slots=True)
class StatusReport:
    """Where a jobs file's latest run stands."""

    store: Path | None
    states: dict[LimitKey, dict[Status, int]] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    keys: list[KeyPlan] = field(default_factory=list)
    activity: Activity | None = None
    # The latest run's answers by status code and their latencies.
    responses: Responses = field(default_factory=Responses)
    # Failed and unknown jobs grouped by state and error.
    reasons: list[Reason] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Activity:
    """Whether a run is working on the file now, where its results go, and when
    it started and last wrote its store (Unix times; None: not known)."""

    active: bool
    results: str | None
    started_at: float | None
    last_activity: float | None


def _activity(store_path: Path, store: RunStore) -> Activity:
    # With WAL, a run's writes land in the -wal file first.
    written = [p.stat().st_mtime for p in _store_files(store_path) if p.exists()]
    started = store.get_meta("started_at")
    return Activity(
        active=is_held(store_path.parent),
        results=store.get_meta("results"),
        started_at=None if started is None else float(started),
        last_activity=max(written, default=None),
    )


def _store_files(store_path: Path) -> list[Path]:
    return [store_path, store_path.with_name(f"{store_path.name}-wal")]


def status(
    jobs_file: Path,
    paths: StatePaths,
    names: Sequence[str] = (),
    *,
    ledger_url: str | None = None,
    shown: int | None = 20,
) -> StatusReport:
    """The latest run of `jobs_file` (in the store of one of `names`, if given: an
    API's, then a legacy client's), with its first `shown` failures (None: all)
    and its failures by reason, each with its first few ids (`shown` at most);
    the budget in use is read from the ledger of the run's client at `ledger_url`
    (None: SQLite in `paths`).

    Raises:
        UsageError: when the file has no run (exit 2), saying why that may be.
    """
    found = _store_path(paths, jobs_file, names)
    if found is None:
        raise UsageError(_no_run(jobs_file, paths, names))
    with RunStore(found, read_only=True) as store:
        client = store.get_meta("client") or found.stem
        states: dict[LimitKey, dict[Status, int]] = {}
        for (key, state), n in sorted(store.counts().items()):
            states.setdefault(key, {})[state] = n
        rules = read_table(store.get_meta("rules") or "{}")
        pace = Pace(store.get_meta("pace") or Pace.EXACT)
        fallback = read_table(store.get_meta("fallback") or "{}")
        failures = store.failures(shown)
        reasons = store.reasons(None if shown is None else min(shown, _FEW))
        activity = _activity(found, store)
        responses = _responses(store.get_meta("responses"))
        requests = store.requests_left()
    pending = {
        k: s.get(Status.PENDING, 0) + s.get(Status.IN_FLIGHT, 0)
        for k, s in states.items()
    }
    budget = _Budget(paths, client, ledger_url, fallback)
    keys = _with_requests(_plans(pending, rules, pace, budget), requests)
    return StatusReport(found, states, failures, keys, activity, responses, reasons)


def _with_requests(
    plans: list[KeyPlan], requests: Mapping[LimitKey, int]
) -> list[KeyPlan]:
    """Each key's plan, saying how many of its jobs left are request jobs."""
    return [replace(item, requests=requests.get(item.key, 0)) for item in plans]


def _responses(text: str | None) -> Responses:
    try:
        return Responses.from_json(json.loads(text or "{}"))
    except ValueError:
        return Responses()


def failed_ids(found: StatusReport) -> set[str]:
    """The ids of the jobs that ended failed in the run `status` found."""
    assert found.store is not None
    with RunStore(found.store, read_only=True) as store:
        return store.ids_in([Status.FAILED])


@dataclass(frozen=True, slots=True)
class Shown:
    """One job: where it stands in the latest run, and its last results line."""

    store: Path
    job: JobRecord
    result: dict[str, Any] | None


def show(
    jobs_file: Path,
    job_id: str,
    paths: StatePaths,
    names: Sequence[str],
    results: Path | None = None,
) -> Shown:
    """Job `job_id` of the latest run of `jobs_file`, and its line in `results`
    (None: the results file the run recorded, else the default beside the file).

    Raises:
        UsageError: when the file has no run, or its run no such job (exit 2).
    """
    found = _store_path(paths, jobs_file, names)
    if found is None:
        raise UsageError(_no_run(jobs_file, paths, names))
    with RunStore(found, read_only=True) as store:
        job = store.job(job_id)
        recorded = store.get_meta("results")
    if results is None:
        results = Path(recorded) if recorded else default_results_path(jobs_file)
    if job is None:
        msg = f"{jobs_file}: its run has no job {job_id!r}. Check the id's spelling."
        raise UsageError(msg)
    return Shown(found, job, last_result(results, job_id))


def _no_run(jobs_file: Path, paths: StatePaths, names: Sequence[str]) -> str:
    if not jobs_file.is_file():
        return f"{jobs_file}: no such file, and no run of it in {paths.root}."
    whose = " for this --base-url" if names else ""
    return (
        f"{jobs_file}: no run yet{whose} in {paths.root} (--sandbox runs are kept "
        f"in {paths.sandbox().root}). `batchrun submit {jobs_file}` starts one."
    )


def plan(
    jobs_file: Path,
    rules: dict[LimitKey, Rule],
    pace: Pace,
    paths: StatePaths,
    client: str,
    *,
    ledger_url: str | None = None,
    fallback: dict[LimitKey, Rule] | None = None,
    names: Sequence[str] = (),
) -> list[KeyPlan]:
    """How long the jobs of `jobs_file` not yet settled (in the run of one of
    `names`, else the latest) take under `rules` now, or under what was learned
    of a key's limit under these very rules."""
    jobs = read_jobs(jobs_file)
    settled: set[str] = set()
    found = _store_path(paths, jobs_file, names)
    if found is not None:
        with RunStore(found, read_only=True) as store:
            settled = store.ids_in(ENDED)
    unsettled = [job for job in jobs if job.id not in settled]
    left = Counter(job.key for job in unsettled)
    requests = Counter(job.key for job in unsettled if job.method is not None)
    budget = _Budget(paths, client, ledger_url, fallback or {})
    return _with_requests(_plans(dict(left), rules, pace, budget), requests)


def ended_badly(
    jobs_file: Path, paths: StatePaths, names: Sequence[str] = ()
) -> tuple[int, int]:
    """How many jobs of the latest run of `jobs_file` ended failed, and unknown
    (what `plan` does not count, and a rerun sends only when asked)."""
    found = _store_path(paths, jobs_file, names)
    if found is None:
        return 0, 0
    with RunStore(found, read_only=True) as store:
        counts = store.counts()
    failed = sum(n for (_, s), n in counts.items() if s is Status.FAILED)
    unknown = sum(n for (_, s), n in counts.items() if s is Status.UNKNOWN)
    return failed, unknown


def _plans(
    left: dict[LimitKey, int],
    rules: dict[LimitKey, Rule],
    pace: Pace,
    budget: _Budget,
) -> list[KeyPlan]:
    now = MachineClock().now()
    with _opened(budget, now) as ledger:
        plans = []
        for key, n in sorted((k, n) for k, n in left.items() if n and k in rules):
            force = _in_force(key, rules[key], ledger.recall(key.value), budget)
            plans.append(_plan(key, n, force, pace, ledger, now))
        return plans


def _plan(
    key: LimitKey, jobs: int, force: _InForce, pace: Pace, ledger: Ledger, now: float
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
    return KeyPlan(key, jobs, rule, used, max(0.0, moment - now), force.kept)


def _store_path(
    paths: StatePaths, jobs_file: Path, names: Sequence[str]
) -> Path | None:
    folder = paths.run_folder(jobs_file)
    if names:
        found = [folder / f"{name}.db" for name in names]
        return next((path for path in found if path.exists()), None)
    stores = sorted(folder.glob("*.db"), key=lambda p: p.stat().st_mtime)
    return stores[-1] if stores else None


@dataclass(frozen=True, slots=True)
class KeyLimit:
    """One key's limit for a client: the rule given (profile or --limit), the rule
    a run paces by, and, if that was learned from the server, why and until
    when it is kept (wall clock: then runs try faster rules again)."""

    key: LimitKey
    given: Rule
    rule: Rule
    spread: bool
    learned: Kept | None
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
    budget = _Budget(paths, client, ledger_url, fallback or {})
    rules = {key: rules[key] for key in LimitKey if key in rules}
    found = []
    with _opened(budget) as ledger:
        for key, rule in rules.items():
            force = _in_force(key, rule, ledger.recall(key.value), budget)
            until = None if force.kept is None else force.kept.expires
            why = force.kept
            found.append(KeyLimit(key, rule, force.rule, force.spread, why, until))
    return found


def forget(
    keys: list[LimitKey], paths: StatePaths, client: str, *, ledger_url: str | None
) -> list[LimitKey]:
    """Forget what was learned of `keys`' limits for `client`, and what the
    server was seen to accept: the next run starts from the rule given; return
    the keys that had anything learned."""
    forgotten = []
    with _opened(_Budget(paths, client, ledger_url), read_only=False) as ledger:
        for key in keys:
            had = False
            for name in (key.value, f"{key.value}{RECORD_SUFFIX}"):
                if ledger.recall(name) not in (None, "{}"):
                    ledger.remember(name, "{}")
                    had = had or name == key.value
            if had:
                forgotten.append(key)
    return forgotten
