"""Until when a request counts: its answer, less the key's floor.

The server counts a request when its limiter sees it; the client sees only when
the request's last byte left (`w`) and when its answer came back. Counting it
until its answer is always safe, but an answer that waits on the server's work
(an expensive query) holds the slot for that work too. So the part of the answer
that surely came after the count is taken off:

    a request of key K answered at `a` counts until a - F(K),
    F(K) = e1 - D - (e4 - e1),

e1 and e4 being the quickest and the fourth quickest of K's accepted exchanges
(`w` to answer; no floor before four). D bounds a round trip of the network:
TCP's retransmission timeout (RFC 6298: the smoothed round trip plus four mean
deviations) over round trips that hold no server work, the TCP connect of each
new connection (the kernel answers the SYN) and each refusal (a 429 is refused
before any work); a refusal the floor may have caused doubles it (as TCP
doubles its timeout), lowering every floor, and each doubling is undone after
two of the rule's longest windows with no more such refusals. The floor
may have caused it when its slot was open only as the floor shortened some
count: counting this process's requests until their answers, the slot rule
would not have opened it yet, or a count in the window may be another
process's (whose answer is not known here). A refusal of a slot open anyway (a
stricter server, a stray 429, an outage) says nothing of the floor.

Why it is safe: an exchange is its way to the count (the network, and any
queue before the limiter), then the work and the way back. The least an
exchange of K can take with no queue, L, is estimated from below by the
quickest four: e1 - (e4 - e1). e1 exceeds L by the queue it met (and its share
of the network's jitter); three spacings of the quickest four are that large
or larger unless the quickest was unluckily slow, which for any spread that is
even near its lowest value (a uniform queue, an exponential one, a spread of
work) happens with probability 1/8 and then by a fraction of one spacing,
which shrinks as exchanges accumulate (the spread over their number). Less D
for the two ways, what is left is work, and if every request of K does that
much work after its count, each spends at least F(K) between its count and its
answer: a request that waited in a busy server's queue before its count is
answered that much later, so it counts that much longer. Where the
assumptions fail (the quickest four all queued alike, a queued request doing
less work than the least), a request still counts until `w + D` at least, the
floor being at most its exchange less D: never less safe than the network's
bound alone.

What it saves: the floor before took four mean deviations of all the exchange
times off the quickest, which covers a queue as well but counts a spread of
work as one: answers of 0.2-0.8 s left no floor, and every request counted
until its answer. The gap to the fourth quickest does not grow with the spread
of the work, only with how sparse the quickest answers are: there the floor
keeps nearly the least work (0.2 s less a few hundredths).

A queue is allowed for, not charged, where the server works: once the floor
shows work after the count (half the allowance or more), a request counts no
longer than its send plus D plus a twentieth of the rule's shortest window
(`_QUEUE_SHARE`), however long its answer took. Where answers vary (0.2-0.8 s
of a 2 s window) the floor alone charged each request its own work above the
least: 1.55 x the ideal where a script counting from the send took 1.46 x. So
the bound is safe where no request waits before its count longer than that
allowance (plus what D covers) more than the quickest did; a longer queue may
cost a 429, whose whole trip (the queue in it) raises D at once, and which
doubles it. Where answers hold no work, a late one waited in a queue (a
loopback server sharing the client's CPU: an e2e run got one 429 with the
allowance applied to it), and counts until its answer.

A request in flight counts until its answer, or, on a key whose floor shows
work, until its lease lapses (`hold`): at its grant plus two D (a new
connection's connect, then its way) plus the allowance, its answer not come.
The ledger counts it until then, until its answer replaces that moment with
the one above; a refusal of a request whose slot only a lapse opened widens D,
as one only a floor opened does (`floored`). Where the floor shows work,
that bounds the count as the allowance does, if the request's last byte
left within D of its grant (none waits for a pooled connection).

A refusal or an error (no work to take off), an exchange the transport did not
trace, and every exchange before a round trip has been seen count until their
answers. The learner places an arrival by the network alone (`latest`): an
estimate, not a count. `answer_time` (the slow end of a key's accepted
exchanges) sizes the requests a run keeps in flight.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from batchrun.core.limits import Pace, Rule
from batchrun.pacing.slots import Usage, earliest_slot
from batchrun.pacing.slots import reach as reach_of

# RFC 6298 section 2: the gains of the smoothed round trip and of its deviation,
# and K, the deviations added to make the timeout.
_ALPHA = 1 / 8
_BETA = 1 / 4
_K = 4
# The wait before the count allowed for, as a share of the rule's shortest
# window, on keys whose floor shows server work (half of it or more): it caps
# what counting a request past its arrival can cost (a twentieth of each
# window, 5 %); at real scale 3 s of a minute, and a longer queue shows in the
# trip of the 429 it may cause (`_sample`). Keys whose answers hold no work get
# none: there a late answer is a queue (a loopback sandbox sharing the client's
# CPU held requests past D + 100 ms).
_QUEUE_SHARE = 1 / 20
# The floor reads the quickest exchanges of a key: the quickest, less its gap to
# the fourth quickest (an estimate of the least exchange from its lower
# spacings, `ArrivalBound.floor`). Four: the gap of three spacings falls short
# of the quickest's own excess with probability 1/8 for any density that is
# even near its lowest value (a uniform queue, an exponential one), and then by
# a fraction of one spacing; more would keep more of the work's spread.
_QUICKEST = 4
# A doubling of D stands this many of the rule's longest windows after the last
# refusal that doubled it, then halves: two, as a lesson first lives
# (`model.FIRST_LIFE`), one to act on it and one to see a window of answers
# under it. TCP too keeps a backed-off timeout only until new round trips are
# measured (RFC 6298, section 5). Kept for the rest of the run, one refusal of
# a burst slowed a whole run by a third (bench.draws seed 10192, 2.22 x where
# the run before took 1.50 x); halving back, 200 draws of seed 1 summed 0.97
# and 1.71 lower, of seed 2 1.89 and 1.23, with fewer 429s. Where a server
# queues requests past the allowance all run, 600 jobs cost 2-6 429s where they
# cost 1-4, in as much time.
_RELAX = 2


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
    """A key's accepted exchanges: how many, the `_QUICKEST` quickest of them
    (ascending), and their smoothed time and mean deviation."""

    quickest: list[float]
    times: _Smoothed
    seen: int = 1

    def add(self, exchange: float) -> None:
        bisect.insort(self.quickest, exchange)
        del self.quickest[_QUICKEST:]
        self.times.sample(exchange)
        self.seen += 1


class Paced(Protocol):
    """How a key is paced: its rule, exactly or evenly."""

    @property
    def rule(self) -> Rule: ...

    @property
    def pace(self) -> Pace: ...


@dataclass(slots=True)
class _Counted:
    """One key's recent answered requests of this process: the moment each
    counts until, mapped to its answer, while within `reach` of its answer
    (in the order answered)."""

    answers: dict[float, float] = field(default_factory=dict)
    order: deque[tuple[float, float]] = field(default_factory=deque)
    reach: float = 0.0
    last_short: float = -math.inf

    def add(self, counted: float, answered: float, reach: float) -> None:
        self.reach = reach
        self.answers[counted] = answered
        self.order.append((answered, counted))
        if counted < answered:
            self.last_short = answered
        while self.order and self.order[0][0] < answered - reach:
            _, old = self.order.popleft()
            if self.answers.get(old, math.inf) < answered - reach:
                del self.answers[old]

    def shortened(self, now: float) -> bool:
        """Whether a request counted short may still hold a window."""
        return self.last_short + self.reach > now


@dataclass(slots=True)
class _Flight:
    """A request of this process in flight: its key, when its lease lapses
    (`ArrivalBound.hold`; `math.inf`: never), and whether only a floor or a
    lapse opened its slot (`ArrivalBound.floored`)."""

    key: str
    lapses: float
    floored: bool


class ArrivalBound:
    """D, a bound on a round trip of the network, from the round trips seen
    that hold no server work, and each key's floor, from its accepted
    exchanges."""

    def __init__(self) -> None:
        self._network: _Smoothed | None = None
        self._factor = 1.0
        self._widened = -math.inf
        self._exchanges: dict[str, _Exchanges] = {}
        # Per key, this process's answered requests while they may still hold a
        # window (within the rule's reach of their answers): what each counts
        # until, and its answer.
        self._counted: dict[str, _Counted] = {}
        # This process's requests in flight, by ticket.
        self._flights: dict[int, _Flight] = {}

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
        to be answered; None until a round trip and `_QUICKEST` acceptances
        have been seen. The quickest exchange e1, less D, less its gap to the
        fourth quickest e4: F = e1 - D - (e4 - e1)."""
        bound, seen = self.bound, self._exchanges.get(key)
        if bound is None or seen is None or seen.seen < _QUICKEST:
            return None
        least, fourth = seen.quickest[0], seen.quickest[-1]
        return max(least - bound - (fourth - least), 0.0)

    def answer_time(self, key: str) -> float | None:
        """The slow end of `key`'s accepted exchanges, send to answer: their
        smoothed time plus four mean deviations (as D is of round trips);
        None before one is seen."""
        seen = self._exchanges.get(key)
        if seen is None:
            return None
        return seen.times.mean + _K * seen.times.deviation

    def hold(self, key: str, rule: Rule) -> float | None:
        """How long a request of `key` granted now counts as in flight at most,
        its answer not come (its lease: then it counts until the moment the
        lease lapsed, until its answer says when it counts until): where the
        floor shows the server works after its count (half the queue allowance
        or more), two D (its way to the server, after a new connection's
        connect, as the pacer's probe gate assumes) plus the allowance; else
        None (until its answer)."""
        queue, bound = self._allowance(key, rule), self.bound
        if queue is None or bound is None:
            return None
        return 2 * bound + queue

    def _allowance(self, key: str, rule: Rule) -> float | None:
        """The wait before the count allowed for on `key` under `rule` (a
        twentieth of its shortest window, `_QUEUE_SHARE`), where the key's
        floor shows the server works after its count (half of it or more);
        None where it shows none, or no floor is known yet."""
        floor, queue = self.floor(key), rule.shortest.seconds * _QUEUE_SHARE
        return None if floor is None or floor < queue / 2 else queue

    def granted(
        self,
        key: str,
        ticket: int,
        paced: Paced,
        now: float,
        usage: Callable[[str, Rule], Usage],
        hold: float | None = None,
    ) -> None:
        """A request of `key` was granted `ticket` at `now`, paced by `paced`,
        with a lease of `hold` (None: none); `usage`: the ledger's, the grant in
        it. Notes whether only a floor or a lapse opened its slot (`floored`)."""
        floored = self.floored(key, paced, now, usage)
        lapses = math.inf if hold is None else now + hold
        self._flights[ticket] = _Flight(key, lapses, floored)

    def counts_until(
        self,
        key: str,
        ticket: int,
        trip: Trip | None,
        now: float,
        rule: Rule,
        sent: bool = True,
    ) -> float:
        """Until when the request of `key` granted `ticket`, answered `now`,
        counts (`counted_by`, with `rule`'s shortest window), having learnt
        from `trip`, what the client saw of it (`observe`; None: nothing, and
        it counts until its answer). A refusal of a request whose slot only a
        floor or a lapse opened (`floored`) widens D, lowering every floor.
        `sent=False`: it never reached the server."""
        flight = self._flights.pop(ticket, None)
        counted = now
        self._relax(now, rule)
        if trip is not None:
            if trip.refused and flight is not None and flight.floored:
                self.widen(trip, now)
            self.observe(key, trip, now)
            counted = self.counted_by(key, trip, now, rule)
        if sent:
            self._counted.setdefault(key, _Counted()).add(counted, now, reach_of(rule))
        return counted

    def shortened(self, key: str, now: float) -> bool:
        """Whether a request of `key` this process counted short (until before
        its answer, or a lease that lapsed) may still hold a window at `now`."""
        counted = self._counted.get(key)
        return bool(self._lapsed(key, now)) or (
            counted is not None and counted.shortened(now)
        )

    def _lapsed(self, key: str, now: float) -> list[float]:
        """The moments the leases of `key`'s requests in flight lapsed, by `now`."""
        flights = self._flights.values()
        return [f.lapses for f in flights if f.key == key and f.lapses <= now]

    def floored(
        self, key: str, paced: Paced, now: float, usage: Callable[[str, Rule], Usage]
    ) -> bool:
        """Whether the slot of `key` just granted at `now` was open only as the
        floor, or a lapse, shortened some count (a refusal of its request
        widens D): with this process's requests counted until their answers
        (a lapsed one still in flight), the slot rule of `paced` would not have
        opened it yet, or a count in the window may be another process's.
        `usage`: the ledger's, the grant in it, asked only while a count this
        process shortened may still hold a window. (Its spacing of starts, if
        `paced` spreads them, held at the grant and does not depend on when
        requests count until.)"""
        if not self.shortened(key, now):
            return False
        found = usage(key, paced.rule)
        unfloored = self.unfloored(key, found.finished, now)
        if unfloored is None:
            return True
        finished, flying = unfloored
        before = Usage(found.in_flight - 1 + flying, finished)  # the grant not yet made
        slot = earliest_slot(before, paced.rule, paced.pace)
        return slot is None or slot > now

    def unfloored(
        self, key: str, finished: Sequence[float], now: float
    ) -> tuple[list[float], int] | None:
        """The moments `finished` requests of `key` count until (ascending), as
        they would have with no floor: each of this process's until its
        answer; and how many of them are leases that lapsed, in flight still
        (their answers to come). None when one within reach may be another
        process's (whose answer is not known here)."""
        counted = self._counted.get(key, _Counted())
        lapsed = Counter(self._lapsed(key, now))
        found, flying = [], 0
        for end in finished:
            if lapsed[end] > 0:
                lapsed[end] -= 1
                flying += 1
                continue
            answer = counted.answers.get(end)
            if answer is None and end > now - counted.reach:
                return None  # another process's, or one this one forgot
            found.append(end if answer is None else answer)
        return sorted(found), flying

    def counted_by(
        self, key: str, trip: Trip, answered: float, rule: Rule | None = None
    ) -> float:
        """The latest moment the server can have counted a request of `key`
        answered at `answered` (`observe`d): for an acceptance once the key has
        a floor, the answer less the floor, and, where the floor shows the
        server works after its count (`_allowance` under `rule`; None: not
        asked), no later than its send plus D plus that allowance; else the
        answer. Never before the send plus D, as the floor is at most this
        exchange less D."""
        floor = self.floor(key) if trip.accepted else None
        bound = self.bound
        if floor is None or bound is None:
            return answered
        queue = None if rule is None else self._allowance(key, rule)
        if queue is None:
            # Answers that hold no work: one that came late waited in a queue.
            return answered - floor
        return min(answered - floor, trip.written + bound + queue)

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
            self._exchanges[key] = _Exchanges([exchange], _Smoothed(exchange))
        else:
            seen.add(exchange)

    def widen(self, trip: Trip, now: float) -> bool:
        """Double D after a refusal the bound may have caused; once for every
        request that left after the last widening (those before it were paced
        by the tighter bound already doubled) or halving (`_relax`). Whether
        it widened."""
        if self._network is None or trip.written <= self._widened:
            return False
        self._factor *= 2
        self._widened = now
        return True

    def _relax(self, now: float, rule: Rule) -> None:
        """Halve a widened D once `_RELAX` of `rule`'s longest windows have
        passed since it last widened or halved."""
        if self._factor > 1 and now - self._widened > _RELAX * rule.longest:
            self._factor /= 2
            self._widened = now

    def _sample(self, round_trip: float) -> None:
        if self._network is None:
            self._network = _Smoothed(round_trip)
        else:
            self._network.sample(round_trip)
