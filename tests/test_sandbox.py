"""The sandbox: routes, the exact sliding-window limits, the 429 body, faults, serving."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from batchrun.core.errors import UsageError
from batchrun.core.limits import LimitKey, Rule, Window, parse_rule
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.app import Arrival, Sandbox, create_app
from batchrun.sandbox.faults import Faults, parse_faults
from batchrun.sandbox.policy_headers import HeaderStyle
from batchrun.sandbox.serving import Dropped, running, serve
from support.oracles import max_in_window, most_in_window

pytestmark = pytest.mark.anyio

QUERY = "/teams/t1/data/run-query"
INVITE = "/teams/t1/members/invite"
AVATAR = "/users/me/avatar"
TOKEN = "Bearer s3cret-token-value"
API_429 = {
    "success": False,
    "error": {
        "code": "TOO_MANY_REQUESTS",
        "message": "Too many requests. Please slow down and retry later.",
    },
}


@pytest.fixture
def anyio_backend() -> str:
    """In-process sandbox tests run on asyncio."""
    return "asyncio"


class Clock:
    """A clock that reads `now` and moves only when a test sets it."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rules(**texts: str) -> dict[LimitKey, Rule]:
    """A rule table: a generous global rule plus `key=rule` overrides."""
    table = {LimitKey.GLOBAL: parse_rule("100/1s")}
    table.update(
        {LimitKey(k.replace("_", "-")): parse_rule(v) for k, v in texts.items()}
    )
    return table


def client(app: Starlette, token: str | None = TOKEN) -> httpx.AsyncClient:
    headers = {"Authorization": token} if token is not None else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://sandbox",
        headers=headers,
    )


async def post_at(
    app: Starlette, clock: Clock, moments: Iterable[float], path: str = QUERY
) -> list[int]:
    """POST once at each moment of the fake clock; return the status codes."""
    statuses = []
    async with client(app) as http:
        for moment in moments:
            clock.now = moment
            statuses.append((await http.post(path, json={})).status_code)
    return statuses


async def post_times(
    app: Starlette, count: int, path: str = QUERY
) -> list[httpx.Response]:
    """POST `count` times in a row; return the responses."""
    async with client(app) as http:
        return [await http.post(path, json={}) for _ in range(count)]


# Answers and routes


async def test_accepted_request_echoes_endpoint_team_and_body():
    """An accepted request gets success, its endpoint, its team and its body back."""
    app = create_app(rules=rules(), clock=Clock())
    async with client(app) as http:
        response = await http.post("/teams/team-7/data/run-query", json={"q": [1, 2]})
    assert response.status_code == 200
    assert response.json() == {
        "success": True,
        "data": {
            "request_id": 1,
            "endpoint": "run-query",
            "team_id": "team-7",
            "method": "POST",
            "path": "/teams/team-7/data/run-query",
            "query": "",
            "received": {"q": [1, 2]},
        },
    }


async def test_request_ids_count_up():
    """Each accepted answer carries the next request id."""
    app = create_app(rules=rules(), clock=Clock())
    responses = await post_times(app, 3)
    assert [r.json()["data"]["request_id"] for r in responses] == [1, 2, 3]


async def test_empty_body_echoes_as_empty_object():
    """A request with no body is accepted and echoes an empty object."""
    app = create_app(rules=rules(), clock=Clock())
    async with client(app) as http:
        response = await http.put(AVATAR)
    assert response.status_code == 200
    assert response.json()["data"]["received"] == {}


@pytest.mark.parametrize(
    ("method", "path", "endpoint", "team"),
    [
        pytest.param("POST", QUERY, "run-query", "t1", id="run-query"),
        pytest.param("POST", INVITE, "invite", "t1", id="invite"),
        pytest.param("PUT", AVATAR, "avatar", None, id="avatar"),
    ],
)
async def test_each_route_answers_its_method(method, path, endpoint, team):
    """Each of the three routes accepts its method and names its endpoint."""
    app = create_app(rules=rules(), clock=Clock())
    async with client(app) as http:
        response = await http.request(method, path, json={"n": 1})
    assert response.status_code == 200
    assert response.json()["data"]["endpoint"] == endpoint
    assert response.json()["data"]["team_id"] == team
    assert app.state.sandbox.arrivals[0].key is LimitKey(endpoint)


