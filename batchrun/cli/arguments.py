"""What the command line's flags mean: the typed values the commands are built from.

`cli` hands the values Typer parsed to these functions and gets back checked ones
or a `UsageError` (exit 2) that says which flag is wrong. The options several
commands share (state folder, base URL, token, budget key, ledger, profile and
limits) are resolved once, by `resolve`, into one `Common`; every `--limit` is
parsed there, once. `submit`'s flags are one `SubmitOptions`, which
`submission` turns into the run's `Submission`, including where it sends: the
in-process sandbox (with the rules, faults and headers the `--server-*` flags
give it) or a checked `--base-url`.

A bad URL, a bad CA bundle, sandbox-only flags without `--sandbox`, or a scaled
time against a real API are usage errors before anything is sent. No Typer here:
warnings go through the `warn` the caller gives. What the config files make the
defaults is `defaults`'. Modules that load httpx or Starlette are imported inside
the functions that need them, as in `commands`, so `--help`, `validate` and
`status` start fast.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from batchrun.cli import config
from batchrun.core import durations
from batchrun.core.errors import UsageError
from batchrun.core.identity import SANDBOX_URL, Identity
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
from batchrun.store.paths import StatePaths, user_state_folder
from batchrun.store.results import default_results_path

if TYPE_CHECKING:
    from batchrun.cli.crontab import CronJob
    from batchrun.cli.metrics import MetricsFile
    from batchrun.run.settings import Settings
    from batchrun.run.submission import Submission
    from batchrun.run.view import View
    from batchrun.run.wiring import Target


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """--profile and every --limit (the config files' `[limits]` first, then the
    flags, which win key by key), parsed once; windows divided by `time_scale`."""

    profile: Profile
    overrides: tuple[tuple[LimitKey, Rule], ...]
    time_scale: float
    # Each key's rule: the profile's table with every --limit in place.
    rules: dict[LimitKey, Rule]

    def under(self, profile: Profile) -> dict[LimitKey, Rule]:
        """Each key's rule had `profile` been given (with the same --limit)."""
        table = limit_table(profile=profile, overrides=self.overrides)
        return scaled(table, self.time_scale)

    @property
    def fallback(self) -> dict[LimitKey, Rule]:
        """The rule each key falls back to if the server shows it is too loose:
        with --profile auto, run-query's b, unless --limit gave run-query a rule."""
        return scaled(fallbacks(self.profile, self.overrides), self.time_scale)


def scaled(table: Mapping[LimitKey, Rule], time_scale: float) -> dict[LimitKey, Rule]:
    """`table` with every window divided by --time-scale: the one place the scale
    is applied (backoff and the learner's usual lengths follow it in `_settings`);
    nothing below `cli` knows it.

    Raises:
        UsageError: a --time-scale not above 0.
    """
    if not time_scale > 0:
        msg = f"--time-scale must be greater than 0, got {time_scale}"
        raise UsageError(msg)
    return {key: rule.scaled(time_scale) for key, rule in table.items()}


