"""Issue 24 items 4 and 5, measured: what the arrival bound saves when answers are
slow, and what a server's policy headers cost; on loopback and on the virtual clock.

    PYTHONPATH=. python -m bench.arrival [--jobs 120] [--rounds 3]

Loopback: the sandbox (counting at arrival, sliding log 30/2s) answers every
accepted request `work` seconds after its arrival (`--inject slow=1
--inject slow-seconds=W`), and batchrun (Runner + Client + SqliteLedger, as the
CLI wires them) sends `--jobs` run-query jobs at 30/2s, with the bound and
without it (each request counted until its answer, as before). The ratio is the
span of the server's arrivals over the ideal span (`slots.eta`: the last of N
requests may arrive (N/30 - 1) windows after the first). The learner's serial
start (a key sends one request at a time beyond what the server has been seen to
accept, removed by issue 24 item 3) is turned off in every case here: it is not
what this measures. Policy headers: the server enforces 10/2s, the client is told
30/2s, the sandbox states its policy in each header style; 429s after the first
answer are counted. Stock slowapi (moving window 2/1s) answering 1.5 s after each
arrival: work longer than the window, where requests in flight fill it. Virtual
clock: support/simulation.py, seeded, no real time.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import anyio

from batchrun.core.limits import LimitKey, Rule, parse_rule
from batchrun.pacing.learner import Learner
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.slots import eta
from batchrun.run import runner
from batchrun.sandbox.app import create_app
from batchrun.sandbox.faults import Faults
from batchrun.sandbox.policy_headers import HeaderStyle
from batchrun.sandbox.serving import running
from bench.drivers import drive_batchrun
from support import slowapi_server
from support.case_server import Behaviour
from support.simulation import Network, Server, simulate
from support.stock import limits_server

RULE = "30/2s"
CONCURRENCY = 32
# Work longer than the window: 2/1s with every answer 1.5 s after its arrival.
SLOW_RULE, SLOW_WORK, SLOW_JOBS = "2/1s", 1.5, 40


def _serial_start(on: bool) -> Callable[[], None]:
    """Turn the learner's probe gate beyond what the server was seen to accept
    off, where it would hide what is measured; returns the undo."""
    kept = Learner.opens
    if not on:
        Learner.opens = lambda self, key, now, reach, round_: None  # type: ignore[method-assign]
    return lambda: setattr(Learner, "opens", kept)


def _bound(on: bool) -> Callable[[], None]:
    """Run with the arrival bound on, or off (every request counts until its
    answer); returns the undo."""
    kept = runner._trip
    if not on:
        runner._trip = lambda began, outcome: None
    return lambda: setattr(runner, "_trip", kept)


def _ratio(arrivals: list[float], rule: Rule) -> float:
    """The span of the arrivals over the least span the rule allows for them."""
    ideal = eta(len(arrivals), rule, now=0.0)
    return (max(arrivals) - min(arrivals)) / ideal


def _sandbox_run(
    jobs: int,
    work: float,
    *,
    bound: bool,
    server_rule: str = RULE,
    told: str = RULE,
    headers: HeaderStyle = HeaderStyle.NONE,
) -> tuple[float, int, int]:
    """(ratio, 429s, 429s after the first answer) of one run against the sandbox."""
    faults = Faults(rate_slow=1.0 if work else 0.0, slow_seconds=work)
    rules = {key: parse_rule(server_rule) for key in LimitKey}
    app = create_app(rules=rules, faults=faults, headers=headers)
    undo = _bound(bound)
    try:
        with running(app) as url:
            client = {LimitKey.RUN_QUERY: parse_rule(told)}
            anyio.run(drive_batchrun, url, client, jobs, CONCURRENCY, None)
    finally:
        undo()
    seen = app.state.sandbox.arrivals
    accepted = [a.at for a in seen if a.status == 200]
    refused = [a.at for a in seen if a.status == 429]
    first_answer = min(a.at for a in seen) + work
    late = sum(1 for at in refused if at > first_answer)
    return _ratio(accepted, parse_rule(server_rule)), len(refused), late


def _stock_run(jobs: int, *, bound: bool) -> tuple[float, int, int]:
    """One run against `limits` (moving window 30/2s), answering at once."""
    undo = _bound(bound)
    try:
        with limits_server(RULE) as stock:
            client = {LimitKey.RUN_QUERY: parse_rule(RULE)}
            anyio.run(drive_batchrun, stock.url, client, jobs, CONCURRENCY, None)
            seen = stock.arrivals()
    finally:
        undo()
    accepted = [a.at for a in seen if a.status == 200]
    refused = sum(1 for a in seen if a.status == 429)
    return _ratio(accepted, parse_rule(RULE)), refused, refused


def _slowapi_run(jobs: int, *, bound: bool) -> tuple[float, int, int]:
    """One run against stock slowapi (moving window `SLOW_RULE`) answering every
    accepted request `SLOW_WORK` after its arrival: work longer than the
    window, so that requests in flight fill it (`arrival`: their leases)."""
    undo = _bound(bound)
    try:
        with slowapi_server.serving(SLOW_RULE, Behaviour(latency=SLOW_WORK)) as app:
            client = {LimitKey.RUN_QUERY: parse_rule(SLOW_RULE)}
            anyio.run(drive_batchrun, app.url, client, jobs, CONCURRENCY, None)
            seen = list(app.log)
    finally:
        undo()
    accepted = [a.at for a in seen if a.status == 200]
    refused = sum(1 for a in seen if a.status == 429)
    return _ratio(accepted, parse_rule(SLOW_RULE)), refused, refused


def _virtual(jobs: int, work: float, latency: tuple[float, float], traced: bool) -> str:
    server = Server(LimiterKind.SLIDING, parse_rule(RULE))
    network = Network(work=work, traced=traced, connections=CONCURRENCY)
    run = simulate(
        client=RULE,
        server=server,
        count=jobs,
        concurrency=CONCURRENCY,
        latency=latency,
        network=network,
    )
    return f"{run.ratio:.3f} x, {sum(run.rate_limited.values())} x 429"


def _median(rows: list[tuple[float, int, int]]) -> str:
    ratio = statistics.median(r[0] for r in rows)
    refused = [r[1] for r in rows]
    late = [r[2] for r in rows]
    return f"{ratio:.3f} x, 429s {refused} (after the first answer {late})"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.arrival")
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    undo = _serial_start(on=False)
    jobs, rounds = args.jobs, args.rounds
    print(f"## {jobs} jobs at {RULE}, concurrency {CONCURRENCY}, median of {rounds}")
    print("\n### virtual clock (support/simulation.py)")
    for work, latency, name in (
        (0.1, (1e-4, 1e-4), "100 ms answers, 0.1 ms network"),
        (0.1, (0.005, 0.05), "100 ms answers, 5-50 ms network"),
        (0.0, (0.04, 0.04), "40 ms round trip, no work"),
    ):
        off, on = (_virtual(jobs, work, latency, traced) for traced in (False, True))
        print(f"- {name}: until the answer {off}; bounded {on}")
    print("\n### loopback")
    for work in (0.1, 0.04):
        for bound in (False, True):
            rows = [_sandbox_run(jobs, work, bound=bound) for _ in range(rounds)]
            how = "bounded" if bound else "until the answer"
            print(f"- sandbox, {work * 1000:.0f} ms answers, {how}: {_median(rows)}")
    for bound in (False, True):
        rows = [_stock_run(jobs, bound=bound) for _ in range(rounds)]
        how = "bounded" if bound else "until the answer"
        print(f"- limits moving-window {RULE}, {how}: {_median(rows)}")
    for bound in (False, True):
        rows = [_slowapi_run(SLOW_JOBS, bound=bound) for _ in range(rounds)]
        how = "bounded" if bound else "until the answer"
        name = f"slowapi moving-window {SLOW_RULE}, {SLOW_WORK:g} s answers"
        print(f"- {name}, {SLOW_JOBS} jobs, {how}: {_median(rows)}")
    undo()  # the first request goes alone, as a run without a record sends it
    print("\n### policy headers (server 10/2s, told 30/2s, 60 jobs)")
    for style in (HeaderStyle.IETF, HeaderStyle.DRAFT7, HeaderStyle.X_RATELIMIT):
        rows = [
            _sandbox_run(60, 0.0, bound=True, server_rule="10/2s", headers=style)
            for _ in range(rounds)
        ]
        print(f"- {style.value}: {_median(rows)}")


if __name__ == "__main__":
    main()
