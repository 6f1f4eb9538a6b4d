"""What a person sees of a run: a Rich live view on a terminal, plain lines elsewhere.

Both sinks keep one `_Board` of counts from the runner's events and end with the same
summary. ETAs come from the limits (`pacer.eta` over the jobs left and the recent
sends), not from the past rate. This is the only module that imports Rich.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text

from batchrun.clock import Clock
from batchrun.events import (
    Event,
    JobFinished,
    JobRequeued,
    JobSent,
    RunFinished,
    RunStarted,
    SlotWait,
    Status,
)
from batchrun.limits import LimitKey, Rule
from batchrun.pacer import Pace, eta

_FAILURES_SHOWN = 20


class ProgressSink(Protocol):
    """An event sink that shows a run and prints its summary on `close`."""

    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


def open_progress(
    stream: TextIO, *, clock: Clock, live: bool | None = None
) -> ProgressSink:
    """A live view if `stream` is a terminal (or `live`), plain lines otherwise."""
    if live is None:
        live = stream.isatty()
    if live:
        return LiveView(Console(file=stream), clock=clock)
    return PlainLog(stream, clock=clock)


def format_duration(seconds: float) -> str:
    """`850 ms`, `4.2 s`, `3 m 20 s`, `3 h 59 m`."""
    if seconds < 1:
        return f"{max(0.0, seconds) * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} m {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} m"


@dataclass(slots=True)
class _Key:
    rule: Rule
    total: int
    done: int = 0
    failed: int = 0
    rate_limited: int = 0
    retried: int = 0
    in_flight: int = 0
    waiting_until: float | None = None
    waiting_answer: bool = False
    sends: deque[float] = field(default_factory=deque)

    @property
    def ended(self) -> int:
        return self.done + self.failed

    @property
    def left(self) -> int:
        return self.total - self.ended


class _Board:
    """Counts per key, kept from the events; shared by both sinks."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.keys: dict[LimitKey, _Key] = {}
        self.pace = Pace.EXACT
        self.started = 0.0
        self.failures: list[str] = []
        self.recent_failures: deque[str] = deque(maxlen=3)
        self.failure_count = 0
        self.finished: RunFinished | None = None

    def apply(self, event: Event) -> None:
        match event:
            case RunStarted():
                self._start(event)
            case JobSent(key=key):
                self._sent(self.keys[key], event.at)
            case JobRequeued(key=key, rate_limited=limited):
                state = self.keys[key]
                state.rate_limited += limited
                state.retried += not limited
            case JobFinished():
                self._ended(event)
            case SlotWait(key=key, until=until):
                self.keys[key].waiting_until = until
                self.keys[key].waiting_answer = until is None
            case RunFinished():
                self.finished = event

    def _start(self, event: RunStarted) -> None:
        self.started = event.at
        self.pace = Pace(event.pace)
        self.keys = {
            key: _Key(
                event.rules[key], total, sends=deque(maxlen=event.rules[key].deepest)
            )
            for key, total in event.totals.items()
            if total
        }

    def _sent(self, state: _Key, at: float) -> None:
        state.in_flight += 1
        state.sends.append(at)
        state.waiting_until = None
        state.waiting_answer = False

    def _ended(self, event: JobFinished) -> None:
        state = self.keys[event.key]
        if event.status is Status.DONE:
            state.done += 1
        else:
            state.failed += 1
            self.failure_count += 1
            text = _failure_text(event)
            self.recent_failures.append(text)
            if len(self.failures) < _FAILURES_SHOWN:
                self.failures.append(text)

    def note_answer(self, event: Event) -> None:
        """An answer arrived for a sent job, whatever it said."""
        if isinstance(event, JobRequeued | JobFinished):
            self.keys[event.key].in_flight -= 1

    def eta(self, key: LimitKey) -> float:
        """Seconds until the key's last job may leave, from its rule."""
        state, now = self.keys[key], self.clock.now()
        pending = state.left - state.in_flight
        if pending <= 0:
            return 0.0
        moment = eta(pending, state.rule, now=now, pace=self.pace, recent=state.sends)
        return max(0.0, moment - now)

    def overall_eta(self) -> float:
        return max((self.eta(key) for key in self.keys), default=0.0)

    def next_slot(self, key: LimitKey) -> str:
        state = self.keys[key]
        if not state.left:
            return "-"
        if state.waiting_answer:
            return "after an answer"
        if state.waiting_until is None:
            return "now"
        return f"in {format_duration(state.waiting_until - self.clock.now())}"

    def totals(self) -> tuple[int, int]:
        return sum(k.ended for k in self.keys.values()), sum(
            k.total for k in self.keys.values()
        )


def _failure_text(event: JobFinished) -> str:
    return (
        f"job {event.job_id} ({event.key}) failed after {event.attempts} "
        f"attempt(s): {event.error or 'error'}"
    )


