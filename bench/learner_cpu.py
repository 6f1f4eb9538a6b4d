"""Issue 36's CPU figure: the learner's share of a simulated run's CPU.

A run of `--jobs` jobs (10,000 by default) told 30/2s against a sliding log of
30/2s whose accepted answers are 429s with `--strays` probability (1 %), no
Retry-After, in virtual time (`support.simulation`). Under cProfile, the CPU
spent inside the learner's entry points (`Learner.answered`, `.opens`, `.sent`,
`.stated`) is divided by the whole run's; also printed: the readings
(`KeyModel.decide`) and their mean CPU. cProfile slows everything alike, so the
share, not the seconds, is the figure.

    python -m bench.learner_cpu [--jobs 10000] [--strays 0.01] [--seed 1]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from batchrun.core.limits import parse_rule
from batchrun.pacing.limiters import LimiterKind
from support.simulation import Server, simulate

# The learner's entry points from the runner and the pacer: everything it does
# happens under one of them.
ENTRIES = ("answered", "opens", "sent", "stated")


def share(jobs: int, strays: float, seed: int) -> dict[str, float]:
    """The learner's CPU share of one simulated run, and its readings."""
    rule = parse_rule("30/2s")
    server = Server(LimiterKind.SLIDING, rule, retry_after=False, stray=strays)
    profile = cProfile.Profile()
    started = time.process_time()
    profile.enable()
    run = simulate(client=rule, server=server, count=jobs, seed=seed, bound=1e9)
    profile.disable()
    cpu = time.process_time() - started
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    learner = readings = reading_cpu = 0.0
    for (path, _, name), (_, calls, _, cumulative, _) in stats.items():
        if path.endswith("pacing/learner.py") and name in ENTRIES:
            learner += cumulative
        if path.endswith("pacing/model.py") and name == "decide":
            readings, reading_cpu = calls, cumulative
    total = pstats.Stats(profile).total_tt  # type: ignore[attr-defined]
    return {
        "jobs": jobs,
        "makespan_s": round(run.makespan, 1),
        "cpu_s": round(cpu, 1),
        "learner_share": round(learner / total, 3),
        "readings": readings,
        "ms_per_reading": round(1000 * reading_cpu / max(readings, 1), 1),
    }


def main() -> None:
    """Print the figure for the flags given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--strays", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(share(args.jobs, args.strays, args.seed))


if __name__ == "__main__":
    main()
