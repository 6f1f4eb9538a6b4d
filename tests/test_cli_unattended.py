"""What a run at night needs (issue 22), through the command line: the metrics
file, the halt on a failure storm, answers by status code, the failed jobs as a
jobs file, and one budget for several tokens."""

from __future__ import annotations

import csv
import json
import re
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.limits import limit_table
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running

runner = CliRunner()
FAST = ["--sandbox", "--time-scale", "1000"]


def jobs_file(tmp_path, count=3):
    """`count` jobs: run-query, invite and avatar in turn."""
    kinds = ["run-query,t1", "invite,t1", "avatar,"]
    rows = [f"j{n},{kinds[n % 3]},,extra{n}" for n in range(count)]
    path = tmp_path / "jobs.csv"
    path.write_text("id,type,team_id,payload,note\n" + "\n".join(rows) + "\n")
    return path


def samples(path):
    """(name, labels without `jobs`) -> value, for every sample of the file."""
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            assert sample.labels.pop("jobs") == "jobs.csv"
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_a_run_writes_its_metrics_file(tmp_path):
    """--metrics-file: the ended run's exit code, success time, jobs by outcome
    and answers by code, read with prometheus_client's own parser."""
    metrics = tmp_path / "batchrun.prom"
    path = jobs_file(tmp_path)
    result = runner.invoke(
        app, ["submit", str(path), *FAST, "--metrics-file", str(metrics)]
    )
    assert result.exit_code == 0, result.output
    s = samples(metrics)
    assert s["batchrun_run_exit_code", ()] == 0
    assert s["batchrun_run_in_progress", ()] == 0
    assert (
        s["batchrun_last_success_timestamp_seconds", ()]
        == s["batchrun_run_end_timestamp_seconds", ()]
    )
    for key in ("run-query", "invite", "avatar"):
        assert s["batchrun_jobs", (("endpoint", key), ("outcome", "done"))] == 1
        assert s["batchrun_jobs", (("endpoint", key), ("outcome", "left"))] == 0
    assert s["batchrun_responses", (("code", "200"), ("endpoint", "run-query"))] == 1
    assert s["batchrun_rule_learned", (("endpoint", "invite"),)] == 0


def test_a_failed_run_keeps_the_last_success(tmp_path):
    """A run that exits 1 writes its code and keeps the earlier success time."""
    metrics = tmp_path / "batchrun.prom"
    path = jobs_file(tmp_path)
    args = ["submit", str(path), "--metrics-file", str(metrics)]
    assert runner.invoke(app, [*args, *FAST]).exit_code == 0
    success = samples(metrics)["batchrun_last_success_timestamp_seconds", ()]
    with running(create_app(rules=limit_table())) as url:
        bad = runner.invoke(app, [*args, "--base-url", url + "/wrong-prefix"])
    assert bad.exit_code == 1
    s = samples(metrics)
    assert s["batchrun_run_exit_code", ()] == 1
    assert s["batchrun_last_success_timestamp_seconds", ()] == success
    assert s["batchrun_jobs", (("endpoint", "invite"), ("outcome", "failed"))] == 1
    assert s["batchrun_responses", (("code", "404"), ("endpoint", "avatar"))] == 1


def test_a_bad_jobs_file_writes_exit_2(tmp_path):
    """A refused file is a failed night too: the file says 2."""
    metrics = tmp_path / "batchrun.prom"
    path = tmp_path / "jobs.csv"
    path.write_text("id,type\nx,nope\n")
    result = runner.invoke(
        app, ["submit", str(path), *FAST, "--metrics-file", str(metrics)]
    )
    assert result.exit_code == 2
    assert samples(metrics)["batchrun_run_exit_code", ()] == 2


