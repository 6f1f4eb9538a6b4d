"""Where a `request` job goes: its method and path, checked so that the request
never leaves the base URL.

Invariant: a path that `check_path` returns, with `{team_id}` filled by a valid
team id, names a resource under the base URL and nowhere else: it starts with one
`/`, has no scheme or host, no `..` or `.` step, no `//`, no backslash, and no
escape that decodes to any of these (however many times a server decodes it). So
the token, sent with every request, goes only where the base URL points.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from batchrun.jobs.endpoints import Method
from batchrun.jobs.jobfile import json_kind, shown

PLACEHOLDER = "{team_id}"
# Far beyond any real path; servers commonly refuse request lines over 8 KiB.
MAX_PATH = 4096
_METHODS = ", ".join(m.value for m in Method)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# Control characters and whitespace garble logs and the request line; a fragment
# (`#`) is never sent; a backslash is a slash to some servers.
_UNSAFE = re.compile(r"[\x00-\x20\x7f-\x9f\ud800-\udfff#\\]")
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
# Decoding more often than this finds nothing new in any real path.
_DECODINGS = 4


class BadTarget(Exception):
    """Raised when a method or path cannot be a request job's; its argument is
    the reason shown to the user."""


def check_method(value: Any) -> Method:
    """The method a row names (any case), or BadTarget."""
    if value is None or (isinstance(value, str) and not value.strip()):
        msg = f"method is missing: a request job needs one of {_METHODS}"
        raise BadTarget(msg)
    if not isinstance(value, str):
        msg = f"method must be a string, got {json_kind(value)}"
        raise BadTarget(msg)
    try:
        return Method(value.strip().upper())
    except ValueError:
        msg = f"unknown method {shown(value.strip())} (expected {_METHODS})"
        raise BadTarget(msg) from None


def check_path(value: Any) -> str:
    """The path a row names, as written, or BadTarget saying why it could leave
    the base URL (or cannot be sent)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        msg = "path is missing: a request job needs a path such as /teams/{team_id}/x"
        raise BadTarget(msg)
    if not isinstance(value, str):
        msg = f"path must be a string, got {json_kind(value)}"
        raise BadTarget(msg)
    if len(value) > MAX_PATH:
        msg = f"path is longer than {MAX_PATH} characters"
        raise BadTarget(msg)
    _check_start(value)
    route, _, query = value.partition("?")
    _check_route(value, route)
    _check_braces(value, route, query)
    return value


def _check_start(path: str) -> None:
    outside = "a path is relative to the base URL and starts with '/'"
    if _SCHEME.match(path):
        msg = f"path {shown(path)} names a scheme (an absolute URL?): {outside}"
        raise BadTarget(msg)
    if path.startswith("//"):
        msg = f"path {shown(path)} starts with '//', which names a host: {outside}"
        raise BadTarget(msg)
    if not path.startswith("/"):
        msg = f"path {shown(path)} does not start with '/': {outside}"
        raise BadTarget(msg)
    if _UNSAFE.search(path):
        msg = (
            f"path {shown(path)} holds a space, control character, '#' or '\\': "
            "percent-encode them (a space is %20)"
        )
        raise BadTarget(msg)


def _check_route(path: str, route: str) -> None:
    """The part before `?`, and what it decodes to, never steps out."""
    decoded = route
    for _ in range(_DECODINGS):
        if _ENCODED_SEPARATOR.search(decoded):
            msg = (
                f"path {shown(path)} holds an encoded slash or backslash "
                "(%2F, %5C), which a server may read as a path separator"
            )
            raise BadTarget(msg)
        _check_steps(path, decoded)
        once = unquote(decoded)
        if once == decoded:
            return
        decoded = once


def _check_steps(path: str, route: str) -> None:
    if "//" in route:
        msg = f"path {shown(path)} holds '//' (an empty step, or a host)"
        raise BadTarget(msg)
    if any(step in (".", "..") for step in route.split("/")):
        msg = (
            f"path {shown(path)} holds a '.' or '..' step, which could climb out "
            "of the base URL"
        )
        raise BadTarget(msg)


def _check_braces(path: str, route: str, query: str) -> None:
    rest = route.replace(PLACEHOLDER, "") + query.replace(PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        msg = (
            f"path {shown(path)} holds a brace: only {PLACEHOLDER} is filled in; "
            "write a literal brace as %7B or %7D"
        )
        raise BadTarget(msg)
