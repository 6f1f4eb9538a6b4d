"""The run store: the SQLite file that holds one jobs file's jobs and their states.

A job moves `pending → in_flight → done | failed`, back to `pending` when requeued,
or to `unknown` when a run died while an unsafe request (an invite) was in flight.
`in_flight` is written before a request leaves and the outcome right after the
answer, so a run killed at any moment loses nothing: the next run resends in-flight
safe jobs and leaves unsafe ones `unknown` until asked (`--retry-unknown`).

The store's schema has a version (`PRAGMA user_version`): `_MIGRATIONS[n]` takes a
store from version n to n + 1, so a store written by an earlier build is brought up
to date when opened, and one written by a later build is refused.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from batchrun.core.errors import JobsFileError
from batchrun.core.events import Status
from batchrun.core.limits import LimitKey
from batchrun.jobs.endpoints import JobType, Method
from batchrun.jobs.job import Job, Summary, scan
from batchrun.jobs.jobfile import Problem
from batchrun.store import intake
from batchrun.store.database import open_database, write_transaction
from batchrun.store.results import Ended, JobResult

# Each entry takes the store from its index to the next version.
_MIGRATIONS = (
    """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, line INTEGER NOT NULL, type TEXT NOT NULL,
    key TEXT NOT NULL, team_id TEXT, payload TEXT NOT NULL, digest TEXT NOT NULL,
    state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    http_status INTEGER, error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (key, state, line);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
""",
    # `request` jobs: their method and path; `unsafe`: not to be sent again after
    # an ambiguous failure (invites before, now POST and PATCH requests too).
    """
ALTER TABLE jobs ADD COLUMN method TEXT;
ALTER TABLE jobs ADD COLUMN path TEXT;
ALTER TABLE jobs ADD COLUMN unsafe INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET unsafe = 1 WHERE type = 'invite';
""",
)
_PAGE = 500


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed or unknown job and why."""

    id: str
    type: str
    error: str
    state: Status = Status.FAILED


# More rows than any run store holds: "no limit" in a comparison.
_ALL = 2**62


