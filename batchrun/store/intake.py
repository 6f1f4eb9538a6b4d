"""Taking a jobs file into a run store: every row staged in a temporary table,
checked there (bad rows, duplicate ids, changed rows of jobs already sent), then
merged into `jobs`, all in the caller's one transaction.

Invariant: memory does not grow with the file: rows are staged a batch at a time
and duplicates are found by SQLite; a file with any bad row changes nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from batchrun.core.errors import JobsFileError
from batchrun.jobs.job import Job
from batchrun.jobs.jobfile import Problem
from batchrun.store.database import Database

_BATCH = 1000
_SHOWN = JobsFileError.shown
Problems = tuple[list[tuple[int, str]], int]


def take_in(
    db: Database,
    rows: Iterable[Job | Problem],
    *,
    staged: Callable[[Job], tuple[object, ...]] | None = None,
) -> Problems:
    """Stage `rows` in the temporary table `incoming`; return the bad rows
    (the first of them, and how many), duplicate ids included."""
    db.execute(
        "CREATE TEMP TABLE IF NOT EXISTS incoming (id TEXT, line INT, "
        "type TEXT, key TEXT, team_id TEXT, payload TEXT, digest TEXT, "
        "method TEXT, path TEXT, unsafe INT)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS incoming_id ON incoming (id)")
    db.execute("DELETE FROM incoming")
    problems, total = _stage(db, rows, staged or staged_row)
    return _duplicates(db, problems, total)


def _stage(
    db: Database,
    rows: Iterable[Job | Problem],
    staged: Callable[[Job], tuple[object, ...]],
) -> Problems:
    problems: list[tuple[int, str]] = []
    total = 0
    batch: list[tuple[object, ...]] = []
    for row in rows:
        if isinstance(row, Problem):
            total += 1
            if len(problems) < _SHOWN:
                problems.append((row.line, row.reason))
            if row.id is None:
                continue
            # A bad row still claims its id: a later row with it is named.
            batch.append((row.id, row.line, *(None,) * 8))
        else:
            batch.append(staged(row))
        if len(batch) >= _BATCH:
            _insert(db, batch)
    _insert(db, batch)
    return problems, total


def _insert(db: Database, batch: list[tuple[object, ...]]) -> None:
    db.executemany("INSERT INTO incoming VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
    batch.clear()


def _duplicates(db: Database, problems: list[tuple[int, str]], total: int) -> Problems:
    """Add the rows whose id an earlier row already has, in line order."""
    query = (
        "FROM incoming i JOIN (SELECT id, min(line) AS first FROM incoming "
        "GROUP BY id HAVING count(*) > 1) d ON i.id = d.id "
        "WHERE i.line > d.first AND i.type IS NOT NULL"
    )
    more, rows = _counted(db, "i.line, i.id, d.first", query)
    found = [
        (line, f"duplicate id {job_id!r} (first on line {first})")
        for line, job_id, first in rows
    ]
    return sorted(problems + found)[:_SHOWN], total + more


def _counted(db: Database, columns: str, query: str) -> tuple[int, list[Any]]:
    """How many rows `query` finds, and the first of them by line."""
    [(count,)] = db.execute(f"SELECT count(*) {query}")
    rows = db.execute(f"SELECT {columns} {query} ORDER BY i.line LIMIT {_SHOWN}")
    return count, rows


def conflicts(db: Database) -> Problems:
    """Staged rows that changed a job an earlier run already sent."""
    query = (
        "FROM incoming i JOIN jobs j ON i.id = j.id "
        "WHERE i.digest != j.digest AND j.state != 'pending'"
    )
    total, rows = _counted(db, "i.line, i.id, j.state", query)
    problems = [
        (
            line,
            f"job {job_id!r} is {state} from an earlier run but its row "
            "changed; restore it, give it a new id, or use --restart",
        )
        for line, job_id, state in rows
    ]
    return problems, total


def merge(db: Database) -> None:
    """The staged rows into `jobs`: new ones pending, pending ones gone from the
    file dropped, the others' rows brought up to date (states kept)."""
    db.execute(
        "DELETE FROM jobs WHERE state = 'pending' "
        "AND id NOT IN (SELECT id FROM incoming)"
    )
    db.execute(
        "INSERT INTO jobs (id, line, type, key, team_id, payload, digest, method, "
        "path, unsafe, state) SELECT id, line, type, key, team_id, payload, "
        "digest, method, path, unsafe, 'pending' "
        "FROM incoming WHERE true ON CONFLICT (id) DO UPDATE SET "
        "line = excluded.line, type = excluded.type, key = excluded.key, "
        "team_id = excluded.team_id, payload = excluded.payload, "
        "digest = excluded.digest, method = excluded.method, "
        "path = excluded.path, unsafe = excluded.unsafe"
    )
    db.execute("DELETE FROM incoming")


def identity(job: Job) -> tuple[object, ...]:
    """What `validate` stages of a job: all a check needs, no payload or digest."""
    return (
        job.id,
        job.line,
        job.type.value,
        job.key.value,
        job.team_id,
        None,
        None,
        *_target(job),
    )


def _target(job: Job) -> tuple[str | None, str | None, int]:
    """A job's method and path (a request's; none for the typed endpoints), and
    whether it is unsafe to send again after an ambiguous failure."""
    method = None if job.method is None else job.method.value
    return method, job.target, int(not job.endpoint.safe_to_repeat)


def staged_row(job: Job) -> tuple[object, ...]:
    """A job as `incoming` holds it, with the digest that tells a changed row."""
    payload = json.dumps(job.payload, sort_keys=True, separators=(",", ":"))
    fields: list[object] = [job.type.value, job.team_id, payload]
    if job.method is not None:
        # Only a request's: the digests of typed jobs stay those earlier builds
        # stored, so their done rows are not taken for changed ones.
        fields += [job.method.value, job.target]
    content = json.dumps(fields)
    digest = hashlib.sha256(content.encode()).hexdigest()[:32]
    return (
        job.id,
        job.line,
        job.type.value,
        job.key.value,
        job.team_id,
        payload,
        digest,
        *_target(job),
    )
