"""The benchmark's case servers and case chains (support/case_server,
support/slowapi_server, support/script_cases).

Over loopback, bounded: a few requests each against a server the test starts.
"""

from __future__ import annotations

import time

import httpx
import pytest

from batchrun.core.limits import LimitKey, parse_rule
from batchrun.sandbox.faults import Faults
from support.case_server import Behaviour, Served, serving
from support.script_cases import CASES, case_server, chains, summarize

PATH = "/teams/acme/data/run-query"
RULES = {LimitKey.RUN_QUERY: parse_rule("2/10s")}


def _send(url: str, count: int) -> list[httpx.Response]:
    with httpx.Client(base_url=url, timeout=10) as http:
        return [
            http.post(PATH, json={}, headers={"Idempotency-Key": f"k{i}"})
            for i in range(count)
        ]


def test_latency_holds_accepted_answers_and_counts_on_arrival():
    with serving(RULES, Behaviour(latency=0.3)) as server:
        answers = _send(server.url, 3)
        log = list(server.log)
    assert [a.status_code for a in answers] == [200, 200, 429]
    held = [s.answered - s.at for s in log]
    assert held[0] >= 0.3
    assert held[1] >= 0.3
    assert held[2] < 0.3  # a refusal is answered at once
    assert [s.idempotency_key for s in log] == ["k0", "k1", "k2"]


def test_retry_after_is_sent_unless_the_case_takes_it_off():
    with serving(RULES, Behaviour()) as server:
        assert "retry-after" in _send(server.url, 3)[2].headers
    with serving(RULES, Behaviour(retry_after=False)) as server:
        refused = _send(server.url, 3)[2]
    assert refused.status_code == 429
    assert "retry-after" not in refused.headers


def test_injected_faults_stop_after_their_time():
    rules = {LimitKey.RUN_QUERY: parse_rule("100/10s")}
    faults = Faults(rate_429=1.0, seed=1)
    with serving(rules, Behaviour(faults_for=0.2), faults=faults) as server:
        first = _send(server.url, 2)
        time.sleep(0.3)
        later = _send(server.url, 2)
    assert [a.status_code for a in first] == [429, 429]
    assert [a.status_code for a in later] == [200, 200]


def test_injected_faults_start_after_their_delay():
    rules = {LimitKey.RUN_QUERY: parse_rule("100/10s")}
    faults = Faults(rate_429=1.0, seed=1)
    outage = Behaviour(faults_from=1.0, faults_for=2.0)
    with serving(rules, outage, faults=faults) as server:
        first = _send(server.url, 2)
        time.sleep(1.5)
        during = _send(server.url, 1)
        time.sleep(2.0)
        later = _send(server.url, 1)
    assert [a.status_code for a in first] == [200, 200]
    assert [a.status_code for a in during + later] == [429, 200]


def test_a_following_case_runs_after_the_one_it_follows():
    assert [[c.number for c in chain] for chain in chains([6])] == [[5, 6]]
    assert [[c.number for c in chain] for chain in chains([5, 6, 1])] == [
        [1],
        [5, 6],
    ]
    assert len([c for chain in chains(None) for c in chain]) == len(CASES)


def test_the_summary_counts_every_request_at_the_server():
    case = CASES[2]  # 60 jobs at 10/2s: ideal 10 s
    log = [Served(100.0, 100.01, 429, "q0")]
    log += [Served(100.0 + i, 100.05 + i, 200, f"q{i}") for i in range(60)]
    row = summarize(case, "tool", log, 0, False, 0)
    assert row["http_429"] == 1
    assert row["requests"] == 61
    assert row["exactly_once"]
    assert row["makespan_s"] == 59.05
    assert row["ratio"] == round(59.05 / 10, 3)


def test_the_slowapi_case_runs_against_stock_slowapi_with_its_latency():
    pytest.importorskip("slowapi")
    case = next(c for c in CASES if c.limiter == "slowapi")
    assert (case.number, case.jobs, case.told, case.server) == (
        9,
        120,
        "30/2s",
        "30/2s",
    )
    assert case.ideal() == pytest.approx(6.04)  # 30 at 0, 2, 4, 6 s, then 40 ms
    with case_server(case, 0) as server:
        (answer,) = _send(server.url, 1)
        log = list(server.log)
    assert answer.status_code == 200
    assert log[0].answered - log[0].at >= 0.04


def test_slowapi_refuses_past_its_moving_window_at_once_and_counts_on_arrival():
    pytest.importorskip("slowapi")
    from support import slowapi_server

    assert slowapi_server.limit_text("15/4s+60/20s") == "15/4 second;60/20 second"
    with slowapi_server.serving("2/10s", Behaviour(latency=0.3)) as server:
        answers = _send(server.url, 3)
        log = list(server.log)
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json() == {"error": "Rate limit exceeded: 2 per 10 second"}
    assert "retry-after" not in answers[2].headers  # slowapi's default
    held = [s.answered - s.at for s in log]
    assert held[0] >= 0.3
    assert held[1] >= 0.3
    assert held[2] < 0.3
    assert [s.idempotency_key for s in log] == ["k0", "k1", "k2"]
