"""Readings past a sliding window: a leaky bucket, an aligned counter, a
shorter window, a lowered count; each with a safer one to fall back to."""

from __future__ import annotations

import math
from collections.abc import Sequence

from batchrun.core import durations
from batchrun.core.limits import Rule, Window
from batchrun.pacing.learning import counters
from batchrun.pacing.learning.lessons import Lesson, implies
from batchrun.pacing.learning.log import (
    KeyLog,
    Sent,
    arrival_leeway,
    arrived,
    count_within,
    with_answers,
)
from batchrun.pacing.learning.readings import infer, latest_refusal

# A leaky bucket is read only for a shortest window of at most this count: its
# reading paces by one window per request of the burst's window.
LEAK_MOST = 100


def counted_lesson(counter: counters.Counter, rule: Rule) -> Lesson:
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


def aligned_counter(
    log: Sequence[Sent], rule: Rule, *, leeway: bool = True
) -> counters.Counter | None:
    """The aligned counter of the rule's shortest window, at its count or lower,
    that explains `log` (`counters.read`), each arrival anywhere between its
    send and its answer (`leeway`) or where `arrived` estimates it; None if
    none does. (A longer window is read only as a quota, `infer`: a log seldom
    covers it.)"""
    answered = with_answers(log)
    requests = [
        counters.Request(
            arrived(s), bool(s.refused), s.wait, arrival_leeway(s) if leeway else 0.0
        )
        for s in answered
    ]
    return counters.read(sorted(requests, key=lambda r: r.at), rule.shortest)


def _binding(rule: Rule) -> Window:
    """The window that sets the rule's long-run rate (`Rule.interval`)."""
    return max(rule.windows, key=lambda w: (w.seconds / w.count, -w.seconds))


def lowered(log: KeyLog, rule: Rule) -> Lesson | None:
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
    latest = latest_refusal(log.sent)
    if latest is None:
        return None
    refusal, arrivals = latest
    binding = _binding(rule)
    seen = count_within(arrivals, refusal, binding.seconds)
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


def looser_lesson(
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


def leaky_lesson(
    log: Sequence[Sent], rule: Rule, safe: Lesson, looser: Lesson | None
) -> Lesson | None:
    """`rule` read as a leaky bucket that drains at the rate of the rule's shortest
    window, with the `safe` window reading to fall back to, and the `looser` one
    (a shorter window, faster than `safe`) before it. A Retry-After longer than
    one such drain is the drain of a slower bucket (it has room again by then),
    which is read if it is faster than `safe` (a window server asks for about
    its window). None if `rule` already is such a reading (its refusal is
    `safe`), or if the bucket would hold the window's whole count anyway.

    Its first request past the burst settles it: a window server refuses that
    one, for one 429; a bucket lets it through, and then keeps letting through
    more than the window reading allows (`Fallback.ruled_out`), or stays in
    doubt, kept with the window reading behind it."""
    base = rule.shortest
    if rule.burst is not None or base.count > LEAK_MOST:
        return None
    windows = rule.windows
    drain = max((s.wait for s in log if s.refused and s.wait is not None), default=0)
    if drain > base.seconds / base.count + 1.0:  # Retry-After rounds up to seconds
        if drain >= safe.rule.interval:
            return None
        base, windows = _slower(rule, drain)
    step = base.seconds / base.count
    burst = _burst(log, step, 2 * base.count)
    if burst + 1 >= base.count:
        return None
    bucket = Rule(windows, burst)
    # Behind the bucket, the shorter window, faster than the safe reading:
    # each reading is tried fastest first, and a wrong one costs one 429 (a
    # bucket slower than the shorter window is not tried before it).
    if looser is not None and bucket.interval > looser.rule.interval:
        return None
    after = safe if looser is None else looser
    then = "" if after is safe else f", then {safe.rule},"
    why = (
        f"{safe.evidence}: read as a leaky bucket that lets {burst + 1} through "
        f"at once, then drains at {base}; {after.rule}{then} if refused again"
    )
    return Lesson(bucket, why, fallback=after)


def _slower(rule: Rule, drain: float) -> tuple[Window, tuple[Window, ...]]:
    """A bucket slower than `rule`'s shortest window, one request a `drain`, and
    the rule's windows with it (those it implies dropped)."""
    base = Window(math.floor(rule.shortest.seconds / drain), rule.shortest.seconds)
    kept = [w for w in rule.windows if not implies(base, w)]
    return base, tuple(sorted([base, *kept], key=lambda w: (w.seconds, w.count)))


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


def stated_lesson(lesson: Lesson, rule: Rule) -> Lesson:
    """`lesson` learned from a server's "none remaining", said so."""
    learned = next(w for w in lesson.rule.windows if w not in rule.windows)
    seconds = durations.compact(learned.seconds)
    why = f"the server said none remained after {learned.count} within {seconds}"
    return Lesson(lesson.rule, why, said=True)