class _Sink:
    """Routes events to the board; subclasses show it."""

    def __init__(self, clock: Clock) -> None:
        self.board = _Board(clock)
        self._closed = False

    def emit(self, event: Event) -> None:
        self.board.note_answer(event)
        self.board.apply(event)
        self.shown(event)

    def shown(self, event: Event) -> None:
        """Show what the event changed."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.summarize()

    def summarize(self) -> None:
        """Print the final summary."""


def _summary_rows(board: _Board) -> list[list[str]]:
    rows = [
        [
            str(key),
            str(s.done),
            str(s.failed),
            str(s.left),
            str(s.rate_limited),
            str(s.retried),
        ]
        for key, s in board.keys.items()
    ]
    return rows


_SUMMARY_HEADER = ["endpoint", "done", "failed", "left", "429s", "retries"]


def _closing_lines(board: _Board) -> list[str]:
    done = sum(s.done for s in board.keys.values())
    failed = sum(s.failed for s in board.keys.values())
    left = sum(s.left for s in board.keys.values())
    elapsed = format_duration(board.clock.now() - board.started)
    lines = [f"{done} done, {failed} failed, {left} left in {elapsed}."]
    if board.finished is not None and board.finished.stopped:
        lines.append("Stopped early: run the same command again to resume.")
    return lines


class PlainLog(_Sink):
    """Timestamped lines without escape codes, at most one progress line per `every`."""

    def __init__(
        self,
        stream: TextIO,
        *,
        clock: Clock,
        every: float = 10.0,
        wall: Callable[[], datetime] = datetime.now,
    ) -> None:
        super().__init__(clock)
        self._stream = stream
        self._every = every
        self._wall = wall
        self._last_line = -float("inf")
        self._keys_ended: set[LimitKey] = set()

    def shown(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._line(self._start_text())
            self._last_line = event.at
        elif isinstance(event, JobFinished):
            self._finished(event)
        elif isinstance(event, JobSent | JobRequeued) and self._due(event.at):
            self._progress(event.at)

    def _finished(self, event: JobFinished) -> None:
        board = self.board
        if event.status is Status.FAILED and board.failure_count <= _FAILURES_SHOWN:
            self._line(board.failures[board.failure_count - 1])
        state = board.keys[event.key]
        if not state.left and event.key not in self._keys_ended:
            self._keys_ended.add(event.key)
            self._line(
                f"{event.key}: all {state.total} jobs ended "
                f"({state.done} done, {state.failed} failed)"
            )
        elif self._due(event.at):
            self._progress(event.at)

    def _due(self, at: float) -> bool:
        return at - self._last_line >= self._every

    def _progress(self, at: float) -> None:
        self._last_line = at
        ended, total = self.board.totals()
        parts = [
            f"{key} {s.ended}/{s.total} (429s {s.rate_limited}, retries {s.retried})"
            for key, s in self.board.keys.items()
        ]
        eta_text = format_duration(self.board.overall_eta())
        self._line(f"{ended}/{total} ended; " + "; ".join(parts) + f"; ETA {eta_text}")

    def _start_text(self) -> str:
        board = self.board
        _, total = board.totals()
        keys = ", ".join(f"{k} {s.total} at {s.rule}" for k, s in board.keys.items())
        eta_text = format_duration(board.overall_eta())
        return f"starting: {total} jobs: {keys}; pace {board.pace}; ETA {eta_text}"

    def summarize(self) -> None:
        rows = [_SUMMARY_HEADER, *_summary_rows(self.board)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(_SUMMARY_HEADER))]
        for row in rows:
            cells = [
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ]
            self._stream.write("  " + "  ".join(cells) + "\n")
        for line in _closing_lines(self.board):
            self._line(line)
        self._stream.flush()

    def _line(self, text: str) -> None:
        stamp = self._wall().strftime("%Y-%m-%d %H:%M:%S")
        self._stream.write(f"{stamp} {text}\n")
        self._stream.flush()


class LiveView(_Sink):
    """A Rich live view: overall bar, a row per endpoint, recent failures."""

    def __init__(self, console: Console, *, clock: Clock) -> None:
        super().__init__(clock)
        self._console = console
        self._bar = Progress(
            TextColumn("[bold]batchrun"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
            get_time=time.monotonic,
        )
        self._task = self._bar.add_task("run", total=None, detail="")
        self._live = Live(
            get_renderable=self.render,
            console=console,
            refresh_per_second=4,
            transient=False,
        )

    def shown(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._live.start()

    def render(self) -> RenderableType:
        """The current view: refreshed by Rich a few times a second."""
        board = self.board
        ended, total = board.totals()
        elapsed = format_duration(board.clock.now() - board.started)
        eta_text = format_duration(board.overall_eta())
        detail = f"{ended}/{total}  elapsed {elapsed}  ETA {eta_text}"
        self._bar.update(self._task, total=total, completed=ended, detail=detail)
        parts: list[RenderableType] = [self._bar.get_renderable(), self._table()]
        parts += [Text(line, style="red") for line in board.recent_failures]
        return Group(*parts)

    def _table(self) -> Table:
        table = Table(box=None, pad_edge=False)
        for name in (
            "endpoint",
            "rule",
            "done/total",
            "failed",
            "429s",
            "retries",
            "in flight",
            "next slot",
            "ETA",
        ):
            table.add_column(
                name, justify="left" if name in ("endpoint", "rule") else "right"
            )
        for key, s in self.board.keys.items():
            table.add_row(
                str(key),
                str(s.rule),
                f"{s.done}/{s.total}",
                str(s.failed),
                str(s.rate_limited),
                str(s.retried),
                str(s.in_flight),
                self.board.next_slot(key),
                format_duration(self.board.eta(key)),
            )
        return table

    def summarize(self) -> None:
        if self._live.is_started:
            self._live.stop()
        table = Table(title="Summary", box=None, pad_edge=False)
        for name in _SUMMARY_HEADER:
            table.add_column(name, justify="left" if name == "endpoint" else "right")
        for row in _summary_rows(self.board):
            table.add_row(*row)
        self._console.print(table)
        for line in _closing_lines(self.board):
            self._console.print(line, highlight=False)
