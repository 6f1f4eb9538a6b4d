"""The chart: requests in the trailing window over time, against the limit.

One panel for batchrun and one for the anchor that exceeded a window the most, on
the shape and window where it did. The line is how many arrivals (whatever their
answer) the sandbox saw in the window ending at each moment; arrivals answered 429
(by any window of the rule) are marked.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from batchrun.core.limits import parse_rule


def trailing(times: list[float], seconds: float) -> tuple[list[float], list[int]]:
    """The count of arrivals in (t - seconds, t] at every moment it changes: each
    arrival, and each moment an arrival leaves the window (t + seconds)."""
    end = times[-1]
    moments = sorted({*times, *(t + seconds for t in times if t + seconds <= end)})
    return moments, [_inside(times, t, seconds) for t in moments]


def _inside(times: list[float], moment: float, seconds: float) -> int:
    return bisect_right(times, moment) - bisect_right(times, moment - seconds)


def worst(pacing: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """The anchor run and window index with the largest most/limit ratio."""
    anchors = [r for r in pacing if r["tool"] != "batchrun"]
    return max(
        ((run, i) for run in anchors for i in range(len(run["windows"]))),
        key=lambda pair: (
            pair[0]["windows"][pair[1]]["most"] / pair[0]["windows"][pair[1]]["limit"]
        ),
    )


def _panel(axis: Any, run: dict[str, Any], index: int) -> None:
    window = parse_rule(run["shape"]).windows[index]
    times = [at for at, _ in run["arrivals"]]
    moments, counts = trailing(times, window.seconds)
    axis.step(moments, counts, where="post", label="requests in the trailing window")
    axis.axhline(window.count, color="black", linestyle="--", label=f"limit {window}")
    rejected = [at for at, status in run["arrivals"] if status == 429]
    if rejected:
        heights = [_inside(times, t, window.seconds) for t in rejected]
        axis.scatter(rejected, heights, color="red", marker="x", label="answered 429")
    most = run["windows"][index]["most"]
    axis.set_title(
        f"{run['tool']}: {run['shape']}, {run['jobs']} jobs, "
        f"most {most} in {window.seconds:g} s"
    )
    axis.set_ylabel("requests")
    axis.legend(loc="best", fontsize="small")


def draw(pacing: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    """Write the PNG; return which runs it shows."""
    anchor, index = worst(pacing)
    ours = next(
        r for r in pacing if r["tool"] == "batchrun" and r["shape"] == anchor["shape"]
    )
    figure, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True, sharey=True)
    _panel(axes[0], ours, index)
    _panel(axes[1], anchor, index)
    axes[1].set_xlabel("seconds since the driver started")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return {
        "path": str(path),
        "shape": anchor["shape"],
        "anchor": anchor["tool"],
        "window": anchor["windows"][index]["window"],
    }


# The benchmark pages' charts (docs/benchmarks/), drawn from the figures kept in
# bench/: `python -m bench.chart` redraws them all.
HERE = Path(__file__).parent
PAGES = HERE.parent / "docs" / "benchmarks"


def bars(path: Path, title: str, values: dict[str, float], unit: str) -> None:
    """A horizontal bar per label, its value written at its end."""
    figure, axis = plt.subplots(figsize=(9, 0.45 * len(values) + 1.2))
    labels = list(values)[::-1]
    axis.barh(labels, [values[label] for label in labels], color="tab:blue")
    for y, label in enumerate(labels):
        axis.annotate(
            f" {values[label]:g}",
            (values[label], y),
            va="center",
            fontsize="small",
        )
    axis.set_xlabel(unit)
    axis.set_title(title)
    axis.margins(x=0.12)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def throughput(path: Path, cases: list[dict[str, Any]]) -> None:
    """Requests a second per client, grouped by concurrency."""
    names = {
        "bare": "bare httpx loop",
        "runner": "Runner path",
        "runner_ledger": "+ SQLite ledger",
        "runner_durable": "+ run store, results",
        "cli_submit": "batchrun submit",
    }
    figure, axis = plt.subplots(figsize=(9, 4))
    width = 0.16
    for i, (key, name) in enumerate(names.items()):
        xs = [c + (i - 2) * width for c in range(len(cases))]
        axis.bar(xs, [case[key]["rps"] for case in cases], width, label=name)
    axis.set_xticks(range(len(cases)))
    axis.set_xticklabels([f"concurrency {case['concurrency']}" for case in cases])
    axis.set_ylabel("requests a second (server-side)")
    axis.set_title("2,000 requests, limits not binding")
    axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def stricter(
    path: Path, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]
) -> None:
    """Makespan over the server's ideal per server: batchrun's first run and rerun
    (`ours`), and the anchors' retry loops (`theirs`, the baseline)."""
    servers = list(dict.fromkeys(row["scenario"] for row in ours))
    drivers = ["batchrun", "batchrun rerun", "aiolimiter", "pyrate-limiter", "limits"]
    rows = {(r["scenario"], r["tool"]): r for r in [*theirs, *ours]}
    figure, axis = plt.subplots(figsize=(10, 0.7 * len(servers) + 1.5))
    height = 0.15
    for i, driver in enumerate(drivers):
        ys = [s + (i - 2) * height for s in range(len(servers))]
        ratios = [rows[(s, driver)].get("ratio") or 0.0 for s in servers]
        axis.barh(ys, ratios, height, label=driver)
    axis.set_yticks(range(len(servers)))
    axis.set_yticklabels(servers, fontsize="small")
    axis.invert_yaxis()
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_xlabel(
        "makespan / server-ideal (lower is better; 1 is the best any client can do)"
    )
    axis.set_title("60 jobs, client 30/2s, against stricter servers")
    axis.legend(fontsize="small", loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _load(name: str) -> Any:
    return json.loads((HERE / "results" / name).read_text())


def pages() -> None:
    """Every chart of docs/benchmarks/, from bench/results/results.json and the
    stricter-server runs kept beside it."""
    results = _load("results.json")
    draw(results["pacing"], PAGES / "pacing.png")
    rows = results["overhead"]["rows"]
    grants = {row["what"]: row["us_per_grant"] for row in rows}
    bars(PAGES / "overhead.png", "CPU per grant (rule 1000000/1s)", grants, "µs")
    throughput(PAGES / "throughput.png", results["throughput"]["cases"])
    big = results["bigfile"]
    memory = {
        step: big[step]["peak_rss_mib"] for step in ("read_jobs", "scan", "validate")
    }
    bars(PAGES / "big-files.png", "1,000,000 rows: peak RSS", memory, "MiB")
    startup = {what: run["best_ms"] for what, run in results["startup"].items()}
    bars(PAGES / "startup.png", "Start-up, best of 5", startup, "ms")
    rows = _load("stricter.json")
    ours = [row for row in rows if row["tool"].startswith("batchrun")]
    theirs = [row for row in rows if not row["tool"].startswith("batchrun")]
    stricter(PAGES / "stricter.png", ours, theirs)


if __name__ == "__main__":
    pages()
