"""Learning a key's real limit from what the server accepted and what it refused.

The API's documentation does not settle its run-query limit, nor say whether it
counts in fixed or sliding windows; a 429 is the server's one certain word. After a
429 episode has settled (every request of it answered), `infer` reads this process's
log of the key's requests and explains the refusals with one window (COUNT/W), W
taken from the rule's own windows, the lengths the API description uses (1 s,
10 s, 1 m, 5 m, 1 h, 24 h, scaled with the run's time scale), and the windows of
one request the server names (`_heard`: a Retry-After after a single accepted
request, or the shortest gap it let between two):

- a refusal of a request that left while N accepted requests were counted in W (sent
  before it, answered within W of its start: the pacer's own way of counting) says
  the server allows at most N per W, if W is the window that refused it;
- an accepted request that left while N were counted says the server allows at
  least N + 1 per W, so a W whose refusals came at fewer is not the one.

A burst fits any window longer than it lasted, so the log often cannot tell the
rule's own window from a shorter one. The safe reading (the rule's own window, or
the shortest that fits) is learned, and when a shorter window fits as well it is
paced by first, with the safe one to fall back to (`Fallback`): one request past
the safe count settles it, for at most one more 429. A burst refused after N
fits a leaky bucket as well (nginx `limit_req`: N at once, then one more as each
drains, at the rule's own rate or a Retry-After's), which no window reading paces
near its speed: that reading is tried first of all (`_leaky`), unless a
Retry-After speaks for a window. Refused although the rule held, the log is read
as a fixed window or weighted counter of unknown phase (`counters.read`): a burst
that straddled its reset read the count too high. Spaced evenly and still
refused, the count is lowered (`_lowered`); a longer window is read only as a
quota, or when the log covers half of it.
Invariant: a lesson only ever adds a window or lowers a count, so the rule it gives
never allows more than the rule it came from; the one looser reading, a leaky
bucket's burst, stands only with a window reading to fall back to.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from batchrun.core import durations
from batchrun.core.errors import UsageError
from batchrun.core.limits import Rule, Window
from batchrun.pacing import counters
from batchrun.pacing.slots import spread_interval

# The window lengths, in seconds, that the API description uses or that common
# servers count in.
_CANDIDATES = (1.0, 10.0, 60.0, 300.0, 3600.0, 86400.0)
# How long a learned limit is trusted (the Redis ledger keeps it as long).
KEPT_FOR = 30 * 86400.0
# Over n window lengths, up to this many, more than n + 1 times the window's
# count of accepted requests rule the window out in any counting
# (`Fallback.ruled_out`).
_SPANS = 6
# A leaky bucket is read only for a shortest window of at most this count: its
# reading paces by one window per request of the burst's window.
_LEAK_MOST = 100
# A window longer than the rule's shortest is learned as a quota only when it
# counts at least this many times the shortest window's count (`infer`).
_QUOTA = 3
# Behind a leaky bucket's reading with a burst, a shorter window's is tried next
# only if the window reading would pace this many times slower (`_leaky`).
_WORTH = 3
# Probes in flight (`KeyLog.gated`) grow by this many per accepted probe: 1 is
# TCP's slow start (1, 2, 4 ...). It stays 0 (one probe at a time) until the
# lessons are read from a whole burst's refusals: the readings below are made
# for a log with one refused probe per window.
_GROWTH = 0
# Requests older than the longest candidate window cannot bear on a lesson; past
# this many the oldest are dropped, which keeps `infer` cheap (quadratic in it).
_KEPT = 2000


@dataclass(slots=True)
class Sent:
    """One request of the key: when it left, when its answer came, and whether that
    answer was a 429 (None while unanswered)."""

    start: float
    end: float | None = None
    refused: bool | None = None
    # The Retry-After of a refusal, if the server gave one.
    wait: float | None = None
    # It left past what the server had been seen to accept (`KeyLog.beyond`).
    probe: bool = False


@dataclass(frozen=True, slots=True)
class Lesson:
    """What a settled 429 episode taught: a tighter rule and why; or, when the rule
    already held and the server still refused (`spread`), to space requests evenly."""

    rule: Rule
    evidence: str
    spread: bool = False
    # A safer lesson that explains the log as well: the key falls back to it if
    # the server refuses again before it lets through more than it allows.
    fallback: Lesson | None = None


def candidates(rule: Rule, *, time_scale: float = 1.0) -> tuple[float, ...]:
    """The window lengths a refusal may be explained by, shortest first."""
    scaled = {seconds / time_scale for seconds in _CANDIDATES}
    return tuple(sorted(scaled | {w.seconds for w in rule.windows}))


@dataclass(slots=True)
class _Accepted:
    """Accepted arrivals (ascending), and the most of them seen within each window
    asked for (`most`), kept up to date as more come."""

    arrivals: list[float] = field(default_factory=list)
    peaks: dict[float, int] = field(default_factory=dict)

    def add(self, moment: float) -> None:
        _bounded_insort(self.arrivals, moment)
        for seconds, count in self.peaks.items():
            within = _within(self.arrivals, moment, seconds)
            self.peaks[seconds] = max(count, within)

    def most(self, seconds: float) -> int:
        """The most arrivals within any `seconds`: counted from the list the
        first time it is asked for, and kept up to date by `add` from then on."""
        if seconds not in self.peaks:
            self.peaks[seconds] = _most(self.arrivals, seconds)
        return self.peaks[seconds]

    def clear(self) -> None:
        self.arrivals.clear()
        self.peaks.clear()


@dataclass(slots=True)
class KeyLog:
    """This process's recent requests of one key, in the order they left, and what
    the server has been seen to let through.

    `proven(W)` is the most accepted requests seen within any W: in this process
    since the last lesson (`accepted`), or by earlier runs and processes
    (`record`, kept in the ledger). A request that leaves while some window
    already holds that many is a probe: at most `cwnd` probes are in flight,
    and each accepted one lets one more go (1, 2, 4 ... as TCP's slow start
    grows), so a server stricter than the rule refuses a few requests, not a
    window of them, and a right rule is at full speed after a few round trips.
    A refused probe starts again from one.
    """

    sent: deque[Sent] = field(default_factory=lambda: deque(maxlen=_KEPT))
    ends: list[float] = field(default_factory=list)
    accepted: _Accepted = field(default_factory=_Accepted)
    seen: _Accepted = field(default_factory=_Accepted)
    record: dict[float, int] = field(default_factory=dict)
    unanswered: int = 0
    probes: int = 0
    cwnd: int = 1
    # When the newest request accepted before the key was told to space its
    # requests evenly arrived (a key spaced from the start: never).
    unspaced: float = -math.inf

    def started(self, at: float, *, probe: bool = False) -> Sent:
        """Log a request that leaves at `at`; `answered` fills in its answer."""
        entry = Sent(at, probe=probe)
        self.sent.append(entry)
        self.unanswered += 1
        self.probes += probe
        return entry

    def answered(self, entry: Sent, at: float, refused: bool | None) -> None:
        """Record the answer of `entry` (`refused` None: no answer, e.g. a timeout)."""
        entry.end, entry.refused = at, refused
        self.unanswered -= 1
        self.probes -= entry.probe
        _bounded_insort(self.ends, at)
        if entry.probe and refused is not None:
            self.cwnd = 1 if refused else self.cwnd + _GROWTH
        if refused is False:
            self.accepted.add(_arrival(entry))
            self.seen.add(_arrival(entry))

    def proven(self, seconds: float) -> int:
        """The most accepted requests the server was seen to let through in W."""
        return max(self.record.get(seconds, 0), self.accepted.most(seconds))

    def beyond(self, windows: Iterable[Window], now: float) -> bool:
        """Whether some window already holds as many requests as the server has
        been seen to accept in it: the next one is a probe."""
        for window in windows:
            used = self.unanswered + len(self.ends)
            used -= bisect.bisect_right(self.ends, now - window.seconds)
            if used >= self.proven(window.seconds):
                return True
        return False

    def gated(self, windows: Iterable[Window], now: float) -> bool:
        """Whether the next request would be a probe with `cwnd` in flight."""
        return self.probes >= self.cwnd and self.beyond(windows, now)

    def spacing(self) -> None:
        """The key is told to space its requests evenly from now (`unspaced`)."""
        self.unspaced = max(_arrival(s) for s in self.sent if s.refused is False)

    def rearm(self, rule: Rule | None = None) -> None:
        """After a lesson the server's state is in doubt: what it was seen to accept
        is kept only up to what `rule` (the lesson's) allows in each of its windows."""
        counts = {} if rule is None else {w.seconds: w.count for w in rule.windows}
        self.record = {
            seconds: min(count, self.proven(seconds))
            for seconds, count in counts.items()
        }
        self.accepted.clear()

    def settled(self, since: float) -> bool:
        """Whether every request that left at or before `since` has its answer."""
        return all(s.end is not None for s in self.sent if s.start <= since)


def _most(arrivals: list[float], seconds: float) -> int:
    """The most of `arrivals` (ascending) within any `seconds`."""
    return max((_within(arrivals, m, seconds) for m in arrivals), default=0)


def _within(arrivals: list[float], moment: float, seconds: float) -> int:
    """How many of `arrivals` (ascending) fall in (moment - seconds, moment]."""
    later = bisect.bisect_right(arrivals, moment)
    return later - bisect.bisect_right(arrivals, moment - seconds)


def _bounded_insort(values: list[float], value: float) -> None:
    bisect.insort(values, value)
    if len(values) > 2 * _KEPT:
        del values[:_KEPT]


class Fit(Enum):
    """How a refusal's Retry-After must fit a window for the window to explain it
    (`_agrees`)."""

    # It names when the oldest request counted in the window leaves it (a
    # sliding window): the reading that fits the server's word best.
    SLIDING = "sliding"
    # It may come earlier (a fixed window resets before its oldest request would
    # leave a sliding one): the safe reading, whichever way the server counts.
    FIXED = "fixed"
    # It is not read at all.
    NONE = "none"


def infer(
    log: Sequence[Sent],
    rule: Rule,
    windows: Iterable[float],
    *,
    fit: Fit = Fit.SLIDING,
) -> Lesson | None:
    """The first of `windows` that explains every refusal in `log` and contradicts
    no acceptance, as a tightened `rule`; None if the log has no refusal or none
    fits. `fit`: how a Retry-After must fit the window.

    A lesson that would not change `rule` is also None: then the server refused
    requests that an exact log of this rule already holds to (it counts in a way
    the log does not match) and only a different pace can help.
    """
    answered = _answered(log)
    latest = _latest_refusal(answered)
    if latest is None:
        return None
    refusals = sum(1 for s in answered if s.refused)
    shortest = rule.shortest
    # How long the log ran, from its first accepted arrival to its last refusal.
    refusal, accepted = latest
    span = refusal - accepted[0] if accepted else 0.0
    for seconds in windows:
        # Only a window no longer than the rule's shortest may be a fixed one
        # whose reset comes early: a longer one is a quota, whose Retry-After
        # names its end.
        longer = seconds > shortest.seconds
        window_fit = Fit.SLIDING if fit is Fit.FIXED and longer else fit
        most, least = _bounds(answered, seconds, fit=window_fit)
        # A window longer than the rule's shortest is read as a quota (at least
        # `_QUOTA` times the shortest's count), or if the log covers half of
        # it; else its count is only how long the log is (a weighted counter's
        # refusal a minute and a bit after a burst would read as an hourly
        # limit of 25 under 15/1m, and a burst's refusal as its count per 10 s).
        covered = span >= seconds / 2
        read = not longer or covered or least >= _QUOTA * shortest.count
        if most >= least and read:
            # `least` the server has surely let through in `seconds`; between it
            # and `most` the log cannot tell, so the count learned is the safe one.
            lesson = _tightened(rule, Window(least, seconds), refusals)
            if lesson is not None:
                return lesson
    return None


def _bounds(log: Sequence[Sent], seconds: float, *, fit: Fit) -> tuple[int, int]:
    """Bounds on the count per `seconds` of a server that refused and accepted as
    in `log`: at most the fewest accepted requests that arrived within `seconds`
    up to a refusal; at least the most that arrived within `seconds` up to an
    acceptance (the server let them all through).

    A request is taken to arrive halfway through its round trip; requests that
    seem to arrive together all count, whatever order they really came in. A
    refusal whose Retry-After does not `fit` the window rules it out.
    """
    arrivals = sorted(_arrival(s) for s in log if s.refused is False)
    most, least = len(arrivals), 1
    for entry in log:
        moment = _arrival(entry)
        inside = bisect.bisect_right(arrivals, moment) - bisect.bisect_right(
            arrivals, moment - seconds
        )
        if entry.refused:
            agrees = _agrees(entry, arrivals, seconds, fit)
            most = min(most, inside if agrees else 0)
        else:
            least = max(least, inside)
    return most, least


def _agrees(refusal: Sent, arrivals: list[float], seconds: float, fit: Fit) -> bool:
    """Whether a refusal's Retry-After fits a window of `seconds`: then it names
    about when the oldest accepted arrival within it leaves the window (`fit`
    SLIDING), or no later (FIXED). Servers round it up to whole seconds, and the
    arrival is an estimate, hence the slack.
    """
    if refusal.wait is None or fit is Fit.NONE:
        return True
    moment = _arrival(refusal)
    oldest = bisect.bisect_right(arrivals, moment - seconds)
    if oldest >= len(arrivals) or arrivals[oldest] > moment:
        return True  # nothing within the window: `inside` is 0 anyway
    predicted = arrivals[oldest] + seconds - moment
    early = math.inf if fit is Fit.FIXED else 0.1 * seconds + 0.05
    return -early <= refusal.wait - predicted <= 1.0 + 0.1 * seconds


def _answered(log: Sequence[Sent]) -> list[Sent]:
    """The requests of `log` that have an answer, 2xx or 429."""
    return [s for s in log if s.end is not None and s.refused is not None]


def _leeway(entry: Sent) -> float:
    """How far a request's arrival may be from `_arrival`'s estimate: anywhere
    between its send and its answer."""
    return 0.0 if entry.end is None else (entry.end - entry.start) / 2


def _arrival(entry: Sent) -> float:
    end = entry.start if entry.end is None else entry.end
    return (entry.start + end) / 2


def stored(lesson: Lesson, *, given: Rule, time_scale: float, at: float) -> str:
    """A lesson as the text a ledger keeps, with the rule it was `given` (what it
    tightened): windows in unscaled seconds, so a run at another time scale reads
    the same limit; `at` is wall-clock seconds."""
    windows = _unscaled(lesson.rule, time_scale)
    why = lesson.evidence
    if time_scale != 1:
        why += f" (at --time-scale {time_scale:g})"
    fields = {"windows": windows, "spread": lesson.spread, "why": why}
    if lesson.rule.burst is not None:
        fields["burst"] = lesson.rule.burst
    if lesson.fallback is not None:
        fields["safer"] = _unscaled(lesson.fallback.rule, time_scale)
    return json.dumps({**fields, "given": _unscaled(given, time_scale), "at": at})


# The ledger key, after the limit key's, of what the server was seen to accept.
RECORD_SUFFIX = "#accepted"


def accepted_record(
    record: dict[float, int], given: Rule, time_scale: float, at: float
) -> str:
    """What the server was seen to accept in each window of `given` (`record`:
    window seconds at `time_scale` to count), as the text a ledger keeps."""
    seen = [[count, seconds * time_scale] for seconds, count in sorted(record.items())]
    return json.dumps({"seen": seen, "given": _unscaled(given, time_scale), "at": at})


def recalled_record(
    text: str | None, given: Rule, time_scale: float, *, now: float | None = None
) -> dict[float, int]:
    """The record a ledger kept (`accepted_record`) for `given`: window seconds
    to count, no count above the window's own; empty if none was kept for this
    very rule, it is unreadable, or older than `KEPT_FOR`."""
    moment = time.time() if now is None else now
    try:
        kept = json.loads(text or "{}")
        at = float(kept["at"])
        same = _same(
            sorted((int(c), float(s)) for c, s in kept["given"]), given, time_scale
        )
        seen = [(int(c), float(s) / time_scale) for c, s in kept["seen"]]
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return {}
    if not same or not moment - KEPT_FOR <= at <= moment + 86400.0:
        return {}
    record = {}
    for count, seconds in seen:
        # A window of the rule by its own length; any other (a lesson's) as kept.
        own = [w for w in given.windows if math.isclose(w.seconds, seconds)]
        most = own[0].count if own else count
        record[own[0].seconds if own else seconds] = max(0, min(count, most))
    return record


def _unscaled(rule: Rule, time_scale: float) -> list[list[float]]:
    return [[w.count, w.seconds * time_scale] for w in rule.windows]


def recalled(
    rule: Rule, text: str | None, *, time_scale: float, now: float
) -> Lesson | None:
    """The lesson a ledger kept (`stored`), applied to `rule`: only ever tighter
    than `rule`, whatever was kept, but for a leaky bucket's burst, which comes
    with the safer reading it falls back to. None if nothing (or nothing
    readable) was; if it was learned under another rule than `rule` (the user
    now gives another: theirs wins); or if it is older than `KEPT_FOR` at `now`
    (wall-clock seconds): servers change their limits, and one 429 learns it
    again."""
    kept = _read(text, time_scale)
    if kept is None:
        return None
    fresh = now - KEPT_FOR <= kept.at <= now + 86400.0  # slack for clock steps
    if not fresh or not _same(kept.given, rule, time_scale):
        return None
    if not _plausible([*kept.windows, *kept.safer], rule, time_scale):
        return None
    tightened = adopt(rule, kept.windows, "")
    tighter = rule if tightened is None else tightened.rule
    # Kept for this very rule (--profile auto's answer that it holds) says so too.
    plain = not kept.spread and kept.burst is None
    if tighter == rule and plain and tuple(kept.windows) != rule.windows:
        return None
    if kept.burst is not None:
        base = tighter.shortest
        if not 0 <= kept.burst < base.count - 1 or base.count > _LEAK_MOST:
            return None  # no bucket this rule's windows do not already hold to
        tighter = Rule(tighter.windows, kept.burst)
    safer = adopt(Rule(tighter.windows), kept.safer, "") if kept.safer else None
    fallback = None if safer is None else Lesson(safer.rule, "kept as the safer")
    why = f"learned {kept.when}: {kept.why}"
    return Lesson(tighter, why, kept.spread, fallback)


@dataclass(frozen=True, slots=True)
class _Kept:
    """A kept lesson's fields, read (`_read`); windows at the run's time scale."""

    windows: list[Window]
    given: list[tuple[int, float]]
    at: float
    when: str
    why: str
    spread: bool
    burst: int | None
    safer: list[Window]


def _read(text: str | None, time_scale: float) -> _Kept | None:
    """The fields of a kept lesson; None if any is missing or unreadable."""

    def windows(pairs: Any) -> list[Window]:
        return [Window(int(c), float(s) / time_scale) for c, s in pairs]

    try:
        kept = json.loads(text or "{}")
        at = float(kept["at"])
        burst = kept.get("burst")
        return _Kept(
            windows=windows(kept["windows"]),
            given=sorted((int(c), float(s)) for c, s in kept["given"]),
            at=at,
            when=time.strftime("%Y-%m-%d %H:%M", time.localtime(at)),
            why=str(kept["why"]),
            spread=bool(kept["spread"]),
            burst=None if burst is None else int(burst),
            safer=windows(kept.get("safer", [])),
        )
    except (
        ValueError,
        TypeError,
        KeyError,
        UsageError,
        OverflowError,
        OSError,
        RecursionError,
    ):
        return None


def _same(given: list[tuple[int, float]], rule: Rule, time_scale: float) -> bool:
    """Whether `given` (unscaled windows, sorted) is `rule` at `time_scale`, in
    whatever order its windows were written."""
    ours = sorted((w.count, w.seconds) for w in rule.windows)
    return len(given) == len(ours) and all(
        c == count and math.isclose(s, seconds * time_scale, rel_tol=1e-9)
        for (c, s), (count, seconds) in zip(given, ours, strict=True)
    )


def _plausible(windows: list[Window], rule: Rule, time_scale: float) -> bool:
    """Whether kept windows are ones a lesson of `rule` can hold: their lengths
    among its candidates, or one the server named (`_heard`: from a millisecond
    to the rule's longest window); a hand edit or a damaged row could otherwise
    stall a key for ages, or hold no window at all."""
    lengths = candidates(rule, time_scale=time_scale)
    return all(
        any(math.isclose(w.seconds, s, rel_tol=1e-9) for s in lengths)
        or 0.001 <= w.seconds <= rule.longest
        for w in windows
    )


def adopt(rule: Rule, policy: Iterable[Window], source: str) -> Lesson | None:
    """`rule` tightened by the windows a server states (`source` names where),
    or None if it already holds to all of them. Never a loosening: a stated window
    looser than the rule is simply already kept."""
    windows = list(rule.windows)
    for window in policy:
        if not any(_implies(w, window) for w in windows):
            windows = [w for w in windows if not _implies(window, w)] + [window]
    if len(windows) == len(rule.windows) and set(windows) == set(rule.windows):
        return None
    tighter = Rule(tuple(sorted(windows, key=lambda w: w.seconds)))
    stated = "+".join(str(w) for w in policy)
    return Lesson(tighter, f"the server states {stated} in its {source}")


def _tightened(rule: Rule, window: Window, refusals: int) -> Lesson | None:
    """`rule` with `window` added, or None if `rule` already holds to it."""
    if any(_implies(w, window) for w in rule.windows):
        return None
    windows = [w for w in rule.windows if not _implies(window, w)]
    tighter = Rule(tuple(sorted([*windows, window], key=lambda w: w.seconds)))
    evidence = (
        f"{refusals} request(s) refused after {window.count} accepted within "
        f"{durations.compact(window.seconds)}"
    )
    return Lesson(tighter, evidence)


def _implies(strict: Window, loose: Window) -> bool:
    """Whether holding to `strict` also holds to `loose` (fewer in a longer time)."""
    return strict.seconds >= loose.seconds and strict.count <= loose.count


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
    ) -> None:
        """Log the answer of a request of `key` (`refused`: None if no answer
        came; `wait`: a refusal's Retry-After)."""
        entry.wait = wait
        self._log(key).answered(entry, at, refused)

    def gated(self, key: str, windows: Iterable[Window], now: float) -> bool:
        """Whether `key`'s next request must wait for a probe's answer (`KeyLog`)."""
        return self._log(key).gated(windows, now)

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

    def spent(self, key: str, entry: Sent) -> None:
        """The server accepted `entry` and said no budget remains: as good as a
        refusal of a request sent right after it, at no cost. Reviewed like a 429
        episode, but read plainly (the shorter reading is tried on 429s only)."""
        log = self._log(key)
        log.sent.append(Sent(entry.start, entry.end, True))
        if key not in self._episodes:
            self._episodes[key] = entry.start
            self._stated.add(key)

    def review(
        self, key: str, rule: Rule, *, spread: bool, safer: Fallback | None = None
    ) -> Lesson | None:
        """The lesson of `key`'s episode once every request sent before it began
        has its answer; None while it has not settled, or when none is pending.

        A window no longer than the rule's own is learned at once. When none
        explains the log, the server counts in another way (weighted counters, a
        leaky bucket) or over a longer window (an hourly quota): spacing requests
        evenly is tried first, as it costs nothing if the count was right. If
        429s still come when spread, a longer window that is a quota is learned,
        or else the count is lowered (`_lowered`). `safer`: the fallback that
        stands, if a reading is in doubt.
        """
        began = self._episodes.get(key)
        log = self._logs.get(key)
        if began is None or log is None or not log.settled(began):
            return None
        del self._episodes[key]
        if not any(s.refused is False for s in log.sent):
            return None  # nothing was ever accepted: no count to learn from
        windows = candidates(rule, time_scale=self._time_scale)
        # The rule's own windows first: the best guess at the server's time scale.
        own = sorted({w.seconds for w in rule.windows})
        # The windows the server named (`_heard`) come first of the shorter.
        heard = [w for w in _heard(log.sent, rule) if w not in own]
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
        if key in self._stated:
            # "None remaining" teaches a count, no more: it cost nothing, and
            # the server's own count is what the key is then paced by.
            self._stated.discard(key)
            return None if lesson is None else _stated_lesson(lesson, rule)
        if lesson is not None and safer is None:
            # One faster reading at a time is tried, for at most one more 429;
            # spaced evenly, no bucket's burst can be used.
            looser = _looser(log.sent, rule, lesson, shorter)
            # A Retry-After that only the shorter window fits, read as a sliding
            # window's, speaks for that reading (or a fixed window's reset):
            # not for a bucket's.
            told = infer(log.sent, rule, order)
            said = looser is not None and told is not None and told.rule == looser.rule
            leaky = None if spread or said else _leaky(log.sent, rule, lesson, looser)
            lesson = leaky or looser or lesson
        if lesson is not None:
            log.rearm()
        if lesson is not None or not _refused_amid_acceptances(log.sent, rule):
            # Refused with nothing accepted in any window (a spent quota, or
            # other clients of the token): there is no count to learn, only waiting.
            return lesson
        if spread:
            longer = infer(log.sent, rule, [w for w in windows if w > rule.longest])
            if longer is not None:
                lesson = longer
            elif safer is not None:
                # The rule itself is in doubt (a fallback stands): that is the
                # lesson, and the fallback answers it.
                why = "429s still came when spaced evenly"
                lesson = Lesson(Rule(rule.windows), why, True)
            else:
                lesson = _lowered(log, rule)
            if lesson is not None:
                log.rearm()
            return lesson
        log.rearm()
        # An aligned counter that explains the log (`counters.read`): at the
        # rule's own count, it is the rule counted another way, which spacing
        # evenly answers; at a lower one, a burst read the rule too high.
        counter = _counter(log.sent, rule)
        past = safer is not None and not safer.stated and _past(log.sent, safer.rule)
        # Only the log read as estimated (no leeway) keeps a fallback standing
        # at the rule's own count: loosened by the round trips, that count
        # explains far more, and the fallback would seldom be taken.
        strict = _counter(log.sent, rule, leeway=False) if past else counter
        counted = strict is not None and strict.window == rule.shortest
        if past and not counted:
            # The key went past what the safer reading allows (a bucket's burst,
            # a shorter window): that reading, which the fallback holds, answers.
            # (A statement, `--profile auto`'s B, is taken only if 429s still
            # come when spaced evenly: its A may be the rule, counted another way.)
            return Lesson(Rule(rule.windows), "a request was refused again")
        lesson = None if counted or counter is None else _counted(counter, rule)
        if lesson is None:
            why = "429s came although requests kept to the rule"
            plain = Rule(rule.windows)  # spaced evenly, a burst is no longer read
            lesson = Lesson(plain, f"{why}: the server counts in another way", True)
        if lesson.spread:
            log.spacing()
        return lesson


