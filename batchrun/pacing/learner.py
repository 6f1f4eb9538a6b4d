"""The one owner of what a run learns of each key's server: per key, its model
(`model.KeyModel`: the evidence, the lesson in force, its lifetime) and its log
(`log.KeyLog`: what the server was seen to accept, the probe gate). It tells the
pacer how to pace each key, and keeps each key's lesson and record in the ledger
(`kept`), so later runs and other processes start from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from batchrun.core.clock import Clock, wall_time
from batchrun.core.events import Because, EventSink, Evidence, RuleLearned
from batchrun.core.limits import LimitKey, Pace, Rule, Window
from batchrun.pacing.kept import (
    RECORD_SUFFIX,
    Kept,
    lesson_text,
    read_lesson,
    read_record,
    record_text,
)
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.log import KeyLog, Sent, latest
from batchrun.pacing.model import (
    FIRST_LIFE,
    USUAL,
    Answer,
    Candidate,
    KeyModel,
    Lesson,
    holds_all,
    joined,
    lengths,
    named_window,
)
from batchrun.pacing.pacer import Pacer


@dataclass(slots=True)
class _Key:
    model: KeyModel
    log: KeyLog
    kept_record: dict[float, int]
    # What the pacer was last told to pace the key by.
    paced: Candidate
    # The latest send of a refused request not yet read: it is read once every
    # request sent before it has its answer.
    unread: float | None = None
    # Each window the server stated, and when it last stated it; each stated
    # count, the window it was read in and when (`Learner.stated`).
    stated: dict[Window, float] = field(default_factory=dict)
    named: dict[int, tuple[Window, float]] = field(default_factory=dict)


class Learner:
    """Learns each key's server from its answers and paces the key by it (see
    the module docstring); the pacer's probe gate (`Pacer.gate`). `usual`: the
    usual window lengths (`model.USUAL`), in the time of the pacer's rules."""

    def __init__(
        self,
        *,
        pacer: Pacer,
        clock: Clock,
        sink: EventSink,
        usual: Sequence[float] = USUAL,
        fallback: Mapping[LimitKey, Rule] | None = None,
        wall: Callable[[], float] = wall_time,
    ) -> None:
        self._pacer = pacer
        self._wall = wall
        self._clock = clock
        self._sink = sink
        self._given = dict(pacer.rules)
        self._keys = {
            key: _Key(
                KeyModel(rule, lengths(rule, usual=usual)),
                KeyLog(),
                {},
                Candidate(LimiterKind.SLIDING, rule),
            )
            for key, rule in self._given.items()
        }
        self._fallback = dict(fallback or {})
        self._ways = {key: pacer.pace(key) for key in self._given}
        # What earlier runs taught, reported once the run has started.
        self._reports: list[RuleLearned] = []
        pacer.gate = self

    def recall(self, keys: Iterable[LimitKey]) -> list[RuleLearned]:
        """Pace `keys` by what the ledger kept of them (a lesson still alive), or
        by their safer rule (--profile auto) for a first lifetime; what to
        report once the run has started."""
        now, wall = self._clock.now(), self._wall()
        for key in keys:
            state, given = self._keys[key], self._given[key]
            ledger = self._pacer.ledger
            text = ledger.recall(f"{key.value}{RECORD_SUFFIX}")
            record = read_record(text, given=given, now=wall)
            state.log.record, state.kept_record = dict(record), record
            kept = read_lesson(ledger.recall(key.value), given=given, now=wall)
            lesson = self._recalled(state.model, kept, now, wall)
            if lesson is None and key in self._fallback:
                safer = Candidate(LimiterKind.SLIDING, self._fallback[key])
                why = Evidence(Because.SAFER, rule=safer.rule)
                lesson = state.model.adopt(safer, why, now)
            if lesson is not None:
                self._pace(key, lesson, kept=kept is not None)
        found, self._reports = self._reports, []
        return found

    def _recalled(
        self, model: KeyModel, kept: Kept | None, now: float, wall: float
    ) -> Lesson | None:
        """The kept lesson in force from `now`, if still alive; a lesson that
        expired leaves the next one learned soon after to live twice as long."""
        if kept is None:
            return None
        if kept.expired(wall):
            ago = wall - kept.expires
            model.expired = Lesson(
                kept.candidate, kept.why, now - ago - kept.life, now - ago, kept.life
            )
            return None
        lesson = model.adopt(kept.candidate, kept.why, now, life=kept.life)
        lesson.expires = now + kept.expires - wall
        lesson.began = now - (wall - kept.began)
        return lesson

    def sent(self, key: LimitKey, at: float) -> Sent:
        """Log a request of `key` leaving at `at`."""
        log = self._keys[key].log
        return log.started(at, probe=log.beyond(self._lengths(key), at))

    def answered(
        self,
        key: LimitKey,
        entry: Sent,
        at: float,
        *,
        refused: bool | None,
        wait: float | None = None,
        by: float | None = None,
        spent: float | None = None,
    ) -> None:
        """Take the answer of a request of `key` (`refused`: None if no answer
        came; `wait`: a refusal's Retry-After; `by`: the latest moment it can
        have arrived, if the network bounds it before its answer; `spent`: it
        said none remain for that many seconds, read as a refusal of a request
        right after, and one as the reset is near)."""
        state = self._keys[key]
        state.log.answered(entry, at, refused, by)
        if refused is None:
            return
        arrived = latest(entry)
        state.model.add(Answer(entry.start, arrived, not refused, wait), at)
        if spent is not None and not refused:
            # Said as it arrived: a request right after it would be refused,
            # and one just before the reset (less its rounding) too.
            state.model.add(Answer(entry.start, arrived, False, spent, said=True), at)
            state.unread = max(entry.start, state.unread or entry.start)
        if refused:
            state.unread = max(entry.start, state.unread or entry.start)
            state.log.doubt(self._lengths(key), at)
        lesson = None
        if state.unread is not None and state.log.settled(state.unread):
            state.unread = None
            lesson = state.model.decide(at)
        if lesson is not None:
            self._pace(key, lesson)
        elif state.model.current(at) != state.paced:
            self._pace_plain(key)  # the lesson expired: faster candidates again
        if refused is False:
            self._keep_record(key)

    def stated(
        self,
        key: LimitKey,
        policy: tuple[Window, ...],
        *,
        limit: int | None = None,
        reset: float | None = None,
        trip: float = 0.0,
    ) -> None:
        """What the server states joins the given rule outright, each window
        for `FIRST_LIFE` of its length after it was last stated: `policy`'s
        windows, or with none, a stated `limit` in the window its `reset`, said
        `trip` after the request left, names (`_name`). Nothing looser is
        chosen while they stand; they pace the key (kept in the ledger as a
        lesson) unless what paces it already holds to them. Once one lapses
        and the joined rule loosens, what was learned under it ends."""
        state, now = self._keys[key], self._clock.now()
        if policy:
            state.stated.update(dict.fromkeys(policy, now))
        elif limit is not None and reset:
            self._name(state, limit, reset, trip, now)
        else:
            return
        standing = _standing(state, now)
        model = state.model
        rule = joined(self._given[key], standing)
        if rule == model.given:
            return
        model.current(now)  # a lesson whose life ran out ends
        before, model.given = model.plain, rule
        if model.plain.speed < before.speed:
            model.forget(now)  # a statement lapsed: its refusals are old news
        lesson = model.lesson
        if lesson is not None and lesson.why.because is Because.STATED:
            lesson = None  # what was stated before is `rule` now
        if lesson is None and rule == self._given[key]:
            model.forget(now)
            self._pace_plain(key)  # nothing stated stands: the given rule
            return
        if lesson is None:
            candidate = model.plain
        elif holds_all(lesson.candidate.rule, rule):
            return  # what paces the key holds to what was stated
        else:  # the lesson, held to what was stated too
            held = joined(lesson.candidate.rule, rule.windows)
            candidate = replace(lesson.candidate, rule=held)
        why = Evidence(Because.STATED, rule=Rule(standing) if standing else rule)
        self._pace(key, model.adopt(candidate, why, now))

    @staticmethod
    def _name(state: _Key, limit: int, reset: float, trip: float, now: float) -> None:
        """Read a stated count in the window its reset names among the candidate
        lengths (`model.named_window`), the longest named for that count (a
        fixed window's reset counts down); stated again now."""
        named = named_window(limit, reset, trip, state.model.lengths)
        last = state.named.get(limit)
        if last is not None and not _stands(*last, now):
            last = None  # lapsed: the count is read afresh
        if last is not None and (named is None or named.seconds <= last[0].seconds):
            named = last[0]
        if named is not None:
            state.named[limit] = (named, now)

    def opens(
        self, key: LimitKey, now: float, reach: float | None, round_: float | None
    ) -> float | None:
        """The probe gate (`log.KeyLog.gated`) over the windows of the rule in
        force and of the given rule: as many probes on their way at once as
        the rule's rate fills in a `round_` (the time one takes to surely
        arrive), one at least; none while a refusal waits to be read."""
        state, lengths = self._keys[key], self._lengths(key)
        if state.unread is not None and state.log.beyond(lengths, now):
            return math.inf  # a refusal not read yet: no probe before it is
        interval = self._pacer.rule(key).interval
        at_once = 1 if round_ is None else max(1, math.ceil(round_ / interval))
        return state.log.gated(lengths, now, reach, at_once)

    def _lengths(self, key: LimitKey) -> tuple[float, ...]:
        rules = (self._pacer.rule(key), self._given[key])
        return tuple(sorted({w.seconds for rule in rules for w in rule.windows}))

    def _pace(self, key: LimitKey, lesson: Lesson, *, kept: bool = False) -> None:
        """Pace `key` by `lesson`, keep it in the ledger, and say so. What the
        server was seen to accept is capped at the lesson's counts: past them,
        requests are probes again once it expires."""
        candidate = lesson.candidate
        self._keys[key].paced = candidate
        self._pacer.pace_by(key, candidate.rule, candidate.pace)
        self._keys[key].log.rearm(candidate.rule, self._lengths(key))
        spread = candidate.pace is Pace.SPREAD
        at = self._clock.now()
        said = RuleLearned(at, key, candidate.rule, spread, lesson.why, kept)
        if kept:
            self._reports.append(said)
            return
        self._sink.emit(said)
        self._keep_lesson(key, lesson)
        self._keep_record(key)

    def _keep_lesson(self, key: LimitKey, lesson: Lesson) -> None:
        """Keep `lesson` in the ledger, on the wall clock, with its expiry."""
        wall = self._wall() - self._clock.now()
        saved = Kept(
            lesson.candidate,
            lesson.why,
            lesson.began + wall,
            lesson.expires + wall,
            lesson.life,
        )
        self._pacer.ledger.remember(
            key.value, lesson_text(saved, given=self._given[key])
        )

    def _pace_plain(self, key: LimitKey) -> None:
        """Pace `key` by its given rule again (its lesson ended), as joined
        with what the server stated; the ledger keeps when it ended."""
        model = self._keys[key].model
        self._keys[key].paced = model.plain
        self._pacer.pace_by(key, model.given, self._ways[key])
        if model.expired is not None:
            self._keep_lesson(key, model.expired)

    def _keep_record(self, key: LimitKey) -> None:
        """Keep in the ledger what the server was seen to accept of `key`, when it
        has changed: a rerun, or another process, starts from it."""
        state = self._keys[key]
        record = {seconds: state.log.proven(seconds) for seconds in self._lengths(key)}
        if record == state.kept_record:
            return
        state.kept_record = record
        text = record_text(record, given=self._given[key], at=self._wall())
        self._pacer.ledger.remember(f"{key.value}{RECORD_SUFFIX}", text)


def _standing(state: _Key, now: float) -> tuple[Window, ...]:
    """The stated windows that stand at `now`, each for `FIRST_LIFE` of its
    length after it was last stated (a server that states a different quota
    on different answers keeps each); the others are dropped."""
    state.stated = {
        w: said for w, said in state.stated.items() if _stands(w, said, now)
    }
    named = state.named.items()
    state.named = {c: (w, said) for c, (w, said) in named if _stands(w, said, now)}
    return (*state.stated, *(w for w, _ in state.named.values()))


def _stands(window: Window, said: float, now: float) -> bool:
    """A window stated at `said` still stands at `now` (`FIRST_LIFE` of it)."""
    return now - said <= FIRST_LIFE * window.seconds
