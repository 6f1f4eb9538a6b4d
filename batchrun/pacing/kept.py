"""What the ledger keeps of a key's server between runs, in one text format:
the lesson in force (the candidate chosen, why, and its lifetime) under the key's
own name, and what the server was seen to accept under `KEY#accepted`.

Both are JSON, with windows in the seconds the run paced by and moments in
wall-clock seconds (every process of the client shares them). A text is read
back only for the very rule it was kept under, window for window; anything
unreadable, older than `KEPT_FOR`, or looser than that rule reads as nothing
kept.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from batchrun.core.errors import UsageError
from batchrun.core.events import Because, Evidence
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
    seconds (`life`: its length)."""

    candidate: Candidate
    why: Evidence
    began: float
    expires: float
    life: float

    def expired(self, now: float) -> bool:
        """Whether its lifetime has run out at `now` (wall clock)."""
        return now >= self.expires


def lesson_text(kept: Kept, *, given: Rule) -> str:
    """`kept` as the text a ledger keeps for a key given `given`."""
    candidate = kept.candidate
    return json.dumps(
        {
            "kind": candidate.kind.value,
            "windows": _pairs(candidate.rule),
            "burst": candidate.rule.burst,
            "origin": candidate.origin,
            "counts_refused": candidate.counts_refused,
            "because": kept.why.because.value,
            "refused": kept.why.refused,
            "rule": None if kept.why.rule is None else _pairs(kept.why.rule),
            "given": _pairs(given),
            "began": kept.began,
            "expires": kept.expires,
            "life": kept.life,
        }
    )


def read_lesson(text: str | None, *, given: Rule, now: float) -> Kept | None:
    """The lesson kept in `text` for a key given `given`; None if none,
    unreadable, kept under another rule, older than `KEPT_FOR`, or looser than
    `given` in some window."""
    try:
        fields: dict[str, Any] = json.loads(text or "{}")
        if not _same(fields["given"], given):
            return None
        burst = fields["burst"]
        rule = Rule(_windows(fields["windows"]), burst and int(burst))
        candidate = Candidate(
            LimiterKind(fields["kind"]),
            rule,
            float(fields["origin"]),
            bool(fields["counts_refused"]),
        )
        began, expires = float(fields["began"]), float(fields["expires"])
        life = float(fields["life"])
        named = fields["rule"]
        why = Evidence(
            Because(fields["because"]),
            int(fields["refused"]),
            # In the order the server stated them.
            None
            if named is None
            else Rule(tuple(Window(int(c), float(s)) for c, s in named)),
        )
    except _UNREADABLE:
        return None
    if not now - KEPT_FOR <= began <= now + _SLACK or not _within(rule, given):
        return None
    return Kept(candidate, why, began, expires, life)


def record_text(record: dict[float, int], *, given: Rule, at: float) -> str:
    """What the server was seen to accept in each window (`record`: window
    seconds to count), as the text a ledger keeps."""
    seen = [[count, seconds] for seconds, count in sorted(record.items())]
    return json.dumps({"seen": seen, "given": _pairs(given), "at": at})


def read_record(text: str | None, *, given: Rule, now: float) -> dict[float, int]:
    """The record kept in `text` for `given`: window seconds to count, no count
    above the window's own; empty if none was kept for this very rule, it is
    unreadable, or older than `KEPT_FOR`."""
    try:
        fields = json.loads(text or "{}")
        at = float(fields["at"])
        same = _same(fields["given"], given)
        seen = [(int(c), float(s)) for c, s in fields["seen"]]
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


def _pairs(rule: Rule) -> list[list[float]]:
    return [[w.count, w.seconds] for w in rule.windows]


def _windows(pairs: Any) -> tuple[Window, ...]:
    windows = [Window(int(c), float(s)) for c, s in pairs]
    return tuple(sorted(windows, key=lambda w: w.seconds))


def _same(pairs: Any, rule: Rule) -> bool:
    """Whether `pairs` (kept windows) are `rule`'s."""
    kept = sorted((int(c), float(s)) for c, s in pairs)
    ours = sorted((w.count, w.seconds) for w in rule.windows)
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
