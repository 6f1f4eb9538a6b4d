"""What the command line's strings mean: checked values and settings built from flags.

`cli` hands the strings Typer parsed to these functions and gets back checked
values (a results path, a round's name, the rules in force, the whole
`Submission` of a `submit`) or a `UsageError` (exit 2) that says which flag is
wrong. No Typer here: warnings go through the `warn` the caller gives. Where
`submit` sends is `targets`'; what the config files make the defaults is
`defaults`'. Modules that load httpx or Starlette are imported inside the
functions that need them, as in `commands`, so `--help`, `validate` and `status`
start fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from batchrun.cli import config
from batchrun.core import durations
from batchrun.core.errors import UsageError
from batchrun.core.limits import (
    LimitKey,
    Pace,
    Profile,
    Rule,
    fallbacks,
    limit_table,
    parse_override,
)
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle
from batchrun.store.paths import StatePaths
from batchrun.store.results import default_results_path

if TYPE_CHECKING:
    from batchrun.cli.crontab import CronJob
    from batchrun.cli.metrics import MetricsFile
    from batchrun.run.settings import Settings
    from batchrun.run.submission import Submission
    from batchrun.run.view import View


def results_path(
    jobs_file: Path, results: Path | None, *, sandbox: bool = False
) -> Path:
    """--results, else beside the jobs file (a `--sandbox` run's apart); a file,
    never a device.

    Raises:
        UsageError: jobs from stdin and no --results, or results under /dev.
    """
    if results is None:
        if str(jobs_file) == "-":
            msg = "submit - reads the jobs from stdin: name the results with --results."
            raise UsageError(msg)
        results = default_results_path(jobs_file, sandbox=sandbox)
    where = (results.absolute(), results.resolve())
    if any(p.is_relative_to(d) for p in where for d in ("/dev", "/proc")):
        msg = (
            f"--results {results}: the results are read back to resume and by "
            "`show`, so they go to a file, not a device."
        )
        raise UsageError(msg)
    return results


def round_name(run_id: str | None) -> str | None:
    """--run-id with its %-codes filled from today's date (strftime)."""
    if run_id is None:
        return None
    name = datetime.now().astimezone().strftime(run_id).strip()
    if not name:
        msg = "--run-id must name the round, e.g. --run-id %F (today's date)."
        raise UsageError(msg)
    return name


def shown_count(text: str) -> int | None:
    """--show N or all (None)."""
    if text == "all":
        return None
    if not text.isdigit():
        msg = f"--show takes a number or 'all', got {text!r}."
        raise UsageError(msg)
    return int(text)


def rules(
    profile: Profile, limits: list[str] | None, time_scale: float
) -> dict[LimitKey, Rule]:
    """Each key's rule: the profile's table with every --limit in place."""
    overrides = [parse_override(text) for text in limits or []]
    return limit_table(profile=profile, overrides=overrides, time_scale=time_scale)


def served_rules(
    profile: Profile, limits: list[str] | None, time_scale: float
) -> dict[LimitKey, Rule]:
    """The rules `batchrun sandbox` enforces: one statement, never auto."""
    if profile is Profile.AUTO:
        msg = "the sandbox enforces one statement: --profile a or b, not auto"
        raise UsageError(msg)
    return rules(profile, limits, time_scale)


def fallback_rules(
    profile: Profile, limits: list[str] | None, time_scale: float = 1.0
) -> dict[LimitKey, Rule]:
    """The rule each key falls back to if the server shows it is too loose:
    with --profile auto, run-query's b, unless --limit gave run-query a rule."""
    overrides = [parse_override(text) for text in limits or []]
    return fallbacks(profile, overrides, time_scale)


def verbosity(quiet: bool, verbose: bool) -> int:
    """-1 for --quiet, 1 for --verbose, else 0; both at once is a usage error."""
    if quiet and verbose:
        msg = "--quiet and --verbose ask for opposite things: give one"
        raise UsageError(msg)
    return -1 if quiet else int(verbose)


def forgotten(names: list[str] | None) -> list[LimitKey]:
    """The keys named by --forget ("all": every key)."""
    if names and "all" in names:
        return list(LimitKey)
    try:
        return [LimitKey(name) for name in names or []]
    except ValueError:
        known = ", ".join(key.value for key in LimitKey)
        msg = f"--forget takes a key ({known}) or 'all'"
        raise UsageError(msg) from None


def server_rules(
    profile: Profile,
    limits: list[str] | None,
    server_limits: list[str] | None,
    time_scale: float,
) -> dict[LimitKey, Rule]:
    """The client's rules with each `--server-limit` in place of its key's."""
    server = [_server_override(text) for text in server_limits or []]
    client = [parse_override(text) for text in limits or []]
    return limit_table(
        profile=profile, overrides=[*client, *server], time_scale=time_scale
    )


def _server_override(text: str) -> tuple[LimitKey, Rule]:
    """One --server-limit, its errors naming that flag rather than --limit."""
    try:
        return parse_override(text)
    except UsageError as exc:
        why = exc.message.removeprefix(f"bad --limit {text!r}: ")
        msg = f"bad --server-limit {text!r}: {why}"
        raise UsageError(msg) from None


def settings(
    concurrency: int | None,
    max_attempts: int,
    time_scale: float,
    pace: Pace,
    profile: Profile,
    limits: list[str] | None,
) -> Settings:
    """The runner's settings from submit's flags (backoff scaled with the windows)."""
    from batchrun.run.settings import Settings

    overrides = [parse_override(text) for text in limits or []]
    return Settings(
        fallback=fallbacks(profile, overrides, time_scale),
        concurrency=concurrency,
        max_attempts=max_attempts,
        backoff=1.0 / time_scale,
        backoff_cap=60.0 / time_scale,
        pace=pace,
        time_scale=time_scale,
    )


def submission(
    jobs_file: Path,
    *,
    base_url: str | None,
    token: str | None,
    profile: Profile,
    limit: list[str],
    pace: Pace,
    concurrency: int | None,
    max_attempts: int,
    timeout: float,
    results: Path | None,
    sandbox: bool,
    inject: list[str] | None,
    server_limit: list[str] | None,
    server_counting: LimiterKind | None,
    server_headers: HeaderStyle | None,
    server_burst: int | None,
    time_scale: float,
    state_dir: Path | None,
    ledger: str | None,
    ca_bundle: Path | None,
    deadline: str | None,
    retry_failed: bool,
    retry_unknown: bool,
    restart: bool,
    run_id: str | None,
    no_color: bool,
    quiet: bool,
    verbose: bool,
    halt_after: str | None,
    metrics_file: Path | None,
    budget_key: str | None,
    stdin: Callable[[Path, StatePaths], Path],
    warn: Callable[[str], None],
) -> Submission:
    """The `Submission` that `submit`'s flags ask for, each checked in turn; jobs
    from stdin (`-`) are first kept in the state folder by `stdin`."""
    from batchrun.cli import clients, targets
    from batchrun.cli.metrics_file import metrics_writer
    from batchrun.run.halt import HaltPolicy
    from batchrun.run.submission import Submission

    targets.check_time_scale(time_scale, sandbox=sandbox, base_url=base_url)
    halt = None if halt_after is None else HaltPolicy.parse(halt_after)
    metrics = metrics_writer(metrics_file, jobs_file, warn)
    rules_in_force = rules(profile, limit, time_scale)
    given = server_rules(profile, limit, server_limit, time_scale)
    how = (inject, server_limit, server_counting, server_headers, server_burst)
    server = targets.Server(sandbox, given, *how)
    state = StatePaths.resolve(state_dir)
    results = results_path(jobs_file, results, sandbox=sandbox)
    if str(jobs_file) == "-":
        jobs_file = stdin(results, state)
    if sandbox:
        state = state.sandbox()
    where = targets.target(base_url, token, timeout, server, ca_bundle, warn)
    return Submission(
        jobs_file=jobs_file,
        target=replace(where, budget_key=clients.budget_key(budget_key)),
        rules=rules_in_force,
        settings=settings(concurrency, max_attempts, time_scale, pace, profile, limit),
        results=results,
        state=state,
        deadline=None if deadline is None else durations.parse(deadline),
        retry_failed=retry_failed,
        retry_unknown=retry_unknown,
        restart=restart,
        ledger_url=ledger,
        view=_view(
            jobs_file, results, metrics, not no_color, verbosity(quiet, verbose)
        ),
        run_id=round_name(run_id),
        halt=halt,
        ended=None if metrics is None else metrics.close,
    )


def _view(
    jobs_file: Path,
    results: Path,
    metrics: MetricsFile | None,
    color: bool,
    verbosity: int,
) -> View:
    """How a run is shown (`progress.view`), heard by the metrics file too."""
    from batchrun.cli.progress import view

    shown = view(jobs_file, color=color, verbosity=verbosity, results=results)
    return shown if metrics is None else metrics.around(shown)


def cron_job(
    jobs_file: Path,
    *,
    schedule: str,
    deadline: str,
    log: Path | None,
    env_file: Path | None,
    state_dir: Path | None,
    base_url: str | None,
    extra: tuple[str, ...],
) -> CronJob:
    """What cron-line's line runs, every path absolute; files that are not there,
    and a bad --deadline, are usage errors now rather than every night."""
    from batchrun.cli.crontab import CronJob

    durations.parse(deadline)
    return CronJob(
        schedule=schedule,
        python=Path(sys.executable).absolute(),
        jobs_file=_existing(jobs_file),
        state_dir=StatePaths.resolve(state_dir, create=False).root.absolute(),
        log=(log or _default_log(jobs_file)).absolute(),
        env_file=None if env_file is None else _existing(env_file),
        base_url=base_url,
        deadline=deadline,
        extra=extra,
        folder=_project_folder(),
    )


def _existing(path: Path) -> Path:
    """The absolute path of a file that is there; else a usage error."""
    if not path.is_file():
        msg = f"{path}: no such file."
        raise UsageError(msg)
    return path.absolute()


def _project_folder() -> Path | None:
    """The current folder if it holds a batchrun.toml: cron starts elsewhere."""
    folder = Path.cwd()
    return folder if (folder / config.PROJECT_FILE).is_file() else None


def _default_log(jobs_file: Path) -> Path:
    """cron-line's log file: logs/NAME.log beside the jobs file."""
    return jobs_file.absolute().parent / "logs" / f"{jobs_file.stem}.log"
