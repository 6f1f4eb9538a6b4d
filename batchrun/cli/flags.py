"""Typer, declared once: the app, every flag and argument of the commands (names,
help texts, checks of defaults, help panels), and the two calls a command makes of
it (`done`, and `Context`'s type). The only module that imports typer; what the
flags' strings mean is `arguments`'.

Each flag is declared once, its help text in the same module, so a new flag is
one edit here.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import typer.core

from batchrun import __version__
from batchrun.cli import config
from batchrun.core.errors import Exit
from batchrun.core.limits import Pace, Profile
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle

# The help texts that take more than a line.
_PROFILE = (
    "run-query limit: b = 15/1m+500/1h (the stricter, default), a = 30/1m; auto = a "
    "until the server shows it is b (at most one 429 to find out)."
)

_SANDBOX_PROFILE = (
    "The run-query limit the sandbox enforces: b = 15/1m+500/1h (default), a = 30/1m."
)

_INJECT = (
    "Sandbox faults: 429=0.05, 5xx=0.1, drop=0.05, slow=0.1, slow-seconds=2, seed=7 "
    "(repeatable)."
)

_SERVER_BURST = (
    "With --sandbox and --server-counting leaky: its burst, as `batchrun sandbox "
    "--burst`."
)

_SERVER_LIMIT = (
    "With --sandbox: the sandbox enforces this rule for KEY instead of the client's, "
    "e.g. run-query=10/1m, to watch the client learn it (repeatable)."
)

_SERVER_COUNTING = (
    "With --sandbox: how it counts: sliding (the default), fixed, weighted or leaky, "
    "as `batchrun sandbox --counting`."
)

_SERVER_HEADERS = (
    "With --sandbox: the rate-limit headers it states: none (the default), ietf, "
    "draft7 or x-ratelimit, as `batchrun sandbox --headers`."
)

_LEDGER = (
    "Where the client's budget lives: redis://[:PASSWORD@]HOST:PORT/DB (rediss:// for"
    " TLS) shares it across machines. Default: SQLite in the state folder (this "
    "machine)."
)

_RETRY_UNKNOWN = (
    "Resend invites left unknown (a timeout, a 5xx, or a run that died mid-request: "
    "the server may have processed them)."
)

_RUN_ID = (
    "Name this round; a new name sends every job again (a new night). %-codes take "
    "today's date: --run-id %F is one round a day."
)

_COUNTING = (
    "How the sandbox counts: sliding (a log, exact), fixed (aligned windows), "
    "weighted (a sliding-window estimate from two fixed counts), leaky (nginx "
    "limit_req: one request per WINDOW/COUNT, and --burst more at once)."
)

_BURST = (
    "With --counting leaky: requests the bucket lets through at once beyond the first"
    " (nginx's limit_req burst=B nodelay)."
)

_HEADERS = (
    "Rate-limit headers the sandbox states on every answer: none (only a 429's "
    "Retry-After), ietf (RateLimit-Policy and RateLimit, draft 08 on), draft7 "
    "(express-rate-limit's RateLimit: limit=, remaining=, reset=), x-ratelimit "
    "(X-RateLimit-Limit, -Remaining and -Reset)."
)

_BUDGET_KEY = (
    "Name the client's budget in the ledger: rotated or sibling tokens of one quota "
    "that give the same NAME share it. Default: base URL + token."
)

_HALT_AFTER = (
    "Stop starting jobs once N jobs of this run failed, or P% of those ended (from "
    "20 on); finish those in flight, exit 1, the rest left for a resume."
)

_METRICS_FILE = (
    "Write the run as Prometheus text (node_exporter's textfile collector: name it "
    "*.prom) once a minute and at its end. Needs the metrics extra: from a "
    "checkout, pip install '.\\[metrics]'."
)

_FAILED = (
    "Write the failed jobs of the latest run to PATH as a jobs file of the same "
    "format and columns, to fix and submit again."
)


def _no_bool(params: list[Any]) -> list[Any]:
    """Every on/off flag shown without a value, `--help` and `--version` too."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class _Group(typer.core.TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _no_bool(super().get_params(ctx))


class Command(typer.core.TyperCommand):
    """A command whose on/off flags show no `<bool>` in --help, and whose usage
    line names a required argument as it is (JOBS_FILE, not {JOBS_FILE})."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_bool(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p[:1] + p[-1:] == "{}" else p for p in pieces]


_E = TypeVar("_E", bound=StrEnum)

app = typer.Typer(
    name="batchrun",
    cls=_Group,
    help="Spread a queue of API jobs over time, inside the API's rate limits.",
    no_args_is_help=True,
    add_completion=True,
    # A traceback with locals could show the token; terminal.reported reports errors.
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
Context = typer.Context


def done(code: int = 0) -> NoReturn:
    """End the command with exit code `code`."""
    raise typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"batchrun {__version__}")
        raise typer.Exit()


class _ChoiceError(typer.BadParameter):
    """A bad choice, said as the flag and its choices, with no "Invalid value"."""

    def format_message(self) -> str:
        return self.message


def _choices(
    flag: str, kind: type[_E], *, allowed: tuple[_E, ...] = ()
) -> Callable[[Any], _E]:
    """A parser of `flag`'s value: one of `allowed` (default every member)."""
    members = allowed or tuple(kind)
    names = [member.value for member in members]
    said = f"{', '.join(names[:-1])} or {names[-1]}"

    def parse(value: Any) -> _E:
        for member in members:
            if str(value) == member.value:
                return member
        msg = f"{flag} must be {said}, not {str(value)!r}."
        raise _ChoiceError(msg)

    return parse


