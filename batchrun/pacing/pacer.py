"""The pacer: grants send slots per key, first come first served, never polling.

The slot itself is `slots.earliest_slot` (the sliding-window rule, stated there),
checked and recorded atomically by a `Ledger`; the pacer only orders the senders of
each key and sleeps until the computed slot, or until an answer of the key arrives
when in-flight requests fill a window.

After a 429 the key cools down (`cool_down`), and then is half-open, as a circuit
breaker is: it grants one probe and nothing more until the probe's answer, so a
server that still refuses costs one 429, not a burst of them. Past what the server
has been seen to accept in a window (kept in the ledger beside the lessons, so a
rerun starts at full speed), requests are probes that reach the server one at a
time, each once the last has surely arrived (`learning.log.KeyLog.gated`).

A request counts until its answer, less the part of it taken to have come after
the server counted it (`arrival.ArrivalBound`: the key's floor); a refused one
too, unless the key's server was seen not to count refusals (`room.Room`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

import anyio

from batchrun.core.clock import Clock, wall_time
from batchrun.core.events import EventSink, SlotWait
from batchrun.core.limits import LimitKey, Pace, Rule, Window
from batchrun.pacing.arrival import ArrivalBound, Trip
from batchrun.pacing.cooling import Cooling
from batchrun.pacing.learning.learner import Learner
from batchrun.pacing.learning.lessons import Lesson
from batchrun.pacing.learning.retest import Kept, due, interval, testable, under_way
from batchrun.pacing.learning.storage import (
    RECORD_SUFFIX,
    accepted_record,
    recalled,
    recalled_record,
    stored,
)
from batchrun.pacing.ledger import Ledger
from batchrun.pacing.room import Room, known
from batchrun.pacing.room import remember as remember_room
from batchrun.pacing.slots import Grant, Wait, earliest_slot, reach


class Pacer:
    """Grants send slots per key, first come first served, as early as the rule
    allows (see the module docstring)."""

    def __init__(
        self,
        *,
        rules: Mapping[LimitKey, Rule],
        ledger: Ledger,
        clock: Clock,
        pace: Pace = Pace.EXACT,
        sink: EventSink | None = None,
        time_scale: float = 1.0,
    ) -> None:
        self._rules = dict(rules)
        self._given = dict(rules)  # what lessons tighten, kept with them
        self._ledger = ledger
        self._clock = clock
        self._pace = pace
        self._paces = dict.fromkeys(self._rules, pace)
        self._sink = sink
        # fast_acquire: an uncontended turn costs no trip through the event loop.
        self._turns = {key: anyio.Lock(fast_acquire=True) for key in self._rules}
        # Made only while a sender sleeps on the key (at most one: turns are FIFO).
        self._answers: dict[LimitKey, anyio.Event] = {}
        self._cooling = {key: Cooling() for key in self._rules}
        self.learner = Learner(time_scale=time_scale)
        self._time_scale = time_scale
        self._kept_records: dict[LimitKey, dict[float, int]] = {}
        # Keys re-testing a kept lesson: its rule, whose windows gate probes too.
        self._retests: dict[LimitKey, Rule] = {}
        self.arrival = ArrivalBound()
        # Per key, the latest answer of a request counted until before it (by
        # the arrival bound): until then plus the rule's reach, a grant may
        # have come only from the bound, and a refusal may say it is too tight.
        self._bounded: dict[LimitKey, float] = {}
        # Per key, its refusals and whether the server counts them (`room`).
        self._rooms = {key: Room() for key in self._rules}

    @property
    def rules(self) -> Mapping[LimitKey, Rule]:
        """The rule of every key this pacer grants slots for."""
        return self._rules

    async def acquire(self, key: LimitKey) -> int:
        """Wait for the next slot of `key`; return the ticket to `release` later."""
        async with self._turns[key]:
            while True:
                wait = self._try(key)
                if isinstance(wait, Grant):
                    return wait.ticket
                self._emit(SlotWait(self._clock.now(), key, wait.until))
                await self._sleep(key, wait.until)

    def release(
        self,
        key: LimitKey,
        ticket: int,
        *,
        sent: bool = True,
        trip: Trip | None = None,
        refused: bool | None = None,
    ) -> bool:
        """Record the answer of a granted request, waking a sender waiting on it;
        `sent=False`: it never reached the server, and takes no room in the windows.
        `trip`, what the client saw of the exchange, may let the request count
        until before its answer (`arrival`: the answer less the key's floor);
        `refused`: the server answered 429 (False: it let the request through,
        None: no answer), which may settle whether it counts refusals (`room`).
        True: the room test was refused, which the server counting refusals
        explains (the rule, counting them, waits already: no lesson, no backoff).

        The answer of a half-open key's probe closes the circuit: the key sends at
        its rule again, unless the answer was a 429 and `cool_down` follows. A probe
        that never reached the server proves nothing: another goes."""
        now = self._clock.now()
        ends = now if trip is None else self._counts_until(key, trip, now)
        self._ledger.release(ticket, ends, sent=sent)
        room, before = self._rooms[key], self._rooms[key].counted
        explained = room.answered(ticket, refused if sent else None, ends)
        if room.counted is not before:
            remember_room(self._ledger, key.value, room.counted, at=wall_time())
        cooling = self._cooling[key]
        if cooling.probe == ticket:
            cooling.probe = None
            cooling.half_open = not sent
        answer = self._answers.pop(key, None)
        if answer is not None:
            answer.set()
        return explained

    def _counts_until(self, key: LimitKey, trip: Trip, now: float) -> float:
        """Until when a request answered `now` counts: its answer, less the
        key's floor when one is known. A refusal of a request that left while
        a floor was in play widens the bound on the network, lowering floors."""
        in_play = self._bounded.get(key, -math.inf) + reach(self._rules[key])
        if trip.refused and trip.written < in_play:
            self.arrival.widen(trip, now)
        self.arrival.observe(key.value, trip, now)
        counted = self.arrival.counted_by(key.value, trip, now)
        if counted < now:
            self._bounded[key] = now
        return counted

    def cool_down(self, key: LimitKey, until: float, *, asked: bool = False) -> None:
        """Grant no slot of `key` before `until` (after a 429 from the server), then
        one probe. A cool-down that starts while another runs extends that episode.
        `asked`: the server named `until` (Retry-After), not a backoff guess."""
        self._cooling[key].extend(self._clock.now(), until, asked=asked)

    def learn(
        self,
        key: LimitKey,
        lesson: Lesson,
        *,
        kept: Lesson | None = None,
        keep: bool = True,
        confirms: float | None = None,
        back: bool = False,
    ) -> None:
        """Pace `key` by the lesson's rule from now on (and evenly, if it says so;
        `back` to a lesson before, or one a re-test confirmed: as it says), and
        keep it (or `kept`, joined with a safer rule that still stands), with
        the safer reading it falls back to if it has one, in the ledger for later
        runs and other processes (`keep`); `confirms`: it confirms a lesson
        re-tested, kept with that interval (`retest.interval`)."""
        self._rules[key] = lesson.rule
        self._retests.pop(key, None)
        self._rooms[key].steady = not lesson.trial and lesson.fallback is None
        if lesson.spread or back:
            self._paces[key] = Pace.SPREAD if lesson.spread else self._pace
        cooling = self._cooling[key]
        if not cooling.asked:
            # A backoff was a guess at when the server has room again; the rule
            # learned says it better (a probe still goes first, half-open), and
            # a reading in doubt is tested when it next allows a request.
            guess, cooling.until = cooling.until, min(cooling.until, self._clock.now())
            doubted = lesson.fallback if lesson.trial else None
            if doubted is not None and doubted.fallback is not None:
                usage = self._ledger.usage(key.value, doubted.rule)
                slot = earliest_slot(usage, doubted.rule)
                cooling.until = guess if slot is None else slot
        if keep:
            # Kept as paced now: spaced evenly until a lesson goes `back`.
            spread = self._paces[key] is Pace.SPREAD
            kept = replace(kept or lesson, spread=spread, trial=False)
            given, scale = self._given[key], self._time_scale
            later = interval(kept, given, scale, confirms=confirms)
            text = stored(
                kept, given=given, time_scale=scale, at=wall_time(), retest=later
            )
            self._ledger.remember(key.value, text)

    def forget(
        self, key: LimitKey, *, kept: bool = True, back: Lesson | None = None
    ) -> None:
        """Pace `key` by `back` (its given rule if None) from now on, and forget
        what the ledger kept of it if `kept` (a re-test ruled it out)."""
        self.learn(key, back or Lesson(self._given[key], ""), keep=False, back=True)
        if kept:
            self._ledger.remember(key.value, "{}")

    def recall(self, keys: Iterable[LimitKey]) -> list[Kept]:
        """Pace `keys` by what the ledger kept from earlier runs, but those due
        for a re-test (`retest.due`), which pace by the given rule with it to
        fall back to; say what."""
        found = []
        now, scale = wall_time(), self._time_scale
        for key in keys:
            given = self._given[key]
            self._rooms[key].counted = known(self._ledger, key.value, now=now)
            kept = self._ledger.recall(f"{key.value}{RECORD_SUFFIX}")
            self._kept_records[key] = recalled_record(kept, given, scale)
            self.learner.seed(key, self._kept_records[key])
            text = self._ledger.recall(key.value)
            lesson = recalled(given, text, time_scale=scale, now=now)
            if lesson is None:
                continue
            again = due(text, now) if testable(lesson, given) else None
            if again is None:
                self.learn(key, lesson, keep=False)
            else:  # paced by the given rule already; the ledger has it due
                self._retests[key] = lesson.rule
            self.learner.rearm(key.value, lesson.rule)
            found.append(Kept(key, lesson, again))
        return found

    def retest(self, key: LimitKey, rule: Rule, base: Rule | None = None) -> None:
        """Pace `key` by `base` (its given rule if None) again, with `rule`, a
        lesson in doubt, behind it: past it, a probe waits for every answer. The
        ledger's lesson is due until the server answers (`retest.under_way`)."""
        self._rules[key] = self._given[key] if base is None else base
        self._retests[key] = rule
        self._rooms[key].steady = False
        text = self._ledger.recall(key.value)
        text = under_way(text, rule, self._given[key], self._time_scale, wall_time())
        if text is not None:
            self._ledger.remember(key.value, text)

    def gate(self, key: LimitKey) -> tuple[Window, ...]:
        """The windows whose accepted record gates `key` (rule, given, re-test)."""
        tested = self._retests[key].windows if key in self._retests else ()
        return tuple({*self._rules[key].windows, *self._given[key].windows, *tested})

    def given(self, key: LimitKey) -> Rule:
        """The rule `key` was given, which lessons tighten."""
        return self._given[key]

    def probe(self, key: LimitKey) -> bool:
        """Whether a request of `key` leaving now is a probe (`KeyLog.beyond`)."""
        return self.learner.beyond(key, self.gate(key), self._clock.now())

    def keep_record(self, key: LimitKey) -> None:
        """Keep in the ledger what the server was seen to accept of `key`, when it
        has grown: a rerun, or another process, starts from it."""
        record = self.learner.record(key, self.gate(key))
        if record == self._kept_records.get(key):
            return
        self._kept_records[key] = record
        text = accepted_record(record, self._given[key], self._time_scale, wall_time())
        self._ledger.remember(f"{key.value}{RECORD_SUFFIX}", text)

    def used(self, key: LimitKey) -> list[float]:
        """The moments of the requests of `key` that fill its windows now, as the
        ledger holds them (every process of the client); one in flight counts as
        sent now."""
        usage = self._ledger.usage(key.value, self._rules[key])
        now = self._clock.now()
        return sorted([*usage.finished, *[now] * usage.in_flight])

    def full(self, key: LimitKey) -> bool:
        """Whether the client's own record (the ledger) leaves `key` no slot now:
        then its rule already waits, and a server's "none remaining" adds nothing."""
        usage = self._ledger.usage(key.value, self._rules[key])
        slot = earliest_slot(usage, self._rules[key], self._paces[key])
        return slot is None or slot > self._clock.now()

    def pace(self, key: LimitKey) -> Pace:
        """How `key` is paced now."""
        return self._paces[key]

    def hold(self, key: LimitKey, until: float) -> None:
        """Grant no slot of `key` before `until`, as a server that says its budget
        is spent until then asks (no lesson shortens it; no probe follows)."""
        self._cooling[key].hold(until)

    def cooling(self, key: LimitKey) -> tuple[float, float]:
        """When the key's latest cool-down began, and when it ends (or ended)."""
        return self._cooling[key].began, self._cooling[key].until

    def _try(self, key: LimitKey) -> Grant | Wait:
        now = self._clock.now()
        cooling = self._cooling[key]
        if now < cooling.until:
            return Wait(cooling.until)
        if cooling.probe is not None:
            return Wait(None)  # half-open: the probe's answer decides
        held = self._probe_wait(key, now)
        if held is not None:
            return held
        rule, pace = self._rules[key], self._paces[key]
        grant = self._rooms[key].reserve(self._ledger, key, rule, pace, now)
        if cooling.half_open and isinstance(grant, Grant):
            cooling.probe = grant.ticket
        return grant

    def _probe_wait(self, key: LimitKey, now: float) -> Wait | None:
        """Past what the server was seen to accept, how long the next request
        (a probe) waits for the last one: until it has surely arrived
        (`KeyLog.gated`), or, past a lesson under re-test, until every request
        before it has its answer; None: it need not wait."""
        if key in self._retests and self.learner.in_flight(key) and self.probe(key):
            # A server that still enforces the lesson then refuses that one
            # request, whatever order the others arrived in.
            return Wait(None)
        bound = self.arrival.bound
        # From its send, a probe reaches the server within two bounds: one for a
        # new connection's connect before it is written, one for its way.
        reach = None if bound is None else 2 * bound
        opens = self.learner.gated(key, self.gate(key), now, reach)
        if opens is None:
            return None
        return Wait(None if math.isinf(opens) else opens)

    async def _sleep(self, key: LimitKey, until: float | None) -> None:
        # An answer of this key may open a slot sooner (or the ledger may name a
        # moment only as a bound, e.g. another process's request timing out).
        delay = math.inf if until is None else until - self._clock.now()
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = anyio.Event()
        with anyio.move_on_after(delay):
            await answer.wait()

    def _emit(self, event: SlotWait) -> None:
        if self._sink is not None:
            self._sink.emit(event)
