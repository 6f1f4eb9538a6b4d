"""What the command line's strings mean: checked values and settings built from flags.

`cli` hands the strings Typer parsed to these functions and gets back checked
values (a results path, a round's name, the rules in force) or a `UsageError`
(exit 2) that says which flag is wrong. No Typer here: warnings go through the
`warn` the caller gives. Modules that load httpx or Starlette are imported inside
the functions that need them, as in `cli`, so `--help`, `validate` and `status`
start fast.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

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
from batchrun.store.paths import StatePaths, api_fingerprint, client_fingerprint
from batchrun.store.results import default_results_path

if TYPE_CHECKING:
    from batchrun.cli.crontab import CronJob
    from batchrun.cli.submission import Target
    from batchrun.run.runner import Settings

# --concurrency's default, which `config` shows too.
CONCURRENCY = 8


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


def stores(base_url: str | None, token: str | None) -> tuple[str, ...]:
    """The names of the run store of an API: its own, then a legacy one (of an
    earlier batchrun, named by base URL and token); none without a base URL."""
    if base_url is None:
        return ()
    return (api_fingerprint(base_url), client_fingerprint(base_url, token))


def client(base_url: str | None, token: str | None) -> str | None:
    """The client's fingerprint (base URL and token), or None without a base URL."""
    return None if base_url is None else client_fingerprint(base_url, token)


def rules(
    profile: Profile, limits: list[str] | None, time_scale: float
) -> dict[LimitKey, Rule]:
    """Each key's rule: the profile's table with every --limit in place."""
    overrides = [parse_override(text) for text in limits or []]
    return limit_table(profile=profile, overrides=overrides, time_scale=time_scale)


def learning_client(base_url: str | None, token: str | None) -> str:
    """The client whose limits `limits` shows: it needs a base URL."""
    if base_url is None:
        msg = (
            "limits are learned per client: give its --base-url "
            "(or BATCHRUN_BASE_URL) and its token"
        )
        raise UsageError(msg)
    return client_fingerprint(base_url, token)


def served_rules(
    profile: Profile, limits: list[str] | None, time_scale: float
) -> dict[LimitKey, Rule]:
    """The rules `batchrun sandbox` enforces: one statement, never auto."""
    if profile is Profile.AUTO:
        msg = "the sandbox enforces one statement: --profile a or b, not auto"
        raise UsageError(msg)
    return rules(profile, limits, time_scale)


def fallback_rules(profile: Profile, limits: list[str] | None) -> dict[LimitKey, Rule]:
    """The rule each key falls back to if the server shows it is too loose:
    with --profile auto, run-query's b, unless --limit gave run-query a rule."""
    return fallbacks(profile, [parse_override(text) for text in limits or []])


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
    concurrency: int,
    max_attempts: int,
    time_scale: float,
    pace: Pace,
    profile: Profile,
    limits: list[str] | None,
) -> Settings:
    """The runner's settings from submit's flags (backoff scaled with the windows)."""
    from batchrun.run.runner import Settings

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


@dataclass(frozen=True, slots=True)
class Server:
    """What `submit` says about the in-process sandbox: whether to use it, the
    rules it enforces (the client's, with `--server-limit` on top) and how."""

    sandbox: bool
    rules: dict[LimitKey, Rule]
    inject: list[str] | None
    limits: list[str] | None
    counting: LimiterKind | None
    headers: HeaderStyle | None
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


def target(
    base_url: str | None,
    token: str | None,
    timeout: float,
    server: Server,
    ca_bundle: Path | None,
    warn: Callable[[str], None],
) -> Target:
    """Where submit sends: the in-process sandbox, or the checked --base-url
    (a missing token for a remote host is warned about, not refused)."""
    from batchrun.cli.submission import Target

    server.check()
    if server.sandbox:
        return _sandbox_target(server, token, timeout, ca_bundle)
    if not base_url:
        msg = "No API to talk to: give --base-url (or BATCHRUN_BASE_URL), or --sandbox."
        raise UsageError(msg)
    check_base_url(base_url, warn)
    _check_ca_bundle(ca_bundle)
    host = urlsplit(base_url).hostname or ""
    if not token and not _is_loopback(host):
        warn(
            f"WARNING: no token for {host} (BATCHRUN_TOKEN or --token): requests go "
            "without Authorization."
        )
    return Target(base_url=base_url, token=token, timeout=timeout, ca_bundle=ca_bundle)


def _sandbox_target(
    server: Server, token: str | None, timeout: float, ca_bundle: Path | None
) -> Target:
    """The sandbox served in process, through an ASGI transport."""
    from batchrun.api.client import asgi_transport
    from batchrun.cli.submission import Target
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
        base_url="http://sandbox.local",
        token=token,
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


def check_base_url(url: str, warn: Callable[[str], None]) -> None:
    """An http(s) URL with a host and no credentials; plain http:// to a host
    that is not loopback is warned about (the token would travel in clear)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        msg = f"--base-url must be an http:// or https:// URL with a host, got {url!r}."
        raise UsageError(msg)
    if parts.username or parts.password:
        msg = (
            "--base-url must not hold credentials; pass the token with BATCHRUN_TOKEN."
        )
        raise UsageError(msg)
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        warn(
            f"WARNING: {parts.hostname} is reached over plain http://: the token "
            "travels unencrypted. Use https://."
        )


def _is_loopback(host: str) -> bool:
    """localhost, or a loopback IP address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def _shown_defaults() -> dict[str, str]:
    """The defaults `config` shows for the settings no source sets."""
    return {
        "base-url": "(none)",
        "profile": Profile.B.value,
        "concurrency": str(CONCURRENCY),
        "ledger": "SQLite in the state folder",
        "state-dir": str(StatePaths.resolve(None, create=False).root),
    }


def limits_in_force(found: config.Config, profile: Profile) -> list[config.InForce]:
    """Each key's rule with no --limit, and where it came from."""
    table = limit_table(
        profile=profile,
        overrides=[parse_override(text) for text in found.limit_flags()],
    )
    return [
        config.InForce(key.value, str(table[key]), _limit_source(found, key, profile))
        for key in LimitKey
    ]


def _limit_source(found: config.Config, key: LimitKey, profile: Profile) -> str:
    """The config file that set a key's rule, else its profile or the default."""
    if key.value in found.limits:
        return str(found.limits[key.value].source)
    return f"profile {profile.value}" if key is LimitKey.RUN_QUERY else "default"


# Serves limits of its own: the client's config does not make the server.
_UNCONFIGURED = frozenset({"sandbox"})


def config_defaults(found: config.Config, group: object) -> dict[str, Any]:
    """Click's default_map: for each command, the options the config files set.
    Click reads it after the command line and the envvar, so flags and
    BATCHRUN_* win over the files."""
    values = found.params()
    commands: dict[str, Any] = getattr(group, "commands", {})
    return {
        name: {p.name: values[p.name] for p in command.params if p.name in values}
        for name, command in commands.items()
        if name not in _UNCONFIGURED
    }


def settings_in_force(
    found: config.Config, environ: Mapping[str, str]
) -> list[config.InForce]:
    """The settings no flag gives, and where each came from; URLs redacted."""
    from batchrun.ledgers.redis_ledger import redacted

    return [
        replace(row, value=redacted(row.value))
        if row.key in ("base-url", "ledger")
        else row
        for row in config.in_force(found, environ, _shown_defaults())
    ]
