"""What a server says about its rate limits in its response headers.

Holds `Hints` and `read_hints`, which read `Retry-After` (RFC 9110), both
generations of the IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers:
`RateLimit-Limit`/`-Remaining`/`-Reset` and `RateLimit-Policy: 100;w=60` up to
draft 06, the `RateLimit: limit=…, remaining=…, reset=…` dictionary of draft 07,
and `RateLimit-Policy: "name";q=…;w=…` with `RateLimit: "name";r=…;t=…` from
draft 08 on) and the `X-RateLimit-*` family.

Invariant: `read_hints` never raises, whatever the header bytes; every wait it
returns is finite and within [0, cap]; every value it ignored or capped is named
in one note, so the caller can say why it did not follow the server.
"""

import datetime
import email.utils
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from batchrun.core.limits import Window

# Display spellings, for notes; `headers` arrives with lower-case names.
_NAMES = {
    "retry-after": "Retry-After",
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
_SIGNED_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_DURATION_PART = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,9})?)(ms|h|m|s)")
_DURATION = re.compile(f"(?:{_DURATION_PART.pattern})+")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = re.compile(r"[0-9]{1,15}(\.[0-9]{1,9})?")


@dataclass(frozen=True, slots=True)
class Hints:
    """What the response's headers say about the server's limits.

    `retry_after` and `reset` are seconds from now, capped. `policy` holds the
    windows the server states it enforces; `remaining` and `reset` describe the
    quota with the fewest requests left (for 0 left, the one that refills last).
    The caller decides whether `retry_after` applies: slowapi sends it on 2xx
    answers too, where it only repeats the window's reset.
    """

    retry_after: float | None = None
    policy: tuple[Window, ...] = ()
    remaining: int | None = None
    reset: float | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Quota:
    """One stated quota's state: requests left and seconds until it refills."""

    remaining: int | None
    reset: float | None


@dataclass(frozen=True, slots=True)
class _Member:
    """One member of a structured-field list or dictionary, values as written."""

    key: str | None
    value: str
    params: Mapping[str, str]


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
        moment = _http_date(value)
        seconds = None if moment is None else max(moment - reading.now, 0.0)
    if seconds is None:
        reading.ignore("retry-after", value, "neither seconds nor an HTTP date")
    elif seconds < 0:
        reading.ignore("retry-after", value, "a negative wait")
    else:
        return reading.wait("retry-after", seconds)
    return None


def _delta_seconds(value: str) -> float | None:
    """The number, or the largest of a repeated header's numbers ("60, 60")."""
    numbers = [_float(part) for part in value.split(",")]
    if not numbers or any(number is None for number in numbers):
        return None
    return max(number for number in numbers if number is not None)


def _float(text: str) -> float | None:
    """A decimal, perhaps negative (for its own note); "inf", "nan", "1e3" are not.

    Digits too many for a float give inf, which is then capped: the server
    asked for a very long wait, not for none.
    """
    text = text.strip()
    return float(text) if _SIGNED_DECIMAL.fullmatch(text) else None


def _http_date(value: str) -> float | None:
    """Epoch seconds of an IMF-fixdate, RFC 850 or asctime date, else None.

    An HTTP-date is always GMT (RFC 9110 5.6.7), so a date without a zone
    (asctime) or with `-0000` (as `email.utils.formatdate()` writes it, and for
    which `parsedate_to_datetime` returns a naive datetime) is read as UTC.
    """
    try:
        parts = email.utils.parsedate_tz(value)
        if parts is None:
            return None
        # datetime, unlike calendar.timegm, refuses "32 Nov" instead of rolling over.
        moment = datetime.datetime(*parts[:6], tzinfo=datetime.UTC)
        return moment.timestamp() - (parts[9] or 0)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


# --- IETF RateLimit fields ----------------------------------------------------


def _read_policy(value: str | None, reading: _Reading) -> None:
    """Windows of `RateLimit-Policy`: `100;w=60` or `"burst";q=100;w=60`."""
    for member in _members(value or ""):
        quota = member.params.get("q", member.params.get("l", member.value))
        unit = _unquote(member.params.get("qu", "requests"))
        if unit not in _REQUEST_UNITS:
            why = f"quota unit {unit[:20]!r} is not requests"
            reading.ignore("ratelimit-policy", _text(member), why)
        else:
            _add_window(quota, member.params.get("w"), member, reading)


def _add_window(
    quota: str, window: str | None, member: _Member, reading: _Reading
) -> None:
    count, seconds = _count(quota), _seconds(window or "")
    if count is None or count < 1 or seconds is None or seconds <= 0:
        why = "needs a quota of 1 or more and a window (w) of more than 0 s"
        reading.ignore("ratelimit-policy", _text(member), why)
    else:
        reading.policy.append(Window(count, seconds))


def _read_ratelimit(value: str | None, reading: _Reading) -> None:
    """`RateLimit`: draft 07's `limit=, remaining=, reset=` or later `"x";r=;t=`."""
    members = list(_members(value or ""))
    if any(member.key is not None for member in members):
        fields = {m.key: m.value for m in members if m.key is not None}
        remaining, reset = fields.get("remaining"), fields.get("reset")
        _add_quota("ratelimit", remaining, reset, reading, reset_name=_RESET)
    for member in members:
        if member.key is None:
            r, t = member.params.get("r"), member.params.get("t")
            _add_quota("ratelimit", r, t, reading, reset_name=_RESET)


