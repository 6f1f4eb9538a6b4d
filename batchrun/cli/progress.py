"""What a person sees of a run: a Rich live view on a terminal, plain lines
(`plain_log`) elsewhere.

Both sinks keep a `board.Board` of counts built from the runner's events, and both
end with the same summary on `close()`. This is the only module that imports Rich.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from batchrun.cli.board import (
    NONE,
    Board,
    BoardView,
    capped_text,
    closing_lines,
    learned_note,
    next_slot,
    overall,
    rule_text,
    summary_rows,
)
from batchrun.cli.news import spoken
from batchrun.cli.plain_log import PlainLog, fitted, log_tag
from batchrun.core import durations
from batchrun.core.clock import Clock
from batchrun.core.events import Event, RunStarted, RunTally, Status
from batchrun.core.limits import LimitKey
from batchrun.core.responses import Responses
from batchrun.run.view import ProgressSink

if TYPE_CHECKING:
    from batchrun.run.news import News

_VIEW_COLUMNS = "endpoint,rule,done,failed,429s,retries,sending,next slot,ETA"
# Terminals that cannot move the cursor: a live view would be a blank screen there.
_DUMB_TERMINALS = ("dumb", "unknown")


def open_progress(
    stream: TextIO,
    *,
    live: bool | None = None,
    clock: Clock,
    every: float = 10.0,
    wall: Callable[[], datetime] = datetime.now,
    notes: Callable[[News], None] | None = None,
    color: bool = True,
    tag: str = "",
    verbosity: int = 0,
    results: Path | None = None,
    earlier: Mapping[Status, int] | None = None,
    responses: Responses | None = None,
    tally: RunTally | None = None,
    board: Board | None = None,
) -> ProgressSink:
    """A Rich live view if `stream` is a terminal, plain timestamped lines otherwise.

    `live` forces either; a terminal with TERM=dumb gets plain lines. The live view
    reads `clock` from its refresh thread, so it must be readable from any thread
    (MachineClock is); it has no colour with `color=False` or NO_COLOR set. Plain
    lines: at most one progress line per `every` seconds of event time, stamped with
    `wall()` and `tag` (`log_tag`). `note()` goes to `notes` (default: the stream)
    unless a live view is drawing, which prints it above itself. `verbosity` -1
    (--quiet): plain lines, and only failures and the summary; 1 (--verbose): every
    requeue, not only the first ones. The summary's last line names `results`,
    the results file, on the same stream; with `earlier` (a resumed run's jobs
    that ended before it, by state), its counts are the whole file's. With
    `responses` and `tally` (the run's, which the run counts) it shows those;
    with `board`, it keeps its counts there (`BoardView`).
    """
    if every < 0:
        msg = f"every must be at least 0 s, got {every}"
        raise ValueError(msg)
    if live is None:
        live = stream.isatty() and os.environ.get("TERM") not in _DUMB_TERMINALS
    if board is None:
        board = Board(responses, tally)
    if live and verbosity >= 0:
        console = Console(file=stream, force_terminal=True, no_color=_no_color(color))
        return _LiveView(
            console,
            clock=clock,
            notes=notes,
            results=results,
            earlier=earlier,
            board=board,
        )
    return PlainLog(
        stream,
        clock=clock,
        every=every,
        wall=wall,
        notes=notes,
        tag=tag,
        verbosity=verbosity,
        results=results,
        earlier=earlier,
        board=board,
    )


def view(
    jobs_file: Path, *, color: bool, verbosity: int, results: Path | None = None
) -> BoardView:
    """How `submit` shows its run: `open_progress` on stdout, its plain lines
    tagged with the process and `jobs_file`, its summary ending with `results`."""

    def opened(
        *,
        clock: Clock,
        notes: Callable[[News], None],
        earlier: Mapping[Status, int] | None = None,
        responses: Responses | None = None,
        tally: RunTally | None = None,
        board: Board | None = None,
    ) -> ProgressSink:
        return open_progress(
            sys.stdout,
            clock=clock,
            notes=notes,
            color=color,
            tag=log_tag(jobs_file),
            verbosity=verbosity,
            results=results,
            earlier=earlier,
            responses=responses,
            tally=tally,
            board=board,
        )

    return opened


def _no_color(color: bool) -> bool:
    # https://no-color.org: set and not empty.
    return not color or bool(os.environ.get("NO_COLOR"))


class _LiveView:
    """A Rich live view: an overall bar, a row per endpoint, the latest failures."""

    def __init__(
        self,
        console: Console,
        *,
        clock: Clock,
        notes: Callable[[News], None] | None,
        results: Path | None = None,
        earlier: Mapping[Status, int] | None = None,
        board: Board,
    ) -> None:
        self._console = console
        self._results = results
        self._earlier = earlier
        self._notes = notes
        self._clock = clock
        self._board = board
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

    def note(self, news: News) -> None:
        # While the view draws, only its console may print, above the view:
        # anything else is erased by the next redraw.
        if self._live.is_started or self._notes is None:
            self._say(spoken(news))
        else:
            self._notes(news)

    def _render(self) -> RenderableType:
        # Runs on Rich's refresh thread: the board is only read under the lock
        # that `emit` changes it under.
        with self._lock:
            return self._render_board()

    def _render_board(self) -> RenderableType:
        now = self._clock.now()
        etas = self._board.etas(now)
        parts: list[RenderableType] = [self._bar(now, etas), self._table(now, etas)]
        if self._board.capped is not None:
            parts.append(Text(capped_text(self._board.capped), style="yellow"))
        learned = learned_note(self._board.keys.values())
        if learned:
            parts.append(Text(learned, style="dim"))
        recent = tuple(self._board.recent)
        if recent:
            parts.append(Text("Latest failures:", style="bold red"))
            parts.extend(Text(f"  {line}", style="red") for line in recent)
        return Group(*parts)

    def _bar(self, now: float, etas: dict[LimitKey, float]) -> Table:
        c = overall(list(self._board.keys.values()))
        grid = Table.grid(padding=(0, 1))
        ended = c.total > 0 and c.ended == c.total
        eta = durations.spoken(max(etas.values(), default=0.0))
        # The bar takes what the counts and times leave of the width.
        width = max(20, min(self._console.width - 48, 100))
        grid.add_row(
            ProgressBar(total=max(c.total, 1), completed=c.ended, width=width),
            f"{c.ended:,}/{c.total:,}",
            f"elapsed {durations.spoken(self._board.elapsed(now))}",
            "done" if ended else f"ETA {eta}",
        )
        return grid

    def _table(self, now: float, etas: dict[LimitKey, float]) -> Table:
        # One space between columns, none wraps: 80 columns hold every row,
        # "run-query  15/1m+500/1h*  2,000/2,000 …" included.
        table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0))
        for i, name in enumerate(_VIEW_COLUMNS.split(",")):
            table.add_column(name, justify="left" if i < 2 else "right", no_wrap=True)
        for key, s in list(self._board.keys.items()):
            c = s.counts
            key_eta = durations.spoken(etas.get(key, 0.0)) if c.left > 0 else NONE
            numbers = (c.failed, c.rate_limited, c.retried, s.in_flight)
            table.add_row(
                Text(key),
                Text(rule_text(s)),
                f"{c.done:,}/{c.total:,}",
                *(f"{n:,}" for n in numbers),
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
        now = self._clock.now()
        for line in closing_lines(self._board, now, self._results, self._earlier):
            self._say(line)

    def _say(self, text: str) -> None:
        """A line of text, wrapped at words (a number kept with its unit)."""
        self._console.print(Text(fitted(text, self._console.width)), soft_wrap=True)
