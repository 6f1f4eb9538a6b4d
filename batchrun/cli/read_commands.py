"""The commands that send nothing: validate, status, plan, limits, show, cron-line
and config. `commands` registers them on the Typer app, in the order `--help` lists
them; each hands its flags to `arguments`, asks `query.read_model`, and hands
what it found to `reports`.

Modules that load httpx or Starlette are imported inside the commands that need
them, so `validate` and `status` start fast (start-up matters under cron).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import TYPE_CHECKING

from batchrun.cli import arguments, config, defaults, flags, reports, terminal
from batchrun.core.errors import JobsFileError, UsageError
from batchrun.core.limits import Pace, Profile

if TYPE_CHECKING:
    from pathlib import Path

    from batchrun.query.read_model import StatusReport


def validate(jobs_file: flags.JobsArg, as_json: flags.JsonFlag = False) -> None:
    """Check JOBS_FILE without sending anything: every bad row, or a summary."""
    from batchrun.store.state import check_jobs_file

    with terminal.reported():
        try:
            summary = check_jobs_file(jobs_file)
        except JobsFileError as exc:
            if not as_json:
                raise exc.checked() from None
            terminal.echo([json.dumps(reports.problems_json(exc), indent=2)])
            flags.done(exc.exit_code)
    if as_json:
        terminal.echo([json.dumps(reports.summary_json(jobs_file, summary), indent=2)])
    else:
        terminal.echo(reports.summary_lines(jobs_file, summary))


def status(
    jobs_file: flags.JobsArg,
    state_dir: flags.StateDirOpt = None,
    ledger: flags.LedgerOpt = None,
    base_url: flags.BaseUrlOpt = None,
    token: flags.TokenOpt = None,
    as_json: flags.ScriptJsonFlag = False,
    show: flags.ShowOpt = "20",
    failed_as_jobs: flags.FailedOpt = None,
) -> None:
    """Where the latest run of JOBS_FILE stands: counts, failures, budget, ETA.

    Also the answers by HTTP status code, with their latency.
    """
    from batchrun.query.read_model import status as read_status

    with terminal.reported():
        shown = arguments.shown_count(show)
        common = arguments.resolve(state_dir=state_dir, base_url=base_url, token=token)
        found = read_status(
            jobs_file,
            common.state,
            common.identity.stores,
            ledger_url=ledger,
            shown=shown,
        )
        if failed_as_jobs is not None:
            _export_failed(jobs_file, found, failed_as_jobs)
    if as_json:
        terminal.echo([json.dumps(reports.status_json(jobs_file, found), indent=2)])
    else:
        terminal.echo(reports.status_lines(jobs_file, found))


def _export_failed(jobs_file: Path, found: StatusReport, dest: Path) -> None:
    """--failed-as-jobs: the latest run's failed jobs, as a jobs file at `dest`."""
    from batchrun.jobs.extract import extract
    from batchrun.query.read_model import failed_ids

    copied = extract(jobs_file, dest, failed_ids(found))
    terminal.to_stderr(
        f"{copied.written} failed job(s) written to {dest}: fix them, then "
        f"`batchrun submit {dest}`."
    )
    if copied.missing:
        terminal.to_stderr(
            f"{len(copied.missing)} failed job(s) are no longer in {jobs_file} "
            "(changed since the run): not copied."
        )


def plan(
    ctx: flags.Context,
    jobs_file: flags.JobsArg,
    profile: flags.ProfileOpt = Profile.B,
    limit: flags.LimitOpt = None,
    pace: flags.PaceOpt = Pace.EXACT,
    state_dir: flags.StateDirOpt = None,
    ledger: flags.LedgerOpt = None,
    base_url: flags.BaseUrlOpt = None,
    token: flags.TokenOpt = None,
    budget_key: flags.BudgetKeyOpt = None,
    time_scale: flags.TimeScaleOpt = 1.0,
    as_json: flags.JsonFlag = False,
) -> None:
    """How long the jobs of JOBS_FILE not yet done take (nothing is sent)."""
    from batchrun.query.read_model import ended_badly
    from batchrun.query.read_model import plan as make_plan

    limit = flags.with_file_limits(ctx, limit)
    with terminal.reported():
        arguments.check_time_scale(
            time_scale, sandbox=base_url is None, base_url=base_url
        )
        common = arguments.resolve(
            state_dir=state_dir,
            base_url=base_url,
            token=token,
            budget_key=budget_key,
            ledger=ledger,
            profile=profile,
            limit=limit,
            time_scale=time_scale,
        )
        fallback = common.limits.fallback
        names = common.identity.stores
        plans = make_plan(
            jobs_file,
            common.limits.rules,
            pace,
            common.state,
            common.identity.client,
            ledger_url=common.ledger_url,
            fallback=fallback,
            names=names,
        )
        ended = ended_badly(jobs_file, common.state, names)
    if as_json:
        terminal.echo([json.dumps(reports.plan_json(jobs_file, plans), indent=2)])
        return
    lines = reports.plan_lines(plans) if plans else [reports.nothing_left(*ended)]
    if any(item.key in fallback for item in plans):
        statement_a = common.limits.under(Profile.A)
        lines.append(reports.auto_line(fallback, statement_a))
    terminal.echo(lines)