@dataclass(frozen=True, slots=True)
class Reason:
    """Failed or unknown jobs that ended alike: their state and error, how many,
    and the first ids (in file order)."""

    state: Status
    error: str
    count: int
    ids: list[str]


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as the run store holds it (`batchrun show`)."""

    id: str
    line: int
    type: str
    state: Status
    attempts: int
    http_status: int | None
    error: str | None


class RunStore:
    """The jobs of one file for one client, and where each stands."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        # Under the run's lock, this process alone writes the store.
        self._db = open_database(
            path, _MIGRATIONS, read_only=read_only, alone=not read_only
        )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def sync(self, rows: Iterable[Job | Problem], *, path: str, restart: bool) -> None:
        """Take in the jobs file: new rows queue, changed done rows are refused.

        One transaction: any bad row or conflict leaves the store as it was.
        """
        with write_transaction(self._db):
            if restart:
                self._db.execute("DELETE FROM jobs")
            problems, total = intake.take_in(self._db, rows)
            if not total:
                problems, total = intake.conflicts(self._db)
            if total:
                raise JobsFileError(path, problems, total)
            intake.merge(self._db)

    def check(self, rows: Iterable[Job | Problem], *, path: str) -> Summary:
        """`validate`: find every bad row as `sync` does (duplicate ids by SQLite,
        so memory does not grow with the file), keep nothing, and count the jobs.

        Raises:
            JobsFileError: naming the first bad rows and counting all of them.
        """
        with write_transaction(self._db):
            problems, total = intake.take_in(self._db, rows, staged=intake.identity)
            if total:
                raise JobsFileError(path, problems, total)
            per_type = self._db.execute(
                "SELECT type, count(*) FROM incoming WHERE type IS NOT NULL "
                "GROUP BY type ORDER BY min(line)"
            )
            per_team = self._db.execute(
                "SELECT team_id, count(*) FROM incoming WHERE team_id IS NOT NULL "
                "GROUP BY team_id"
            )
            per_budget = self._db.execute(
                "SELECT key, type, count(*) FROM incoming WHERE type IS NOT NULL "
                "GROUP BY key, type ORDER BY min(line)"
            )
            self._db.execute("DELETE FROM incoming")
        types = {JobType(kind): n for kind, n in per_type}
        budgets: dict[LimitKey, dict[JobType, int]] = {}
        for key, kind, n in per_budget:
            budgets.setdefault(LimitKey(key), {})[JobType(kind)] = n
        return Summary(sum(types.values()), types, dict(per_team), budgets)

    def recover(self, *, retry_failed: bool, retry_unknown: bool) -> None:
        """Settle what an earlier run left in flight, and requeue what is asked."""
        with write_transaction(self._db):
            self._db.execute(
                "UPDATE jobs SET state = 'unknown' WHERE state = 'in_flight' AND unsafe"
            )
            self._db.execute(
                "UPDATE jobs SET state = 'pending' WHERE state = 'in_flight'"
            )
            for flag, state in (
                (retry_failed, Status.FAILED),
                (retry_unknown, Status.UNKNOWN),
            ):
                if flag:
                    self._db.execute(
                        "UPDATE jobs SET state = 'pending', attempts = 0 "
                        "WHERE state = ?",
                        (state,),
                    )

    def settle(self, ends: Iterable[Ended]) -> dict[tuple[str, bool, Status], int]:
        """Take the results file's word for jobs this store still has to send
        (pending or in flight) that it records as ended: each gets the state of
        its last line in `ends`. Returns how many changed, by type, whether
        unsafe to send twice, and state.

        One transaction, staged in a temporary table a batch at a time.
        """
        with write_transaction(self._db):
            self._db.execute(
                "CREATE TEMP TABLE IF NOT EXISTS ended (seq INTEGER PRIMARY KEY, "
                "id TEXT, state TEXT, attempts INT, http_status INT, error TEXT)"
            )
            self._db.execute("DELETE FROM ended")
            rows = iter(ends)
            while batch := list(itertools.islice(rows, _PAGE)):
                self._db.executemany(
                    "INSERT INTO ended (id, state, attempts, http_status, error) "
                    "VALUES (?, ?, ?, ?, ?)",
                    batch,
                )
            return self._settle_ended()

    def _settle_ended(self) -> dict[tuple[str, bool, Status], int]:
        last = (
            "(SELECT * FROM ended WHERE seq IN "
            "(SELECT max(seq) FROM ended GROUP BY id)) e"
        )
        waiting = "jobs.state IN ('pending', 'in_flight')"
        changed = self._db.execute(
            f"SELECT jobs.type, jobs.unsafe, e.state, count(*) FROM jobs "
            f"JOIN {last} ON jobs.id = e.id WHERE {waiting} GROUP BY 1, 2, 3"
        )
        self._db.execute(
            f"UPDATE jobs SET state = e.state, attempts = e.attempts, "
            f"http_status = e.http_status, error = e.error FROM {last} "
            f"WHERE jobs.id = e.id AND {waiting}"
        )
        self._db.execute("DELETE FROM ended")
        return {
            (kind, bool(unsafe), Status(state)): n for kind, unsafe, state, n in changed
        }

    def pending(self, key: LimitKey) -> Iterator[Job]:
        """The key's pending jobs in file order, read a page at a time."""
        after = -1
        while True:
            page = self._db.execute(
                "SELECT id, type, team_id, payload, line, method, path FROM jobs "
                "WHERE key = ? AND state = 'pending' AND line > ? ORDER BY line "
                "LIMIT ?",
                (key.value, after, _PAGE),
            )
            for job_id, kind, team, payload, line, method, path in page:
                yield Job(
                    job_id,
                    JobType(kind),
                    team,
                    json.loads(payload),
                    line,
                    None if method is None else Method(method),
                    path,
                )
            if len(page) < _PAGE:
                return
            after = page[-1][4]

    def requests_left(self) -> dict[LimitKey, int]:
        """How many request jobs of each key are pending or in flight."""
        rows = self._db.execute(
            "SELECT key, count(*) FROM jobs WHERE method IS NOT NULL "
            "AND state IN ('pending', 'in_flight') GROUP BY key"
        )
        return {LimitKey(k): n for k, n in rows}

    def counts(self) -> dict[tuple[LimitKey, Status], int]:
        """How many jobs of each key stand in each state."""
        rows = self._db.execute("SELECT key, state, count(*) FROM jobs GROUP BY 1, 2")
        return {(LimitKey(k), Status(s)): n for k, s, n in rows}

    def failures(self, limit: int | None = 20) -> list[Failure]:
        """The first failed and unknown jobs, in file order, with their errors
        (`limit` None: all of them)."""
        rows = self._db.execute(
            "SELECT id, type, coalesce(error, ''), state FROM jobs "
            "WHERE state IN ('failed', 'unknown') ORDER BY line LIMIT ?",
            (-1 if limit is None else limit,),  # SQLite: a negative LIMIT is none
        )
        return [Failure(i, t, e, Status(s)) for i, t, e, s in rows]

    def reasons(self, few: int | None = 5, most: int = 20) -> list[Reason]:
        """Failed and unknown jobs grouped by state and error, the group met
        first in the file first: at most `most` groups, each with its first
        `few` ids (None: all)."""
        rows = self._db.execute(
            "SELECT state, error, total, id FROM ("
            " SELECT *, dense_rank() OVER (ORDER BY first, state, error) AS nth_group"
            " FROM ("
            "  SELECT state, coalesce(error, '') AS error, id, line,"
            "  count(*) OVER reason AS total,"
            "  row_number() OVER (reason ORDER BY line) AS nth,"
            "  min(line) OVER reason AS first"
            "  FROM jobs WHERE state IN ('failed', 'unknown')"
            "  WINDOW reason AS (PARTITION BY state, coalesce(error, ''))"
            " ) WHERE nth <= ?"
            ") WHERE nth_group <= ? ORDER BY nth_group, line",
            (_ALL if few is None else few, most),
        )
        found: dict[tuple[str, str], Reason] = {}
        for state, error, total, job_id in rows:
            empty = Reason(Status(state), error, total, [])
            reason = found.setdefault((state, error), empty)
            reason.ids.append(job_id)
        return list(found.values())

    def job(self, job_id: str) -> JobRecord | None:
        """The job `job_id` of this run, or None if the run has no such job."""
        found = self._db.execute(
            "SELECT id, line, type, state, attempts, http_status, error FROM jobs "
            "WHERE id = ?",
            (job_id,),
        )
        if not found:
            return None
        job, line, kind, state, attempts, http_status, error = found[0]
        return JobRecord(job, line, kind, Status(state), attempts, http_status, error)

    def ids_in(self, states: Iterable[Status]) -> set[str]:
        """The ids of the jobs in any of `states`."""
        wanted = [s.value for s in states]
        marks = ",".join("?" * len(wanted))
        rows = self._db.execute(f"SELECT id FROM jobs WHERE state IN ({marks})", wanted)
        return {row[0] for row in rows}

    def ended_among(self, jobs: Iterable[Job]) -> int:
        """How many of `jobs` this store holds, unchanged, as sent before (done,
        failed, unknown or in flight): whether it is the run of their file."""
        found = 0
        for job in jobs:
            rows = self._db.execute(
                "SELECT 1 FROM jobs WHERE id = ? AND digest = ? AND state != 'pending'",
                (job.id, intake.staged_row(job)[6]),
            )
            found += bool(rows)
        return found

    def get_meta(self, name: str) -> str | None:
        rows = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, name: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (name) DO UPDATE "
            "SET value = excluded.value",
            (name, value),
        )

    # The runner's Recorder: every change is committed before the runner goes on.

    def started(self, job: Job, attempt: int) -> None:
        self._db.execute(
            "UPDATE jobs SET state = 'in_flight', attempts = ? WHERE id = ?",
            (attempt, job.id),
        )

    def requeued(self, job: Job, *, maybe_processed: bool) -> None:
        # An unsafe job whose request may have been processed stays in flight, so
        # that a crash before its retry leaves it unknown rather than resent.
        if maybe_processed and not job.endpoint.safe_to_repeat:
            return
        self._db.execute("UPDATE jobs SET state = 'pending' WHERE id = ?", (job.id,))

    def finished(self, result: JobResult) -> None:
        self._db.execute(
            "UPDATE jobs SET state = ?, attempts = ?, http_status = ?, error = ? "
            "WHERE id = ?",
            (
                result.status.value,
                result.attempts,
                result.http_status,
                result.error,
                result.id,
            ),
        )


def check_jobs_file(path: Path) -> Summary:
    """`validate`: the jobs of `path` counted, or JobsFileError naming every bad
    row. Duplicate ids are found in a private temporary SQLite database (it spills
    to a temporary file when large, and is gone when closed), not in memory."""
    with RunStore("") as store:
        return store.check(scan(path, check_duplicates=False), path=str(path))