def _switch(*names: str, help: str, panel: str) -> Any:
    """An on/off flag with no value shown in --help."""
    return typer.Option(*names, help=help, rich_help_panel=panel, metavar="")


VersionFlag = Annotated[
    bool,
    typer.Option(
        "--version",
        callback=_version,
        is_eager=True,
        metavar="",
        help="Show the version.",
    ),
]
JobsArg = Annotated[
    Path,
    typer.Argument(
        metavar="JOBS_FILE",
        help="The jobs file: CSV, or JSON Lines if it ends in .jsonl.",
    ),
]
ProfileOpt = Annotated[
    Profile,
    typer.Option(
        "--profile",
        metavar="a|b|auto",
        parser=_choices("--profile", Profile),
        help=_PROFILE,
        rich_help_panel="Limits",
    ),
]
# The sandbox enforces one statement: `auto` means nothing for a server.
SandboxProfileOpt = Annotated[
    Profile,
    typer.Option(
        "--profile",
        metavar="a|b",
        parser=_choices("--profile", Profile, allowed=(Profile.A, Profile.B)),
        help=_SANDBOX_PROFILE,
        rich_help_panel="Limits",
    ),
]
LimitOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--limit",
        metavar="KEY=RULE",
        help="Replace one key's rule, e.g. run-query=30/1m (repeatable).",
        rich_help_panel="Limits",
    ),
]
TimeScaleOpt = Annotated[
    float,
    typer.Option(
        "--time-scale",
        help="Divide every window by this factor (demos, tests): 30 makes 1m 2s.",
        rich_help_panel="Limits",
    ),
]
InjectOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--inject",
        metavar="FAULT=RATE",
        help=_INJECT,
        rich_help_panel="Sandbox faults",
    ),
]
# submit's flags that act only with --sandbox: their panel is the last.
_WITH_SANDBOX = "With --sandbox"
SubmitInjectOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--inject",
        metavar="FAULT=RATE",
        help=_INJECT,
        rich_help_panel=_WITH_SANDBOX,
    ),
]
# Choices are named in the help text: Rich would fold a long list mid-word.
CountingOpt = Annotated[
    LimiterKind,
    typer.Option(
        "--counting",
        metavar="KIND",
        parser=_choices("--counting", LimiterKind),
        help=_COUNTING,
    ),
]
BurstOpt = Annotated[int, typer.Option("--burst", min=0, help=_BURST)]
ServerBurstOpt = Annotated[
    int | None,
    typer.Option(
        "--server-burst",
        min=0,
        show_default=False,
        help=_SERVER_BURST,
        rich_help_panel=_WITH_SANDBOX,
    ),
]
HeadersOpt = Annotated[
    HeaderStyle,
    typer.Option(
        "--headers",
        metavar="STYLE",
        parser=_choices("--headers", HeaderStyle),
        help=_HEADERS,
    ),
]
ServerLimitOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--server-limit",
        metavar="KEY=RULE",
        help=_SERVER_LIMIT,
        rich_help_panel=_WITH_SANDBOX,
    ),
]
ServerCountingOpt = Annotated[
    LimiterKind | None,
    typer.Option(
        "--server-counting",
        metavar="KIND",
        parser=_choices("--server-counting", LimiterKind),
        show_default=False,
        help=_SERVER_COUNTING,
        rich_help_panel=_WITH_SANDBOX,
    ),
]
ServerHeadersOpt = Annotated[
    HeaderStyle | None,
    typer.Option(
        "--server-headers",
        metavar="STYLE",
        parser=_choices("--server-headers", HeaderStyle),
        show_default=False,
        help=_SERVER_HEADERS,
        rich_help_panel=_WITH_SANDBOX,
    ),
]
StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        envvar="BATCHRUN_STATE_DIR",
        help="Where runs and the send ledger live. Default: the user's state folder.",
        rich_help_panel="State",
    ),
]
LedgerOpt = Annotated[
    str | None,
    typer.Option(
        "--ledger",
        envvar="BATCHRUN_LEDGER_URL",
        metavar="URL",
        show_default=False,
        help=_LEDGER,
        rich_help_panel="State",
    ),
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        envvar="BATCHRUN_BASE_URL",
        help="The API's base URL.",
        rich_help_panel="Where to send",
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        envvar="BATCHRUN_TOKEN",
        show_default=False,
        help="Bearer token (better: set BATCHRUN_TOKEN). Never printed or stored.",
        rich_help_panel="Where to send",
    ),
]
PaceOpt = Annotated[
    Pace,
    typer.Option(
        metavar="exact|spread",
        parser=_choices("--pace", Pace),
        help="exact: as early as the windows allow; spread: evenly spaced.",
        rich_help_panel="Limits",
    ),
]
ConcurrencyOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Most requests in flight at once, a hard cap. Default: as the limits "
        "need (each endpoint's rate times its answer times), 8 to 64.",
        rich_help_panel="Limits",
    ),
]
AttemptsOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="Give up on a job after this many server errors or timeouts.",
        rich_help_panel="Run control",
    ),
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        min=0.001,
        help="Seconds to wait for each answer.",
        rich_help_panel="Where to send",
    ),
]
ResultsOpt = Annotated[
    Path | None,
    typer.Option(
        help="Results file (JSON Lines). Default: JOBS.results.jsonl.",
        rich_help_panel="Output",
    ),
]
SandboxFlag = Annotated[
    bool,
    _switch(
        "--sandbox",
        help="Run against the built-in local sandbox.",
        panel="Where to send",
    ),
]
CaBundleOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="PATH",
        help="Also trust the CA certificates in this PEM file (a private CA).",
        rich_help_panel="Where to send",
    ),
]
DeadlineOpt = Annotated[
    str | None,
    typer.Option(
        metavar="DURATION",
        help=(
            "Stop starting requests after this long (e.g. 55m), then exit "
            f"{Exit.STOPPED.value}."
        ),
        rich_help_panel="Run control",
    ),
]
RetryFailedFlag = Annotated[
    bool,
    _switch(
        "--retry-failed",
        help="Try failed jobs again.",
        panel="Run control",
    ),
]
RetryUnknownFlag = Annotated[
    bool,
    _switch(
        "--retry-unknown",
        help=_RETRY_UNKNOWN,
        panel="Run control",
    ),
]
RestartFlag = Annotated[
    bool,
    _switch(
        "--restart",
        help="Forget earlier runs of this file; start over.",
        panel="Run control",
    ),
]
RunIdOpt = Annotated[
    str | None,
    typer.Option(
        "--run-id",
        metavar="ID",
        help=_RUN_ID,
        rich_help_panel="Run control",
    ),
]
JsonFlag = Annotated[
    bool,
    _switch(
        "--json",
        help="One JSON object on stdout, for scripts.",
        panel="Output",
    ),
]
QuietFlag = Annotated[
    bool,
    _switch(
        "--quiet",
        "-q",
        help="Only failures and the summary (plain lines, no live view).",
        panel="Output",
    ),
]
VerboseFlag = Annotated[
    bool,
    _switch(
        "--verbose",
        "-v",
        help="Every requeue in the plain log, not only the first 20.",
        panel="Output",
    ),
]
NoColorFlag = Annotated[
    bool,
    _switch(
        "--no-color",
        help="No colour in the live view (as NO_COLOR=1).",
        panel="Output",
    ),
]

