"""The line `batchrun cron-line` prints, run as cron runs it: `/bin/sh -c` under an
empty environment (`env -i`), against a loopback sandbox."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.limits import limit_table, parse_override
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running

pytestmark = pytest.mark.e2e
TOKEN = "tok-cron-7e1d-SECRET"
LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d batchrun\[\d+\] nightly\.csv: ")


def cron_line(tmp_path, url):
    jobs = tmp_path / "jobs" / "nightly.csv"
    jobs.parent.mkdir()
    rows = [f"q{i},run-query,t1," for i in range(5)] + ["i0,invite,t1,"]
    jobs.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    env_file = tmp_path / "batchrun.env"
    env_file.write_text(f"BATCHRUN_TOKEN={TOKEN}\n")
    args = ["cron-line", str(jobs), "--base-url", url, "--env-file", str(env_file)]
    result = CliRunner().invoke(app, [*args, "--limit", "run-query=20/1s"])
    assert result.exit_code == 0, result.stderr
    return jobs, result.stdout.strip()


def test_the_printed_line_works_under_env_i(tmp_path):
    """Under `env -i` (no PATH to the venv, no HOME, no BATCHRUN_*) the command of
    the printed line sends every job with the env file's token, into a log folder
    it made, every log line naming time, process and file; the token is not in it."""
    rules = limit_table(overrides=[parse_override("run-query=20/1s")])
    server = create_app(rules=rules)
    with running(server) as url:
        jobs, line = cron_line(tmp_path, url)
        assert line.startswith("0 1 * * * ")
        assert TOKEN not in line
        command = line.removeprefix("0 1 * * * ").replace("\\%", "%")
        done = subprocess.run(
            ["/usr/bin/env", "-i", "/bin/sh", "-c", command], timeout=60, check=False
        )
    assert done.returncode == 0
    log = (jobs.parent / "logs" / "nightly.log").read_text().splitlines()
    assert any("summary:" in entry for entry in log)
    assert [entry for entry in log if not LINE.match(entry)] == []
    results = jobs.with_name("nightly.results.jsonl").read_text().splitlines()
    assert {json.loads(r)["status"] for r in results} == {"done"}
    assert len(results) == 6
    bearer = hashlib.sha256(f"Bearer {TOKEN}".encode()).hexdigest()[:12]
    assert {a.client for a in server.state.sandbox.arrivals} == {bearer}