def _read_limits(
    profile: Profile, limits: Sequence[str] | None, time_scale: float = 1.0
) -> Limits:
    """--profile and the --limit texts as one `Limits`.

    Raises:
        UsageError: a bad --limit, or a --time-scale not above 0.
    """
    overrides = tuple(parse_override(text) for text in limits or [])
    table = scaled(limit_table(profile=profile, overrides=overrides), time_scale)
    return Limits(
        profile=profile, overrides=overrides, time_scale=time_scale, rules=table
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Common:
    """What the options several commands share resolve to: the state folder
    (not made: commands that write call `made`), the client's identity, its
    ledger and the limits given."""

    state: StatePaths
    identity: Identity
    # --ledger: Redis URL, or None for SQLite; out of repr, as it may hold a password.
    ledger_url: str | None = field(repr=False)
    limits: Limits


def resolve(
    *,
    state_dir: Path | None,
    base_url: str | None = None,
    token: str | None = None,
    budget_key: str | None = None,
    ledger: str | None = None,
    profile: Profile = Profile.B,
    limit: Sequence[str] | None = None,
    time_scale: float = 1.0,
    sandbox: bool = False,
) -> Common:
    """The shared options, resolved once: --state-dir (or BATCHRUN_STATE_DIR),
    else the user's state folder; the client (`--sandbox`: the sandbox served in
    process, whatever --base-url says); its ledger; the limits.

    Raises:
        UsageError: a bad --limit or --time-scale, or a bad --budget-key.
    """
    limits = _read_limits(profile, limit, time_scale)
    identity = Identity(
        base_url=SANDBOX_URL if sandbox else base_url,
        token=token,
        budget_key=budget_key,
        is_sandbox=sandbox,
    )
    root = (state_dir or user_state_folder()).expanduser()
    return Common(
        state=StatePaths(root), identity=identity, ledger_url=ledger, limits=limits
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitOptions:
    """Every flag of `submit`, as Typer parsed it (`limit`: the config files'
    `[limits]`, then --limit); `submission` checks them."""

    jobs_file: Path
    base_url: str | None
    token: str | None = field(repr=False)
    profile: Profile
    limit: list[str]
    pace: Pace
    concurrency: int | None
    max_attempts: int
    timeout: float
    results: Path | None
    sandbox: bool
    time_scale: float
    state_dir: Path | None
    ledger: str | None = field(repr=False)
    ca_bundle: Path | None
    deadline: str | None
    retry_failed: bool
    retry_unknown: bool
    restart: bool
    run_id: str | None
    no_color: bool
    quiet: bool
    verbose: bool
    halt_after: str | None
    metrics_file: Path | None
    budget_key: str | None
    inject: list[str] | None
    server_limit: list[str] | None
    server_counting: LimiterKind | None
    server_headers: HeaderStyle | None
    server_burst: int | None


def submission(
    given: SubmitOptions,
    *,
    stdin: Callable[[Path, StatePaths], Path],
    warn: Callable[[str], None],
) -> Submission:
    """The `Submission` that `submit`'s flags ask for, each checked in turn; jobs
    from stdin (`-`) are first kept in the state folder by `stdin`."""
    from batchrun.cli.metrics_file import metrics_writer
    from batchrun.run.halt import HaltPolicy
    from batchrun.run.submission import Submission

    check_time_scale(given.time_scale, sandbox=given.sandbox, base_url=given.base_url)
    halt = None if given.halt_after is None else HaltPolicy.parse(given.halt_after)
    metrics = metrics_writer(given.metrics_file, given.jobs_file, warn)
    common = resolve(
        state_dir=given.state_dir,
        base_url=given.base_url,
        token=given.token,
        budget_key=given.budget_key,
        ledger=given.ledger,
        profile=given.profile,
        limit=given.limit,
        time_scale=given.time_scale,
        sandbox=given.sandbox,
    )
    server = _server(given, common.limits)
    state = common.state.made()
    results = _results_path(given.jobs_file, given.results, sandbox=given.sandbox)
    jobs_file = given.jobs_file
    if str(jobs_file) == "-":
        jobs_file = stdin(results, state)
    return Submission(
        jobs_file=jobs_file,
        target=_target(given, common.identity, server, warn),
        rules=common.limits.rules,
        settings=_settings(given, common.limits),
        results=results,
        state=state.sandbox() if given.sandbox else state,
        deadline=None if given.deadline is None else durations.parse(given.deadline),
        retry_failed=given.retry_failed,
        retry_unknown=given.retry_unknown,
        restart=given.restart,
        ledger_url=common.ledger_url,
        view=_view(
            jobs_file,
            results,
            metrics,
            not given.no_color,
            _verbosity(given.quiet, given.verbose),
        ),
        run_id=_round_name(given.run_id),
        halt=halt,
        ended=None if metrics is None else metrics.close,
    )


def _settings(given: SubmitOptions, limits: Limits) -> Settings:
    """The runner's settings from submit's flags: backoff, the Retry-After
    cap and the usual window lengths the learner tries, scaled with the
    windows."""
    from batchrun.api.hints import RETRY_AFTER_CAP
    from batchrun.pacing.model import USUAL
    from batchrun.run.settings import Settings

    scale = given.time_scale
    return Settings(
        fallback=limits.fallback,
        concurrency=given.concurrency,
        max_attempts=given.max_attempts,
        backoff=1.0 / scale,
        backoff_cap=60.0 / scale,
        retry_after_cap=RETRY_AFTER_CAP / scale,
        pace=given.pace,
        usual=tuple(seconds / scale for seconds in USUAL),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Server:
    """What `submit` says about the in-process sandbox: whether to use it, the
    rules it enforces (the client's, with `--server-limit` on top) and how."""

    sandbox: bool
    rules: dict[LimitKey, Rule]
    inject: list[str] | None = None
    limits: list[str] | None = None
    counting: LimiterKind | None = None
    headers: HeaderStyle | None = None
    burst: int | None = None

    def check(self) -> None:
        """Sandbox-only flags without --sandbox are a usage error."""
        given = {
            "--inject": self.inject,
            "--server-limit": self.limits,
            "--server-counting": self.counting,
            "--server-headers": self.headers,
            "--server-burst": self.burst,
        }
        named = [flag for flag, value in given.items() if value]
        if named and not self.sandbox:
            verb = "works" if len(named) == 1 else "work"
            msg = f"{', '.join(named)} only {verb} with --sandbox."
            raise UsageError(msg)


def _server(given: SubmitOptions, limits: Limits) -> _Server:
    """The sandbox `submit` asks for: the client's rules with each
    `--server-limit` in place of its key's."""
    server = [_server_override(text) for text in given.server_limit or []]
    return _Server(
        sandbox=given.sandbox,
        rules=scaled(
            limit_table(profile=limits.profile, overrides=[*limits.overrides, *server]),
            limits.time_scale,
        ),
        inject=given.inject,
        limits=given.server_limit,
        counting=given.server_counting,
        headers=given.server_headers,
        burst=given.server_burst,
    )


def _target(
    given: SubmitOptions,
    identity: Identity,
    server: _Server,
    warn: Callable[[str], None],
) -> Target:
    """Where submit sends: the in-process sandbox, or the checked --base-url
    (a missing token for a remote host is warned about, not refused)."""
    from batchrun.run.wiring import Target

    server.check()
    if given.sandbox:
        return _sandbox_target(server, identity, given.timeout, given.ca_bundle)
    if identity.base_url is None:
        msg = "No API to talk to: give --base-url (or BATCHRUN_BASE_URL), or --sandbox."
        raise UsageError(msg)
    check_base_url(identity.base_url, warn, token=bool(identity.token))
    _check_ca_bundle(given.ca_bundle)
    return Target(identity=identity, timeout=given.timeout, ca_bundle=given.ca_bundle)


def _sandbox_target(
    server: _Server, identity: Identity, timeout: float, ca_bundle: Path | None
) -> Target:
    """The sandbox served in process, through an ASGI transport."""
    from batchrun.api.client import asgi_transport
    from batchrun.run.wiring import Target
    from batchrun.sandbox import faults
    from batchrun.sandbox.app import create_app

    app = create_app(
        rules=server.rules,
        faults=faults.parse_faults(server.inject or []),
        counting=server.counting or LimiterKind.SLIDING,
        headers=server.headers or HeaderStyle.NONE,
        burst=server.burst or 0,
    )
    _check_ca_bundle(ca_bundle)
    return Target(
        identity=identity,
        timeout=timeout,
        transport=asgi_transport(app),
        ca_bundle=ca_bundle,
    )


def check_time_scale(time_scale: float, *, sandbox: bool, base_url: str | None) -> None:
    """Scaling a real API's windows would multiply its limits: only the sandbox,
    in process or on loopback (`batchrun sandbox --time-scale N`), is scaled."""
    host = urlsplit(base_url or "").hostname or ""
    if time_scale != 1 and not sandbox and not _is_loopback(host):
        msg = (
            f"--time-scale {time_scale:g} only works with --sandbox or a sandbox on "
            f"loopback: against a real API it would send {time_scale:g} times "
            "faster than its limits allow."
        )
        raise UsageError(msg)


def _check_ca_bundle(ca_bundle: Path | None) -> None:
    """A bad bundle exits 2 before anything starts."""
    from batchrun.api.client import tls_context

    if ca_bundle is not None:
        tls_context(ca_bundle)


def check_base_url(
    url: str, warn: Callable[[str], None], *, token: bool = True
) -> None:
    """An http(s) URL with a host and no credentials. For a host that is not
    loopback, one warning: no token, or a token that would travel in clear."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        msg = f"--base-url must be an http:// or https:// URL with a host, got {url!r}."
        raise UsageError(msg)
    if parts.username or parts.password:
        msg = (
            "--base-url must not hold credentials; pass the token with BATCHRUN_TOKEN."
        )
        raise UsageError(msg)
    host = parts.hostname
    if _is_loopback(host):
        return
    if not token:
        how = " over plain http://" if parts.scheme == "http" else ""
        warn(
            f"no token for {host} (BATCHRUN_TOKEN or --token): requests go{how} "
            "without Authorization."
        )
    elif parts.scheme == "http":
        warn(
            f"{host} is reached over plain http://: the token travels unencrypted. "
            "Use https://."
        )


def _is_loopback(host: str) -> bool:
    """localhost, or a loopback IP address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _results_path(
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


def _round_name(run_id: str | None) -> str | None:
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


def served_rules(
    profile: Profile, limits: list[str] | None, time_scale: float
) -> dict[LimitKey, Rule]:
    """The rules `batchrun sandbox` enforces: one statement, never auto."""
    if profile is Profile.AUTO:
        msg = "the sandbox enforces one statement: --profile a or b, not auto"
        raise UsageError(msg)
    return _read_limits(profile, limits, time_scale).rules


def _verbosity(quiet: bool, verbose: bool) -> int:
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


def _server_override(text: str) -> tuple[LimitKey, Rule]:
    """One --server-limit, its errors naming that flag rather than --limit."""
    try:
        return parse_override(text)
    except UsageError as exc:
        why = exc.message.removeprefix(f"bad --limit {text!r}: ")
        msg = f"bad --server-limit {text!r}: {why}"
        raise UsageError(msg) from None


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
        state_dir=resolve(state_dir=state_dir).state.root.absolute(),
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
