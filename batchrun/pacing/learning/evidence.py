"""Whether a 429 episode is evidence for its lesson (`weighed`), or noise.

The model: a refusal of a request that arrived with N accepted within W reads
"at most N per W", and an acceptance with M within W reads "at least M". A
reading explains a set of refusals if one count per W fits them all and the
acceptances around them (within `SPAN` windows of W: "not long before"), or if
an aligned counter of W (a fixed window or weighted counter, which lets up to
twice its count through a sliding W) at a count no higher than the lesson's
does (`counters.read`); W is any window of the lesson, of the safer reading
behind it, or of the fallback that stands.

- A refusal that no such reading explains is contradicted by the server's own
  record (it accepted more in the same window length not long before or
  after): noise, a stray 429 of an overloaded gateway. It teaches nothing.
- One that is explained still needs a second word: another refusal, sent after
  the first was answered, that the same reading explains (a probe refused, or
  the next episode's refusal), a Retry-After that fits the reading, or a
  stated limit. Until then the rule stands with the reading behind it, tried
  in this process only (`Lesson.trial`: never kept in the ledger): a faster
  reading with safer ones behind it (a leaky bucket's burst) is put to the
  test when it next allows a request: refused then, the safer one stands;
  refused later, the reading does (`Learner._tested`).
- Explained only by a window longer than the rule's (a quota, which the
  learner reads once requests are spaced evenly): the same, with that window.

A server that became stricter for good is learned once its looser past has left
the span, or at once if it says so (a Retry-After, a rate-limit header).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from enum import Enum, IntEnum

from batchrun.core.limits import Rule, Window
from batchrun.pacing.learning.alternatives import aligned_counter
from batchrun.pacing.learning.lessons import Lesson, adopt
from batchrun.pacing.learning.log import Sent, arrived, with_answers
from batchrun.pacing.learning.readings import Fit, agrees, bounds, burst_window

# How many windows of the record around a refusal bear on it ("not long
# before"): the span `counters.read` replays too.
SPAN = 4


class Weight(Enum):
    """What a settled 429 episode is worth to its lesson."""

    NOISE = "contradicted by what the server accepted"
    DOUBTED = "explained, but by one refusal alone"
    EVIDENCE = "explained, and corroborated"


def weighed(
    log: Sequence[Sent],
    lesson: Lesson,
    safer: Rule | None,
    *,
    stated: bool,
    longer: Iterable[float] = (),
    given: Rule | None = None,
) -> Weight:
    """What the latest refusal of `log` is worth to `lesson`; `safer`: the rule
    of a fallback that stands (the lesson is joined with it), a statement of
    the limit if `stated` (a second word already); `longer`: window lengths
    past the rule's, where a quota may be read once requests are spaced evenly
    (`Learner.review`): a refusal one explains is the first step there;
    `given`: the rule the user gave (`_news`)."""
    answered = with_answers(log)
    latest = newest_refusal(answered)
    if latest is None:
        return Weight.NOISE
    windows = _windows(lesson, safer)
    bursts = _bursts(lesson, safer)
    quota = [Window(len(answered), seconds) for seconds in longer]

    def reads(refusals: list[Sent]) -> bool:
        return explained(answered, refusals, windows) or explained(
            answered, refusals, bursts, counters=False
        )

    def spans(refusals: list[Sent]) -> bool:
        return _slides(answered, refusals, quota)

    refusals = [s for s in answered if s.refused]
    # A refusal answered before the latest was sent: a second word, if one
    # reading explains both.
    earlier = [s for s in refusals if s.end is not None and s.end <= latest.start]
    if reads([latest]):
        fits = any(_fits(s, answered, _news(windows, given)) for s in refusals)
        agree = stated or fits or any(reads([s, latest]) for s in earlier)
        return Weight.EVIDENCE if agree else Weight.DOUBTED
    # Only a longer window explains it (a quota, read once spaced evenly):
    # a second refusal it explains too is the evidence.
    if not spans([latest]):
        return Weight.NOISE
    return (
        Weight.EVIDENCE if any(spans([s, latest]) for s in earlier) else Weight.DOUBTED
    )


class Confirmation(IntEnum):
    """How strongly the server confirmed a lesson (`confirmed`): not at all
    (this process only), on weak grounds, by refusing again just past it, or
    by its own word."""

    NONE = 0
    WEAK = 1
    STRONG = 2
    SAID = 3


def confirmed(
    log: Sequence[Sent],
    lesson: Lesson,
    safer: Rule | None,
    *,
    stated: bool,
    given: Rule | None = None,
) -> Confirmation:
    """Whether later runs may inherit `lesson` (the ledger keeps it), and how
    strongly: the server said so (a statement of the limit if `stated`, or a
    refusal whose Retry-After fits a window of the reading), or it kept
    refusing just past the reading: two refusals that it explains, the second
    sent after the first was answered and nothing accepted between their
    arrivals (`STRONG`: a stray 429 is followed by an acceptance, a limit by
    another refusal); or, with acceptances between them, an exact replay of a
    window the given rule lacks explains both (`WEAK`: re-tested by the next
    run, `retest.interval`)."""
    if stated:
        # A statement (`--profile auto`'s B, a lesson an earlier run kept)
        # speaks for the reading only if it holds to it already.
        held = safer is not None and adopt(safer, lesson.rule.windows, "") is None
        return Confirmation.SAID if held else Confirmation.STRONG
    answered = with_answers(log)
    windows = _windows(lesson, safer)
    refusals = sorted((s for s in answered if s.refused), key=arrived)
    news = _news(windows, given)
    if any(_fits(s, answered, news) for s in refusals):
        return Confirmation.SAID
    weak = Confirmation.NONE
    accepted = sorted(arrived(s) for s in answered if s.refused is False)
    for n, first in enumerate(refusals):
        for second in refusals[n + 1 :]:
            if first.end is None or first.end > second.start:
                continue  # sent before the first was answered: one burst
            low = bisect.bisect_right(accepted, arrived(first))
            apart = bisect.bisect_left(accepted, arrived(second)) > low
            # Apart (the server let some through between them), only an
            # exact replay of a window the given rule lacks explains both.
            if explained(answered, [first, second], news if apart else windows):
                if not apart:
                    return Confirmation.STRONG
                weak = Confirmation.WEAK
    return weak


def newest_refusal(log: Sequence[Sent]) -> Sent | None:
    """The refusal of `log` that arrived last; None if none was refused."""
    refusals = [s for s in with_answers(log) if s.refused]
    return max(refusals, key=arrived, default=None)


def explained(
    log: Sequence[Sent],
    refusals: Sequence[Sent],
    windows: Iterable[Window],
    *,
    counters: bool = True,
) -> bool:
    """Whether one reading of one of `windows` explains every one of `refusals`
    and the acceptances of `log` around them: one sliding count per W, or (if
    `counters`) an aligned counter of W at a count no higher than the window's."""
    for window in windows:
        kept = _around(log, refusals, window.seconds)
        most, least = bounds(kept, window.seconds, fit=Fit.NONE)
        if least <= window.count <= most:
            return True  # a sliding window of the reading's count
        if not counters:
            continue
        counter = aligned_counter(kept, Rule((window,)), leeway=False)
        if counter is not None and counter.window == window:
            return True  # an aligned counter of it
    return False


