"""`status` and `plan`: their numbers against hand-computed cases."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.clock import MachineClock
from batchrun.core.events import Status
from batchrun.core.identity import client_fingerprint
from batchrun.core.limits import Pace, parse_rule
from batchrun.jobs.job import scan
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.slots import Grant
from batchrun.store.paths import StatePaths
from batchrun.store.results import JobResult
from batchrun.store.state import RunStore

runner = CliRunner()
URL = "https://api.example.test"


def jobs_file(tmp_path, queries=0, invites=0):
    rows = [f"q{i},run-query,t," for i in range(queries)]
    rows += [f"i{i},invite,t," for i in range(invites)]
    path = tmp_path / "jobs.csv"
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def test_plan_of_a_fresh_file_comes_from_the_rules(tmp_path):
    """40 invites at 15/5m take 10 m (15, 15, 10); 2,000 queries at b take 3 h 33 m."""
    result = runner.invoke(app, ["plan", str(jobs_file(tmp_path, 2000, 40))])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("40 invite jobs at 15/5m: 10 m 0 s")
    # 500 per hour: four hours' batches, the last of 500 taking 33 m 20 s at 15/1m.
    assert lines[1].startswith("2,000 run-query jobs at 15/1m+500/1h: 3 h 33 m")
    assert lines[2] == "all: 3 h 33 m"


def test_plan_json_gives_each_key_and_the_longest(tmp_path):
    """plan --json: each endpoint's jobs, rule and seconds, and the run's ETA."""
    path = jobs_file(tmp_path, 2000, 40)
    result = runner.invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["file"] == str(path)
    by_key = {k["key"]: k for k in report["keys"]}
    assert (by_key["invite"]["jobs_left"], by_key["invite"]["rule"]) == (40, "15/5m")
    assert by_key["invite"]["eta_seconds"] == 600.0
    assert report["eta_seconds"] == by_key["run-query"]["eta_seconds"] > 3 * 3600


def test_plan_spread_spaces_by_the_binding_interval(tmp_path):
    """With --pace spread, 40 invites at 15/5m are 20 s + 1 % apart:
    39 x 20.2 s = 13 m 8 s."""
    result = runner.invoke(
        app, ["plan", str(jobs_file(tmp_path, 0, 40)), "--pace", "spread"]
    )
    assert result.stdout.startswith("40 invite jobs at 15/5m: 13 m 8 s")


def test_plan_counts_the_ledger_in_use_now(tmp_path):
    """15 queries sent by another run a moment ago hold 15/1m: the next 15 wait 1 m."""
    paths = StatePaths(tmp_path / "state").made()
    client = client_fingerprint(URL, "tok")
    ledger = SqliteLedger(paths.ledger, client=client, hold=30, now=MachineClock().now)
    rule = parse_rule("15/1m+500/1h")
    for _ in range(15):
        grant = ledger.reserve("run-query", rule, Pace.EXACT, MachineClock().now())
        assert isinstance(grant, Grant)
        ledger.release(grant.ticket, MachineClock().now())
    ledger.close()
    result = runner.invoke(
        app,
        [
            "plan",
            str(jobs_file(tmp_path, 15)),
            "--base-url",
            URL,
            "--token",
            "tok",
            "--state-dir",
            str(paths.root),
            "--json",
        ],
    )
    (key,) = json.loads(result.stdout)["keys"]
    # A minute from the sends, less the moments the test took since.
    assert 55.0 < key["eta_seconds"] <= 60.0
    assert key["in_use"] == {"15/1m": 15, "500/1h": 15}


def test_plan_skips_jobs_already_done(tmp_path):
    """Done jobs of an earlier run are not planned again."""
    path = jobs_file(tmp_path, 20)
    paths = StatePaths(tmp_path / "state").made()
    client = client_fingerprint(URL, None)
    with RunStore(paths.run_store(path, client)) as store:
        store.sync(scan(path), path=str(path), restart=False)
        for i in range(5):
            store.finished(JobResult(f"q{i}", "run-query", Status.DONE, 1, 200))
    result = runner.invoke(
        app, ["plan", str(path), "--base-url", URL, "--state-dir", str(paths.root)]
    )
    # 15 left at 15/1m all leave at once.
    assert result.stdout.startswith("15 run-query jobs at 15/1m+500/1h: 0 ms")


def test_status_reports_states_failures_and_eta(tmp_path):
    """status --json: counts per endpoint and state, failures, and the ETA left."""
    path = jobs_file(tmp_path, 20, 2)
    paths = StatePaths(tmp_path / "state").made()
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", "run-query=2/1m,invite=15/5m")
        store.set_meta("pace", "exact")
        for i in range(3):
            store.finished(JobResult(f"q{i}", "run-query", Status.DONE, 1, 200))
        store.finished(
            JobResult("i0", "invite", Status.FAILED, 1, 404, error="HTTP 404")
        )
    result = runner.invoke(app, ["status", str(path), "--json"])
    report = json.loads(result.stdout)
    assert report["states"] == {
        "invite": {"failed": 1, "pending": 1},
        "run-query": {"done": 3, "pending": 17},
    }
    assert report["failures"] == [
        {"id": "i0", "type": "invite", "state": "failed", "error": "HTTP 404"}
    ]
    by_key = {k["key"]: k for k in report["keys"]}
    # 17 left at 2/1m: pairs at 0, 1, ..., 8 minutes.
    assert by_key["run-query"]["eta_seconds"] == 480.0
    assert by_key["invite"]["jobs_left"] == 1


@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_status_of_a_file_never_run_exits_2(tmp_path, as_json):
    """A file with no run: exit 2, a message naming the file and how to start one,
    nothing on stdout for a script to misread."""
    path = jobs_file(tmp_path, 1)
    result = runner.invoke(app, ["status", str(path), *as_json])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert f"{path}: no run yet" in result.stderr
    assert f"`batchrun submit {path}` starts one" in result.stderr


def test_status_of_a_missing_file_exits_2(tmp_path):
    """A file that does not exist (and never ran): exit 2, "no such file"."""
    missing = tmp_path / "nope.csv"
    result = runner.invoke(app, ["status", str(missing)])
    assert result.exit_code == 2
    assert f"{missing}: no such file" in result.stderr


def test_status_text_lists_states_and_failures(tmp_path):
    """status without --json prints a line per endpoint and per failure reason."""
    path = jobs_file(tmp_path, 2)
    paths = StatePaths(tmp_path / "state").made()
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", "run-query=2/1m")
        store.finished(
            JobResult("q0", "run-query", Status.FAILED, 3, 503, error="HTTP 503")
        )
    result = runner.invoke(app, ["status", str(path)])
    assert "run-query: 1 failed, 1 pending" in result.stdout
    assert "  1 failed: HTTP 503 (q0)" in result.stdout
    assert "1 run-query jobs at 2/1m: 0 ms" in result.stdout


def test_status_says_which_jobs_left_of_a_budget_are_requests(tmp_path):
    """status: the global budget's jobs left are requests; run-query's, some."""
    path = tmp_path / "jobs.csv"
    path.write_text(
        "id,type,team_id,payload,method,path\n"
        "g0,request,,,GET,/users/me/x\n"
        "g1,request,,,DELETE,/users/me/y\n"
        "r0,request,t,,POST,/teams/t/data/run-query\n"
        "q0,run-query,t,,,\n"
        "q1,run-query,t,,,\n"
    )
    paths = StatePaths(tmp_path / "state").made()
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", "run-query=2/1m,global=120/1m")
        store.finished(JobResult("g1", "request", Status.DONE, 1, 200))
    result = runner.invoke(app, ["status", str(path)])
    assert "1 global jobs (requests) at 120/1m" in result.stdout
    assert "3 run-query jobs (1 of them requests) at 2/1m" in result.stdout
    report = json.loads(runner.invoke(app, ["status", str(path), "--json"]).stdout)
    by_key = {k["key"]: k for k in report["keys"]}
    assert (
        by_key["global"]["requests_left"],
        by_key["run-query"]["requests_left"],
    ) == (
        1,
        1,
    )


# What was learned of a client's limits: plan, status and `limits`.

LEARNED = {
    "kind": "sliding",
    "windows": [[5, 60.0], [500, 3600.0]],
    "burst": None,
    "origin": 0.0,
    "counts_refused": False,
    "because": "refused",
    "refused": 2,
    "rule": None,
    "given": [[15, 60.0], [500, 3600.0]],
    "began": time.time(),
    "expires": time.time() + 3600.0,
    "life": 3600.0,
}


def learned_ledger(paths, token="tok", text=None):
    """A ledger where an earlier run of the client learned run-query is 5/1m."""
    ledger = SqliteLedger(
        paths.ledger,
        client=client_fingerprint(URL, token),
        hold=30,
        now=MachineClock().now,
    )
    ledger.remember("run-query", text or json.dumps(LEARNED))
    ledger.close()


def cli(tmp_path, *args):
    state = ["--state-dir", str(tmp_path / "state"), "--base-url", URL]
    return runner.invoke(app, [*args, *state, "--token", "tok"])


def test_plan_paces_by_a_learned_rule_and_says_so(tmp_path):
    """15 queries at a learned 5/1m take 2 m, not the 0 ms of 15/1m."""
    learned_ledger(StatePaths(tmp_path / "state").made())
    result = cli(tmp_path, "plan", str(jobs_file(tmp_path, 15)))
    assert result.stdout.startswith(
        "15 run-query jobs at 5/1m+500/1h (learned): 2 m 0 s"
    ), result.stdout


def test_plan_with_a_limit_given_ignores_what_was_learned(tmp_path):
    learned_ledger(StatePaths(tmp_path / "state").made())
    path = str(jobs_file(tmp_path, 15))
    result = cli(tmp_path, "plan", path, "--limit", "run-query=15/1m")
    assert result.stdout.startswith("15 run-query jobs at 15/1m: 0 ms"), result.stdout


def test_status_shows_the_learned_rule_of_the_rule_the_run_was_given(tmp_path):
    path = jobs_file(tmp_path, 15)
    paths = StatePaths(tmp_path / "state").made()
    learned_ledger(paths)
    with RunStore(paths.run_store(path, client_fingerprint(URL, "tok"))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", '{"run-query": [[15, 60.0], [500, 3600.0]]}')
    (key,) = json.loads(cli(tmp_path, "status", str(path), "--json").stdout)["keys"]
    assert key["rule"] == "5/1m+500/1h"
    assert key["learned"].endswith(": 2 requests refused")
    with RunStore(paths.run_store(path, client_fingerprint(URL, "tok"))) as store:
        store.set_meta("rules", '{"run-query": [[15, 60.0]]}')
    (key,) = json.loads(cli(tmp_path, "status", str(path), "--json").stdout)["keys"]
    assert (key["rule"], key["learned"]) == ("15/1m", None)


def test_limits_shows_what_was_learned_and_forgets_it(tmp_path):
    learned_ledger(StatePaths(tmp_path / "state").made())
    shown = cli(tmp_path, "limits")
    assert shown.exit_code == 0, shown.stderr
    assert "run-query: 5/1m+500/1h (given 15/1m+500/1h)" in shown.stdout
    assert ": 2 requests refused" in shown.stdout
    assert "invite: 15/5m" in shown.stdout
    # Another client (another token) learned nothing.
    other = runner.invoke(
        app, ["limits", "--state-dir", str(tmp_path / "state"), "--base-url", URL]
    )
    assert "run-query: 15/1m+500/1h\n" in other.stdout
    forgot = cli(tmp_path, "limits", "--forget", "run-query")
    assert "Forgot what was learned of run-query's limit." in forgot.stdout
    after = json.loads(cli(tmp_path, "limits", "--json").stdout)
    assert after["run-query"] == {
        "rule": "15/1m+500/1h",
        "burst": None,
        "given": "15/1m+500/1h",
        "spread": False,
        "learned": None,
        "until": None,
    }


def test_limits_says_until_when_a_lesson_is_kept(tmp_path):
    """A lesson lives for a time: `limits` says until when, then runs try the
    given rule again; an expired one is not shown as in force."""
    paths = StatePaths(tmp_path / "state").made()
    learned_ledger(paths)
    shown = cli(tmp_path, "limits").stdout
    assert "  kept until " in shown
    until = json.loads(cli(tmp_path, "limits", "--json").stdout)["run-query"]["until"]
    assert until == pytest.approx(LEARNED["expires"])
    expired = {**LEARNED, "expires": time.time() - 1.0}
    learned_ledger(paths, text=json.dumps(expired))
    after = json.loads(cli(tmp_path, "limits", "--json").stdout)["run-query"]
    assert (after["rule"], after["learned"]) == ("15/1m+500/1h", None)


def test_limits_needs_a_client_and_a_known_key(tmp_path):
    no_client = runner.invoke(app, ["limits", "--state-dir", str(tmp_path)])
    assert no_client.exit_code == 2
    assert "limits are learned per client" in no_client.stderr
    bad_key = cli(tmp_path, "limits", "--forget", "run-queries")
    assert bad_key.exit_code == 2
    assert "--forget takes a key" in bad_key.stderr


def test_a_damaged_learned_text_is_ignored(tmp_path):
    learned_ledger(StatePaths(tmp_path / "state").made(), text="{not json")
    shown = cli(tmp_path, "limits")
    assert "run-query: 15/1m+500/1h\n" in shown.stdout


def test_auto_plans_by_b_until_the_server_settled_it(tmp_path):
    """--profile auto plans 30 queries by B (15/1m: 1 m) while nothing is known,
    and by what was learned once something is."""
    path = str(jobs_file(tmp_path, 30))
    before = cli(tmp_path, "plan", path, "--profile", "auto")
    assert before.stdout.startswith("30 run-query jobs at 15/1m+500/1h: 1 m 0 s")
    shown = cli(tmp_path, "limits", "--profile", "auto")
    assert "until the server shows 30/1m holds (--profile auto)" in shown.stdout
    a_holds = {
        **LEARNED,
        "windows": [[30, 60.0]],
        "given": [[30, 60.0]],
        "because": "safer",
        "rule": [[30, 60.0]],
    }
    learned_ledger(StatePaths(tmp_path / "state").made(), text=json.dumps(a_holds))
    after = cli(tmp_path, "plan", path, "--profile", "auto")
    assert after.stdout.startswith("30 run-query jobs at 30/1m (learned): 0 ms")


def ran(tmp_path):
    """A run of 2 queries, stored as `submit` leaves it: q0 failed, q1 pending; the
    results file holds q0 twice, the later line the one that counts."""
    path = jobs_file(tmp_path, 2)
    paths = StatePaths(tmp_path / "state").made()
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.finished(
            JobResult("q0", "run-query", Status.FAILED, 3, 503, error="HTTP 503")
        )
    lines = [
        {"id": "q0", "status": "failed", "response": "old", "finished_at": 1.0},
        {"id": "q1", "status": "done", "response": {"other": 1}},
        {"id": "q0", "status": "failed", "response": {"e": "busy"}, "finished_at": 2},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n{torn"
    path.with_name("jobs.results.jsonl").write_text(text)
    return path


def test_show_json_gives_the_store_and_the_last_results_line(tmp_path):
    """show --json: the job's state, attempts and error from the run store, and its
    last line in the results file (a torn last line skipped)."""
    path = ran(tmp_path)
    result = runner.invoke(app, ["show", str(path), "q0", "--json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert {k: report[k] for k in ("id", "line", "state", "attempts", "error")} == {
        "id": "q0",
        "line": 2,
        "state": "failed",
        "attempts": 3,
        "error": "HTTP 503",
    }
    assert report["result"]["response"] == {"e": "busy"}


def test_show_text_of_a_job_with_no_result_yet(tmp_path):
    """show: a field a line; a job with no results line says so."""
    path = ran(tmp_path)
    path.with_name("jobs.results.jsonl").unlink()
    result = runner.invoke(app, ["show", str(path), "q1"])
    assert result.exit_code == 0, result.stderr
    assert "state: pending" in result.stdout.splitlines()
    assert "response: (no line in the results file)" in result.stdout


def test_show_text_gives_the_response_and_when(tmp_path):
    """show: the response as JSON and when the job ended."""
    result = runner.invoke(app, ["show", str(ran(tmp_path)), "q0"])
    assert 'response: {"e": "busy"}' in result.stdout
    assert "finished: 19" in result.stdout


@pytest.mark.parametrize(
    ("job_id", "message"),
    [
        pytest.param("q9", "its run has no job 'q9'", id="no-such-job"),
        pytest.param(None, "no run yet", id="never-run"),
    ],
)
def test_show_of_a_job_not_there_exits_2(tmp_path, job_id, message):
    """show of an id the run does not hold, or of a file never run: exit 2."""
    path = ran(tmp_path) if job_id else jobs_file(tmp_path, 1)
    result = runner.invoke(app, ["show", str(path), job_id or "q0"])
    assert result.exit_code == 2
    assert message in result.stderr


def test_status_tells_unknown_from_failed_with_the_way_out(tmp_path):
    """An unknown invite is listed as unknown, with its reason and --retry-unknown."""
    path = jobs_file(tmp_path, 1, 2)
    paths = StatePaths(tmp_path / "state").made()
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", "run-query=2/1m,invite=15/5m")
        store.finished(
            JobResult("i0", "invite", Status.UNKNOWN, 1, None, error="timeout")
        )
        store.finished(JobResult("i1", "invite", Status.FAILED, 1, 404, error="nope"))
    result = runner.invoke(app, ["status", str(path)])
    assert "invite: 1 failed, 1 unknown" in result.stdout
    assert "  1 unknown: timeout (i0)" in result.stdout
    assert "  1 failed: nope (i1)" in result.stdout
    assert "--retry-unknown" in result.stdout
    report = json.loads(runner.invoke(app, ["status", str(path), "--json"]).stdout)
    assert [f["state"] for f in report["failures"]] == ["unknown", "failed"]


def failed_run(tmp_path, failed):
    """A run of `failed` + 1 queries, `failed` of them failed."""
    path = jobs_file(tmp_path, failed + 1)
    paths = StatePaths(tmp_path / "state").made()
    store_path = paths.run_store(path, client_fingerprint(URL, None))
    with RunStore(store_path) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", "run-query=2/1m")
        for i in range(failed):
            store.finished(
                JobResult(f"q{i}", "run-query", Status.FAILED, 1, 404, error="gone")
            )
    return path, store_path


def test_status_shows_20_failures_then_says_how_many_more(tmp_path):
    """status gives a line per reason with its first 5 ids (--show N: at most N,
    --show all: every one); --json lists the first 20 failures (--show N: N,
    all: every one), with the total."""
    path, _ = failed_run(tmp_path, 25)
    text = runner.invoke(app, ["status", str(path)]).stdout
    assert "  25 failed: gone (q0, q1, q2, q3, q4 and 20 more)" in text.splitlines()
    text = runner.invoke(app, ["status", str(path), "--show", "all"]).stdout
    every = ", ".join(f"q{i}" for i in range(25))
    assert f"  25 failed: gone ({every})" in text.splitlines()
    text = runner.invoke(app, ["status", str(path), "--show", "2"]).stdout
    assert "  25 failed: gone (q0, q1 and 23 more)" in text.splitlines()
    result = runner.invoke(app, ["status", str(path), "--json", "--show", "3"])
    report = json.loads(result.stdout)
    assert [f["id"] for f in report["failures"]] == ["q0", "q1", "q2"]
    assert report["failures_total"] == 25


def test_status_show_takes_a_number_or_all(tmp_path):
    """--show anything else exits 2 with what it takes."""
    path, _ = failed_run(tmp_path, 1)
    result = runner.invoke(app, ["status", str(path), "--show", "some"])
    assert result.exit_code == 2
    assert "--show takes a number or 'all'" in result.stderr


def test_status_json_says_whether_a_run_is_active(tmp_path):
    """status --json: `active` while a run holds the file's lock, not after."""
    from batchrun.store.runlock import RunLock

    path, store_path = failed_run(tmp_path, 1)

    def active():
        report = json.loads(runner.invoke(app, ["status", str(path), "--json"]).stdout)
        return report["active"]

    assert active() is False
    with RunLock(store_path.parent, path):
        assert active() is True
        text = runner.invoke(app, ["status", str(path)]).stdout
        assert "a run is working on it now" in text
    assert active() is False