@pytest.mark.parametrize(
    ("method", "path", "query", "team"),
    [
        pytest.param("GET", "/teams/t1/reports", "day=3", "t1", id="get-team"),
        pytest.param("DELETE", "/teams/t2/members/m9", "", "t2", id="delete"),
        pytest.param("PATCH", "/users/me/profile", "", None, id="patch-user"),
        pytest.param("POST", "/users/me/notes", "a=1&b=2", None, id="post-other"),
    ],
)
async def test_any_other_path_is_answered_with_an_echo(method, path, query, team):
    """Any other method and path of the API is accepted under global, and
    echoes what came."""
    app = create_app(rules=rules(), clock=Clock())
    body = {"n": 1} if method in ("POST", "PATCH") else None
    url = f"{path}?{query}" if query else path
    async with client(app) as http:
        response = await http.request(method, url, json=body)
    assert response.status_code == 200
    data = response.json()["data"]
    assert (data["endpoint"], data["method"], data["path"]) == ("global", method, path)
    assert (data["query"], data["team_id"]) == (query, team)
    assert data["received"] == (body or {})
    assert [a.key for a in app.state.sandbox.arrivals] == [LimitKey.GLOBAL]


async def test_unknown_path_is_a_404_json_error():
    """A path outside the API (/teams/, /users/me/: a wrong base URL prefix)
    gets 404 with the API's JSON error shape."""
    app = create_app(rules=rules(), clock=Clock())
    async with client(app) as http:
        response = await http.post("/v1/teams/t1/data/run-query", json={})
    assert response.status_code == 404
    body = response.json()
    assert body["success"] is False
    assert body["error"]["code"] == "NOT_FOUND"
    assert "/v1/teams/t1/data/run-query" in body["error"]["message"]


async def test_unknown_path_counts_against_global():
    """Requests to unknown paths draw on the global budget."""
    app = create_app(rules={LimitKey.GLOBAL: parse_rule("1/10s")}, clock=Clock())
    async with client(app) as http:
        first = await http.get("/nowhere")
        second = await http.get("/elsewhere")
    assert (first.status_code, second.status_code) == (404, 429)
    assert second.json() == API_429
    assert [a.key for a in app.state.sandbox.arrivals] == [LimitKey.GLOBAL] * 2


async def test_unknown_path_is_unlimited_without_a_global_rule():
    """With no global rule, unknown paths are answered 404 and never 429."""
    app = create_app(rules={LimitKey.RUN_QUERY: parse_rule("1/10s")}, clock=Clock())
    responses = await post_times(app, 5, "/nowhere")
    assert [r.status_code for r in responses] == [404] * 5


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        pytest.param("GET", QUERY, "POST", id="get-run-query"),
        pytest.param("PUT", INVITE, "POST", id="put-invite"),
        pytest.param("POST", AVATAR, "PUT", id="post-avatar"),
    ],
)
async def test_wrong_method_is_a_405_json_error(method, path, allowed):
    """A route called with the wrong method gets 405, a JSON error and Allow."""
    app = create_app(rules=rules(), clock=Clock())
    async with client(app) as http:
        response = await http.request(method, path)
    assert response.status_code == 405
    assert response.json()["success"] is False
    assert response.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert response.headers["Allow"] == allowed


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"{not json", id="broken"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
        pytest.param(b"[" * 100_000, id="too-deep"),
    ],
)
async def test_invalid_json_body_is_a_400(content):
    """A body that is not valid JSON gets 400 with a JSON error."""
    app = create_app(rules=rules(), clock=Clock())
    async with client(app) as http:
        response = await http.post(QUERY, content=content)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "BAD_REQUEST"


async def test_invalid_json_body_still_counts():
    """A 400 for a bad body still uses up the budget: the server saw it."""
    app = create_app(rules=rules(run_query="1/10s"), clock=Clock())
    async with client(app) as http:
        bad = await http.post(QUERY, content=b"{")
        good = await http.post(QUERY, json={})
    assert (bad.status_code, good.status_code) == (400, 429)


# Limits


