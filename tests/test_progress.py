"""The progress sinks: plain log lines, the Rich live view and the closing summary."""

from __future__ import annotations

import io
import itertools
import os
import re
from datetime import datetime
from pathlib import Path

import pytest

from batchrun.cli.board import Board, next_slot
from batchrun.cli.plain_log import fitted, log_tag, stamped
from batchrun.cli.progress import open_progress
from batchrun.core import durations
from batchrun.core.events import (
    Because,
    Evidence,
    InFlightCapped,
    JobFinished,
    JobRequeued,
    JobSent,
    RuleLearned,
    RunFinished,
    RunStarted,
    SlotWait,
    Status,
)
from batchrun.core.limits import LimitKey, Pace, parse_rule
from batchrun.pacing.slots import eta
from batchrun.run.exit_code import Cause
from batchrun.run.news import News, Stopping
from batchrun.run.view import QUIET

RQ, INVITE = LimitKey.RUN_QUERY, LimitKey.INVITE
STAMP = "2024-05-01 12:00:00"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeClock:
    """A clock that reads whatever the test sets."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time


class TTY(io.StringIO):
    """An in-memory stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def stream():
    return io.StringIO()


@pytest.fixture
def plain(stream, clock):
    """A plain-lines sink on `stream`, stamped with a fixed wall time."""
    sink = open_progress(
        stream, live=False, clock=clock, wall=lambda: datetime(2024, 5, 1, 12)
    )
    yield sink
    sink.close()


@pytest.fixture
def live(stream, clock, monkeypatch):
    """A live view on `stream`, 80 columns wide; closed at teardown."""
    monkeypatch.setenv("COLUMNS", "80")
    sink = open_progress(stream, live=True, clock=clock)
    yield sink
    sink.close()


def start(totals=None, rules=None, *, at=0.0, pace=Pace.EXACT):
    totals = totals or {RQ: 10}
    rules = rules or {RQ: "30/2s", INVITE: "15/5m"}
    parsed = {key: parse_rule(text) for key, text in rules.items()}
    return RunStarted(at, totals, parsed, pace)


def finished(job_id, *, at=1.0, key=RQ, ok=True, attempts=1, error=None):
    status = Status.DONE if ok else Status.FAILED
    http = 200 if ok else 404
    return JobFinished(at, key, job_id, status, attempts, http, error)


def send_and_finish(sink, count, *, at=1.0, key=RQ, ok=True, step=0.0):
    for i in range(count):
        moment = at + i * step
        sink.emit(JobSent(moment, key, f"j{i}", 1))
        sink.emit(finished(f"j{i}", at=moment, key=key, ok=ok, error="HTTP 404"))


def lines(stream):
    return stream.getvalue().splitlines()


def texts(stream):
    """The plain lines without their timestamps."""
    return [line.removeprefix(f"{STAMP} ") for line in lines(stream)]


def last_frame(stream):
    """The live view as last drawn, before the summary, with escape codes removed."""
    text = ANSI.sub("", stream.getvalue()).replace("\r", "\n")
    before = text[: text.rindex("Summary")]
    return before[before.rindex("elapsed") :]


def row(frame, key):
    lines = (line.strip() for line in frame.splitlines())
    return next(line for line in lines if line.startswith(str(key)))


def test_plain_lines_have_no_escape_codes(plain, stream):
    """Plain mode writes no ANSI escape code, from the start line to the summary."""
    plain.emit(start({RQ: 30}))
    send_and_finish(plain, 25, ok=False, step=1.0)
    plain.emit(JobRequeued(30.0, RQ, "j9", 2.0, True, "HTTP 429"))
    plain.emit(RunFinished(31.0, stopped=True))
    plain.close()
    assert "\x1b" not in stream.getvalue()


def test_plain_lines_start_with_a_local_timestamp(plain, stream):
    """Every plain line, summary included, starts with `YYYY-MM-DD HH:MM:SS `."""
    plain.emit(start({RQ: 2}))
    send_and_finish(plain, 2)
    plain.close()
    assert len(lines(stream)) > 5
    assert all(line.startswith(f"{STAMP} ") for line in lines(stream))


def test_plain_lines_name_the_process_and_file(stream, clock):
    """With a tag, every plain line (summary too) names the process and jobs file
    after its timestamp, so two runs appending to one log can be told apart."""
    tag = log_tag(Path("/data/nightly.csv"))
    assert tag == f"batchrun[{os.getpid()}] nightly.csv: "
    wall = lambda: datetime(2024, 5, 1, 12)  # noqa: E731
    sink = open_progress(stream, live=False, clock=clock, wall=wall, tag=tag)
    sink.emit(start({RQ: 2}))
    send_and_finish(sink, 2)
    sink.close()
    assert len(lines(stream)) > 5
    assert all(line.startswith(f"{STAMP} {tag}") for line in lines(stream))


