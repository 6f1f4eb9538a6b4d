"""A crontab line that runs `batchrun submit` as written, under cron's bare environment.

cron starts a command with `/bin/sh`, `PATH=/usr/bin:/bin` and little else: no venv,
no exported variables, no current folder. So the line names everything absolutely
(the Python that runs batchrun, the jobs file, the state folder, the log), makes the
log's folder, and reads secrets (the token, a ledger URL with a password) from an
env file rather than holding them: a crontab is readable by `crontab -l` and lands
in backups. It never holds the token.

The schedule is checked, and its next run found, by cronsim (the cron arithmetic of
Healthchecks.io), in the machine's local time as cron keeps it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import cronsim

from batchrun.core.errors import UsageError

# Options that would put a secret in the crontab.
_SECRET_OPTIONS = ("--token", "--ledger")
# The @words of crontab(5), as the five fields each stands for; @reboot has none.
_WORDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
REBOOT = "@reboot"
_EXAMPLE = "e.g. '0 1 * * *' (01:00 every night) or @daily."


@dataclass(frozen=True, slots=True, kw_only=True)
class CronJob:
    """What one crontab line runs; every path absolute."""

    schedule: str
    python: Path
    jobs_file: Path
    state_dir: Path
    log: Path
    env_file: Path | None = None
    base_url: str | None = None
    deadline: str | None = None
    extra: Sequence[str] = ()
    # Run from here, so that submit reads the project's batchrun.toml.
    folder: Path | None = None

    def __post_init__(self) -> None:
        next_run(self.schedule, datetime(2000, 1, 1))
        for option in self.extra:
            if option.split("=", 1)[0] in _SECRET_OPTIONS:
                msg = (
                    f"{option.split('=', 1)[0]} would put a secret in the crontab: "
                    "set BATCHRUN_TOKEN or BATCHRUN_LEDGER_URL in a file only you "
                    "can read, and pass it with --env-file."
                )
                raise UsageError(msg)


def next_run(schedule: str, after: datetime) -> datetime | None:
    """When cron next starts a line of `schedule` after `after` (naive local time);
    None for @reboot, which runs at boot.

    Raises:
        UsageError: not five cron fields cron can run, nor an @word of crontab(5).
    """
    words = schedule.split()
    if words == [REBOOT]:
        return None
    fields = _WORDS.get(words[0], "") if len(words) == 1 else " ".join(words)
    if len(fields.split()) != 5:
        msg = f"--schedule must be five cron fields or an @word, got {schedule!r}; "
        raise UsageError(msg + _EXAMPLE)
    try:
        return next(cronsim.CronSim(fields, after))
    except (cronsim.CronSimError, StopIteration) as exc:
        msg = f"--schedule {schedule!r} is not a cron schedule ({exc}); "
        raise UsageError(msg + _EXAMPLE) from None


def crontab_line(job: CronJob) -> str:
    """One line for `crontab -e`: the schedule, then a command for `/bin/sh`."""
    return f"{' '.join(job.schedule.split())} {_escaped(command(job))}"


def command(job: CronJob) -> str:
    """The shell command of the line, as `/bin/sh -c` runs it (cron's `%` unescaped)."""
    steps = [] if job.folder is None else [f"cd {_q(job.folder)}"]
    if job.env_file is not None:
        # set -a exports plain KEY=value lines too (the systemd/Docker env format).
        steps.append(f"set -a && . {_q(job.env_file)} && set +a")
    steps.append(" ".join(_q(word) for word in _submit_words(job)))
    # The braces send a missing env file's error to the log too, not to cron mail.
    logged = "{ " + " && ".join(steps) + f"; }} >> {_q(job.log)} 2>&1"
    return f"mkdir -p {_q(job.log.parent)} && {logged}"


def _submit_words(job: CronJob) -> list[str | Path]:
    words: list[str | Path] = [job.python, "-m", "batchrun", "submit", job.jobs_file]
    words += ["--state-dir", job.state_dir]
    if job.base_url is not None:
        words += ["--base-url", job.base_url]
    if job.deadline is not None:
        words += ["--deadline", job.deadline]
    return [*words, *job.extra]


def _q(word: str | Path) -> str:
    return shlex.quote(str(word))


def _escaped(text: str) -> str:
    # crontab(5): an unescaped % in the command ends it and starts its stdin.
    return text.replace("%", "\\%")
