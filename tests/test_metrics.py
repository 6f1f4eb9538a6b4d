"""`--metrics-file`: a run as Prometheus text (cli/metrics.py), read back with
prometheus_client's own parser, as node_exporter's textfile collector reads it."""

from __future__ import annotations

import contextlib
import io

from prometheus_client.parser import text_string_to_metric_families

from batchrun.cli.metrics import MetricsFile, last_success
from batchrun.cli.progress import open_progress, view
from batchrun.core.events import (
    Because,
    Evidence,
    JobAnswered,
    JobFinished,
    JobRequeued,
    JobSent,
    RuleLearned,
    RunStarted,
    RunTally,
    Status,
    Tally,
    Tee,
)
from batchrun.core.limits import LimitKey, Pace, parse_rule
from batchrun.core.responses import Responses

RQ = LimitKey.RUN_QUERY
INV = LimitKey.INVITE
REFUSED = Evidence(Because.REFUSED, 2)


def read(path) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the file: (name, labels) -> value."""
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            found[sample.name, frozenset(sample.labels.items())] = sample.value
    return found


def value(samples, name, **labels):
    return samples[name, frozenset({"jobs": "nightly.csv", **labels}.items())]


class Wall:
    """A wall clock that moves only when the test says."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def _a_run(metrics: MetricsFile) -> None:
    """Three run-query jobs (one 429 then done, one 400, one left) and two
    invites (done, unknown), with run-query's rule learned."""
    rules = {RQ: parse_rule("15/1m+500/1h"), INV: parse_rule("15/5m")}
    metrics.emit(RunStarted(0.0, {RQ: 3, INV: 2}, rules, Pace.EXACT))
    answers = [
        (RQ, "a", 429, 0.1),
        (RQ, "a", 200, 0.2),
        (RQ, "b", 400, 0.3),
        (INV, "c", 201, 0.4),
        (INV, "d", None, 30.0),
    ]
    for key, job, status, latency in answers:
        metrics.emit(JobSent(1.0, key, job, 1))
        metrics.emit(JobAnswered(2.0, key, job, status, latency))
    metrics.emit(JobRequeued(2.0, RQ, "a", 1.0, True, "HTTP 429"))
    metrics.emit(JobFinished(3.0, RQ, "a", Status.DONE, 2, 200, None))
    metrics.emit(JobFinished(3.0, RQ, "b", Status.FAILED, 1, 400, "HTTP 400"))
    metrics.emit(JobFinished(3.0, INV, "c", Status.DONE, 1, 201, None))
    metrics.emit(JobFinished(3.0, INV, "d", Status.UNKNOWN, 1, None, "timeout"))
    metrics.emit(RuleLearned(4.0, RQ, parse_rule("10/1m"), False, REFUSED))


def test_an_ended_run_writes_every_count_the_issue_names(tmp_path):
    """Start, end, duration, exit code, jobs by outcome, answers by code, 429s,
    retries, latencies and the rule in force, each labelled with the jobs file."""
    path = tmp_path / "batchrun.prom"
    wall = Wall()
    metrics = MetricsFile(path, label="nightly.csv", wall=wall)
    _a_run(metrics)
    wall.now += 10
    metrics.write(exit_code=1)
    s = read(path)
    assert value(s, "batchrun_run_start_timestamp_seconds") == 1_700_000_000.0
    assert value(s, "batchrun_run_end_timestamp_seconds") == 1_700_000_010.0
    assert value(s, "batchrun_run_duration_seconds") == 10.0
    assert value(s, "batchrun_run_exit_code") == 1
    assert value(s, "batchrun_run_in_progress") == 0
    outcomes = {"done": 1, "failed": 1, "unknown": 0, "left": 1}
    for outcome, n in outcomes.items():
        assert value(s, "batchrun_jobs", endpoint="run-query", outcome=outcome) == n
    assert value(s, "batchrun_jobs", endpoint="invite", outcome="unknown") == 1
    codes = {"200": 1, "400": 1, "429": 1}
    for code, n in codes.items():
        assert value(s, "batchrun_responses", endpoint="run-query", code=code) == n
    assert value(s, "batchrun_responses", endpoint="invite", code="error") == 1
    assert value(s, "batchrun_rate_limited", endpoint="run-query") == 1
    assert value(s, "batchrun_retries", endpoint="run-query") == 0
    assert (
        value(s, "batchrun_latency_seconds", endpoint="run-query", quantile="1") == 0.3
    )
    assert value(s, "batchrun_latency_seconds", endpoint="invite", quantile="1") == 0.4
    learned = {"rule": "10/1m", "learned": "true"}
    assert value(s, "batchrun_rule_info", endpoint="run-query", **learned) == 1
    assert value(s, "batchrun_rule_learned", endpoint="run-query") == 1
    given = {"rule": "15/5m", "learned": "false"}
    assert value(s, "batchrun_rule_info", endpoint="invite", **given) == 1
    # This run failed and none before succeeded: no success to report.
    assert not any(name == "batchrun_last_success_timestamp_seconds" for name, _ in s)