def test_stamped_prefixes_every_line():
    """A message of several lines gets the stamp and tag on each."""
    text = stamped("one\ntwo", tag="t: ", wall=lambda: datetime(2024, 5, 1, 12))
    assert text == f"{STAMP} t: one\n{STAMP} t: two"


def test_a_quiet_plain_log_says_what_it_waits_for(plain, stream, clock):
    """After QUIET seconds without a line, a tick writes what the run waits for:
    each key's next slot (in how long, and the wall time) and the ETA."""
    plain.emit(start({RQ: 10}))
    plain.emit(SlotWait(0.0, RQ, 250.0))
    clock.time = QUIET - 1
    plain.tick()
    assert len(lines(stream)) == 1
    clock.time = QUIET
    plain.tick()
    assert texts(stream)[-1].startswith(
        "waiting: run-query next slot in 3 m 20 s (at 12:03:20) — 0/10 done"
    )
    plain.tick()
    assert len(lines(stream)) == 2


def test_a_tick_before_the_start_or_after_close_writes_nothing(stream, clock):
    """No run, or a closed one: nothing to wait for, so nothing is written."""
    sink = open_progress(stream, live=False, clock=clock)
    clock.time = 10 * QUIET
    sink.tick()
    sink.emit(start({RQ: 1}))
    sink.close()
    written = len(lines(stream))
    clock.time = 20 * QUIET
    sink.tick()
    assert len(lines(stream)) == written


def test_start_line_names_jobs_rules_pace_and_eta(plain, stream):
    """The start line gives the job count, each key's total and rule, pace and ETA."""
    rules = {RQ: "15/1m+500/1h", INVITE: "15/5m"}
    plain.emit(start({RQ: 100, INVITE: 20}, rules))
    # run-query: 15 a minute, so the 100th leaves in the 7th minute; invite: 300 s.
    assert texts(stream) == [
        "starting: 120 jobs — run-query 100 at 15/1m+500/1h, invite 20 at 15/5m; "
        "pace exact; ETA 6 m 0 s"
    ]


def test_start_eta_is_computed_from_the_rule(plain, stream):
    """60 jobs at 30/2s: 30 leave now, the other 30 when the window frees, at 2 s."""
    plain.emit(start({RQ: 60}, {RQ: "30/2s"}))
    expected = durations.spoken(eta(60, parse_rule("30/2s"), now=0.0))
    assert expected == "2.0 s"
    assert texts(stream)[0].endswith(f"ETA {expected}")


def test_eta_follows_the_limits_not_the_past_rate(plain, stream):
    """After 30 sends in 10 s, 60 more at 30/2s take 3 s by the rule, not 20 s."""
    plain.emit(start({RQ: 90}, {RQ: "30/2s"}, at=90.0))
    for i in range(30):
        plain.emit(JobSent(99.0, RQ, f"j{i}", 1))
    for i in range(30):
        plain.emit(finished(f"j{i}", at=100.0))
    rule = parse_rule("30/2s")
    expected = durations.spoken(eta(60, rule, now=100.0, recent=[99.0] * 30) - 100.0)
    assert expected == "3.0 s"
    [line] = [t for t in texts(stream) if t.startswith("progress:")]
    assert line.endswith(f"ETA {expected}")


def test_progress_line_shape(plain, stream):
    """A progress line sums up done/total, failed, 429s and retries, then per key."""
    plain.emit(start({RQ: 3, INVITE: 2}))
    plain.emit(JobSent(1.0, RQ, "j1", 1))
    plain.emit(JobRequeued(2.0, RQ, "j1", 1.0, True, "HTTP 429"))
    plain.emit(JobSent(3.0, INVITE, "i1", 1))
    plain.emit(JobRequeued(4.0, INVITE, "i1", 1.0, False, "timeout"))
    plain.emit(JobSent(11.0, RQ, "j1", 2))
    assert [t for t in texts(stream) if t.startswith("progress:")] == [
        "progress: 0/5 done, 0 failed, 1 429s, 1 retries — "
        "run-query 0/3 done, 0 failed, 1 429s, 0 retries; "
        "invite 0/2 done, 0 failed, 0 429s, 1 retries; ETA 0 ms"
    ]