def _latest_refusal(log: Sequence[Sent]) -> tuple[float, list[float]] | None:
    """When the latest refusal in `log` arrived, and every accepted arrival
    (ascending); None if nothing was refused."""
    answered = _answered(log)
    refusal = max((_arrival(s) for s in answered if s.refused), default=None)
    if refusal is None:
        return None
    return refusal, sorted(_arrival(s) for s in answered if s.refused is False)


def _past(log: Sequence[Sent], rule: Rule) -> bool:
    """Whether the latest refusal in `log` came when as many accepted requests as
    some window of `rule` allows were already within it."""
    latest = _latest_refusal(log)
    if latest is None:
        return False
    refusal, arrivals = latest
    return any(_within(arrivals, refusal, w.seconds) >= w.count for w in rule.windows)


def _heard(log: Sequence[Sent], rule: Rule) -> list[float]:
    """The windows that refusals' Retry-Afters name, no longer than the rule's
    shortest, ascending: from the one accepted arrival before the refusal to when
    the server asks for the next request, in whole milliseconds rounded up. (A
    refusal with more accepted in that time names no window: a bucket's burst
    drains one request a Retry-After, a window's count in more.)

    A leaky bucket with no burst (nginx `limit_req` without `burst`) refuses what
    comes sooner than one drain after the last it accepted and asks for that
    drain: one request per such window is its rate, which none of the usual
    lengths gives (one per 2 s of a `30r/m` bucket would otherwise be read as one
    per second, refused, then one per minute)."""
    arrivals = sorted(_arrival(s) for s in log if s.refused is False)
    heard: set[float] = set()
    for entry in log:
        if not entry.refused or entry.wait is None:
            continue
        moment = _arrival(entry)
        before = bisect.bisect_right(arrivals, moment)
        if before:
            span = entry.wait + moment - arrivals[before - 1]
            seconds = math.ceil(span * 1000 - 1e-6) / 1000
            alone = _within(arrivals, moment, seconds) == 1
            if alone and 0 < seconds <= rule.shortest.seconds:
                heard.add(seconds)
    # Without a Retry-After, the log names one: the shortest the server was
    # seen to let between two requests (the whole milliseconds below it, so
    # that the two fall in no one window), if slower than the rule's pace
    # spaced evenly (a 429 comes back sooner than an answer, so a refusal seems
    # to arrive early: no gap at that pace says anything).
    gaps = [later - sooner for sooner, later in itertools.pairwise(arrivals)]
    gap = (math.ceil(min(gaps, default=0.0) * 1000 - 1e-6) - 1) / 1000
    if spread_interval(rule) < gap <= rule.shortest.seconds:
        heard.add(gap)
    return sorted(heard)


