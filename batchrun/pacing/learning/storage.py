"""Lessons and what the server accepted, as the text a ledger keeps, and read
back only for the rule they were learned under."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from batchrun.core.errors import UsageError
from batchrun.core.limits import Rule, Window
from batchrun.pacing.learning.alternatives import LEAK_MOST
from batchrun.pacing.learning.lessons import Lesson, adopt, candidates

# How long a learned limit is trusted (the Redis ledger keeps it as long).
KEPT_FOR = 30 * 86400.0

# How a recalled lesson's evidence begins: when it was learned, then why.
LEARNED = "learned "


def stored(
    lesson: Lesson, *, given: Rule, time_scale: float, at: float, retest: float = 0.0
) -> str:
    """A lesson as the text a ledger keeps, with the rule it was `given` (what it
    tightened): windows in unscaled seconds, so a run at another time scale reads
    the same limit; `at` is wall-clock seconds, when the server last confirmed
    it (`confirmed`), and `retest` the seconds from then until the next run
    re-tests it (`retest.due`)."""
    windows = _unscaled(lesson.rule, time_scale)
    why = lesson.evidence
    if time_scale != 1:
        why += f" (at --time-scale {time_scale:g})"
    fields = {"windows": windows, "spread": lesson.spread, "why": why}
    if lesson.rule.burst is not None:
        fields["burst"] = lesson.rule.burst
    if lesson.fallback is not None:
        fields["safer"] = _unscaled(lesson.fallback.rule, time_scale)
    cadence = {"confirmed": at, "retest": retest}
    return json.dumps(
        {**fields, "given": _unscaled(given, time_scale), "at": at, **cadence}
    )


# The ledger key, after the limit key's, of what the server was seen to accept.
RECORD_SUFFIX = "#accepted"


def accepted_record(
    record: dict[float, int], given: Rule, time_scale: float, at: float
) -> str:
    """What the server was seen to accept in each window of `given` (`record`:
    window seconds at `time_scale` to count), as the text a ledger keeps."""
    seen = [[count, seconds * time_scale] for seconds, count in sorted(record.items())]
    return json.dumps({"seen": seen, "given": _unscaled(given, time_scale), "at": at})


def recalled_record(
    text: str | None, given: Rule, time_scale: float, *, now: float | None = None
) -> dict[float, int]:
    """The record a ledger kept (`accepted_record`) for `given`: window seconds
    to count, no count above the window's own; empty if none was kept for this
    very rule, it is unreadable, or older than `KEPT_FOR`."""
    moment = time.time() if now is None else now
    try:
        kept = json.loads(text or "{}")
        at = float(kept["at"])
        same = _same(
            sorted((int(c), float(s)) for c, s in kept["given"]), given, time_scale
        )
        seen = [(int(c), float(s) / time_scale) for c, s in kept["seen"]]
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return {}
    if not same or not moment - KEPT_FOR <= at <= moment + 86400.0:
        return {}
    record = {}
    for count, seconds in seen:
        # A window of the rule by its own length; any other (a lesson's) as kept.
        own = [w for w in given.windows if math.isclose(w.seconds, seconds)]
        most = own[0].count if own else count
        record[own[0].seconds if own else seconds] = max(0, min(count, most))
    return record


def _unscaled(rule: Rule, time_scale: float) -> list[list[float]]:
    return [[w.count, w.seconds * time_scale] for w in rule.windows]


def recalled(
    rule: Rule, text: str | None, *, time_scale: float, now: float
) -> Lesson | None:
    """The lesson a ledger kept (`stored`), applied to `rule`: only ever tighter
    than `rule`, whatever was kept, but for a leaky bucket's burst, which comes
    with the safer reading it falls back to. None if nothing (or nothing
    readable) was; if it was learned under another rule than `rule` (the user
    now gives another: theirs wins); or if it is older than `KEPT_FOR` at `now`
    (wall-clock seconds): servers change their limits, and one 429 learns it
    again."""
    kept = _read(text, time_scale)
    if kept is None:
        return None
    fresh = now - KEPT_FOR <= kept.at <= now + 86400.0  # slack for clock steps
    if not fresh or not _same(kept.given, rule, time_scale):
        return None
    if not _plausible([*kept.windows, *kept.safer], rule, time_scale):
        return None
    stricter = adopt(rule, kept.windows, "")
    tighter = rule if stricter is None else stricter.rule
    # Kept for this very rule (--profile auto's answer that it holds) says so too.
    plain = not kept.spread and kept.burst is None
    if tighter == rule and plain and tuple(kept.windows) != rule.windows:
        return None
    if kept.burst is not None:
        base = tighter.shortest
        if not 0 <= kept.burst < base.count - 1 or base.count > LEAK_MOST:
            return None  # no bucket this rule's windows do not already hold to
        tighter = Rule(tighter.windows, kept.burst)
    safer = adopt(Rule(tighter.windows), kept.safer, "") if kept.safer else None
    fallback = None if safer is None else Lesson(safer.rule, "kept as the safer")
    why = f"{LEARNED}{kept.when}: {kept.why}"
    return Lesson(tighter, why, kept.spread, fallback)


@dataclass(frozen=True, slots=True)
class _Kept:
    """A kept lesson's fields, read (`_read`); windows at the run's time scale."""

    windows: list[Window]
    given: list[tuple[int, float]]
    at: float
    when: str
    why: str
    spread: bool
    burst: int | None
    safer: list[Window]


def _read(text: str | None, time_scale: float) -> _Kept | None:
    """The fields of a kept lesson; None if any is missing or unreadable."""

    def windows(pairs: Any) -> list[Window]:
        return [Window(int(c), float(s) / time_scale) for c, s in pairs]

    try:
        kept = json.loads(text or "{}")
        at = float(kept["at"])
        burst = kept.get("burst")
        return _Kept(
            windows=windows(kept["windows"]),
            given=sorted((int(c), float(s)) for c, s in kept["given"]),
            at=at,
            when=time.strftime("%Y-%m-%d %H:%M", time.localtime(at)),
            why=str(kept["why"]),
            spread=bool(kept["spread"]),
            burst=None if burst is None else int(burst),
            safer=windows(kept.get("safer", [])),
        )
    except (
        ValueError,
        TypeError,
        KeyError,
        UsageError,
        OverflowError,
        OSError,
        RecursionError,
    ):
        return None


def _same(given: list[tuple[int, float]], rule: Rule, time_scale: float) -> bool:
    """Whether `given` (unscaled windows, sorted) is `rule` at `time_scale`, in
    whatever order its windows were written."""
    ours = sorted((w.count, w.seconds) for w in rule.windows)
    return len(given) == len(ours) and all(
        c == count and math.isclose(s, seconds * time_scale, rel_tol=1e-9)
        for (c, s), (count, seconds) in zip(given, ours, strict=True)
    )


def _plausible(windows: list[Window], rule: Rule, time_scale: float) -> bool:
    """Whether kept windows are ones a lesson of `rule` can hold: their lengths
    among its candidates, or one the server named (`heard_windows`: from a millisecond
    to the rule's longest window); a hand edit or a damaged row could otherwise
    stall a key for ages, or hold no window at all."""
    lengths = candidates(rule, time_scale=time_scale)
    return all(
        any(math.isclose(w.seconds, s, rel_tol=1e-9) for s in lengths)
        or 0.001 <= w.seconds <= rule.longest
        for w in windows
    )