def test_progress_lines_are_batched(plain, stream):
    """A thousand jobs ending within 10 s make one progress line, not one each."""
    plain.emit(start({RQ: 5000}))
    send_and_finish(plain, 1000, at=10.0, step=0.009)
    progress = [t for t in texts(stream) if t.startswith("progress:")]
    assert len(progress) == 1


def test_progress_lines_come_every_interval(plain, stream):
    """Events spread over 35 s make a progress line at 10, 20 and 30 s."""
    plain.emit(start({RQ: 5000}))
    send_and_finish(plain, 36, at=0.0, step=1.0)
    progress = [t for t in texts(stream) if t.startswith("progress:")]
    assert [p.split(" done")[0] for p in progress] == [
        "progress: 10/5,000",
        "progress: 20/5,000",
        "progress: 30/5,000",
    ]


def test_key_finished_line_comes_at_once(plain, stream):
    """When a key's last job ends, a line says so before the next progress line."""
    plain.emit(start({RQ: 2, INVITE: 5}))
    send_and_finish(plain, 1, at=1.0)
    plain.emit(JobSent(2.0, RQ, "j2", 1))
    plain.emit(finished("j2", at=2.0, ok=False, attempts=3, error="HTTP 404"))
    assert texts(stream)[-1] == "run-query: all 2 jobs ended (1 done, 1 failed)"
    assert not [t for t in texts(stream) if t.startswith("progress:")]


def test_failure_line_shape(plain, stream):
    """A failure line names the job, its key, the attempts and the error."""
    plain.emit(start({INVITE: 5}))
    plain.emit(
        finished("j7", key=INVITE, ok=False, attempts=3, error="HTTP 404 Not Found")
    )
    assert texts(stream)[-1] == (
        "job j7 (invite) failed after 3 attempts: HTTP 404 Not Found"
    )


def test_failure_line_without_error_text_uses_the_status(plain, stream):
    """A failure with no error text says its HTTP status, in the singular for 1."""
    plain.emit(start({INVITE: 5}))
    plain.emit(finished("j1", key=INVITE, ok=False))
    assert texts(stream)[-1] == "job j1 (invite) failed after 1 attempt: HTTP 404"


def test_an_unknown_invite_has_its_own_lines_and_summary_column(plain, stream):
    """An unknown job is not called failed: its line, the key's end and the
    summary (with an unknown column) say unknown and how to resend it."""
    plain.emit(start({INVITE: 2}))
    send_and_finish(plain, 1, key=INVITE)
    plain.emit(JobSent(2.0, INVITE, "i9", 1))
    plain.emit(JobFinished(2.5, INVITE, "i9", Status.UNKNOWN, 1, None, "timeout"))
    assert texts(stream)[-2:] == [
        "job i9 (invite) unknown after 1 attempt: timeout; it may have been "
        "processed, so it is not resent (check, then --retry-unknown)",
        "invite: all 2 jobs ended (1 done, 0 failed, 1 unknown)",
    ]
    plain.emit(RunFinished(3.0, stopped=False))
    plain.close()
    assert texts(stream)[-4:] == [
        "  endpoint  done  failed  unknown  left  429s  retries",
        "  invite       1       0        1     0     0        0",
        "  total        1       0        1     0     0        0",
        "1 done, 0 failed, 1 unknown, 0 left in 3.0 s.",
    ]


def test_failures_are_listed_up_to_20_then_counted(plain, stream):
    """The first 20 failures get a line each; later ones are only counted."""
    plain.emit(start({RQ: 100}))
    send_and_finish(plain, 25, ok=False)
    assert len([t for t in texts(stream) if " failed after " in t]) == 20
    assert [t for t in texts(stream) if t.startswith("more than 20 failures")]
    plain.close()
    assert "25 failed" in texts(stream)[-1]


def test_plain_summary_is_an_aligned_table(plain, stream, clock):
    """close() prints per-key done, failed, left, 429s and retries, totals, elapsed."""
    plain.emit(start({RQ: 3, INVITE: 1}))
    plain.emit(JobSent(1.0, RQ, "j1", 1))
    plain.emit(JobRequeued(1.5, RQ, "j1", 1.0, True, "HTTP 429"))
    send_and_finish(plain, 2, at=2.0)
    send_and_finish(plain, 1, at=3.0, key=INVITE, ok=False)
    plain.emit(RunFinished(4.2, stopped=False))
    clock.time = 99.0
    plain.close()
    assert texts(stream)[-6:] == [
        "summary:",
        "  endpoint   done  failed  left  429s  retries",
        "  run-query     2       0     1     1        0",
        "  invite        0       1     0     0        0",
        "  total         2       1     1     1        0",
        "2 done, 1 failed, 1 left in 4.2 s.",
    ]