async def test_over_limit_gets_the_api_429_body():
    """An over-limit request gets 429 with exactly the API's documented body."""
    app = create_app(rules=rules(run_query="1/10s"), clock=Clock())
    first, second = await post_times(app, 2)
    assert first.status_code == 200
    assert second.status_code == 429
    assert second.json() == API_429
    assert second.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("accepted", "moment", "retry_after"),
    [
        pytest.param([0.0, 1.0], 2.0, "8", id="whole-seconds"),
        pytest.param([0.0, 1.0], 5.5, "5", id="rounded-up"),
        pytest.param([0.0, 1.0], 9.9, "1", id="at-least-one"),
        pytest.param([0.0, 1.0], 10 - 1e-7, "1", id="never-zero"),
        # 0.3 + 10 - 3.3 is 7.000000000000001 in floats.
        pytest.param([0.3, 1.0], 3.3, "7", id="float-noise-not-rounded-up"),
    ],
)
async def test_retry_after_is_seconds_until_the_oldest_arrival_leaves(
    accepted, moment, retry_after
):
    """Retry-After rounds up the wait until the oldest accepted arrival leaves."""
    clock = Clock()
    app = create_app(rules=rules(run_query="2/10s"), clock=clock)
    assert await post_at(app, clock, accepted) == [200, 200]
    clock.now = moment
    async with client(app) as http:
        response = await http.post(QUERY, json={})
    assert response.status_code == 429
    assert response.headers["Retry-After"] == retry_after


async def test_window_is_half_open():
    """An arrival at t leaves a W-second window at exactly t + W, not before."""
    clock = Clock()
    app = create_app(rules=rules(run_query="2/10s"), clock=clock)
    statuses = await post_at(app, clock, [0.0, 1.0, 9.9, 10.0, 10.5, 11.0])
    assert statuses == [200, 200, 429, 200, 429, 200]


async def test_window_ends_at_the_float_sum_the_pacer_uses():
    """An arrival at 0.7 has left a 10 s window at 0.7 + 10 (not 10.7 - 10 < 0.7)."""
    clock = Clock()
    app = create_app(rules=rules(run_query="1/10s"), clock=clock)
    assert await post_at(app, clock, [0.7, 0.7 + 10]) == [200, 200]


async def test_every_window_of_a_rule_holds():
    """With 2/1s+3/10s both the short and the long window reject."""
    clock = Clock()
    app = create_app(rules=rules(run_query="2/1s+3/10s"), clock=clock)
    statuses = await post_at(app, clock, [0.0, 0.5, 0.9, 1.0, 2.0, 10.0])
    assert statuses == [200, 200, 429, 200, 429, 200]


async def test_multi_window_retry_after_uses_the_longest_wait():
    """Retry-After waits for the window that frees up last."""
    clock = Clock()
    app = create_app(rules=rules(run_query="2/1s+3/10s"), clock=clock)
    assert await post_at(app, clock, [0.0, 0.5, 1.0]) == [200, 200, 200]
    clock.now = 1.2
    async with client(app) as http:
        response = await http.post(QUERY, json={})
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "9"


async def test_clients_have_separate_budgets():
    """Each Authorization header draws on its own budget."""
    app = create_app(rules=rules(run_query="1/10s"), clock=Clock())
    async with client(app, "Bearer a") as first, client(app, "Bearer b") as second:
        assert (await first.post(QUERY, json={})).status_code == 200
        assert (await first.post(QUERY, json={})).status_code == 429
        assert (await second.post(QUERY, json={})).status_code == 200


async def test_requests_without_a_token_share_one_budget():
    """Requests with no Authorization header are one anonymous client."""
    app = create_app(rules=rules(run_query="1/10s"), clock=Clock())
    async with client(app, None) as first, client(app, None) as second:
        assert (await first.post(QUERY, json={})).status_code == 200
        assert (await second.post(QUERY, json={})).status_code == 429


async def test_keys_have_separate_budgets():
    """Using up one endpoint's budget leaves another endpoint's untouched."""
    app = create_app(rules=rules(run_query="1/10s", invite="1/10s"), clock=Clock())
    async with client(app) as http:
        assert (await http.post(QUERY, json={})).status_code == 200
        assert (await http.post(QUERY, json={})).status_code == 429
        assert (await http.post(INVITE, json={})).status_code == 200


