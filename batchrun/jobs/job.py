"""Jobs: the `Job` value, the rules its fields obey, and scanning a jobs file.

Every row of a jobs file is checked before anything is sent
(docs/reference/contract.md#the-jobs-file): `scan` turns each row that `jobfile.rows`
reads into a `Job` or a `Problem` (line and reason); no other exception escapes. Only
the ids seen so far (for duplicates) grow with the file, and the run store finds
duplicates in SQLite instead.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from batchrun.core import strict_json
from batchrun.core.errors import JobsFileError
from batchrun.core.limits import LimitKey
from batchrun.jobs.endpoints import (
    ENDPOINTS,
    WITH_BODY,
    Endpoint,
    JobType,
    Method,
    request_endpoint,
)
from batchrun.jobs.jobfile import (
    Problem,
    Row,
    is_jsonl,
    json_error,
    json_kind,
    rows,
    shown,
)
from batchrun.jobs.target import PLACEHOLDER, BadTarget, check_method, check_path


@dataclass(frozen=True, slots=True)
class Job:
    """One request to make: validated, immutable, and named by its unique `id`."""

    id: str
    type: JobType
    team_id: str | None = None
    payload: dict[str, Any] = field(default_factory=dict, compare=False)
    line: int = 0
    # A `request` job's method and path as written (`{team_id}` not yet filled).
    method: Method | None = None
    target: str | None = None

    @property
    def endpoint(self) -> Endpoint:
        if self.method is None or self.target is None:
            return ENDPOINTS[self.type]
        return request_endpoint(self.method, self.target, self.path)

    @property
    def key(self) -> LimitKey:
        return self.endpoint.key

    @property
    def path(self) -> str:
        """The request path, with `team_id` percent-encoded so it stays one segment."""
        template = self.target or ENDPOINTS[self.type].path
        return template.replace(PLACEHOLDER, quote(self.team_id or "", safe=""))

    @property
    def body(self) -> dict[str, Any] | None:
        """The JSON body to send: the payload, none for a GET or DELETE."""
        if self.method is not None and self.method not in WITH_BODY:
            return None
        return self.payload


@dataclass(frozen=True, slots=True)
class Summary:
    """What a valid jobs file holds, by type and by team, and by the budget each
    type's jobs draw on (`per_budget[key][type]`)."""

    total: int
    per_type: dict[JobType, int]
    per_team: dict[str, int]
    per_budget: dict[LimitKey, dict[JobType, int]] = field(default_factory=dict)


# Letters, digits and the unreserved marks of RFC 3986 only, so a team id is one
# path segment as written; `.` and `..` would be path steps, so no all-dots id either.
_TEAM_ID = re.compile(r"[A-Za-z0-9._~-]+")
# Control characters garble logs and the terminal; lone surrogates cannot be encoded.
_UNSAFE_TEXT = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_TYPES = "run-query, invite, avatar or request"


class _BadRow(Exception):
    """Raised by a row check; its one argument is the reason shown to the user."""


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
    per_budget: dict[LimitKey, Counter[JobType]] = {}
    for job in jobs:
        per_type[job.type] += 1
        per_budget.setdefault(job.key, Counter())[job.type] += 1
        if job.team_id is not None:
            per_team[job.team_id] += 1
    budgets = {key: dict(types) for key, types in per_budget.items()}
    return Summary(per_type.total(), dict(per_type), dict(per_team), budgets)


def scan(path: Path, *, check_duplicates: bool = True) -> Iterator[Job | Problem]:
    """Stream a CSV or JSONL jobs file, yielding each valid Job or a Problem.

    Duplicate ids are found with a set of the ids seen, unless the caller finds
    them itself (`check_duplicates=False`: the run store does, in SQLite, so that
    a huge file is taken in with memory that does not grow with it).
    """
    text_payload = not is_jsonl(path)
    yield from _jobs(rows(path), text_payload=text_payload, unique=check_duplicates)


