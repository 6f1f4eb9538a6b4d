"""The pacer: grants send slots per key, first come first served, never polling.

The slot itself is `slots.earliest_slot` (the sliding-window rule, stated there),
checked and recorded atomically by a `Ledger`; the pacer only orders the senders of
each key and sleeps until the computed slot, or until an answer of the key arrives
when in-flight requests fill a window. Each key is paced by a rule, a way (exactly
or evenly), from a given moment on: `pace_by` changes both, as the learner decides.

After a 429 the key cools down (`cool_down`), and then is half-open, as a circuit
breaker is: it grants one probe and nothing more until the probe's answer, so a
server that still refuses costs one 429, not a burst of them. A `Gate` (the
learner's probe gate) may hold a request back until an earlier one has surely
reached the server.

A request counts until its answer, less the part of it taken to have come after
the server counted it (`arrival.ArrivalBound`: the key's floor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

import anyio

from batchrun.core.clock import Clock
from batchrun.core.events import EventSink, SlotWait
from batchrun.core.limits import LimitKey, Pace, Rule
from batchrun.pacing.arrival import ArrivalBound, Trip
from batchrun.pacing.cooling import Cooling
from batchrun.pacing.ledger import Ledger
from batchrun.pacing.slots import Grant, Wait, earliest_slot, reach


class Gate(Protocol):
    """Holds a key's next request back: None, it may leave now; else when it
    may (`math.inf`: at an answer). `reach`: the network's bound on a request's
    way to the server from its send, if known."""

    def opens(
        self, key: LimitKey, now: float, reach: float | None, round_: float | None
    ) -> float | None:
        """When the next request of `key` may leave; None: now. `round_`: how
        long a request takes to surely arrive (`reach`, else its answer)."""
        ...


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
    ) -> None:
        self._rules = dict(rules)
        self.ledger = ledger
        self._clock = clock
        self._paces = dict.fromkeys(self._rules, pace)
        self._sink = sink
        # fast_acquire: an uncontended turn costs no trip through the event loop.
        self._turns = {key: anyio.Lock(fast_acquire=True) for key in self._rules}
        # Made only while a sender sleeps on the key (at most one: turns are FIFO).
        self._answers: dict[LimitKey, anyio.Event] = {}
        self._cooling = {key: Cooling() for key in self._rules}
        self.arrival = ArrivalBound()
        # Per key, the latest answer of a request counted until before it (by
        # the arrival bound): until then plus the rule's reach, a refusal may
        # say the bound is too tight.
        self._bounded: dict[LimitKey, float] = {}
        self.gate: Gate | None = None

    @property
    def rules(self) -> Mapping[LimitKey, Rule]:
        """The rule each key is paced by now."""
        return self._rules

    def pace(self, key: LimitKey) -> Pace:
        """How `key` is paced now: exactly, or evenly."""
        return self._paces[key]

    def pace_by(self, key: LimitKey, rule: Rule, pace: Pace) -> None:
        """Pace `key` by `rule`, `pace`, from now on. A backoff the server did not
        name was a guess at when it has room again; the rule says it better (a
        probe still goes first, half-open)."""
        self._rules[key], self._paces[key] = rule, pace
        cooling = self._cooling[key]
        if not cooling.asked:
            cooling.until = min(cooling.until, self._clock.now())
        self._wake(key)

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
        self, key: LimitKey, ticket: int, *, sent: bool = True, trip: Trip | None = None
    ) -> None:
        """Record the answer of a granted request, waking a sender waiting on it;
        `sent=False`: it never reached the server, and takes no room in the windows.
        `trip`, what the client saw of the exchange, may let the request count
        until before its answer (`arrival`: the answer less the key's floor).

        The answer of a half-open key's probe closes the circuit: the key sends at
        its rule again, unless the answer was a 429 and `cool_down` follows. A probe
        that never reached the server proves nothing: another goes."""
        now = self._clock.now()
        ends = now if trip is None else self._counts_until(key, trip, now)
        self.ledger.release(ticket, ends, sent=sent)
        cooling = self._cooling[key]
        if cooling.probe == ticket:
            cooling.probe = None
            cooling.half_open = not sent
        self._wake(key)

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

    def hold(self, key: LimitKey, until: float) -> None:
        """Grant no slot of `key` before `until`, as a server that says its budget
        is spent until then asks (no rule shortens it; no probe follows)."""
        self._cooling[key].hold(until)

    def cooling(self, key: LimitKey) -> tuple[float, float]:
        """When the key's latest cool-down began, and when it ends (or ended)."""
        return self._cooling[key].began, self._cooling[key].until

    def used(self, key: LimitKey) -> list[float]:
        """The moments of the requests of `key` that fill its windows now, as the
        ledger holds them (every process of the client); one in flight counts as
        sent now."""
        usage = self.ledger.usage(key.value, self._rules[key])
        now = self._clock.now()
        return sorted([*usage.finished, *[now] * usage.in_flight])

    def full(self, key: LimitKey) -> bool:
        """Whether the client's own record (the ledger) leaves `key` no slot now:
        then its rule already waits, and a server's "none remaining" adds nothing."""
        usage = self.ledger.usage(key.value, self._rules[key])
        slot = earliest_slot(usage, self._rules[key], self._paces[key])
        return slot is None or slot > self._clock.now()

    def _try(self, key: LimitKey) -> Grant | Wait:
        now = self._clock.now()
        cooling = self._cooling[key]
        if now < cooling.until:
            return Wait(cooling.until)
        if cooling.probe is not None:
            return Wait(None)  # half-open: the probe's answer decides
        if self.gate is not None:
            bound = self.arrival.bound
            # From its send, a request reaches the server within two bounds:
            # one for a new connection's connect before it is written, one for
            # its way.
            reach = None if bound is None else 2 * bound
            answer = self.arrival.answer_time(key.value)
            opens = self.gate.opens(key, now, reach, answer if reach is None else reach)
            if opens is not None:
                return Wait(None if math.isinf(opens) else opens)
        grant = self.ledger.reserve(key.value, self._rules[key], self._paces[key], now)
        if cooling.half_open and isinstance(grant, Grant):
            cooling.probe = grant.ticket
        return grant

    def _wake(self, key: LimitKey) -> None:
        answer = self._answers.pop(key, None)
        if answer is not None:
            answer.set()

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