def _counted(counter: counters.Counter, rule: Rule) -> Lesson:
    """`rule` with its shortest window's count lowered to `counter`'s: paced
    exactly for a fixed window, spaced evenly for a weighted counter."""
    shortest = rule.shortest
    lower = tuple(counter.window if w == shortest else w for w in rule.windows)
    why = (
        f"429s came although requests kept to the rule: read as a "
        f"{counter.counting.value} of {counter.window} that starts "
        f"{durations.compact(counter.phase)} into each"
    )
    weighted = counter.counting is counters.Counting.WEIGHTED
    return Lesson(Rule(lower), why, spread=weighted)


def _counter(
    log: Sequence[Sent], rule: Rule, *, leeway: bool = True
) -> counters.Counter | None:
    """The aligned counter of the rule's shortest window, at its count or lower,
    that explains `log` (`counters.read`), each arrival anywhere between its
    send and its answer (`leeway`) or where `_arrival` estimates it; None if
    none does. (A longer window is read only as a quota, `infer`: a log seldom
    covers it.)"""
    answered = _answered(log)
    requests = [
        counters.Request(
            _arrival(s), bool(s.refused), s.wait, _leeway(s) if leeway else 0.0
        )
        for s in answered
    ]
    return counters.read(sorted(requests, key=lambda r: r.at), rule.shortest)


