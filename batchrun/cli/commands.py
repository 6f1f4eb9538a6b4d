"""The command line: flags become settings, errors become messages and exit codes.

Only this module knows about Typer; what the flags' strings mean (checked values,
the settings built from them) is `arguments`'. Every `BatchrunError` is caught
once, in `_reported`, printed on stderr without a traceback, and turned into its
exit code. Modules that load httpx or Starlette are imported inside the commands
that need them, so `--help`, `validate` and `status` start fast (start-up matters
under cron).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from batchrun import __version__
from batchrun.cli import arguments, config, reports
from batchrun.core import durations
from batchrun.core.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    BatchrunError,
    JobsFileError,
    StateError,
    UsageError,
)
from batchrun.core.limits import Pace, Profile
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle
from batchrun.store.paths import StatePaths, client_fingerprint
from batchrun.store.results import default_results_path

app = typer.Typer(
    name="batchrun",
    help="Spread a queue of API jobs over time, inside the API's rate limits.",
    no_args_is_help=True,
    add_completion=True,
    # A traceback with locals could show the token; errors are reported by _reported.
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Shown under `submit --help`; README's table says the same at more length.
_EXIT_CODES = (
    "Exit codes: 0 all done; 1 some jobs failed or are unknown; 2 bad usage or jobs "
    "file, nothing sent; 3 another run holds this file; 74 state folder or ledger "
    "unusable; 69 stopped early, every request failing the same way (401/403, or the "
    "server unreachable); 75 stopped early (deadline, ledger lost), resume by "
    "running again; 130 Ctrl-C; 143 SIGTERM. A signal's code wins, then 69, then "
    "1, then 75."
)

_JobsArg = Annotated[
    Path, typer.Argument(help="The jobs file: CSV, or JSON Lines if it ends in .jsonl.")
]
_ProfileOpt = Annotated[
    Profile,
    typer.Option(
        "--profile",
        help="run-query limit: b = 15/1m+500/1h (the stricter, default), a = 30/1m; "
        "auto = a until the server shows it is b (at most one 429 to find out).",
        rich_help_panel="Limits",
    ),
]
_LimitOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--limit",
        metavar="KEY=RULE",
        help="Replace one key's rule, e.g. run-query=30/1m (repeatable).",
        rich_help_panel="Limits",
    ),
]
_TimeScaleOpt = Annotated[
    float,
    typer.Option(
        "--time-scale",
        help="Divide every window by this factor (demos, tests): 30 makes 1m 2s.",
        rich_help_panel="Limits",
    ),
]
_InjectOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--inject",
        metavar="FAULT=RATE",
        help="Sandbox faults: 429=0.05, 5xx=0.1, drop=0.05, slow=0.1, "
        "slow-seconds=2, seed=7 (repeatable).",
        rich_help_panel="Sandbox faults",
    ),
]
_COUNTING_HELP = (
    "How the sandbox counts: sliding (a log, exact), fixed (aligned windows), "
    "weighted (a sliding-window estimate from two fixed counts), leaky (nginx "
    "limit_req: one request per WINDOW/COUNT, and --burst more at once)."
)
_BURST_HELP = (
    "With --counting leaky: requests the bucket lets through at once beyond the "
    "first (nginx's limit_req burst=B nodelay)."
)
_HEADERS_HELP = (
    "Rate-limit headers the sandbox states on every answer: none (only a 429's "
    "Retry-After), ietf (RateLimit-Policy and RateLimit, draft 08 on), draft7 "
    "(express-rate-limit's RateLimit: limit=, remaining=, reset=), x-ratelimit "
    "(X-RateLimit-Limit/-Remaining/-Reset)."
)
_CountingOpt = Annotated[LimiterKind, typer.Option("--counting", help=_COUNTING_HELP)]
_BurstOpt = Annotated[int, typer.Option("--burst", min=0, help=_BURST_HELP)]
_ServerBurstOpt = Annotated[
    int | None,
    typer.Option(
        "--server-burst",
        min=0,
        show_default=False,
        help="With --sandbox and --server-counting leaky: its burst, as "
        "`batchrun sandbox --burst`.",
    ),
]
_HeadersOpt = Annotated[HeaderStyle, typer.Option("--headers", help=_HEADERS_HELP)]
_ServerLimitOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--server-limit",
        metavar="KEY=RULE",
        help="With --sandbox: the sandbox enforces this rule for KEY instead of "
        "the client's, e.g. run-query=10/1m, to watch the client learn it "
        "(repeatable).",
    ),
]
_ServerCountingOpt = Annotated[
    LimiterKind | None,
    typer.Option(
        "--server-counting",
        show_default=False,
        help="With --sandbox: how it counts, as `batchrun sandbox --counting` "
        "(default sliding).",
    ),
]
_ServerHeadersOpt = Annotated[
    HeaderStyle | None,
    typer.Option(
        "--server-headers",
        show_default=False,
        help="With --sandbox: the rate-limit headers it states, as `batchrun "
        "sandbox --headers` (default none).",
    ),
]
_StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        envvar="BATCHRUN_STATE_DIR",
        help="Where runs and the send ledger live. Default: the user's state folder.",
        rich_help_panel="State",
    ),
]
_LedgerOpt = Annotated[
    str | None,
    typer.Option(
        "--ledger",
        envvar="BATCHRUN_LEDGER_URL",
        metavar="URL",
        show_default=False,
        help="Where the client's budget lives: redis://[:PASSWORD@]HOST:PORT/DB "
        "(rediss:// for TLS) shares it across machines. Default: SQLite in the "
        "state folder (this machine).",
        rich_help_panel="State",
    ),
]
_BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        envvar="BATCHRUN_BASE_URL",
        help="The API's base URL.",
        rich_help_panel="Where to send",
    ),
]
_TokenOpt = Annotated[
    str | None,
    typer.Option(
        envvar="BATCHRUN_TOKEN",
        show_default=False,
        help="Bearer token (better: set BATCHRUN_TOKEN). Never printed or stored.",
        rich_help_panel="Where to send",
    ),
]
_PaceOpt = Annotated[
    Pace,
    typer.Option(
        help="exact: as early as the windows allow; spread: evenly spaced.",
        rich_help_panel="Limits",
    ),
]
_ConcurrencyOpt = Annotated[
    int,
    typer.Option(
        min=1, help="Most requests in flight at once.", rich_help_panel="Limits"
    ),
]
_AttemptsOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="Give up on a job after this many server errors or timeouts.",
        rich_help_panel="Run control",
    ),
]
_TimeoutOpt = Annotated[
    float,
    typer.Option(
        min=0.001,
        help="Seconds to wait for each answer.",
        rich_help_panel="Where to send",
    ),
]
_ResultsOpt = Annotated[
    Path | None,
    typer.Option(
        help="Results file (JSON Lines). Default: JOBS.results.jsonl.",
        rich_help_panel="Output",
    ),
]
_SandboxFlag = Annotated[
    bool,
    typer.Option(
        "--sandbox",
        help="Run against the built-in local sandbox.",
        rich_help_panel="Where to send",
        metavar="",
    ),
]
_CaBundleOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="PATH",
        help="Also trust the CA certificates in this PEM file (a private CA).",
        rich_help_panel="Where to send",
    ),
]
_DeadlineOpt = Annotated[
    str | None,
    typer.Option(
        metavar="DURATION",
        help="Stop starting requests after this long (e.g. 55m), then exit 75.",
        rich_help_panel="Run control",
    ),
]
_RetryFailedFlag = Annotated[
    bool,
    typer.Option(
        "--retry-failed",
        help="Try failed jobs again.",
        rich_help_panel="Run control",
        metavar="",
    ),
]
_RetryUnknownFlag = Annotated[
    bool,
    typer.Option(
        "--retry-unknown",
        help="Resend invites left unknown (a timeout, a 5xx, or a run that died "
        "mid-request: the server may have processed them).",
        rich_help_panel="Run control",
        metavar="",
    ),
]
_RestartFlag = Annotated[
    bool,
    typer.Option(
        "--restart",
        help="Forget earlier runs of this file; start over.",
        rich_help_panel="Run control",
        metavar="",
    ),
]
_RunIdOpt = Annotated[
    str | None,
    typer.Option(
        "--run-id",
        metavar="ID",
        help="Name this round; a new name sends every job again (a new night). "
        "%-codes take today's date: --run-id %F is one round a day.",
        rich_help_panel="Run control",
    ),
]
_JsonFlag = Annotated[
    bool,
    typer.Option(
        "--json",
        help="One JSON object on stdout, for scripts.",
        rich_help_panel="Output",
        metavar="",
    ),
]
_QuietFlag = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="Only failures and the summary (plain lines, no live view).",
        rich_help_panel="Output",
        metavar="",
    ),
]
_VerboseFlag = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Every requeue in the plain log, not only the first 20.",
        rich_help_panel="Output",
        metavar="",
    ),
]
_NoColorFlag = Annotated[
    bool,
    typer.Option(
        "--no-color",
        help="No colour in the live view (as NO_COLOR=1).",
        rich_help_panel="Output",
        metavar="",
    ),
]


@app.command(epilog=_EXIT_CODES)
def submit(
    ctx: typer.Context,
    jobs_file: _JobsArg,
    base_url: _BaseUrlOpt = None,
    token: _TokenOpt = None,
    profile: _ProfileOpt = Profile.B,
    limit: _LimitOpt = None,
    pace: _PaceOpt = Pace.EXACT,
    concurrency: _ConcurrencyOpt = arguments.CONCURRENCY,
    max_attempts: _AttemptsOpt = 5,
    timeout: _TimeoutOpt = 30.0,
    results: _ResultsOpt = None,
    sandbox: _SandboxFlag = False,
    inject: _InjectOpt = None,
    server_limit: _ServerLimitOpt = None,
    server_counting: _ServerCountingOpt = None,
    server_headers: _ServerHeadersOpt = None,
    server_burst: _ServerBurstOpt = None,
    time_scale: _TimeScaleOpt = 1.0,
    state_dir: _StateDirOpt = None,
    ledger: _LedgerOpt = None,
    ca_bundle: _CaBundleOpt = None,
    deadline: _DeadlineOpt = None,
    retry_failed: _RetryFailedFlag = False,
    retry_unknown: _RetryUnknownFlag = False,
    restart: _RestartFlag = False,
    run_id: _RunIdOpt = None,
    no_color: _NoColorFlag = False,
    quiet: _QuietFlag = False,
    verbose: _VerboseFlag = False,
) -> None:
    """Send every job of JOBS_FILE inside the rate limits; run it again to resume."""
    from batchrun.cli.submission import Submission, submit

    say = _log_for(jobs_file)
    limit = _with_file_limits(ctx, limit)
    with _reported(say):
        arguments.check_time_scale(time_scale, sandbox=sandbox, base_url=base_url)
        rules = arguments.rules(profile, limit, time_scale)
        server_rules = arguments.server_rules(profile, limit, server_limit, time_scale)
        server = arguments.Server(
            sandbox,
            server_rules,
            inject,
            server_limit,
            server_counting,
            server_headers,
            server_burst,
        )
        state = StatePaths.resolve(state_dir)
        results = arguments.results_path(jobs_file, results, sandbox=sandbox)
        if str(jobs_file) == "-":
            jobs_file = _from_stdin(results, state)
        job = Submission(
            jobs_file=jobs_file,
            target=arguments.target(
                base_url, token, timeout, server, ca_bundle, _to_stderr
            ),
            rules=rules,
            settings=arguments.settings(
                concurrency, max_attempts, time_scale, pace, profile, limit
            ),
            results=results,
            state=state,
            deadline=None if deadline is None else durations.parse(deadline),
            retry_failed=retry_failed,
            retry_unknown=retry_unknown,
            restart=restart,
            ledger_url=ledger,
            color=not no_color,
            verbosity=arguments.verbosity(quiet, verbose),
            run_id=arguments.round_name(run_id),
        )
        raise typer.Exit(submit(job, say=say))


@app.command()
def validate(jobs_file: _JobsArg, as_json: _JsonFlag = False) -> None:
    """Check JOBS_FILE without sending anything: every bad row, or a summary."""
    from batchrun.store.state import check_jobs_file

    with _reported():
        try:
            summary = check_jobs_file(jobs_file)
        except JobsFileError as exc:
            if not as_json:
                raise
            _echo([json.dumps(reports.problems_json(exc), indent=2)])
            raise typer.Exit(exc.exit_code) from None
    if as_json:
        _echo([json.dumps(reports.summary_json(jobs_file, summary), indent=2)])
    else:
        _echo(reports.summary_lines(jobs_file, summary))


@app.command()
def status(
    jobs_file: _JobsArg,
    state_dir: _StateDirOpt = None,
    ledger: _LedgerOpt = None,
    base_url: _BaseUrlOpt = None,
    token: _TokenOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object, for scripts.")
    ] = False,
    show: Annotated[
        str,
        typer.Option(
            "--show",
            metavar="N|all",
            help="How many failed and unknown jobs to list (all: every one).",
        ),
    ] = "20",
) -> None:
    """Where the latest run of JOBS_FILE stands: counts, failures, budget, ETA."""
    from batchrun.cli.overview import status as read_status

    with _reported():
        shown = arguments.shown_count(show)
        paths = StatePaths.resolve(state_dir, create=False)
        found = read_status(
            jobs_file,
            paths,
            arguments.stores(base_url, token),
            ledger_url=ledger,
            shown=shown,
        )
    if as_json:
        _echo([json.dumps(reports.status_json(jobs_file, found), indent=2)])
    else:
        _echo(reports.status_lines(jobs_file, found))


@app.command()
def plan(
    ctx: typer.Context,
    jobs_file: _JobsArg,
    profile: _ProfileOpt = Profile.B,
    limit: _LimitOpt = None,
    pace: _PaceOpt = Pace.EXACT,
    state_dir: _StateDirOpt = None,
    ledger: _LedgerOpt = None,
    base_url: _BaseUrlOpt = None,
    token: _TokenOpt = None,
    as_json: _JsonFlag = False,
) -> None:
    """How long the jobs of JOBS_FILE not yet done take (nothing is sent)."""
    from batchrun.cli.overview import plan as make_plan

    limit = _with_file_limits(ctx, limit)
    with _reported():
        rules = arguments.rules(profile, limit, 1.0)
        client = arguments.client(base_url, token) or client_fingerprint("", None)
        paths = StatePaths.resolve(state_dir, create=False)
        plans = make_plan(
            jobs_file,
            rules,
            pace,
            paths,
            client,
            ledger_url=ledger,
            fallback=arguments.fallback_rules(profile, limit),
            names=arguments.stores(base_url, token),
        )
    if as_json:
        _echo([json.dumps(reports.plan_json(jobs_file, plans), indent=2)])
    else:
        _echo(reports.plan_lines(plans) if plans else ["Nothing to send."])


@app.command("limits")
def limits_command(
    ctx: typer.Context,
    base_url: _BaseUrlOpt = None,
    token: _TokenOpt = None,
    profile: _ProfileOpt = Profile.B,
    limit: _LimitOpt = None,
    state_dir: _StateDirOpt = None,
    ledger: _LedgerOpt = None,
    forget: Annotated[
        list[str] | None,
        typer.Option(
            "--forget",
            metavar="KEY",
            help="Forget what was learned of KEY's limit (or 'all'); repeatable.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object, for scripts.")
    ] = False,
) -> None:
    """The rule each key is paced by for a client, and what was learned of it."""
    from batchrun.cli import overview

    limit = _with_file_limits(ctx, limit)
    with _reported():
        client = arguments.learning_client(base_url, token)
        rules = arguments.rules(profile, limit, 1.0)
        asked = arguments.forgotten(forget)
        paths = StatePaths.resolve(state_dir, create=bool(asked))
        forgotten = (
            overview.forget(asked, paths, client, ledger_url=ledger) if asked else []
        )
        found = overview.limits(
            rules,
            paths,
            client,
            ledger_url=ledger,
            fallback=arguments.fallback_rules(profile, limit),
        )
    if as_json:
        _echo([json.dumps(reports.limits_json(found), indent=2)])
    else:
        _echo(reports.limits_lines(found, asked, forgotten))


@app.command()
def show(
    jobs_file: _JobsArg,
    job_id: Annotated[str, typer.Argument(metavar="ID", help="The job's id.")],
    results: _ResultsOpt = None,
    state_dir: _StateDirOpt = None,
    base_url: _BaseUrlOpt = None,
    token: _TokenOpt = None,
    as_json: _JsonFlag = False,
) -> None:
    """One job of JOBS_FILE's latest run: its state, attempts, error and response."""
    from batchrun.cli.overview import show as find

    with _reported():
        paths = StatePaths.resolve(state_dir, create=False)
        where = results or default_results_path(jobs_file)
        shown = find(jobs_file, job_id, paths, arguments.stores(base_url, token), where)
    if as_json:
        _echo([json.dumps(reports.show_json(shown), indent=2)])
    else:
        _echo(reports.show_lines(shown))


