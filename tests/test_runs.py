"""Running the same command again resumes: a renewed token, a moved file and an
earlier batchrun's store all find the run; a new round is asked for by name."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.identity import client_fingerprint
from batchrun.store.paths import StatePaths
from tests.test_cli import jobs_file

runner = CliRunner()


def submit(path: Path, url: str, *more: str, token: str = "token-one"):
    args = ["submit", str(path), "--base-url", url, "--token", token, *more]
    return runner.invoke(app, args)


def test_a_renewed_token_resumes_the_run(tmp_path, api):
    """Done with one token, run again with a new one: nothing is sent again."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    again = submit(path, url, token="token-two")
    assert again.exit_code == 0, again.stderr
    assert len(sandbox.arrivals) == 3
    assert "Nothing to send" in again.stderr
    status = runner.invoke(app, ["status", str(path), "--base-url", url])
    assert status.exit_code == 0, status.stderr


def test_a_moved_file_resumes_its_run(tmp_path, api):
    """The jobs file renamed into another folder, a row added: its run follows
    it, and only the new row is sent."""
    url, sandbox = api
    path = jobs_file(tmp_path, rows=("a,run-query,t1,", "b,invite,t1,"))
    assert submit(path, url).exit_code == 0
    moved = tmp_path / "elsewhere" / "renamed.csv"
    moved.parent.mkdir()
    path.rename(moved)
    with moved.open("a") as file:
        file.write("c,avatar,,\n")
    again = submit(moved, url)
    assert again.exit_code == 0, again.stderr
    assert "Resuming the run of" in again.stderr
    assert len(sandbox.arrivals) == 3
    [store] = StatePaths(tmp_path / "state").run_stores()
    assert store.parent == StatePaths(tmp_path / "state").run_folder(moved)


def test_a_resumed_runs_summary_counts_the_file(tmp_path, api):
    """After a resume the summary counts the whole file, this run's beside it:
    3 of 3 done, 1 in this run; a first run says its own counts alone."""
    url, _ = api
    path = jobs_file(tmp_path, rows=("a,run-query,t1,", "b,invite,t1,"))
    first = submit(path, url)
    assert first.exit_code == 0, first.stderr
    assert "2 done, 0 failed, 0 left in" in first.stdout
    with path.open("a") as file:
        file.write("c,avatar,,\n")
    again = submit(path, url)
    assert again.exit_code == 0, again.stderr
    assert "3 of 3 done (1 in this run), 0 failed, 0 left in" in again.stdout


def test_a_copy_is_a_run_of_its_own(tmp_path, api):
    """The file copied (the original still there): the copy is another file, and
    its run sends its jobs; the original's run is left as it was."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    copy = tmp_path / "copy.csv"
    shutil.copy(path, copy)
    assert submit(copy, url).exit_code == 0
    assert len(sandbox.arrivals) == 6
    assert len(StatePaths(tmp_path / "state").run_stores()) == 2


def test_night_two_says_everything_was_done_and_how_to_start_a_round(tmp_path, api):
    """A rerun of a finished run sends nothing and says why, and how to send again."""
    url, _ = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    again = submit(path, url)
    assert again.exit_code == 0
    assert "every job of" in again.stderr
    assert "3 done" in again.stderr
    assert "--run-id" in again.stderr


def test_a_new_run_id_is_a_new_round(tmp_path, api):
    """--run-id n1 twice sends once; n2 sends every job again, warning about the
    invite, with Idempotency-Keys of its own."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url, "--run-id", "n1").exit_code == 0
    same = submit(path, url, "--run-id", "n1")
    assert same.exit_code == 0
    assert "(round n1)" in same.stderr
    assert len(sandbox.arrivals) == 3
    new = submit(path, url, "--run-id", "n2")
    assert new.exit_code == 0, new.stderr
    assert "New round n2" in new.stderr
    assert "1 invite(s) done or unknown" in new.stderr
    assert len(sandbox.arrivals) == 6
    keys = [a.idempotency_key for a in sandbox.arrivals]
    assert not set(keys[:3]) & set(keys[3:])


def test_a_run_id_takes_todays_date(tmp_path, api):
    """%-codes in --run-id are filled from today's date: one round a day."""
    url, _ = api
    path = jobs_file(tmp_path)
    assert submit(path, url, "--run-id", "night-%Y").exit_code == 0
    again = submit(path, url, "--run-id", "night-%Y")
    assert "(round night-2" in again.stderr


