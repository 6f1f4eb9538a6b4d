"""A lesson (a tighter rule and why), the window lengths a refusal may be read
in, and joining windows into a rule that holds to both (`adopt`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from batchrun.core import durations
from batchrun.core.limits import Rule, Window

# The window lengths, in seconds, that the API description uses or that common
# servers count in.
_CANDIDATES = (1.0, 10.0, 60.0, 300.0, 3600.0, 86400.0)


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
    # One refusal alone (`evidence`): paced by in this process only, never kept.
    trial: bool = False
    # What later runs may inherit (`evidence.confirmed`): a reading that the
    # server's word (a Retry-After, a stated limit) or a refusal just past it
    # confirmed. An unconfirmed one paces this process only.
    confirmed: bool = True
    # Confirmed strongly (`evidence.Confirmation.STRONG` or `SAID`): kept, it
    # is first re-tested after `retest.RETEST_WINDOWS` of the given rule's
    # longest window; on weaker grounds, by the very next run.
    strong: bool = True
    # Confirmed by the server's own word (`evidence.Confirmation.SAID`): not
    # re-tested in the run that learned it (`retest.run_wait`).
    said: bool = False


def candidates(rule: Rule, *, time_scale: float = 1.0) -> tuple[float, ...]:
    """The window lengths a refusal may be explained by, shortest first."""
    scaled = {seconds / time_scale for seconds in _CANDIDATES}
    return tuple(sorted(scaled | {w.seconds for w in rule.windows}))


def adopt(rule: Rule, policy: Iterable[Window], source: str) -> Lesson | None:
    """`rule` tightened by the windows a server states (`source` names where),
    or None if it already holds to all of them. Never a loosening: a stated window
    looser than the rule is simply already kept."""
    windows = list(rule.windows)
    for window in policy:
        if not any(implies(w, window) for w in windows):
            windows = [w for w in windows if not implies(window, w)] + [window]
    if len(windows) == len(rule.windows) and set(windows) == set(rule.windows):
        return None
    tighter = Rule(tuple(sorted(windows, key=lambda w: w.seconds)))
    stated = "+".join(str(w) for w in policy)
    return Lesson(tighter, f"the server states {stated} in its {source}", said=True)


def tightened(rule: Rule, window: Window, refusals: int) -> Lesson | None:
    """`rule` with `window` added, or None if `rule` already holds to it."""
    if any(implies(w, window) for w in rule.windows):
        return None
    windows = [w for w in rule.windows if not implies(window, w)]
    tighter = Rule(tuple(sorted([*windows, window], key=lambda w: w.seconds)))
    evidence = (
        f"{refusals} request(s) refused after {window.count} accepted within "
        f"{durations.compact(window.seconds)}"
    )
    return Lesson(tighter, evidence)


def implies(strict: Window, loose: Window) -> bool:
    """Whether holding to `strict` also holds to `loose` (fewer in a longer time)."""
    return strict.seconds >= loose.seconds and strict.count <= loose.count
