"""The flags and arguments of the commands, as Typer declares them: names, help
texts, defaults' checks and help panels. What their strings mean is `arguments`'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli import config
from batchrun.core.limits import Pace, Profile
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle

JobsArg = Annotated[
    Path, typer.Argument(help="The jobs file: CSV, or JSON Lines if it ends in .jsonl.")
]
ProfileOpt = Annotated[
    Profile,
    typer.Option(
        "--profile",
        help="run-query limit: b = 15/1m+500/1h (the stricter, default), a = 30/1m; "
        "auto = a until the server shows it is b (at most one 429 to find out).",
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
CountingOpt = Annotated[LimiterKind, typer.Option("--counting", help=_COUNTING_HELP)]
BurstOpt = Annotated[int, typer.Option("--burst", min=0, help=_BURST_HELP)]
ServerBurstOpt = Annotated[
    int | None,
    typer.Option(
        "--server-burst",
        min=0,
        show_default=False,
        help="With --sandbox and --server-counting leaky: its burst, as "
        "`batchrun sandbox --burst`.",
    ),
]
HeadersOpt = Annotated[HeaderStyle, typer.Option("--headers", help=_HEADERS_HELP)]
ServerLimitOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--server-limit",
        metavar="KEY=RULE",
        help="With --sandbox: the sandbox enforces this rule for KEY instead of "
        "the client's, e.g. run-query=10/1m, to watch the client learn it "
        "(repeatable).",
    ),
]
ServerCountingOpt = Annotated[
    LimiterKind | None,
    typer.Option(
        "--server-counting",
        show_default=False,
        help="With --sandbox: how it counts, as `batchrun sandbox --counting` "
        "(default sliding).",
    ),
]
ServerHeadersOpt = Annotated[
    HeaderStyle | None,
    typer.Option(
        "--server-headers",
        show_default=False,
        help="With --sandbox: the rate-limit headers it states, as `batchrun "
        "sandbox --headers` (default none).",
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
        help="Where the client's budget lives: redis://[:PASSWORD@]HOST:PORT/DB "
        "(rediss:// for TLS) shares it across machines. Default: SQLite in the "
        "state folder (this machine).",
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
        help="exact: as early as the windows allow; spread: evenly spaced.",
        rich_help_panel="Limits",
    ),
]
ConcurrencyOpt = Annotated[
    int,
    typer.Option(
        min=1, help="Most requests in flight at once.", rich_help_panel="Limits"
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
    typer.Option(
        "--sandbox",
        help="Run against the built-in local sandbox.",
        rich_help_panel="Where to send",
        metavar="",
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
    typer.Option(
        "--retry-failed",
        help="Try failed jobs again.",
        rich_help_panel="Run control",
        metavar="",
    ),
]
RetryUnknownFlag = Annotated[
    bool,
    typer.Option(
        "--retry-unknown",
        help="Resend invites left unknown (a timeout, a 5xx, or a run that died "
        "mid-request: the server may have processed them).",
        rich_help_panel="Run control",
        metavar="",
    ),
]
RestartFlag = Annotated[
    bool,
    typer.Option(
        "--restart",
        help="Forget earlier runs of this file; start over.",
        rich_help_panel="Run control",
        metavar="",
    ),
]
RunIdOpt = Annotated[
    str | None,
    typer.Option(
        "--run-id",
        metavar="ID",
        help="Name this round; a new name sends every job again (a new night). "
        "%-codes take today's date: --run-id %F is one round a day.",
        rich_help_panel="Run control",
    ),
]
JsonFlag = Annotated[
    bool,
    typer.Option(
        "--json",
        help="One JSON object on stdout, for scripts.",
        rich_help_panel="Output",
        metavar="",
    ),
]
QuietFlag = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="Only failures and the summary (plain lines, no live view).",
        rich_help_panel="Output",
        metavar="",
    ),
]
VerboseFlag = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Every requeue in the plain log, not only the first 20.",
        rich_help_panel="Output",
        metavar="",
    ),
]
NoColorFlag = Annotated[
    bool,
    typer.Option(
        "--no-color",
        help="No colour in the live view (as NO_COLOR=1).",
        rich_help_panel="Output",
        metavar="",
    ),
]


def with_file_limits(ctx: typer.Context, limit: list[str] | None) -> list[str]:
    """The config files' [limits], then --limit, which wins key by key."""
    found = ctx.obj if isinstance(ctx.obj, config.Config) else config.Config(())
    return [*found.limit_flags(), *(limit or [])]
