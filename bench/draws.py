"""Issue 36, item 6: batchrun against a reference script on random servers.

Each draw is one seeded random server, run on the virtual clock of
support/simulation.py (the real runner, pacer and learner against a `limiters`
model): batchrun runs twice with one ledger (`carried`), and the reference script
(support/script_client.py: a sliding log of the told rule from the send, 8 in
flight, Retry-After or 0.5/1/2/4 s) runs the same two servers with no memory.
Windows are scaled as in the other benches: 30/2s stands for 30/1m.

The distribution (each item drawn independently, weights in parentheses):

- told rule: 30/2s (6), 120/2s (1), 15/10s (2), 10/10s (1): profile a's
  run-query, the global rule, invite and avatar at 30 x; W is its window, c its
  count;
- the server's rule against the told one: equal (7); stricter, c x 1/3, 1/2 or
  2/3 on W (5); a shorter window, c/2 per W/2 or c/4 per W/4, rounded down (4);
  the B shape, c/2 per W with c x 50/3 per 60 W (statement B's 500/1h, never
  binding here) or 2c per 5 W (binding) (4);
- shape: sliding log (7); fixed windows at a phase uniform in [0, W) (5);
  weighted counter at such a phase (4); leaky bucket at the rule's binding rate
  with a burst of 0, 1, c'/4, c'/2 or c' - 1 (c' the binding window's count) (4);
- refusals count (sliding log and fixed windows only): yes (3), no (7);
- Retry-After on the limiter's 429s: yes (6), no (4);
- policy header fields: none (5), IETF draft 08+ (2), draft 7 (2),
  X-RateLimit (2), as the sandbox's `policy_headers` writes them and the
  client's own reader (`api.client.classify`) reads them;
- latency, a round trip uniform in: 2-10 ms (4), 10-50 ms (3), 20-100 ms (3)
  (at real scale 60 ms to 3 s), the request arriving at a uniform point of it;
- work on the server per accepted request: none (2), 0.05 W (1), uniform in
  0.1-0.4 W (1) (answers taking 0.2-0.8 s of a 2 s window; the server counts on
  arrival);
- jobs: uniform in L to L + 110, L = max(40, 2c + 1): 40-150 for 15/10s and
  10/10s, 61-171 for 30/2s, 241-351 for 120/2s (more than two told windows, so
  no ideal is 0); `--jobs` fixes it;
- disturbances, each independently, placed by the undisturbed ideal I:
  stray 429s (0.15): 2, 5 or 10 % of the requests the limiter accepts (and
  counts), for the whole run (2) or from U(0, 0.5) I for U(0.25, 0.5) I (3);
  an outage (0.1): every request 429 for 1 or 2 W from U(0.2, 0.6) I, with a
  Retry-After of the outage left (1) or none (1), uncounted; another consumer
  (0.15): a quarter or half the server's rate, from U(0, 0.3) I for
  U(0.3, 0.6) I (at least W); a rule change (0.15): tightening to x 1/3 or 1/2 (1), or
  loosening from x 1/3 or 1/2 back to the drawn rule (1), at U(1, 3) W, kept
  counts (a leaky bucket starts empty);
- run 2: on the rule in force at the end of run 1, quiet (6), with the same
  disturbances (2), or, quiet otherwise, an outage of 1 W (no Retry-After) from
  U(0.2, 0.6) I (2). "Quiet by run 2" is recorded.

The ideal is `simulation.ideal(server, jobs, told)`: greedy arrivals at zero
latency under the server's own rule, asked again at a rule change, so under a
change it is the ideal under the changing rule (greedy is optimal: an earlier
acceptance never delays a later one). It also keeps the told rule as a sliding
log, as the contract binds every client to: a fixed window at a phase lets
2c through across its edge, an ideal no lawful client reaches (the server-only
ideal is kept as `server_ideal` in the JSON). Disturbances (strays, outage,
another consumer) are not in it.

The server is "stricter than told" when its rule is not equal to the told
one, or it changes its rule (a loosening starts stricter), or it is a weighted
counter, or a leaky bucket whose burst is smaller than the told count.

The checks (issue 36's figures): (a) in each run batchrun's ratio is within 0.02
of the script's, or <= 1.05; (b) where the server is stricter than told, run
1's 429s <= max(4, the script's); (c) where the server is quiet by run 2,
batchrun's run 2 has 0 x 429 and ratio <= 1.05; (d) p90 of batchrun's ratio
<= 1.10, each run. p90 is the nearest rank (the ceil(0.9 n)-th smallest).

`python -m bench.draws --draws 200 --seed 1` runs draws with seeds 10000 S + i
and writes bench/results/draws.json; `--only SEED [--trace]` reruns one draw
(with every arrival); `--cases` runs issue 36's named cases instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from batchrun.core.limits import Rule, Window, parse_rule
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle
from support.script_client import script
from support.simulation import Network, Server, Simulated, carried, ideal, simulate

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "draws.json"
CASES = HERE / "results" / "draws_cases.json"
# httpx's trace says when each request left, as over a real network (bench.learner).
TRACED = Network(traced=True)
SPAN = 10_000  # draw seeds of --seed S: SPAN x S + i
# A run is stopped past this many CPU seconds (most take well under one).
CPU_CAP = 10.0
T = TypeVar("T")


def pick(rng: random.Random, weighted: Sequence[tuple[T, int]]) -> T:
    """One of the values, by weight."""
    chosen: T = rng.choices([v for v, _ in weighted], [w for _, w in weighted])[0]
    return chosen


def counts(rule: Rule, factor: float) -> Rule:
    """`rule` with every count times `factor`, rounded down, at least 1."""
    return Rule(
        tuple(
            Window(max(1, math.floor(w.count * factor)), w.seconds)
            for w in rule.windows
        )
    )


@dataclass(frozen=True, slots=True)
class Draw:
    """One random server, its two runs, and what the checks need to know of it."""

    seed: int
    told: str
    count: int
    latency: tuple[float, float]
    first: Server
    then: Server
    words: str
    stricter: bool
    quiet: bool
    # --profile auto: the rule batchrun falls back to (statement B).
    fallback: str | None = None
    # The script's rule, where it is not `told` (under auto: statement B).
    script_told: str | None = None
    # What the server does beyond the round trip (a queue before its limiter);
    # batchrun's transport is traced, the script reads no trace.
    network: Network = TRACED


@dataclass(frozen=True, slots=True)
class Figures:
    """One run: makespan over the ideal, and the 429s the server answered."""

    ratio: float
    refused: int
    makespan: float = 0.0
    ideal: float = 0.0
    server_ideal: float = 0.0
    finished: bool = True
    # Stopped after `--cpu-cap` CPU seconds: no figures, and every check fails.
    capped: bool = False


CAPPED = Figures(ratio=math.inf, refused=0, finished=False, capped=True)


class OverCap(Exception):
    """A run spent more CPU than `--cpu-cap` allows."""


@contextlib.contextmanager
def cpu_cap(seconds: float) -> Iterator[list[bool]]:
    """Raise `OverCap` inside the block once it has spent `seconds` of CPU, and
    again every 10 ms of CPU after, until it ends; the list it gives holds True
    from then on. It raises only in the project's own code: raised in a
    `__del__` or a garbage collector's callback (pytest's, say) it would be
    ignored or reported as unraisable, so the signal waits for the next tick."""
    over: list[bool] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        over[:] = [True]
        if frame is not None and _ours(frame.f_code.co_filename):
            raise OverCap

    kept = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, seconds, 0.01)
    try:
        yield over
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, kept)


def _ours(path: str) -> bool:
    """Whether code in `path` is the project's (not an installed library's)."""
    return path.startswith(str(HERE.parent)) and "site-packages" not in path


def _over(exc: BaseException | None) -> bool:
    """Whether `exc` is, holds or was caused by an `OverCap` (trio may wrap it)."""
    if exc is None:
        return False
    if isinstance(exc, OverCap):
        return True
    inner = exc.exceptions if isinstance(exc, BaseExceptionGroup) else ()
    return any(_over(e) for e in inner) or _over(exc.__cause__ or exc.__context__)


def capped(run: Callable[[], Simulated], seconds: float) -> Simulated | None:
    """`run()`, or None if it spent more than `seconds` of CPU."""
    try:
        with cpu_cap(seconds) as over:
            done = run()
        # An OverCap swallowed on the way (a finally, trio's own handling) still
        # leaves the run over the cap.
        return None if over else done
    except BaseException as exc:
        if _over(exc):
            return None
        raise


@dataclass(frozen=True, slots=True)
class Result:
    """A draw's four runs (b: batchrun, s: the script; 1 and 2: the runs)."""

    seed: int
    words: str
    stricter: bool
    quiet: bool
    b1: Figures
    b2: Figures
    s1: Figures
    s2: Figures
    cpu: float = field(default=0.0, compare=False)