def test_the_lock_probe_off_linux(tmp_path, monkeypatch):
    """Without /proc/locks, a probe tells a held lock from a free one."""
    from batchrun.store import runlock

    monkeypatch.setattr(runlock, "_PROC_LOCKS", tmp_path / "no-proc-locks")
    assert runlock.is_held(tmp_path) is False
    with runlock.RunLock(tmp_path, tmp_path / "jobs.csv"):
        assert runlock.is_held(tmp_path) is True
    assert runlock.is_held(tmp_path) is False


def test_status_json_gives_results_and_times_of_a_run(tmp_path):
    """After a submit, status --json names the results file, when the run started
    and when it last wrote (Unix times), and the text says them too."""
    path = jobs_file(tmp_path, 2)
    before = time.time()
    result = runner.invoke(
        app,
        [
            "submit",
            str(path),
            "--base-url",
            "http://127.0.0.1:9",
            "--max-attempts",
            "1",
            "--timeout",
            "0.5",
        ],
    )
    assert result.exit_code in (1, 69), result.output
    report = json.loads(
        runner.invoke(
            app, ["status", str(path), "--base-url", "http://127.0.0.1:9", "--json"]
        ).stdout
    )
    assert report["results"] == str(tmp_path / "jobs.results.jsonl")
    assert before - 1 <= report["started_at"] <= report["last_activity"] <= time.time()
    assert report["active"] is False
    text = runner.invoke(
        app, ["status", str(path), "--base-url", "http://127.0.0.1:9"]
    ).stdout
    assert f"results: {tmp_path / 'jobs.results.jsonl'}" in text
    assert "latest run started 20" in text


