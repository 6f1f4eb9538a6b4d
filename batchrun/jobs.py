"""Jobs: the `Job` value, the endpoint table, and reading + validating jobs files.

A jobs file is streamed line by line and every row is checked before anything is
sent (CONTRACT.md section 1). Whatever its bytes, reading yields a `Job` or a
`Problem` naming the physical line (where its record starts, for a CSV record that
spans lines) and a reason; no other exception escapes `read_jobs`. Memory stays
bounded: a line or field over `_MAX_ROW` bytes is refused, and only the ids seen so
far (for duplicates) grow with the file.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

from batchrun import strict_json
from batchrun.errors import JobsFileError
from batchrun.limits import LimitKey

_MAX_ROW = 16 * 2**20
# Payloads may be large JSON documents; the csv module's default cap is 128 KiB.
csv.field_size_limit(_MAX_ROW)


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


# Letters, digits and the unreserved marks of RFC 3986 only, so a team id is one
# path segment as written; `.` and `..` would be path steps, so no all-dots id either.
_TEAM_ID = re.compile(r"[A-Za-z0-9._~-]+")
# Control characters garble logs and the terminal; lone surrogates cannot be encoded.
_UNSAFE_TEXT = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_TYPES = "run-query, invite or avatar"
_COLUMNS = ("id", "type", "team_id", "payload")
_REQUIRED = ("id", "type")
_HEADER_HINT = "the first line must name the columns, e.g. id,type,team_id,payload"
_JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number"}
_JSON_KINDS |= {float: "a number", str: "a string", list: "an array", dict: "an object"}
_CSV_ERRORS = {
    "unexpected end of data": 'a quoted field starts here but its closing " is missing',
    "',' expected after '\"'": (
        'text follows a closing " (inside a quoted field write a quote as "")'
    ),
    "new-line character seen in unquoted field": (
        "a lone carriage return (\\r) in an unquoted field: "
        "end lines with \\n or \\r\\n, or quote the field"
    ),
    "field larger than field limit": "a field is larger than 16 MiB",
}


class _BadRow(Exception):
    """Raised by a row check; its one argument is the reason shown to the user."""


class _Unreadable(Exception):
    """Raised when the rest of the file cannot be read; the scan stops there."""


def read_jobs(path: Path) -> list[Job]:
    """Read and validate a whole jobs file.

    Raises:
        JobsFileError: naming the first bad rows and counting all of them.
    """
    return list(valid_jobs(path))


def valid_jobs(path: Path) -> Iterator[Job]:
    """Stream the jobs of a file, holding none of them; once a row is bad, stop
    yielding, and at the end of the file raise JobsFileError naming the bad rows."""
    problems: list[tuple[int, str]] = []
    total = 0
    for item in scan(path):
        if isinstance(item, Problem):
            total += 1
            if len(problems) < JobsFileError.shown:
                problems.append((item.line, item.reason))
        elif not total:
            yield item
    if total:
        raise JobsFileError(str(path), problems, total)


def summarize(jobs: Iterable[Job]) -> Summary:
    """Count jobs per type and per team, types in order of first appearance."""
    per_type: Counter[JobType] = Counter()
    per_team: Counter[str] = Counter()
    for job in jobs:
        per_type[job.type] += 1
        if job.team_id is not None:
            per_team[job.team_id] += 1
    return Summary(per_type.total(), dict(per_type), dict(per_team))


def scan(path: Path, *, check_duplicates: bool = True) -> Iterator[Job | Problem]:
    """Stream a CSV or JSONL jobs file, yielding each valid Job or a Problem.

    Duplicate ids are found with a set of the ids seen, unless the caller finds
    them itself (`check_duplicates=False`: the run store does, in SQLite, so that
    a huge file is taken in with memory that does not grow with it).
    """
    opened = _open(path)
    if isinstance(opened, Problem):
        yield opened
        return
    jsonl = path.name.lower().endswith(".jsonl")
    with opened:
        lines = _Lines(opened)
        rows = _jsonl_rows(lines) if jsonl else _csv_rows(lines)
        try:
            yield from _jobs(rows, text_payload=not jsonl, unique=check_duplicates)
        except _Unreadable as exc:
            yield Problem(lines.number, str(exc))
        except OSError as exc:
            yield Problem(0, f"cannot read it: {exc.strerror or exc}")


def _open(path: Path) -> BinaryIO | Problem:
    try:
        if path.is_dir():
            return Problem(0, "this is a folder, not a jobs file")
        return path.open("rb")
    except FileNotFoundError:
        return Problem(0, "no such file")
    except OSError as exc:
        return Problem(0, f"cannot read it: {exc.strerror or exc}")
    except ValueError as exc:  # e.g. a NUL in the name
        return Problem(0, f"not a usable file name ({exc})")


# A row as read: its line and fields, or why it could not be read at all.
_Row = tuple[int, dict[str, Any]] | Problem


def _jobs(
    rows: Iterator[_Row], *, text_payload: bool, unique: bool
) -> Iterator[Job | Problem]:
    seen: dict[str, int] | None = {} if unique else None
    for row in rows:
        if isinstance(row, Problem):
            yield row
        else:
            yield _job(*row, seen, text_payload=text_payload)


def _job(
    line: int,
    fields: dict[str, Any],
    seen: dict[str, int] | None,
    *,
    text_payload: bool,
) -> Job | Problem:
    try:
        # The id first, so a later duplicate is named even if this row is bad.
        job_id = _unique(_id(fields.get("id")), line, seen)
        kind = _type(fields.get("type"))
        payload = _payload(fields.get("payload"), text=text_payload)
        team = _team(fields.get("team_id")) if ENDPOINTS[kind].needs_team else None
    except _BadRow as exc:
        return Problem(line, str(exc))
    return Job(job_id, kind, team, payload, line)


def _csv_rows(lines: _Lines) -> Iterator[_Row]:
    records = _records(lines)
    first = next(records, None)
    if first is None:
        yield Problem(0, f"the file is empty: expected a header row ({_HEADER_HINT})")
        return
    header = first if isinstance(first, Problem) else _header(*first)
    if isinstance(header, Problem):
        yield header
        return
    for record in records:
        if isinstance(record, Problem):
            yield record
        else:
            yield record[0], dict(zip(header, record[1], strict=False))


def _records(lines: _Lines) -> Iterator[tuple[int, list[str]] | Problem]:
    """Non-blank CSV records with the line each starts on."""
    # strict: an unclosed quote is an error, not a field that swallows the file.
    reader = csv.reader(lines, strict=True)
    while True:
        # The reader pulls lines only as a record needs them, so this is its start.
        start = lines.number + 1
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            lines.take_flaw()
            yield Problem(start, _csv_error(exc))
            continue
        flaw = lines.take_flaw()
        if flaw is not None:
            yield flaw
        elif any(cell.strip() for cell in record):
            yield start, record


def _header(line: int, record: list[str]) -> list[str] | Problem:
    names = [name.strip() for name in record]
    missing = [name for name in _REQUIRED if name not in names]
    if missing:
        found = _shown(",".join(names))
        reason = f"the header {found} lacks column(s) {', '.join(missing)}"
        return Problem(line, f"{reason}: {_HEADER_HINT}")
    counts = Counter(names)
    twice = [name for name in _COLUMNS if counts[name] > 1]
    if twice:
        return Problem(line, f"the header names {', '.join(twice)} more than once")
    return names


def _jsonl_rows(lines: _Lines) -> Iterator[_Row]:
    for text in lines:
        flaw = lines.take_flaw()
        if flaw is not None:
            yield flaw
        elif text.strip():
            yield _json_object(lines.number, text)


def _json_object(line: int, text: str) -> _Row:
    try:
        value = strict_json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Problem(line, f"not valid JSON ({_json_error(exc)})")
    if not isinstance(value, dict):
        kind = _json_kind(value)
        return Problem(line, f"expected one JSON object {{...}} per line, got {kind}")
    return line, value


def _id(value: Any) -> str:
    if value is None:
        msg = "id is missing: every job needs a unique id"
        raise _BadRow(msg)
    if isinstance(value, bool) or not isinstance(value, str | int):
        msg = f"id must be a string or an integer, got {_json_kind(value)}"
        raise _BadRow(msg)
    text = str(value).strip()
    if not text:
        msg = "id is empty: every job needs a unique id"
        raise _BadRow(msg)
    if _UNSAFE_TEXT.search(text):
        msg = f"id {_shown(text)} holds a control character or a lone surrogate"
        raise _BadRow(msg)
    return text


def _unique(job_id: str, line: int, seen: dict[str, int] | None) -> str:
    if seen is None:
        return job_id
    first = seen.setdefault(job_id, line)
    if first != line:
        msg = f"duplicate id {_shown(job_id)} (first on line {first})"
        raise _BadRow(msg)
    return job_id


def _type(value: Any) -> JobType:
    if value is None or (isinstance(value, str) and not value.strip()):
        msg = f"type is missing (expected {_TYPES})"
        raise _BadRow(msg)
    if not isinstance(value, str):
        msg = f"type must be a string, got {_json_kind(value)}"
        raise _BadRow(msg)
    try:
        return JobType(value.strip())
    except ValueError:
        msg = f"unknown type {_shown(value.strip())} (expected {_TYPES})"
        raise _BadRow(msg) from None


def _team(value: Any) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        msg = "team_id is missing: run-query and invite jobs need a team"
        raise _BadRow(msg)
    if not isinstance(value, str):
        msg = f"team_id must be a string, got {_json_kind(value)}"
        raise _BadRow(msg)
    if not _TEAM_ID.fullmatch(value) or not value.strip("."):
        msg = (
            f"team_id {_shown(value)} may hold only letters, digits, '.', '_', '~' "
            "and '-', and must not be only dots"
        )
        raise _BadRow(msg)
    return value


def _payload(value: Any, *, text: bool) -> dict[str, Any]:
    """The request body; in CSV it is JSON text, in JSONL already an object."""
    if value is None or (text and isinstance(value, str) and not value.strip()):
        return {}
    plain = False
    if text and isinstance(value, str):
        plain = strict_json.surely_encodable(value)
        try:
            value = strict_json.loads(value)
        except (ValueError, RecursionError) as exc:
            msg = f"payload is not valid JSON ({_json_error(exc)})"
            raise _BadRow(msg) from None
    if not isinstance(value, dict):
        msg = f"payload must be a JSON object {{...}}, got {_json_kind(value)}"
        raise _BadRow(msg)
    if not plain:
        _check_sendable(value)
    return value


def _check_sendable(payload: dict[str, Any]) -> None:
    # The same encoding httpx applies when sending, so it cannot fail mid-run.
    try:
        strict_json.check_encodable(payload)
    except UnicodeEncodeError:
        msg = "payload holds a lone surrogate escape (\\ud800-\\udfff), not text"
        raise _BadRow(msg) from None
    except RecursionError:
        msg = "payload is nested too deeply"
        raise _BadRow(msg) from None


def _json_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos + 1}"
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _json_kind(value: Any) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _csv_error(exc: csv.Error) -> str:
    text = str(exc)
    reason = next((v for k, v in _CSV_ERRORS.items() if text.startswith(k)), None)
    return reason or f"not readable as CSV ({text})"


def _shown(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else f"{shown[:56]}...{shown[0]}"


class _Lines:
    """Decodes a binary file line by line, counting physical lines.

    Each line is decoded on its own, so a bad byte is named by its line and reading
    goes on; only `\\n` splits lines (the csv module sees `\\r\\n` as it should).
    """

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.number = 0
        self._flaw: Problem | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        raw = self._file.readline(_MAX_ROW + 1)
        if not raw:
            raise StopIteration
        self.number += 1
        if len(raw) > _MAX_ROW:
            msg = "a line is longer than 16 MiB: this does not look like a jobs file"
            raise _Unreadable(msg)
        codec = "utf-8-sig" if self.number == 1 else "utf-8"
        try:
            return raw.decode(codec)
        except UnicodeDecodeError as exc:
            if self._flaw is None:
                self._flaw = Problem(self.number, _not_utf8(exc))
            return raw.decode(codec, errors="replace")

    def take_flaw(self) -> Problem | None:
        """The first undecodable line since the last call, if any."""
        flaw, self._flaw = self._flaw, None
        return flaw


def _not_utf8(exc: UnicodeDecodeError) -> str:
    where = f"byte 0x{exc.object[exc.start]:02x}, column {exc.start + 1}"
    return f"not UTF-8 text ({where}): save the file as UTF-8"
