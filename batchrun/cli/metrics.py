"""`--metrics-file`: a run as Prometheus text, for node_exporter's textfile collector.

The way Prometheus watches a batch job: the job writes what it did to a file, the
textfile collector exposes it, and an alert fires when the last success is too
old or a run failed. `MetricsFile` is an event sink that reads a run's counts (a
`board.Board`: the view's own, when it goes `around` one) and writes them with
prometheus_client's `write_to_textfile` (a temporary file renamed over the old
one, so a scrape never reads half a file): once a minute during the run, and at
its end with the exit code. Every series
carries the jobs file's name as its `jobs` label, so that the files of several
jobs files can sit in one folder. The last success is kept from the previous file
when this run did not succeed.

This is the only module that imports prometheus_client (the `metrics` extra).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, Info, write_to_textfile
from prometheus_client.parser import text_string_to_metric_families

from batchrun.cli.board import Board, BoardView
from batchrun.core.clock import Clock, wall_time
from batchrun.core.events import Event, RunStarted, RunTally, Status, Tally
from batchrun.core.responses import PERCENTILES, KeyResponses, Responses
from batchrun.run.view import ProgressSink, View

if TYPE_CHECKING:
    from batchrun.run.news import News

_PREFIX = "batchrun_"
_LAST_SUCCESS = f"{_PREFIX}last_success_timestamp_seconds"
# How often a run rewrites the file: a scrape (15 s to 1 m) sees a live run move.
EVERY = 60.0


class MetricsFile:
    """An event sink that writes the run it hears about to `path`: when the run
    starts, on a `tick` once `EVERY` seconds of `clock` passed, and on `close`.

    A file that cannot be written is said once through `warn`, and the run goes
    on: the metrics only describe it.
    """

    def __init__(
        self,
        path: Path,
        *,
        label: str,
        wall: Callable[[], float] = wall_time,
        clock: Callable[[], float] = time.monotonic,
        warn: Callable[[str], None] = lambda text: None,
    ) -> None:
        self.path = path
        self._label = label
        self._wall = wall
        self._clock = clock
        self._warn = warn
        self.board = Board()
        self._started = wall()
        self._last_success = last_success(path, label)
        self._written: float | None = None
        self._warned = False

    def emit(self, event: Event) -> None:
        self.board.apply(event)
        self.heard(event)

    def heard(self, event: Event) -> None:
        """Act on `event`, once counted on `board`."""
        if isinstance(event, RunStarted):
            self._try_write()

    def tick(self) -> None:
        """Write the run so far if it was last written `EVERY` seconds ago."""
        if self._written is not None and self._clock() - self._written >= EVERY:
            self._try_write()

    def close(self, exit_code: int) -> None:
        """Write the ended run with its exit code."""
        self._try_write(exit_code)

    def around(self, view: BoardView) -> View:
        """`view`, keeping its counts on this file's board, with this file hearing
        the run's events and ticks as well: the run is counted once."""

        def opened(
            *,
            clock: Clock,
            notes: Callable[[News], None],
            earlier: Mapping[Status, int] | None = None,
            responses: Responses | None = None,
            tally: RunTally | None = None,
        ) -> ProgressSink:
            # One board for both, made before the run: its counts, the run's.
            self.board = Board(responses, tally)
            shown = view(clock=clock, notes=notes, earlier=earlier, board=self.board)
            return _Metered(shown, self)

        return opened

    def _try_write(self, exit_code: int | None = None) -> None:
        self._written = self._clock()
        try:
            self.write(exit_code)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                self._warn(
                    f"cannot write the metrics file {self.path}: "
                    f"{exc.strerror or exc}. The run goes on without it."
                )

    def write(self, exit_code: int | None = None) -> None:
        """Write the run so far; with `exit_code`, as ended.

        Raises:
            OSError: when the file (or its temporary twin) cannot be written.
        """
        ended = None if exit_code is None else self._wall()
        if exit_code == 0:
            self._last_success = ended
        registry = CollectorRegistry()
        run = _Gauges(registry, self._label)
        run.set("run_start_timestamp_seconds", "When the run started.", self._started)
        run.set(
            "run_in_progress", "1 while the run works, 0 once it ended.", ended is None
        )
        end = self._wall() if ended is None else ended
        run.set(
            "run_duration_seconds",
            "How long the run took (so far).",
            end - self._started,
        )
        if exit_code is not None and ended is not None:
            run.set("run_end_timestamp_seconds", "When the run ended.", ended)
            run.set(
                "run_exit_code", "The run's exit code (0: every job done).", exit_code
            )
        if self._last_success is not None:
            run.set(
                "last_success_timestamp_seconds",
                "When a run last ended with exit code 0.",
                self._last_success,
            )
        _keys(registry, self._label, self.board)
        write_to_textfile(str(self.path), registry)


