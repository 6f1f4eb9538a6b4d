"""One submit against a loopback server: a lost run store or ledger is noticed.

A run store that was deleted or emptied (its marker beside it remains), or missing
while a results file lists jobs of the file, is never taken for a fresh start: the
run refuses with exit 2 and sends nothing, unless `--restart`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from tests.test_cli import FAST, jobs_file

runner = CliRunner()


def submit(path: Path, url: str, *more: str):
    return runner.invoke(app, ["submit", str(path), "--base-url", url, *more])


def the_store(tmp_path: Path) -> Path:
    [store] = (tmp_path / "state" / "runs").glob("*/*.db")
    return store


@pytest.mark.parametrize("loss", ["deleted", "emptied"])
def test_a_lost_run_store_is_refused_not_sent_again(tmp_path, api, loss):
    """All three jobs (an invite among them) done, then the store lost: the rerun
    sends nothing and exits 2 saying so; --restart sends them all again."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    store = the_store(tmp_path)
    if loss == "deleted":
        store.unlink()
    else:
        store.write_bytes(b"")
    refused = submit(path, url)
    assert refused.exit_code == 2
    assert "was deleted or emptied after an earlier run" in refused.stderr
    assert "--restart" in refused.stderr
    assert len(sandbox.arrivals) == 3
    assert submit(path, url, "--restart").exit_code == 0
    assert len(sandbox.arrivals) == 6
    # The restarted store is marked again: a normal rerun resumes, sending nothing.
    again = submit(path, url)
    assert again.exit_code == 0, again.stderr
    assert len(sandbox.arrivals) == 6


def test_results_without_a_run_in_the_state_folder_are_refused(tmp_path, api):
    """Another state folder (moved, or wiped whole) has no run of the file, but its
    results file lists three: exit 2, pointing at --state-dir and --restart."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    refused = submit(path, url, "--state-dir", str(tmp_path / "elsewhere"))
    assert refused.exit_code == 2
    assert "holds 3 result(s) of earlier runs" in refused.stderr
    assert "--state-dir" in refused.stderr
    assert len(sandbox.arrivals) == 3


def test_a_sandbox_try_out_never_blocks_the_real_run(tmp_path, api):
    """The README's order: a --sandbox try-out (twice: the second resumes it,
    with nothing left to send), then the real API with the same file: the real
    run starts without --restart, sends every job once, and each run's results
    stay in their own file, one line per job."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    for _ in range(2):
        assert runner.invoke(app, ["submit", str(path), *FAST]).exit_code == 0
    real = submit(path, url)
    assert real.exit_code == 0, real.stderr
    assert len(sandbox.arrivals) == 3
    tried = (tmp_path / "jobs.sandbox.results.jsonl").read_text().splitlines()
    assert len(tried) == 3
    sent = (tmp_path / "jobs.results.jsonl").read_text().splitlines()
    assert len(sent) == 3


def test_a_first_run_and_a_rerun_go_as_before(tmp_path, api):
    """No results file and no store: a fresh start; a rerun resumes quietly."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    rerun = submit(path, url)
    assert rerun.exit_code == 0
    assert "Nothing to send" in rerun.stderr
    assert len(sandbox.arrivals) == 3


def test_an_emptied_ledger_is_reported(tmp_path, api):
    """The send ledger emptied between runs: the next run says its windows are
    paced as full (the ledger's own tests check the pacing)."""
    url, _ = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    (tmp_path / "state" / "ledger.db").write_bytes(b"")
    for suffix in ("-wal", "-shm"):
        (tmp_path / "state" / f"ledger.db{suffix}").unlink(missing_ok=True)
    rerun = submit(path, url)
    assert rerun.exit_code == 0
    assert "was emptied, deleted or replaced" in rerun.stderr


@pytest.mark.parametrize("where", ["api", "sandbox"])
@pytest.mark.parametrize(
    "content", [None, "id,type,team_id,payload\nx,nope,,\n"], ids=["missing", "bad"]
)
def test_a_submit_that_sends_nothing_leaves_nothing(tmp_path, api, where, content):
    """A missing jobs file, or one with a bad row: exit 2, and no ledger.db, run
    folder or run store is made; `status` then says there is no run (exit 2)
    rather than that no run is working on it (exit 0)."""
    url, sandbox = api
    state = tmp_path / "state"
    path = tmp_path / "jobs.csv"
    if content is not None:
        path.write_text(content)
    to = ["--sandbox"] if where == "sandbox" else ["--base-url", url]
    result = runner.invoke(app, ["submit", str(path), *to])
    assert result.exit_code == 2, result.stderr
    assert not (state / "ledger.db").exists()
    assert not list(state.rglob("*.db"))
    assert not (state / "runs").exists()
    assert not (state / "sandbox" / "runs").exists()
    shown = runner.invoke(app, ["status", str(path)])
    assert shown.exit_code == 2, shown.stdout
    said = "no such file" if content is None else "no run yet"
    assert said in shown.stderr
    assert sandbox.arrivals == []


def test_show_reads_the_results_file_the_run_recorded(tmp_path, api):
    """A run made with --results elsewhere.jsonl: `show JOBS ID` (and --json)
    gives the job's line from that file, with no --results given again."""
    url, _ = api
    path = jobs_file(tmp_path)
    elsewhere = tmp_path / "out" / "elsewhere.jsonl"
    elsewhere.parent.mkdir()
    assert submit(path, url, "--results", str(elsewhere)).exit_code == 0
    shown = runner.invoke(app, ["show", str(path), "a", "--json"])
    assert shown.exit_code == 0, shown.stderr
    result = json.loads(shown.stdout)["result"]
    assert result is not None
    assert (result["id"], result["status"]) == ("a", "done")
    text = runner.invoke(app, ["show", str(path), "a"])
    assert "(no line in the results file)" not in text.stdout
