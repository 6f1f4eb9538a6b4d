"""Choosing the client's ledger: `--ledger URL` / BATCHRUN_LEDGER_URL for submit,
status and plan, against a real redis-server; errors name the URL, never its
password; a Redis lost mid-run stops the run with exit 75."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.identity import client_fingerprint
from batchrun.core.limits import LimitKey, Pace, limit_table, parse_override, parse_rule
from batchrun.ledgers.redis_ledger import RedisLedger
from batchrun.ledgers.shared_ledger import open_shared_ledger
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.slots import Grant
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running
from batchrun.store.paths import StatePaths
from support.oracles import max_in_window
from tests.conftest import REDIS_PASSWORD, RedisServer, redis_process

runner = CliRunner()
FAST = ["--sandbox", "--time-scale", "1000"]
API = "https://api.example.test"


def query_jobs(tmp_path, count=3):
    path = tmp_path / "jobs.csv"
    rows = [f"q{i},run-query,t1," for i in range(count)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def test_no_url_is_the_sqlite_file_and_a_redis_url_is_redis(tmp_path, redis_url):
    """The default stays SQLite in the state folder; a redis:// URL opens Redis."""
    state = StatePaths(tmp_path).made()
    for url, kind in ((None, SqliteLedger), (redis_url, RedisLedger)):
        ledger = open_shared_ledger(url, state=state, client="c", hold=1, now=time.time)
        assert isinstance(ledger, kind)
        ledger.close()


def test_submit_records_its_sends_in_the_redis_of_the_environment(
    tmp_path, monkeypatch, redis_url, redis_server: RedisServer
):
    """BATCHRUN_LEDGER_URL sends the budget to Redis, under the client's
    fingerprint (not the token)."""
    monkeypatch.setenv("BATCHRUN_LEDGER_URL", redis_url)
    monkeypatch.setenv("BATCHRUN_TOKEN", "tok-SECRET")
    result = runner.invoke(app, ["submit", str(query_jobs(tmp_path)), *FAST])
    assert result.exit_code == 0, result.stderr
    client = client_fingerprint("http://sandbox.local", "tok-SECRET")
    keys = {k.decode() for k in redis_server.connect().keys("*")}
    assert f"batchrun:{{{client}}}:run-query:done" in keys
    assert not any("tok-SECRET" in key for key in keys)


def test_plan_shows_the_budget_other_machines_use(tmp_path, redis_url):
    """plan --ledger counts requests another host recorded in Redis."""
    other_host = RedisLedger(
        redis_url, client=client_fingerprint(API, None), hold=30.0, now=time.time
    )
    rule = parse_rule("15/1m+500/1h")
    for _ in range(2):
        grant = other_host.reserve("run-query", rule, Pace.EXACT, time.time())
        assert isinstance(grant, Grant)
    args = ["plan", str(query_jobs(tmp_path)), "--base-url", API]
    result = runner.invoke(app, [*args, "--ledger", redis_url])
    assert result.exit_code == 0, result.stderr
    assert "in use now: 2 of 15/1m, 2 of 500/1h" in result.stdout
    alone = runner.invoke(app, args)
    assert "in use now: 0 of 15/1m, 0 of 500/1h" in alone.stdout


def test_status_reads_the_budget_from_redis(tmp_path, redis_url):
    """status --ledger shows the budget in use that submit recorded in Redis."""
    jobs = query_jobs(tmp_path, 4)
    server = create_app(rules=limit_table(overrides=[parse_override("run-query=2/1m")]))
    with running(server) as url:
        common = ["--base-url", url, "--ledger", redis_url]
        limit = ["--limit", "run-query=2/1m", "--deadline", "1s"]
        sent = runner.invoke(app, ["submit", str(jobs), *common, *limit])
        assert sent.exit_code == 75, sent.stderr
        result = runner.invoke(app, ["status", str(jobs), *common])
    assert result.exit_code == 0, result.stderr
    assert "run-query: 2 done, 2 pending" in result.stdout
    assert "in use now: 2 of 2/1m" in result.stdout