def test_status_groups_failures_by_reason(tmp_path):
    """20 jobs refused with one long message and 2 with another: two lines, each
    with its count and first ids, the reason met first in the file first, not
    the message 20 times; --json gives the same as `reasons`."""
    path = jobs_file(tmp_path, 23)
    long = "HTTP 401 Unauthorized;" + " the token is missing, wrong or expired" * 3
    paths = StatePaths(tmp_path / "state").made()
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", "run-query=2/1m")
        for i in range(22):
            error = "HTTP 404 Not Found" if i in (3, 9) else long
            failed = Status.FAILED
            store.finished(JobResult(f"q{i}", "run-query", failed, 1, 0, error=error))
    text = runner.invoke(app, ["status", str(path)]).stdout
    assert text.count(long) == 1
    lines = [line for line in text.splitlines() if " failed: " in line]
    assert lines == [
        f"  20 failed: {long} (q0, q1, q2, q4, q5 and 15 more)",
        "  2 failed: HTTP 404 Not Found (q3, q9)",
    ]
    report = json.loads(runner.invoke(app, ["status", str(path), "--json"]).stdout)
    assert [(r["count"], r["ids"][:2]) for r in report["reasons"]] == [
        (20, ["q0", "q1"]),
        (2, ["q3", "q9"]),
    ]


