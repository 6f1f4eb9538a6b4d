"""End to end: `batchrun submit` against a stock server-side limiter over loopback.

The server is Python `limits` (moving window, as slowapi runs it), not batchrun's
own sandbox: when the client's rule equals the server's, every job is accepted once
and nothing is refused; with slowapi's headers, a stricter server's stated count is
kept from its first answer. Windows are scaled down (10/1s) so the run takes seconds.
The nginx and express-rate-limit servers of support/stock_programs.py need programs the test
extra lacks (nginx; node and `npm ci`): their tests check only that each limiter
is what bench/stricter.py assumes, and are skipped, saying why, without them.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from support import stock_programs as stock
from support.stock import Server, limits_server

pytestmark = pytest.mark.e2e
JOBS = 30


def query_jobs(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "jobs.csv"
    rows = [f"q{i:04d},run-query,acme," for i in range(count)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("headers", [False, True], ids=["bare", "slowapi-headers"])
def test_equal_rules_against_limits_moving_window_are_done_once_with_no_429(
    tmp_path, headers
):
    """Client and server both at 10/1s (limits moving window): each job 200
    once, and at most one 429: a busy server that reads a request late may see
    one window hold one too many where the arrival bound's assumptions fail
    (docs/design/arrival.md, "What it does not cover"; seen in two full runs on
    a loaded 2-core machine, 1 x 429 each, under the network-only bound since
    replaced by the floor)."""
    with limits_server("10/1s", strategy="moving-window", headers=headers) as server:
        started = time.monotonic()
        result = CliRunner().invoke(
            app,
            [
                "submit",
                str(query_jobs(tmp_path, JOBS)),
                "--base-url",
                server.url,
                "--limit",
                "run-query=10/1s",
            ],
        )
        elapsed = time.monotonic() - started
        arrivals = server.arrivals()
    assert result.exit_code == 0, result.stdout + result.stderr
    statuses = Counter(a.status for a in arrivals)
    assert statuses[200] == JOBS
    assert set(statuses) <= {200, 429}
    assert statuses[429] <= 1, statuses
    accepted = [a.key for a in arrivals if a.status == 200]
    assert len(set(accepted)) == JOBS
    # Ideal 2.0 s (two full windows after the first ten); slack for a busy machine.
    assert elapsed < 5.0, elapsed


def test_slowapi_headers_name_a_stricter_limit_from_the_first_answer(tmp_path):
    """Told 30/2s, a stock `limits` moving window of 10/2s with slowapi's
    headers: X-RateLimit-Limit 10 and a reset a whole second late (3 s) name
    the 2 s window, so the key is paced by 10/2s from the first answer. Each
    job 200 once; at most the one 429 a busy machine may cause (above)."""
    with limits_server("10/2s", strategy="moving-window", headers=True) as server:
        result = CliRunner().invoke(
            app,
            [
                "submit",
                str(query_jobs(tmp_path, 20)),
                "--base-url",
                server.url,
                "--limit",
                "run-query=30/2s",
            ],
        )
        arrivals = server.arrivals()
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "the server states 10/2s in its rate-limit headers" in result.stdout
    statuses = Counter(a.status for a in arrivals)
    assert statuses[200] == 20
    assert statuses[429] <= 1, statuses
    assert len({a.key for a in arrivals if a.status == 200}) == 20


def burst(server: Server, count: int) -> list[httpx.Response]:
    """`count` run-query POSTs one after the other; the answers."""
    with httpx.Client(base_url=server.url, timeout=10.0) as http:
        return [http.post("/teams/acme/data/run-query", json={}) for _ in range(count)]


@pytest.mark.skipif(
    shutil.which("nginx") is None,
    reason="nginx is not installed (apt-get install -y nginx-light)",
)
def test_nginx_nodelay_accepts_burst_plus_one_then_answers_the_api_429():
    """nginx limit_req burst=10 nodelay: 11 accepted at once, then the API's 429 body."""
    with stock.nginx_server(rate="1r/s", burst=10, nodelay=True) as server:
        answers = burst(server, 13)
        arrivals = server.arrivals()
    assert [a.status_code for a in answers] == [200] * 11 + [429] * 2
    assert answers[-1].json()["error"]["code"] == "TOO_MANY_REQUESTS"
    assert "retry-after" not in answers[-1].headers
    assert [a.status for a in arrivals] == [200] * 11 + [429] * 2


@pytest.mark.skipif(
    shutil.which("node") is None or not (stock.EXPRESS / "node_modules").is_dir(),
    reason="express-rate-limit needs node and `npm ci` in support/express",
)
def test_express_draft_8_sends_retry_after_only_on_429():
    """express-rate-limit 3/2s draft-8: RateLimit on every answer, Retry-After on 429."""
    with stock.express_server(
        window_ms=2000, limit=3, standard_headers="draft-8"
    ) as server:
        answers = burst(server, 4)
        arrivals = server.arrivals()
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[0].headers["RateLimit"].startswith('"3-in-2sec"; r=2; t=')
    assert "retry-after" not in answers[0].headers
    assert answers[-1].headers["Retry-After"] in {"1", "2"}
    assert answers[-1].json()["error"]["code"] == "TOO_MANY_REQUESTS"
    assert [a.status for a in arrivals] == [200, 200, 200, 429]
