"""Limit rules as values: `Window`, `Rule`, the rule grammar, profiles and the table.

A rule is one or more windows that all hold at once: `15/1m+500/1h` allows at most 15
requests in any 60 s and at most 500 in any 3600 s. Values are checked when built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from batchrun.core import durations
from batchrun.core.errors import StateError, UsageError

_WINDOW = re.compile(rf"^\s*(\d+)\s*/\s*{durations.PATTERN}\s*$")
_GRAMMAR_HINT = (
    "A rule is COUNT/WINDOW, several joined by '+'; WINDOW is a number with unit "
    "ms, s, m, h or d (a bare unit means 1 of it). Examples: 30/1m, 15/m+500/1h, "
    "1000/1d."
)


class LimitKey(StrEnum):
    """The budgets requests draw on: one per limited endpoint, and the global one."""

    RUN_QUERY = "run-query"
    INVITE = "invite"
    AVATAR = "avatar"
    GLOBAL = "global"


class Profile(StrEnum):
    """The two published statements of the run-query limit, or `auto`: paced by
    the looser (A) while the stricter (B) is not ruled out, and by B as soon as the
    server shows A is too loose (`fallbacks`)."""

    A = "a"
    B = "b"
    AUTO = "auto"


class Pace(StrEnum):
    """`exact`: as early as the windows allow; `spread`: evenly at the long-run rate."""

    EXACT = "exact"
    SPREAD = "spread"


@dataclass(frozen=True, slots=True)
class Window:
    """At most `count` requests within any interval of `seconds`."""

    count: int
    seconds: float

    def __post_init__(self) -> None:
        if self.count < 1:
            msg = f"a window must allow at least 1 request, got {self.count}"
            raise UsageError(msg)
        if not self.seconds > 0:
            msg = f"a window must last longer than 0 s, got {self.seconds}"
            raise UsageError(msg)

    def __str__(self) -> str:
        return f"{self.count}/{durations.compact(self.seconds)}"


@dataclass(frozen=True, slots=True)
class Rule:
    """Windows that all hold at once; and, read from a server's refusals (never
    given), a leaky bucket's `burst`: after `burst` + 1 requests at once, one more
    per interval of the shortest window (`slots.paced` holds it as windows).

    Derived once, as the pacer reads them on every grant: `interval`, the seconds
    between requests at the binding long-run rate (the `spread` pace); `longest`,
    the longest window (older history no longer matters); `deepest`, the largest
    count (the pacer never needs more history entries than this).
    """

    windows: tuple[Window, ...]
    burst: int | None = None
    interval: float = field(init=False, repr=False, compare=False)
    longest: float = field(init=False, repr=False, compare=False)
    deepest: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.windows:
            msg = "a rule needs at least one window"
            raise UsageError(msg)
        if self.burst is not None and self.burst < 0:
            msg = f"a burst must be at least 0, got {self.burst}"
            raise UsageError(msg)
        derived = {
            "interval": max(w.seconds / w.count for w in self.windows),
            "longest": max(w.seconds for w in self.windows),
            "deepest": max(w.count for w in self.windows),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def __str__(self) -> str:
        if self.burst is None:
            return self.grammar
        return f"{self.grammar}, bursts of {self.burst + 1}"

    @property
    def grammar(self) -> str:
        """The windows in the limit grammar (`30/1m+500/1h`), which has no word
        for a leaky bucket's burst."""
        return "+".join(str(w) for w in self.windows)

    @property
    def shortest(self) -> Window:
        """The window of the shortest time: its interval is a leaky bucket's."""
        return min(self.windows, key=lambda w: w.seconds)

    def scaled(self, factor: float) -> Rule:
        """This rule with every window divided by `factor` (to compress demo time)."""
        windows = tuple(Window(w.count, w.seconds / factor) for w in self.windows)
        return Rule(windows, self.burst)


def parse_rule(text: str) -> Rule:
    """Parse `COUNT/WINDOW[+COUNT/WINDOW...]`, raising UsageError with a hint."""
    windows = []
    for part in text.split("+"):
        match = _WINDOW.match(part)
        if match is None:
            msg = (
                f"bad limit rule {text!r}: cannot read {part.strip()!r}. "
                f"{_GRAMMAR_HINT}"
            )
            raise UsageError(msg)
        count, number, unit = match.groups()
        try:
            windows.append(Window(int(count), durations.seconds(number, unit)))
        except UsageError as exc:
            msg = f"bad limit rule {text!r}: {exc.message}. {_GRAMMAR_HINT}"
            raise UsageError(msg) from None
    return Rule(tuple(windows))


def parse_override(text: str) -> tuple[LimitKey, Rule]:
    """Parse one `--limit KEY=RULE` value."""
    key, sep, rule = text.partition("=")
    keys = ", ".join(k.value for k in LimitKey)
    if not sep:
        msg = (
            f"bad --limit {text!r}: expected KEY=RULE, e.g. run-query=30/1m "
            f"(keys: {keys})"
        )
        raise UsageError(msg)
    try:
        limit_key = LimitKey(key.strip())
    except ValueError:
        msg = f"bad --limit {text!r}: unknown key {key.strip()!r} (keys: {keys})"
        raise UsageError(msg) from None
    return limit_key, parse_rule(rule)


_DEFAULTS: Mapping[LimitKey, str] = {
    LimitKey.INVITE: "15/5m",
    LimitKey.AVATAR: "10/5m",
    LimitKey.GLOBAL: "120/1m",
}
_RUN_QUERY: Mapping[Profile, str] = {
    Profile.A: "30/1m",
    Profile.B: "15/1m+500/1h",
    Profile.AUTO: "30/1m",
}


def limit_table(
    *,
    profile: Profile = Profile.B,
    overrides: Iterable[tuple[LimitKey, Rule]] = (),
) -> dict[LimitKey, Rule]:
    """The rule of every key: defaults, the profile's run-query rule, then overrides."""
    table = {key: parse_rule(text) for key, text in _DEFAULTS.items()}
    table[LimitKey.RUN_QUERY] = parse_rule(_RUN_QUERY[profile])
    table.update(overrides)
    return table


def fallbacks(
    profile: Profile,
    overrides: Iterable[tuple[LimitKey, Rule]] = (),
) -> dict[LimitKey, Rule]:
    """The rule each key falls back to once the server shows its rule is too loose:
    with `--profile auto`, run-query's statement B (unless --limit gave run-query a
    rule); none otherwise."""
    if profile is not Profile.AUTO or any(
        k is LimitKey.RUN_QUERY for k, _ in overrides
    ):
        return {}
    return {LimitKey.RUN_QUERY: parse_rule(_RUN_QUERY[Profile.B])}


def table_text(table: Mapping[LimitKey, Rule]) -> str:
    """A rule table as JSON text, `{"run-query": [[15, 60.0], [500, 3600.0]]}`, to
    store; `read_table` reads it back."""
    return json.dumps(
        {
            key.value: [[w.count, w.seconds] for w in rule.windows]
            for key, rule in table.items()
        }
    )


def read_table(text: str) -> dict[LimitKey, Rule]:
    """The rule table stored by `table_text` (or, from earlier builds, as
    `key=rule` pairs joined by commas)."""
    try:
        if not text.startswith("{"):
            return dict(parse_override(part) for part in text.split(",") if part)
        return {
            LimitKey(key): Rule(tuple(Window(int(c), float(w)) for c, w in windows))
            for key, windows in json.loads(text).items()
        }
    except (ValueError, TypeError, UsageError):
        msg = f"the stored limit table {text[:60]!r} is damaged"
        raise StateError(msg) from None
