"""A run in plain timestamped lines, for a log file or cron mail: start, progress,
failures, what a quiet run waits for, and the summary. No escape codes; each line
names its time, process and jobs file (`log_tag`), so two runs in one log tell
apart.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import textwrap
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from batchrun.cli.board import (
    Board,
    KeyCounts,
    capped_text,
    closing_lines,
    ended_text,
    failure_text,
    learned_text,
    next_slot,
    overall,
    summary_rows,
    tally,
)
from batchrun.cli.news import spoken
from batchrun.core import durations
from batchrun.core.clock import Clock
from batchrun.core.events import (
    Event,
    InFlightCapped,
    JobFinished,
    JobRequeued,
    RuleLearned,
    RunFinished,
    RunStarted,
    Status,
)
from batchrun.run.view import QUIET

if TYPE_CHECKING:
    from batchrun.run.news import News

# Enough to see a pattern in a cron mail; the results file holds every failure.
_FAILURES_LISTED = 20
_STAMP = "%Y-%m-%d %H:%M:%S"


# A number and its unit (`1 ms`, `5 m 0 s`) stay on one line when a line wraps.
_UNITED = re.compile(r"(?<=\d) (?=(?:ms|s|m|h|d)\b)")
_GLUE = "\u00a0"


def fitted(text: str, width: int) -> str:
    """`text` wrapped at words to `width` columns, each continuation indented two
    more than its line, a number kept with its unit: a terminal would cut a long
    line wherever its edge falls, mid-word."""
    out: list[str] = []
    for line in text.splitlines():
        indent = " " * (len(line) - len(line.lstrip(" ")))
        wrapped = textwrap.wrap(
            _UNITED.sub(_GLUE, line),
            width=max(width, 20),
            subsequent_indent=indent + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        out.extend(part.replace(_GLUE, " ") for part in wrapped or [line])
    return "\n".join(out)


def log_tag(jobs_file: Path) -> str:
    """What each line of a log names: the process and the jobs file, so that the
    lines of two runs (or a refused run's error) appended to one log tell apart."""
    return f"batchrun[{os.getpid()}] {jobs_file.name}: "


def stamped(text: str, *, tag: str, wall: Callable[[], datetime]) -> str:
    """`text`, each of its lines prefixed with the local time and `tag`."""
    stamp = wall().strftime(_STAMP)
    return "\n".join(f"{stamp} {tag}{line}" for line in text.splitlines())


class PlainLog:
    """Timestamped lines, no escape codes: start, progress, failures, summary."""

    def __init__(
        self,
        stream: TextIO,
        *,
        clock: Clock,
        every: float,
        wall: Callable[[], datetime],
        notes: Callable[[News], None] | None,
        tag: str,
        verbosity: int = 0,
        results: Path | None = None,
        earlier: Mapping[Status, int] | None = None,
        board: Board,
    ) -> None:
        self._stream = stream
        self._results = results
        self._earlier = earlier
        self._verbosity = verbosity
        self._notes = notes
        self._tag = tag
        self._clock = clock
        self._said = clock.now()
        self._every = every
        self._wall = wall
        self._board = board
        self._last = -math.inf
        self._requeues = 0
        self._capped_said = False
        self._closed = False

    def emit(self, event: Event) -> None:
        state = self._board.apply(event)
        if isinstance(event, RunStarted):
            self._last = event.at
            self._chatter(self._start_text(event.at))
        elif isinstance(event, InFlightCapped) and event.lasted is None:
            if not self._capped_said:  # once: the summary says how long
                self._capped_said = True
                self._chatter(capped_text(event))
        elif state is not None and not isinstance(event, RunFinished):
            if isinstance(event, JobFinished):
                self._finished(event, state)
            elif isinstance(event, JobRequeued):
                self._requeued(event)
            elif isinstance(event, RuleLearned):
                self._chatter(learned_text(event))
            if event.at - self._last >= self._every:
                self._progress(event.at)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._board.started is not None:
            self._summary()

    def note(self, news: News) -> None:
        if self._notes is None:
            self._line(spoken(news))
        else:
            self._notes(news)

    def tick(self) -> None:
        now = self._clock.now()
        board = self._board
        if self._closed or board.started is None or now - self._said < QUIET:
            return
        waits = "; ".join(
            f"{key} next slot {self._slot_text(s, now)}"
            for key, s in board.keys.items()
            if s.counts.left > 0
        )
        counts = tally(overall(board.keys.values()))
        eta_text = durations.spoken(board.eta(now))
        self._chatter(f"waiting: {waits} — {counts}; ETA {eta_text}")

    def _slot_text(self, state: KeyCounts, now: float) -> str:
        if state.slot is None or state.slot <= now:
            return next_slot(state, now)
        at = self._wall() + timedelta(seconds=state.slot - now)
        return f"in {durations.spoken(state.slot - now)} (at {at:%H:%M:%S})"

    def _start_text(self, at: float) -> str:
        board = self._board
        keys = ", ".join(
            f"{k} {s.counts.total:,} at {s.rule}" for k, s in board.keys.items()
        )
        total = overall(board.keys.values()).total
        eta_text = durations.spoken(board.eta(at))
        return f"starting: {total:,} jobs — {keys}; pace {board.pace}; ETA {eta_text}"

    def _finished(self, event: JobFinished, state: KeyCounts) -> None:
        if event.status is not Status.DONE:
            self._failure(event)
        counts = state.counts
        if counts.left == 0:
            self._chatter(
                f"{event.key}: all {counts.total:,} jobs ended ({ended_text(counts)})"
            )

    def _requeued(self, event: JobRequeued) -> None:
        self._requeues += 1
        listed = math.inf if self._verbosity > 0 else _FAILURES_LISTED
        if self._requeues > listed:
            return
        why = event.reason
        if event.rate_limited:
            extra = why.removeprefix("HTTP 429").lstrip("; ")
            why = "429 (rate limited)" + (f"; {extra}" if extra else "")
        self._chatter(
            f"job {event.job_id} ({event.key}): {why}; requeued, next try in "
            f"{durations.spoken(event.delay)}"
        )
        if self._requeues == listed:
            self._chatter("further requeues are only counted (--verbose lists all)")

    def _failure(self, event: JobFinished) -> None:
        count = self._board.failures
        if count <= _FAILURES_LISTED:
            self._line(failure_text(event))
        elif count == _FAILURES_LISTED + 1:
            self._line(
                f"more than {_FAILURES_LISTED} failures: further ones are only "
                "counted here (the results file lists every one)"
            )

    def _progress(self, at: float) -> None:
        self._last = at
        board = self._board
        keys = "; ".join(f"{k} {tally(s.counts)}" for k, s in board.keys.items())
        eta_text = durations.spoken(board.eta(at))
        counts = tally(overall(board.keys.values()))
        self._chatter(f"progress: {counts} — {keys}; ETA {eta_text}")

    def _summary(self) -> None:
        rows = summary_rows(self._board)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        self._line("summary:")
        for row in rows:
            cells = (
                cell.ljust(width) if i == 0 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            )
            self._line("  " + "  ".join(cells))
        now = self._clock.now()
        for text in closing_lines(self._board, now, self._results, self._earlier):
            self._line(text)

    def _chatter(self, text: str) -> None:
        """A line about how the run goes, which --quiet leaves out."""
        if self._verbosity >= 0:
            self._line(text)

    def _line(self, text: str) -> None:
        self._said = self._clock.now()
        # A closed pipe (`| head`) must not stop the run this log reports on.
        with contextlib.suppress(OSError, ValueError):
            line = stamped(text, tag=self._tag, wall=self._wall)
            if self._stream.isatty():
                line = fitted(line, shutil.get_terminal_size().columns)
            self._stream.write(line + "\n")
            self._stream.flush()
