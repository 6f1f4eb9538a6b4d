"""Issue 24: what one client's lessons do to its later runs when the server changes.

`bench.learner` runs a row and one rerun on a quiet server. A chain runs one
client (one ledger) through several runs in turn, each against a server of its
own: a lesson kept, re-tested, confirmed or dropped shows in the runs after it,
and a server that changed between runs (upgraded, or noisy for one run) shows
what a stale lesson costs. Simulated in virtual time like `bench.learner` (the
real runner, pacer and learner against `limiters` models; 30/2s stands for
30/1m), 60 jobs a run, traced loopback.

`python -m bench.chains [--seeds N] [--only TEXT]` prints, per chain, each
seed's runs (ratio to the ideal / 429s), and how many seeds end with a lesson
that makes the last run slower than 1.1 x.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from bench.learner import model, traced_run
from tests.simulation import Server, carried

SLOW = 1.1


def chains() -> dict[str, tuple[Server, ...]]:
    """Named chains: the servers of each run, in order."""
    leaky, sliding = LimiterKind.LEAKY, LimiterKind.SLIDING

    def nginx(**options: object) -> Server:
        # nginx's `limit_req rate=15r/s burst=10` (no Retry-After by default).
        return model(leaky, "30/2s", burst=10, retry_after=False, **options)

    def right(**options: object) -> Server:
        return model(sliding, "30/2s", **options)

    return {
        "nginx bucket, four runs": (nginx(),) * 4,
        "nginx bucket, strays in the second run": (
            nginx(),
            nginx(stray=0.05),
            nginx(),
            nginx(),
        ),
        "nginx bucket, then a sliding 30/2s with strays, then quiet": (
            nginx(),
            right(stray=0.05, retry_after=False),
            right(),
            right(),
        ),
        "nginx bucket, then a quiet sliding 30/2s": (nginx(), right(), right()),
    }


def run_chain(
    servers: Sequence[Server], seed: int, jobs: int
) -> list[tuple[float, int]]:
    """Each run's ratio to the ideal and 429s, one ledger carried between runs."""
    ledger, runs = MemoryLedger(), []
    for server in servers:
        run = traced_run("30/2s", server, count=jobs, seed=seed, ledger=ledger)
        runs.append((run.ratio, run.tally.rate_limited))
        ledger = carried(ledger)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--only", default="", help="chains whose name holds this")
    args = parser.parse_args()
    for name, servers in chains().items():
        if args.only not in name:
            continue
        print(f"## {name}")
        slow = 0
        for seed in range(args.seeds):
            runs = run_chain(servers, seed, args.jobs)
            slow += runs[-1][0] > SLOW
            print(f"- seed {seed}: " + " -> ".join(f"{r:.3f}/{n}" for r, n in runs))
        print(f"- last run slower than {SLOW} x: {slow} of {args.seeds} seeds\n")


if __name__ == "__main__":
    main()
