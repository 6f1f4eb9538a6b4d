"""End to end: 500 jobs against a loopback sandbox that fails on purpose.

The sandbox answers 10 % of accepted requests with a 5xx, drops 5 % of connections
mid-answer and holds 5 % past the client's timeout. Every request it saw is counted,
whatever its answer.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.limits import LimitKey, limit_table, parse_override
from batchrun.sandbox.app import create_app
from batchrun.sandbox.faults import Faults
from batchrun.sandbox.serving import running
from support.oracles import max_in_window

pytestmark = pytest.mark.e2e

JOBS = 500
RULE = "run-query=100/1s"
# Slow answers take 1 s; the client gives up after 0.3 s, so each is a timeout.
SLOW_SECONDS = 1.0
TIMEOUT = "0.3"


def clean_env(**settings):
    """The CLI's environment: no BATCHRUN_* from outside (the autouse fixture that
    strips them is per test, and this run is shared by the module), then `settings`."""
    env: dict[str, str | None] = dict.fromkeys(
        (name for name in os.environ if name.startswith("BATCHRUN_")), None
    )
    return env | settings


@pytest.fixture(scope="module")
def flaky_run(tmp_path_factory):
    """One run of 500 run-query jobs against the flaky sandbox, shared by the tests."""
    folder = tmp_path_factory.mktemp("flaky")
    jobs = folder / "jobs.csv"
    rows = [f"q{i:04d},run-query,team{i % 7}," for i in range(JOBS)]
    jobs.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    results = folder / "results.jsonl"
    server = create_app(
        rules=limit_table(overrides=[parse_override(RULE)]),
        faults=Faults(
            rate_5xx=0.10,
            rate_drop=0.05,
            rate_slow=0.05,
            slow_seconds=SLOW_SECONDS,
            seed=11,
        ),
    )
    args = ["submit", str(jobs), "--limit", RULE, "--timeout", TIMEOUT]
    args += ["--concurrency", "16", "--max-attempts", "3", "--results", str(results)]
    with running(server) as url:
        outcome = CliRunner().invoke(
            app,
            [*args, "--base-url", url],
            env=clean_env(BATCHRUN_STATE_DIR=str(folder / "state")),
        )
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    return outcome, lines, server.state.sandbox


def test_every_job_ends_done_or_failed_with_its_reason(flaky_run):
    """Each of the 500 jobs has exactly one result: done, or failed with an error."""
    outcome, lines, _ = flaky_run
    assert outcome.exit_code in (0, 1), outcome.stdout + outcome.stderr
    assert len(lines) == JOBS
    assert {line["id"] for line in lines} == {f"q{i:04d}" for i in range(JOBS)}
    failed = [line for line in lines if line["status"] == "failed"]
    assert all(line["error"] for line in failed), failed
    assert {line["status"] for line in lines} <= {"done", "failed"}
    # The faults really happened: jobs were retried past each kind of failure.
    assert sum(line["attempts"] > 1 for line in lines) > JOBS * 0.1


def test_faults_were_injected_and_retries_stay_bounded(flaky_run):
    """Every fault kind was seen, and the sandbox saw at most 3 requests per job."""
    _, _, sandbox = flaky_run
    statuses = Counter(a.status for a in sandbox.arrivals)
    assert statuses[0] > 0  # dropped connections
    assert sum(statuses[s] for s in (500, 502, 503)) > 0
    assert len(sandbox.arrivals) <= 3 * JOBS, statuses


def test_no_window_holds_more_than_the_limit_counting_every_attempt(flaky_run):
    """Counting every arrival, whatever its answer, no 1 s window holds over 100."""
    _, _, sandbox = flaky_run
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 1.0) <= 100
    assert not [a for a in sandbox.arrivals if a.status == 429]