def _relation(rng: random.Random, told: Rule) -> tuple[str, Rule]:
    window = told.windows[0]
    c, w = window.count, window.seconds
    relation = pick(rng, [("equal", 7), ("stricter", 5), ("shorter", 4), ("B", 4)])
    if relation == "stricter":
        factor = rng.choice((1 / 3, 1 / 2, 2 / 3))
        return f"stricter x{factor:.2f}", counts(told, factor)
    if relation == "shorter":
        k = rng.choice((2, 4))
        return "shorter window", Rule((Window(max(1, c // k), w / k),))
    if relation == "B":
        if rng.random() < 0.5:
            long = Window(math.ceil(c * 50 / 3), 60 * w)
        else:
            long = Window(2 * c, 5 * w)
        return "B shape", Rule((Window(max(1, c // 2), w), long))
    return "equal", told


def _shape(
    rng: random.Random, rule: Rule, w: float
) -> tuple[LimiterKind, dict[str, Any]]:
    kind = pick(
        rng,
        [
            (LimiterKind.SLIDING, 7),
            (LimiterKind.FIXED, 5),
            (LimiterKind.WEIGHTED, 4),
            (LimiterKind.LEAKY, 4),
        ],
    )
    if kind in (LimiterKind.FIXED, LimiterKind.WEIGHTED):
        return kind, {"origin": -round(rng.uniform(0, w), 3)}
    if kind is LimiterKind.LEAKY:
        binding = max(rule.windows, key=lambda x: x.seconds / x.count)
        c = binding.count
        return kind, {"burst": rng.choice((0, 1, c // 4, c // 2, c - 1))}
    return kind, {}


def _base(rng: random.Random, told: Rule) -> tuple[Server, list[str], bool]:
    """The undisturbed server, its words, and whether it is stricter than told."""
    w = told.windows[0].seconds
    relation, rule = _relation(rng, told)
    kind, options = _shape(rng, rule, w)
    refused = kind in (LimiterKind.SLIDING, LimiterKind.FIXED) and rng.random() < 0.3
    retry_after = rng.random() < 0.6
    headers = pick(
        rng,
        [
            (HeaderStyle.NONE, 5),
            (HeaderStyle.IETF, 2),
            (HeaderStyle.DRAFT7, 2),
            (HeaderStyle.X_RATELIMIT, 2),
        ],
    )
    work, spread = pick(
        rng, [((0.0, 0.0), 2), ((0.05 * w, 0.0), 1), ((0.1 * w, 0.3 * w), 1)]
    )
    server = Server(
        kind,
        rule,
        options,
        retry_after=retry_after,
        count_refused=refused,
        headers=headers,
        work=work,
        work_spread=spread,
    )
    burst = options.get("burst")
    stricter = relation != "equal" or kind is LimiterKind.WEIGHTED
    stricter |= burst is not None and burst + 1 < told.windows[0].count
    where = f" at {-options['origin']:g}" if "origin" in options else ""
    words = [
        f"{kind.value}{where} {rule}"
        + (f" burst {burst}" if burst is not None else ""),
        f"({relation})",
        "R-A" if retry_after else "no R-A",
    ]
    words += ["refused count"] if refused else []
    words += [] if headers is HeaderStyle.NONE else [f"headers {headers.value}"]
    if spread:
        words.append(f"work {work:g}-{work + spread:g} s")
    elif work:
        words.append(f"work {work:g} s")
    return server, words, stricter


def _disturbed(
    rng: random.Random, base: Server, told: Rule, count: int
) -> tuple[Server, list[str], bool]:
    """Run 1's server: `base` with strays, an outage, a rival, a rule change."""
    w = told.windows[0].seconds
    at = ideal(base, count)
    server, words, tightens = base, [], False
    if rng.random() < 0.15:
        share = rng.choice((0.02, 0.05, 0.1))
        if rng.random() < 0.4:
            server = replace(server, stray=share)
            words.append(f"{share:.0%} strays all run")
        else:
            start, span = rng.uniform(0, 0.5) * at, rng.uniform(0.25, 0.5) * at
            server = replace(server, stray=share, stray_from=start, stray_for=span)
            words.append(f"{share:.0%} strays {start:.1f}+{span:.1f} s")
    if rng.random() < 0.1:
        start, span, said = (
            rng.uniform(0.2, 0.6) * at,
            w * rng.choice((1, 2)),
            rng.random() < 0.5,
        )
        server = replace(
            server, outage_from=start, outage_for=span, outage_retry_after=said
        )
        words.append(f"outage {start:.1f}+{span:g} s" + (" R-A" if said else ""))
    if rng.random() < 0.15:
        binding = max(base.rule.windows, key=lambda x: x.seconds / x.count)
        share = rng.choice((0.25, 0.5))
        every = binding.seconds / (binding.count * share)
        start, span = rng.uniform(0, 0.3) * at, max(w, rng.uniform(0.3, 0.6) * at)
        server = replace(server, rival_every=every, rival_from=start, rival_for=span)
        words.append(f"rival {share:.0%} {start:.1f}+{span:.1f} s")
    if rng.random() < 0.15:
        factor, change = rng.choice((1 / 3, 1 / 2)), round(rng.uniform(1, 3) * w, 3)
        if rng.random() < 0.5:
            server = replace(
                server, change_to=counts(base.rule, factor), change_at=change
            )
            words.append(f"tightens to {server.change_to} at {change:g} s")
            tightens = True
        else:
            server = replace(
                server,
                rule=counts(base.rule, factor),
                change_to=base.rule,
                change_at=change,
            )
            words.append(f"loosens from {server.rule} at {change:g} s")
            tightens = True  # stricter than told before the change
    return server, words, tightens


def draw(seed: int, jobs: int | None = None) -> Draw:
    """The draw of `seed` (see the module docstring)."""
    rng = random.Random(seed)
    told_text = pick(rng, [("30/2s", 6), ("120/2s", 1), ("15/10s", 2), ("10/10s", 1)])
    told = parse_rule(told_text)
    base, words, stricter = _base(rng, told)
    latency = pick(rng, [((0.002, 0.01), 4), ((0.01, 0.05), 3), ((0.02, 0.1), 3)])
    # At least two windows of the told rule, so no ideal is 0.
    low = max(40, 2 * told.windows[0].count + 1)
    count = rng.randint(low, low + 110) if jobs is None else jobs
    first, disturbed, tightens = _disturbed(rng, base, told, count)
    rule = base.rule if first.change_to is None else first.change_to
    quiet_server = replace(base, rule=rule)
    then = pick(rng, [("quiet", 6), ("same", 2), ("outage", 2)])
    second = quiet_server
    if then == "same":
        second = replace(first, rule=rule, change_to=None, change_at=0.0)
    elif then == "outage":
        start = rng.uniform(0.2, 0.6) * ideal(quiet_server, count)
        w = told.windows[0].seconds
        second = replace(quiet_server, outage_from=start, outage_for=w)
    quiet = not (second.stray or second.outage_for or second.rival_every)
    low, high = (round(x * 1000) for x in latency)
    text = f"told {told_text}, {count} jobs, {low}-{high} ms; "
    text += ", ".join(words + disturbed)
    if not quiet:
        text += "; run 2 " + (
            "as run 1"
            if then == "same"
            else f"outage {second.outage_from:.1f}+{second.outage_for:g} s"
        )
    return Draw(
        seed,
        told_text,
        count,
        latency,
        first,
        second,
        text,
        stricter or tightens,
        quiet,
    )


def figures(run: Simulated | None, best: float) -> Figures:
    """What the draws report of one run, against the ideal `best`."""
    if run is None:
        return replace(CAPPED, ideal=round(best, 4))
    return Figures(
        ratio=round(run.makespan / best, 4),
        refused=sum(a.status == 429 for a in run.arrivals),
        makespan=round(run.makespan, 4),
        ideal=round(best, 4),
        server_ideal=round(run.ideal, 4),
        finished=run.finished,
    )


Runs = tuple[Simulated | None, Simulated | None, Simulated | None, Simulated | None]


def runs(d: Draw, cap: float = math.inf) -> Runs:
    """batchrun's two runs (one ledger), then the script's two; a run that spends
    more than `cap` CPU seconds is None (run 2 gets what run 1 kept so far)."""
    ledger = MemoryLedger()
    common: dict[str, Any] = {"count": d.count, "seed": d.seed, "latency": d.latency}
    fallback = None if d.fallback is None else parse_rule(d.fallback)
    # batchrun as `submit` runs it with no --concurrency; the script keeps 8.
    ours: dict[str, Any] = {
        "client": d.told,
        "network": d.network,
        "fallback": fallback,
        "concurrency": None,
    }
    told = d.script_told or d.told
    first = partial(simulate, server=d.first, ledger=ledger, **ours, **common)
    b1 = capped(first, cap)
    # Run 2 follows run 1 at once: what the ledger keeps ages as its time passed.
    wall = None if b1 is None else b1.wall_end
    then = partial(
        simulate, server=d.then, ledger=carried(ledger), wall=wall, **ours, **common
    )
    b2 = capped(then, cap)
    # The script reads no trace: its transport gives none.
    untraced = replace(d.network, traced=False)
    theirs = partial(script, client=told, network=untraced, **common)
    s1 = capped(partial(theirs, server=d.first), cap)
    s2 = capped(partial(theirs, server=d.then), cap)
    return b1, b2, s1, s2


def measure(d: Draw, cap: float = math.inf) -> Result:
    """One draw's result; runs over `cap` CPU seconds are `CAPPED`."""
    started = time.process_time()
    b1, b2, s1, s2 = runs(d, cap)
    cpu = time.process_time() - started
    told = parse_rule(d.told)
    first, then = ideal(d.first, d.count, told), ideal(d.then, d.count, told)
    return Result(
        d.seed,
        d.words,
        d.stricter,
        d.quiet,
        figures(b1, first),
        figures(b2, then),
        figures(s1, first),
        figures(s2, then),
        round(cpu, 2),
    )


# --- The summary and the checks ---------------------------------------------------


def p90(values: Sequence[float]) -> float:
    """The nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


RUNS: dict[str, Callable[[Result], Figures]] = {
    "batchrun run 1": lambda r: r.b1,
    "batchrun run 2": lambda r: r.b2,
    "script run 1": lambda r: r.s1,
    "script run 2": lambda r: r.s2,
}


def summary(results: Sequence[Result]) -> dict[str, dict[str, float]]:
    """Median, p90 and worst of the ratio and of the 429s, per client and run."""
    table = {}
    for name, run in RUNS.items():
        ratios = [run(r).ratio for r in results]
        # A capped run's 429s are not known: left out, and counted.
        refused = [float(run(r).refused) for r in results if not run(r).capped]
        refused = refused or [0.0]
        table[name] = {
            "ratio median": round(statistics.median(ratios), 3),
            "ratio p90": round(p90(ratios), 3),
            "ratio worst": round(max(ratios), 3),
            "429 median": statistics.median(refused),
            "429 p90": p90(refused),
            "429 worst": max(refused),
            "unfinished": sum(not run(r).finished for r in results),
            "capped": sum(run(r).capped for r in results),
        }
    return table


def _near(b: Figures, s: Figures) -> bool:
    return b.ratio <= s.ratio + 0.02 or b.ratio <= 1.05


def checks(results: Sequence[Result]) -> dict[str, dict[str, Any]]:
    """Issue 36's figures as booleans, each with the seeds that violate it."""
    a1 = [r.seed for r in results if not _near(r.b1, r.s1)]
    a2 = [r.seed for r in results if not _near(r.b2, r.s2)]
    b = [
        r.seed
        for r in results
        if r.stricter and (r.b1.capped or r.b1.refused > max(4, r.s1.refused))
    ]
    c = [
        r.seed
        for r in results
        if r.quiet and (r.b2.capped or r.b2.refused > 0 or r.b2.ratio > 1.05)
    ]
    d1 = p90([r.b1.ratio for r in results])
    d2 = p90([r.b2.ratio for r in results])
    over = [r.seed for r in results if r.b1.ratio > 1.10 or r.b2.ratio > 1.10]
    return {
        "a run 1: within 0.02 x ideal of the script or <= 1.05": _check(
            a1, len(results)
        ),
        "a run 2: within 0.02 x ideal of the script or <= 1.05": _check(
            a2, len(results)
        ),
        "b: stricter server, run 1 429s <= max(4, script's)": _check(
            b, sum(r.stricter for r in results)
        ),
        "c: quiet by run 2, run 2 0 x 429 and <= 1.05": _check(
            c, sum(r.quiet for r in results)
        ),
        "d: p90 of the ratio <= 1.10, run 1": {
            "holds": d1 <= 1.10,
            "p90": round(d1, 3),
        },
        "d: p90 of the ratio <= 1.10, run 2": {
            "holds": d2 <= 1.10,
            "p90": round(d2, 3),
            "draws over 1.10 in either run": len(over),
        },
    }


def _check(seeds: list[int], of: int) -> dict[str, Any]:
    return {"holds": not seeds, "violations": len(seeds), "of": of, "seeds": seeds}


MEASURES: dict[str, Callable[[Result], float]] = {
    "batchrun run 1 ratio": lambda r: r.b1.ratio,
    "batchrun run 1 429s": lambda r: r.b1.refused,
    "batchrun run 2 ratio": lambda r: r.b2.ratio,
    "batchrun run 2 429s": lambda r: r.b2.refused,
    "batchrun - script, run 1 ratio": lambda r: r.b1.ratio - r.s1.ratio,
    "batchrun - script, run 2 ratio": lambda r: r.b2.ratio - r.s2.ratio,
}


def worst(results: Sequence[Result], count: int = 10) -> dict[str, list[int]]:
    """The seeds of the worst draws by each measure, worst first (ties by seed)."""
    return {
        name: [r.seed for r in sorted(results, key=lambda r: (-measure(r), r.seed))][
            :count
        ]
        for name, measure in MEASURES.items()
    }


# --- Printing -------------------------------------------------------------------


def line(r: Result) -> str:
    """One draw in one line."""

    def run(f: Figures) -> str:
        if f.capped:
            return "over the CPU cap"
        return f"{f.ratio:.3f}/{f.refused}" + ("" if f.finished else " UNFINISHED")

    return (
        f"| {r.seed} | {r.words} | {run(r.b1)} | {run(r.b2)} "
        f"| {run(r.s1)} | {run(r.s2)} |"
    )


HEAD = (
    "| seed | draw | batchrun run 1 | batchrun run 2 | script run 1 | script run 2 |\n"
    "|---|---|---|---|---|---|"
)


def print_summary(table: dict[str, dict[str, float]]) -> None:
    """The summary as a Markdown table (a capped run's ratio is its worst)."""
    print(
        "| client, run | ratio median | p90 | worst | 429s median | p90 | worst "
        "| over the CPU cap | unfinished |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row in table.items():
        ratios = [row["ratio median"], row["ratio p90"], row["ratio worst"]]
        shown = " | ".join("capped" if math.isinf(r) else f"{r:.3f}" for r in ratios)
        print(
            f"| {name} | {shown} | {row['429 median']:g} "
            f"| {row['429 p90']:g} | {row['429 worst']:g} | {row['capped']:g} "
            f"| {row['unfinished']:g} |"
        )


def print_checks(found: dict[str, dict[str, Any]]) -> None:
    for name, check in found.items():
        extra = {k: v for k, v in check.items() if k not in ("holds", "seeds")}
        shown = ", ".join(f"{k} {v}" for k, v in extra.items())
        print(f"- {name}: {'holds' if check['holds'] else 'FAILS'} ({shown})")


def print_worst(results: Sequence[Result], ranked: dict[str, list[int]]) -> None:
    by_seed = {r.seed: r for r in results}
    for name, seeds in ranked.items():
        print(f"\n### Worst by {name}\n\n{HEAD}")
        for seed in seeds:
            print(line(by_seed[seed]))


# --- Issue 36's named cases --------------------------------------------------------

LOOPBACK = (0.002, 0.01)


def named_cases() -> list[Draw]:
    """Issue 36's cases as fixed servers (seed 0; `--seeds` runs more)."""
    sliding, b = LimiterKind.SLIDING, "15/2s+500/2m"

    def case(name: str, told: str, first: Server, count: int, **more: Any) -> Draw:
        then = more.pop("then", first)
        return Draw(0, told, count, LOOPBACK, first, then, name, True, True, **more)

    right = Server(sliding, parse_rule("30/2s"))
    tightens = replace(
        right, retry_after=False, change_to=parse_rule("10/2s"), change_at=3.0
    )
    auto = Server(sliding, parse_rule(b))
    stated = Server(
        sliding, parse_rule("10/2s"), headers=HeaderStyle.X_RATELIMIT, work=0.1
    )
    demo = Server(sliding, parse_rule(b))
    return [
        case(
            "tightening 30/2s -> 10/2s 3 s in, no R-A",
            "30/2s",
            tightens,
            120,
            then=Server(sliding, parse_rule("10/2s"), retry_after=False),
        ),
        case(
            "5 % of accepted answered 429 from 2 s for 14 s",
            "30/2s",
            replace(right, stray=0.05, stray_from=2.0, stray_for=14.0),
            240,
            then=right,
        ),
        case(
            "--profile auto, B found in run 1; run 2 a 4 s outage at 8 s, no R-A",
            "30/2s",
            auto,
            195,
            then=replace(auto, outage_from=8.0, outage_for=4.0),
            fallback=b,
            script_told=b,
        ),
        case(
            "X-RateLimit 10/2s stated from the first answer, 100 ms answers",
            "30/2s",
            stated,
            60,
        ),
        case(
            "answers 0.2-0.8 s, counted on arrival",
            "30/2s",
            replace(right, work=0.2, work_spread=0.6),
            120,
        ),
        case(
            "another consumer 15/2s from 2 s for 6 s in run 1; run 2 quiet",
            "30/2s",
            replace(right, rival_every=2 / 15, rival_from=2.0, rival_for=6.0),
            240,
            then=right,
        ),
        case(
            "a queue before the limiter: 10 % wait up to 1 s; answers 0.2-0.8 s",
            "30/2s",
            replace(right, work=0.2, work_spread=0.6),
            240,
            network=replace(TRACED, queue=1.0, queued=0.1),
        ),
        case(
            "told 30/2s, weighted 10/2s",
            "30/2s",
            Server(LimiterKind.WEIGHTED, parse_rule("10/2s")),
            60,
        ),
        case(
            "the demo's run-query, 10 % stray 429s all run; run 2 quiet",
            b,
            replace(demo, stray=0.1),
            60,
            then=demo,
        ),
    ]


def after_stop(run: Simulated) -> dict[str, int]:
    """429s on requests sent after the first answer, and after the first answer
    that said none remain (a stated policy's figures)."""
    first = min((at for at, _ in run.answers), default=math.inf)
    spent = [
        at
        for at, outcome in run.answers
        if outcome.hints is not None and outcome.hints.remaining == 0
    ]
    zero = min(spent, default=math.inf)
    refused = [a.sent for a in run.arrivals if a.status == 429]
    return {
        "429s sent after the first answer": sum(t > first for t in refused),
        "429s sent after a Remaining 0": sum(t > zero for t in refused),
    }


def run_case(d: Draw, cap: float = math.inf) -> dict[str, Any]:
    """One seed of a case: the four runs' figures and the stated-policy counts."""
    b1, b2, s1, s2 = runs(d, cap)
    told = parse_rule(d.told)
    first, then = ideal(d.first, d.count, told), ideal(d.then, d.count, told)
    row: dict[str, Any] = {
        name: asdict(figures(run, best))
        for name, run, best in zip(
            RUNS, (b1, b2, s1, s2), (first, then, first, then), strict=True
        )
    }
    if d.then.outage_for and b2 is not None:
        less = (b2.makespan - d.then.outage_for) / then
        row["batchrun run 2, less the outage"] = round(less, 4)
    if d.first.headers is not HeaderStyle.NONE:
        for name, run in (("run 1", b1), ("run 2", b2)):
            if run is not None:
                row[f"batchrun {name} stated"] = after_stop(run)
    return row


def _spread(values: Sequence[float], digits: int = 3) -> str:
    """Median and worst, as `median (worst)`."""
    return f"{statistics.median(values):.{digits}f} ({max(values):.{digits}f})"


def run_cases(args: argparse.Namespace) -> None:
    """Every named case over `--seeds` seeds: median (worst) per client and run."""
    print(
        "| case | batchrun run 1: ratio / 429s | batchrun run 2 | "
        "script run 1 | script run 2 |\n|---|---|---|---|---|"
    )
    record: dict[str, Any] = {
        "command": f"python -m bench.draws --cases --seeds {args.seeds}"
        + ("" if args.cpu_cap == CPU_CAP else f" --cpu-cap {args.cpu_cap:g}"),
        "commit": commit(),
    }
    for d in named_cases():
        if args.only_case not in d.words:
            continue
        rows = [
            run_case(replace(d, seed=seed), args.cpu_cap) for seed in range(args.seeds)
        ]
        cells = []
        for name in RUNS:
            ratios = [row[name]["ratio"] for row in rows]
            refused = [float(row[name]["refused"]) for row in rows]
            cells.append(f"{_spread(ratios)} / {_spread(refused, 0)}")
        print(f"| {d.words} | " + " | ".join(cells) + " |", flush=True)
        for extra in rows[0]:
            if extra not in RUNS:
                print(f"  - {extra}: " + "; ".join(str(r[extra]) for r in rows))
        record[d.words] = rows
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")


def commit() -> str:
    """The commit measured, with `+dirty` for uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE)
        return done.stdout.strip()

    dirty = "+dirty" if git("status", "--porcelain", "--", "batchrun", "tests") else ""
    return git("rev-parse", "--short", "HEAD") + dirty


def batchrun_commit() -> str:
    """The last commit that changed the package measured (batchrun/)."""
    done = subprocess.run(
        ["git", "log", "-1", "--format=%h", "--", "batchrun"],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
    )
    return done.stdout.strip()


def trace(d: Draw, cap: float = math.inf) -> None:
    """Every arrival of the draw's four runs."""
    for name, run in zip(RUNS, runs(d, cap), strict=True):
        if run is None:
            print(f"\n#### {name}: over the CPU cap of {cap:g} s\n")
            continue
        print(f"\n#### {name}: {run.makespan:.3f} s, ideal {run.ideal:.3f} s\n")
        print("sent at status job")
        for a in run.arrivals:
            print(f"{a.sent:.4f} {a.at:.4f} {a.status} {a.job}")


def load(path: Path) -> list[Result]:
    """The draws of a saved record."""
    record = json.loads(path.read_text())
    results = []
    for d in record["draws"]:
        b1, b2, s1, s2 = (Figures(**d[name]) for name in ("b1", "b2", "s1", "s2"))
        kind = (d["seed"], d["words"], d["stricter"], d["quiet"])
        results.append(Result(*kind, b1, b2, s1, s2))
    return results


def tables(path: Path) -> None:
    """The summary, the checks and the worst draws of a saved record."""
    results = load(path)
    print_summary(summary(results))
    print()
    print_checks(checks(results))
    print_worst(results, worst(results))


def run_draws(args: argparse.Namespace) -> None:
    seeds = [SPAN * args.seed + i for i in range(args.draws)]
    print(HEAD)
    results, started = [], time.monotonic()
    for seed in seeds:
        results.append(measure(draw(seed, args.jobs), args.cpu_cap))
        print(line(results[-1]), flush=True)
    seconds = time.monotonic() - started
    table, found, ranked = summary(results), checks(results), worst(results)
    print(f"\n{len(results)} draws in {seconds:.0f} s (wall clock)\n")
    print_summary(table)
    print()
    print_checks(found)
    print_worst(results, ranked)
    print("\n### Slowest draws by CPU (batchrun's and the script's four runs)\n")
    for r in sorted(results, key=lambda r: -r.cpu)[:5]:
        print(f"- {r.seed}: {r.cpu:.1f} s")
    record = {
        "command": f"python -m bench.draws --draws {args.draws} --seed {args.seed}"
        + ("" if args.jobs is None else f" --jobs {args.jobs}")
        + ("" if args.cpu_cap == CPU_CAP else f" --cpu-cap {args.cpu_cap:g}"),
        "commit": commit(),
        "batchrun": batchrun_commit(),
        "summary": table,
        "checks": found,
        "worst": ranked,
        # CPU seconds vary from run to run: printed, not kept.
        "draws": [{k: v for k, v in asdict(r).items() if k != "cpu"} for r in results],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=None, help="jobs in every draw")
    parser.add_argument("--only", type=int, default=None, help="one draw's seed")
    parser.add_argument("--trace", action="store_true", help="with --only: arrivals")
    parser.add_argument("--cases", action="store_true", help="issue 36's cases")
    parser.add_argument("--only-case", default="", help="cases whose name holds this")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per case")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tables", type=Path, help="print a saved record's tables")
    parser.add_argument(
        "--cpu-cap",
        type=float,
        default=CPU_CAP,
        help="CPU seconds a run may spend before it is stopped and counted failed",
    )
    args = parser.parse_args(None if argv is None else list(argv))
    if args.tables is not None:
        tables(args.tables)
        return
    if args.json is None:
        args.json = CASES if args.cases else RESULTS
    if args.cases:
        run_cases(args)
        return
    if args.only is not None:
        d = draw(args.only, args.jobs)
        print(HEAD)
        print(line(measure(d, args.cpu_cap)))
        if args.trace:
            trace(d, args.cpu_cap)
        return
    run_draws(args)


if __name__ == "__main__":
    main()