def test_elapsed_without_run_finished_reads_the_clock(plain, stream, clock):
    """If the run never reported its end, elapsed time runs to close()."""
    plain.emit(start({RQ: 1}))
    clock.time = 200.0
    plain.close()
    assert texts(stream)[-1] == "0 done, 0 failed, 1 left in 3 m 20 s."


def test_stopped_run_leaves_the_resume_hint_to_the_exit_message(plain, stream):
    """A stopped run's log ends with its counts; "Stopped early" is said once,
    with the exit code, not here as well."""
    plain.emit(start({RQ: 10}))
    send_and_finish(plain, 2)
    plain.emit(RunFinished(3.0, stopped=True))
    plain.close()
    assert texts(stream)[-1] == "2 done, 0 failed, 8 left in 3.0 s."
    assert "Stopped early" not in stream.getvalue()


@pytest.mark.parametrize("mode", ["plain", "live"])
def test_close_prints_the_summary_once(request, stream, mode):
    """close() is idempotent: a second call prints nothing more."""
    sink = request.getfixturevalue(mode)
    sink.emit(start({RQ: 1}))
    sink.close()
    after_first = stream.getvalue()
    sink.close()
    assert stream.getvalue() == after_first
    assert after_first.lower().count("summary") == 1


def test_close_before_start_prints_nothing(plain, stream):
    """A run that never started (an error before it) leaves no empty summary."""
    plain.close()
    assert stream.getvalue() == ""


def test_events_outside_the_run_are_ignored(plain, stream):
    """Events before the start or of keys without jobs neither raise nor print."""
    plain.emit(SlotWait(0.0, RQ, 5.0))
    plain.emit(start({RQ: 1, INVITE: 0}))
    plain.emit(SlotWait(20.0, LimitKey.GLOBAL, None))
    plain.emit(JobSent(20.0, INVITE, "i1", 1))
    assert len(lines(stream)) == 1


def test_broken_stream_does_not_raise(clock):
    """A closed pipe under the plain log does not stop the run."""

    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    sink = open_progress(Broken(), live=False, clock=clock)
    sink.emit(start({RQ: 1}))
    sink.close()


def test_negative_interval_is_refused(stream, clock):
    """A negative `every` is refused when the sink is built."""
    with pytest.raises(ValueError, match="every must be at least 0 s"):
        open_progress(stream, live=False, clock=clock, every=-1.0)


def test_terminal_gets_the_live_view(clock):
    """With `live` unset, a terminal stream gets Rich's view, with escape codes."""
    stream = TTY()
    sink = open_progress(stream, clock=clock)
    sink.emit(start({RQ: 1}))
    sink.close()
    assert "\x1b[" in stream.getvalue()


def test_pipe_gets_plain_lines(stream, clock):
    """With `live` unset, a stream that is not a terminal gets plain lines."""
    sink = open_progress(stream, clock=clock)
    sink.emit(start({RQ: 1}))
    assert stream.getvalue().splitlines()[0].endswith("ETA 0 ms")
    assert "\x1b" not in stream.getvalue()


def test_live_row_shows_done_total_and_429s(live, stream):
    """Each key's row shows its rule, done/total, failed, 429s, retries, in flight."""
    live.emit(start({RQ: 10, INVITE: 5}))
    send_and_finish(live, 3)
    live.emit(JobSent(2.0, RQ, "j3", 1))
    live.emit(JobRequeued(2.0, RQ, "j3", 1.0, True, "HTTP 429"))
    live.emit(JobSent(3.0, RQ, "j3", 2))
    live.emit(JobRequeued(3.0, RQ, "j3", 1.0, True, "HTTP 429"))
    live.emit(JobSent(4.0, RQ, "j4", 1))
    live.close()
    cells = row(last_frame(stream), RQ).split()
    assert cells[:7] == ["run-query", "30/2s", "3/10", "0", "2", "0", "1"]
    assert row(last_frame(stream), INVITE).split()[:3] == ["invite", "15/5m", "0/5"]


def test_live_eta_is_computed_from_the_rule(live, stream):
    """The view's ETA for 60 jobs at 30/2s is eta()'s 2.0 s, per key and overall."""
    live.emit(start({RQ: 60}, {RQ: "30/2s"}))
    live.close()
    frame = last_frame(stream)
    assert row(frame, RQ).endswith("2.0 s")
    assert "ETA 2.0 s" in frame


