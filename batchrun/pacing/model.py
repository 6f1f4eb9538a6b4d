"""One model of what the server enforces on a key: candidate rules replayed
against the key's answers; the fastest that the answers allow paces the key.
This docstring is the model's one screen (docs/design/learner.md says the same).

    Candidates. A rule the server may enforce, no looser than the given rule G:
    G's windows and one window of some length and count, in some shape (a
    sliding log, counting refusals or not; a fixed window or a weighted counter
    at a phase; a leaky bucket at G's rate with some burst, or at a slower
    rate with a burst that is a power of two, `BURSTS`).
    Lengths: G's, a tenth of its shortest, the usual ones (1 s, 10 s, 1 m,
    5 m, 1 h, 1 d, divided as G is by --time-scale) up to half the horizon,
    and a grid down from G's shortest (halves, to that tenth); none longer
    than the evidence spans or G's shortest window (each request is a new
    peak of a longer one, so any refusal would fit it). Phases: two per
    length, and those the last two refusals name: where a Retry-After says
    the window ends; a fixed window's just after each arrived (it refuses at
    its end), a weighted counter's just before (it refuses at its start).

    Replay. Each candidate replays the answers through the server model of
    `limiters` that the sandbox and the simulation use, counting what the
    server counted, at three ends (`ENDS`): every request arriving at its
    send; every one at its latest arrival; each refusal at its latest and each
    acceptance at its send (a refusal is answered before any work, so at the
    other two it seems to arrive before the acceptances that left with it).
    An acceptance it refuses at the first two rules it out. A refusal it
    refuses at one end at least, it explains. The server's word is
    read as refusals no model counts: an answer saying none remain, a refusal
    of the next request; a Retry-After of W s, a refusal W - 1 s later.

    Evidence. Answers within the horizon (`HORIZON` of G's longest window, at
    most `KEPT`); refusals only since the lesson in force expired. A refusal is
    read once every request sent before it has its answer; a reading that
    changed nothing is not made again before an acceptance and more than
    `TAU` refusals.

    Count. Per shape, length and phase, by search, or read off the replay
    (each is monotone in its count): the least count no acceptance rules
    out; then the largest that
    explains every refusal that some standing candidate explains (the others,
    a stray 429 or an outage, are set aside).

    Choice. With at most `TAU` refusals, or at most `TAU` explicable that
    G does not explain too (G's own edge is no news), no change (what paces
    the key stays). Else the
    fastest such candidate (as fast: a log, then a fixed window, a weighted
    counter, a bucket); kept exactly, a weighted counter evenly, a bucket as
    a bucket. What paces the key stays while it explains
    the answers and is no slower. What the server states joins G outright,
    each window for `FIRST_LIFE` of its length after it was last stated (so
    the quotas or routes it names in turn all hold): a policy's windows, or
    a count stated with no window (X-RateLimit-Limit) in the window its reset
    names (`named_window`: the shortest candidate length from the reset to
    the reset plus the answer's time, else the longest within its rounding
    below it). When one lapses and G as joined loosens, what was learned
    under it ends.

    Lifetime. A lesson (a choice other than G) lives `FIRST_LIFE` of the
    longest of its own windows (those not G's), or of G's shortest if
    longer. It ends then, or sooner when more than `TAU` refusals come that
    neither it nor any other candidate explains. Then G paces the key
    again: past what the server was seen to accept (capped by the lesson,
    and by what any window let through when a 429 came), requests are probes, a
    round's worth at a time (`log.KeyLog.gated`). If the expired lesson
    explains the refusals that follow, it comes back for `GROWTH` times its
    last life. Kept in the ledger, a lesson lives on in
    later runs and other processes by the same clock (wall time).

    Cool-down (`run.settlement`). A 429 with a Retry-After holds the key as
    asked; a lone 429 without one costs only its slot; a run of them backs
    off from the rule's interval, doubling, to its longest window.

Pure and synchronous: `learner.Learner` asks after each answer.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from batchrun.core.events import Because, Evidence
from batchrun.core.limits import Pace, Rule, Window
from batchrun.pacing.limiters import Limiter, LimiterKind, make_limiter

# The most refusals that change nothing: one, so a lone 429 never changes the
# pace, and a second that agrees with it does.
TAU = 1
# Evidence counts within this many of G's longest windows: a sliding window needs
# one, a weighted counter two (the previous window weighs on the current), and
# one more lets a refusal be read against the window before it.
HORIZON = 4
# At most this many answers are replayed: enough for four windows of a rule of
# 500, and a bound on the CPU a choice costs.
KEPT = 2000
# A lesson first lives two of its longest windows: one to act on it, one to see
# a window of answers under it before the faster candidates are tried again.
FIRST_LIFE = 2
# Each time the server refuses a faster candidate again, the lesson lives this
# many times longer: twice, so a wrong lesson is kept at most about as long
# as it has stood (four kept wrong lessons twice as long: measured 0.1 to 0.3
# x slower in some next runs of bench.draws, for a 429 fewer).
GROWTH = 2
# A lesson never lives longer than a day: a server that loosened is found again
# within one, at the cost of two 429s.
LONGEST_LIFE = 86400.0
# Phases tried for a fixed window or a weighted counter, as shares of its
# length, besides those the refusals name (`phases_of`): two, as the refusals
# place the others; each phase is a family replayed on every choice (CPU).
PHASES = (0.0, 0.5)
# Window phases are also tried at the last this many refusals (and where their
# Retry-After says the window ends).
RECENT = 2
# A Retry-After in whole seconds may be rounded up by up to one.
ROUNDING = 1.0
# Shapes in the order they are preferred among candidates as fast: a log paced
# exactly holds under a fixed window too; a phase or a burst is one more thing
# to fit.
SHAPES = (
    LimiterKind.SLIDING,
    LimiterKind.FIXED,
    LimiterKind.WEIGHTED,
    LimiterKind.LEAKY,
)
# A bucket at G's rate is searched in its burst; one slower than G (nginx's
# rate below the rule's) is searched in its rate at each of the bursts that
# are powers of this below G's shortest count: two, so a burst between two
# tried is read as the lower, at most half of it (a bucket of 7/10s with a
# burst of 1 under 15/10s was read as logs and windows in turn, each refused
# again: bench.draws seed 10142, 1.16 x; read as its bucket, 1.08 x). No burst
# of 0: that bucket is a window of one per its interval, on the grid of
# lengths already, and a rate searched count by count walked down a refusal
# at a time against it (26, 23, 19 ... 11 per second, each refused, against
# a bucket of 10/s). Each is a bucket family, replayed once per count tried
# (CPU).
BURSTS = 2
# The window lengths, in seconds, that the API description uses or that common
# servers count in.
USUAL = (1.0, 10.0, 60.0, 300.0, 3600.0, 86400.0)
# Lengths tried reach from a tenth of G's shortest window (a burst limit under
# it; shorter ones are lost in the arrival's spread) to half the horizon (two
# of them fit in the evidence).
SHORTEST_SHARE = 0.1
# And lengths on a grid of this ratio down from G's shortest window to that
# tenth, where no length tried is as near: a server's window may be none of
# the usual lengths (2.5 s under 15/10s), and the fastest candidate in the next
# usual length up was four times too slow (bench.draws seeds 10180 and 10189).
# Two: a window between grid points is at most twice one of them; and a
# server that cuts the rule's window into parts cuts it in halves and quarters
# (7/500ms under 30/2s fits neither 0.4 s nor 1 s: bench.draws seed 10032;
# from G down rather than from the tenth up, the sums of the draws' ratios
# fell 1.2 and 2.7). None longer than G's shortest: after an
# outage, a longer one explains its refusals and slows the key (bench.draws
# --cases, the outage under --profile auto: 1.35 x).
GRID = 2.0


def lengths(given: Rule, *, usual: Iterable[float] = USUAL) -> tuple[float, ...]:
    """The window lengths candidates are tried in: G's, a tenth of its
    shortest (`SHORTEST_SHARE`: a burst limit), the `usual` ones (in G's
    time) between that tenth and half the horizon, and the `GRID` down from
    G's shortest to that tenth. (A window the server states joins G itself.)"""
    low = given.shortest.seconds * SHORTEST_SHARE
    high = HORIZON * given.longest / 2
    found = {low, *(w.seconds for w in given.windows)}
    found |= {s for s in usual if low <= s <= high}
    steps = math.ceil(math.log(given.shortest.seconds / low, GRID))
    for seconds in (given.shortest.seconds / GRID**step for step in range(1, steps)):
        # Only where no length tried is as near (the gaps between them).
        if all(abs(math.log(seconds / s, GRID)) >= 0.5 for s in found):
            found.add(seconds)
    return tuple(sorted(found))