@app.command(
    "cron-line",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def cron_line(
    ctx: typer.Context,
    jobs_file: _JobsArg,
    schedule: Annotated[
        str, typer.Option(help="When: five cron fields or an @word.")
    ] = "0 1 * * *",
    deadline: Annotated[
        str, typer.Option(metavar="DURATION", help="Each run's --deadline.")
    ] = "55m",
    log: Annotated[
        Path | None,
        typer.Option(help="Log file, appended to. Default: logs/NAME.log beside JOBS."),
    ] = None,
    env_file: Annotated[
        Path | None,
        typer.Option(help="A file of KEY=value lines (BATCHRUN_TOKEN=…) read first."),
    ] = None,
    state_dir: _StateDirOpt = None,
    base_url: _BaseUrlOpt = None,
) -> None:
    """Print a crontab line that runs `submit JOBS_FILE` under cron's bare
    environment; other options (--profile a, --limit …) are passed on to submit."""
    from batchrun.cli.crontab import crontab_line

    with _reported():
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
        _to_stderr(
            "The line holds no token: put BATCHRUN_TOKEN=… in a file only you can "
            "read (chmod 600) and add --env-file FILE."
        )
    _echo([crontab_line(job)])


@app.command("config")
def config_command(ctx: typer.Context, as_json: _JsonFlag = False) -> None:
    """The settings in force with no flag (BATCHRUN_* variables, batchrun.toml,
    the user's config.toml, defaults) and where each came from; never the token."""
    found = ctx.obj if isinstance(ctx.obj, config.Config) else config.Config(())
    rows = arguments.settings_in_force(found, os.environ)
    profile = Profile(next(row.value for row in rows if row.key == "profile"))
    limits = arguments.limits_in_force(found, profile)
    token = "BATCHRUN_TOKEN" if os.environ.get("BATCHRUN_TOKEN") else None
    if as_json:
        shown = reports.config_json(rows, limits, token, found.files)
        _echo([json.dumps(shown, indent=2)])
    else:
        _echo(reports.config_lines(rows, limits, token, found.files))


@app.command("sandbox")
def sandbox_command(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on.")
    ] = 8000,
    profile: _ProfileOpt = Profile.B,
    limit: _LimitOpt = None,
    inject: _InjectOpt = None,
    counting: _CountingOpt = LimiterKind.SLIDING,
    burst: _BurstOpt = 0,
    headers: _HeadersOpt = HeaderStyle.NONE,
    time_scale: _TimeScaleOpt = 1.0,
) -> None:
    """Serve a local copy of the API that enforces the limits, counted as told."""
    from batchrun.sandbox import app as sandbox
    from batchrun.sandbox import faults, serving

    with _reported():
        rules = arguments.served_rules(profile, limit, time_scale)
        server = sandbox.create_app(
            rules=rules,
            faults=faults.parse_faults(inject or []),
            counting=counting,
            headers=headers,
            burst=burst,
        )
    limits = ", ".join(f"{key.value} {rule}" for key, rule in rules.items())
    bucket = f" (burst {burst})" if burst else ""
    how = f"counting {counting.value}{bucket}, headers {headers.value}"

    def announce(url: str) -> None:
        typer.echo(f"Sandbox on {url} ({limits}; {how}). Ctrl-C stops it.")

    with _reported():
        serving.serve(server, host=host, port=port, announce=announce)