@pytest.mark.parametrize(
    ("until", "expected"),
    [
        pytest.param(13.2, "3.2 s", id="slot-later"),
        pytest.param(None, "on answer", id="answer"),
        pytest.param(9.0, "now", id="slot-passed"),
    ],
)
def test_live_next_slot(live, stream, clock, until, expected):
    """The next-slot cell reads the latest SlotWait against the clock."""
    live.emit(start({RQ: 10}))
    live.emit(SlotWait(5.0, RQ, until))
    clock.time = 10.0
    live.close()
    assert expected in row(last_frame(stream), RQ)


def test_live_finished_key_has_no_next_slot(live, stream):
    """A key whose jobs all ended shows a dash for its next slot and ETA."""
    live.emit(start({RQ: 2}))
    send_and_finish(live, 2)
    live.close()
    assert row(last_frame(stream), RQ).split()[-2:] == ["—", "—"]


def test_live_shows_the_last_three_failures(live, stream):
    """Under the table, the view lists the three most recent failure reasons."""
    live.emit(start({RQ: 10}))
    send_and_finish(live, 5, ok=False)
    live.close()
    frame = last_frame(stream)
    shown = [line.strip() for line in frame.splitlines() if "failed after" in line]
    assert [line.split()[1] for line in shown] == ["j2", "j3", "j4"]


def test_live_summary_and_closing_line(live, stream):
    """The live view ends with the summary table and the counts line."""
    live.emit(start({RQ: 10}))
    send_and_finish(live, 4)
    live.emit(RunFinished(5.0, stopped=True))
    live.close()
    text = ANSI.sub("", stream.getvalue())
    summary = text[text.rindex("Summary") :].splitlines()
    assert any(line.split() == ["total", "4", "0", "6", "0", "0"] for line in summary)
    assert summary[-1] == "4 done, 0 failed, 6 left in 5.0 s."


def test_live_rows_fit_80_columns(live, stream):
    """At 80 columns no cell is cut: the longest key, a two-window rule, 4-digit
    counts, a long next slot and ETA all show whole."""
    live.emit(start({RQ: 2000, INVITE: 200}, {RQ: "15/1m+500/1h", INVITE: "15/5m"}))
    live.emit(SlotWait(0.0, RQ, 733.0))
    live.close()
    cells = row(last_frame(stream), RQ).split()
    assert "…" not in last_frame(stream)
    assert cells[:3] == ["run-query", "15/1m+500/1h", "0/2,000"]
    # The ETA starts from the next slot: 12 m 13 s, then 3 h 33 m of the rule.
    assert " ".join(cells[-8:]) == "12 m 13 s 3 h 45 m"
    assert max(map(len, ANSI.sub("", stream.getvalue()).splitlines())) <= 80


def test_a_note_prints_above_the_live_view(live, stream):
    """A note during the live view goes through its console, above the view,
    so the next redraw does not erase it."""
    live.emit(start({RQ: 10}))
    live.note(Stopping(Cause.SIGINT))
    live.close()
    text = ANSI.sub("", stream.getvalue())
    assert "Ctrl-C (again to stop at once): starting no new requests" in text
    assert text.index("Ctrl-C (again") < text.rindex("Summary")


def test_a_note_outside_the_live_view_goes_to_notes(stream, clock):
    """Before the view starts, a note goes to the `notes` callback (stderr)."""
    said: list[News] = []
    sink = open_progress(stream, live=True, clock=clock, notes=said.append)
    sink.note(Stopping(Cause.SIGTERM))
    sink.close()
    assert said == [Stopping(Cause.SIGTERM)]
    assert stream.getvalue() == ""


def test_plain_notes_go_to_notes(stream, clock):
    """The plain log hands notes to the `notes` callback, not to its own lines."""
    said: list[News] = []
    sink = open_progress(stream, live=False, clock=clock, notes=said.append)
    sink.note(Stopping(Cause.DEADLINE))
    assert said == [Stopping(Cause.DEADLINE)]
    assert stream.getvalue() == ""


def test_dumb_terminal_gets_plain_lines(clock, monkeypatch):
    """TERM=dumb: a terminal that cannot move the cursor gets plain lines."""
    monkeypatch.setenv("TERM", "dumb")
    stream = TTY()
    sink = open_progress(stream, clock=clock)
    sink.emit(start({RQ: 1}))
    sink.close()
    assert "\x1b" not in stream.getvalue()
    assert "starting: 1 jobs" in stream.getvalue()