ScriptJsonFlag = Annotated[
    bool, typer.Option("--json", help="One JSON object, for scripts.")
]
ShowOpt = Annotated[
    str,
    typer.Option(
        "--show",
        metavar="N|all",
        help="How many failed and unknown jobs to list (all: every one).",
    ),
]
ForgetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--forget",
        metavar="KEY",
        help="Forget what was learned of KEY's limit (or 'all'); repeatable.",
    ),
]
JobIdArg = Annotated[str, typer.Argument(metavar="ID", help="The job's id.")]
ScheduleOpt = Annotated[str, typer.Option(help="When: five cron fields or an @word.")]
CronDeadlineOpt = Annotated[
    str, typer.Option(metavar="DURATION", help="Each run's --deadline.")
]
LogOpt = Annotated[
    Path | None,
    typer.Option(help="Log file, appended to. Default: logs/NAME.log beside JOBS."),
]
EnvFileOpt = Annotated[
    Path | None,
    typer.Option(help="A file of KEY=value lines (BATCHRUN_TOKEN=…) read first."),
]
HostOpt = Annotated[str, typer.Option(help="Interface to listen on.")]
PortOpt = Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")]


def _named(flag: str, metavar: str, text: str, panel: str | None = None) -> Any:
    """An option that takes a value and shows no default."""
    return typer.Option(
        flag, metavar=metavar, show_default=False, help=text, rich_help_panel=panel
    )


BudgetKeyOpt = Annotated[
    str | None, _named("--budget-key", "NAME", _BUDGET_KEY, "State")
]
HaltAfterOpt = Annotated[
    str | None, _named("--halt-after", "N|P%", _HALT_AFTER, "Run control")
]
MetricsFileOpt = Annotated[
    Path | None, _named("--metrics-file", "PATH", _METRICS_FILE, "Output")
]
FailedOpt = Annotated[Path | None, _named("--failed-as-jobs", "PATH", _FAILED)]


def with_file_limits(ctx: Context, limit: list[str] | None) -> list[str]:
    """The config files' [limits], then --limit, which wins key by key."""
    found = ctx.obj if isinstance(ctx.obj, config.Config) else config.Config(())
    return [*found.limit_flags(), *(limit or [])]
