"""The help texts of the commands' flags that take more than a line: `flags`
declares each flag, and names its text here.
"""

from __future__ import annotations

PROFILE = (
    "run-query limit: b = 15/1m+500/1h (the stricter, default), a = 30/1m; auto = a "
    "until the server shows it is b (at most one 429 to find out)."
)

SANDBOX_PROFILE = (
    "The run-query limit the sandbox enforces: b = 15/1m+500/1h (default), a = 30/1m."
)

INJECT = (
    "Sandbox faults: 429=0.05, 5xx=0.1, drop=0.05, slow=0.1, slow-seconds=2, seed=7 "
    "(repeatable)."
)

SERVER_BURST = (
    "With --sandbox and --server-counting leaky: its burst, as `batchrun sandbox "
    "--burst`."
)

SERVER_LIMIT = (
    "With --sandbox: the sandbox enforces this rule for KEY instead of the client's, "
    "e.g. run-query=10/1m, to watch the client learn it (repeatable)."
)

SERVER_COUNTING = (
    "With --sandbox: how it counts: sliding (the default), fixed, weighted or leaky, "
    "as `batchrun sandbox --counting`."
)

SERVER_HEADERS = (
    "With --sandbox: the rate-limit headers it states: none (the default), ietf, "
    "draft7 or x-ratelimit, as `batchrun sandbox --headers`."
)

LEDGER = (
    "Where the client's budget lives: redis://[:PASSWORD@]HOST:PORT/DB (rediss:// for"
    " TLS) shares it across machines. Default: SQLite in the state folder (this "
    "machine)."
)

RETRY_UNKNOWN = (
    "Resend invites left unknown (a timeout, a 5xx, or a run that died mid-request: "
    "the server may have processed them)."
)

RUN_ID = (
    "Name this round; a new name sends every job again (a new night). %-codes take "
    "today's date: --run-id %F is one round a day."
)

COUNTING = (
    "How the sandbox counts: sliding (a log, exact), fixed (aligned windows), "
    "weighted (a sliding-window estimate from two fixed counts), leaky (nginx "
    "limit_req: one request per WINDOW/COUNT, and --burst more at once)."
)

BURST = (
    "With --counting leaky: requests the bucket lets through at once beyond the first"
    " (nginx's limit_req burst=B nodelay)."
)

HEADERS = (
    "Rate-limit headers the sandbox states on every answer: none (only a 429's "
    "Retry-After), ietf (RateLimit-Policy and RateLimit, draft 08 on), draft7 "
    "(express-rate-limit's RateLimit: limit=, remaining=, reset=), x-ratelimit "
    "(X-RateLimit-Limit, -Remaining and -Reset)."
)

BUDGET_KEY = (
    "Name the client's budget in the ledger: rotated or sibling tokens of one quota "
    "that give the same NAME share it. Default: base URL + token."
)

HALT_AFTER = (
    "Stop starting jobs once N jobs of this run failed, or P% of those ended (from "
    "20 on); finish those in flight, exit 1, the rest left for a resume."
)

METRICS_FILE = (
    "Write the run as Prometheus text (node_exporter's textfile collector: name it "
    "*.prom) once a minute and at its end. Needs the metrics extra: from a "
    "checkout, pip install '.\\[metrics]'."
)

FAILED = (
    "Write the failed jobs of the latest run to PATH as a jobs file of the same "
    "format and columns, to fix and submit again."
)
