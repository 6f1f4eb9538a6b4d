"""The crontab line: absolute paths, a log folder made, no secret, cron's `%`."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from batchrun.cli.crontab import CronJob, command, crontab_line, next_run
from batchrun.core.errors import UsageError


def job(**changes):
    fields = {
        "schedule": "0 1 * * *",
        "python": Path("/opt/venv/bin/python"),
        "jobs_file": Path("/data/nightly.csv"),
        "state_dir": Path("/var/lib/batchrun"),
        "log": Path("/data/logs/nightly.log"),
        "deadline": "55m",
    }
    return CronJob(**{**fields, **changes})


def test_the_line_runs_the_venv_python_and_makes_the_log_folder():
    """Schedule, then mkdir -p of the log folder, then the venv's Python by its
    absolute path, stdout and stderr appended to the log."""
    assert crontab_line(job()) == (
        "0 1 * * * mkdir -p /data/logs && { /opt/venv/bin/python -m batchrun submit "
        "/data/nightly.csv --state-dir /var/lib/batchrun --deadline 55m; } "
        ">> /data/logs/nightly.log 2>&1"
    )


def test_an_env_file_is_read_first_and_exported():
    """--env-file: read with set -a, so plain KEY=value lines are exported."""
    text = command(job(env_file=Path("/home/ana/.batchrun.env")))
    assert "{ set -a && . /home/ana/.batchrun.env && set +a && /opt/venv" in text


def test_words_are_quoted_and_percent_escaped_for_cron():
    """A space is quoted for sh; a % is escaped in the line (cron would cut the
    command there) but not in the command sh runs."""
    odd = job(jobs_file=Path("/data/my jobs 100%.csv"))
    assert "'/data/my jobs 100%.csv'" in command(odd)
    assert "'/data/my jobs 100\\%.csv'" in crontab_line(odd)


def test_extra_options_are_passed_on():
    """Options cron-line does not know go to submit, after its own."""
    line = crontab_line(job(extra=("--profile", "a"), base_url="https://api.example"))
    assert line.endswith(
        "--base-url https://api.example --deadline 55m --profile a; } "
        ">> /data/logs/nightly.log 2>&1"
    )


@pytest.mark.parametrize(
    "extra", [("--token", "tok"), ("--token=tok",), ("--ledger", "redis://:pw@h/0")]
)
def test_a_secret_never_goes_in_the_line(extra):
    """--token or --ledger would sit in the crontab: refused, pointing to --env-file."""
    with pytest.raises(UsageError, match="--env-file"):
        job(extra=extra)


@pytest.mark.parametrize(
    "schedule",
    [
        *("0 1 * *", "daily", "0 1 * * * *", "", "@nightly"),
        *("61 1 * * *", "0 24 * * *", "0 1 31 2 *", "0 1 * 13 *", "0 1 * * 8"),
        "*/0 * * * *",
    ],
)
def test_a_bad_schedule_is_refused(schedule):
    """Anything but five fields cron can run or an @word of crontab(5) is
    refused with an example: a minute past 59, February 31st."""
    with pytest.raises(UsageError, match="0 1 \\* \\* \\*"):
        job(schedule=schedule)


def test_an_at_word_schedule_is_kept():
    """@daily and the like are a whole schedule."""
    assert crontab_line(job(schedule="@daily")).startswith("@daily mkdir -p ")


def test_a_project_folder_is_entered_first():
    """With a project folder (one holding batchrun.toml), the line cds there, so
    submit under cron reads the project's config."""
    text = command(job(folder=Path("/data/project")))
    assert "{ cd /data/project && /opt/venv/bin/python -m batchrun submit" in text


FRIDAY = datetime(2026, 11, 27, 16, 50)  # a Friday


@pytest.mark.parametrize(
    ("schedule", "when"),
    [
        ("0 1 * * *", datetime(2026, 11, 28, 1, 0)),
        ("50 16 * * *", datetime(2026, 11, 28, 16, 50)),
        ("*/15 * * * 1-5", datetime(2026, 11, 27, 17, 0)),
        ("0 9 * * mon", datetime(2026, 11, 30, 9, 0)),
        ("0 0 1 1 *", datetime(2027, 1, 1, 0, 0)),
        ("@weekly", datetime(2026, 11, 29, 0, 0)),
        ("@hourly", datetime(2026, 11, 27, 17, 0)),
        ("@monthly", datetime(2026, 12, 1, 0, 0)),
        ("@reboot", None),
    ],
)
def test_the_next_run_is_the_one_cron_starts(schedule, when):
    """The next minute the schedule matches after now, never now itself; @words
    as crontab(5) defines them; @reboot has none."""
    assert next_run(schedule, FRIDAY) == when