def test_plan_takes_a_time_scale_for_a_scaled_demo(tmp_path):
    """During a demo at --time-scale 30 against a sandbox on loopback, 15 queries
    sent a moment ago hold 15/2s: `plan --time-scale 30` says so in scaled terms
    (in use now: 15 of 15/2s; the next 15 wait about 2 s), not 15 of 15/1m."""
    loopback = "http://127.0.0.1:8765"
    paths = StatePaths(tmp_path / "state").made()
    client = client_fingerprint(loopback, None)
    ledger = SqliteLedger(paths.ledger, client=client, hold=30, now=MachineClock().now)
    rule = parse_rule("15/1m+500/1h").scaled(30)
    for _ in range(15):
        grant = ledger.reserve("run-query", rule, Pace.EXACT, MachineClock().now())
        assert isinstance(grant, Grant)
        ledger.release(grant.ticket, MachineClock().now())
    ledger.close()
    args = ["plan", str(jobs_file(tmp_path, 15)), "--base-url", loopback]
    args += ["--state-dir", str(paths.root), "--time-scale", "30"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert "15 run-query jobs at 15/2s+500/2m: " in result.stdout
    assert "(in use now: 15 of 15/2s, 15 of 500/2m)" in result.stdout
    (key,) = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["keys"]
    assert 0.0 < key["eta_seconds"] <= 2.0


def test_plan_time_scale_against_a_real_api_is_refused(tmp_path):
    """A scaled plan of a real API would be wrong by that factor: exit 2."""
    path = jobs_file(tmp_path, 1)
    result = runner.invoke(
        app, ["plan", str(path), "--base-url", URL, "--time-scale", "30"]
    )
    assert result.exit_code == 2
    assert "--time-scale 30 only works with --sandbox" in result.stderr


def test_plan_says_what_profile_auto_assumes(tmp_path):
    """--profile auto plans run-query by statement b, and says so and why."""
    path = jobs_file(tmp_path, 30)
    result = runner.invoke(app, ["plan", str(path), "--profile", "auto"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("30 run-query jobs at 15/1m+500/1h: 1 m")
    assert (
        "--profile auto plans run-query at 15/1m+500/1h (statement b) until the "
        "service shows it enforces 30/1m (statement a)"
    ) in result.stdout
    plain = runner.invoke(app, ["plan", str(path)])
    assert "--profile auto" not in plain.stdout


def test_plan_with_only_failed_jobs_left_names_retry_failed(tmp_path):
    """Every job ended, 3 failed and 1 unknown: plan names the flags that send
    them, rather than "Nothing to send." alone."""
    path = jobs_file(tmp_path, 5, 1)
    paths = StatePaths(tmp_path / "state").made()
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.finished(JobResult("q0", "run-query", Status.DONE, 1, 200))
        store.finished(JobResult("q1", "run-query", Status.DONE, 1, 200))
        for i in range(2, 5):
            store.finished(JobResult(f"q{i}", "run-query", Status.FAILED, 1, 404))
        store.finished(JobResult("i0", "invite", Status.UNKNOWN, 1, None))
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        "Nothing to send: 3 failed (--retry-failed sends them again); "
        "1 unknown (--retry-unknown sends them again).\n"
    )