def _jobs(
    found: Iterator[Row], *, text_payload: bool, unique: bool
) -> Iterator[Job | Problem]:
    seen: dict[str, int] | None = {} if unique else None
    for row in found:
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
    job_id = None
    try:
        # The id first, so a later duplicate is named even if this row is bad.
        job_id = _unique(_id(fields.get("id")), line, seen)
        kind = _type(fields.get("type"))
        payload = _payload(fields.get("payload"), text=text_payload)
        if kind is JobType.REQUEST:
            return _request(job_id, line, fields, payload)
        _no_target(fields, kind)
        team = _team(fields.get("team_id")) if ENDPOINTS[kind].needs_team else None
    except _BadRow as exc:
        return Problem(line, str(exc), job_id)
    return Job(job_id, kind, team, payload, line)


def _request(
    job_id: str, line: int, fields: dict[str, Any], payload: dict[str, Any]
) -> Job:
    """A `request` row: its method and path (never out of the base URL), a body
    only where the method has one, and the team its path names."""
    try:
        method = check_method(fields.get("method"))
        target = check_path(fields.get("path"))
    except BadTarget as exc:
        raise _BadRow(str(exc)) from None
    if payload and method not in WITH_BODY:
        msg = (
            f"a {method.value} request carries no payload: put its arguments in "
            "the path's query string (?name=value), or leave payload empty"
        )
        raise _BadRow(msg)
    team = None
    if PLACEHOLDER in target:
        team = _team(fields.get("team_id"), why=f"the path holds {PLACEHOLDER}")
    return Job(job_id, JobType.REQUEST, team, payload, line, method, target)


def _no_target(fields: dict[str, Any], kind: JobType) -> None:
    """`method` and `path` belong to request jobs; another type's row holding
    them would send to its own endpoint, not the one written."""
    for name in ("method", "path"):
        value = fields.get(name)
        if value is not None and not (isinstance(value, str) and not value.strip()):
            msg = (
                f"{name} is for request jobs: {_a(kind.value)} job goes to its own "
                "endpoint. Leave it empty, or make the job a request"
            )
            raise _BadRow(msg)


def _id(value: Any) -> str:
    if value is None:
        msg = "id is missing: every job needs a unique id"
        raise _BadRow(msg)
    if isinstance(value, bool) or not isinstance(value, str | int):
        msg = f"id must be a string or an integer, got {json_kind(value)}"
        raise _BadRow(msg)
    text = str(value).strip()
    if not text:
        msg = "id is empty: every job needs a unique id"
        raise _BadRow(msg)
    if _UNSAFE_TEXT.search(text):
        msg = f"id {shown(text)} holds a control character or a lone surrogate"
        raise _BadRow(msg)
    return text


def _unique(job_id: str, line: int, seen: dict[str, int] | None) -> str:
    if seen is None:
        return job_id
    first = seen.setdefault(job_id, line)
    if first != line:
        msg = f"duplicate id {shown(job_id)} (first on line {first})"
        raise _BadRow(msg)
    return job_id


def _type(value: Any) -> JobType:
    if value is None or (isinstance(value, str) and not value.strip()):
        msg = f"type is missing (expected {_TYPES})"
        raise _BadRow(msg)
    if not isinstance(value, str):
        msg = f"type must be a string, got {json_kind(value)}"
        raise _BadRow(msg)
    try:
        return JobType(value.strip())
    except ValueError:
        msg = f"unknown type {shown(value.strip())} (expected {_TYPES})"
        raise _BadRow(msg) from None


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _team(value: Any, *, why: str = "run-query and invite jobs need a team") -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        msg = f"team_id is missing: {why}"
        raise _BadRow(msg)
    if not isinstance(value, str):
        msg = f"team_id must be a string, got {json_kind(value)}"
        raise _BadRow(msg)
    if not _TEAM_ID.fullmatch(value) or not value.strip("."):
        msg = (
            f"team_id {shown(value)} may hold only letters, digits, '.', '_', '~' "
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
            msg = f"payload is not valid JSON ({json_error(exc)})"
            raise _BadRow(msg) from None
    if not isinstance(value, dict):
        msg = f"payload must be a JSON object {{...}}, got {json_kind(value)}"
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
