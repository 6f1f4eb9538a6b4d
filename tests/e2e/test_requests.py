"""End to end: request jobs for any endpoint, paced by the budget the server
counts them against (issue 37), over real loopback sockets.

Windows are scaled 60 times (invite 15/5s, run-query 15/1s+500/1m, global
120/1s), so the slowest key of the mixed file takes about 5 s. Every request the
sandbox saw is counted at the sandbox, by the key it counted it against.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.cli.arguments import scaled
from batchrun.cli.commands import app
from batchrun.core.limits import LimitKey, Pace, limit_table, parse_override
from batchrun.pacing.slots import eta
from batchrun.sandbox.app import create_app
from batchrun.sandbox.faults import Faults
from batchrun.sandbox.serving import running
from support.mixed import write_mixed
from support.oracles import max_in_window
from tests.e2e.test_flaky import clean_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]
SCALE = 60.0
COUNTS = {"queries": 60, "invites": 20, "resolving": 20, "others": 100}


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """The 200 jobs of the mixed file, submitted once against a scaled sandbox."""
    folder = tmp_path_factory.mktemp("mixed")
    jobs = write_mixed(folder / "jobs.csv", **COUNTS)
    rules = scaled(limit_table(), SCALE)
    server = create_app(rules=rules)
    env = clean_env(BATCHRUN_STATE_DIR=str(folder / "state"))
    with running(server) as url:
        started = time.monotonic()
        result = CliRunner().invoke(
            app,
            ["submit", str(jobs), "--base-url", url, "--time-scale", f"{SCALE:g}"],
            env=env,
        )
        elapsed = time.monotonic() - started
    results = [
        json.loads(line)
        for line in (folder / "jobs.results.jsonl").read_text().splitlines()
    ]
    return result, server.state.sandbox, rules, results, elapsed


def test_every_job_of_the_mixed_file_is_done_once_with_no_429(mixed_run):
    """200 jobs, 200 arrivals, all 200: not one 429, not one sent twice."""
    result, sandbox, _, results, _ = mixed_run
    assert result.exit_code == 0, result.stdout + result.stderr
    assert Counter(a.status for a in sandbox.arrivals) == {200: 200}
    sent = Counter(a.idempotency_key for a in sandbox.arrivals)
    assert (len(sent), set(sent.values())) == (200, {1})
    assert Counter(r["status"] for r in results) == {"done": 200}


def test_requests_are_counted_by_the_server_where_the_client_paced_them(mixed_run):
    """The sandbox counts 70 run-query, 30 invite and 100 global arrivals: the
    20 requests to run-query's and invite's paths drew on those budgets."""
    _, sandbox, _, _, _ = mixed_run
    assert Counter(a.key for a in sandbox.arrivals) == {
        LimitKey.RUN_QUERY: 70,
        LimitKey.INVITE: 30,
        LimitKey.GLOBAL: 100,
    }


def test_every_key_stays_within_its_rule_at_the_server(mixed_run):
    """No window of any key's rule ever holds more arrivals than its count."""
    _, sandbox, rules, _, _ = mixed_run
    for key in (LimitKey.RUN_QUERY, LimitKey.INVITE, LimitKey.GLOBAL):
        for window in rules[key].windows:
            most = max_in_window(sandbox, key, window.seconds)
            assert most <= window.count, (key, window, most)


def test_the_mixed_file_ends_near_the_slowest_keys_ideal(mixed_run):
    """Invites (30 at 15/5s) bound the run: it ends within 1.5 x their ideal, a
    sanity bound for a busy 2-core machine (the figure is bench.whole_api's)."""
    _, _, rules, _, elapsed = mixed_run
    ideal = eta(30, rules[LimitKey.INVITE], now=0.0, pace=Pace.EXACT)
    assert ideal == pytest.approx(5.0)
    assert elapsed < 1.5 * ideal + 2.0, (elapsed, ideal)


# Requests whose answers never come in time


