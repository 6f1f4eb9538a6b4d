"""Values of rate-limit header fields, read tolerantly: numbers, durations, dates,
and the members of a structured-field list or dictionary (RFC 9651).

Invariant: every reader returns None (or skips a member) for what it cannot read;
none raises, whatever the bytes.

Not a structured-field library (http-sf): RFC 9651 has a parser drop the whole
field at the first error, and a server that writes one key in capitals, spaces
around `=` or an unclosed string in one member would then state no limit at all.
"""

import datetime
import email.utils
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

_SIGNED_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_DURATION_PART = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,9})?)(ms|h|m|s)")
_DURATION = re.compile(f"(?:{_DURATION_PART.pattern})+")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = re.compile(r"[0-9]{1,15}(\.[0-9]{1,9})?")
# RFC 3339 section 5.6 date-time: a date, "T" (or a space, as RFC 3339 allows and
# many servers write), a time, and a zone that is "Z" or an offset.
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a structured-field list or dictionary, values as written."""

    key: str | None
    value: str
    params: Mapping[str, str]

    def text(self) -> str:
        """The member as written back, for a note."""
        params = "".join(f";{key}={value}" for key, value in self.params.items())
        return self.value + params


def members(value: str) -> Iterator[Member]:
    """Members of a list or dictionary; a dictionary member has a `key`.

    Tolerant on purpose: it splits on commas and semicolons outside quotes and
    never rejects a whole field, as a strict RFC 9651 parser must, because a
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
            yield Member(key.strip(), rest.strip(), params)
        else:
            yield Member(None, value_text, params)


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


def unquote(text: str) -> str:
    """A structured-field string's content; any other text as it is."""
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def signed_float(text: str) -> float | None:
    """A decimal, perhaps negative (for its own note); "inf", "nan", "1e3" are not.

    Digits too many for a float give inf, which is then capped: the server
    asked for a very long wait, not for none.
    """
    text = text.strip()
    return float(text) if _SIGNED_DECIMAL.fullmatch(text) else None


def whole(text: str) -> int | None:
    """A count of 0 or more: an integer, or a decimal rounded down ("3.0" is 3,
    "2.5" is 2, which never reads more room than the server stated), else None."""
    seconds = decimal(text)
    return None if seconds is None else math.floor(seconds)


def decimal(text: str) -> float | None:
    """A non-negative structured-field integer or decimal, else None."""
    return float(text) if _NUMBER.fullmatch(text) else None


def duration(text: str) -> float | None:
    """Seconds of a Go-style duration such as "1h2m3.5s" or "20ms", else None."""
    if not _DURATION.fullmatch(text):
        return None
    parts = _DURATION_PART.findall(text)
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def rfc3339(text: str) -> float | None:
    """Epoch seconds of an RFC 3339 date-time ("2026-11-23T10:23:26Z"), else None."""
    if not _RFC3339.fullmatch(text):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:  # a 30th of February, an hour 25
        return None
    return moment.timestamp()


def http_date(value: str) -> float | None:
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
