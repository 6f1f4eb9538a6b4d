"""Jobs: the `Job` value, the endpoint table, and reading + validating jobs files.

A jobs file is read line by line; every row is checked before anything is sent
(CONTRACT.md section 1), and every bad row is reported with its line number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from batchrun.limits import LimitKey


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