def main() -> None:
    """The `batchrun` entry point."""
    try:
        app()
    except KeyboardInterrupt:
        _interrupted()
    except BaseExceptionGroup as group:
        # Out of a run's task group: a Ctrl-C alone is a stop, anything else a bug.
        if group.split(KeyboardInterrupt)[1] is None:
            _interrupted()
        _internal(group)
    except Exception as exc:
        _internal(exc)


def _interrupted() -> NoReturn:
    typer.echo("Interrupted.", err=True)
    sys.exit(EXIT_INTERRUPTED)


def _internal(exc: BaseException) -> NoReturn:
    """Report a bug in one line per exception and exit 70 (never 1, which means
    "some jobs failed")."""
    if os.environ.get("BATCHRUN_DEBUG"):
        raise exc
    # No traceback: its frames could hold the token. BATCHRUN_DEBUG=1 shows it.
    for leaf in _leaves(exc):
        typer.echo(f"batchrun: internal error: {type(leaf).__name__}: {leaf}", err=True)
    typer.echo(
        "Please report this (rerun with BATCHRUN_DEBUG=1 for details).", err=True
    )
    sys.exit(EXIT_INTERNAL)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions an ExceptionGroup holds, however nested; else `exc` alone."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"batchrun {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version."
        ),
    ] = False,
) -> None:
    """Spread a queue of API jobs over time so that they never trip the rate limits."""
    with _reported():
        found = config.load()
    ctx.obj = found
    ctx.default_map = arguments.config_defaults(found, ctx.command)


