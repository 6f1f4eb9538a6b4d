"""Durations as people write and read them: one parse and two formats.

`parse` reads the grammar of windows and deadlines (`55m`, `1.5h`, `500ms`, a bare
unit meaning 1 of it); `compact` writes a window back in that grammar, so that
`parse(compact(s)) == s` for the windows people write; `spoken` is for logs and
views (`850 ms`, `4.2 s`, `3 m 20 s`, `3 h 59 m`).
"""

from __future__ import annotations

import re

from batchrun.core.errors import UsageError

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# A number (optional: a bare unit means 1 of it) and a unit.
PATTERN = r"(\d+(?:\.\d+)?|\.\d+)?\s*(ms|s|m|h|d)"
_DURATION = re.compile(rf"^\s*{PATTERN}\s*$")


def seconds(number: str | None, unit: str) -> float:
    """The seconds in a matched number and unit of `PATTERN`."""
    return float(number or 1) * _UNIT_SECONDS[unit]


def parse(text: str) -> float:
    """Seconds in a duration like `55m`, `90s`, `1.5h` or `500ms`."""
    match = _DURATION.match(text)
    if match is None or not float(match.group(1) or 1) > 0:
        msg = (
            f"bad duration {text!r}: expected a number with unit ms, s, m, h or d (55m)"
        )
        raise UsageError(msg)
    return seconds(*match.groups())


def compact(value: float) -> str:
    """A duration in the rule grammar: `2s`, `1m`, `5m`, `1h`, `1d`, `250ms`, `1.5s`."""
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_SECONDS[unit]
        if value >= size and (value / size).is_integer():
            return f"{int(value / size)}{unit}"
    if value < 1 and (value * 1000).is_integer():
        return f"{int(value * 1000)}ms"
    if value < 1:
        return f"{value * 1000:.3g}ms"  # a scaled window: 33.3ms, not 0.0333333s
    return f"{value:g}s"


def spoken(value: float) -> str:
    """A duration for people: `850 ms`, `4.2 s`, `3 m 20 s`, `3 h 59 m`."""
    ms = round(max(0.0, value) * 1000)
    if ms < 1000:
        return f"{ms} ms"
    if ms < 59_950:
        return f"{ms / 1000:.1f} s"
    whole = round(ms / 1000)
    if whole < 3600:
        return f"{whole // 60} m {whole % 60} s"
    minutes = round(whole / 60)
    return f"{minutes // 60} h {minutes % 60} m"
