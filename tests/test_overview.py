"""`status` and `plan`: their numbers against hand-computed cases."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.cli.learned import KeyLimit
from batchrun.cli.reports import limits_lines
from batchrun.core.clock import MachineClock, wall_time
from batchrun.core.events import Status
from batchrun.core.limits import LimitKey, Pace, Rule, parse_rule
from batchrun.jobs.job import scan
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.room import ROOM_SUFFIX, kept, known
from batchrun.pacing.slots import Grant
from batchrun.store.paths import StatePaths, client_fingerprint
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
    paths = StatePaths.resolve(tmp_path / "state")
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
    paths = StatePaths.resolve(tmp_path / "state")
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
    paths = StatePaths.resolve(tmp_path / "state")
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
    """status without --json prints a line per endpoint and each failure."""
    path = jobs_file(tmp_path, 2)
    paths = StatePaths.resolve(tmp_path / "state")
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", "run-query=2/1m")
        store.finished(
            JobResult("q0", "run-query", Status.FAILED, 3, 503, error="HTTP 503")
        )
    result = runner.invoke(app, ["status", str(path)])
    assert "run-query: 1 failed, 1 pending" in result.stdout
    assert "failed: q0 (run-query): HTTP 503" in result.stdout
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
    paths = StatePaths.resolve(tmp_path / "state")
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
    "windows": [[5, 60.0], [500, 3600.0]],
    "spread": False,
    "why": "2 request(s) refused after 5 accepted within 1m",
    "given": [[15, 60.0], [500, 3600.0]],
    "at": time.time(),
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
    learned_ledger(StatePaths.resolve(tmp_path / "state"))
    result = cli(tmp_path, "plan", str(jobs_file(tmp_path, 15)))
    assert result.stdout.startswith(
        "15 run-query jobs at 5/1m+500/1h (learned): 2 m 0 s"
    ), result.stdout


def test_plan_with_a_limit_given_ignores_what_was_learned(tmp_path):
    learned_ledger(StatePaths.resolve(tmp_path / "state"))
    path = str(jobs_file(tmp_path, 15))
    result = cli(tmp_path, "plan", path, "--limit", "run-query=15/1m")
    assert result.stdout.startswith("15 run-query jobs at 15/1m: 0 ms"), result.stdout


def test_status_shows_the_learned_rule_of_the_rule_the_run_was_given(tmp_path):
    path = jobs_file(tmp_path, 15)
    paths = StatePaths.resolve(tmp_path / "state")
    learned_ledger(paths)
    with RunStore(paths.run_store(path, client_fingerprint(URL, "tok"))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", '{"run-query": [[15, 60.0], [500, 3600.0]]}')
    (key,) = json.loads(cli(tmp_path, "status", str(path), "--json").stdout)["keys"]
    assert key["rule"] == "5/1m+500/1h"
    assert key["learned"].endswith(LEARNED["why"])
    with RunStore(paths.run_store(path, client_fingerprint(URL, "tok"))) as store:
        store.set_meta("rules", '{"run-query": [[15, 60.0]]}')
    (key,) = json.loads(cli(tmp_path, "status", str(path), "--json").stdout)["keys"]
    assert (key["rule"], key["learned"]) == ("15/1m", None)


def test_limits_shows_what_was_learned_and_forgets_it(tmp_path):
    learned_ledger(StatePaths.resolve(tmp_path / "state"))
    shown = cli(tmp_path, "limits")
    assert shown.exit_code == 0, shown.stderr
    assert "run-query: 5/1m+500/1h (given 15/1m+500/1h)" in shown.stdout
    assert LEARNED["why"] in shown.stdout
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
        "confirmed": None,
        "retest": None,
        "refusals_counted": None,
        "refusals_seen_at": None,
    }


def test_forget_also_forgets_whether_the_server_counts_refusals(tmp_path):
    """What was seen of refusals (`room`) is learned too: `limits` shows it,
    and forgets it with the lesson; the next run tests it again."""
    paths = StatePaths.resolve(tmp_path / "state")
    learned_ledger(paths)
    client = client_fingerprint(URL, "tok")
    ledger = SqliteLedger(paths.ledger, client=client, hold=30, now=MachineClock().now)
    seen = wall_time()
    ledger.remember(f"run-query{ROOM_SUFFIX}", kept(False, seen))
    ledger.remember(f"invite{ROOM_SUFFIX}", kept(True, seen))
    assert known(ledger, "run-query", now=wall_time()) is False
    ledger.close()
    shown = cli(tmp_path, "limits").stdout.splitlines()
    refusals = [line for line in shown if line.startswith("  429s ")]
    assert refusals[0].startswith("  429s take no slot: the server was seen not to")
    assert refusals[1].startswith("  429s each take a slot: the server was seen to")
    as_json = json.loads(cli(tmp_path, "limits", "--json").stdout)
    assert as_json["run-query"]["refusals_counted"] is False
    assert as_json["invite"]["refusals_counted"] is True
    assert as_json["invite"]["refusals_seen_at"] == pytest.approx(seen)
    assert cli(tmp_path, "limits", "--forget", "run-query").exit_code == 0
    ledger = SqliteLedger(paths.ledger, client=client, hold=30, now=MachineClock().now)
    assert known(ledger, "run-query", now=wall_time()) is None
    ledger.close()
    # A key with nothing learned but what its server does with refusals.
    forgot = cli(tmp_path, "limits", "--forget", "invite")
    assert "Forgot what was learned of invite's limit." in forgot.stdout
    after = json.loads(cli(tmp_path, "limits", "--json").stdout)
    assert after["invite"]["refusals_counted"] is None
    assert "--forget KEY" not in cli(tmp_path, "limits").stdout


def test_a_stale_refusal_answer_is_neither_shown_nor_said_to_be_forgotten(tmp_path):
    """Seen 40 days ago (kept for 30): `limits` shows nothing of it, and
    --forget says there was nothing to forget, and clears it."""
    paths = StatePaths.resolve(tmp_path / "state")
    client = client_fingerprint(URL, "tok")
    ledger = SqliteLedger(paths.ledger, client=client, hold=30, now=MachineClock().now)
    ledger.remember(f"avatar{ROOM_SUFFIX}", kept(False, wall_time() - 40 * 86400))
    ledger.close()
    assert "429s" not in cli(tmp_path, "limits").stdout
    forgot = cli(tmp_path, "limits", "--forget", "avatar")
    assert "Nothing was learned of avatar: nothing to forget." in forgot.stdout
    ledger = SqliteLedger(paths.ledger, client=client, hold=30, now=MachineClock().now)
    assert ledger.recall(f"avatar{ROOM_SUFFIX}") == "{}"
    ledger.close()


@pytest.mark.parametrize("paced", ["bucket", "evenly"])
def test_429s_take_a_slot_where_a_bucket_or_even_spacing_paces(paced):
    """Refusals are left out only of windows paced exactly (`room.lifted`):
    under a bucket reading or even spacing, `limits` does not say they take
    no slot, though the server was seen not to count them."""
    given = parse_rule("30/1m")
    rule = Rule(given.windows, burst=10) if paced == "bucket" else given
    item = KeyLimit(
        LimitKey.RUN_QUERY,
        given,
        rule,
        paced == "evenly",
        "learned it",
        refusals=(False, wall_time()),
    )
    (shown,) = [line for line in limits_lines([item], [], []) if "429s" in line]
    assert shown.startswith("  429s each take a slot, paced as a bucket or evenly")


def test_limits_needs_a_client_and_a_known_key(tmp_path):
    no_client = runner.invoke(app, ["limits", "--state-dir", str(tmp_path)])
    assert no_client.exit_code == 2
    assert "limits are learned per client" in no_client.stderr
    bad_key = cli(tmp_path, "limits", "--forget", "run-queries")
    assert bad_key.exit_code == 2
    assert "--forget takes a key" in bad_key.stderr


def test_a_damaged_learned_text_is_ignored(tmp_path):
    learned_ledger(StatePaths.resolve(tmp_path / "state"), text="{not json")
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
        "why": "16 accepted within 1m",
    }
    learned_ledger(StatePaths.resolve(tmp_path / "state"), text=json.dumps(a_holds))
    after = cli(tmp_path, "plan", path, "--profile", "auto")
    assert after.stdout.startswith("30 run-query jobs at 30/1m (learned): 0 ms")


def ran(tmp_path):
    """A run of 2 queries, stored as `submit` leaves it: q0 failed, q1 pending; the
    results file holds q0 twice, the later line the one that counts."""
    path = jobs_file(tmp_path, 2)
    paths = StatePaths.resolve(tmp_path / "state")
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
    paths = StatePaths.resolve(tmp_path / "state")
    with RunStore(paths.run_store(path, client_fingerprint(URL, None))) as store:
        store.sync(scan(path), path=str(path), restart=False)
        store.set_meta("rules", "run-query=2/1m,invite=15/5m")
        store.finished(
            JobResult("i0", "invite", Status.UNKNOWN, 1, None, error="timeout")
        )
        store.finished(JobResult("i1", "invite", Status.FAILED, 1, 404, error="nope"))
    result = runner.invoke(app, ["status", str(path)])
    assert "invite: 1 failed, 1 unknown" in result.stdout
    assert "  unknown: i0 (invite): timeout" in result.stdout
    assert "  failed: i1 (invite): nope" in result.stdout
    assert "--retry-unknown" in result.stdout
    report = json.loads(runner.invoke(app, ["status", str(path), "--json"]).stdout)
    assert [f["state"] for f in report["failures"]] == ["unknown", "failed"]


def failed_run(tmp_path, failed):
    """A run of `failed` + 1 queries, `failed` of them failed."""
    path = jobs_file(tmp_path, failed + 1)
    paths = StatePaths.resolve(tmp_path / "state")
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
    """status lists the first 20 failures and counts the rest; --show N lists N,
    --show all every one, in the text and in --json (with the total)."""
    path, _ = failed_run(tmp_path, 25)
    text = runner.invoke(app, ["status", str(path)]).stdout
    assert "failed: q19 (run-query): gone" in text
    assert "q20" not in text
    assert "… and 5 more (--show all lists every one)" in text
    text = runner.invoke(app, ["status", str(path), "--show", "all"]).stdout
    assert "failed: q24 (run-query): gone" in text
    assert "more" not in text
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
    """Without /proc/locks, a shared lock probe tells a held lock from a free one."""
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
