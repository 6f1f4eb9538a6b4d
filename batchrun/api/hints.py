"""What a server says about its rate limits in its response headers.

Holds `Hints` and `read_hints`, which read `Retry-After` (RFC 9110) and
`Retry-After-Ms` (OpenAI, Azure), both generations of the IETF RateLimit fields
(draft-ietf-httpapi-ratelimit-headers: `RateLimit-Limit`/`-Remaining`/`-Reset`
and `RateLimit-Policy: 100;w=60` up to draft 06, the `RateLimit: limit=…,
remaining=…, reset=…` dictionary of draft 07, and from draft 08 to 11
`RateLimit-Policy: name;q=…;qu=…;w=…;pk=…` (a token or a string names the
policy; `qu` defaults to "request"; a policy without `w` states no window) with
`RateLimit: name;r=…;t=…`) and the `X-RateLimit-*` family. Counts may be
written as decimals ("3.0"), resets as a delta, an epoch, a Go-style duration
("6m0s") or an RFC 3339 date-time.

Invariant: `read_hints` never raises, whatever the header bytes; every wait it
returns is finite and within [0, cap]; every value it ignored or capped is named
in one note, so the caller can say why it did not follow the server.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from batchrun.api.fields import (
    Member,
    decimal,
    duration,
    http_date,
    members,
    rfc3339,
    signed_float,
    unquote,
    whole,
)
from batchrun.core.limits import Window

# Longest Retry-After honoured for a key whose windows are all shorter; a key's
# longest window raises it (`api.client.Client(waits=…)`): a 500/1h key told to
# wait 40 min waits 40 min. A server asking for more is capped, with a note.
RETRY_AFTER_CAP = 900.0

# Display spellings, for notes; `headers` arrives with lower-case names.
_NAMES = {
    "retry-after": "Retry-After",
    "retry-after-ms": "Retry-After-Ms",
    "ratelimit": "RateLimit",
    "ratelimit reset": "RateLimit reset",
    "ratelimit-policy": "RateLimit-Policy",
    "ratelimit-limit": "RateLimit-Limit",
    "ratelimit-remaining": "RateLimit-Remaining",
    "ratelimit-reset": "RateLimit-Reset",
}
# (remaining, (reset, …)) of each X- family: GitHub and slowapi, Twitter,
# Discord, and OpenAI's per-request one (whose reset reads like "6m0s").
_X_FAMILIES = (
    ("x-ratelimit-remaining", ("x-ratelimit-reset", "x-ratelimit-reset-after")),
    ("x-rate-limit-remaining", ("x-rate-limit-reset", "x-rate-limit-reset-after")),
    ("x-ratelimit-remaining-requests", ("x-ratelimit-reset-requests",)),
)
# Quota units that count requests: "requests" in draft 08's prose, "request" in
# its registry; a policy in bytes or concurrency is no request rate.
_REQUEST_UNITS = frozenset({"request", "requests"})
# A reset is a delta, or a moment since the epoch in seconds or milliseconds. No
# server means a delta of 31 years (1e9 s), nor an epoch in seconds past the
# year 5000 (1e11 s): so 1e9 <= v < 1e11 is epoch seconds (years 2001-5138) and
# v >= 1e11 is epoch milliseconds (from 1973 on).
_EPOCH_SECONDS = 1e9
_EPOCH_MILLISECONDS = 1e11
_RESET = "ratelimit reset"


@dataclass(frozen=True, slots=True)
class Hints:
    """What the response's headers say about the server's limits.

    `retry_after` and `reset` are seconds from now, capped. `policy` holds the
    windows the server states it enforces; `remaining` and `reset` describe the
    quota with the fewest requests left (for 0 left, the one that refills last).
    `limit` is that quota's stated count, where no window is stated with it
    (`X-RateLimit-Limit`, `RateLimit-Limit` without `w`, draft 07's `limit`).
    The caller decides whether `retry_after` applies: slowapi sends it on 2xx
    answers too, where it only repeats the window's reset.
    """

    retry_after: float | None = None
    policy: tuple[Window, ...] = ()
    remaining: int | None = None
    reset: float | None = None
    notes: tuple[str, ...] = ()
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class _Quota:
    """One stated quota's state: requests left and seconds until it refills,
    and its count where one is stated."""

    remaining: int | None
    reset: float | None
    limit: int | None = None


class _Reading:
    """What the readers found so far; mutable so each reader only appends."""

    __slots__ = ("cap", "notes", "now", "policy", "quotas")

    def __init__(self, *, now: float, cap: float) -> None:
        self.now = now
        self.cap = cap
        self.policy: list[Window] = []
        self.quotas: list[_Quota] = []
        self.notes: list[str] = []

    def ignore(self, name: str, value: str, why: str) -> None:
        self.notes.append(f"{_display(name)} {_short(value)} ignored: {why}")

    def wait(self, name: str, seconds: float) -> float:
        """`seconds` capped at `cap`, with a note when it was."""
        if seconds <= self.cap:
            return max(seconds, 0.0)
        self.notes.append(
            f"{_display(name)} of {seconds:.0f} s capped at {self.cap:g} s"
        )
        return float(self.cap)


def read_hints(headers: Mapping[str, str], *, now: float, cap: float) -> Hints:
    """Read the rate-limit headers of one response; never raises.

    Args:
        headers: lower-case names; a repeated header joined with ", ".
        now: wall-clock epoch seconds, for HTTP dates and epoch resets.
        cap: the longest wait to report; longer ones are capped, with a note.
    """
    reading = _Reading(now=now, cap=cap)
    # Milliseconds are the finer statement of the same wait: they come first.
    retry_after = _read_retry_after_ms(headers.get("retry-after-ms"), reading)
    if retry_after is None:
        retry_after = _read_retry_after(headers.get("retry-after"), reading)
    _read_policy(headers.get("ratelimit-policy"), reading)
    _read_ratelimit(headers.get("ratelimit"), reading)
    _read_separate(headers, reading)
    for remaining, resets in _X_FAMILIES:
        _read_family(headers, remaining, resets, reading)
    quota = _most_restrictive(reading.quotas)
    return Hints(
        retry_after=retry_after,
        policy=tuple(dict.fromkeys(reading.policy)),
        remaining=quota.remaining,
        reset=quota.reset,
        notes=tuple(reading.notes),
        limit=quota.limit,
    )


def _most_restrictive(quotas: list[_Quota]) -> _Quota:
    """The fewest requests left; among equals, the one that refills last."""
    known = [quota for quota in quotas if quota.remaining is not None]
    if known:
        return min(known, key=lambda q: (q.remaining, -(q.reset or 0.0)))
    resets = [quota.reset for quota in quotas if quota.reset is not None]
    return _Quota(None, max(resets) if resets else None)


# --- Retry-After --------------------------------------------------------------


def _read_retry_after(value: str | None, reading: _Reading) -> float | None:
    """Seconds to wait from delta-seconds or an HTTP-date; past dates give 0."""
    if value is None:
        return None
    seconds = _delta_seconds(value)
    if seconds is None:
        moment = http_date(value)
        seconds = None if moment is None else max(moment - reading.now, 0.0)
    if seconds is None:
        reading.ignore("retry-after", value, "neither seconds nor an HTTP date")
    elif seconds < 0:
        reading.ignore("retry-after", value, "a negative wait")
    else:
        return reading.wait("retry-after", seconds)
    return None


def _read_retry_after_ms(value: str | None, reading: _Reading) -> float | None:
    """Seconds to wait from `Retry-After-Ms`, a count of milliseconds."""
    if value is None:
        return None
    milliseconds = _delta_seconds(value)
    if milliseconds is None or milliseconds < 0:
        reading.ignore("retry-after-ms", value, "not a number of milliseconds")
        return None
    return reading.wait("retry-after-ms", milliseconds / 1000)


def _delta_seconds(value: str) -> float | None:
    """The number, or the largest of a repeated header's numbers ("60, 60")."""
    numbers = [signed_float(part) for part in value.split(",")]
    if not numbers or any(number is None for number in numbers):
        return None
    return max(number for number in numbers if number is not None)


# --- IETF RateLimit fields ----------------------------------------------------


def _read_policy(value: str | None, reading: _Reading) -> None:
    """Windows of `RateLimit-Policy`: `100;w=60` or `"burst";q=100;w=60`."""
    for member in members(value or ""):
        quota = member.params.get("q", member.params.get("l", member.value))
        unit = unquote(member.params.get("qu", "request"))
        if unit not in _REQUEST_UNITS:
            why = f"quota unit {unit[:20]!r} is not requests"
            reading.ignore("ratelimit-policy", member.text(), why)
        else:
            _add_window(quota, member.params.get("w"), member, reading)


def _add_window(
    quota: str, window: str | None, member: Member, reading: _Reading
) -> None:
    count, seconds = whole(quota), decimal(window or "")
    if count is None or count < 1 or seconds is None or seconds <= 0:
        why = "needs a quota of 1 or more and a window (w) of more than 0 s"
        reading.ignore("ratelimit-policy", member.text(), why)
    else:
        reading.policy.append(Window(count, seconds))


def _read_ratelimit(value: str | None, reading: _Reading) -> None:
    """`RateLimit`: draft 07's `limit=, remaining=, reset=` or later `"x";r=;t=`."""
    items = list(members(value or ""))
    if any(member.key is not None for member in items):
        fields = {m.key: m.value for m in items if m.key is not None}
        remaining, reset = fields.get("remaining"), fields.get("reset")
        limit = fields.get("limit")
        _add_quota(
            "ratelimit", remaining, reset, reading, reset_name=_RESET, limit=limit
        )
    for member in items:
        if member.key is None:
            r, t = member.params.get("r"), member.params.get("t")
            _add_quota("ratelimit", r, t, reading, reset_name=_RESET)


def _read_separate(headers: Mapping[str, str], reading: _Reading) -> None:
    """Drafts up to 06: `RateLimit-Limit` (may carry `;w=`), `-Remaining`, `-Reset`."""
    limit = None
    for member in members(headers.get("ratelimit-limit", "")):
        if "w" in member.params:
            _add_window(member.value, member.params["w"], member, reading)
        elif limit is None:  # the first, the quota `-Remaining` describes
            limit = member.value
    remaining = headers.get("ratelimit-remaining")
    reset = headers.get("ratelimit-reset")
    if remaining is not None or reset is not None:
        _add_quota("ratelimit-remaining", remaining, reset, reading, limit=limit)


def _read_family(
    headers: Mapping[str, str],
    remaining: str,
    resets: tuple[str, ...],
    reading: _Reading,
) -> None:
    """One `X-RateLimit-*` family; its `-Limit` is a count with no window."""
    text = headers.get(remaining)
    reset_name = next((name for name in resets if name in headers), None)
    if text is None and reset_name is None:
        return
    reset = None if reset_name is None else headers[reset_name]
    limit = headers.get(remaining.replace("remaining", "limit"))
    _add_quota(remaining, text, reset, reading, reset_name=reset_name, limit=limit)


def _add_quota(
    name: str,
    remaining: str | None,
    reset: str | None,
    reading: _Reading,
    *,
    reset_name: str | None = None,
    limit: str | None = None,
) -> None:
    left = None if remaining is None else _smallest_count(name, remaining, reading)
    reset_name = reset_name or name.replace("remaining", "reset")
    seconds = None if reset is None else _reset(reset_name, reset, reading)
    count = None if limit is None else _stated_count(name, limit, reading)
    if left is not None or seconds is not None:
        reading.quotas.append(_Quota(left, seconds, count))


def _stated_count(name: str, text: str, reading: _Reading) -> int | None:
    """A quota's stated count (1 or more), or None with a note; a repeated
    header's several counts are not paired with its resets, so none is."""
    name = name.replace("remaining", "limit")
    if "," in text:
        reading.ignore(name, text, "several counts, none paired with a reset")
        return None
    count = _smallest_count(name, text, reading)
    if count is not None and count < 1:
        reading.ignore(name, text, "a limit below 1")
        return None
    return count


def _smallest_count(name: str, text: str, reading: _Reading) -> int | None:
    counts = [whole(part.strip()) for part in text.split(",")]
    if any(count is None for count in counts):
        reading.ignore(name, text, "not a whole number of requests")
        return None
    return min(count for count in counts if count is not None)


def _reset(name: str, text: str, reading: _Reading) -> float | None:
    """Seconds until the quota refills, from a delta, an epoch (see top) or an
    RFC 3339 date-time; the latest of a repeated header's values."""
    values = [_reset_delay(part.strip(), reading.now) for part in text.split(",")]
    if any(value is None for value in values):
        reading.ignore(name, text, "not a number of seconds of 0 or more")
        return None
    return reading.wait(name, max(value for value in values if value is not None))


def _reset_delay(text: str, now: float) -> float | None:
    """Seconds from `now` until the moment `text` names."""
    moment = rfc3339(text)
    if moment is not None:
        return moment - now
    value = decimal(text)
    if value is None:
        return duration(text)
    if value >= _EPOCH_MILLISECONDS:
        return value / 1000 - now
    return value - now if value >= _EPOCH_SECONDS else value


def _display(name: str) -> str:
    return _NAMES.get(name) or "-".join(
        "RateLimit" if part == "ratelimit" else part.title() for part in name.split("-")
    )


def _short(value: str) -> str:
    """`value` repr'd, cut to 40 characters, so a hostile header stays readable."""
    return repr(value if len(value) <= 40 else value[:39] + "…")
