"""Typer, declared once: the app, every flag and argument of the commands (names,
help texts, checks of defaults, help panels), and the two calls a command makes of
it (`done`, and `Context`'s type). The only module that imports typer; what the
flags' strings mean is `arguments`'.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import typer.core

from batchrun import __version__
from batchrun.cli import config, helps
from batchrun.core.limits import Pace, Profile
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle


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
        help=helps.PROFILE,
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
        help=helps.SANDBOX_PROFILE,
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
        help=helps.INJECT,
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
        help=helps.INJECT,
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
        help=helps.COUNTING,
    ),
]
BurstOpt = Annotated[int, typer.Option("--burst", min=0, help=helps.BURST)]
ServerBurstOpt = Annotated[
    int | None,
    typer.Option(
        "--server-burst",
        min=0,
        show_default=False,
        help=helps.SERVER_BURST,
        rich_help_panel=_WITH_SANDBOX,
    ),
]
HeadersOpt = Annotated[
    HeaderStyle,
    typer.Option(
        "--headers",
        metavar="STYLE",
        parser=_choices("--headers", HeaderStyle),
        help=helps.HEADERS,
    ),
]
ServerLimitOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--server-limit",
        metavar="KEY=RULE",
        help=helps.SERVER_LIMIT,
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
        help=helps.SERVER_COUNTING,
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
        help=helps.SERVER_HEADERS,
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
        help=helps.LEDGER,
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
        help="Stop starting requests after this long (e.g. 55m), then exit 75.",
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
        help=helps.RETRY_UNKNOWN,
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
        help=helps.RUN_ID,
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
    str | None, _named("--budget-key", "NAME", helps.BUDGET_KEY, "State")
]
HaltAfterOpt = Annotated[
    str | None, _named("--halt-after", "N|P%", helps.HALT_AFTER, "Run control")
]
MetricsFileOpt = Annotated[
    Path | None, _named("--metrics-file", "PATH", helps.METRICS_FILE, "Output")
]
FailedOpt = Annotated[Path | None, _named("--failed-as-jobs", "PATH", helps.FAILED)]


def with_file_limits(ctx: Context, limit: list[str] | None) -> list[str]:
    """The config files' [limits], then --limit, which wins key by key."""
    found = ctx.obj if isinstance(ctx.obj, config.Config) else config.Config(())
    return [*found.limit_flags(), *(limit or [])]