async def test_key_without_a_rule_uses_the_global_rule():
    """A key with no rule of its own is limited by the global rule."""
    app = create_app(rules={LimitKey.GLOBAL: parse_rule("2/10s")}, clock=Clock())
    responses = await post_times(app, 3)
    assert [r.status_code for r in responses] == [200, 200, 429]


async def test_rejected_requests_do_not_consume_budget():
    """429s are not counted: the budget frees up when the accepted one leaves."""
    clock = Clock()
    app = create_app(rules=rules(run_query="1/10s"), clock=clock)
    statuses = await post_at(app, clock, [0.0, 5.0, 9.0, 10.0])
    assert statuses == [200, 429, 429, 200]


_windows = st.lists(
    st.builds(Window, st.integers(1, 4), st.sampled_from([0.5, 1.0, 2.0, 3.0])),
    min_size=1,
    max_size=2,
)
_steps = st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]), max_size=40)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(windows=_windows, steps=_steps)
def test_admit_accepts_exactly_what_every_window_allows(windows, steps):
    """admit accepts a request iff each window holds fewer than COUNT accepted ones."""
    rule = Rule(tuple(windows))
    clock = Clock()
    sandbox = Sandbox({LimitKey.GLOBAL: rule}, clock=clock)
    accepted: list[float] = []
    for step in steps:
        clock.now += step
        fits = all(
            sum(a + w.seconds > clock.now for a in accepted) < w.count for w in windows
        )
        wait = sandbox.admit("c", LimitKey.RUN_QUERY).wait
        assert (wait is None) is fits
        if wait is None:
            accepted.append(clock.now)
        else:
            assert wait > 0
    for w in windows:
        assert most_in_window(accepted, w.seconds) <= w.count


# Counting and stated policy


async def test_counting_picks_the_server_model():
    """Fixed windows take 2 at 9.9 s and 2 more at 10 s; the sliding log does not."""
    moments = [9.9, 9.9, 10.0, 10.0]
    statuses = {}
    for counting in (LimiterKind.FIXED, LimiterKind.SLIDING):
        clock = Clock()
        app = create_app(rules=rules(run_query="2/10s"), clock=clock, counting=counting)
        statuses[counting] = await post_at(app, clock, moments)
    assert statuses == {
        LimiterKind.FIXED: [200, 200, 200, 200],
        LimiterKind.SLIDING: [200, 200, 429, 429],
    }


async def test_a_leaky_sandbox_has_no_burst():
    """Leaky at 2/1s is nginx without burst: one request per 500 ms."""
    clock = Clock()
    app = create_app(
        rules=rules(run_query="2/1s"), clock=clock, counting=LimiterKind.LEAKY
    )
    statuses = await post_at(app, clock, [0.0, 0.2, 0.499, 0.5, 1.0])
    assert statuses == [200, 429, 429, 200, 200]


async def test_a_leaky_sandbox_with_a_burst_lets_it_through_at_once():
    """--burst 2: three at once, then one per 500 ms as it drains."""
    clock = Clock()
    app = create_app(
        rules=rules(run_query="2/1s"),
        clock=clock,
        counting=LimiterKind.LEAKY,
        burst=2,
    )
    statuses = await post_at(app, clock, [0.0, 0.0, 0.0, 0.0, 0.499, 0.5])
    assert statuses == [200, 200, 200, 429, 429, 200]


def test_a_burst_without_a_leaky_bucket_is_a_usage_error():
    with pytest.raises(UsageError, match="a burst needs leaky counting"):
        create_app(rules=rules(run_query="2/1s"), burst=2)


def test_a_rule_too_slow_for_a_leaky_bucket_is_a_usage_error():
    """nginx counts in thousandths of a request per second: 1/1h is too slow."""
    with pytest.raises(UsageError, match="cannot count leaky"):
        create_app(rules=rules(run_query="1/1h"), counting=LimiterKind.LEAKY)


