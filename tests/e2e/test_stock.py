"""End to end: `batchrun submit` against a stock server-side limiter over loopback.

The server is Python `limits` (moving window, as slowapi runs it), not batchrun's
own sandbox: when the client's rule equals the server's, every job is accepted once
and nothing is refused. Windows are scaled down (10/1s) so the run takes seconds.
The nginx and express-rate-limit servers of bench/stock.py are exercised by
`python -m bench stricter`, not here: they need programs the test extra lacks.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.cli import app
from tests.stock import limits_server

pytestmark = pytest.mark.e2e
JOBS = 30


def query_jobs(tmp_path, count):
    path = tmp_path / "jobs.csv"
    rows = [f"q{i:04d},run-query,acme," for i in range(count)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("headers", [False, True], ids=["bare", "slowapi-headers"])
def test_equal_rules_against_limits_moving_window_are_done_once_with_no_429(
    tmp_path, headers
):
    """Client and server both at 10/1s (limits moving window): each job 200 once, no 429."""
    with limits_server("10/1s", strategy="moving-window", headers=headers) as server:
        started = time.monotonic()
        result = CliRunner().invoke(
            app,
            [
                "submit",
                str(query_jobs(tmp_path, JOBS)),
                "--base-url",
                server.url,
                "--limit",
                "run-query=10/1s",
            ],
        )
        elapsed = time.monotonic() - started
        arrivals = server.arrivals()
    assert result.exit_code == 0, result.stdout + result.stderr
    assert Counter(a.status for a in arrivals) == {200: JOBS}
    assert len({a.key for a in arrivals}) == JOBS
    # Ideal 2.0 s (two full windows after the first ten); slack for a busy machine.
    assert elapsed < 5.0, elapsed