def limits_command(
    ctx: flags.Context,
    base_url: flags.BaseUrlOpt = None,
    token: flags.TokenOpt = None,
    budget_key: flags.BudgetKeyOpt = None,
    profile: flags.ProfileOpt = Profile.B,
    limit: flags.LimitOpt = None,
    state_dir: flags.StateDirOpt = None,
    ledger: flags.LedgerOpt = None,
    forget: flags.ForgetOpt = None,
    as_json: flags.ScriptJsonFlag = False,
) -> None:
    """The rule each key is paced by for a client, and what was learned of it."""
    from batchrun.query.read_model import forget as forget_learned
    from batchrun.query.read_model import limits as learned_limits

    limit = flags.with_file_limits(ctx, limit)
    with terminal.reported():
        common = arguments.resolve(
            state_dir=state_dir,
            base_url=base_url,
            token=token,
            budget_key=budget_key,
            ledger=ledger,
            profile=profile,
            limit=limit,
        )
        client = _learning_client(common)
        asked = arguments.forgotten(forget)
        paths = common.state.made() if asked else common.state
        forgotten = (
            forget_learned(asked, paths, client, ledger_url=ledger) if asked else []
        )
        found = learned_limits(
            common.limits.rules,
            paths,
            client,
            ledger_url=ledger,
            fallback=common.limits.fallback,
        )
    if as_json:
        terminal.echo([json.dumps(reports.limits_json(found), indent=2)])
    else:
        terminal.echo(reports.limits_lines(found, asked, forgotten))


def _learning_client(common: arguments.Common) -> str:
    """The client whose limits `limits` shows: it needs a base URL or a
    --budget-key."""
    if not common.identity.named:
        msg = (
            "limits are learned per client: give its --base-url "
            "(or BATCHRUN_BASE_URL) and its token, or its --budget-key"
        )
        raise UsageError(msg)
    return common.identity.client


def show(
    jobs_file: flags.JobsArg,
    job_id: flags.JobIdArg,
    results: flags.ResultsOpt = None,
    state_dir: flags.StateDirOpt = None,
    base_url: flags.BaseUrlOpt = None,
    token: flags.TokenOpt = None,
    as_json: flags.JsonFlag = False,
) -> None:
    """One job of JOBS_FILE's latest run: its state, attempts, error and response."""
    from batchrun.query.read_model import show as find

    with terminal.reported():
        common = arguments.resolve(state_dir=state_dir, base_url=base_url, token=token)
        shown = find(jobs_file, job_id, common.state, common.identity.stores, results)
    if as_json:
        terminal.echo([json.dumps(reports.show_json(shown), indent=2)])
    else:
        terminal.echo(reports.show_lines(shown))


def cron_line(
    ctx: flags.Context,
    jobs_file: flags.JobsArg,
    schedule: flags.ScheduleOpt = "0 1 * * *",
    deadline: flags.CronDeadlineOpt = "55m",
    log: flags.LogOpt = None,
    env_file: flags.EnvFileOpt = None,
    state_dir: flags.StateDirOpt = None,
    base_url: flags.BaseUrlOpt = None,
) -> None:
    """Print a crontab line that runs `submit JOBS_FILE` under cron.

    The line works in cron's bare environment; other options (--profile a,
    --limit …) are passed on to submit.
    """
    from batchrun.cli.crontab import crontab_line, next_run

    with terminal.reported():
        job = arguments.cron_job(
            jobs_file,
            schedule=schedule,
            deadline=deadline,
            log=log,
            env_file=env_file,
            state_dir=state_dir,
            base_url=base_url,
            extra=tuple(ctx.args),
        )
    if env_file is None and os.environ.get("BATCHRUN_TOKEN"):
        terminal.to_stderr(
            "The line holds no token: put BATCHRUN_TOKEN=… in a file only you can "
            "read (chmod 600) and add --env-file FILE."
        )
    elif job.env_file is not None and job.env_file.stat().st_mode & 0o044:
        terminal.warning(
            f"other users can read {job.env_file}, which is meant to hold the "
            f"token: chmod 600 {job.env_file}"
        )
    terminal.echo([crontab_line(job)])
    # On stderr: stdout is the one line, for `| crontab -`.
    when = next_run(job.schedule, datetime.now())
    terminal.to_stderr(
        "Next run: at the next boot."
        if when is None
        else f"Next run: {when:%a %Y-%m-%d %H:%M} (this machine's local time)."
    )


def config_command(ctx: flags.Context, as_json: flags.JsonFlag = False) -> None:
    """The settings in force with no flag, and where each came from.

    From BATCHRUN_* variables, batchrun.toml, the user's config.toml or the
    defaults; never the token.
    """
    found = ctx.obj if isinstance(ctx.obj, config.Config) else config.Config(())
    rows = defaults.settings_in_force(found, os.environ)
    profile = Profile(next(row.value for row in rows if row.key == "profile"))
    limits = defaults.limits_in_force(found, profile)
    token = "BATCHRUN_TOKEN" if os.environ.get("BATCHRUN_TOKEN") else None
    if as_json:
        shown = reports.config_json(rows, limits, token, found.files)
        terminal.echo([json.dumps(shown, indent=2)])
    else:
        terminal.echo(reports.config_lines(rows, limits, token, found.files))
