"""The printed tables (Markdown, so docs/benchmarks/ can hold them as printed) and
the goals of issue 5, checked against the measured figures."""

from __future__ import annotations

from typing import Any

from bench.stricter import table as stricter_table


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def pacing(runs: list[dict[str, Any]]) -> str:
    rows = [
        [
            r["shape"],
            r["tool"],
            r["jobs"],
            ", ".join(f"{w['most']} / {w['limit']}" for w in r["windows"]),
            r["http_429"],
            r.get("connection_errors_retried", 0),
            f"{r['makespan_s']:.2f}",
            f"{r['ideal_s']:.2f}",
            f"{r['makespan_ratio']:.3f}",
        ]
        for r in runs
    ]
    header = ["shape", "tool", "jobs", "most in a window / limit", "429s"]
    header += ["conn. errors retried"]
    return table([*header, "makespan s", "ideal s", "ratio"], rows)


def stricter(rows: list[dict[str, Any]]) -> str:
    return stricter_table(rows)


def overhead(result: dict[str, Any]) -> str:
    rows = [[r["what"], f"{r['grants']:,}", r["us_per_grant"]] for r in result["rows"]]
    return table(["what (rule " + result["rule"] + ")", "grants", "CPU µs/grant"], rows)


def throughput(result: dict[str, Any]) -> str:
    rows = []
    for case in result["cases"]:
        n = case["concurrency"]
        for name, label in (
            ("bare", "bare httpx + anyio loop"),
            ("runner", "batchrun Runner path"),
            ("runner_ledger", "Runner path + SQLite ledger"),
            ("runner_durable", "Runner path + SQLite ledger + run store, results"),
        ):
            if name not in case:
                continue
            run = case[name]
            rps, wall = round(run["rps"]), f"{run['wall_s']:.2f}"
            rows.append(
                [label, n, run.get("in_flight_mean", "-"), run["count"], rps, wall]
            )
        rows.append(_cli_row(case["cli_submit"], n))
    header = ["client", "concurrency", "mean in flight at a send", "requests"]
    return table([*header, "req/s (server-side)", "wall s"], rows)


def _cli_row(cli: dict[str, Any], concurrency: int) -> list[Any]:
    label = "`batchrun submit` (subprocess)"
    if "error" in cli:
        return [label, concurrency, "-", "-", cli["error"], "-"]
    wall = f"{cli['wall_s']:.2f} (with start-up)"
    return [label, concurrency, "-", cli["count"], round(cli["rps"]), wall]


def bigfile(result: dict[str, Any]) -> str:
    rows = [
        [
            "`read_jobs` (keeps every Job)",
            result["read_jobs"]["seconds"],
            result["read_jobs"]["peak_rss_mib"],
        ],
        [
            "`scan` (streaming)",
            result["scan"]["seconds"],
            result["scan"]["peak_rss_mib"],
        ],
        [
            "`batchrun validate` (wall)",
            result["validate"]["wall_s"],
            result["validate"]["peak_rss_mib"],
        ],
    ]
    first = result.get("first_request")
    if first is not None:
        for key, name in (("seconds", "a fresh run"), ("resume_seconds", "its resume")):
            if key in first:
                seconds = first[key]
                shown = seconds if seconds is not None else f"> {first['cap_s']}"
                rows.append(
                    [f"`batchrun submit`, {name}: to first request", shown, "-"]
                )
    size = f"{result['rows']:,} rows, {result['bytes'] / 2**20:.0f} MiB"
    return table([f"step ({size})", "seconds", "peak RSS MiB"], rows)


def startup(result: dict[str, Any]) -> str:
    rows = [[name, r["best_ms"]] for name, r in result.items()]
    return table(["command", "best of runs, ms"], rows)


def goals(results: dict[str, Any]) -> list[list[Any]]:
    """Each goal of issue 5 with the measured figure and whether it was met."""
    found: list[list[Any]] = []
    for run in results.get("pacing", []):
        if run["tool"] == "batchrun":
            found += _pacing_goal(run)
    if "overhead" in results:
        found += _overhead_goals(results["overhead"])
    if "throughput" in results:
        found += _throughput_goals(results["throughput"])
    if "startup" in results:
        for name in ("batchrun --help", "batchrun validate (10 rows)"):
            best = results["startup"][name]["best_ms"]
            found.append([f"{name} under 300 ms", f"{best} ms", best < 300])
    return found


def _pacing_goal(run: dict[str, Any]) -> list[list[Any]]:
    shape = run["shape"]
    return [
        [
            f"{shape}: no window exceeded",
            f"exceeded by {run['exceeded_by']}",
            run["exceeded_by"] <= 0,
        ],
        [f"{shape}: zero 429s", run["http_429"], run["http_429"] == 0],
        [
            f"{shape}: makespan within 2 % of ideal",
            f"{run['makespan_ratio']:.3f}",
            run["makespan_ratio"] <= 1.02,
        ],
    ]


def _overhead_goals(result: dict[str, Any]) -> list[list[Any]]:
    rows = result["rows"]
    memory = next(r for r in rows if "MemoryLedger.reserve" in r["what"])
    anchor = min(
        (r for r in rows if not r["what"].startswith("batchrun")),
        key=lambda r: r["us_per_grant"],
    )
    found = [
        [
            "memory ledger at or below the fastest anchor",
            f"{memory['us_per_grant']} µs vs "
            f"{anchor['what']} {anchor['us_per_grant']} µs",
            memory["us_per_grant"] <= anchor["us_per_grant"],
        ]
    ]
    for row in rows:
        if "SqliteLedger" in row["what"]:
            found.append(
                [
                    f"SQLite ledger under 100 µs ({row['grants']:,} grants)",
                    f"{row['us_per_grant']} µs",
                    row["us_per_grant"] < 100,
                ]
            )
    if not result["sqlite_ledger_present"]:
        found.append(
            ["SQLite ledger under 100 µs", "SqliteLedger not importable", None]
        )
    return found


def _throughput_goals(result: dict[str, Any]) -> list[list[Any]]:
    found = []
    for case in result["cases"]:
        n, bare = case["concurrency"], case["bare"]["rps"]
        runs = [
            ("Runner path", case["runner"]),
            ("`batchrun submit`", case["cli_submit"]),
        ]
        for name, run in runs:
            if "error" not in run:
                share = run["rps"] / bare
                goal = f"{name} at least 80 % of the bare loop (concurrency {n})"
                found.append([goal, f"{share:.0%}", share >= 0.8])
    return found


def goals_table(results: dict[str, Any]) -> str:
    rows = [
        [goal, measured, {True: "met", False: "**missed**", None: "-"}[ok]]
        for goal, measured, ok in goals(results)
    ]
    return table(["goal (issue 5)", "measured", ""], rows)