def _with_file_limits(ctx: typer.Context, limit: list[str] | None) -> list[str]:
    """The config files' [limits], then --limit, which wins key by key."""
    found = ctx.obj if isinstance(ctx.obj, config.Config) else config.Config(())
    return [*found.limit_flags(), *(limit or [])]


def _echo(lines: list[str]) -> None:
    """Print on stdout; a reader that left early (`| head`) is not a failure."""
    try:
        for line in lines:
            typer.echo(line)
    except BrokenPipeError:
        # Python's advice: point stdout at /dev/null, or the flush at exit fails
        # again, and Click would exit 1 for a command that did its work.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _from_stdin(results: Path, state: StatePaths) -> Path:
    """The jobs piped in, copied into the state folder under a name of their
    results file's, so that the same pipe run again finds its run and resumes.
    JSON Lines if the first character is `{`, else CSV."""
    stream = typer.get_binary_stream("stdin")
    head = stream.read(65536)
    kind = ".jsonl" if head.lstrip().startswith(b"{") else ".csv"
    copy = state.stdin_copy(results, kind)
    try:
        with copy.open("wb") as file:
            file.write(head)
            shutil.copyfileobj(stream, file)
    except OSError as exc:
        msg = f"cannot keep the jobs read from stdin in {copy}: {exc.strerror or exc}."
        raise UsageError(msg) from None
    return copy


def _to_stderr(text: str) -> None:
    typer.echo(text, err=True)


def _log_for(jobs_file: Path) -> Callable[[str], None]:
    """How `submit` writes on stderr: off a terminal (cron, a log file) each line
    carries the time, the process and the jobs file, as the plain progress does."""
    if sys.stderr.isatty():
        return _to_stderr
    from batchrun.cli.progress import log_tag, stamped

    tag = log_tag(jobs_file)
    return lambda text: _to_stderr(stamped(text, tag=tag, wall=datetime.now))


@contextmanager
def _reported(say: Callable[[str], None] = _to_stderr) -> Iterator[None]:
    """Print a BatchrunError's message on stderr and exit with its code, also one
    raised in a run's task group (inside an ExceptionGroup). A group that holds
    another exception too goes on to `main`, which reports a bug (exit 70)."""
    try:
        yield
    except* BatchrunError as group:
        errors = [leaf for leaf in _leaves(group) if isinstance(leaf, BatchrunError)]
        # A state problem says most about what to do; else the first one raised.
        exc = min(errors, key=lambda e: not isinstance(e, StateError))
        say(f"{exc.label}{exc.message}")
        raise typer.Exit(exc.exit_code) from None
