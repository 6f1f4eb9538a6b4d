"""A reading in doubt, with the safer one the server may enforce instead."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from batchrun.core import durations
from batchrun.core.limits import Rule
from batchrun.pacing.learning.lessons import Lesson, adopt

# Over n window lengths, up to this many, more than n + 1 times the window's
# count of accepted requests rule the window out in any counting
# (`Fallback.ruled_out`).
_SPANS = 6


class Seen(Protocol):
    """What a fallback asks of the learner: the most accepted requests of a key
    seen within a length of time (`Learner.accepted_within`)."""

    def accepted_within(self, key: str, seconds: float) -> int: ...


@dataclass(frozen=True, slots=True)
class Fallback:
    """A key paced by a rule that may be too loose, with the safer reading the server
    may enforce instead (`--profile auto`: statement A, with B to fall back to; a
    leaky bucket's burst, or a short window, with the rule's own window behind it).

    The key proves its way past the safer rule one request at a time
    (`KeyLog.gated`), so finding out costs at most one 429 per window: a
    refusal takes the safer reading whole (`taken`), and its own fallback, if it
    has one, stands next; acceptances past what one of its windows allows in any
    counting rule it out (`ruled_out`). Either answer is a lesson, kept like any;
    until then, the ledger keeps the safer reading.
    """

    reading: Lesson
    # A statement of the limit (`--profile auto`'s B), not a reading of the log.
    stated: bool = False
    # The reading of one refusal alone (`Lesson.trial`): ruled out, it is
    # simply dropped (the rule it stood behind was never in doubt).
    trial: bool = False
    # A lesson an earlier run kept, re-tested (the key paces by the given rule
    # with it behind): the interval it was kept with (`retest.due`). Its
    # confirmation is a second word already: one refusal it explains takes it.
    retest: float | None = None
    # Whether the reading ahead of it (the key's rule) was confirmed strongly
    # (`Lesson.strong`), and by the server's own word (`Lesson.said`): the
    # lesson that rules this fallback out is no stronger.
    strong: bool = True
    said: bool = False

    @property
    def rule(self) -> Rule:
        """The safer rule."""
        return self.reading.rule

    @property
    def tested(self) -> bool:
        """A reading of one refusal with safer ones behind it (a leaky
        bucket's burst): the pacer puts it to the test when it next allows a
        request (`Pacer.learn`); the next refusal is the second word, and
        the key is paced by it, or by the safer one behind it if the test
        itself was refused (`Learner._tested`)."""
        return self.trial and self.reading.fallback is not None

    def taken(self, lesson: Lesson, given: Rule) -> Lesson:
        """`lesson`, learned while this fallback stood, joined with it (no longer
        read as a leaky bucket: its burst was refused), and with the safer
        reading's own fallback, if `lesson` has none."""
        joined = adopt(Rule(lesson.rule.windows), self.rule.windows, "")
        rule = Rule(lesson.rule.windows) if joined is None else joined.rule
        why = f"{lesson.evidence}; so the server enforces {rule}, not {given}"
        after = lesson.fallback or self.reading.fallback
        if after is not None and adopt(rule, after.rule.windows, "") is None:
            after = None  # the joined rule already holds to it: nothing in doubt
        return replace(lesson, rule=rule, evidence=why, fallback=after, trial=False)

    def kept(self, lesson: Lesson) -> Lesson:
        """`lesson` as the ledger keeps it while this fallback stands: joined with
        it, so that later runs start from the safer reading."""
        joined = adopt(lesson.rule, self.rule.windows, "") or lesson
        return Lesson(joined.rule, lesson.evidence, lesson.spread, strong=lesson.strong)

    def ruled_out(self, learner: Seen, key: str, given: Rule) -> Lesson | None:
        """A lesson that `given` holds if the server let through more than one of
        this fallback's own windows (COUNT/W) allows in any counting: more than
        (n + 1) x COUNT within n x W, for some n up to `_SPANS` (fixed windows let
        up to that many through, a sliding log n x COUNT), or, for a leaky
        bucket's burst B, more than 2 x (B + 1) within the time it leaks B + 1
        (`_past_burst`); None while it has not."""
        past = self._past_burst(learner, key, given)
        if past is not None:
            return past
        for window in self.rule.windows:
            if window in given.windows:
                continue  # held by both readings: it settles nothing
            for spans in range(1, _SPANS + 1):
                span = window.seconds * spans
                seen = learner.accepted_within(key, span)
                if seen > (spans + 1) * window.count:
                    why = (
                        f"{seen} accepted within {durations.compact(span)}, more "
                        f"than {self.rule} allows: the server enforces {given}"
                    )
                    return Lesson(given, why, strong=self.strong, said=self.said)
        return None

    def _past_burst(self, learner: Seen, key: str, given: Rule) -> Lesson | None:
        """`given` if the server let through more in a burst than this
        fallback's leaky bucket allows: at most B + 1 at once and its rate
        after, so at most 2 x (B + 1) while it leaks B + 1."""
        burst = self.rule.burst
        if burst is None or (given.burst is not None and given.burst <= burst):
            return None
        base = self.rule.shortest
        span = (burst + 1) * base.seconds / base.count
        seen = learner.accepted_within(key, span)
        if seen <= 2 * (burst + 1):
            return None
        why = (
            f"{seen} accepted within {durations.compact(span)}, more than bursts "
            f"of {burst + 1} allow: the server enforces {given}"
        )
        return Lesson(given, why, strong=self.strong, said=self.said)
