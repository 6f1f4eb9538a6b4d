"""Issue 40: two hosts on one Redis budget while Redis loses its history.

`python -m bench.ledger_lost [--restarts 50] [--flushes 20] [--per-run 5]
[--jobs 60] [--seed 1]` runs the driver of support/ledger_lost.py (two
`batchrun submit` processes sharing one budget through a redis-server that is
restarted or flushed at seeded moments) until it has lost Redis's history that
many times, and writes each run and the summary to
bench/results/ledger_lost.json.

The e2e test tests/e2e/test_ledger_lost.py runs the same driver, smaller.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from support.ledger_lost import Outcome, moments_of, run_once

RESULTS = Path(__file__).parent / "results" / "ledger_lost.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger_lost")
    parser.add_argument("--restarts", type=int, default=50)
    parser.add_argument("--flushes", type=int, default=20)
    parser.add_argument("--per-run", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args(argv)
    rng = random.Random(options.seed)
    # Both hosts send from about 1 s after their start (Python's start-up); a
    # loss costs each a window, so a run of 2 x 60 jobs at 10/1s takes 13 s+.
    span = (1.5, 1.5 + 2.0 * options.per_run)
    outcomes: list[Outcome] = []
    for kind, total in (("restart", options.restarts), ("flush", options.flushes)):
        while sum(len(o.moments) for o in outcomes if o.kind == kind) < total:
            done = sum(len(o.moments) for o in outcomes if o.kind == kind)
            count = min(options.per_run, total - done)
            seed = rng.randrange(1 << 30)
            moments = moments_of(random.Random(seed), count, span)
            outcome = run_once(kind, seed, moments, options.jobs)
            outcomes.append(outcome)
            print(json.dumps(asdict(outcome)), flush=True)
    summary = _summary(outcomes)
    print(json.dumps(summary, indent=1))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"summary": summary, "runs": [asdict(o) for o in outcomes]}, indent=1
        )
        + "\n"
    )


def _summary(outcomes: list[Outcome]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for kind in ("restart", "flush"):
        mine = [o for o in outcomes if o.kind == kind]
        summary[kind] = {
            "runs": len(mine),
            "losses": sum(len(o.moments) for o in mine),
            "windows_over": sum(o.over for o in mine),
            "most_in_a_window": max((o.most for o in mine), default=0),
            "refused": sum(o.refused for o in mine),
            "jobs": 2 * sum(o.jobs for o in mine),
            "accepted": sum(o.accepted for o in mine),
            "exit_codes": dict(Counter(c for o in mine for c in o.codes)),
            "down_at_start": sum(o.down_at_start for o in mine),
            "errors": [e for o in mine for e in o.errors],
            "tracebacks": sum(o.tracebacks for o in mine),
            "said": sum(o.said for o in mine),
            "seconds": round(sum(o.seconds for o in mine), 1),
        }
    return summary


if __name__ == "__main__":
    main()
