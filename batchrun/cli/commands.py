"""The command line: the Typer app, its commands and the `batchrun` entry point.

`submit` and `sandbox` are here; the commands that send nothing are in
`read_commands`, registered here in the order `--help` lists them. The flags are
declared in `flags`; what they mean is `arguments`', which `submit` hands its
flags as one `SubmitOptions`. Every `BatchrunError` is caught once, in
`terminal.reported`, printed on stderr without a traceback, and turned into its
exit code. Modules that load httpx or Starlette are
imported inside the commands that need them, so `--help`, `validate` and `status`
start fast (start-up matters under cron).
"""

from __future__ import annotations

from batchrun.cli import arguments, config, defaults, flags, read_commands, terminal
from batchrun.core.errors import Exit, code_of
from batchrun.core.limits import Pace, Profile
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle

app = flags.app


@app.command(cls=flags.Command, epilog=terminal.exit_codes_epilog())
def submit(
    ctx: flags.Context,
    jobs_file: flags.JobsArg,
    base_url: flags.BaseUrlOpt = None,
    token: flags.TokenOpt = None,
    profile: flags.ProfileOpt = Profile.B,
    limit: flags.LimitOpt = None,
    pace: flags.PaceOpt = Pace.EXACT,
    concurrency: flags.ConcurrencyOpt = defaults.CONCURRENCY,
    max_attempts: flags.AttemptsOpt = 5,
    timeout: flags.TimeoutOpt = 30.0,
    results: flags.ResultsOpt = None,
    sandbox: flags.SandboxFlag = False,
    time_scale: flags.TimeScaleOpt = 1.0,
    state_dir: flags.StateDirOpt = None,
    ledger: flags.LedgerOpt = None,
    ca_bundle: flags.CaBundleOpt = None,
    deadline: flags.DeadlineOpt = None,
    retry_failed: flags.RetryFailedFlag = False,
    retry_unknown: flags.RetryUnknownFlag = False,
    restart: flags.RestartFlag = False,
    run_id: flags.RunIdOpt = None,
    no_color: flags.NoColorFlag = False,
    quiet: flags.QuietFlag = False,
    verbose: flags.VerboseFlag = False,
    halt_after: flags.HaltAfterOpt = None,
    metrics_file: flags.MetricsFileOpt = None,
    budget_key: flags.BudgetKeyOpt = None,
    # Last, so that their panel is --help's last.
    inject: flags.SubmitInjectOpt = None,
    server_limit: flags.ServerLimitOpt = None,
    server_counting: flags.ServerCountingOpt = None,
    server_headers: flags.ServerHeadersOpt = None,
    server_burst: flags.ServerBurstOpt = None,
) -> None:
    """Send every job of JOBS_FILE inside the rate limits; run it again to resume."""
    given = arguments.SubmitOptions(
        jobs_file=jobs_file,
        base_url=base_url,
        token=token,
        profile=profile,
        limit=flags.with_file_limits(ctx, limit),
        pace=pace,
        concurrency=concurrency,
        max_attempts=max_attempts,
        timeout=timeout,
        results=results,
        sandbox=sandbox,
        time_scale=time_scale,
        state_dir=state_dir,
        ledger=ledger,
        ca_bundle=ca_bundle,
        deadline=deadline,
        retry_failed=retry_failed,
        retry_unknown=retry_unknown,
        restart=restart,
        run_id=run_id,
        no_color=no_color,
        quiet=quiet,
        verbose=verbose,
        halt_after=halt_after,
        metrics_file=metrics_file,
        budget_key=budget_key,
        inject=inject,
        server_limit=server_limit,
        server_counting=server_counting,
        server_headers=server_headers,
        server_burst=server_burst,
    )
    from batchrun.run.submission import submit

    say = terminal.log_for(jobs_file)
    with terminal.reported(say):
        job = arguments.submission(
            given, stdin=terminal.from_stdin, warn=terminal.warning
        )
        end = submit(job, say=terminal.telling(say))
        flags.done(terminal.said_ending(end, say))


# The commands that send nothing, in the order `--help` lists them.
app.command(cls=flags.Command)(read_commands.validate)
app.command(cls=flags.Command)(read_commands.status)
app.command(cls=flags.Command)(read_commands.plan)
app.command("limits", cls=flags.Command)(read_commands.limits_command)
app.command(cls=flags.Command)(read_commands.show)
app.command(
    "cron-line",
    cls=flags.Command,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)(read_commands.cron_line)
app.command("config", cls=flags.Command)(read_commands.config_command)


@app.command("sandbox", cls=flags.Command)
def sandbox_command(
    host: flags.HostOpt = "127.0.0.1",
    port: flags.PortOpt = defaults.SANDBOX_PORT,
    profile: flags.SandboxProfileOpt = Profile.B,
    limit: flags.LimitOpt = None,
    inject: flags.InjectOpt = None,
    counting: flags.CountingOpt = LimiterKind.SLIDING,
    burst: flags.BurstOpt = 0,
    headers: flags.HeadersOpt = HeaderStyle.NONE,
    time_scale: flags.TimeScaleOpt = 1.0,
) -> None:
    """Serve a local copy of the API that enforces the limits, counted as told."""
    from batchrun.sandbox import app as sandbox
    from batchrun.sandbox import faults, serving

    with terminal.reported():
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
        terminal.echo([f"Sandbox on {url} ({limits}; {how}). Ctrl-C stops it."])

    with terminal.reported():
        serving.serve(server, host=host, port=port, announce=announce)


def main() -> None:
    """The `batchrun` entry point."""
    try:
        app()
    except (KeyboardInterrupt, BaseExceptionGroup, Exception) as exc:
        # Also out of a run's task group: a Ctrl-C alone is a stop, anything else
        # a bug (a BatchrunError was reported by `terminal.reported`).
        if code_of(exc) is Exit.INTERRUPTED:
            terminal.interrupted()
        terminal.internal_error(exc)


@app.callback()
def _options(
    ctx: flags.Context,
    version: flags.VersionFlag = False,
) -> None:
    """Spread a queue of API jobs over time so that they never trip the rate limits."""
    with terminal.reported():
        found = config.load()
    ctx.obj = found
    ctx.default_map = defaults.config_defaults(found, ctx.command)