async def test_answers_state_the_quota_left_after_them():
    """With IETF headers, an accepted answer states what is left after it, and a
    429 states none left with the reset Retry-After rounds up."""
    clock = Clock()
    app = create_app(
        rules=rules(run_query="2/10s"), clock=clock, headers=HeaderStyle.IETF
    )
    async with client(app) as http:
        first = await http.post(QUERY, json={})
        clock.now = 4.0
        await http.post(QUERY, json={})
        clock.now = 5.5
        refused = await http.post(QUERY, json={})
    assert first.headers["RateLimit-Policy"] == '"2/10s";q=2;w=10'
    assert first.headers["RateLimit"] == '"2/10s";r=1;t=10'
    assert refused.status_code == 429
    assert refused.headers["RateLimit"] == '"2/10s";r=0;t=4.5'
    assert refused.headers["Retry-After"] == "5"


async def test_no_headers_by_default_and_none_on_unlimited_keys():
    """By default only a 429's Retry-After speaks; a key with no rule states nothing."""
    plain = create_app(rules=rules(), clock=Clock())
    unlimited = create_app(rules={}, clock=Clock(), headers=HeaderStyle.IETF)
    for app in (plain, unlimited):
        [response] = await post_times(app, 1)
        assert response.status_code == 200
        assert not any("ratelimit" in name for name in response.headers)


# Arrivals


async def test_arrivals_record_time_status_and_idempotency_key():
    """Every arrival is recorded with its time, status and Idempotency-Key."""
    clock = Clock(3.0)
    app = create_app(rules=rules(run_query="1/10s"), clock=clock)
    async with client(app) as http:
        await http.post(QUERY, json={}, headers={"Idempotency-Key": "job-1"})
        clock.now = 4.0
        await http.post(QUERY, json={}, headers={"Idempotency-Key": "job-2"})
        await http.post("/nowhere")
    seen = [
        (a.at, a.key, a.status, a.idempotency_key) for a in app.state.sandbox.arrivals
    ]
    assert seen == [
        (3.0, LimitKey.RUN_QUERY, 200, "job-1"),
        (4.0, LimitKey.RUN_QUERY, 429, "job-2"),
        (4.0, LimitKey.GLOBAL, 404, None),
    ]


async def test_arrival_client_is_a_hash_not_the_token():
    """The recorded client is a short hash per token that never holds the token."""
    app = create_app(rules=rules(), clock=Clock())
    for token in (TOKEN, TOKEN, "Bearer other"):
        async with client(app, token) as http:
            await http.post(QUERY, json={})
    first, again, other = (a.client for a in app.state.sandbox.arrivals)
    assert first == again != other
    assert len(first) == 12
    assert set(first) <= set("0123456789abcdef")
    assert "s3cret" not in first


async def test_cancelled_answer_is_still_recorded():
    """A request whose answer never comes (client gave up) is recorded with 0."""
    faults = Faults(rate_slow=1.0, slow_seconds=5.0)
    app = create_app(rules=rules(), faults=faults, clock=Clock(2.0))
    async with client(app) as http:
        with anyio.move_on_after(0.02):
            await http.post(QUERY, json={})
    [arrival] = app.state.sandbox.arrivals
    assert (arrival.at, arrival.status) == (2.0, 0)


@pytest.mark.parametrize(
    ("times", "seconds", "most"),
    [
        pytest.param([], 10.0, 0, id="empty"),
        pytest.param([0.0, 1.0, 2.0], 10.0, 3, id="all-inside"),
        pytest.param([0.0, 10.0], 10.0, 1, id="boundary-excluded"),
        pytest.param([0.0, 9.9], 10.0, 2, id="just-inside"),
        pytest.param([0.0, 1.0, 5.0, 11.0, 12.0, 14.0], 10.0, 4, id="sliding"),
        pytest.param([0.0, 0.0, 0.0], 1.0, 3, id="same-moment"),
    ],
)
def test_most_in_window(times, seconds, most):
    """most_in_window counts the busiest half-open interval of the given length."""
    assert most_in_window(times, seconds) == most


def hand_made_sandbox() -> Sandbox:
    sandbox = Sandbox(rules())
    sandbox.arrivals.extend(
        Arrival(at, "c", key, status, None)
        for at, key, status in [
            (12.0, LimitKey.RUN_QUERY, 200),
            (0.0, LimitKey.RUN_QUERY, 200),
            (1.0, LimitKey.RUN_QUERY, 429),
            (2.0, LimitKey.RUN_QUERY, 200),
            (3.0, LimitKey.INVITE, 200),
            (10.0, LimitKey.RUN_QUERY, 0),
        ]
    )
    return sandbox


