"""The exit code a submission that raised ends with (run/exit_code.code_of), as
the metrics file is told it, and the order of the stops' codes (supervisor)."""

from __future__ import annotations

import pytest

from batchrun.core.errors import (
    DiskFull,
    JobsFileError,
    RunLocked,
    StoppedEarly,
    UsageError,
)
from batchrun.run.exit_code import code_of
from batchrun.run.supervisor import _rank


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(UsageError("x"), 2, id="usage"),
        pytest.param(JobsFileError("f", [(2, "bad")], 1), 2, id="jobs-file"),
        pytest.param(RunLocked("x"), 3, id="locked"),
        pytest.param(StoppedEarly("x", exit_code=143), 143, id="sigterm"),
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


def test_a_signal_beats_a_halt_beats_the_deadline():
    """The code a stopped run keeps: a signal's over --halt-after's 1 over 75."""
    assert _rank(None) < _rank(75) < _rank(1) < _rank(143) == _rank(130)