def test_restart_warns_before_sending_done_invites_again(tmp_path, api):
    """--restart says how many done invites go out again, before sending them."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    again = submit(path, url, "--restart")
    assert again.exit_code == 0
    # A warning, set apart from the log's stamped lines.
    warned = [ln for ln in again.stderr.splitlines() if "invite(s) done" in ln]
    assert warned[0].startswith("warning: 1 invite(s) done or unknown")
    # The warning comes before the run; the summary ends with the results file.
    assert "Results:" in again.stdout.splitlines()[-1]
    assert len(sandbox.arrivals) == 6


def legacy(tmp_path: Path, url: str, token: str) -> None:
    """Make the run store look like an earlier batchrun's: named by base URL and
    token, without the API it ran against."""
    [store] = StatePaths(tmp_path / "state").run_stores()
    db = sqlite3.connect(store)
    with db:
        db.execute("DELETE FROM meta WHERE name IN ('base_url', 'jobs_file')")
    db.close()
    name = store.with_name(client_fingerprint(url, token))
    for suffix in (".db", ".generation"):
        store.with_suffix(suffix).rename(name.with_suffix(suffix))


def test_an_earlier_batchruns_store_of_the_same_token_is_taken(tmp_path, api):
    """A store named by base URL and token (an earlier batchrun) is resumed."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    legacy(tmp_path, url, "token-one")
    again = submit(path, url)
    assert again.exit_code == 0, again.stderr
    assert len(sandbox.arrivals) == 3


def test_an_earlier_batchruns_store_of_another_token_is_refused(tmp_path, api):
    """Of another token, it may be of another API: exit 2, naming the mv to resume."""
    url, sandbox = api
    path = jobs_file(tmp_path)
    assert submit(path, url).exit_code == 0
    legacy(tmp_path, url, "token-one")
    refused = submit(path, url, token="token-two")
    assert refused.exit_code == 2
    assert "did not record its API" in refused.stderr
    assert "mv " in refused.stderr
    assert len(sandbox.arrivals) == 3


def test_a_sandbox_run_stopped_early_resumes(tmp_path):
    """--sandbox keeps its run apart: stopped by its deadline, it says to run the
    same command, and that resumes (the jobs done are not sent again)."""
    path = jobs_file(tmp_path, rows=[f"q{i},run-query,t1," for i in range(40)])
    args = ["--sandbox", "--limit", "run-query=2/1m", "--deadline", "0.5s"]
    result = runner.invoke(app, ["submit", str(path), *args])
    assert result.exit_code == 75
    assert "Stopped early with 38 job(s) left: run the same command" in result.stderr
    again = runner.invoke(app, ["submit", str(path), *args])
    assert "Resuming: 2 done earlier, 38 to send" in again.stderr


CSV = "id,type,team_id,payload\na,run-query,t1,\nb,invite,t1,\n"


def test_jobs_from_stdin_need_results_and_resume(tmp_path, api):
    """`submit -` reads stdin; it needs --results (never a file named `-` or under
    /dev); the same pipe run again resumes, sending nothing."""
    url, sandbox = api
    args = ["submit", "-", "--base-url", url, "--token", "token-one"]
    alone = runner.invoke(app, args, input=CSV)
    assert alone.exit_code == 2
    assert "--results" in alone.stderr
    device = runner.invoke(app, [*args, "--results", "/dev/stdout"], input=CSV)
    assert device.exit_code == 2
    assert "not a device" in device.stderr
    results = tmp_path / "out.jsonl"
    for _ in range(2):
        ran = runner.invoke(app, [*args, "--results", str(results)], input=CSV)
        assert ran.exit_code == 0, ran.stderr
    assert len(sandbox.arrivals) == 2
    assert len(results.read_text().splitlines()) == 2
    assert not (tmp_path / "-.results.jsonl").exists()


def test_json_lines_from_stdin(tmp_path):
    """A pipe whose first character is `{` is JSON Lines."""
    lines = '{"id": "a", "type": "avatar", "payload": {}}\n'
    results = tmp_path / "out.jsonl"
    args = ["submit", "-", "--sandbox", "--results", str(results)]
    ran = runner.invoke(app, args, input=lines)
    assert ran.exit_code == 0, ran.stderr
    [line] = results.read_text().splitlines()
    assert json.loads(line)["status"] == "done"