def _binding(rule: Rule) -> Window:
    """The window that sets the rule's long-run rate (`Rule.interval`)."""
    return max(rule.windows, key=lambda w: (w.seconds / w.count, -w.seconds))


def _lowered(log: KeyLog, rule: Rule) -> Lesson | None:
    """`rule`, spaced evenly and still refused, with its binding window's count
    lowered to what the server had accepted within it when it last refused, if
    that is half of it or more; else, or if requests in that window were not
    all spaced evenly yet, by one (a stray 429, another client of the token,
    costs a step, not half the pace). None if the count is 1 already, or if the
    server accepted nothing since the last lesson (a probe refused in the same
    full window says nothing new).

    Evenly spaced, a weighted counter (or a fixed window) refuses as its count
    is passed; an exact log of a count read too high from a burst (one that
    straddled the counter's reset, which lets at most twice the count through)
    cannot say by how much, but the refusal can: a sliding window holds the
    fixed one it ends at. A burst still in the window weighs on a weighted
    counter, so its refusal comes early."""
    if not log.accepted.arrivals:
        return None
    latest = _latest_refusal(log.sent)
    if latest is None:
        return None
    refusal, arrivals = latest
    binding = _binding(rule)
    seen = _within(arrivals, refusal, binding.seconds)
    spaced = refusal - binding.seconds > log.unspaced
    half = math.ceil(binding.count / 2)
    near = spaced and half <= seen < binding.count
    count = seen if near else binding.count - 1
    if count < 1:
        return None
    lower = Window(count, binding.seconds)
    windows = tuple(lower if w == binding else w for w in rule.windows)
    why = (
        f"429s still came when spaced evenly, after {seen} accepted within "
        f"{durations.compact(binding.seconds)}"
    )
    return Lesson(Rule(windows), why, spread=True)