def _read_separate(headers: Mapping[str, str], reading: _Reading) -> None:
    """Drafts up to 06: `RateLimit-Limit` (may carry `;w=`), `-Remaining`, `-Reset`."""
    for member in _members(headers.get("ratelimit-limit", "")):
        if "w" in member.params:
            _add_window(member.value, member.params["w"], member, reading)
    remaining = headers.get("ratelimit-remaining")
    reset = headers.get("ratelimit-reset")
    if remaining is not None or reset is not None:
        _add_quota("ratelimit-remaining", remaining, reset, reading)


def _read_family(
    headers: Mapping[str, str],
    remaining: str,
    resets: tuple[str, ...],
    reading: _Reading,
) -> None:
    """One `X-RateLimit-*` family; its `-Limit` states no window, so no rule."""
    text = headers.get(remaining)
    reset_name = next((name for name in resets if name in headers), None)
    if text is None and reset_name is None:
        return
    reset = None if reset_name is None else headers[reset_name]
    _add_quota(remaining, text, reset, reading, reset_name=reset_name)


def _add_quota(
    name: str,
    remaining: str | None,
    reset: str | None,
    reading: _Reading,
    *,
    reset_name: str | None = None,
) -> None:
    left = None if remaining is None else _smallest_count(name, remaining, reading)
    reset_name = reset_name or name.replace("remaining", "reset")
    seconds = None if reset is None else _reset(reset_name, reset, reading)
    if left is not None or seconds is not None:
        reading.quotas.append(_Quota(left, seconds))


def _smallest_count(name: str, text: str, reading: _Reading) -> int | None:
    counts = [_count(part.strip()) for part in text.split(",")]
    if any(count is None for count in counts):
        reading.ignore(name, text, "not a whole number of requests")
        return None
    return min(count for count in counts if count is not None)


def _reset(name: str, text: str, reading: _Reading) -> float | None:
    """Seconds until the quota refills, from a delta or an epoch (see top)."""
    values = [_reset_value(part.strip()) for part in text.split(",")]
    if any(value is None for value in values):
        reading.ignore(name, text, "not a number of seconds of 0 or more")
        return None
    value = max(value for value in values if value is not None)
    if value >= _EPOCH_MILLISECONDS:
        value = value / 1000 - reading.now
    elif value >= _EPOCH_SECONDS:
        value -= reading.now
    return reading.wait(name, value)


# --- a tolerant reader for the structured fields (RFC 8941) these use ---------


def _members(value: str) -> Iterator[_Member]:
    """Members of a list or dictionary; a dictionary member has a `key`.

    Tolerant on purpose: it splits on commas and semicolons outside quotes and
    never rejects a whole field, as a strict RFC 8941 parser must, because a
    stock server that gets one parameter wrong still states a usable limit.
    """
    for text in _split(value, ","):
        value_text, *param_texts = _split(text, ";")
        if not value_text:
            continue
        key, sep, rest = value_text.partition("=")
        quoted = value_text.startswith('"')
        params = dict(_param(param) for param in param_texts if param)
        if sep and not quoted:
            yield _Member(key.strip(), rest.strip(), params)
        else:
            yield _Member(None, value_text, params)


def _param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    return key.strip().lower(), value.strip() if sep else "?1"


def _split(value: str, separator: str) -> list[str]:
    """Stripped pieces of `value` between `separator`s outside double quotes."""
    pieces, start, quoted, escaped = [], 0, False, False
    for index, char in enumerate(value):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            pieces.append(value[start:index].strip())
            start = index + 1
    pieces.append(value[start:].strip())
    return pieces


def _unquote(text: str) -> str:
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _count(text: str) -> int | None:
    """A structured-field integer (at most 15 digits), else None."""
    return int(text) if _NUMBER.fullmatch(text) and "." not in text else None


def _seconds(text: str) -> float | None:
    """A non-negative structured-field integer or decimal, else None."""
    return float(text) if _NUMBER.fullmatch(text) else None


def _reset_value(text: str) -> float | None:
    seconds = _seconds(text)
    return seconds if seconds is not None else _duration(text)


def _duration(text: str) -> float | None:
    """Seconds of a Go-style duration such as "1h2m3.5s" or "20ms", else None."""
    if not _DURATION.fullmatch(text):
        return None
    parts = _DURATION_PART.findall(text)
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def _text(member: _Member) -> str:
    params = "".join(f";{key}={value}" for key, value in member.params.items())
    return member.value + params


def _display(name: str) -> str:
    return _NAMES.get(name) or "-".join(
        "RateLimit" if part == "ratelimit" else part.title() for part in name.split("-")
    )


def _short(value: str) -> str:
    """`value` repr'd, cut to 40 characters, so a hostile header stays readable."""
    return repr(value if len(value) <= 40 else value[:39] + "…")
