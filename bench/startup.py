"""Measurement 5: start-up wall time of the installed `batchrun` command.

Best of `repeat` runs each of `batchrun --help` and `batchrun validate` on a 10-row
file, with `python -c pass` and `python -c "import batchrun.cli.commands"` beside
them to show how much is the interpreter and how much is importing.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bigfile import write_jobs
from bench.throughput import batchrun_command


def best_of(command: list[str], repeat: int) -> dict[str, Any]:
    """The fastest of `repeat` runs, in ms, and every run."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, check=False)
        times.append((time.perf_counter() - started) * 1000)
        if done.returncode != 0:
            msg = f"{command} exited {done.returncode}: {done.stderr.decode()[-300:]}"
            raise RuntimeError(msg)
    return {"best_ms": round(min(times), 1), "runs_ms": [round(t, 1) for t in times]}


def measure(repeat: int, say: Callable[[str], None]) -> dict[str, Any]:
    """Each command, best of `repeat`."""
    with tempfile.TemporaryDirectory() as folder:
        ten = Path(folder) / "ten.csv"
        write_jobs(ten, 10)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import batchrun.cli.commands'": [
                sys.executable,
                "-c",
                "import batchrun.cli.commands",
            ],
            "batchrun --help": [batchrun_command(), "--help"],
            "batchrun validate (10 rows)": [batchrun_command(), "validate", str(ten)],
        }
        result = {}
        for name, command in commands.items():
            result[name] = best_of(command, repeat)
            say(f"startup {name}: {result[name]['best_ms']} ms")
    return result
