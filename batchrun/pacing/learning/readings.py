"""Window readings of a log: which COUNT/W explains every refusal and
contradicts no acceptance (`infer`), and what the refusals name."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from enum import Enum

from batchrun.core.limits import Rule, Window
from batchrun.pacing.learning.lessons import Lesson, tightened
from batchrun.pacing.learning.log import Sent, arrived, count_within, with_answers
from batchrun.pacing.slots import paced, spread_interval

# A window longer than the rule's shortest is learned as a quota only when it
# counts at least this many times the shortest window's count (`infer`).
_QUOTA = 3


class Fit(Enum):
    """How a refusal's Retry-After must fit a window for the window to explain it
    (`agrees`)."""

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
    answered = with_answers(log)
    latest = latest_refusal(answered)
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
        most, least = bounds(answered, seconds, fit=window_fit)
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
            lesson = tightened(rule, Window(least, seconds), refusals)
            if lesson is not None:
                return lesson
    return None


def bounds(log: Sequence[Sent], seconds: float, *, fit: Fit) -> tuple[int, int]:
    """Bounds on the count per `seconds` of a server that refused and accepted as
    in `log`: at most the fewest accepted requests that arrived within `seconds`
    up to a refusal; at least the most that arrived within `seconds` up to an
    acceptance (the server let them all through).

    A request is taken to arrive halfway through its round trip; requests that
    seem to arrive together all count, whatever order they really came in. A
    refusal whose Retry-After does not `fit` the window rules it out.
    """
    arrivals = sorted(arrived(s) for s in log if s.refused is False)
    most, least = len(arrivals), 1
    for entry in log:
        moment = arrived(entry)
        inside = bisect.bisect_right(arrivals, moment) - bisect.bisect_right(
            arrivals, moment - seconds
        )
        if entry.refused:
            fits = agrees(entry, arrivals, seconds, fit)
            most = min(most, inside if fits else 0)
        else:
            least = max(least, inside)
    return most, least


def agrees(refusal: Sent, arrivals: list[float], seconds: float, fit: Fit) -> bool:
    """Whether a refusal's Retry-After fits a window of `seconds`: then it names
    about when the oldest accepted arrival within it leaves the window (`fit`
    SLIDING), or no later (FIXED). Servers round it up to whole seconds, and the
    arrival is an estimate, hence the slack.
    """
    if refusal.wait is None or fit is Fit.NONE:
        return True
    moment = arrived(refusal)
    oldest = bisect.bisect_right(arrivals, moment - seconds)
    if oldest >= len(arrivals) or arrivals[oldest] > moment:
        return True  # nothing within the window: `inside` is 0 anyway
    predicted = arrivals[oldest] + seconds - moment
    early = math.inf if fit is Fit.FIXED else 0.1 * seconds + 0.05
    return -early <= refusal.wait - predicted <= 1.0 + 0.1 * seconds


def latest_refusal(log: Sequence[Sent]) -> tuple[float, list[float]] | None:
    """When the latest refusal in `log` arrived, and every accepted arrival
    (ascending); None if nothing was refused."""
    answered = with_answers(log)
    refusal = max((arrived(s) for s in answered if s.refused), default=None)
    if refusal is None:
        return None
    return refusal, sorted(arrived(s) for s in answered if s.refused is False)


def went_past(log: Sequence[Sent], rule: Rule) -> bool:
    """Whether the latest refusal in `log` came when as many accepted requests as
    some window of `rule` allows (or its burst, `burst_window`) were already
    within it."""
    latest = latest_refusal(log)
    if latest is None:
        return False
    refusal, arrivals = latest
    burst = burst_window(rule)
    windows = rule.windows if burst is None else (*rule.windows, burst)
    return any(count_within(arrivals, refusal, w.seconds) >= w.count for w in windows)


def burst_window(rule: Rule) -> Window | None:
    """A leaky bucket reading's burst as a window: B + 1 within one drain (the
    first of the windows it is paced by, `slots.paced`); None for a rule with
    no burst."""
    return None if rule.burst is None else paced(rule)[0]


def heard_windows(log: Sequence[Sent], rule: Rule) -> list[float]:
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
    arrivals = sorted(arrived(s) for s in log if s.refused is False)
    heard: set[float] = set()
    for entry in log:
        if not entry.refused or entry.wait is None:
            continue
        moment = arrived(entry)
        before = bisect.bisect_right(arrivals, moment)
        if before:
            span = entry.wait + moment - arrivals[before - 1]
            seconds = math.ceil(span * 1000 - 1e-6) / 1000
            alone = count_within(arrivals, moment, seconds) == 1
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


def refused_amid_acceptances(log: Sequence[Sent], rule: Rule) -> bool:
    """Whether some refusal came with accepted requests within the rule's window
    (whatever its Retry-After: a server that counts another way computes it
    another way too)."""
    answered = with_answers(log)
    most, _ = bounds(answered, rule.longest, fit=Fit.NONE)
    return most > 0