@pytest.mark.parametrize("command", ["submit", "status", "plan"])
def test_ledger_option_is_offered(command):
    """submit, status and plan take --ledger (and name its environment variable)."""
    result = runner.invoke(app, [command, "--help"])
    assert "--ledger" in result.stdout
    assert "BATCHRUN_LEDGER_URL" in result.stdout


@pytest.mark.parametrize("command", ["submit", "plan"])
def test_a_wrong_password_exits_74_and_never_shows_it(
    tmp_path, redis_server: RedisServer, command
):
    """A ledger Redis refuses: exit 74, the URL named with *** for the password,
    nothing sent."""
    url = f"redis://:wrong-pw@127.0.0.1:{redis_server.port}/0"
    extra = FAST if command == "submit" else ["--base-url", API]
    jobs = str(query_jobs(tmp_path))
    result = runner.invoke(app, [command, jobs, *extra, "--ledger", url])
    assert result.exit_code == 74
    assert f"redis://:***@127.0.0.1:{redis_server.port}/0" in result.stderr
    assert "wrong-pw" not in result.stdout + result.stderr
    assert not (tmp_path / "jobs.results.jsonl").exists()


def test_a_ledger_url_of_another_kind_exits_2(tmp_path):
    """--ledger takes redis:// or rediss:// only."""
    args = ["submit", str(query_jobs(tmp_path)), *FAST, "--ledger", "http://h/0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "redis:// or rediss://" in result.stderr


def test_redis_lost_mid_run_stops_with_exit_75(tmp_path):
    """Redis goes away mid-run: no request starts after, those in flight end, the
    run exits 75; the password is never shown."""
    jobs = query_jobs(tmp_path, 12)
    with redis_process(tmp_path / "redis") as server:

        def shut_down_soon() -> None:
            time.sleep(1.2)
            assert server.process is not None
            server.process.kill()

        killer = threading.Thread(target=shut_down_soon)
        killer.start()
        args = ["--sandbox", "--limit", "run-query=4/1s", "--ledger", server.url]
        result = runner.invoke(app, ["submit", str(jobs), *args])
        killer.join()
    assert result.exit_code == 75, result.stderr
    assert "Ledger lost: cannot use the ledger at redis://:***@" in result.stderr
    # A sandbox run resumes like any run.
    assert "run the same command to resume" in result.stderr
    assert REDIS_PASSWORD not in result.stdout + result.stderr
    done = (tmp_path / "jobs.sandbox.results.jsonl").read_text().splitlines()
    assert 4 <= len(done) < 12


def _emptied(ledger: Path) -> None:
    with sqlite3.connect(ledger) as db:
        db.execute("DELETE FROM send_log")


def _deleted(ledger: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize(("loss", "code"), [(_emptied, 0), (_deleted, 75)])
def test_a_sqlite_ledger_lost_mid_run_is_never_an_empty_budget(tmp_path, loss, code):
    """Issue 40: the SQLite ledger emptied in place mid-run: the run says so once
    and goes on, every window paced as full (exit 0); deleted: the run stops
    with 75 and the resumed run waits out the windows. Either way every arrival
    holds 4/1s at the server, and no traceback."""
    jobs, rule = query_jobs(tmp_path, 14), "run-query=4/1s"
    ledger = tmp_path / "state" / "ledger.db"
    server = create_app(rules=limit_table(overrides=[parse_override(rule)]))
    with running(server) as url:
        args = ["submit", str(jobs), "--base-url", url, "--limit", rule]
        sandbox = server.state.sandbox

        def lose_soon() -> None:
            while len(sandbox.arrivals) < 6:
                time.sleep(0.01)
            loss(ledger)

        thief = threading.Thread(target=lose_soon)
        thief.start()
        first = runner.invoke(app, args)
        thief.join()
        results = [first]
        if first.exit_code == 75:
            results.append(runner.invoke(app, args))
    assert first.exit_code == code, first.stderr
    assert results[-1].exit_code == 0, results[-1].stderr
    said = first.stderr.count("emptied while in use")
    said += first.stderr.count("deleted or replaced while in use")
    assert said == 1, first.stderr
    assert not any("Traceback" in r.stderr for r in results)
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 1.0) <= 4
    assert len({a.idempotency_key for a in sandbox.arrivals if a.status == 200}) == 14