def _has_colour(stream):
    """Whether any SGR code sets a foreground or background colour."""
    codes = re.findall(r"\x1b\[([0-9;]*)m", stream.getvalue())
    params = {int(p) for code in codes for p in code.split(";") if p}
    return any(30 <= p <= 48 or 90 <= p <= 107 for p in params)


def test_live_view_has_colour_by_default(clock, monkeypatch):
    """Without NO_COLOR the live view colours its failures (the control case)."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    stream = TTY()
    sink = open_progress(stream, live=True, clock=clock)
    sink.emit(start({RQ: 2}))
    send_and_finish(sink, 1, ok=False)
    sink.close()
    assert _has_colour(stream)


@pytest.mark.parametrize("how", ["NO_COLOR", "color=False"])
def test_no_color_is_honoured(clock, monkeypatch, how):
    """NO_COLOR (set, not empty) or color=False (--no-color): no colour codes."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    if how == "NO_COLOR":
        monkeypatch.setenv("NO_COLOR", "1")
    stream = TTY()
    sink = open_progress(stream, live=True, clock=clock, color=how == "NO_COLOR")
    sink.emit(start({RQ: 2}))
    send_and_finish(sink, 1, ok=False)
    sink.close()
    assert not _has_colour(stream)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        pytest.param(0.85, "850 ms", id="ms"),
        pytest.param(-0.5, "0 ms", id="negative"),
        pytest.param(4.2, "4.2 s", id="seconds"),
        pytest.param(59.97, "1 m 0 s", id="rounds-up-to-a-minute"),
        pytest.param(200, "3 m 20 s", id="minutes"),
        pytest.param(14_340, "3 h 59 m", id="hours"),
        pytest.param(3599.7, "1 h 0 m", id="rounds-up-to-an-hour"),
    ],
)
def test_spoken_durations(seconds, expected):
    """Durations read as ms, tenths of seconds, m and s, or h and m."""
    assert durations.spoken(seconds) == expected


def test_first_requeues_get_a_line_each(plain, stream):
    """The first 20 requeues are named with their reason and delay, then counted."""
    plain.emit(start({RQ: 30}))
    for i in range(25):
        plain.emit(JobSent(0.0, RQ, f"j{i}", 1))
        limited = i % 2 == 0
        reason = "HTTP 429" if limited else "HTTP 503"
        plain.emit(JobRequeued(0.0, RQ, f"j{i}", 1.5, limited, reason))
    lines = [t for t in texts(stream) if "requeued" in t]
    assert len(lines) == 20
    assert (
        lines[0]
        == "job j0 (run-query): 429 (rate limited); requeued, next try in 1.5 s"
    )
    assert lines[1] == "job j1 (run-query): HTTP 503; requeued, next try in 1.5 s"
    assert (
        texts(stream)[-1] == "further requeues are only counted (--verbose lists all)"
    )


def test_requeue_line_carries_the_retry_after_note(plain, stream):
    """A capped Retry-After is said on the requeue line."""
    plain.emit(start({RQ: 1}))
    plain.emit(JobSent(0.0, RQ, "j", 1))
    reason = "HTTP 429; Retry-After of 86400 s capped at 900 s"
    plain.emit(JobRequeued(0.0, RQ, "j", 900.0, True, reason))
    assert (
        "429 (rate limited); Retry-After of 86400 s capped at 900 s"
        in texts(stream)[-1]
    )


def test_a_learned_rule_is_a_plain_line_and_marks_the_live_rule(plain, stream):
    """RuleLearned prints one line naming the new rule and why; the board's rule
    for the key becomes it, marked as learned."""
    plain.emit(start())
    plain.emit(
        RuleLearned(1.0, RQ, parse_rule("10/2s"), False, Evidence(Because.REFUSED, 8))
    )
    assert (
        "run-query: the server allows less than the rule; now 10/2s"
        in stream.getvalue()
    )
    assert "(8 requests refused)" in stream.getvalue()


def test_live_row_marks_a_learned_rule(live, stream):
    """The live table marks a learned rule with `*`, said under the table, so the
    rule column never wraps."""
    live.emit(start())
    live.emit(
        RuleLearned(1.0, RQ, parse_rule("10/2s"), True, Evidence(Because.REFUSED, 2))
    )
    live.close()
    frame = last_frame(stream)
    assert row(frame, RQ).split()[1:3] == ["10/2s*", "0/10"]
    assert "* learned from the server's answers, sent evenly spaced" in frame


