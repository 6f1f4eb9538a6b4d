"""End to end: `batchrun submit` against the sandbox over real loopback sockets.

Windows are scaled down (30/2s) so real timing stays short; tolerances hold on a
busy 2-core machine. Every request the sandbox saw is counted.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.limits import LimitKey, Pace, limit_table, parse_override, parse_rule
from batchrun.pacing.slots import eta
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running
from support.oracles import max_in_window

pytestmark = pytest.mark.e2e
runner = CliRunner()


def query_jobs(tmp_path, count):
    path = tmp_path / "jobs.csv"
    rows = [f"q{i:04d},run-query,team{i % 3}," for i in range(count)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def serve(rule: str):
    overrides = [parse_override(f"run-query={rule}")]
    return create_app(rules=limit_table(overrides=overrides))


def submit(path, url, *args):
    started = time.monotonic()
    result = runner.invoke(app, ["submit", str(path), "--base-url", url, *args])
    return result, time.monotonic() - started


@pytest.mark.parametrize("pace", list(Pace))
def test_120_jobs_at_30_per_2s_finish_near_ideal_with_no_429(tmp_path, pace):
    """120 run-query jobs at 30/2s: zero 429s, no window exceeded, < 1.5 x ideal
    (a sanity bound that holds under coverage on a busy 2-core machine, where
    1.2 x failed at 7.22 s of 7.2; the speed goal is in bench/)."""
    rule = parse_rule("30/2s")
    server = serve("30/2s")
    with running(server) as url:
        result, elapsed = submit(
            query_jobs(tmp_path, 120),
            url,
            "--limit",
            "run-query=30/2s",
            "--pace",
            pace.value,
            "--concurrency",
            "32",
        )
    assert result.exit_code == 0, result.stdout + result.stderr
    sandbox = server.state.sandbox
    statuses = Counter(a.status for a in sandbox.arrivals)
    assert statuses == {200: 120}
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 2.0) <= 30
    ideal = eta(120, rule, now=0.0, pace=pace)
    assert elapsed < 1.5 * ideal, (elapsed, ideal)


def test_stricter_sandbox_still_ends_every_job_done_exactly_once(tmp_path):
    """Client at 30/2s, server at 20/2s: 429s happen, yet each job is done once."""
    server = serve("20/2s")
    with running(server) as url:
        result, _ = submit(
            query_jobs(tmp_path, 40),
            url,
            "--limit",
            "run-query=30/2s",
            "--concurrency",
            "32",
        )
    assert result.exit_code == 0, result.stdout + result.stderr
    arrivals = server.state.sandbox.arrivals
    assert any(a.status == 429 for a in arrivals)
    done = Counter(a.idempotency_key for a in arrivals if a.status == 200)
    assert len(done) == 40
    assert set(done.values()) == {1}
    results = (tmp_path / "jobs.results.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["status"] for r in results) == ["done"] * 40
    # Retries carry the job's own Idempotency-Key.
    assert len({a.idempotency_key for a in arrivals}) == 40