def test_a_run_in_progress_has_no_end_yet(tmp_path):
    """Mid-run the file says the run is working, how long so far, and no exit code."""
    path = tmp_path / "batchrun.prom"
    wall = Wall()
    metrics = MetricsFile(path, label="nightly.csv", wall=wall)
    _a_run(metrics)
    wall.now += 10
    metrics.write()
    s = read(path)
    assert value(s, "batchrun_run_in_progress") == 1
    assert value(s, "batchrun_run_duration_seconds") == 10.0
    names = {name for name, _ in s}
    assert "batchrun_run_exit_code" not in names
    assert "batchrun_run_end_timestamp_seconds" not in names


def test_a_failed_run_keeps_the_last_success_of_an_earlier_one(tmp_path):
    """The success time survives failed runs, so "no success in 26 h" can fire."""
    path = tmp_path / "batchrun.prom"
    MetricsFile(path, label="nightly.csv", wall=Wall(1000.0)).write(exit_code=0)
    assert last_success(path, "nightly.csv") == 1000.0
    assert last_success(path, "other.csv") is None
    failed = MetricsFile(path, label="nightly.csv", wall=Wall(5000.0))
    failed.write()
    failed.write(exit_code=1)
    s = read(path)
    assert value(s, "batchrun_last_success_timestamp_seconds") == 1000.0
    assert value(s, "batchrun_run_exit_code") == 1
    MetricsFile(path, label="nightly.csv", wall=Wall(9000.0)).write(exit_code=0)
    assert last_success(path, "nightly.csv") == 9000.0


def test_an_unreadable_earlier_file_means_no_earlier_success(tmp_path):
    """A damaged or foreign file is replaced, not a reason to fail the run."""
    path = tmp_path / "batchrun.prom"
    path.write_text("this is {not prometheus\n")
    assert last_success(path, "nightly.csv") is None
    assert last_success(tmp_path / "missing.prom", "nightly.csv") is None
    MetricsFile(path, label="nightly.csv", wall=Wall()).write(exit_code=2)
    assert value(read(path), "batchrun_run_exit_code") == 2


def test_the_file_is_replaced_whole(tmp_path):
    """Written by rename: no temporary file is left beside it for the collector."""
    path = tmp_path / "batchrun.prom"
    metrics = MetricsFile(path, label="nightly.csv", wall=Wall())
    for _ in range(3):
        metrics.write()
    metrics.write(exit_code=0)
    assert [p.name for p in tmp_path.iterdir()] == ["batchrun.prom"]


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_run_writes_at_its_start_then_once_a_minute(tmp_path):
    """Nothing before the run starts (a run refused for another's lock must not
    touch the file), then at the start, then on a tick a minute later."""
    path = tmp_path / "batchrun.prom"
    clock = Ticks()
    metrics = MetricsFile(path, label="nightly.csv", wall=Wall(), clock=clock)
    metrics.tick()
    assert not path.exists()
    rules = {RQ: parse_rule("15/1m")}
    metrics.emit(RunStarted(0.0, {RQ: 1}, rules, Pace.EXACT))
    assert value(read(path), "batchrun_jobs", endpoint="run-query", outcome="left") == 1
    metrics.emit(JobFinished(3.0, RQ, "a", Status.DONE, 1, 200, None))
    clock.now = 59.0
    metrics.tick()
    assert value(read(path), "batchrun_jobs", endpoint="run-query", outcome="left") == 1
    clock.now = 60.0
    metrics.tick()
    assert value(read(path), "batchrun_jobs", endpoint="run-query", outcome="done") == 1
    metrics.close(0)
    assert value(read(path), "batchrun_run_exit_code") == 0


def test_a_file_that_cannot_be_written_is_said_once(tmp_path):
    """A folder gone mid-run: one warning, and the run is not stopped by it."""
    said: list[str] = []
    path = tmp_path / "gone" / "batchrun.prom"
    clock = Ticks()
    metrics = MetricsFile(path, label="x", wall=Wall(), clock=clock, warn=said.append)
    metrics.emit(RunStarted(0.0, {RQ: 1}, {RQ: parse_rule("15/1m")}, Pace.EXACT))
    clock.now = 120.0
    metrics.tick()
    metrics.close(1)
    assert len(said) == 1
    assert said[0].startswith(f"cannot write the metrics file {path}: No such file")