def named_window(
    count: int, reset: float, trip: float, lengths: Iterable[float]
) -> Window | None:
    """The window a count stated without one (`X-RateLimit-Limit`) is read in,
    if any. A reset is no longer than the window: said `trip` after the
    request left, it names the shortest candidate length (`lengths`) in
    [reset, reset + trip]. Else, as a reset may be rounded up by `ROUNDING`
    (slowapi adds a second), the longest in [reset - ROUNDING, reset). Else
    none (a bucket's reset is the time until one more fits, no window)."""
    above = [s for s in lengths if reset <= s <= reset + trip]
    below = [s for s in lengths if reset - ROUNDING <= s < reset]
    if above:
        return Window(count, min(above))
    return Window(count, max(below)) if below else None


@dataclass(frozen=True, slots=True)
class Answer:
    """One answered request as evidence: it reached the server between `sent`
    and `latest`, and was `accepted` or refused (with `wait`, a Retry-After).
    `said`: no request but the server's word that one would be refused then
    (an answer's "none remaining", or a Retry-After less its rounding: an
    `echo` of a refusal, not one more), explained as a refusal is, counted by
    no model."""

    sent: float
    latest: float
    accepted: bool
    wait: float | None = None
    said: bool = False
    echo: bool = False


def said(answers: Sequence[Answer]) -> list[Answer]:
    """What each refusal's Retry-After says: a request would still be refused
    a second (the rounding of whole seconds) before the wait ends."""
    return [
        Answer(moment, moment, accepted=False, said=True, echo=True)
        for a in answers
        if not a.accepted and a.wait is not None and a.wait > ROUNDING
        for moment in (a.latest + a.wait - ROUNDING,)
    ]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A rule the server may enforce, in the shape it counts in."""

    kind: LimiterKind
    rule: Rule
    origin: float = 0.0
    counts_refused: bool = False

    def limiter(self) -> Limiter:
        """The server model of this candidate (`limiters`)."""
        options: dict[str, object] = {}
        if self.kind in (LimiterKind.FIXED, LimiterKind.WEIGHTED):
            options["origin"] = self.origin
        if self.kind in (LimiterKind.SLIDING, LimiterKind.FIXED):
            options["count_refused"] = self.counts_refused
        if self.kind is LimiterKind.LEAKY:
            options["burst"] = self.rule.burst or 0
        return make_limiter(self.kind, Rule(self.rule.windows), **options)

    @property
    def pace(self) -> Pace:
        """How the pacer keeps it: evenly for a weighted counter (which refuses
        bursts a log allows), exactly otherwise (a bucket by its burst)."""
        return Pace.SPREAD if self.kind is LimiterKind.WEIGHTED else Pace.EXACT

    @property
    def speed(self) -> tuple[float, float]:
        """Sorts faster first: the long-run interval (evenly spaced a little
        longer), then the most sent at once."""
        rule = self.rule
        burst = rule.shortest.count if rule.burst is None else rule.burst + 1
        if self.pace is Pace.SPREAD:
            return (rule.interval * 1.01, -1)
        return (rule.interval, -burst)

    def __str__(self) -> str:
        refused = ", refusals counted" if self.counts_refused else ""
        return f"{self.kind.value} {self.rule}{refused}"


@dataclass(frozen=True, slots=True)
class Family:
    """Candidates that differ only in the count of their window."""

    kind: LimiterKind
    given: Rule
    seconds: float
    origin: float = 0.0
    counts_refused: bool = False
    # A bucket's burst, when the count searched is its rate per window (None:
    # the count is how many it lets through at once, at G's rate).
    burst: int | None = None

    def at(self, count: int, *, alone: bool = False) -> Candidate:
        """The family's candidate of `count` in its window, with G's windows
        (`alone`: without them, to replay the window by itself). A bucket of
        no `burst` lets `count` through at once and drains at G's rate; one
        of a `burst` drains `count` per window (as nginx's, its burst may be
        more than that count: the pacer sends no more than the window's)."""
        if self.kind is LimiterKind.LEAKY and self.burst is None:
            return Candidate(self.kind, Rule(self.given.windows, burst=count - 1))
        window = Window(count, self.seconds)
        rule = Rule((window,)) if alone else joined(self.given, (window,))
        if self.kind is LimiterKind.LEAKY:
            return Candidate(self.kind, replace(rule, burst=self.burst))
        return Candidate(self.kind, rule, self.origin, self.counts_refused)

    @property
    def most(self) -> int:
        """The largest count to search: what G lets through in the window."""
        return min(
            w.count * max(1, math.ceil(self.seconds / w.seconds - 1e-9))
            for w in self.given.windows
        )


def joined(rule: Rule, windows: Iterable[Window]) -> Rule:
    """`rule` held to `windows` too: each window joins unless one already
    holds to it, and the windows it holds to leave (a bucket keeps its burst)."""
    found = list(rule.windows)
    for window in windows:
        found = [w for w in found if not holds(window, w)]
        if not any(holds(w, window) for w in found):
            found.append(window)
    return replace(rule, windows=tuple(sorted(found, key=lambda w: w.seconds)))


def holds(strict: Window, loose: Window) -> bool:
    """Holding to `strict` also holds to `loose`: fewer in a longer time."""
    return strict.seconds >= loose.seconds and strict.count <= loose.count


def holds_all(strict: Rule, loose: Rule) -> bool:
    """Holding to `strict` also holds to every window of `loose`."""
    return all(any(holds(s, w) for s in strict.windows) for w in loose.windows)


class Phases(NamedTuple):
    """Where the refusals say a fixed window and a weighted counter begin."""

    fixed: list[float]
    weighted: list[float]


def families(
    given: Rule, lengths: Iterable[float], phases: Phases | None = None
) -> list[Family]:
    """Every family of candidates for `given` (the module docstring's
    Candidates); `phases`: where the refusals say windows begin."""
    named = Phases([], []) if phases is None else phases
    found = []
    for seconds in sorted(set(lengths)):
        for refused in (False, True):
            found.append(Family(LimiterKind.SLIDING, given, seconds, 0.0, refused))
        base = {share * seconds for share in PHASES}
        for kind, said in (
            (LimiterKind.FIXED, named.fixed),
            (LimiterKind.WEIGHTED, named.weighted),
        ):
            origins = base | {p % seconds for p in said}
            found += [
                Family(kind, given, seconds, origin) for origin in sorted(origins)
            ]
        if seconds == given.shortest.seconds:
            found.append(Family(LimiterKind.LEAKY, given, seconds))
            found += [
                Family(LimiterKind.LEAKY, given, seconds, burst=burst)
                for burst in bursts(given)
            ]
    return found


def bursts(given: Rule) -> list[int]:
    """The bursts a bucket slower than G is tried with: the powers of
    `BURSTS` below G's shortest count."""
    found, burst = [], 1
    while burst < given.shortest.count:
        found.append(burst)
        burst *= BURSTS
    return found


def _last_refused(a: Answer) -> float:
    """A refusal at its latest arrival, an acceptance at its send."""
    return a.sent if a.accepted else a.latest


# Where each answer is replayed as arriving: every one at its send (early), every
# one at its latest (late), and each refusal at its latest with each acceptance
# at its send (the window as full as it can be when a refusal comes: a refusal,
# answered before any work, has a shorter interval than the acceptances that
# left with it, and at either of the other two ends arrives before them).
ENDS: tuple[Callable[[Answer], float], ...] = (
    lambda a: a.sent,
    lambda a: a.latest,
    _last_refused,
)


class Judge:
    """A family's verdicts on the evidence, for any count: whether an
    acceptance rules the count out (the candidate refuses it at both ends of
    its arrival), and which refusals it explains (it refuses them at one end
    at least)."""

    def __init__(
        self,
        family: Family,
        answers: Sequence[Answer],
        ends: tuple[Arrivals, ...] | None = None,
    ) -> None:
        self.family = family
        self._answers = answers
        # A replay's state does not depend on the count asked about, as it
        # counts what the server counted: one replay a family gives, per
        # answer, the least count that accepts it at its send or at its latest
        # (an acceptance rules out every count below it), and the count below
        # which some end of `ENDS` refuses it (a refusal is explained). A
        # bucket's state does depend on its count (its rate), so a bucket is
        # replayed for each count asked.
        self._accepts: list[int] | None = None
        self._explains: list[int] | None = None
        if family.kind is not LimiterKind.LEAKY:
            found = ends or all_ends(answers)
            if any(len(end) != len(answers) for end in found):
                msg = "the arrivals given are of other answers"
                raise ValueError(msg)
            fills = [[h + 1 for h in held] for held in _fills(family, found)]
            early, late = fills[0], fills[1]
            self._accepts = [min(e, lt) for e, lt in zip(early, late, strict=True)]
            self._explains = [max(at) for at in zip(*fills, strict=True)]

    def _bucket_refusals(
        self, count: int, ends: Sequence[Callable[[Answer], float]] = ENDS
    ) -> list[tuple[bool, ...]]:
        """Whether the bucket of `count` refuses each answer, at each of `ends`
        (all of `ENDS`: early, late, a refusal's latest)."""
        candidate = self.family.at(count, alone=True)
        accepts = [_accepted(candidate, self._answers, at) for at in ends]
        return [tuple(not ok for ok in oks) for oks in zip(*accepts, strict=True)]

    def ruled_out(self, count: int) -> bool:
        """Whether some acceptance rules the candidate of `count` out: it
        refuses the acceptance at its send and at its latest (`ENDS`' first
        two; at the third an acceptance is where it is at the first)."""
        answers = self._answers
        if self._accepts is not None:
            pairs = zip(self._accepts, answers, strict=True)
            return any(a.accepted and count < n for n, a in pairs)
        ends = self._bucket_refusals(count, ENDS[:2])
        return any(
            a.accepted and ref[0] and ref[1]
            for ref, a in zip(ends, answers, strict=True)
        )

    def explained(self, count: int) -> frozenset[int]:
        """The refusals (indexes into the evidence) the candidate explains."""
        answers = self._answers
        if self._explains is not None:
            below = self._explains
            return frozenset(
                i for i, a in enumerate(answers) if not a.accepted and count < below[i]
            )
        ends = self._bucket_refusals(count)
        return frozenset(
            i
            for i, (ref, a) in enumerate(zip(ends, answers, strict=True))
            if any(ref) and not a.accepted
        )

    def least(self) -> int | None:
        """The family's least count no acceptance rules out (None: not even its
        largest). Ruling out is monotone in the count: a family replayed once
        knows the least count each acceptance allows, and takes the largest;
        a bucket's count is searched."""
        most = self.family.most
        if self._accepts is not None:
            pairs = zip(self._accepts, self._answers, strict=True)
            need = max((n for n, a in pairs if a.accepted), default=1)
            return None if need > most else max(1, need)
        low, high = 1, most
        if self.ruled_out(high):
            return None
        while low < high:
            middle = (low + high) // 2
            if self.ruled_out(middle):
                low = middle + 1
            else:
                high = middle
        return low

    def fastest(self, low: int, refusals: frozenset[int]) -> Candidate | None:
        """The family's largest count from `low` that explains every one of
        `refusals`; None if even `low` does not. Explaining is monotone too:
        a family replayed once knows the count below which each refusal is
        explained, and takes the least; a bucket's count is searched."""
        high = self.family.most
        if self._explains is not None:
            below = min((self._explains[i] for i in refusals), default=high + 1)
            top = min(high, below - 1)
            return None if top < low else self.family.at(top)
        if not refusals <= self.explained(low):
            return None
        while low < high:
            middle = (low + high + 1) // 2
            if refusals <= self.explained(middle):
                low = middle
            else:
                high = middle - 1
        return self.family.at(low)


# One answer arriving at one end: its index, the moment, said, accepted.
Arrival = tuple[int, float, bool, bool]
# The answers in the order they arrived at one end.
Arrivals = list[Arrival]


def arrivals(answers: Sequence[Answer], at: Callable[[Answer], float]) -> Arrivals:
    """The answers in the order they arrived at `at(answer)` (one end)."""
    ends = ((i, at(a), a.said, a.accepted) for i, a in enumerate(answers))
    return sorted(ends, key=lambda arrival: arrival[1])


def all_ends(answers: Sequence[Answer]) -> tuple[Arrivals, ...]:
    """The answers in the order they arrived at each of `ENDS`."""
    return tuple(arrivals(answers, at) for at in ENDS)


def _fills(family: Family, ends: tuple[Arrivals, ...]) -> list[list[int]]:
    """`_held` at each of `ENDS` (as `all_ends` orders them). Where the family
    counts no refusal, the third end replays just what the first does (the
    acceptances at their sends): one replay reads both."""
    early, late, last_refused = ends
    if family.counts_refused:
        return [_held(family, end)[0] for end in ends]
    refusals = [arrival for arrival in last_refused if not arrival[3]]
    held, read = _held(family, early, refusals)
    mixed = [read.get(i, fill) for i, fill in enumerate(held)]
    return [held, _held(family, late)[0], mixed]


def _held(
    family: Family, ends: Arrivals, reads: Iterable[Arrival] = ()
) -> tuple[list[int], dict[int, int]]:
    """How full the family's window was as each answer arrived (at one of
    its `ends`), replayed through its model with a count no answer reaches;
    and how full it was at each of `reads` (in order), replaying none of them."""
    room = len(ends) + family.most + 1
    limiter = family.at(room, alone=True).limiter()
    left, replay = limiter.room, limiter.replay
    held, read = [0] * len(ends), {}
    pending = deque(reads)
    for index, moment, said, accepted in ends:
        while pending and (pending[0][1], pending[0][0]) < (moment, index):
            first, then, *_ = pending.popleft()
            read[first] = room - left("", "", then)
        held[index] = room - left("", "", moment)
        if not said:
            replay("", "", moment, accepted=accepted)
    for first, then, *_ in pending:
        read[first] = room - left("", "", then)
    return held, read


def _accepted(
    candidate: Candidate, answers: Sequence[Answer], at: Callable[[Answer], float]
) -> list[bool]:
    """Whether `candidate` accepts each answer arriving at `at(answer)`."""
    limiter = candidate.limiter()
    accepts = [True] * len(answers)
    for index in sorted(range(len(answers)), key=lambda i: at(answers[i])):
        answer, moment = answers[index], at(answers[index])
        if answer.said:
            quotas = limiter.quotas("", "", moment)
            accepts[index] = all(q.remaining > 0 for q in quotas)
        else:
            accepts[index] = limiter.replay("", "", moment, accepted=answer.accepted)
    return accepts


def choose(
    given: Rule,
    answers: Sequence[Answer],
    lengths: Iterable[float],
    phases: Phases | None = None,
) -> Candidate | None:
    """The candidate that paces the key (the module docstring's Choice); None
    when the answers change nothing (at most `TAU` refusals, or at most `TAU`
    explicable that G does not explain too): what paces the key stays."""
    plain = Candidate(LimiterKind.SLIDING, given)
    if sum(not a.accepted and not a.echo for a in answers) <= TAU:
        return None
    news = frozenset(i for i, a in enumerate(answers) if not a.accepted)
    news -= _explained(plain, answers)
    if len(news) <= TAU:
        return None  # G explains all but a lone one, without a replay more
    ends = all_ends(answers)
    judges = [Judge(f, answers, ends) for f in families(given, lengths, phases)]
    standing = [(j, low) for j in judges if (low := j.least()) is not None]
    explicable = frozenset().union(*(j.explained(low) for j, low in standing))
    if len(explicable & news) <= TAU:
        return None  # G explains all but a lone one: nothing says slow down
    found = [c for j, low in standing if (c := j.fastest(low, explicable))]
    if not found:
        return None
    chosen = min(found, key=lambda c: (c.speed, SHAPES.index(c.kind)))
    # G's own rule in another shape, kept the same way, is G.
    same = (chosen.rule, chosen.pace) == (given, Pace.EXACT)
    return plain if same else chosen


@dataclass(slots=True)
class Lesson:
    """A choice slower than G in force: why, since when, until when (on the
    pacer's clock), and its lifetime."""

    candidate: Candidate
    why: Evidence
    began: float
    expires: float
    life: float


@dataclass(slots=True)
class KeyModel:
    """A key's learner state, all of it: the evidence, the lesson in force and
    its lifetime (the module docstring is its one screen)."""

    given: Rule
    lengths: tuple[float, ...]
    answers: list[Answer] = field(default_factory=list)
    # Refusals before this moment are no longer evidence (a lesson expired).
    since: float = -math.inf
    lesson: Lesson | None = None
    # The lesson that expired last, while a refusal may still confirm it again
    # (for one more of its lifetimes).
    expired: Lesson | None = None
    # A reading that changed nothing is not made again before an acceptance
    # (a server that refuses everything is read once, not at every 429) and
    # more than `TAU` refusals after it (a lone stray 429 is not read again
    # with the strays read before it: they were explained by nothing then).
    read: bool = False
    accepted_since_read: bool = False
    refused_since_read: int = 0

    @property
    def plain(self) -> Candidate:
        """G itself, kept as a sliding log."""
        return Candidate(LimiterKind.SLIDING, self.given)

    def current(self, now: float) -> Candidate:
        """The candidate in force at `now`: the lesson while it lives, else G."""
        lesson = self.lesson
        if lesson is not None and now >= lesson.expires:
            self.since, self.lesson, self.expired = lesson.expires, None, lesson
        if self.expired is not None and now >= self.expired.expires + self.expired.life:
            self.expired = None
        return self.plain if self.lesson is None else self.lesson.candidate

    def adopt(
        self,
        candidate: Candidate,
        why: Evidence,
        now: float,
        *,
        life: float | None = None,
    ) -> Lesson:
        """Pace by `candidate` from `now` for `life` (default: `FIRST_LIFE` of
        the longest of its own windows)."""
        life = FIRST_LIFE * self.own(candidate) if life is None else life
        life = min(life, LONGEST_LIFE)
        self.lesson = Lesson(candidate, why, now, now + life, life)
        self.expired = None
        return self.lesson

    def own(self, candidate: Candidate) -> float:
        """The longest window of `candidate` that G does not have, or G's
        shortest if longer (a shorter window still paces within G's): what a
        lesson is about, and what its lifetime counts in."""
        given = self.given.windows
        mine = [w.seconds for w in candidate.rule.windows if w not in given]
        return max([*mine, self.given.shortest.seconds])

    def add(self, answer: Answer, now: float) -> None:
        """Take one answer as evidence (within the horizon)."""
        self.answers.append(answer)
        self.accepted_since_read |= answer.accepted
        self.refused_since_read += not answer.accepted
        if self.accepted_since_read and self.refused_since_read > TAU:
            self.read = False
        horizon = now - HORIZON * self.given.longest
        if len(self.answers) > KEPT or self.answers[0].latest < horizon:
            self.answers = [a for a in self.answers if a.latest >= horizon][-KEPT:]

    def decide(self, now: float) -> Lesson | None:
        """Choose again after a refusal, once every request sent before it has
        its answer (the evidence a refusal is read against); the new lesson,
        if it paces the key slower than what paces it now. A lesson that
        expired and explains the refusals since is confirmed again, with twice
        its life."""
        held = self.current(now)
        evidence = [a for a in self.answers if a.accepted or a.latest >= self.since]
        again = self.expired
        if again is not None and explains(again.candidate, evidence):
            life = GROWTH * again.life
            refused = sum(not a.accepted for a in evidence)
            why = Evidence(Because.AGAIN, refused)
            return self.adopt(again.candidate, why, now, life=life)
        told = [*evidence, *said(evidence)]
        if self.read or (held != self.plain and explains(held, told)):
            return None  # read already, or the lesson in force explains it
        # No window longer than the evidence spans (or G's shortest): each
        # request is a new peak of such a window, so any refusal would fit
        # one (a stray 429 read as 25/1m, 12 s into a run).
        span = now - min((a.sent for a in self.answers), default=now)
        span = max(span, self.given.shortest.seconds)
        testable = [seconds for seconds in self.lengths if seconds <= span]
        candidate = choose(self.given, told, testable, phases_of(evidence))
        refusals = sum(not a.accepted for a in evidence)
        real = sum(not a.accepted and not a.said for a in evidence)
        if candidate in (None, self.plain) and held != self.plain and real > TAU:
            self.lesson_ends(now)  # refused past it, and nothing slower explains
            return None
        if candidate in (None, held) or (
            candidate.speed <= held.speed and explains(held, told)
        ):
            # Read (more than a lone 429), and no news: not again before an
            # acceptance.
            self.read = refusals > TAU
            self.accepted_since_read, self.refused_since_read = False, 0
            return None  # what paces the key stays
        return self.adopt(candidate, Evidence(Because.REFUSED, refusals), now)

    def forget(self, now: float) -> None:
        """No lesson, and no refusal before `now` is evidence (what G stands
        for changed: the server loosened the policy it states)."""
        self.lesson, self.expired, self.since, self.read = None, None, now, False

    def lesson_ends(self, now: float) -> None:
        """The lesson in force ends at `now`, as if it expired."""
        if self.lesson is not None:
            self.lesson.expires = now
            self.current(now)


def phases_of(answers: Sequence[Answer]) -> Phases:
    """Where a window may begin, as the last few refusals say: where a
    Retry-After says it ends; a fixed window refuses at its end, so one
    begins right after a refusal arrived (its latest arrival), and a
    weighted counter at its start, so one begins right before (its send)."""
    refused = [a for a in answers if not a.accepted and not a.said][-RECENT:]
    named = [a.latest + a.wait for a in refused if a.wait]
    return Phases(
        [*named, *(a.latest for a in refused)], [*named, *(a.sent for a in refused)]
    )


def _verdicts(
    candidate: Candidate, answers: Sequence[Answer]
) -> list[tuple[Answer, tuple[bool, ...]]]:
    """Each answer, and whether `candidate` accepts it at each of `ENDS`."""
    accepts = [_accepted(candidate, answers, at) for at in ENDS]
    return list(zip(answers, zip(*accepts, strict=True), strict=True))


def _explained(candidate: Candidate, answers: Sequence[Answer]) -> frozenset[int]:
    """The refusals of `answers` (indexes) that `candidate` refuses at one end
    at least."""
    verdicts = enumerate(_verdicts(candidate, answers))
    return frozenset(i for i, (a, oks) in verdicts if not a.accepted and not all(oks))


def explains(candidate: Candidate, answers: Sequence[Answer]) -> bool:
    """Whether `candidate` explains every refusal of `answers` and no
    acceptance rules it out."""
    for answer, oks in _verdicts(candidate, answers):
        early, late = oks[:2]
        if answer.accepted and not (early or late):
            return False  # refused at both its ends
        if not answer.accepted and all(oks):
            return False  # accepted at every end
    return True
