"""How late a request can have reached the server: a bound from the network alone.

The server counts a request when it arrives; the client sees only when the request
left and when its answer came back. Counting it until its answer is always safe,
but an answer that waits on the server's work (an expensive query) holds the slot
for that work too. The network alone bounds the arrival sooner:

    a request whose last byte left at w arrived by w + D,

where D bounds the one-way delay. D is read from round trips that hold no server
work: the TCP connect of each new connection (the kernel answers the SYN), and
each refusal (a 429 is refused before any work is done). D is the retransmission
timeout TCP derives from such samples (RFC 6298: the smoothed round trip plus four
times its mean deviation), so a one-way trip, shorter than any round trip, is
within it while the network stays as measured; a refusal that the bound may have
caused doubles it (as TCP doubles its timeout), for the rest of the run.

The slot rule stays as `slots` states it, with "answered" read as "counts until":
a request counts until min(its answer, w + D). Why it is safe: if request i
arrived at w_i + f_i and a later request j left at w_j >= w_i + D + WINDOW, then
j arrived at w_j + f_j >= (w_i + f_i) + WINDOW + (D - f_i): at least one window
later whenever f_i <= D. With no sample yet there is no D, and a request counts
until its answer, as without this module.
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
    """

    written: float
    round_trip: float | None = None
    refused: bool = False


class ArrivalBound:
    """D, the bound on a request's one-way delay, from the round trips seen."""

    def __init__(self) -> None:
        self._smoothed: float | None = None
        self._deviation = 0.0
        self._factor = 1.0
        self._widened = -math.inf

    @property
    def bound(self) -> float | None:
        """D in seconds; None until a round trip has been seen."""
        if self._smoothed is None:
            return None
        return (self._smoothed + _K * self._deviation) * self._factor

    def latest(self, written: float) -> float | None:
        """The latest moment a request whose last byte left at `written` can
        have arrived; None when nothing is known (count it until its answer)."""
        bound = self.bound
        return None if bound is None else written + bound

    def observe(self, trip: Trip, answered: float) -> None:
        """Learn from one exchange: its connect, and a refusal's whole trip."""
        if trip.round_trip is not None:
            self._sample(trip.round_trip)
        if trip.refused:
            self._sample(max(answered - trip.written, 0.0))

    def widen(self, trip: Trip, now: float) -> bool:
        """Double D after a refusal the bound may have caused; once for every
        request that left after the last widening (those before it were paced
        by the tighter bound already doubled). Whether it widened."""
        if self._smoothed is None or trip.written <= self._widened:
            return False
        self._factor *= 2
        self._widened = now
        return True

    def _sample(self, round_trip: float) -> None:
        """RFC 6298 section 2.2 for the first sample, 2.3 for the later ones."""
        if self._smoothed is None:
            self._smoothed, self._deviation = round_trip, round_trip / 2
            return
        error = abs(self._smoothed - round_trip)
        self._deviation = (1 - _BETA) * self._deviation + _BETA * error
        self._smoothed = (1 - _ALPHA) * self._smoothed + _ALPHA * round_trip
