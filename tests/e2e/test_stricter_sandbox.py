"""End to end: `batchrun submit` against a sandbox stricter than its rule, over loopback.

The client holds `30/10s` at `--time-scale 10` (30/1s, learning's candidate windows
scaled alike); the sandbox enforces 10/1s, counted by each `limiters` model, with or
without rate-limit headers. Every request the sandbox saw is counted; request
counts are bounded by the jobs.
"""

from __future__ import annotations

from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.limits import limit_table, parse_override
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.app import create_app
from batchrun.sandbox.policy_headers import HeaderStyle
from batchrun.sandbox.serving import running

pytestmark = pytest.mark.e2e
runner = CliRunner()
CLIENT = ["--limit", "run-query=30/10s", "--time-scale", "10"]
SERVER = "run-query=10/1s"


def stricter(counting: LimiterKind, headers: HeaderStyle = HeaderStyle.NONE):
    rules = limit_table(overrides=[parse_override(SERVER)])
    return create_app(rules=rules, counting=counting, headers=headers)


def submit(tmp_path, url: str, count: int):
    path = tmp_path / "jobs.csv"
    rows = [f"q{i:04d},run-query,team{i % 3}," for i in range(count)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return runner.invoke(app, ["submit", str(path), "--base-url", url, *CLIENT])


def statuses_and_done(server) -> tuple[Counter[int], Counter[str | None]]:
    arrivals = server.state.sandbox.arrivals
    statuses = Counter(a.status for a in arrivals)
    done = Counter(a.idempotency_key for a in arrivals if a.status == 200)
    return statuses, done


@pytest.mark.parametrize("counting", list(LimiterKind))
def test_the_client_learns_a_stricter_server_however_it_counts(tmp_path, counting):
    """Each job accepted exactly once, no more 429s than a script told the
    same rule takes (20 or more; issue 36's bound is max(4, the script's):
    2 to 7 measured here alone, up to 14 on a busy machine), and a run
    refused more than once (a lone 429 changes nothing) says it learned. 30 jobs: a first
    burst of 20 that straddles a fixed window's reset would all be accepted
    (10 in each), and nothing learned."""
    server = stricter(counting)
    with running(server) as url:
        result = submit(tmp_path, url, 30)
    assert result.exit_code == 0, result.stdout + result.stderr
    statuses, done = statuses_and_done(server)
    assert len(done) == 30
    assert set(done.values()) == {1}
    assert 1 <= statuses[429] <= 20, statuses
    if statuses[429] > 1:
        assert "run-query: the server allows less than the rule; now" in result.stdout


@pytest.mark.parametrize(
    ("headers", "counting"),
    [
        (HeaderStyle.IETF, LimiterKind.SLIDING),
        (HeaderStyle.IETF, LimiterKind.FIXED),
        (HeaderStyle.IETF, LimiterKind.LEAKY),
        (HeaderStyle.DRAFT7, LimiterKind.SLIDING),
        (HeaderStyle.DRAFT7, LimiterKind.LEAKY),
    ],
)
def test_a_stated_policy_is_kept_with_no_429(tmp_path, headers, counting):
    """A stated window is adopted from the first answer: no 429 at all."""
    server = stricter(counting, headers)
    with running(server) as url:
        result = submit(tmp_path, url, 20)
    assert result.exit_code == 0, result.stdout + result.stderr
    statuses, done = statuses_and_done(server)
    assert statuses == {200: 20}
    assert set(done.values()) == {1}
    assert "in its rate-limit headers" in result.stdout


def test_an_x_ratelimit_count_is_kept_with_no_429(tmp_path):
    """X-RateLimit-* states a count with no window; the first answer's reset
    names it (10 per the rule's own window, 1 s scaled), so the key is
    paced by it from then on: no 429 (the first request goes alone), but the
    one a busy machine may cause (test_stock.py)."""
    server = stricter(LimiterKind.SLIDING, HeaderStyle.X_RATELIMIT)
    with running(server) as url:
        result = submit(tmp_path, url, 20)
    assert result.exit_code == 0, result.stdout + result.stderr
    statuses, done = statuses_and_done(server)
    assert statuses[200] == 20
    assert statuses[429] <= 1, statuses
    assert set(done.values()) == {1}
    assert "in its rate-limit headers" in result.stdout


def test_a_bucket_slower_than_the_rule_is_tried_as_a_shorter_window_next(tmp_path):
    """A leaky bucket with no burst at 10/s: the shorter window that fits
    (1/100ms, a bucket's interval) is tried before the rule's own (1/1s, ten
    times slower), and holds. A few 429s on the way (3 to 5 measured: a lone
    one, then one per faster reading refuted; issue 36 allows max(4, a
    script's), and a script told 30/s takes far more here)."""
    server = stricter(LimiterKind.LEAKY)
    with running(server) as url:
        result = submit(tmp_path, url, 20)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "now 1/100ms+30/1s" in result.stdout
    assert "now 1/1s" not in result.stdout
    statuses, done = statuses_and_done(server)
    assert set(done.values()) == {1}
    assert statuses[429] <= 8
