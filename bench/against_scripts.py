"""batchrun against the scripts a user would write instead (issue 24, item 7).

Every case of `support.script_cases` is run by `batchrun submit` and by the four
scripts `bench.script_pyrate`, `bench.script_limits`, `bench.script_aiolimiter`
and `bench.script_sleep`, each in its own process against its own fresh server
(`support.case_server`: the sandbox on loopback, every request logged; case 9:
stock slowapi, `support.slowapi_server`, with the same log), one run
after another (`--side-by-side`: the tools of a case at once, quicker but they
share the machine and the servers' thread lock, which slows every round trip); the
table gives, per case and tool, the median over the rounds of the 429s the server
sent and of the makespan (first arrival to last accepted answer, at the server)
over the case's ideal (`Case.ideal`). Every run is bounded: SIGTERM after
max(30 s, 6 x ideal), then SIGKILL.

    python -m bench.against_scripts                 # every case, 3 rounds
    python -m bench.against_scripts --case 2 --quick  # one row, one round
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from bench.progress import say
from support.script_cases import CASES, SCALE, Case, case_server, chains, summarize

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "against_scripts.json"
TOOLS = {
    "batchrun": "batchrun",
    "pyrate-limiter script": "bench.script_pyrate",
    "limits script": "bench.script_limits",
    "aiolimiter script": "bench.script_aiolimiter",
    "sleep loop": "bench.script_sleep",
}
TOKEN = "bench-token-not-a-secret"
# Between a case and the one that follows it: two 2 s windows, a later run.
SETTLE = 4.0
_STOP_SECONDS = 10.0


def command(tool: str, case: Case, url: str, folder: Path, again: bool) -> list[str]:
    """The command line that runs `case` with `tool` against `url`."""
    jobs = str(folder / "jobs.csv")
    if tool == "batchrun":
        told = "+".join(
            f"{w.count}/{w.seconds * SCALE:g}s" for w in case.told_rule.windows
        )
        line = [sys.executable, "-m", "batchrun", "submit", jobs, "--base-url", url]
        line += ["--limit", f"run-query={told}", "--time-scale", str(SCALE)]
        line += ["--state-dir", str(folder / "state"), "--quiet"]
        return line + (["--restart"] if again else [])
    (window,) = case.told_rule.windows
    line = [sys.executable, "-m", TOOLS[tool], jobs, "--base-url", url]
    line += ["--count", str(window.count), "--seconds", f"{window.seconds:g}"]
    return [*line, "--deadline", f"{timeout(case):g}"]


def timeout(case: Case) -> float:
    return max(30.0, 6 * case.ideal())


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    path = [str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    return env | {
        "PYTHONPATH": os.pathsep.join(path),
        "BATCHRUN_TOKEN": TOKEN,
        "API_TOKEN": TOKEN,
    }


def _execute(line: list[str], bound: float, log: Path) -> tuple[bool, int]:
    """Run `line`; SIGTERM at `bound` seconds, SIGKILL later. (stalled, exit code)"""
    with log.open("a") as out:
        process = subprocess.Popen(
            line, stdout=out, stderr=out, env=_environment(), cwd=ROOT
        )
        try:
            return False, process.wait(bound)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                return True, process.wait(_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                return True, process.wait()


def run_once(
    case: Case, tool: str, folder: Path, round_: int, again: bool
) -> dict[str, Any]:
    """One tool through one case against a fresh server; the row of figures."""
    with case_server(case, round_) as server:
        started = time.time()
        line = command(tool, case, server.url, folder, again)
        stalled, code = _execute(line, timeout(case), folder / "run.log")
        ended = time.time()
        log = list(server.log)
    return summarize(case, tool, log, round_, stalled, code) | {
        "run_s": round(ended - started, 2)
    }


def run_chain(chain: list[Case], tool: str, *, round_: int) -> list[dict[str, Any]]:
    """A chain of cases with one client state, SETTLE seconds apart."""
    rows = []
    with TemporaryDirectory() as name:
        folder = Path(name)
        for index, case in enumerate(chain):
            rows_file = "id,type,team_id,payload\n" + "".join(
                f"q{i:04d},run-query,acme,\n" for i in range(case.jobs)
            )
            (folder / "jobs.csv").write_text(rows_file)
            if index:
                time.sleep(SETTLE)
            rows.append(run_once(case, tool, folder, round_, again=index > 0))
    return rows


def measure(
    numbers: list[int] | None,
    tools: list[str],
    rounds: int,
    serial: bool,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Every round of every chosen case: the tools side by side (or serial)."""
    rows: list[dict[str, Any]] = []
    for round_ in range(rounds):
        for chain in chains(numbers):
            with ThreadPoolExecutor(1 if serial else len(tools)) as pool:
                done = pool.map(partial(run_chain, chain, round_=round_), tools)
                for chain_rows in done:
                    for row in chain_rows:
                        say(_line(row))
                        rows.append(row)
    wanted = set(numbers or [c.number for c in CASES])
    return [row for row in rows if row["case"] in wanted]