def test_max_in_window_counts_only_its_key():
    """max_in_window counts arrivals of the given key only, in time order."""
    sandbox = hand_made_sandbox()
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 10.0) == 3
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 10.5) == 4
    assert max_in_window(sandbox, LimitKey.INVITE, 10.0) == 1
    assert max_in_window(sandbox, LimitKey.AVATAR, 10.0) == 0


def test_max_in_window_filters_by_status():
    """With statuses, max_in_window counts only arrivals answered with one of them."""
    sandbox = hand_made_sandbox()
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 10.0, statuses={200}) == 2
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 10.0, statuses={429}) == 1
    assert max_in_window(sandbox, LimitKey.RUN_QUERY, 20.0, statuses={0, 200}) == 4


# Faults


async def test_injected_429_has_no_retry_after():
    """An injected 429 carries the API body but no Retry-After."""
    app = create_app(rules=rules(), faults=Faults(rate_429=1.0, seed=1), clock=Clock())
    [response] = await post_times(app, 1)
    assert response.status_code == 429
    assert response.json() == API_429
    assert "Retry-After" not in response.headers


async def test_injected_server_errors_are_json_500_502_or_503():
    """Injected server errors are 500, 502 or 503 with a JSON error body."""
    app = create_app(rules=rules(), faults=Faults(rate_5xx=1.0, seed=3), clock=Clock())
    responses = await post_times(app, 30)
    assert {r.status_code for r in responses} == {500, 502, 503}
    assert all(r.json()["success"] is False for r in responses)
    assert [a.status for a in app.state.sandbox.arrivals] == [
        r.status_code for r in responses
    ]


async def test_fault_rates_are_roughly_right():
    """Over 200 requests, 429=0.2 and 5xx=0.3 inject about 40 and 60 faults."""
    faults = Faults(rate_429=0.2, rate_5xx=0.3, seed=11)
    app = create_app(rules=rules(run_query="200/1s"), faults=faults, clock=Clock())
    responses = await post_times(app, 200)
    seen = Counter("5xx" if r.status_code >= 500 else r.status_code for r in responses)
    assert 20 <= seen[429] <= 60
    assert 40 <= seen["5xx"] <= 80
    assert seen[200] == 200 - seen[429] - seen["5xx"]


async def test_seeded_faults_repeat():
    """The same seed injects the same faults in the same order."""

    async def statuses() -> list[int]:
        app = create_app(
            rules=rules(), faults=Faults(rate_5xx=0.5, seed=7), clock=Clock()
        )
        return [r.status_code for r in await post_times(app, 12)]

    first = await statuses()
    assert 200 in first
    assert len(set(first)) > 1
    assert await statuses() == first


async def test_injected_slow_answer_waits_slow_seconds():
    """An injected slow answer comes at least slow_seconds later, still accepted."""
    faults = Faults(rate_slow=1.0, slow_seconds=0.05, seed=1)
    app = create_app(rules=rules(), faults=faults, clock=Clock())
    started = time.monotonic()
    [response] = await post_times(app, 1)
    assert time.monotonic() - started >= 0.05
    assert response.status_code == 200


async def test_injected_drop_raises_in_process_and_records_0():
    """In process an injected drop raises Dropped; it is recorded with status 0."""
    app = create_app(rules=rules(), faults=Faults(rate_drop=1.0, seed=1), clock=Clock())
    async with client(app) as http:
        with pytest.raises(Dropped):
            await http.post(QUERY, json={})
    assert [a.status for a in app.state.sandbox.arrivals] == [0]