def _slides(
    log: Sequence[Sent], refusals: Sequence[Sent], windows: Iterable[Window]
) -> bool:
    """Whether a sliding window of one of `windows`' lengths, at some count no
    higher than its own, explains `refusals` and the acceptances around them."""
    for window in windows:
        kept = _around(log, refusals, window.seconds)
        most, least = bounds(kept, window.seconds, fit=Fit.NONE)
        if least <= min(most, window.count):
            return True
    return False


def _around(
    log: Sequence[Sent], refusals: Sequence[Sent], seconds: float
) -> list[Sent]:
    """`refusals` and the acceptances of `log` from `SPAN` windows of `seconds`
    before the first of them on."""
    first = min(arrived(s) for s in refusals)
    since = first - SPAN * seconds
    return [
        s
        for s in log
        if arrived(s) > since and (s.refused is False or arrived(s) >= first)
    ]


def _fits(refusal: Sent, log: Sequence[Sent], windows: Iterable[Window]) -> bool:
    """Whether `refusal`'s Retry-After fits a window of the reading: it names
    no later a moment than the window's oldest accepted request leaves it."""
    if refusal.wait is None:
        return False
    arrivals = sorted(arrived(s) for s in log if s.refused is False)
    return any(agrees(refusal, arrivals, w.seconds, Fit.FIXED) for w in windows)


def _news(windows: Iterable[Window], given: Rule | None) -> list[Window]:
    """The windows of a reading that a Retry-After can speak for: those the
    `given` rule does not hold already. One that fits the given window says
    the window is full, which the log did not show: another consumer of the
    budget as well as another counting; it confirms neither."""
    return [w for w in windows if given is None or w not in given.windows]


def _bursts(lesson: Lesson, safer: Rule | None) -> list[Window]:
    """The bursts of the leaky buckets among `lesson`, `safer` and the lessons
    behind `lesson`, as windows (`burst_window`: B + 1 within one drain). A
    bucket drains continuously: only a sliding count reads it, never an
    aligned counter; and its burst is not a window a Retry-After can fit."""
    rules = [lesson.rule, *([] if safer is None else [safer]), *_behind(lesson)]
    return [w for w in map(burst_window, rules) if w is not None]


def _behind(lesson: Lesson) -> list[Rule]:
    """The rules of the safer lessons behind `lesson`, nearest first."""
    rules = []
    behind = lesson.fallback
    while behind is not None:
        rules.append(behind.rule)
        behind = behind.fallback
    return rules


def _windows(lesson: Lesson, safer: Rule | None) -> list[Window]:
    """The windows a reading may be in: those of `lesson`, of `lesson` joined
    with `safer` (what the key is paced by if the fallback is taken), and of
    the safer lessons behind it."""
    joined = None if safer is None else adopt(lesson.rule, safer.windows, "")
    found = list(lesson.rule.windows)
    if joined is not None:
        found.extend(w for w in joined.rule.windows if w not in found)
    for rule in _behind(lesson):
        found.extend(rule.windows)
    return found