def test_live_rule_column_does_not_wrap_at_80_columns(live, stream):
    """A learned two-window rule beside 4-digit counts stays on its row."""
    live.emit(start({RQ: 1200, INVITE: 200}, {RQ: "15/1m+500/1h", INVITE: "15/5m"}))
    live.emit(
        RuleLearned(
            1.0, RQ, parse_rule("15/10s+500/1h"), False, Evidence(Because.REFUSED, 2)
        )
    )
    live.close()
    frame = last_frame(stream).splitlines()
    rows = [line for line in frame if line.strip()][1:]
    assert rows[1].split()[:3] == ["run-query", "15/10s+500/1h*", "0/1,200"]
    assert rows[2].split()[0] == "invite"


def test_the_finished_bar_says_done(live, stream, clock):
    """Once every job ended the bar says done, not `ETA 0 ms`."""
    live.emit(start({RQ: 3}))
    send_and_finish(live, 3)
    clock.time = 2.0
    live.emit(RunFinished(2.0, stopped=False))
    live.close()
    frame = last_frame(stream)
    bar = next(line for line in frame.splitlines() if "elapsed" in line)
    assert bar.rstrip().endswith("done")
    assert "ETA" not in bar


def test_the_bar_uses_a_wide_terminal(stream, clock, monkeypatch):
    """At 120 columns the bar grows into the width the 80-column view leaves."""
    widths = {}
    for columns in ("80", "120"):
        monkeypatch.setenv("COLUMNS", columns)
        out = io.StringIO()
        sink = open_progress(out, live=True, clock=clock)
        sink.emit(start({RQ: 10}))
        sink.close()
        text = ANSI.sub("", out.getvalue()).replace("\r", "\n")
        bar = next(ln for ln in text.splitlines() if "elapsed" in ln)
        widths[columns] = len(bar.split(" 0/10")[0].strip())
    assert widths["120"] >= widths["80"] + 35


@pytest.mark.parametrize(
    ("earlier", "said"),
    [
        pytest.param({}, "20 done, 0 failed, 0 left in", id="first-run"),
        pytest.param(
            {"done": 70, "failed": 0, "unknown": 0},
            "90 of 90 done (20 in this run), 0 failed, 0 left in",
            id="resumed",
        ),
        pytest.param(
            {"done": 1180, "failed": 3, "unknown": 2},
            "1,200 of 1,205 done (20 in this run), 3 failed, 2 unknown, 0 left in",
            id="resumed-with-failures",
        ),
    ],
)
def test_a_resumed_summary_counts_the_whole_file(stream, clock, earlier, said):
    """The counts line after a resume is the file's, with this run's beside it."""
    sink = open_progress(
        stream,
        live=False,
        clock=clock,
        wall=lambda: datetime(2024, 5, 1, 12),
        earlier=earlier,
    )
    sink.emit(start({RQ: 20}))
    send_and_finish(sink, 20)
    sink.close()
    assert said in texts(stream)[-1]


def test_numbers_have_thousands_separators(plain, stream, clock):
    """Counts read 1,200 in the start line, progress, summary and counts line."""
    plain.emit(start({RQ: 1200}, {RQ: "15/1m+500/1h"}))
    send_and_finish(plain, 1000, at=0.0, step=0.0101)
    clock.time = 20.0
    plain.close()
    text = "\n".join(texts(stream))
    assert "starting: 1,200 jobs — run-query 1,200 at" in text
    assert "progress: 991/1,200 done" in text
    assert re.search(r"run-query +1,000 +0 +200", text)
    assert "1,000 done, 0 failed, 200 left in" in text


def test_a_terminal_gets_plain_lines_cut_only_between_words(clock, monkeypatch):
    """Plain lines on a terminal wrap at words, continuations indented, a number
    kept with its unit; never cut mid-word by the terminal's edge."""
    monkeypatch.setenv("COLUMNS", "60")
    tty = TTY()
    sink = open_progress(
        tty, live=False, clock=clock, wall=lambda: datetime(2024, 5, 1, 12)
    )
    sink.emit(start({RQ: 10}))
    sink.note(Stopping(Cause.DEADLINE))
    sink.emit(
        finished(
            "j1", ok=False, error="sandbox runs are not kept (their state is temporary)"
        )
    )
    sink.close()
    shown = tty.getvalue().splitlines()
    assert max(map(len, shown)) <= 60
    assert any(line.startswith("  ") for line in shown)
    assert "temporary)" in " ".join(shown).split()


