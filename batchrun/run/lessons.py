"""What a run's answers teach its pacer: a policy stated in headers, a 429
episode reviewed once settled, a spent budget counted, and the safer rule a key
falls back to (--profile auto) taken or ruled out.

Each lesson goes to the pacer (which keeps it for later runs) and is reported as
a `RuleLearned` event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from batchrun.api.hints import Hints
from batchrun.core.clock import Clock
from batchrun.core.events import EventSink, RuleLearned
from batchrun.core.limits import LimitKey, Pace, Rule
from batchrun.pacing.learning.fallback import Fallback
from batchrun.pacing.learning.lessons import Lesson, adopt
from batchrun.pacing.learning.log import Sent
from batchrun.pacing.learning.retest import reconfirmed, run_wait, testable
from batchrun.pacing.pacer import Pacer


@dataclass(frozen=True, slots=True)
class _InForce:
    """A lesson a key is paced by in this run: when this run re-tests it
    (`math.inf`: never, the server stated it), the wait before that, and the
    root: the run's earliest lesson still in force (a root ruled out, or a
    reading in doubt, leaves the next lesson to be one), which the key goes
    back to if the re-test rules it out (None: this is the root, and the key
    goes back to its given rule).

    Lessons stand on the root, not on each other: each later one was learned
    while something (another consumer, stray 429s) lowered the count, and
    stepping back one level at a time cannot end within a run, since a rule
    within a factor (n + 1) / n of the next cannot be ruled out in fewer than
    n of its windows (`Fallback.ruled_out`). Paced by the root, a re-test rules
    a lesson its cause has left out in a few windows, and a refusal past it
    still costs one 429."""

    lesson: Lesson
    due: float
    wait: float
    base: _InForce | None


class Lessons:
    """The learning side of a run: what earlier runs taught, what this one's
    answers teach, and each key's fallback while it is in question."""

    def __init__(
        self,
        *,
        pacer: Pacer,
        clock: Clock,
        sink: EventSink,
        fallback: Mapping[LimitKey, Rule],
    ) -> None:
        self._pacer = pacer
        self._clock = clock
        self._sink = sink
        self._learner = pacer.learner
        recalled = pacer.recall(list(pacer.rules))
        # What an earlier run learned of a key settles its fallback too.
        settled = {kept.key for kept in recalled}
        self._fallback = {
            key: Fallback(Lesson(rule, f"the safer statement {rule}"), stated=True)
            for key, rule in fallback.items()
            if key in pacer.rules and key not in settled
        }
        for kept in recalled:
            if kept.retest is not None:
                # Re-tested: the given rule, with the lesson behind it.
                self._fallback[kept.key] = Fallback(kept.lesson, retest=kept.retest)
            elif kept.lesson.fallback is not None:
                # A faster reading kept in doubt is still in doubt.
                self._fallback[kept.key] = Fallback(kept.lesson.fallback)
        self._recalled = [(k.key, k.lesson) for k in recalled if k.retest is None]
        # Keys paced by a lesson an earlier run kept: the ledger's cadence
        # re-tests it (`retest.due`), not this run.
        self._kept = {k.key for k in recalled if k.retest is None}
        # Per key, the lesson of this run in force, and the one under re-test.
        self._in_force: dict[LimitKey, _InForce] = {}
        self._tested: dict[LimitKey, _InForce] = {}

    def recalled(self) -> None:
        """Report what earlier runs taught, as the run starts (a lesson under
        re-test is reported once the server has settled it)."""
        for key, lesson in self._recalled:
            spread = self._pacer.pace(key) is Pace.SPREAD
            at = self._clock.now()
            self._sink.emit(
                RuleLearned(at, key, lesson.rule, spread, lesson.evidence, kept=True)
            )

    def heed(self, key: LimitKey, hints: Hints | None, accepted: Sent | None) -> None:
        """Follow what an answer's headers say: a stated policy stricter than the
        rule is adopted before it costs a 429; a spent budget waits for its reset.

        A spent budget that the ledger accounts for is only our own count: the rule
        waits it out to the moment (a reset is often rounded up to whole seconds).
        One that it does not (the server counts stricter, another client of the
        token, an earlier run) is held until the stated reset, and if the server
        let this request (`accepted`) through and states no policy (which would
        explain it), it teaches the count as a 429 would.
        """
        if hints is None:
            return
        if hints.policy:
            lesson = adopt(self._pacer.rules[key], hints.policy, "rate-limit headers")
            if lesson is not None:
                self._learned(key, lesson)
        if hints.remaining != 0 or self._pacer.full(key):
            return
        if accepted is not None and not hints.policy:
            # A stated policy explains its own "none remaining": the rule holds
            # to it already (a request's answer can come after the server
            # counted the next one), and the count is no news.
            self._learner.spent(key, accepted)
        if hints.reset:
            self._pacer.hold(key, self._clock.now() + hints.reset)

    def review(self, key: LimitKey) -> None:
        """Once a 429 episode of `key` has settled, pace by what it taught."""
        spread = self._pacer.pace(key) is Pace.SPREAD
        safer = self._fallback.get(key)
        rule = self._pacer.rules[key]
        given = self._pacer.given(key)
        lesson = self._learner.review(
            key, rule, spread=spread, safer=safer, given=given
        )
        if lesson is not None:
            self._learned(key, lesson)

    def rule_out(self, key: LimitKey) -> None:
        """Drop `key`'s fallback once the server let through more than it allows."""
        if key not in self._fallback:
            return
        given = self._pacer.rules[key]
        fallback = self._fallback[key]
        lesson = fallback.ruled_out(self._learner, key, given)
        if lesson is not None and fallback.trial:
            del self._fallback[key]  # a 429 in doubt, now known to be noise
        elif lesson is not None:
            self._learned(key, lesson, ruled_out=True)

    def retest(self, key: LimitKey) -> None:
        """Re-test `key`'s lesson once it is due (`_put_in_force`) and no 429 episode
        is pending: the key goes back to the run's first lesson (`_InForce`; or
        its given rule) with the lesson behind it, which a refusal just past it
        confirms and acceptances past it rule out, as a later run re-tests a
        kept lesson."""
        record = self._in_force.get(key)
        if record is None:
            return  # nothing of this run in force: the common case, per answer
        now = self._clock.now()
        if now < record.due or self._behind(key):
            return
        if self._learner.pending(key) or now < self._pacer.cooling(key)[1]:
            return
        self._tested[key] = record
        self._fallback[key] = Fallback(record.lesson, retest=0.0)
        base = None if record.base is None else record.base.lesson.rule
        self._pacer.retest(key, record.lesson.rule, base)

    def _learned(
        self, key: LimitKey, lesson: Lesson, *, ruled_out: bool = False
    ) -> None:
        # A lesson settles a fallback (`_settled`): one that rules the fallback
        # out drops it; any other (a tighter rule, a refusal past what the
        # fallback allows, 429s that still come when spread) takes it.
        given = self._pacer.rules[key]
        fallback = self._settled(key, lesson)
        retest = None if fallback is None else fallback.retest
        if retest is not None and ruled_out:
            self._relax(key)
            self._emit(key, lesson)
            return
        if retest is not None and fallback is not None:
            # Refused past it: the lesson stands as kept, its pace too,
            # confirmed again (an earlier run's is re-tested again by a later
            # run, `retest.due`).
            lesson = reconfirmed(fallback.reading, lesson)
            if key not in self._tested:
                self._kept.add(key)
        elif fallback is not None and not ruled_out and not fallback.trial:
            # (A reading in doubt, one refusal's, is no safer reading: a second
            # refusal's lesson reads it with its own, `Learner.review`; a
            # stated policy or count stands without it.)
            lesson = fallback.taken(lesson, given)
        if lesson.fallback is not None:
            strong = lesson.confirmed and lesson.strong
            self._fallback[key] = Fallback(
                lesson.fallback, trial=lesson.trial, strong=strong, said=lesson.said
            )
        # Later runs start from a faster reading with the safer one behind it,
        # as this one goes on; while a safer rule stands that is no reading of
        # the log (--profile auto's B), from the lesson joined with it.
        standing = None if lesson.fallback else self._fallback.get(key)
        kept = None if standing is None else standing.kept(lesson)
        keep = lesson.confirmed and not lesson.trial
        self._pacer.learn(
            key, lesson, kept=kept, keep=keep, confirms=retest, back=retest is not None
        )
        if lesson.trial:
            return  # a 429 in doubt: nothing learned yet
        self._put_in_force(key, lesson)
        self._emit(key, lesson)

    def _settled(self, key: LimitKey, lesson: Lesson) -> Fallback | None:
        """The fallback `lesson` settles, taken off; None if it settles none:
        it is the first to only space the same rule evenly while a safer
        reading stands, whose count is still in question. (A trial is the
        reading such a lesson answers: left standing, no count would ever rule
        it out, and every lone 429 after it would be set aside.)"""
        spread = self._pacer.pace(key) is Pace.SPREAD
        same = lesson.rule == self._pacer.rules[key]
        standing = self._fallback.get(key)
        if lesson.spread and same and not spread and standing and not standing.trial:
            return None
        return self._fallback.pop(key, None)

    def _relax(self, key: LimitKey) -> None:
        """A re-test found the server no stricter than the run's first lesson
        (`_InForce.base`, re-tested in turn after its own wait) or the given
        rule: pace by that again, as it was learned (evenly or not), kept again
        if it was; the ledger forgets a lesson it kept (one of this run that was
        never kept leaves it as it is: another process may keep one)."""
        tested = self._tested.pop(key, None)
        base = None if tested is None else tested.base
        kept = tested is None or tested.lesson.confirmed
        if base is None:
            self._in_force.pop(key, None)
            self._pacer.forget(key, kept=kept)
            return
        if base.lesson.confirmed:
            self._pacer.learn(key, base.lesson, back=True)
        else:
            # Paced by this process only: the lesson ruled out must not stay in
            # the ledger, where the next run would re-test it from the given
            # rule, and a server stricter than that refuses past it again.
            self._pacer.forget(key, kept=kept, back=base.lesson)
        due = base.due if math.isinf(base.due) else self._clock.now() + base.wait
        self._in_force[key] = replace(base, due=due)

    def _put_in_force(self, key: LimitKey, lesson: Lesson) -> None:
        """Record `lesson` as in force, re-tested in this run after
        `retest.run_wait` (twice as long as the last re-test's wait if that was
        of the same rule: it was refused, or the server taught the rule again)
        unless the server stated it or a re-test cannot rule it out; none while
        a safer reading that is not its own stands behind it (`_behind`) or an
        earlier run's lesson paces the key. A reading with a safer one of its
        own behind it is re-tested once that is settled (`retest`), on the
        time it was first learned: the reading that settles it takes its place
        (the root before both stays the base)."""
        if (self._behind(key) and lesson.fallback is None) or key in self._kept:
            return
        held = self._in_force.get(key)
        tested = self._tested.pop(key, None)
        given, now = self._pacer.given(key), self._clock.now()
        if lesson.rule == given:
            self._in_force.pop(key, None)
        elif held is not None and held.lesson.rule == lesson.rule and tested is None:
            # Its time runs on, and it stays paced as first learned: spacing
            # evenly that came on top goes at its re-test (`Pacer.learn`'s
            # `back`: confirmed, it stands as first learned).
            first = replace(lesson, spread=held.lesson.spread)
            self._in_force[key] = replace(held, lesson=first)
        else:
            again = tested is not None and tested.lesson.rule == lesson.rule
            wait = run_wait(given, tested.wait if tested and again else None)
            base = tested.base if tested and again else held
            if held is not None and held.lesson.fallback is not None:
                base = held.base  # a reading in doubt is no lesson to go back to
            if base is not None and base.base is not None:
                base = base.base  # the run's first lesson: its root
            stays = lesson.said or not testable(lesson, given)
            due = math.inf if stays else now + wait
            self._in_force[key] = _InForce(lesson, due, wait, base)

    def _behind(self, key: LimitKey) -> bool:
        """Whether a safer reading stands behind `key`'s rule (not a 429 in
        doubt, which a re-test supersedes)."""
        standing = self._fallback.get(key)
        return standing is not None and not standing.trial

    def _emit(self, key: LimitKey, lesson: Lesson) -> None:
        at = self._clock.now()
        spread = self._pacer.pace(key) is Pace.SPREAD
        self._sink.emit(RuleLearned(at, key, lesson.rule, spread, lesson.evidence))
