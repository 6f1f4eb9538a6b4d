"""The API's endpoints: each job type's method, path, limit key and repeat safety.

The one table that the jobs reader, the client, the run store and the sandbox all
read (reporting-api-rate-limits.md, section 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from batchrun.core.limits import LimitKey


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
