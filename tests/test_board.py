"""The summary's numbers (cli/board.py): answers by code and latency per endpoint."""

from __future__ import annotations

from batchrun.cli.board import Board, closing_lines
from batchrun.core.events import JobAnswered, JobFinished, JobSent, RunStarted, Status
from batchrun.core.limits import LimitKey, Pace, parse_rule

RQ = LimitKey.RUN_QUERY


def test_the_summary_shows_answers_by_code_and_latency():
    """After the counts' table, a line per endpoint: `200: 2, 429: 1; p50 …`."""
    board = Board()
    board.apply(RunStarted(0.0, {RQ: 2}, {RQ: parse_rule("15/1m")}, Pace.EXACT))
    for job, status in [("a", 429), ("a", 200), ("b", 200)]:
        board.apply(JobSent(1.0, RQ, job, 1))
        assert board.apply(JobAnswered(1.5, RQ, job, status, 0.5)) is None
    board.apply(JobFinished(2.0, RQ, "a", Status.DONE, 2, 200, None))
    board.apply(JobFinished(2.0, RQ, "b", Status.DONE, 1, 200, None))
    lines = closing_lines(board, 3.0)
    assert lines[0].startswith("run-query responses: 200: 2, 429: 1; p50 ")
    assert lines[0].endswith(", max 500 ms")
    assert lines[-1] == "2 done, 0 failed, 0 left in 3.0 s."


def test_a_run_without_answers_has_no_response_lines():
    """Nothing sent: the summary is the counts' line alone, as before."""
    board = Board()
    board.apply(RunStarted(0.0, {RQ: 1}, {RQ: parse_rule("15/1m")}, Pace.EXACT))
    assert closing_lines(board, 1.0) == ["0 done, 0 failed, 1 left in 1.0 s."]