@pytest.fixture(scope="module")
def slow_requests(tmp_path_factory):
    """One request of each method against a server slower than --timeout."""
    folder = tmp_path_factory.mktemp("slow")
    jobs = folder / "jobs.csv"
    rows = [
        'post,request,acme,"{""n"": 1}",POST,/teams/{team_id}/notes',
        'patch,request,,"{""n"": 2}",PATCH,/users/me/profile',
        "get,request,acme,,GET,/teams/{team_id}/reports",
        'put,request,,"{""n"": 3}",PUT,/users/me/settings',
        "delete,request,acme,,DELETE,/teams/{team_id}/members/m1",
    ]
    jobs.write_text("id,type,team_id,payload,method,path\n" + "\n".join(rows) + "\n")
    loose = limit_table(overrides=[parse_override("global=100/1s")])
    server = create_app(rules=loose, faults=Faults(rate_slow=1.0, slow_seconds=1.5))
    args = ["submit", str(jobs), "--timeout", "0.5", "--max-attempts", "3"]
    env = clean_env(BATCHRUN_STATE_DIR=str(folder / "state"))
    with running(server) as url:
        result = CliRunner().invoke(
            app, [*args, "--base-url", url, "--limit", "global=100/1s"], env=env
        )
        deadline = time.monotonic() + 5
        # The server records a request when its handler ends, after the client
        # gave up: wait for the 2 + 3 x 3 arrivals.
        while len(server.state.sandbox.arrivals) < 11 and time.monotonic() < deadline:
            time.sleep(0.05)
    ended = (folder / "jobs.results.jsonl").read_text().splitlines()
    by_id = {json.loads(line)["id"]: json.loads(line) for line in ended}
    keys = {a.idempotency_key for a in server.state.sandbox.arrivals}
    return result, server.state.sandbox, by_id, keys


def test_a_timed_out_post_or_patch_ends_unknown_and_is_not_sent_again(slow_requests):
    """POST and PATCH whose answers were lost arrive once and end unknown."""
    result, sandbox, by_id, _ = slow_requests
    assert result.exit_code == 1
    for job in ("post", "patch"):
        assert (by_id[job]["status"], by_id[job]["attempts"]) == ("unknown", 1)
        assert "timeout" in by_id[job]["error"]
    methods = Counter(a.idempotency_key for a in sandbox.arrivals)
    assert sorted(methods.values()) == [1, 1, 3, 3, 3]


def test_a_timed_out_get_put_or_delete_is_retried(slow_requests):
    """GET, PUT and DELETE are idempotent: tried 3 times, then failed."""
    _, _, by_id, _ = slow_requests
    for job in ("get", "put", "delete"):
        assert (by_id[job]["status"], by_id[job]["attempts"]) == ("failed", 3)


# Bad rows: refused before anything is sent


@pytest.fixture(scope="module")
def quiet_server():
    """A sandbox on loopback that records whatever reaches it."""
    server = create_app(rules=limit_table())
    with running(server) as url:
        yield url, server.state.sandbox


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        pytest.param("GET,/teams/../admin", "'..' step", id="dot-dot"),
        pytest.param("GET,/teams//admin", "holds '//'", id="double-slash"),
        pytest.param("GET,https://evil.example/x", "names a scheme", id="absolute"),
        pytest.param("GET,http:/teams/a", "names a scheme", id="scheme"),
        pytest.param("GET,//evil.example/x", "starts with '//'", id="host"),
        pytest.param("GET,/teams/a%2F..%2Fb", "encoded slash", id="encoded-slash"),
        pytest.param("FETCH,/teams/a", "unknown method 'FETCH'", id="method"),
        pytest.param(
            "GET,/teams/{team_id}/x",
            "team_id is missing: the path holds {team_id}",
            id="no-team",
        ),
    ],
)
def test_a_bad_request_row_exits_2_naming_its_line_with_nothing_sent(
    tmp_path, quiet_server, row, reason
):
    """Each unsafe or incomplete request row refuses the file: exit 2, the line
    and reason on stderr, not one request at the server."""
    url, sandbox = quiet_server
    jobs = tmp_path / "jobs.csv"
    jobs.write_text(
        "id,type,team_id,payload,method,path\n"
        "ok,request,acme,,GET,/teams/{team_id}/reports\n"
        f"bad,request,,,{row}\n"
    )
    before = len(sandbox.arrivals)
    env = clean_env(BATCHRUN_STATE_DIR=str(tmp_path / "state"))
    result = CliRunner().invoke(app, ["submit", str(jobs), "--base-url", url], env=env)
    assert result.exit_code == 2
    assert "line 3" in result.stderr
    assert reason in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(sandbox.arrivals) == before


def test_a_get_with_a_payload_exits_2_naming_its_line(tmp_path, quiet_server):
    """A GET carries its arguments in the query string: a payload refuses it."""
    url, sandbox = quiet_server
    jobs = tmp_path / "jobs.jsonl"
    line = {
        "id": 1,
        "type": "request",
        "method": "GET",
        "path": "/r",
        "payload": {"a": 1},
    }
    jobs.write_text(json.dumps(line) + "\n")
    before = len(sandbox.arrivals)
    env = clean_env(BATCHRUN_STATE_DIR=str(tmp_path / "state"))
    result = CliRunner().invoke(app, ["submit", str(jobs), "--base-url", url], env=env)
    assert result.exit_code == 2
    assert "line 1" in result.stderr
    assert "a GET request carries no payload" in result.stderr
    assert len(sandbox.arrivals) == before
