"""What a person sees of a run: a Rich live view on a terminal, plain lines elsewhere.

Both sinks keep a `board.Board` of counts built from the runner's events, and both
end with the same summary on `close()`. Plain lines carry no escape codes. This is
the only module that imports Rich.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from batchrun.cli.board import (
    NONE,
    Board,
    KeyCounts,
    closing_lines,
    ended_text,
    failure_text,
    learned_text,
    next_slot,
    overall,
    rule_text,
    summary_rows,
    tally,
)
from batchrun.core import durations
from batchrun.core.clock import Clock
from batchrun.core.events import (
    Event,
    JobFinished,
    JobRequeued,
    RuleLearned,
    RunFinished,
    RunStarted,
    Status,
)
from batchrun.core.limits import LimitKey
from batchrun.run.view import QUIET, ProgressSink, View

# Enough to see a pattern in a cron mail; the results file holds every failure.
_FAILURES_LISTED = 20
_STAMP = "%Y-%m-%d %H:%M:%S"
_VIEW_COLUMNS = "endpoint,rule,done,failed,429s,retries,sending,next slot,ETA"
# Terminals that cannot move the cursor: a live view would be a blank screen there.
_DUMB_TERMINALS = ("dumb", "unknown")


def log_tag(jobs_file: Path) -> str:
    """What each line of a log names: the process and the jobs file, so that the
    lines of two runs (or a refused run's error) appended to one log tell apart."""
    return f"batchrun[{os.getpid()}] {jobs_file.name}: "


def stamped(text: str, *, tag: str, wall: Callable[[], datetime]) -> str:
    """`text`, each of its lines prefixed with the local time and `tag`."""
    stamp = wall().strftime(_STAMP)
    return "\n".join(f"{stamp} {tag}{line}" for line in text.splitlines())


def open_progress(
    stream: TextIO,
    *,
    live: bool | None = None,
    clock: Clock,
    every: float = 10.0,
    wall: Callable[[], datetime] = datetime.now,
    notes: Callable[[str], None] | None = None,
    color: bool = True,
    tag: str = "",
    verbosity: int = 0,
) -> ProgressSink:
    """A Rich live view if `stream` is a terminal, plain timestamped lines otherwise.

    `live` forces either; a terminal with TERM=dumb gets plain lines. The live view
    reads `clock` from its refresh thread, so it must be readable from any thread
    (MachineClock is); it has no colour with `color=False` or NO_COLOR set. Plain
    lines: at most one progress line per `every` seconds of event time, stamped with
    `wall()` and `tag` (`log_tag`). `note()` goes to `notes` (default: the stream)
    unless a live view is drawing, which prints it above itself. `verbosity` -1
    (--quiet): plain lines, and only failures and the summary; 1 (--verbose): every
    requeue, not only the first ones.
    """
    if every < 0:
        msg = f"every must be at least 0 s, got {every}"
        raise ValueError(msg)
    if live is None:
        live = stream.isatty() and os.environ.get("TERM") not in _DUMB_TERMINALS
    if live and verbosity >= 0:
        console = Console(file=stream, force_terminal=True, no_color=_no_color(color))
        return _LiveView(console, clock=clock, notes=notes)
    return _PlainLog(
        stream,
        clock=clock,
        every=every,
        wall=wall,
        notes=notes,
        tag=tag,
        verbosity=verbosity,
    )


def view(jobs_file: Path, *, color: bool, verbosity: int) -> View:
    """How `submit` shows its run: `open_progress` on stdout, its plain lines
    tagged with the process and `jobs_file`."""

    def opened(*, clock: Clock, notes: Callable[[str], None]) -> ProgressSink:
        return open_progress(
            sys.stdout,
            clock=clock,
            notes=notes,
            color=color,
            tag=log_tag(jobs_file),
            verbosity=verbosity,
        )

    return opened


def _no_color(color: bool) -> bool:
    # https://no-color.org: set and not empty.
    return not color or bool(os.environ.get("NO_COLOR"))


class _PlainLog:
    """Timestamped lines, no escape codes: start, progress, failures, summary."""

    def __init__(
        self,
        stream: TextIO,
        *,
        clock: Clock,
        every: float,
        wall: Callable[[], datetime],
        notes: Callable[[str], None] | None,
        tag: str,
        verbosity: int = 0,
    ) -> None:
        self._stream = stream
        self._verbosity = verbosity
        self._notes = notes or self._line
        self._tag = tag
        self._clock = clock
        self._said = clock.now()
        self._every = every
        self._wall = wall
        self._board = Board()
        self._last = -math.inf
        self._requeues = 0
        self._closed = False

    def emit(self, event: Event) -> None:
        state = self._board.apply(event)
        if isinstance(event, RunStarted):
            self._last = event.at
            self._chatter(self._start_text(event.at))
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

    def note(self, text: str) -> None:
        self._notes(text)

    def tick(self) -> None:
        now = self._clock.now()
        board = self._board
        if self._closed or board.started is None or now - self._said < QUIET:
            return
        waits = "; ".join(
            f"{key} next slot {self._slot_text(s, now)}"
            for key, s in board.keys.items()
            if s.left > 0
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
        keys = ", ".join(f"{k} {s.total} at {s.rule}" for k, s in board.keys.items())
        total = overall(board.keys.values()).total
        eta_text = durations.spoken(board.eta(at))
        return f"starting: {total} jobs — {keys}; pace {board.pace}; ETA {eta_text}"

    def _finished(self, event: JobFinished, state: KeyCounts) -> None:
        if event.status is not Status.DONE:
            self._failure(event)
        if state.left == 0:
            self._chatter(
                f"{event.key}: all {state.total} jobs ended ({ended_text(state)})"
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
        keys = "; ".join(f"{k} {tally(s)}" for k, s in board.keys.items())
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
        for text in closing_lines(self._board, self._clock.now()):
            self._line(text)

    def _chatter(self, text: str) -> None:
        """A line about how the run goes, which --quiet leaves out."""
        if self._verbosity >= 0:
            self._line(text)

    def _line(self, text: str) -> None:
        self._said = self._clock.now()
        # A closed pipe (`| head`) must not stop the run this log reports on.
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(stamped(text, tag=self._tag, wall=self._wall) + "\n")
            self._stream.flush()


class _LiveView:
    """A Rich live view: an overall bar, a row per endpoint, the latest failures."""

    def __init__(
        self, console: Console, *, clock: Clock, notes: Callable[[str], None] | None
    ) -> None:
        self._console = console
        self._notes = notes
        self._clock = clock
        self._board = Board()
        self._lock = threading.Lock()
        self._live = Live(
            console=console,
            get_renderable=self._render,
            refresh_per_second=4,
            transient=False,
        )
        self._closed = False

    def emit(self, event: Event) -> None:
        with self._lock:
            self._board.apply(event)
        if isinstance(event, RunStarted) and not (
            self._closed or self._live.is_started
        ):
            self._live.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._live.is_started:
            self._live.stop()
        if self._board.started is not None:
            self._summary()

    def tick(self) -> None:
        """The live view redraws itself: its next slot and ETA are always there."""

    def note(self, text: str) -> None:
        # While the view draws, only its console may print, above the view:
        # anything else is erased by the next redraw.
        if self._live.is_started or self._notes is None:
            self._console.print(Text(text))
        else:
            self._notes(text)

    def _render(self) -> RenderableType:
        # Runs on Rich's refresh thread: the board is only read under the lock
        # that `emit` changes it under.
        with self._lock:
            return self._render_board()

    def _render_board(self) -> RenderableType:
        now = self._clock.now()
        etas = self._board.etas(now)
        parts: list[RenderableType] = [self._bar(now, etas), self._table(now, etas)]
        recent = tuple(self._board.recent)
        if recent:
            parts.append(Text("Latest failures:", style="bold red"))
            parts.extend(Text(f"  {line}", style="red") for line in recent)
        return Group(*parts)

    def _bar(self, now: float, etas: dict[LimitKey, float]) -> Table:
        c = overall(list(self._board.keys.values()))
        grid = Table.grid(padding=(0, 1))
        grid.add_row(
            ProgressBar(total=max(c.total, 1), completed=c.ended, width=30),
            f"{c.ended}/{c.total}",
            f"elapsed {durations.spoken(self._board.elapsed(now))}",
            f"ETA {durations.spoken(max(etas.values(), default=0.0))}",
        )
        return grid

    def _table(self, now: float, etas: dict[LimitKey, float]) -> Table:
        # One space between columns, and only the rule may wrap: 80 columns hold
        # every row, "run-query  15/1m+500/1h  2000/2000 …" included.
        table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0))
        for i, name in enumerate(_VIEW_COLUMNS.split(",")):
            table.add_column(name, justify="left" if i < 2 else "right", no_wrap=i != 1)
        for key, s in list(self._board.keys.items()):
            key_eta = durations.spoken(etas.get(key, 0.0)) if s.left > 0 else NONE
            numbers = (s.failed, s.rate_limited, s.retried, s.in_flight)
            table.add_row(
                Text(key),
                Text(rule_text(s)),
                f"{s.done}/{s.total}",
                *(str(n) for n in numbers),
                next_slot(s, now),
                key_eta,
            )
        return table

    def _summary(self) -> None:
        table = Table(title="Summary", box=None, header_style="bold")
        header, *rows = summary_rows(self._board)
        for name in header:
            table.add_column(name, justify="left" if name == "endpoint" else "right")
        for row in rows:
            table.add_row(*row)
        self._console.print(table)
        for line in closing_lines(self._board, self._clock.now()):
            self._console.print(Text(line))