class _Metered:
    """A view that hands its events and ticks to a metrics file too."""

    def __init__(self, shown: ProgressSink, metrics: MetricsFile) -> None:
        self._shown = shown
        self._metrics = metrics

    def emit(self, event: Event) -> None:
        self._shown.emit(event)  # counts it on the board both read
        self._metrics.heard(event)

    def tick(self) -> None:
        self._shown.tick()
        self._metrics.tick()

    def note(self, news: News) -> None:
        self._shown.note(news)

    def close(self) -> None:
        self._shown.close()


class _Gauges:
    """Gauges that all carry the `jobs` label, made as they are first set."""

    def __init__(self, registry: CollectorRegistry, label: str) -> None:
        self._registry = registry
        self._label = label
        self._made: dict[str, Gauge] = {}

    def set(self, name: str, doc: str, value: float, **labels: str) -> None:
        gauge = self._made.get(name)
        if gauge is None:
            names = ["jobs", *labels]
            gauge = Gauge(_PREFIX + name, doc, names, registry=self._registry)
            self._made[name] = gauge
        gauge.labels(jobs=self._label, **labels).set(value)


def _keys(registry: CollectorRegistry, label: str, board: Board) -> None:
    """Per endpoint: jobs by outcome, answers by code, 429s, retries, latency,
    and the rule in force."""
    gauges = _Gauges(registry, label)
    rules = Info(
        f"{_PREFIX}rule",
        "The rule an endpoint is paced by, and whether it was learned.",
        ["jobs", "endpoint"],
        registry=registry,
    )
    for key, state in board.keys.items():
        _jobs(gauges, key, state.counts)
        learned = state.learned is not None
        gauges.set(
            "rule_learned",
            "1 if the server taught a stricter rule.",
            learned,
            endpoint=key,
        )
        rules.labels(jobs=label, endpoint=key).info(
            {"rule": str(state.rule), "learned": str(learned).lower()}
        )
    for key, found in board.responses.keys.items():
        _responses(gauges, key, found)


def _jobs(gauges: _Gauges, key: str, counts: Tally) -> None:
    doc = "This run's jobs by outcome (left: for a resume)."
    outcomes = {
        Status.DONE: counts.done,
        Status.FAILED: counts.failed,
        Status.UNKNOWN: counts.unknown,
        "left": counts.left,
    }
    for outcome, n in outcomes.items():
        gauges.set("jobs", doc, n, endpoint=key, outcome=outcome)
    gauges.set(
        "rate_limited", "This run's 429 answers.", counts.rate_limited, endpoint=key
    )
    gauges.set(
        "retries", "This run's retries after errors.", counts.retried, endpoint=key
    )


def _responses(gauges: _Gauges, key: str, found: KeyResponses) -> None:
    doc = "This run's answers by HTTP status (error: no answer)."
    for code, n in found.ordered():
        gauges.set("responses", doc, n, endpoint=key, code=code)
    latency = found.latency
    if not latency.count:
        return
    doc = "Answer latency quantiles of this run (1: the maximum)."
    for p in PERCENTILES:
        value = latency.percentile(p) or 0.0
        gauges.set("latency_seconds", doc, value, endpoint=key, quantile=f"{p / 100:g}")
    gauges.set("latency_seconds", doc, latency.max, endpoint=key, quantile="1")


def last_success(path: Path, label: str) -> float | None:
    """The last success a metrics file records for `label`; None if it records
    none, or is missing or unreadable."""
    with contextlib.suppress(OSError, ValueError):
        text = path.read_text(encoding="utf-8")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == _LAST_SUCCESS and sample.labels.get("jobs") == label:
                    return float(sample.value)
    return None
