"""Issue 37's figure: the mixed file of 200 jobs against the sandbox, over loopback.

60 run-query and 20 invite jobs, 20 POST requests to run-query's and invite's
paths, 100 GET and DELETE requests on other paths (`support.mixed`), submitted by
`batchrun submit` in a subprocess (a core of its own) against the sandbox served
here, both with windows divided by `--scale`. From the sandbox's arrivals (its
own monotonic clock): 429s, the most arrivals of each key within any window of
its rule, and the makespan (first arrival to last 2xx arrival) over the ideal of
the slowest key (`slots.eta` of its jobs under its rule, latency 0).

    python -m bench.whole_api [--scale 30] [--rounds 3]
    (writes bench/results/whole_api.json)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from batchrun.cli.arguments import scaled
from batchrun.core.limits import LimitKey, Pace, Rule, limit_table
from batchrun.pacing.slots import eta
from batchrun.sandbox.app import Arrival, create_app
from batchrun.sandbox.serving import running
from support.mixed import write_mixed
from support.oracles import most_in_window

HERE = Path(__file__).resolve().parent
COUNTS = {"queries": 60, "invites": 20, "resolving": 20, "others": 100}


def run_once(scale: float, folder: Path) -> dict[str, Any]:
    """One submit of the mixed file against a fresh sandbox; its figures."""
    jobs = write_mixed(folder / "mixed.csv", **COUNTS)
    rules = scaled(limit_table(), scale)
    app = create_app(rules=rules)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    env["BATCHRUN_STATE_DIR"] = str(folder / "state")
    command = [sys.executable, "-m", "batchrun", "submit", str(jobs)]
    with running(app) as url:
        started = time.monotonic()
        done = subprocess.run(
            [*command, "--base-url", url, "--time-scale", f"{scale:g}", "--quiet"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.monotonic() - started
    arrivals: list[Arrival] = list(app.state.sandbox.arrivals)
    return {"exit_code": done.returncode, "wall_s": round(wall, 3)} | figures(
        arrivals, rules
    )


def figures(arrivals: list[Arrival], rules: dict[LimitKey, Rule]) -> dict[str, Any]:
    """429s, each key's most arrivals per window, and the makespan ratio."""
    per_key = Counter(a.key for a in arrivals if 200 <= a.status < 300)
    ideals = {
        key.value: eta(n, rules[key], now=0.0, pace=Pace.EXACT)
        for key, n in per_key.items()
    }
    windows: dict[str, list[dict[str, Any]]] = {}
    within = True
    for key in per_key:
        times = sorted(a.at for a in arrivals if a.key is key)
        found = [(w, most_in_window(times, w.seconds)) for w in rules[key].windows]
        within = within and all(most <= w.count for w, most in found)
        windows[key.value] = [
            {"window": str(w), "limit": w.count, "most": most} for w, most in found
        ]
    first = min(a.at for a in arrivals)
    last = max(a.at for a in arrivals if 200 <= a.status < 300)
    ideal = max(ideals.values())
    slowest = max(ideals, key=lambda name: ideals[name])
    return {
        # Where the makespan beyond the ideal goes: the slowest key's arrivals.
        "slowest_key": slowest,
        "slowest_arrivals_s": [
            round(a.at - first, 3)
            for a in sorted(arrivals, key=lambda a: a.at)
            if a.key.value == slowest
        ],
        "requests": len(arrivals),
        "done_per_key": {key.value: n for key, n in per_key.items()},
        "http_429": sum(a.status == 429 for a in arrivals),
        "windows": windows,
        "within_rules": within,
        "ideal_per_key_s": ideals,
        "ideal_s": ideal,
        "makespan_s": round(last - first, 4),
        "makespan_ratio": round((last - first) / ideal, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "whole_api.json")
    args = parser.parse_args()
    rounds = []
    for number in range(args.rounds):
        with tempfile.TemporaryDirectory() as folder:
            found = run_once(args.scale, Path(folder))
        rounds.append(found)
        sys.stdout.write(
            f"round {number + 1}: exit {found['exit_code']}, "
            f"{found['requests']} requests, 429s {found['http_429']}, "
            f"within rules {found['within_rules']}, makespan "
            f"{found['makespan_s']} s / ideal {found['ideal_s']} s = "
            f"{found['makespan_ratio']}\n"
        )
    result = {
        "command": f"python -m bench.whole_api --scale {args.scale:g} "
        f"--rounds {args.rounds}",
        "jobs": COUNTS,
        "scale": args.scale,
        "worst_ratio": max(r["makespan_ratio"] for r in rounds),
        "rounds": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.write(f"wrote {args.out}\n")


if __name__ == "__main__":
    main()
