"""The API's endpoints: each job type's method, path, limit key and repeat safety.

The one table that the jobs reader, the client, the run store and the sandbox all
read (docs/reference/contract.md#the-api), and `resolve`, which names the
budget a `request` job draws on: the server's, found from its method and path, so
a request that names a limited endpoint is paced by that endpoint's rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from urllib.parse import unquote

from batchrun.core.limits import LimitKey


class JobType(StrEnum):
    """The kinds of job a file may hold: one per known endpoint, and `request`,
    any method and path the user names."""

    RUN_QUERY = "run-query"
    INVITE = "invite"
    AVATAR = "avatar"
    REQUEST = "request"


class Method(StrEnum):
    """The methods a `request` job may use."""

    GET = "GET"
    POST = "POST"
    PUT = "PUT"
    PATCH = "PATCH"
    DELETE = "DELETE"


# RFC 9110 section 9.2.2: a repeated GET, PUT or DELETE has the effect of one.
IDEMPOTENT = frozenset({Method.GET, Method.PUT, Method.DELETE})
# RFC 9110 section 9.3: the methods whose request content has a defined meaning.
WITH_BODY = frozenset({Method.POST, Method.PUT, Method.PATCH})


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


def _pattern(template: str) -> re.Pattern[str]:
    # `{team_id}` is one path segment, whatever the team.
    parts = [re.escape(part) for part in template.split("{team_id}")]
    return re.compile("[^/]+".join(parts))


_LIMITED = tuple(
    (end.method, _pattern(end.path), end.key) for end in ENDPOINTS.values()
)


@lru_cache(maxsize=4096)
def resolve(method: str, path: str) -> LimitKey:
    """The budget the server counts `method path` against: the key of the limited
    endpoint it names (section 8, rule 2), else `global`.

    The path is read as the server would route it: without its query string,
    percent-escapes decoded, one trailing slash dropped; the method must match
    too (`GET .../run-query` is not the run-query endpoint).
    """
    route = unquote(path.partition("?")[0])
    if len(route) > 1:
        route = route.removesuffix("/")
    for end_method, pattern, key in _LIMITED:
        if method == end_method and pattern.fullmatch(route):
            return key
    return LimitKey.GLOBAL


def request_endpoint(method: str, template: str, path: str) -> Endpoint:
    """The endpoint of a `request` job: its own method and path template, the
    budget the server counts `path` (the template filled) against, and repeat
    safety by its method (RFC 9110), whichever endpoint it names."""
    return Endpoint(
        method,
        template,
        resolve(method, path),
        "{team_id}" in template,
        Method(method) in IDEMPOTENT,
    )
