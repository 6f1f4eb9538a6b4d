"""Until when a request counts: its answer, less the key's floor.

The server counts a request when its limiter sees it; the client sees only when
the request's last byte left (`w`) and when its answer came back. Counting it
until its answer is always safe, but an answer that waits on the server's work
(an expensive query) holds the slot for that work too. So the part of the answer
that surely came after the count is taken off:

    a request of key K answered at `a` counts until a - F(K),

F(K), the key's floor, being its quickest accepted exchange (`w` to answer) less
D and less four mean deviations of its exchange times. D bounds a round trip of
the network: TCP's retransmission timeout (RFC 6298: the smoothed round trip plus
four mean deviations) over round trips that hold no server work, the TCP connect
of each new connection (the kernel answers the SYN) and each refusal (a 429 is
refused before any work); a refusal the floor may have caused doubles it (as TCP
doubles its timeout) for the rest of the run, lowering every floor.

Why it is safe: the quickest exchange k took its way to the count, any queue
there, the work, and its way back; D covers the two ways, the deviations cover
a queue in k that the exchanges show by varying, and what is left is work. If
every request of K does that much work after its count, each spends at least
F(K) between its count and its answer. A request that waited in a busy server's
queue before its count is answered that much later, so it counts that much
longer: the network alone (`w + D`, the bound this replaced) would have let the
next window open too soon for it. Where the assumptions fail (the quickest
exchange queued as long as every other, a queued request doing less work than
it), a request still counts until `w + D` at least: never less safe than the
old bound. A floor takes a second exchange: the key's first answered, which may
have waited alone (a server waking up), counts until its answer.

A refusal or an error (no work to take off), an exchange the transport did not
trace, and every exchange before a round trip has been seen count until their
answers. The learner places an arrival by the network alone (`latest`): an
estimate, not a count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# RFC 6298 section 2: the gains of the smoothed round trip and of its deviation,
# and K, the deviations added to make the timeout.
_ALPHA = 1 / 8
_BETA = 1 / 4
_K = 4


@dataclass(frozen=True, slots=True)
class Trip:
    """What the client saw of one exchange, on the pacer's clock.

    `written`: when the request's last byte left. `round_trip`: a network round
    trip measured during it (the TCP connect, when it opened its connection).
    `refused`: the answer was a refusal (429), which holds no server work.
    `accepted`: the server accepted it and answered after its work (a 2xx).
    """

    written: float
    round_trip: float | None = None
    refused: bool = False
    accepted: bool = False


class _Smoothed:
    """RFC 6298's estimator of a time: its smoothed value and mean deviation,
    section 2.2 for the first sample (the deviation half of it, unless told),
    2.3 for the later ones."""

    __slots__ = ("deviation", "mean")

    def __init__(self, first: float, deviation: float | None = None) -> None:
        self.mean = first
        self.deviation = first / 2 if deviation is None else deviation

    def sample(self, value: float) -> None:
        self.deviation = (1 - _BETA) * self.deviation + _BETA * abs(self.mean - value)
        self.mean = (1 - _ALPHA) * self.mean + _ALPHA * value


@dataclass(slots=True)
class _Exchanges:
    """A key's accepted exchanges: how many, the quickest, and how much they
    vary (from no deviation at the first: the second, if as quick, counts
    until its send plus D, as the network alone would count it)."""

    quickest: float
    times: _Smoothed
    seen: int = 1


class ArrivalBound:
    """D, a bound on a round trip of the network, from the round trips seen
    that hold no server work, and each key's floor, from its accepted
    exchanges."""

    def __init__(self) -> None:
        self._network: _Smoothed | None = None
        self._factor = 1.0
        self._widened = -math.inf
        self._exchanges: dict[str, _Exchanges] = {}

    @property
    def bound(self) -> float | None:
        """D in seconds; None until a round trip has been seen."""
        if self._network is None:
            return None
        return (self._network.mean + _K * self._network.deviation) * self._factor

    def latest(self, written: float) -> float | None:
        """When a request whose last byte left at `written` reached the server
        if nothing held it there: its send plus D (the learner's estimate of
        an arrival; counting it, the pacer allows for a queue: `counted_by`).
        None when no round trip has been seen."""
        bound = self.bound
        return None if bound is None else written + bound

    def floor(self, key: str) -> float | None:
        """F: how long after its count any accepted request of `key` is taken
        to be answered; None until a round trip and two acceptances have been
        seen (the first may have waited alone, a server waking up, with nothing
        quicker to show it)."""
        bound, seen = self.bound, self._exchanges.get(key)
        if bound is None or seen is None or seen.seen < 2:
            return None
        return max(seen.quickest - bound - _K * seen.times.deviation, 0.0)

    def counted_by(self, key: str, trip: Trip, answered: float) -> float:
        """The latest moment the server can have counted a request of `key`
        answered at `answered` (`observe`d): the answer less the key's floor
        for an acceptance, else the answer. Never before the send plus D, as
        the floor is at most this exchange less D."""
        floor = self.floor(key) if trip.accepted else None
        return answered if floor is None else answered - floor

    def observe(self, key: str, trip: Trip, answered: float) -> None:
        """Learn from one exchange of `key`: its connect and a refusal's whole
        trip (round trips of the network), an acceptance's whole exchange."""
        if trip.round_trip is not None:
            self._sample(trip.round_trip)
        if trip.refused:
            self._sample(max(answered - trip.written, 0.0))
        if not trip.accepted:
            return
        exchange = max(answered - trip.written, 0.0)
        seen = self._exchanges.get(key)
        if seen is None:
            self._exchanges[key] = _Exchanges(exchange, _Smoothed(exchange, 0.0))
            return
        seen.quickest = min(seen.quickest, exchange)
        seen.times.sample(exchange)
        seen.seen += 1

    def widen(self, trip: Trip, now: float) -> bool:
        """Double D after a refusal the bound may have caused; once for every
        request that left after the last widening (those before it were paced
        by the tighter bound already doubled). Whether it widened."""
        if self._network is None or trip.written <= self._widened:
            return False
        self._factor *= 2
        self._widened = now
        return True

    def _sample(self, round_trip: float) -> None:
        if self._network is None:
            self._network = _Smoothed(round_trip)
        else:
            self._network.sample(round_trip)