def _looser(
    log: Sequence[Sent], rule: Rule, safe: Lesson, shorter: Sequence[float]
) -> Lesson | None:
    """The lesson of a window shorter than `safe`'s that explains `log` as well
    (a burst fits any window longer than it lasted), with `safe` to fall back to:
    the shorter reading is tried first, as the faster one, and a single request
    past `safe`'s count (`Fallback`) settles which is right."""
    learned = next(w for w in safe.rule.windows if w not in rule.windows)
    loose = infer(log, rule, [s for s in shorter if s < learned.seconds])
    if loose is None or loose.rule.interval >= safe.rule.interval:
        return None  # none, or no faster (a window of one, slow, that was heard)
    why = f"{loose.evidence}; {learned} if refused again"
    return Lesson(loose.rule, why, fallback=safe)


def _leaky(
    log: Sequence[Sent], rule: Rule, safe: Lesson, looser: Lesson | None
) -> Lesson | None:
    """`rule` read as a leaky bucket that drains at the rate of the rule's shortest
    window, with the `safe` window reading to fall back to; with no burst, the
    `looser` one (a shorter window) first, as the bucket, at the rule's rate, may
    well be too fast. A Retry-After longer than one such drain is the drain of
    a slower bucket (it has room again by then), which is read if it is faster
    than `safe` (a window server asks for about its window). None if `rule`
    already is such a reading (its refusal is `safe`), or if the bucket would
    hold the window's whole count anyway.

    Its first request past the burst settles it: a window server refuses that
    one, for one 429; a bucket lets it through, and then keeps letting through
    more than the window reading allows (`Fallback.ruled_out`), or stays in
    doubt, kept with the window reading behind it."""
    base = rule.shortest
    if rule.burst is not None or base.count > _LEAK_MOST:
        return None
    step = base.seconds / base.count
    windows = rule.windows
    drain = max((s.wait for s in log if s.refused and s.wait is not None), default=0)
    if drain > step + 1.0:  # servers round Retry-After up to whole seconds
        if drain >= safe.rule.interval:
            return None
        base = Window(math.floor(base.seconds / drain), base.seconds)
        step = base.seconds / base.count
        kept = [w for w in rule.windows if not _implies(base, w)]
        windows = tuple(sorted([base, *kept], key=lambda w: (w.seconds, w.count)))
    burst = _burst(log, step, 2 * base.count)
    if burst + 1 >= base.count:
        return None
    # Behind a burst, a shorter window is tried too if the window reading would
    # be `_WORTH` times slower or more (10/10s read as 10/1m): it costs a 429 if
    # wrong, as the bucket's own reading does.
    worth = looser is not None and (
        burst == 0 or _WORTH * looser.rule.interval <= safe.rule.interval
    )
    after = looser if looser is not None and worth else safe
    then = "" if after is safe else f", then {safe.rule},"
    why = (
        f"{safe.evidence}: read as a leaky bucket that lets {burst + 1} through "
        f"at once, then drains at {base}; {after.rule}{then} if refused again"
    )
    return Lesson(Rule(windows, burst), why, fallback=after)


