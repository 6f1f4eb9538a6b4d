"""Jobs: the `Job` value, the endpoint table, and reading + validating jobs files.

A jobs file is read line by line; every row is checked before anything is sent
(CONTRACT.md section 1), and every bad row is reported with its line number.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

from batchrun.errors import JobsFileError
from batchrun.limits import LimitKey

# Payloads may be large JSON documents; the csv module's default cap is 128 KiB.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


class JobType(StrEnum):
    """The kinds of job a file may hold, one per known endpoint."""

    RUN_QUERY = "run-query"
    INVITE = "invite"
    AVATAR = "avatar"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """How a job type becomes a request, and which budget it draws on."""

    method: str
    path: str
    key: LimitKey
    needs_team: bool
    # An invite may have been sent when its answer was lost; repeating it invites twice.
    safe_to_repeat: bool


ENDPOINTS: dict[JobType, Endpoint] = {
    JobType.RUN_QUERY: Endpoint(
        "POST", "/teams/{team_id}/data/run-query", LimitKey.RUN_QUERY, True, True
    ),
    JobType.INVITE: Endpoint(
        "POST", "/teams/{team_id}/members/invite", LimitKey.INVITE, True, False
    ),
    JobType.AVATAR: Endpoint("PUT", "/users/me/avatar", LimitKey.AVATAR, False, True),
}


@dataclass(frozen=True, slots=True)
class Job:
    """One request to make: validated, immutable, and named by its unique `id`."""

    id: str
    type: JobType
    team_id: str | None = None
    payload: dict[str, Any] = field(default_factory=dict, compare=False)
    line: int = 0

    @property
    def endpoint(self) -> Endpoint:
        return ENDPOINTS[self.type]

    @property
    def key(self) -> LimitKey:
        return self.endpoint.key

    @property
    def path(self) -> str:
        """The request path, with `team_id` percent-encoded so it stays one segment."""
        return self.endpoint.path.format(team_id=quote(self.team_id or "", safe=""))


@dataclass(frozen=True, slots=True)
class Problem:
    """One bad row: its physical line (0 for the whole file) and why it is bad."""

    line: int
    reason: str


@dataclass(frozen=True, slots=True)
class Summary:
    """What a valid jobs file holds, by type and by team."""

    total: int
    per_type: dict[JobType, int]
    per_team: dict[str, int]


# Letters, digits and the unreserved marks of RFC 3986 only; never `.` or `..` alone.
_TEAM_ID = re.compile(r"^[A-Za-z0-9._~-]+$")
_TYPES = ", ".join(t.value for t in JobType)
_REQUIRED = ("id", "type")
_SHOWN = JobsFileError.shown


def read_jobs(path: Path) -> list[Job]:
    """Read and validate a whole jobs file; raise JobsFileError naming every bad row."""
    jobs: list[Job] = []
    problems: list[tuple[int, str]] = []
    total = 0
    for item in scan(path):
        if isinstance(item, Job):
            jobs.append(item)
            continue
        total += 1
        if len(problems) < _SHOWN:
            problems.append((item.line, item.reason))
    if total:
        raise JobsFileError(str(path), problems, total)
    return jobs


def summarize(jobs: Iterable[Job]) -> Summary:
    """Count jobs per type and per team."""
    per_type: Counter[JobType] = Counter()
    per_team: Counter[str] = Counter()
    for job in jobs:
        per_type[job.type] += 1
        if job.team_id is not None:
            per_team[job.team_id] += 1
    return Summary(per_type.total(), dict(per_type), dict(per_team))


def scan(path: Path) -> Iterator[Job | Problem]:
    """Stream a CSV or JSONL jobs file, yielding each valid Job or a Problem."""
    opened = _open(path)
    if isinstance(opened, Problem):
        yield opened
        return
    seen: dict[str, int] = {}
    with opened:
        rows = _jsonl_rows(opened) if path.suffix == ".jsonl" else _csv_rows(opened)
        for line, fields in rows:
            yield _unique(_job(line, fields), seen)


def _open(path: Path) -> BinaryIO | Problem:
    try:
        if path.is_dir():
            return Problem(0, "this is a folder, not a jobs file")
        # Bytes, decoded line by line in _Lines, so a bad byte is named by its line.
        return path.open("rb")
    except FileNotFoundError:
        return Problem(0, "no such file")
    except OSError as exc:
        return Problem(0, f"cannot read it: {exc.strerror or exc}")


_Row = tuple[int, "dict[str, Any] | Problem"]


def _csv_rows(file: BinaryIO) -> Iterator[_Row]:
    lines = _Lines(file)
    reader = csv.reader(lines)
    try:
        header = _header(reader, lines)
        if isinstance(header, Problem):
            yield header.line, header
            return
        for record in reader:
            if any(cell.strip() for cell in record):
                yield lines.record_start, dict(zip(header, record, strict=False))
    except (csv.Error, UnicodeDecodeError) as exc:
        yield lines.number, Problem(lines.number, _unreadable(exc))


def _header(reader: Iterator[list[str]], lines: _Lines) -> list[str] | Problem:
    record = next((r for r in reader if any(c.strip() for c in r)), None)
    if record is None:
        return Problem(0, "the file is empty: expected a header row id,type,...")
    header = [name.strip() for name in record]
    missing = [name for name in _REQUIRED if name not in header]
    if missing:
        found = ",".join(header)[:80]
        reason = f"header {found!r} lacks column(s) {', '.join(missing)}"
        return Problem(lines.record_start, reason)
    return header


def _jsonl_rows(file: BinaryIO) -> Iterator[_Row]:
    lines = _Lines(file)
    try:
        for text in lines:
            if text.strip():
                yield lines.number, _json_object(lines.number, text)
    except UnicodeDecodeError as exc:
        yield lines.number, Problem(lines.number, _unreadable(exc))


def _json_object(line: int, text: str) -> dict[str, Any] | Problem:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Problem(line, f"not valid JSON ({_json_error(exc)})")
    if not isinstance(value, dict):
        return Problem(line, f"expected a JSON object, got {type(value).__name__}")
    return value


def _job(line: int, fields: dict[str, Any] | Problem) -> Job | Problem:
    if isinstance(fields, Problem):
        return fields
    job_id = _id(fields.get("id"))
    if isinstance(job_id, Problem):
        return Problem(line, job_id.reason)
    kind = _type(fields.get("type"))
    if isinstance(kind, Problem):
        return Problem(line, kind.reason)
    payload = _payload(fields.get("payload"))
    if isinstance(payload, Problem):
        return Problem(line, payload.reason)
    team = _team(fields.get("team_id")) if ENDPOINTS[kind].needs_team else None
    if isinstance(team, Problem):
        return Problem(line, team.reason)
    return Job(job_id, kind, team, payload, line)


def _id(value: Any) -> str | Problem:
    if isinstance(value, bool) or not isinstance(value, str | int):
        shown = "missing" if value is None else f"a {type(value).__name__}"
        return Problem(0, f"id is {shown}: every job needs a unique id")
    text = str(value).strip()
    return text or Problem(0, "id is empty: every job needs a unique id")


def _type(value: Any) -> JobType | Problem:
    text = value.strip() if isinstance(value, str) else value
    try:
        return JobType(text)
    except ValueError:
        shown = "missing" if not text else repr(text)[:60]
        return Problem(0, f"type is {shown} (expected {_TYPES})")


def _payload(value: Any) -> dict[str, Any] | Problem:
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            return Problem(0, f"payload is not valid JSON ({_json_error(exc)})")
    if not isinstance(value, dict):
        return Problem(0, f"payload must be a JSON object, got {type(value).__name__}")
    return value


def _team(value: Any) -> str | Problem:
    if not isinstance(value, str) or not value.strip():
        return Problem(0, "team_id is missing (run-query and invite need a team)")
    if not _TEAM_ID.match(value) or set(value) == {"."}:
        shown = repr(value)[:60]
        reason = (
            f"team_id {shown} may hold only letters, digits, '.', '_', '~' and '-' "
            "(and is not '.' or '..')"
        )
        return Problem(0, reason)
    return value


def _unique(item: Job | Problem, seen: dict[str, int]) -> Job | Problem:
    if isinstance(item, Problem):
        return item
    first = seen.setdefault(item.id, item.line)
    if first != item.line:
        return Problem(item.line, f"duplicate id {item.id!r} (first on line {first})")
    return item


def _json_error(exc: Exception) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"


def _unreadable(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text (save the file as UTF-8)"
    return f"not readable as CSV ({exc})"


class _Lines:
    """Decodes a file line by line, counting physical lines and CSV record starts."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.number = 0
        self.record_start = 1
        self._between = True
        self._quotes = 0

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        raw = next(self._file)
        self.number += 1
        text = raw.decode("utf-8-sig" if self.number == 1 else "utf-8")
        if self._between:
            self.record_start = self.number
        # A record ends where a line ends outside quotes: an even count of quotes.
        self._quotes = (0 if self._between else self._quotes) + text.count('"')
        self._between = self._quotes % 2 == 0
        return text
