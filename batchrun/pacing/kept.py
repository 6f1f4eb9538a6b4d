"""What the ledger keeps of a key's server between runs, in one text format:
the lesson in force (the candidate chosen, why, and its lifetime) under the key's
own name, and what the server was seen to accept under `KEY#accepted`.

Both are JSON, with windows in unscaled seconds (a run at another --time-scale
reads the same limit) and moments in wall-clock seconds (every process of the
client shares them). A text is read back only for the rule it was kept under;
anything unreadable, older than `KEPT_FOR`, or looser than that rule reads as
nothing kept.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from batchrun.core.errors import UsageError
from batchrun.core.limits import Rule, Window
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.model import Candidate

# How long anything kept is trusted (the Redis ledger keeps it as long).
KEPT_FOR = 30 * 86400.0
# The ledger key, after the limit key's, of what the server was seen to accept.
RECORD_SUFFIX = "#accepted"
# A kept moment this far in the future is a clock that stepped back: still read.
_SLACK = 86400.0
_UNREADABLE = (
    ValueError,
    TypeError,
    KeyError,
    UsageError,
    OverflowError,
    RecursionError,
)


@dataclass(frozen=True, slots=True)
class Kept:
    """A lesson as kept: the candidate, why, and its lifetime in wall-clock
    seconds (`life`: its length, at the run's time scale)."""

    candidate: Candidate
    why: str
    began: float
    expires: float
    life: float

    def expired(self, now: float) -> bool:
        """Whether its lifetime has run out at `now` (wall clock)."""
        return now >= self.expires


def lesson_text(kept: Kept, *, given: Rule, time_scale: float) -> str:
    """`kept` as the text a ledger keeps for a key given `given`."""
    candidate = kept.candidate
    why = kept.why
    if time_scale != 1:
        why += f" (at --time-scale {time_scale:g})"
    return json.dumps(
        {
            "kind": candidate.kind.value,
            "windows": _unscaled(candidate.rule, time_scale),
            "burst": candidate.rule.burst,
            "origin": candidate.origin * time_scale,
            "counts_refused": candidate.counts_refused,
            "why": why,
            "given": _unscaled(given, time_scale),
            "began": kept.began,
            "expires": kept.expires,
            "life": kept.life * time_scale,
        }
    )


def read_lesson(
    text: str | None, *, given: Rule, time_scale: float, now: float
) -> Kept | None:
    """The lesson kept in `text` for a key given `given`, at the run's scale;
    None if none, unreadable, kept under another rule, older than `KEPT_FOR`,
    or looser than `given` in some window."""
    try:
        fields: dict[str, Any] = json.loads(text or "{}")
        if not _same(fields["given"], given, time_scale):
            return None
        burst = fields["burst"]
        rule = Rule(_windows(fields["windows"], time_scale), burst and int(burst))
        candidate = Candidate(
            LimiterKind(fields["kind"]),
            rule,
            float(fields["origin"]) / time_scale,
            bool(fields["counts_refused"]),
        )
        began, expires = float(fields["began"]), float(fields["expires"])
        life = float(fields["life"]) / time_scale
        why = str(fields["why"])
    except _UNREADABLE:
        return None
    if not now - KEPT_FOR <= began <= now + _SLACK or not _within(rule, given):
        return None
    return Kept(candidate, why, began, expires, life)


def learned_when(kept: Kept) -> str:
    """When the lesson began, as a person reads it."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(kept.began))


def record_text(
    record: dict[float, int], *, given: Rule, time_scale: float, at: float
) -> str:
    """What the server was seen to accept in each window (`record`: window
    seconds at the run's scale to count), as the text a ledger keeps."""
    seen = [[count, seconds * time_scale] for seconds, count in sorted(record.items())]
    return json.dumps({"seen": seen, "given": _unscaled(given, time_scale), "at": at})


def read_record(
    text: str | None, *, given: Rule, time_scale: float, now: float
) -> dict[float, int]:
    """The record kept in `text` for `given`: window seconds to count, no count
    above the window's own; empty if none was kept for this very rule, it is
    unreadable, or older than `KEPT_FOR`."""
    try:
        fields = json.loads(text or "{}")
        at = float(fields["at"])
        same = _same(fields["given"], given, time_scale)
        seen = [(int(c), float(s) / time_scale) for c, s in fields["seen"]]
    except _UNREADABLE:
        return {}
    if not same or not now - KEPT_FOR <= at <= now + _SLACK:
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


def _windows(pairs: Any, time_scale: float) -> tuple[Window, ...]:
    windows = [Window(int(c), float(s) / time_scale) for c, s in pairs]
    return tuple(sorted(windows, key=lambda w: w.seconds))


def _same(pairs: Any, rule: Rule, time_scale: float) -> bool:
    """Whether `pairs` (unscaled windows) are `rule` at `time_scale`."""
    kept = sorted((int(c), float(s)) for c, s in pairs)
    ours = sorted((w.count, w.seconds * time_scale) for w in rule.windows)
    return len(kept) == len(ours) and all(
        c == count and math.isclose(s, seconds, rel_tol=1e-9)
        for (c, s), (count, seconds) in zip(kept, ours, strict=True)
    )


def _within(rule: Rule, given: Rule) -> bool:
    """Whether `rule` holds to every window of `given` (no looser anywhere)."""
    return all(
        any(w.seconds >= g.seconds and w.count <= g.count for w in rule.windows)
        for g in given.windows
    )