def _burst(log: Sequence[Sent], step: float, latest: int) -> int:
    """The burst a leaky bucket that drains one request per `step` surely allows,
    having let through the `latest` accepted requests of `log`: the most accepted
    within any stretch, less what drained over it, less one (a fresh bucket takes
    the first request whole). Stretches are taken at their longest (first start
    to last answer, and a millisecond for a server's clock): the bucket then
    drained the most."""
    accepted = sorted((s for s in log if s.refused is False), key=lambda s: s.start)
    accepted = accepted[-latest:]
    level = 1.0
    for first, entry in enumerate(accepted):
        ends = sorted(s.end for s in accepted[first:] if s.end is not None)
        for count, end in enumerate(ends, start=1):
            level = max(level, count - (end - entry.start + 0.001) / step)
    return max(0, math.ceil(level - 1 - 1e-9))


def _stated_lesson(lesson: Lesson, rule: Rule) -> Lesson:
    """`lesson` learned from a server's "none remaining", said so."""
    learned = next(w for w in lesson.rule.windows if w not in rule.windows)
    seconds = durations.compact(learned.seconds)
    why = f"the server said none remained after {learned.count} within {seconds}"
    return Lesson(lesson.rule, why)


def _refused_amid_acceptances(log: Sequence[Sent], rule: Rule) -> bool:
    """Whether some refusal came with accepted requests within the rule's window
    (whatever its Retry-After: a server that counts another way computes it
    another way too)."""
    answered = _answered(log)
    most, _ = _bounds(answered, rule.longest, fit=Fit.NONE)
    return most > 0