def _line(row: dict[str, Any]) -> str:
    state = " STALLED" if row["stalled"] else ""
    return (
        f"case {row['case']} round {row['round'] + 1} {row['tool']}: "
        f"{row['http_429']} x 429, {row['makespan_s']:.2f} s = {row['ratio']:.2f} x "
        f"ideal {row['ideal_s']:.2f} s, {row['accepted']}/{row['jobs']} accepted"
        f"{state}"
    )


def cell(rows: list[dict[str, Any]]) -> str:
    """'429s, ratio' medians over the rounds, with what went wrong in any."""
    if not rows:
        return "-"
    text = (
        f"{statistics.median(r['http_429'] for r in rows):g}, "
        f"{statistics.median(r['ratio'] for r in rows):.2f}"
    )
    stalled = sum(r["stalled"] for r in rows)
    short = sum(not r["exactly_once"] and not r["stalled"] for r in rows)
    notes = [
        f"{stalled} stalled" if stalled else "",
        f"{short} incomplete" * bool(short),
    ]
    shown = ", ".join(filter(None, notes))
    return f"{text} ({shown})" if shown else text


def table(rows: list[dict[str, Any]], tools: list[str]) -> str:
    """The Markdown table: case x tool -> median 429s, median ratio to the ideal."""
    lines = [
        "| case | ideal s | " + " | ".join(tools) + " |",
        "|---|---|" + "---|" * len(tools),
    ]
    for case in CASES:
        mine = [r for r in rows if r["case"] == case.number]
        if not mine:
            continue
        cells = [cell([r for r in mine if r["tool"] == tool]) for tool in tools]
        title = f"{case.number}. {case.title}"
        lines.append(f"| {title} | {case.ideal():.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _meta(rounds: int, serial: bool) -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    ).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit,
        "python": sys.version.split()[0],
        "rounds": rounds,
        "side_by_side": not serial,
        "scale": f"windows / {SCALE}",
    }


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.against_scripts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--case", type=int, nargs="+", choices=[c.number for c in CASES])
    add("--tool", nargs="+", choices=list(TOOLS), help="only these tools")
    add("--rounds", type=int, default=3, help="rounds per case (median kept)")
    add("--quick", action="store_true", help="one round")
    add("--side-by-side", action="store_true", help="the tools of a case at once")
    add(
        "--out",
        type=Path,
        help=f"write the rows as JSON (default for a full run: {RESULTS.name})",
    )
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    rounds = 1 if args.quick else args.rounds
    tools = args.tool or list(TOOLS)
    rows = measure(args.case, tools, rounds, not args.side_by_side, say)
    out = args.out or (None if args.case or args.tool or args.quick else RESULTS)
    text = table(rows, tools)
    if out:
        meta = _meta(rounds, not args.side_by_side)
        out.write_text(
            json.dumps({"meta": meta, "table": text, "rows": rows}, indent=1) + "\n"
        )
    print(text)


if __name__ == "__main__":
    main()
