"""What a run looks like as numbers: counts per key, ETAs and summary rows.

`Board` is built from the runner's events and read by both views (`progress` and
`plain_log`), and by the metrics file, which shows the view's own (`BoardView`);
it knows no terminal. Its jobs per key are the run's tally (`events.RunTally`,
which the runner counts); beside them it keeps what only a view needs: each
key's rule, recent sends, requests in flight and next slot. ETAs come from the
limits (`slots.eta` over the jobs not yet sent and each key's recent sends),
never from the past rate.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from batchrun.cli.news import evidence_text
from batchrun.core import durations
from batchrun.core.clock import Clock
from batchrun.core.events import (
    Event,
    Evidence,
    InFlightCapped,
    JobAnswered,
    JobFinished,
    JobRequeued,
    JobSent,
    RuleLearned,
    RunFinished,
    RunStarted,
    RunTally,
    SlotWait,
    Status,
    Tally,
)
from batchrun.core.limits import LimitKey, Pace, Rule
from batchrun.core.responses import Responses
from batchrun.pacing.slots import eta
from batchrun.run.settings import IN_FLIGHT_CEILING
from batchrun.run.view import ProgressSink, View

if TYPE_CHECKING:
    from batchrun.run.news import News

_FAILURES_RECENT = 3
NONE = "—"
_COLUMNS = ("endpoint", "done", "failed", "left", "429s", "retries")
# The summary says concurrency set the pace when it did for this share of the
# run or more: a run with no --concurrency meets its cap briefly while the
# first answers are timed (the cap follows them), which is no news.
_CAPPED_SHARE = 0.05


@dataclass(slots=True, kw_only=True)
class KeyCounts:
    """A key as a view shows it: its jobs (`counts`, the run's tally of the key),
    and its rule, sends and slot."""

    counts: Tally
    rule: Rule
    sends: deque[float]
    in_flight: int = 0
    # From the last SlotWait: None waits for an answer; -inf once a request left.
    slot: float | None = -math.inf
    # Set once the server showed a stricter limit than the rule (RuleLearned).
    learned: Evidence | None = None
    spread: bool = False

    @property
    def unsent(self) -> int:
        return max(0, self.counts.left - self.in_flight)


def overall(states: Iterable[KeyCounts]) -> Tally:
    """The jobs of every key shown, added up."""
    total = Tally()
    for state in states:
        total.add(state.counts)
    return total


class Board:
    """Counts per key, kept from the events; each sink shows one. The answers by
    code and the jobs per key are counted here unless `responses` and `tally`
    are given: the run's, which the run counts."""

    def __init__(
        self, responses: Responses | None = None, tally: RunTally | None = None
    ) -> None:
        self.keys: dict[LimitKey, KeyCounts] = {}
        self.pace = Pace.EXACT
        self.started: float | None = None
        self.finished: RunFinished | None = None
        self.failures = 0
        self.recent: deque[str] = deque(maxlen=_FAILURES_RECENT)
        self.responses = Responses() if responses is None else responses
        self._counts_answers = responses is None
        self.tally = RunTally() if tally is None else tally
        self._counts_jobs = tally is None
        # The cap on requests in flight holding requests back: the episode under
        # way (None: none), and how long it did so in all.
        self.capped: InFlightCapped | None = None
        self.capped_for = 0.0
        self.cap: InFlightCapped | None = None

    def apply(self, event: Event) -> KeyCounts | None:
        """Count `event`; return the state of its key, if the run has jobs of it."""
        if self._counts_jobs:
            self.tally.emit(event)
        if isinstance(event, RunStarted):
            self._start(event)
            return None
        if isinstance(event, RunFinished):
            self.finished = event
            return None
        if isinstance(event, InFlightCapped):
            self.cap = event
            if event.lasted is None:
                self.capped = event
            else:
                self.capped, self.capped_for = None, self.capped_for + event.lasted
            return None
        if isinstance(event, JobAnswered):
            # Only counted: the JobRequeued or JobFinished that follows moves the key.
            if self._counts_answers:
                self.responses.add(event.key, event.status, event.latency)
            return None
        state = self.keys.get(event.key)
        if state is not None:
            _count(state, event)
            if isinstance(event, JobFinished) and event.status is not Status.DONE:
                self.failures += 1
                self.recent.append(failure_text(event))
        return state

    def _start(self, event: RunStarted) -> None:
        self.started = event.at
        self.pace = event.pace
        self.keys = {
            key: KeyCounts(
                counts=self.tally.of(key),
                rule=rule,
                sends=deque(event.used.get(key, ()), maxlen=rule.deepest),
            )
            for key, total in event.totals.items()
            if total > 0 and (rule := event.rules.get(key)) is not None
        }

    def etas(self, now: float) -> dict[LimitKey, float]:
        """Seconds from `now` until each key's last unsent job may leave."""
        return {key: _eta(s, self.pace, now) for key, s in list(self.keys.items())}

    def eta(self, now: float) -> float:
        """Seconds from `now` until the run's last job may leave."""
        return max(self.etas(now).values(), default=0.0)

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        end = self.finished.at if self.finished is not None else now
        return end - self.started


class BoardView(View, Protocol):
    """A `View` that keeps its counts on `board` when given one: a board another
    listener of the run reads too (the metrics file), so that the run is counted
    once."""

    def __call__(
        self,
        *,
        clock: Clock,
        notes: Callable[[News], None],
        earlier: Mapping[Status, int] | None = None,
        responses: Responses | None = None,
        tally: RunTally | None = None,
        board: Board | None = None,
    ) -> ProgressSink: ...


def _count(
    state: KeyCounts,
    event: JobSent | JobRequeued | JobFinished | SlotWait | RuleLearned,
) -> None:
    match event:
        case JobSent():
            state.in_flight += 1
            state.sends.append(event.at)
            state.slot = -math.inf
        case JobRequeued():
            state.in_flight = max(0, state.in_flight - 1)
            if event.rate_limited:
                # The key cools down for the delay: no slot opens before then.
                state.slot = max(state.slot or -math.inf, event.at + event.delay)
        case JobFinished():
            state.in_flight = max(0, state.in_flight - 1)
        case SlotWait():
            state.slot = event.until
        case RuleLearned():
            state.rule = event.rule
            state.learned = event.evidence
            state.spread = event.spread


def _eta(state: KeyCounts, pace: Pace, now: float) -> float:
    count = state.unsent
    if count == 0:
        return 0.0
    pace = Pace.SPREAD if state.spread else pace
    # The next slot the pacer named (another process's use, a cool-down, a
    # Retry-After) comes first: the ETA is never sooner than the "next slot".
    start = now if state.slot is None else max(now, state.slot)
    moment = eta(count, state.rule, now=start, pace=pace, recent=state.sends)
    return max(0.0, moment - now)


def learned_text(event: RuleLearned) -> str:
    """A line saying what the server showed about a key's limit, and what now."""
    pace = ", spaced evenly" if event.spread else ""
    evidence = evidence_text(event.evidence)
    if event.kept:
        return f"{event.key}: {event.rule}{pace}, {evidence}"
    return (
        f"{event.key}: the server allows less than the rule; now {event.rule}{pace} "
        f"({evidence})"
    )


def rule_text(state: KeyCounts) -> str:
    """A key's rule as the live view's column shows it: `*` when learned from the
    server (said under the table by `learned_note`), so the column never wraps."""
    return f"{state.rule}{'*' if state.learned is not None else ''}"


def learned_note(keys: Iterable[KeyCounts]) -> str | None:
    """What the live view's `*` means, if a rule shows one."""
    learned = [s for s in keys if s.learned is not None]
    if not learned:
        return None
    spread = ", sent evenly spaced" if any(s.spread for s in learned) else ""
    return f"* learned from the server's answers{spread}"


def failure_text(event: JobFinished) -> str:
    status = f"HTTP {event.http_status}" if event.http_status else "unknown error"
    reason = event.error or status
    attempts = "attempt" if event.attempts == 1 else "attempts"
    if event.status is Status.UNKNOWN:
        return (
            f"job {event.job_id} ({event.key}) unknown after {event.attempts} "
            f"{attempts}: {reason}; it may have been processed, so it is not "
            "resent (check, then --retry-unknown)"
        )
    return (
        f"job {event.job_id} ({event.key}) failed after {event.attempts} "
        f"{attempts}: {reason}"
    )


def next_slot(state: KeyCounts, now: float) -> str:
    if state.counts.left <= 0:
        return NONE
    if state.slot is None:
        return "on answer"
    if state.slot <= now:
        return "now"
    return durations.spoken(state.slot - now)


def ended_text(counts: Tally) -> str:
    """How a key's ended jobs came out: done, failed, and unknown if any."""
    unknown = f", {counts.unknown:,} unknown" if counts.unknown else ""
    return f"{counts.done:,} done, {counts.failed:,} failed{unknown}"


def tally(counts: Tally) -> str:
    return (
        f"{counts.done:,}/{counts.total:,} done, {counts.failed:,} failed, "
        f"{counts.rate_limited:,} 429s, {counts.retried:,} retries"
    )


def summary_rows(board: Board) -> list[tuple[str, ...]]:
    """The summary table, header first; an `unknown` column only when a job is."""
    keys = [(str(key), state.counts) for key, state in board.keys.items()]
    named = [*keys, ("total", overall(board.keys.values()))]
    unknown = named[-1][1].unknown > 0
    header = _COLUMNS[:3] + ("unknown",) * unknown + _COLUMNS[3:]
    rows = [header]
    for name, c in named:
        counts = (c.done, c.failed, *(c.unknown,) * unknown, c.left)
        numbers = (*counts, c.rate_limited, c.retried)
        rows.append((name, *(f"{n:,}" for n in numbers)))
    return rows


def closing_lines(
    board: Board,
    now: float,
    results: Path | None = None,
    earlier: Mapping[Status, int] | None = None,
) -> list[str]:
    """The summary's last lines: answers by code, the counts (the whole file's
    after a resume, this run's beside them), the results file."""
    c = overall(board.keys.values())
    elapsed = durations.spoken(board.elapsed(now))
    # Whether it stopped early, and how to resume, is said once, with the exit code
    # (submission.py): not here as well.
    counts = f"{_counts_text(c, earlier or {})}{c.left:,} left in {elapsed}."
    where = [] if results is None else [f"Results: {results}"]
    capped = capped_summary(board, now)
    return [*response_lines(board.responses), counts, *capped, *where]


def _counts_text(c: Tally, earlier: Mapping[Status, int]) -> str:
    """`90 of 90 done (20 in this run), 0 failed, ` after a resume; this run's
    counts alone when nothing ended before it."""
    done, failed, unknown = (
        earlier.get(state, 0) + here
        for state, here in (
            (Status.DONE, c.done),
            (Status.FAILED, c.failed),
            (Status.UNKNOWN, c.unknown),
        )
    )
    unknown_text = f"{unknown:,} unknown, " if unknown else ""
    if not any(earlier.values()):
        return f"{done:,} done, {failed:,} failed, {unknown_text}"
    whole = c.total + sum(earlier.values())
    return (
        f"{done:,} of {whole:,} done ({c.done:,} in this run), {failed:,} failed, "
        f"{unknown_text}"
    )


def capped_text(event: InFlightCapped) -> str:
    """The live view's line while the cap on requests in flight sets the pace."""
    return f"Concurrency sets the pace, not the limit: {_cap_why(event)}."


def capped_summary(board: Board, now: float) -> list[str]:
    """The summary's line when the cap on requests in flight set the pace for
    `_CAPPED_SHARE` of the run or more."""
    if board.cap is None:
        return []
    capped = board.capped_for
    if board.capped is not None:
        capped += now - board.capped.at
    elapsed = board.elapsed(now)
    if capped <= 0 or capped < _CAPPED_SHARE * elapsed:
        return []
    spent = f"{durations.spoken(capped)} of {durations.spoken(elapsed)}"
    why = _cap_why(board.cap)
    return [f"Concurrency, not the limit, set the pace for {spent}: {why}."]


def _cap_why(event: InFlightCapped) -> str:
    """How many were in flight, and who set that cap."""
    if event.given:
        return f"{event.cap} in flight at most (--concurrency {event.cap})"
    if event.cap >= IN_FLIGHT_CEILING:
        return (
            f"{event.cap} in flight, the most without --concurrency "
            "(a larger --concurrency sends more at once)"
        )
    return f"{event.cap} in flight, as the answer times seen needed"


def response_lines(responses: Responses) -> list[str]:
    """Per endpoint, the answers by status code and their latencies (vegeta's and
    k6's summaries): `run-query responses: 200: 1180, 429: 3; p50 120 ms, …`."""
    lines = []
    for key, found in responses.keys.items():
        latency = found.latency_text()
        timed = f"; {latency}" if latency else ""
        lines.append(f"{key} responses: {found.codes_text()}{timed}")
    return lines