class _Clock:
    def now(self) -> float:
        return 0.0


def test_around_a_view_the_run_is_counted_once_on_one_board(tmp_path):
    """The view keeps its counts on the metrics file's board; each event is
    counted there once, and the file writes what the view's summary says."""
    metrics = MetricsFile(tmp_path / "m.prom", label="nightly.csv", wall=Wall())
    stream = io.StringIO()
    boards = []

    def shown(*, clock, notes, earlier=None, responses=None, tally=None, board=None):
        boards.append(board)
        return open_progress(stream, live=False, clock=clock, board=board)

    sink = metrics.around(shown)(clock=_Clock(), notes=lambda text: None)
    rules = {RQ: parse_rule("15/1m")}
    sink.emit(RunStarted(0.0, {RQ: 2}, rules, Pace.EXACT))
    for job, status in (("a", Status.DONE), ("b", Status.FAILED)):
        sink.emit(JobSent(1.0, RQ, job, 1))
        sink.emit(JobAnswered(2.0, RQ, job, 200, 0.1))
        sink.emit(JobFinished(3.0, RQ, job, status, 1, 200, None))
    sink.close()
    metrics.close(1)
    assert boards == [metrics.board]
    counts = metrics.board.keys[RQ].counts
    assert (counts.done, counts.failed, counts.left) == (1, 1, 0)
    assert metrics.board.responses.keys[RQ].codes == {"200": 2}
    samples = read(metrics.path)
    assert value(samples, "batchrun_jobs", endpoint="run-query", outcome="done") == 1
    assert "1 done, 1 failed" in stream.getvalue()


def test_around_a_view_the_answers_shown_are_the_runs(tmp_path):
    """Given the run's answers by code (which the run counts), the view and the
    metrics file show those, and count none again."""
    metrics = MetricsFile(tmp_path / "m.prom", label="nightly.csv", wall=Wall())
    stream = io.StringIO()
    answers = Responses()
    opened = metrics.around(view(tmp_path / "nightly.csv", color=False, verbosity=0))
    with contextlib.redirect_stdout(stream):
        shown = opened(clock=_Clock(), notes=print, responses=answers)
        sink = Tee(answers, shown)
        sink.emit(RunStarted(0.0, {RQ: 1}, {RQ: parse_rule("15/1m")}, Pace.EXACT))
        sink.emit(JobSent(1.0, RQ, "a", 1))
        sink.emit(JobAnswered(2.0, RQ, "a", 429, 0.1))
        sink.emit(JobAnswered(3.0, RQ, "a", 200, 0.1))
        sink.emit(JobFinished(3.0, RQ, "a", Status.DONE, 2, 200, None))
        shown.close()
    metrics.close(0)
    assert metrics.board.responses is answers
    assert answers.keys[RQ].codes == {"200": 1, "429": 1}
    assert "run-query responses: 200: 1, 429: 1" in stream.getvalue()
    samples = read(metrics.path)
    assert value(samples, "batchrun_jobs", endpoint="run-query", outcome="done") == 1


def test_around_a_view_the_jobs_shown_are_the_runs_tally(tmp_path):
    """Given the run's tally (which the runner counts), the view and the metrics
    file show it, and count no job again."""
    metrics = MetricsFile(tmp_path / "m.prom", label="nightly.csv", wall=Wall())
    stream = io.StringIO()
    tally = RunTally()
    opened = metrics.around(view(tmp_path / "nightly.csv", color=False, verbosity=0))
    with contextlib.redirect_stdout(stream):
        shown = opened(clock=_Clock(), notes=print, tally=tally)
        sink = Tee(tally, shown)
        sink.emit(RunStarted(0.0, {RQ: 2}, {RQ: parse_rule("15/1m")}, Pace.EXACT))
        sink.emit(JobSent(1.0, RQ, "a", 1))
        sink.emit(JobRequeued(2.0, RQ, "a", 1.0, rate_limited=True, reason="429"))
        sink.emit(JobSent(3.0, RQ, "a", 2))
        sink.emit(JobFinished(4.0, RQ, "a", Status.DONE, 2, 200, None))
        shown.close()
    metrics.close(1)
    assert metrics.board.tally is tally
    assert tally.keys == {RQ: Tally(total=2, done=1, rate_limited=1)}
    assert "1 done, 0 failed, 1 left" in stream.getvalue()
    samples = read(metrics.path)
    assert value(samples, "batchrun_jobs", endpoint="run-query", outcome="done") == 1
    assert value(samples, "batchrun_rate_limited", endpoint="run-query") == 1