@pytest.mark.parametrize("width", range(20, 70, 3))
def test_fitted_lines_break_only_between_words(width):
    """`fitted` keeps every word whole, a number with its unit, and the indent."""
    text = "  avatar responses: 200: 10; p50 1 ms, p95 15 ms, max 1 m 5 s " * 2
    shown = fitted(text.strip("\n"), width).splitlines()
    assert " ".join(shown).split() == text.split()
    assert all(len(line) <= width for line in shown)
    assert all(line.startswith("  ") for line in shown)
    for before, after in itertools.pairwise(shown):
        assert not (before[-1].isdigit() and after.split()[0] in ("ms", "s", "m"))


def test_the_eta_counts_what_other_processes_used(plain, stream):
    """One invite left at 15/5m, but the ledger holds 15 sends of the last minute
    (another process): the ETA is the 4 m until the window frees, not 0 ms."""
    rules = {INVITE: parse_rule("15/5m")}
    used = {INVITE: [60.0] * 15}
    plain.emit(RunStarted(120.0, {INVITE: 1}, rules, Pace.EXACT, used))
    assert texts(stream)[0].endswith("ETA 4 m 0 s")


def test_the_eta_waits_for_the_next_slot_and_a_cool_down(plain, stream):
    """A Retry-After of 100 s on the key's 429: the ETA is no sooner than the next
    slot, which the live view shows too."""
    board = Board()
    board.apply(start({RQ: 2}, {RQ: "30/2s"}, at=0.0))
    board.apply(JobSent(1.0, RQ, "j1", 1))
    board.apply(JobRequeued(1.0, RQ, "j1", 100.0, True, "HTTP 429"))
    assert board.eta(1.0) == pytest.approx(100.0)
    assert next_slot(board.keys[RQ], 1.0) == durations.spoken(100.0)
    board.apply(SlotWait(2.0, RQ, 150.0))
    assert board.eta(2.0) == pytest.approx(148.0)


def sink_with(stream, clock, verbosity, *, live=False):
    return open_progress(
        stream,
        live=live,
        clock=clock,
        wall=lambda: datetime(2024, 5, 1, 12),
        verbosity=verbosity,
    )


def test_verbose_lists_every_requeue(stream, clock):
    sink = sink_with(stream, clock, 1)
    sink.emit(start({RQ: 30}))
    for i in range(25):
        sink.emit(JobSent(0.0, RQ, f"j{i}", 1))
        sink.emit(JobRequeued(0.0, RQ, f"j{i}", 1.5, True, "HTTP 429"))
    assert len([t for t in texts(stream) if "requeued" in t]) == 25


def test_quiet_says_only_failures_and_the_summary(stream, clock):
    """No start line, progress, requeues or lessons; the failures and the
    summary still come, and a terminal gets plain lines, not a live view."""
    sink = sink_with(stream, clock, -1, live=True)
    sink.emit(start({RQ: 4}))
    sink.emit(JobSent(0.0, RQ, "r", 1))
    sink.emit(JobRequeued(0.0, RQ, "r", 1.5, True, "HTTP 429"))
    send_and_finish(sink, 3, at=20.0)
    sink.emit(JobSent(30.0, RQ, "bad", 1))
    sink.emit(finished("bad", at=30.0, ok=False, error="HTTP 404"))
    sink.close()
    said = texts(stream)
    assert not any(t.startswith(("starting:", "progress:", "job r ")) for t in said)
    assert any("bad" in t and "HTTP 404" in t for t in said)
    assert "summary:" in said
    assert "\x1b[" not in stream.getvalue()


def test_the_live_view_says_while_concurrency_sets_the_pace(live, stream, clock):
    """While the cap on requests in flight holds back requests the limit has
    room for, the view says so under its table; the summary says for how
    long (here 3.5 s of 4.0 s), naming --concurrency when the user gave it."""
    live.emit(start({RQ: 10}))
    live.emit(InFlightCapped(0.5, 8, given=True))
    send_and_finish(live, 3)
    clock.time = 4.0
    live.close()
    said = "Concurrency sets the pace, not the limit: 8 in flight at most"
    assert said in " ".join(last_frame(stream).split())
    summary = ANSI.sub("", stream.getvalue())
    summary = " ".join(summary[summary.rindex("Summary") :].split())
    assert (
        "Concurrency, not the limit, set the pace for 3.5 s of 4.0 s: 8 in flight "
        "at most (--concurrency 8)." in summary
    )