def test_injected_drop_over_loopback_is_a_protocol_error():
    """Over a real socket an injected drop reaches the client as a broken answer."""
    app = create_app(rules=rules(), faults=Faults(rate_drop=1.0, seed=1))
    with (
        running(app) as url,
        httpx.Client(base_url=url, timeout=5) as http,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        http.post(QUERY, json={})
    assert [a.status for a in app.state.sandbox.arrivals] == [0]


async def test_faults_count_against_the_limit():
    """An injected fault still uses up the budget: the server saw the request."""
    app = create_app(
        rules=rules(run_query="1/10s"), faults=Faults(rate_5xx=1.0), clock=Clock()
    )
    first, second = await post_times(app, 2)
    assert first.status_code >= 500
    assert second.status_code == 429
    assert second.headers["Retry-After"] == "10"


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"rate_429": -0.1}, id="negative"),
        pytest.param({"rate_5xx": 1.5}, id="above-one"),
        pytest.param({"rate_drop": float("nan")}, id="nan"),
        pytest.param({"rate_429": 0.6, "rate_slow": 0.5}, id="sum-above-one"),
        pytest.param({"slow_seconds": -1.0}, id="negative-slow-seconds"),
        pytest.param({"slow_seconds": float("inf")}, id="endless-slow-seconds"),
    ],
)
def test_faults_refuse_bad_values(kwargs):
    """Fault rates lie in 0..1 and add up to at most 1; slow_seconds is finite >= 0."""
    with pytest.raises(UsageError):
        Faults(**kwargs)


def test_faults_allow_rates_adding_up_to_one():
    """Rates that add up to 1 are allowed, float noise included."""
    faults = Faults(rate_429=0.1, rate_5xx=0.2, rate_drop=0.3, rate_slow=0.4)
    assert faults.rate_slow == 0.4


def test_parse_faults_reads_inject_values():
    """--inject values set the matching fault fields, seed as an integer."""
    faults = parse_faults(["429=0.05", "5xx=0.1", "seed=3", "slow-seconds=2"])
    assert faults == Faults(rate_429=0.05, rate_5xx=0.1, seed=3, slow_seconds=2.0)
    assert isinstance(faults.seed, int)


def test_parse_faults_reads_drop_and_slow():
    """drop and slow set their rates; later values win; nothing means no faults."""
    faults = parse_faults(["drop=0.9", " drop = 0.2 ", "slow=0.3"])
    assert (faults.rate_drop, faults.rate_slow) == (0.2, 0.3)
    assert parse_faults([]) == Faults()


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param("x=1", id="unknown-name"),
        pytest.param("429=abc", id="not-a-number"),
        pytest.param("429", id="no-value"),
        pytest.param("seed=1.5", id="fractional-seed"),
    ],
)
def test_parse_faults_refuses_bad_values_with_a_hint(spec):
    """A bad --inject value is named in the error, with the accepted names."""
    with pytest.raises(UsageError) as info:
        parse_faults([spec])
    assert repr(spec) in info.value.message
    assert "429, 5xx, drop, slow, slow-seconds, seed" in info.value.message


def test_parse_faults_refuses_out_of_range_rates():
    """A rate read from --inject is still checked against 0..1, and named."""
    with pytest.raises(UsageError, match=r"--inject .*within 0\.\.1.*5xx=2"):
        parse_faults(["5xx=2"])


# Serving


def test_running_serves_on_loopback_until_the_block_ends():
    """running() serves on 127.0.0.1; on exit its thread ends and the port closes."""
    app = create_app(rules=rules())
    before = set(threading.enumerate())
    with running(app) as url, httpx.Client(timeout=5) as http:
        assert url.startswith("http://127.0.0.1:")
        assert http.post(url + QUERY, json={"a": 1}).status_code == 200
        assert len(set(threading.enumerate()) - before) == 1
    assert set(threading.enumerate()) - before == set()
    with httpx.Client(timeout=5) as http, pytest.raises(httpx.ConnectError):
        http.post(url + QUERY, json={})


def test_serve_runs_uvicorn_on_the_given_address(monkeypatch):
    """serve() binds the address, announces its URL, and runs uvicorn on the socket."""
    seen: list[Any] = []
    announced: list[str] = []

    def run(self, sockets=None):
        seen.append((self.config, sockets[0].getsockname()))

    monkeypatch.setattr(uvicorn.Server, "run", run)
    app = create_app(rules=rules())
    serve(app, host="127.0.0.1", port=0, announce=announced.append)
    [(config, (host, port))] = seen
    assert (config.app, config.log_level, host) == (app, "warning", "127.0.0.1")
    assert announced == [f"http://127.0.0.1:{port}"]
