"""The chart: requests in the trailing window over time, against the limit.

One panel for batchrun and one for the anchor that exceeded a window the most, on
the shape and window where it did. The line is how many arrivals (whatever their
answer) the sandbox saw in the window ending at each moment; arrivals answered 429
(by any window of the rule) are marked.
"""

from __future__ import annotations

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
