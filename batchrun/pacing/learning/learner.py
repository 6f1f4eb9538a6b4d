"""The learner: logs each key's requests and, once a 429 episode has settled,
says what it taught (`Learner.review`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from batchrun.core.limits import Rule, Window
from batchrun.pacing.learning.alternatives import (
    aligned_counter,
    counted_lesson,
    leaky_lesson,
    looser_lesson,
    lowered,
    stated_lesson,
)
from batchrun.pacing.learning.evidence import (
    Confirmation,
    Weight,
    confirmed,
    weighed,
)
from batchrun.pacing.learning.fallback import Fallback
from batchrun.pacing.learning.lessons import Lesson, candidates
from batchrun.pacing.learning.log import KeyLog, Sent
from batchrun.pacing.learning.readings import (
    Fit,
    heard_windows,
    infer,
    refused_amid_acceptances,
    went_past,
)


class Learner:
    """Logs each key's requests and, once a 429 episode has settled, says what it
    taught (`review`)."""

    def __init__(self, *, time_scale: float = 1.0) -> None:
        self._time_scale = time_scale
        self._logs: dict[str, KeyLog] = {}
        self._episodes: dict[str, float] = {}
        # Keys whose pending episode is only a server's "none remaining".
        self._stated: set[str] = set()

    def sent(self, key: str, at: float, *, probe: bool = False) -> Sent:
        """Log a request of `key` leaving at `at` (`probe`: `KeyLog.beyond`)."""
        return self._log(key).started(at, probe=probe)

    def answered(
        self,
        key: str,
        entry: Sent,
        at: float,
        *,
        refused: bool | None,
        wait: float | None = None,
        by: float | None = None,
    ) -> None:
        """Log the answer of a request of `key` (`refused`: None if no answer
        came; `wait`: a refusal's Retry-After; `by`: the latest moment it can
        have arrived, if the network bounds it before its answer)."""
        entry.wait = wait
        self._log(key).answered(entry, at, refused, by)

    def gated(
        self, key: str, windows: Iterable[Window], now: float, reach: float | None
    ) -> float | None:
        """When `key`'s next request may leave if a probe must reach the server
        first (`KeyLog.gated`); None: now."""
        return self._log(key).gated(windows, now, reach)

    def beyond(self, key: str, windows: Iterable[Window], now: float) -> bool:
        """Whether `key`'s next request is a probe (`KeyLog.beyond`)."""
        return self._log(key).beyond(windows, now)

    def record(self, key: str, windows: Iterable[Window]) -> dict[float, int]:
        """What the server was seen to accept in each of `windows` (`KeyLog.proven`)."""
        log = self._log(key)
        return {w.seconds: log.proven(w.seconds) for w in windows}

    def seed(self, key: str, record: dict[float, int]) -> None:
        """What earlier runs saw the server accept (`KeyLog.record`)."""
        log = self._log(key)
        for seconds, count in record.items():
            log.record[seconds] = max(count, log.record.get(seconds, 0))

    def rearm(self, key: str, rule: Rule) -> None:
        """Keep what the server was seen to accept of `key` only up to `rule`."""
        self._log(key).rearm(rule)

    def accepted_within(self, key: str, seconds: float) -> int:
        """The most accepted requests of `key` seen to arrive within `seconds`,
        before a lesson as after it."""
        return self._log(key).seen.most(seconds)

    def in_flight(self, key: str) -> int:
        """This process's requests of `key` still waiting for their answer."""
        return self._log(key).unanswered

    def _log(self, key: str) -> KeyLog:
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = KeyLog()
        return log

    def episode(self, key: str, began: float) -> None:
        """A 429 episode of `key` began at `began`: review it once it settles."""
        self._episodes[key] = began
        self._stated.discard(key)

    def pending(self, key: str) -> bool:
        """Whether a 429 episode of `key` waits to be reviewed."""
        return key in self._episodes

    def spent(self, key: str, entry: Sent) -> None:
        """The server accepted `entry` and said no budget remains: as good as a
        refusal of a request sent right after it, at no cost. Reviewed like a 429
        episode, but read plainly (the shorter reading is tried on 429s only)."""
        log = self._log(key)
        log.sent.append(Sent(entry.start, entry.end, True, by=entry.by))
        if key not in self._episodes:
            self._episodes[key] = entry.start
            self._stated.add(key)

    def review(
        self,
        key: str,
        rule: Rule,
        *,
        spread: bool,
        safer: Fallback | None = None,
        given: Rule | None = None,
    ) -> Lesson | None:
        """The lesson of `key`'s episode once every request sent before it began
        has its answer; None while it has not settled, or when none is pending.

        A window no longer than the rule's own is learned at once. When none
        explains the log, the server counts in another way (weighted counters, a
        leaky bucket) or over a longer window (an hourly quota): spacing requests
        evenly is tried first, as it costs nothing if the count was right. If
        429s still come when spread, a longer window that is a quota is learned,
        or else the count is lowered (`lowered`). `safer`: the fallback that
        stands, if a reading is in doubt. A reading the server's own record
        contradicts is noise and teaches nothing; one refusal alone is only a
        trial, never kept (`evidence.weighed`).
        """
        began = self._episodes.get(key)
        log = self._logs.get(key)
        if began is None or log is None or not log.settled(began):
            return None
        del self._episodes[key]
        if not any(s.refused is False for s in log.sent):
            return None  # nothing was ever accepted: no count to learn from
        if key in self._stated:
            # "None remaining" teaches a count, no more: it cost nothing, and
            # the server's own count is what the key is then paced by.
            self._stated.discard(key)
            lesson = self._window_lesson(log, rule, safer=safer, plain=True)
            return None if lesson is None else stated_lesson(lesson, rule)
        if safer is not None and safer.tested:
            # The reading in doubt, put to the test, refused again.
            return self._tested(log, rule, safer, spread=spread, given=given or rule)
        lesson, spaces = self._taught(log, rule, spread=spread, safer=safer)
        if lesson is None:
            return None
        return self._judged(
            log, rule, lesson, spaces=spaces, safer=safer, given=given or rule
        )

    def _tested(
        self, log: KeyLog, rule: Rule, trial: Fallback, *, spread: bool, given: Rule
    ) -> Lesson | None:
        """A reading of one refusal, put to the test (`Fallback.tested`), after
        a second refusal: the key is paced by it, with the safer ones behind
        it; or, if the server confirmed the two strongly (nothing accepted
        between them: the pacer's test, sent when the reading allowed it, was
        refused; or a Retry-After that fits), the reading is wrong too, and
        the log is read with the safer one standing, as after any refusal past
        a fallback. A second stray also takes the reading: the run goes at
        its pace, as a lone 429 did before. Later runs inherit it as the
        server confirmed it (`evidence.confirmed`)."""
        reading, behind = trial.reading, trial.reading.fallback
        word = confirmed(log.sent, reading, None, stated=False, given=given)
        if word >= Confirmation.STRONG and behind is not None:
            safer = Fallback(behind)
            lesson, spaces = self._taught(log, rule, spread=spread, safer=safer)
            reading = behind if lesson is None else safer.taken(lesson, given)
            if spaces:
                log.spacing()
        log.rearm()
        if word is Confirmation.NONE:
            return replace(reading, confirmed=False)
        return _confirmed(reading, word)

    def _judged(
        self,
        log: KeyLog,
        rule: Rule,
        lesson: Lesson,
        *,
        spaces: bool,
        safer: Fallback | None,
        given: Rule,
    ) -> Lesson | None:
        """`lesson` as the evidence for it allows: none for noise, a trial for
        one refusal in doubt, else the lesson itself (`evidence.weighed`)."""
        standing = None if safer is None else safer.rule
        # A statement of the limit, or a lesson an earlier run confirmed,
        # re-tested: a second word already.
        stated = safer is not None and (safer.stated or safer.retest is not None)
        windows = candidates(rule, time_scale=self._time_scale)
        longer = [w for w in windows if w > rule.longest]
        weight = weighed(
            log.sent, lesson, standing, stated=stated, longer=longer, given=given
        )
        if weight is Weight.NOISE or (weight is Weight.DOUBTED and safer):
            return None  # the cool-down was all it cost (`evidence`)
        if weight is Weight.DOUBTED:
            # One refusal alone, in this process only: the rule stands, with
            # the refusal's reading behind it (and the safer ones behind that),
            # which the next refusal settles (`Fallback.tested`; a reading
            # with none behind it, if it agrees) and acceptances past it rule
            # out. Not even spacing evenly: it slows
            # the rest of a run by a window, for what may be a stray 429.
            why = f"a 429 in doubt: {lesson.evidence}"
            return Lesson(rule, why, fallback=lesson, trial=True)
        log.rearm()
        if spaces:
            log.spacing()
        word = confirmed(log.sent, lesson, standing, stated=stated, given=given)
        if word is Confirmation.NONE:
            return replace(lesson, confirmed=False)  # this process's only
        return _confirmed(lesson, word)

    def _taught(
        self, log: KeyLog, rule: Rule, *, spread: bool, safer: Fallback | None
    ) -> tuple[Lesson | None, bool]:
        """The reading of a settled 429 episode's log (`review`), and whether
        the key is told to space its requests evenly from now."""
        lesson = self._window_lesson(log, rule, safer=safer, spread=spread)
        if lesson is not None or not refused_amid_acceptances(log.sent, rule):
            # Refused with nothing accepted in any window (a spent quota, or
            # other clients of the token): there is no count to learn, only waiting.
            return lesson, False
        if spread:
            return self._spread_lesson(log, rule, safer), False
        lesson = _other_counting(log, rule, safer)
        return lesson, lesson.spread

    def _window_lesson(
        self,
        log: KeyLog,
        rule: Rule,
        *,
        safer: Fallback | None,
        spread: bool = False,
        plain: bool = False,
    ) -> Lesson | None:
        """The window reading of the log (`infer`), or, unless `plain` or a
        fallback stands, the faster ones it also fits, fastest first, each with
        the next to fall back to: a leaky bucket (`leaky_lesson`, not when
        `spread`), then a shorter window (`looser_lesson`). A Retry-After that
        a shorter window fits does not rule the bucket out: rounded up to
        whole seconds, it fits a bucket's drain too."""
        windows = candidates(rule, time_scale=self._time_scale)
        # The rule's own windows first: the best guess at the server's time scale.
        own = sorted({w.seconds for w in rule.windows})
        # The windows the server named (`heard_windows`) come first of the shorter.
        heard = [w for w in heard_windows(log.sent, rule) if w not in own]
        shorter = heard + [
            w for w in windows if w < rule.longest and w not in own + heard
        ]
        # While a reading is in doubt, the lesson is joined with the safer one
        # (`Fallback.taken`), which is then what the key is paced by: the
        # shortest window is the one that adds nothing the log does not show.
        order = own + shorter if safer is None else sorted(own + shorter)
        # A Retry-After shorter than a window predicts may be a fixed window's
        # reset: it does not rule the window out of the safe reading.
        lesson = infer(log.sent, rule, order, fit=Fit.FIXED)
        if lesson is None or safer is not None or plain:
            return lesson
        # Each faster reading is tried for at most one more 429; spaced
        # evenly, no bucket's burst can be used.
        looser = looser_lesson(log.sent, rule, lesson, shorter)
        leaky = None if spread else leaky_lesson(log.sent, rule, lesson, looser)
        return leaky or looser or lesson

    def _spread_lesson(
        self, log: KeyLog, rule: Rule, safer: Fallback | None
    ) -> Lesson | None:
        """Refused although spaced evenly: a longer window that is a quota, the
        rule itself in doubt (a fallback stands), or a lowered count."""
        windows = candidates(rule, time_scale=self._time_scale)
        longer = infer(log.sent, rule, [w for w in windows if w > rule.longest])
        if longer is not None:
            lesson: Lesson | None = longer
        elif safer is not None:
            # The rule itself is in doubt (a fallback stands): that is the
            # lesson, and the fallback answers it.
            why = "429s still came when spaced evenly"
            lesson = Lesson(Rule(rule.windows), why, True)
        else:
            lesson = lowered(log, rule)
        return lesson


