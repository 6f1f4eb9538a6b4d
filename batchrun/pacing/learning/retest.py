"""When a kept lesson is re-tested: the weaker the evidence, the sooner.

A lesson the server confirmed strongly (`Lesson.strong`: by its own word, a
Retry-After or header that fits a window the given rule lacks or a stated
limit; or by two refusals back to back) is first re-tested after
`RETEST_WINDOWS` of the given rule's longest window; one kept on weaker
grounds (acceptances between its refusals, or a safer reading ruled out behind
a reading no refusal confirmed, as a stray 429 leaves) by the very next run. A
re-test that the server refuses confirms it, and the next waits twice as long;
one it lets through forgets it.
The cadence is kept in the lesson's text in the ledger (`storage.stored`).

Within the run that learned it, a lesson the server did not confirm by its own
word is re-tested `RUN_WINDOWS` of the given rule's longest window after it was
learned, and each re-test it passes doubles the wait (`run_wait`): a lesson
whose cause went away (stray 429s, another consumer that stopped) stops costing
in the same run. While a run re-tests a lesson the ledger keeps, the ledger has
it due (`under_way`): a run that ends or is killed before the server answers
leaves the test to the next run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from batchrun.core.limits import LimitKey, Rule
from batchrun.pacing.learning.lessons import Lesson
from batchrun.pacing.learning.storage import LEARNED, recalled


@dataclass(frozen=True, slots=True)
class Kept:
    """A lesson an earlier run kept for a key (`Pacer.recall`), and, if it is
    due for a re-test, the interval it was kept with (None: paced by)."""

    key: LimitKey
    lesson: Lesson
    retest: float | None = None


# A lesson confirmed by the server's own word is first re-tested this many of
# the given rule's longest windows (unscaled) after, and each re-test it
# passes at least doubles that (`interval`).
RETEST_WINDOWS = 64
# A lesson not confirmed by the server's own word is re-tested in the run that
# learned it this many of the given rule's longest windows after (`run_wait`).
RUN_WINDOWS: float = 2


def interval(
    lesson: Lesson, given: Rule, time_scale: float, *, confirms: float | None
) -> float:
    """Seconds from now until a run re-tests `lesson`, kept now: `confirms`,
    the interval a re-test it passed was kept with, doubled (at least the
    base); for one just learned, the base if the server confirmed it
    strongly, else 0 (due in the next run)."""
    base = RETEST_WINDOWS * given.longest * time_scale
    if confirms is not None:
        return max(2 * confirms, base)
    return base if lesson.strong else 0.0


def cadence(text: str | None) -> tuple[float, float] | None:
    """When a kept lesson was last confirmed (wall-clock seconds) and when it
    is next re-tested; None if `text` holds no lesson. A lesson kept before
    re-testing (no cadence) is due since it was learned."""
    try:
        kept = json.loads(text or "{}")
        confirmed = float(kept.get("confirmed", kept["at"]))
        retest = max(0.0, float(kept.get("retest", 0.0)))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    if not math.isfinite(confirmed + retest):
        return None
    return confirmed, confirmed + retest


def due(text: str | None, now: float) -> float | None:
    """The re-test interval of a kept lesson if a run starting at `now` (wall
    clock) re-tests it; None if it is not due yet (or none is kept)."""
    kept = cadence(text)
    if kept is None or now < kept[1]:
        return None
    return kept[1] - kept[0]


def run_wait(given: Rule, last: float | None) -> float:
    """Seconds until a lesson learned in this run, which the server did not
    confirm by its own word, is re-tested in it: `RUN_WINDOWS` of the `given`
    rule's longest window, or twice `last`, the wait before the re-test it
    just passed."""
    return RUN_WINDOWS * given.longest if last is None else 2 * last


def testable(lesson: Lesson, given: Rule) -> bool:
    """Whether a re-test can rule `lesson` out (`Fallback.ruled_out`): it holds
    a window `given` lacks, or a leaky bucket's burst. (Spacing evenly alone,
    the server's counting, no count of acceptances rules out.)"""
    extra = any(w not in given.windows for w in lesson.rule.windows)
    return extra or (lesson.rule.burst is not None and lesson.rule.burst != given.burst)


def reconfirmed(kept: Lesson, refusal: Lesson) -> Lesson:
    """A recalled lesson (`kept`), re-tested and refused just past (what the
    refusal read, `refusal`): it stands as kept, confirmed now."""
    why = kept.evidence
    if why.startswith(LEARNED) and ": " in why:
        why = why.split(": ", 1)[1]  # the date is the new confirmation's
    why = f"{why}; re-tested, refused again ({refusal.evidence})"
    return replace(kept, evidence=why, confirmed=True, strong=True, trial=False)


def under_way(
    text: str | None, rule: Rule, given: Rule, time_scale: float, now: float
) -> str | None:
    """`text`, the ledger's lesson, due at once while a run re-tests it (`rule`):
    a run that ends or is killed before the server answers leaves the re-test
    to the next run, not to the lesson's cadence. None: nothing to change (no
    such lesson kept, or it is due already)."""
    kept = recalled(given, text, time_scale=time_scale, now=now)
    if kept is None or kept.rule != rule or due(text, now) is not None:
        return None
    fields = json.loads(text or "{}")
    fields["retest"] = 0.0
    return json.dumps(fields)
