"""The pacer: grants send slots per key, first come first served, never polling.

The slot itself is `slots.earliest_slot` (the sliding-window rule, stated there),
checked and recorded atomically by a `Ledger`; the pacer only orders the senders of
each key and sleeps until the computed slot, or until an answer of the key arrives
when in-flight requests fill a window. Each key is paced by a rule, a way (exactly
or evenly), from a given moment on: `pace_by` changes both, as the learner decides.

After a 429 the key cools down (`cool_down`), then sends one probe
(`sending.Sending`, which holds a key's rule, pace and cool-down). A `Gate` (the
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
from batchrun.pacing.ledger import Ledger
from batchrun.pacing.sending import Sending
from batchrun.pacing.slots import Grant, Wait, earliest_slot


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
        self._keys = {key: Sending(rule, pace) for key, rule in rules.items()}
        self.ledger = ledger
        self._clock = clock
        self._sink = sink
        # fast_acquire: an uncontended turn costs no trip through the event loop.
        self._turns = {key: anyio.Lock(fast_acquire=True) for key in self._keys}
        # Made only while a sender sleeps on the key (at most one: turns are FIFO).
        self._answers: dict[LimitKey, anyio.Event] = {}
        self.arrival = ArrivalBound()
        self.gate: Gate | None = None

    @property
    def rules(self) -> Mapping[LimitKey, Rule]:
        """The rule each key is paced by now."""
        return {key: sending.rule for key, sending in self._keys.items()}

    def rule(self, key: LimitKey) -> Rule:
        """The rule `key` is paced by now."""
        return self._keys[key].rule

    def pace(self, key: LimitKey) -> Pace:
        """How `key` is paced now: exactly, or evenly."""
        return self._keys[key].pace

    def pace_by(self, key: LimitKey, rule: Rule, pace: Pace) -> None:
        """Pace `key` by `rule`, `pace`, from now on. A backoff the server did not
        name was a guess at when it has room again; the rule says it better (a
        probe still goes first, half-open)."""
        self._keys[key].pace_by(rule, pace, self._clock.now())
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
        rule = self._keys[key].rule
        ends = self.arrival.counts_until(key.value, ticket, trip, now, rule, sent)
        self.ledger.release(ticket, ends, sent=sent)
        self._keys[key].answered(ticket, sent=sent)
        self._wake(key)

    def cool_down(self, key: LimitKey, until: float, *, asked: bool = False) -> None:
        """Grant no slot of `key` before `until` (after a 429 from the server), then
        one probe. A cool-down that starts while another runs extends that episode.
        `asked`: the server named `until` (Retry-After), not a backoff guess."""
        self._keys[key].cool_down(self._clock.now(), until, asked=asked)

    def hold(self, key: LimitKey, until: float) -> None:
        """Grant no slot of `key` before `until`, as a server that says its budget
        is spent until then asks (no rule shortens it; no probe follows)."""
        self._keys[key].hold(until)

    def cooling(self, key: LimitKey) -> tuple[float, float]:
        """When the key's latest cool-down began, and when it ends (or ended)."""
        return self._keys[key].began, self._keys[key].until

    def used(self, key: LimitKey) -> list[float]:
        """The moments of the requests of `key` that fill its windows now, as the
        ledger holds them (every process of the client); one in flight counts as
        sent now."""
        usage = self.ledger.usage(key.value, self._keys[key].rule)
        now = self._clock.now()
        return sorted([*usage.finished, *[now] * usage.in_flight])

    def full(self, key: LimitKey) -> bool:
        """Whether the client's own record (the ledger) leaves `key` no slot now:
        then its rule already waits, and a server's "none remaining" adds nothing."""
        sending = self._keys[key]
        usage = self.ledger.usage(key.value, sending.rule)
        slot = earliest_slot(usage, sending.rule, sending.pace)
        return slot is None or slot > self._clock.now()

    def _try(self, key: LimitKey) -> Grant | Wait:
        now = self._clock.now()
        sending = self._keys[key]
        waits = sending.waits(now)
        if waits is not None:
            return waits
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
        rule, pace = sending.rule, sending.pace
        hold = self.arrival.hold(key.value, rule)
        grant = self.ledger.reserve(key.value, rule, pace, now, hold)
        sending.granted(grant)
        if isinstance(grant, Grant):
            usage = self.ledger.usage
            self.arrival.granted(key.value, grant.ticket, sending, now, usage, hold)
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
