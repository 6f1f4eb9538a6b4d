"""The results file: one JSON line per job that reached its end, written as it ends.

A line is flushed as soon as its job finishes, so a crash loses no finished result.
When a job is tried again in a later run (e.g. after it failed), its newer line comes
later in the file: readers take the last line of each id, and the run that sent it
again leaves only that line (`compact`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any, Self

from batchrun.api.outcome import Kind, Outcome
from batchrun.core.errors import UsageError
from batchrun.core.events import ENDED, Status
from batchrun.jobs.job import Job
from batchrun.store.database import explain

# A job's end as a results line records it: id, state (done, failed or unknown),
# attempts, HTTP status, error.
Ended = tuple[str, str, int, int | None, str | None]
_UNKNOWN_NOTE = (
    "the server may have processed this request: check, then resend it with "
    "--retry-unknown"
)


@dataclass(frozen=True, slots=True)
class JobResult:
    """The end of one job: how it ended, after how many attempts, with what answer."""

    id: str
    type: str
    status: Status
    attempts: int
    http_status: int | None
    response: Any = None
    error: str | None = None
    note: str | None = None
    finished_at: float = 0.0
    # Only for a response kept as text: its Content-Type, and its whole size in
    # bytes when only part of it is kept (a line leaves them out otherwise).
    content_type: str | None = None
    size: int | None = None

    @classmethod
    def of(
        cls,
        job: Job,
        attempts: int,
        outcome: Outcome,
        at: float,
        *,
        status: Status | None = None,
    ) -> JobResult:
        """The end of `job` after `attempts`, as its last `outcome` left it:
        done or failed, unless `status` says otherwise (unknown)."""
        done = outcome.kind is Kind.DONE
        return cls(
            id=job.id,
            type=job.type.value,
            status=status or (Status.DONE if done else Status.FAILED),
            attempts=attempts,
            http_status=outcome.status,
            response=outcome.body,
            error=outcome.error,
            note=_noted(outcome.note, status),
            finished_at=at,
            content_type=outcome.content_type,
            size=outcome.size,
        )


def _noted(note: str | None, status: Status | None) -> str | None:
    if status is not Status.UNKNOWN:
        return note
    return f"{note}; {_UNKNOWN_NOTE}" if note else _UNKNOWN_NOTE


_FIELDS = tuple(f.name for f in fields(JobResult))
_OPTIONAL = frozenset(("content_type", "size"))


def default_results_path(jobs_path: Path, *, sandbox: bool = False) -> Path:
    """`jobs.csv` → `jobs.results.jsonl`, beside the jobs file; a `--sandbox`
    run's → `jobs.sandbox.results.jsonl`, so that a try-out's results never stand
    in the way of the real run of the same file (nor mix with its results)."""
    kind = ".sandbox" if sandbox else ""
    return jobs_path.with_name(f"{jobs_path.stem}{kind}.results.jsonl")


def last_result(path: Path, job_id: str) -> dict[str, Any] | None:
    """The last line of the results file at `path` for `job_id` (a later run's line
    wins), or None; unreadable lines (a run killed mid-write) are skipped."""
    found = None
    with (
        contextlib.suppress(FileNotFoundError),
        path.open(encoding="utf-8", errors="replace") as file,
    ):
        for text in file:
            with contextlib.suppress(ValueError):
                line = json.loads(text)
                if isinstance(line, dict) and line.get("id") == job_id:
                    found = line
    return found


_ENDS = frozenset(ENDED)


def ends_since(path: Path, offset: int) -> tuple[int, Iterator[Ended]]:
    """The file's size now, and the job ends its lines record from `offset` up to
    it (unreadable lines skipped), read lazily."""
    try:
        end = path.stat().st_size
    except FileNotFoundError:
        return 0, iter(())
    except OSError as exc:
        raise explain(exc, path) from None
    return end, _ends(path, offset, end)


def _ends(path: Path, offset: int, end: int) -> Iterator[Ended]:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            for raw in file:
                offset += len(raw)
                if offset > end:
                    return
                found = _ended(raw)
                if found is not None:
                    yield found
    except OSError as exc:
        raise explain(exc, path) from None


def _ended(raw: bytes) -> Ended | None:
    try:
        line = json.loads(raw)
        job, state = line["id"], line["status"]
        attempts, status, error = line["attempts"], line["http_status"], line["error"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(job, str) or state not in _ENDS:
        return None
    return job, state, attempts, status, error


def compact(path: Path) -> int:
    """Rewrite the results file at `path` with one line per id, the last (as
    readers take it), in the order of those lines; lines without an id (a run
    killed mid-write) are kept. Atomic: a crash leaves the file as it was.
    Return the file's new size.

    Raises:
        StateError: the file cannot be read or rewritten.
    """
    temporary = path.with_name(f".{path.name}.compacting")
    try:
        with path.open("rb") as file:
            last = {found: n for n, raw in enumerate(file) if (found := _id(raw))}
        with path.open("rb") as file, temporary.open("wb") as out:
            for n, raw in enumerate(file):
                found = _id(raw)
                if found is None or last[found] == n:
                    out.write(raw)
            out.flush()
            os.fsync(out.fileno())
        shutil.copymode(path, temporary)
        os.replace(temporary, path)
        return path.stat().st_size
    except FileNotFoundError:
        return 0
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise explain(exc, path) from None


def _id(raw: bytes) -> str | None:
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    found = line.get("id") if isinstance(line, dict) else None
    return found if isinstance(found, str) else None


class ResultsFile:
    """Appends results as JSON lines to a file, flushing each one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file: IO[str] = path.open("a", encoding="utf-8")
        except OSError as exc:
            msg = f"cannot write results to {path}: {exc.strerror}. Choose --results."
            raise UsageError(msg) from None
        self._end_the_last_line()

    def _end_the_last_line(self) -> None:
        """A run killed mid-write left half a line: end it, so that the next
        line is not glued to it (and lost with it)."""
        try:
            with self.path.open("rb") as file:
                file.seek(-1, 2)
                cut = file.read(1) != b"\n"
        except OSError:
            return  # empty: nothing to end
        if cut:
            self._file.write("\n")

    def tell(self) -> int:
        """The file's size with every line written so far."""
        return self._file.tell()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Each line was flushed as written, and a failed write already raised.
        with contextlib.suppress(OSError):
            self._file.close()

    def write(self, result: JobResult) -> None:
        """Append one result and flush it to the operating system.

        Raises:
            StateError: the line cannot be written (`DiskFull` when no space is left).
        """
        # Not dataclasses.asdict: that deep-copies the response body first.
        fields = {name: getattr(result, name) for name in _FIELDS}
        for name in _OPTIONAL:
            if fields[name] is None:
                del fields[name]
        line = json.dumps(fields, ensure_ascii=False, default=str)
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except OSError as exc:
            raise explain(exc, self.path) from None
