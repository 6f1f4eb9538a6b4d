"""The exit codes: the code an escaping exception ends with (`errors.code_of`), as
the metrics file is told it; the code a stopped run ends with (`exit_code`, from
its `Stop` and counts); and the one table of them that `submit --help`, the README
and the troubleshooting page say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from batchrun.cli import terminal
from batchrun.core.errors import (
    DiskFull,
    Exit,
    JobsFileError,
    LedgerLost,
    RunLocked,
    UsageError,
    code_of,
)
from batchrun.run.exit_code import Cause, Ending, Stop, exit_code

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(UsageError("x"), 2, id="usage"),
        pytest.param(JobsFileError("f", [(2, "bad")], 1), 2, id="jobs-file"),
        pytest.param(RunLocked("x"), 3, id="locked"),
        pytest.param(LedgerLost("x"), 74, id="state"),
        pytest.param(KeyboardInterrupt(), 130, id="ctrl-c"),
        pytest.param(ValueError("bug"), 70, id="bug"),
        pytest.param(
            ExceptionGroup("g", [UsageError("a"), DiskFull("b")]), 74, id="state-first"
        ),
        pytest.param(
            ExceptionGroup("g", [UsageError("a"), ValueError("b")]), 70, id="mixed"
        ),
        pytest.param(
            BaseExceptionGroup("g", [KeyboardInterrupt()]), 130, id="group-ctrl-c"
        ),
    ],
)
def test_an_exception_ends_with_the_code_the_command_line_gives(exc, code):
    """As `terminal.reported` and `main` report them: a group's StateError
    first, 130 for Ctrl-C alone, 70 for anything that is not a BatchrunError."""
    assert code_of(exc) == code


def _stop(*causes: Cause) -> Stop:
    stop = Stop.of(causes[0], f"{causes[0]}!")
    for cause in causes[1:]:
        stop = stop.then(Stop.of(cause, f"{cause}!"))
    return stop


@pytest.mark.parametrize(
    ("causes", "code"),
    [
        pytest.param((Cause.DEADLINE,), 75, id="deadline"),
        pytest.param((Cause.LEDGER_LOST,), 75, id="ledger-lost"),
        pytest.param((Cause.DEADLINE, Cause.HALT), 1, id="halt-beats-deadline"),
        pytest.param((Cause.LEDGER_LOST, Cause.HALT), 1, id="halt-beats-lost"),
        pytest.param((Cause.HALT, Cause.BREAKER), 69, id="breaker-beats-halt"),
        pytest.param((Cause.BREAKER, Cause.DEADLINE), 69, id="breaker-first"),
        pytest.param((Cause.BREAKER, Cause.SIGTERM), 143, id="signal-beats-all"),
        pytest.param((Cause.SIGINT, Cause.SIGTERM), 130, id="first-signal-kept"),
        pytest.param((Cause.SIGTERM, Cause.SIGINT), 143, id="first-signal-kept-2"),
    ],
)
def test_a_stop_ends_with_the_code_of_its_foremost_cause(causes, code):
    """A signal's code wins (the first of two), then the breaker's, then a
    halt's, then a deadline's or a lost ledger's."""
    stop = _stop(*causes)
    assert stop.code == code
    assert [cause for cause, _ in stop.causes] == list(causes)
    for cause in causes:
        assert stop.reason(cause) == f"{cause}!"


def test_failures_and_jobs_left_rank_between_the_stops():
    """Failures beat a stop's 75 but not the breaker's 69 or a signal's; jobs
    left with no stop are 75; nothing left, nothing failed is 0."""
    assert exit_code(None, failed=0, left=0) == 0
    assert exit_code(None, failed=0, left=3) == 75
    assert exit_code(None, failed=2, left=3) == 1
    assert exit_code(Stop.of(Cause.DEADLINE), failed=0, left=0) == 75
    assert exit_code(Stop.of(Cause.DEADLINE), failed=1, left=3) == 1
    assert exit_code(Stop.of(Cause.BREAKER), failed=1, left=3) == 69
    assert exit_code(Stop.of(Cause.SIGINT), failed=1, left=3) == 130


def test_a_stop_keeps_the_first_state_error_only():
    """The ledger lost then a full disk: the run stopped on the lost ledger."""
    lost, full = LedgerLost("gone"), DiskFull("full")
    stop = Stop.failing(lost).then(Stop.of(Cause.HALT, "h")).then(Stop.failing(full))
    assert stop.error is lost
    assert [cause for cause, _ in stop.causes] == [Cause.LEDGER_LOST, Cause.HALT]
    assert Stop.failing(full).cause is Cause.STATE


def test_the_end_of_a_stopped_run_is_said_with_its_reasons():
    """The halt's reason is said even when a signal's code wins; after the
    breaker, the jobs left wait for the fix."""
    said: list[str] = []
    halted = Stop.of(Cause.HALT, "3 job(s) failed").then(Stop.of(Cause.SIGINT))
    end = Ending(Exit.INTERRUPTED, halted, left=4, unknown=2)
    assert terminal.said_ending(end, said.append) == 130
    assert said[0].startswith("2 invite(s) may or may not have been sent")
    assert said[1] == (
        "Halted: 3 job(s) failed. Stopped early with 4 job(s) left: run the same "
        "command to resume."
    )
    said.clear()
    tripped = Ending(Exit.UNAVAILABLE, Stop.of(Cause.BREAKER, "401"), left=1)
    assert terminal.said_ending(tripped, said.append) == 69
    assert said == [
        "Stopped early with 1 job(s) left: once that is fixed, run the same "
        "command to send them."
    ]
    assert terminal.said_ending(Ending(Exit.OK), said.append) == 0
    assert len(said) == 1


def test_every_exit_code_has_its_meaning():
    """The table of codes and the table of their words hold the same codes."""
    assert set(terminal.MEANINGS) == set(Exit)


def test_the_readme_table_is_the_table_of_exit_codes():
    """README's "Exit codes" table, row by row, and which code wins."""
    rows = [f"| {code} | {terminal.MEANINGS[code].meaning} |" for code in sorted(Exit)]
    table = "\n".join(["| code | meaning |", "|---|---|", *rows])
    readme = (ROOT / "README.md").read_text()
    assert f"## Exit codes\n\n{table}\n" in readme
    assert f"When several apply, {terminal.precedence()}." in readme


def test_the_troubleshooting_page_has_a_section_per_exit_code():
    """One section per code (the signals share one), headed with its meaning,
    in the table's order; and which code wins."""
    headed: dict[str, list[str]] = {}
    for code in sorted(Exit):
        heading = terminal.MEANINGS[code].heading
        if heading is not None:
            headed.setdefault(heading, []).append(str(code))
    expected = [f"## {' and '.join(codes)}: {h}" for h, codes in headed.items()]
    page = (ROOT / "docs" / "guide" / "troubleshooting.md").read_text()
    found = re.findall(r"^## \d.*$", page, flags=re.MULTILINE)
    assert found == expected
    flat = " ".join(page.split())
    assert f"When several codes apply, {terminal.precedence()}." in flat


def test_submit_help_ends_with_the_table_of_exit_codes():
    """The epilog names every code `submit` can end with, in the words of the
    table, and which wins."""
    epilog = terminal.exit_codes_epilog()
    for code, meaning in terminal.MEANINGS.items():
        if meaning.brief is not None:
            assert f" {code} {meaning.brief}" in epilog
    assert "A signal's code wins, then 69, then 1, then 75." in epilog
