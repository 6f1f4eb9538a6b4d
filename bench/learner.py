"""Issue 24: what a server stricter than the rule, or noisy, costs a run.

Every row is simulated in virtual time (tests/simulation.py: the real runner,
pacer and learner against a `limiters` model), windows scaled (30/2s stands for
30/1m). A row is the median over seeds of the makespan's ratio to the ideal under
the server's own rule, and of the 429s the server answered. `then` rows are a
second run with what the first left in the ledger (lessons, the accepted record),
on a quiet server.

`python -m bench.learner [--seeds N] [--json PATH]` prints Markdown rows;
`--only TEXT` picks rows, `--jobs N` sets every row's jobs, `--run-windows W`
the windows before a lesson's first re-test within its run
(`retest.RUN_WINDOWS`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from batchrun.core.limits import parse_rule
from batchrun.pacing.learning import retest
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from tests.simulation import Network, Server, Simulated, carried, simulate

_LOOPBACK = (0.002, 0.01)
# httpx's trace says when each request left and how long each connect took, so
# the arrival bound applies, as it does over a real network.
_TRACED = Network(traced=True)


@dataclass(frozen=True, slots=True)
class Case:
    """One row: a client rule against a server model, and what the ledger keeps
    for a second run (`quiet`: that run's server, None: no second run)."""

    name: str
    client: str
    server: Server
    count: int = 60
    quiet: Server | None = None
    concurrency: int = 8


def model(kind: LimiterKind, rule: str, **options: object) -> Server:
    """A server model: `Server`'s own fields among `options`, the rest for the
    limiter (`burst`, `origin`, ...)."""
    fields = {k: v for k, v in options.items() if k in _FIELDS}
    limiter = {k: v for k, v in options.items() if k not in _FIELDS}
    return Server(kind, parse_rule(rule), limiter, **fields)  # type: ignore[arg-type]


_FIELDS = {"retry_after", "work", "stray", "stray_for", "rival_every", "rival_from"}
_FIELDS |= {"rival_for", "stray_from"}


def cases() -> list[Case]:
    """Issue 24's figures, as simulated rows."""
    sliding, fixed = LimiterKind.SLIDING, LimiterKind.FIXED
    weighted, leaky = LimiterKind.WEIGHTED, LimiterKind.LEAKY
    right = model(sliding, "30/2s")
    rows = [
        Case(
            "right rule, 100 ms answers",
            "30/2s",
            model(sliding, "30/2s", work=0.1),
            120,
        ),
        Case(
            "right rule, 100 ms answers, -c 32",
            "30/2s",
            model(sliding, "30/2s", work=0.1),
            120,
            concurrency=32,
        ),
    ]
    for told in (True, False):
        ra = "R-A" if told else "no R-A"
        rows.append(
            Case(
                f"30/2s vs sliding 10/2s, {ra}",
                "30/2s",
                model(sliding, "10/2s", retry_after=told),
                quiet=model(sliding, "10/2s", retry_after=told),
            )
        )
        for origin in (0.0, -0.7, -1.4):
            for kind in (fixed, weighted):
                server = model(kind, "10/2s", retry_after=told, origin=origin)
                rows.append(
                    Case(
                        f"30/2s vs {kind.value} 10/2s at {-origin:g}, {ra}",
                        "30/2s",
                        server,
                        quiet=server,
                    )
                )
        for kind, origins in ((sliding, (0.0,)), (fixed, (0.0, -0.7, -1.4))):
            for origin in origins:
                at = f" at {-origin:g}" if kind is fixed else ""
                where = {"origin": origin} if kind is fixed else {}
                counted = model(
                    kind, "10/2s", retry_after=told, count_refused=True, **where
                )
                rows.append(
                    Case(
                        f"30/2s vs {kind.value} 10/2s{at}, refused count, {ra}",
                        "30/2s",
                        counted,
                        quiet=counted,
                    )
                )
        bucket = model(leaky, "10/2s", retry_after=told, burst=4)
        rows.append(
            Case(f"30/2s vs leaky 5/s burst 4, {ra}", "30/2s", bucket, quiet=bucket)
        )
        # nginx `limit_req rate=15r/s burst=10`: the given rate, smaller bursts.
        bursts = model(leaky, "30/2s", retry_after=told, burst=10)
        rows.append(
            Case(f"30/2s vs leaky 15/s burst 10, {ra}", "30/2s", bursts, quiet=bursts)
        )
    b_shaped = model(sliding, "15/4s+60/20s")
    rows.append(
        Case("a 30/4s vs b 15/4s+60/20s", "30/4s", b_shaped, 120, quiet=b_shaped)
    )
    noisy = model(sliding, "30/2s", stray=0.05, stray_for=14.0)
    rows.append(
        Case("right rule, 5 % stray 429s for 14 s", "30/2s", noisy, 240, quiet=right)
    )
    # A gateway that refuses everything for 0.2 s early in the run, then is quiet.
    outage = model(
        sliding, "30/2s", stray=1.0, stray_from=0.02, stray_for=0.2, retry_after=False
    )
    rows.append(
        Case(
            "right rule, a 0.2 s outage at the start", "30/2s", outage, 240, quiet=right
        )
    )
    rival = model(sliding, "30/2s", rival_every=2 / 15, rival_from=2.0, rival_for=6.0)
    rows.append(
        Case(
            "right rule, another consumer 15/2s for 6 s",
            "30/2s",
            rival,
            240,
            quiet=right,
        )
    )
    # A stricter server, and another consumer of the token for half the run.
    shared = model(
        sliding,
        "10/2s",
        retry_after=False,
        rival_every=0.5,
        rival_from=6.0,
        rival_for=30.0,
    )
    quiet = model(sliding, "10/2s", retry_after=False)
    rows.append(
        Case(
            "30/2s vs sliding 10/2s, no R-A, another consumer 4/2s for 30 s",
            "30/2s",
            shared,
            240,
            quiet=quiet,
        )
    )
    return rows


def traced_run(
    client: str,
    server: Server,
    *,
    count: int,
    seed: int,
    ledger: MemoryLedger,
    concurrency: int = 8,
) -> Simulated:
    """One run over traced loopback, as every row here is made."""
    return simulate(
        client=client,
        server=server,
        count=count,
        seed=seed,
        ledger=ledger,
        latency=_LOOPBACK,
        concurrency=concurrency,
        network=_TRACED,
    )


def _median(runs: list[Simulated], figure: Callable[[Simulated], float]) -> float:
    return statistics.median(figure(run) for run in runs)


def measure(case: Case, seeds: int) -> dict[str, object]:
    """The row of `case`: median ratio and 429s of the run, and of the rerun."""
    firsts, thens = [], []
    for seed in range(seeds):
        ledger = MemoryLedger()
        run = partial(
            traced_run,
            case.client,
            count=case.count,
            seed=seed,
            concurrency=case.concurrency,
        )
        firsts.append(run(case.server, ledger=ledger))
        if case.quiet is not None:
            thens.append(run(replace(case.quiet), ledger=carried(ledger)))
    row: dict[str, object] = {
        "case": case.name,
        "ratio": round(_median(firsts, lambda r: r.ratio), 3),
        "429": _median(firsts, lambda r: r.tally.rate_limited),
        "worst 429": max(r.tally.rate_limited for r in firsts),
    }
    if thens:
        row["then ratio"] = round(_median(thens, lambda r: r.ratio), 3)
        row["worst then ratio"] = round(max(r.ratio for r in thens), 3)
        row["then 429"] = _median(thens, lambda r: r.tally.rate_limited)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", default="", help="rows whose name holds this")
    parser.add_argument("--jobs", type=int, default=None, help="jobs in every row")
    parser.add_argument(
        "--run-windows",
        type=float,
        default=retest.RUN_WINDOWS,
        help="windows before a lesson's first re-test within its run",
    )
    args = parser.parse_args()
    retest.RUN_WINDOWS = args.run_windows
    rows = []
    print(
        "| case | ratio | 429s (median, worst) | then ratio (median, worst) "
        "| then 429s |"
    )
    print("|---|---|---|---|---|")
    for case in cases():
        if args.only not in case.name:
            continue
        if args.jobs is not None:
            case = replace(case, count=args.jobs)
        row = measure(case, args.seeds)
        rows.append(row)
        worst = row.get("worst then ratio")
        then = (row.get("then ratio", "-"), row.get("then 429", "-"))
        then = (then[0] if worst is None else f"{then[0]}, {worst}", then[1])
        print(
            f"| {row['case']} | {row['ratio']} | {row['429']:g}, {row['worst 429']} "
            f"| {then[0]} | {then[1]} |",
            flush=True,
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
