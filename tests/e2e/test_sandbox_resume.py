"""The README's demo, cut by Ctrl-C and run again, as a user would from a shell:
a `--sandbox` run resumes like any run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
SAMPLE = Path(__file__).parents[2] / "sample_jobs.csv"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_sandbox_demo_cut_by_ctrl_c_sends_only_the_rest(tmp_path):
    """90 jobs with --sandbox, SIGINT after some ended: exit 130, saying to run
    the same command; the rerun resumes, sends only the rest, and the results
    file ends with one line per job."""
    jobs = tmp_path / "sample_jobs.csv"
    shutil.copy(SAMPLE, jobs)
    results = tmp_path / "sample_jobs.sandbox.results.jsonl"
    state = ["--state-dir", str(tmp_path / "state")]
    args = [sys.executable, "-m", "batchrun", "submit", str(jobs), "--sandbox"]
    args += ["--time-scale", "60", *state]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while len(_lines(results)) < 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 130, err
    assert b"run the same command to resume" in err
    assert b"not kept" not in err
    before = len(_lines(results))
    assert 20 <= before < 90
    again = subprocess.run(args, capture_output=True, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    assert f"Resuming: {before} done earlier, {90 - before} to send".encode() in (
        again.stderr
    )
    ids = [json.loads(line)["id"] for line in _lines(results)]
    assert len(ids) == len(set(ids)) == 90
