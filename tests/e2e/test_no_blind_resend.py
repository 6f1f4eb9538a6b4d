"""End to end: invites whose answers never come in time are not sent twice.

The loopback sandbox processes every request but answers after 1.5 s; the client
gives up after 0.5 s and would try 3 times. Every arrival is counted at the server.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.limits import LimitKey, limit_table, parse_override
from batchrun.sandbox.app import create_app
from batchrun.sandbox.faults import Faults
from batchrun.sandbox.serving import running
from tests.e2e.test_flaky import clean_env

# Without the fix the two runs retry for about 20 s: room to fail on the asserts.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

INVITES = 5
# A loose invite rule on both sides, so that without the fix the 3 tries of each
# run end in seconds (and the test fails on its asserts, not on its timeout).
LOOSE = "invite=100/1s"


def _arrivals(sandbox, count: int) -> Counter[str | None]:
    """Invite arrivals by Idempotency-Key, once `count` are recorded (the server
    records a request when its handler ends, after the client gave up)."""
    deadline = time.monotonic() + 5
    while len(sandbox.arrivals) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return Counter(
        a.idempotency_key for a in sandbox.arrivals if a.key is LimitKey.INVITE
    )


@pytest.fixture(scope="module")
def slow_invites(tmp_path_factory):
    """5 invites against a server slower than --timeout, then a --retry-failed rerun."""
    folder = tmp_path_factory.mktemp("slow")
    jobs = folder / "jobs.csv"
    rows = [
        f'i{n},invite,acme,"{{""email"": ""u{n}@x.example""}}"' for n in range(INVITES)
    ]
    jobs.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    loose = limit_table(overrides=[parse_override(LOOSE)])
    server = create_app(rules=loose, faults=Faults(rate_slow=1.0, slow_seconds=1.5))
    args = [
        *("submit", str(jobs), "--timeout", "0.5", "--max-attempts", "3"),
        *("--limit", LOOSE),
    ]
    env = clean_env(BATCHRUN_STATE_DIR=str(folder / "state"))
    with running(server) as url:
        first = CliRunner().invoke(app, [*args, "--base-url", url], env=env)
        after_first = _arrivals(server.state.sandbox, INVITES)
        again = [*args, "--base-url", url, "--retry-failed"]
        second = CliRunner().invoke(app, again, env=env)
        after_second = _arrivals(server.state.sandbox, INVITES)
    results = jobs.with_name("jobs.results.jsonl").read_text().splitlines()
    return first, second, after_first, after_second, [json.loads(r) for r in results]


def test_each_invite_reaches_the_server_exactly_once(slow_invites):
    """A timed-out invite is not retried: each arrives once, not 3 times."""
    _, _, arrivals, _, _ = slow_invites
    assert len(arrivals) == INVITES
    assert set(arrivals.values()) == {1}


def test_every_timed_out_invite_is_unknown_with_its_reason(slow_invites):
    """The results file says unknown (not failed), the timeout and the way out."""
    _, _, _, _, results = slow_invites
    assert [r["status"] for r in results] == ["unknown"] * INVITES
    assert all("timeout" in r["error"] for r in results)
    assert all("--retry-unknown" in r["note"] for r in results)


def test_unknown_invites_exit_1_and_are_named_in_the_summary(slow_invites):
    """The run exits 1 and says how many invites are unknown."""
    first, _, _, _, _ = slow_invites
    assert first.exit_code == 1, first.stderr
    assert "5 unknown" in first.stdout
    assert "--retry-unknown" in first.stderr


def test_retry_failed_never_resends_an_unknown_invite(slow_invites):
    """A rerun with --retry-failed sends none of the unknown invites."""
    _, second, first_arrivals, second_arrivals, _ = slow_invites
    assert second.exit_code == 1, second.stderr
    assert second_arrivals == first_arrivals