@dataclass(frozen=True, slots=True)
class Fallback:
    """A key paced by a rule that may be too loose, with the safer reading the server
    may enforce instead (`--profile auto`: statement A, with B to fall back to; a
    leaky bucket's burst, or a short window, with the rule's own window behind it).

    The key proves its way past the safer rule one request at a time
    (`KeyLog.careful`), so finding out costs at most one 429 per window: a
    refusal takes the safer reading whole (`taken`), and its own fallback, if it
    has one, stands next; acceptances past what one of its windows allows in any
    counting rule it out (`ruled_out`). Either answer is a lesson, kept like any;
    until then, the ledger keeps the safer reading.
    """

    reading: Lesson
    # A statement of the limit (`--profile auto`'s B), not a reading of the log.
    stated: bool = False

    @property
    def rule(self) -> Rule:
        """The safer rule."""
        return self.reading.rule

    def taken(self, lesson: Lesson, given: Rule) -> Lesson:
        """`lesson`, learned while this fallback stood, joined with it (no longer
        read as a leaky bucket: its burst was refused), and with the safer
        reading's own fallback, if `lesson` has none."""
        joined = adopt(Rule(lesson.rule.windows), self.rule.windows, "")
        rule = Rule(lesson.rule.windows) if joined is None else joined.rule
        why = f"{lesson.evidence}; so the server enforces {rule}, not {given}"
        after = lesson.fallback or self.reading.fallback
        if after is not None and adopt(rule, after.rule.windows, "") is None:
            after = None  # the joined rule already holds to it: nothing in doubt
        return Lesson(rule, why, lesson.spread, fallback=after)

    def kept(self, lesson: Lesson) -> Lesson:
        """`lesson` as the ledger keeps it while this fallback stands: joined with
        it, so that later runs start from the safer reading."""
        joined = adopt(lesson.rule, self.rule.windows, "") or lesson
        return Lesson(joined.rule, lesson.evidence, lesson.spread)

    def ruled_out(self, learner: Learner, key: str, given: Rule) -> Lesson | None:
        """A lesson that `given` holds if the server let through more than one of
        this fallback's own windows (COUNT/W) allows in any counting: more than
        (n + 1) x COUNT within n x W, for some n up to `_SPANS` (fixed windows let
        up to that many through, a sliding log n x COUNT); None while it has not."""
        for window in self.rule.windows:
            if window in given.windows:
                continue  # held by both readings: it settles nothing
            for spans in range(1, _SPANS + 1):
                span = window.seconds * spans
                seen = learner.accepted_within(key, span)
                if seen > (spans + 1) * window.count:
                    why = (
                        f"{seen} accepted within {durations.compact(span)}, more "
                        f"than {self.rule} allows: the server enforces {given}"
                    )
                    return Lesson(given, why)
        return None