def _confirmed(lesson: Lesson, word: Confirmation) -> Lesson:
    """`lesson` as strongly as the server confirmed it (`evidence.confirmed`)."""
    said = word is Confirmation.SAID
    return replace(lesson, strong=word >= Confirmation.STRONG, said=said)


def _other_counting(log: KeyLog, rule: Rule, safer: Fallback | None) -> Lesson:
    """Refused although the rule held, and not spaced evenly yet: an aligned
    counter that explains the log (`counters.read`) at a lower count (a burst
    read the rule too high), or the safer reading if the key went past it, or
    the rule counted another way, which spacing evenly answers."""
    counter = aligned_counter(log.sent, rule)
    past = safer is not None and not safer.stated and went_past(log.sent, safer.rule)
    # Only the log read as estimated (no leeway) keeps a fallback standing
    # at the rule's own count: loosened by the round trips, that count
    # explains far more, and the fallback would seldom be taken.
    strict = aligned_counter(log.sent, rule, leeway=False) if past else counter
    counted = strict is not None and strict.window == rule.shortest
    if past and not counted:
        # The key went past what the safer reading allows (a bucket's burst,
        # a shorter window): that reading, which the fallback holds, answers.
        # (A statement, `--profile auto`'s B, is taken only if 429s still
        # come when spaced evenly: its A may be the rule, counted another way.)
        return Lesson(Rule(rule.windows), "a request was refused again")
    lesson = None if counted or counter is None else counted_lesson(counter, rule)
    if lesson is None:
        why = "429s came although requests kept to the rule"
        plain = Rule(rule.windows)  # spaced evenly, a burst is no longer read
        lesson = Lesson(plain, f"{why}: the server counts in another way", True)
    return lesson