def test_metrics_without_the_extra_exit_2_saying_how_to_install(tmp_path, monkeypatch):
    """No prometheus_client: exit 2 before anything is sent, naming the extra."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "batchrun.cli.metrics", raising=False)
    path = jobs_file(tmp_path)
    result = runner.invoke(
        app, ["submit", str(path), *FAST, "--metrics-file", str(tmp_path / "m.prom")]
    )
    assert result.exit_code == 2
    assert "pip install 'batchrun[metrics]'" in result.stderr
    assert not (tmp_path / "jobs.sandbox.results.jsonl").exists()


def test_metrics_in_a_missing_folder_exit_2(tmp_path):
    """A metrics file whose folder is not there is a usage error, found at once."""
    path = jobs_file(tmp_path)
    where = tmp_path / "no" / "m.prom"
    result = runner.invoke(
        app, ["submit", str(path), *FAST, "--metrics-file", str(where)]
    )
    assert result.exit_code == 2
    assert f"--metrics-file {where}: the folder" in result.stderr


STORM = ["--inject", "5xx=1", "--max-attempts", "1", "--concurrency", "1"]


def test_halt_after_n_failures_stops_with_jobs_left(tmp_path):
    """--halt-after 3: every job fails, so the run stops after 3 (and what was in
    flight), exits 1, says why, and leaves the rest for a resume."""
    path = jobs_file(tmp_path, count=30)
    result = runner.invoke(
        app, ["submit", str(path), *FAST, *STORM, "--halt-after", "3"]
    )
    assert result.exit_code == 1, result.output
    output = result.stdout + result.stderr
    assert "Halted: 3 job(s) failed in this run (--halt-after 3)" in output
    assert "job(s) left" in output
    lines = (tmp_path / "jobs.sandbox.results.jsonl").read_text().splitlines()
    assert len(lines) == 3


def test_halt_after_a_share_waits_for_twenty_jobs(tmp_path):
    """--halt-after 50%: every job fails, but the share is judged from 20 on."""
    path = jobs_file(tmp_path, count=30)
    result = runner.invoke(
        app, ["submit", str(path), *FAST, *STORM, "--halt-after", "50%"]
    )
    assert result.exit_code == 1
    assert (
        "20 of 20 ended jobs failed in this run (100%" in result.stdout + result.stderr
    )
    lines = (tmp_path / "jobs.sandbox.results.jsonl").read_text().splitlines()
    assert len(lines) == 20


def test_without_halt_after_a_storm_runs_to_the_end(tmp_path):
    """The default is as before: every job is tried."""
    path = jobs_file(tmp_path, count=30)
    result = runner.invoke(app, ["submit", str(path), *FAST, *STORM])
    assert result.exit_code == 1
    assert "Halted" not in result.stdout + result.stderr
    assert len((tmp_path / "jobs.sandbox.results.jsonl").read_text().splitlines()) == 30


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        # A policy that is not N or P%.
        ("--halt-after", "lots", "bad --halt-after 'lots'"),
        # An empty or unprintable name.
        ("--budget-key", " ", "--budget-key must be a name"),
    ],
)
def test_a_bad_night_flag_exits_2_before_anything_is_sent(tmp_path, flag, value, said):
    path = jobs_file(tmp_path)
    result = runner.invoke(app, ["submit", str(path), *FAST, flag, value])
    assert result.exit_code == 2
    assert said in result.stderr


def test_the_summary_counts_answers_by_code(tmp_path):
    """Each endpoint's answers by status code and latency close the summary."""
    path = jobs_file(tmp_path)
    result = runner.invoke(app, ["submit", str(path), *FAST])
    assert result.exit_code == 0
    assert re.search(r"run-query responses: 200: 1; p50 \d", result.stdout)


def _failed_run(tmp_path):
    """A run of 3 jobs against a server that answers 404 to each."""
    path = jobs_file(tmp_path)
    with running(create_app(rules=limit_table())) as url:
        base = url + "/wrong-prefix"
        result = runner.invoke(app, ["submit", str(path), "--base-url", base])
    assert result.exit_code == 1
    return path, base


def test_status_json_holds_the_latest_runs_answers(tmp_path):
    """status --json: per endpoint, codes and latency p50/p95/max in seconds."""
    path, base = _failed_run(tmp_path)
    result = runner.invoke(app, ["status", str(path), "--json", "--base-url", base])
    assert result.exit_code == 0, result.output
    responses = json.loads(result.stdout)["responses"]
    assert responses["run-query"]["codes"] == {"404": 1}
    latency = responses["run-query"]["latency"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["max"] * 1.01
    lines = runner.invoke(app, ["status", str(path), "--base-url", base]).stdout
    assert "latest run: invite responses: 404: 1; p50 " in lines


def test_failed_jobs_become_a_jobs_file(tmp_path):
    """status --failed-as-jobs: the failed jobs, same columns, ready to resubmit."""
    path, base = _failed_run(tmp_path)
    out = tmp_path / "fix-me.csv"
    args = ["status", str(path), "--base-url", base, "--failed-as-jobs", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"3 failed job(s) written to {out}" in result.stderr
    with out.open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["id"] for row in rows] == ["j0", "j1", "j2"]
    assert rows[0]["note"] == "extra0"
    again = runner.invoke(app, ["validate", str(out)])
    assert again.exit_code == 0


def test_budget_key_shares_one_budget_between_tokens(tmp_path):
    """Two tokens with one --budget-key draw on one ledger: what the old token
    sent is in use for the new one; without the key each has its own budget."""
    path = jobs_file(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    later = jobs_file(other)
    with running(create_app(rules=limit_table())) as url:
        where = ["--base-url", url]
        sent = runner.invoke(
            app, ["submit", str(path), *where, "--token", "old", "--budget-key", "prod"]
        )
        assert sent.exit_code == 0, sent.output

        def in_use(*extra):
            args = ["plan", str(later), *where, "--token", "new", "--json", *extra]
            result = runner.invoke(app, args)
            assert result.exit_code == 0, result.output
            return {k["key"]: k["in_use"] for k in json.loads(result.stdout)["keys"]}

        assert in_use("--budget-key", "prod")["invite"] == {"15/5m": 1}
        assert in_use()["invite"] == {"15/5m": 0}


def test_a_run_refused_for_anothers_lock_leaves_the_metrics_file(tmp_path):
    """Exit 3: the file belongs to the run holding the lock, and stays as it was."""
    from batchrun.store.paths import StatePaths
    from batchrun.store.runlock import RunLock

    metrics = tmp_path / "batchrun.prom"
    metrics.write_text("# the other run's\n")
    path = jobs_file(tmp_path)
    # A --sandbox run's (FAST's) lock is in the sandbox's state folder.
    state = StatePaths(tmp_path / "state").made().sandbox()
    with RunLock(state.make_run_folder(path), path):
        result = runner.invoke(
            app,
            [
                *("submit", str(path), *FAST, "--metrics-file", str(metrics)),
                *("--state-dir", str(tmp_path / "state")),
            ],
        )
    assert result.exit_code == 3
    assert metrics.read_text() == "# the other run's\n"
