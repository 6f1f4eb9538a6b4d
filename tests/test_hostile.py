"""Hostile conditions: odd answers, huge or dripping bodies, secrets, paths.

Runner-level tests script the server with respx on trio's virtual clock, so a
15-minute Retry-After costs nothing; CLI tests run a whole `submit` against the
sandbox on loopback.
"""

from __future__ import annotations

import email.utils
import json
import sys
import time
from collections import Counter
from typing import Any

import anyio
import httpx
import pytest
import respx
import trio.testing
from typer.testing import CliRunner

from batchrun.api.client import BODY_LIMIT
from batchrun.api.hints import RETRY_AFTER_CAP
from batchrun.cli.commands import app
from batchrun.core.events import JobRequeued, JobSent, Status
from batchrun.core.limits import LimitKey, limit_table, parse_rule
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running
from batchrun.store.results import JobResult, ResultsFile
from support.doubles import ListSink
from tests.fakes import BASE, make_runner

QUERY = f"{BASE}/teams/t1/data/run-query"
TOKEN = "tok-HOSTILE-7c1e9d2a5b"
cli = CliRunner()


@pytest.fixture
def anyio_backend():
    """Virtual time: backoffs, Retry-After waits and dripping bodies cost nothing."""
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


class ResultsRecorder:
    """A recorder that writes each result to a real results file, and keeps it."""

    def __init__(self, results: ResultsFile) -> None:
        self.file = results
        self.results: list[JobResult] = []

    def started(self, job, attempt: int) -> None:
        pass

    def requeued(self, job, *, maybe_processed: bool) -> None:
        pass

    def finished(self, result: JobResult) -> None:
        self.file.write(result)
        self.results.append(result)


async def run_one(router, tmp_path, *, seconds=30.0, **settings):
    """Run one run-query job through Runner and Client into a results file.

    Returns (result, results-file lines as bytes, sink).
    """
    sink = ListSink()
    rules = {LimitKey.RUN_QUERY: parse_rule("100/1s")}
    path = tmp_path / "results.jsonl"
    with ResultsFile(path) as results:
        recorder = ResultsRecorder(results)
        async with make_runner(
            router,
            rules,
            sink,
            recorder=recorder,
            token=TOKEN,
            timeout=seconds,
            **settings,
        ) as runner:
            job = Job("a", JobType.RUN_QUERY, "t1", {"q": 1})
            await runner.run({LimitKey.RUN_QUERY: [job]}, {LimitKey.RUN_QUERY: 1})
    [result] = recorder.results
    return result, path.read_bytes(), sink


def strict_json(line: bytes):
    """Parse as a strict JSON reader would: no NaN or Infinity."""

    def refuse(name):
        raise ValueError(name)

    return json.loads(line, parse_constant=refuse)


# -- Odd 429s ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(httpx.Response(429), id="no-body"),
        pytest.param(httpx.Response(429, text="<h1>Slow down</h1>"), id="html"),
        pytest.param(httpx.Response(429, json=["too", "many"]), id="json-array"),
        pytest.param(httpx.Response(429, json={"detail": "later"}), id="other-shape"),
        pytest.param(httpx.Response(429, content=b"\xff\xfe\x00"), id="binary"),
        pytest.param(
            httpx.Response(429, content=b"[" * 50_000), id="deeply-nested-json"
        ),
    ],
)
async def test_odd_429_bodies_requeue_and_the_job_ends_done(tmp_path, answer):
    """A 429 whatever its body is requeued, and the retry ends the job done."""
    router = respx.Router()
    router.post(QUERY).side_effect = [answer, httpx.Response(200, json={"ok": 1})]
    result, _, sink = await run_one(router, tmp_path)
    assert (result.status, result.attempts, result.response) == (
        Status.DONE,
        2,
        {"ok": 1},
    )
    assert [e.rate_limited for e in sink.of(JobRequeued)] == [True]


def http_date_in(seconds):
    return email.utils.formatdate(time.time() + seconds, usegmt=True)


@pytest.mark.parametrize(
    ("retry_after", "low", "high"),
    [
        # Seconds are covered by tests/test_runner.py.
        pytest.param(lambda: http_date_in(60), 58.9, 60.0, id="http-date"),
        # Ignored, it is a lone 429 with none: it waits for nothing.
        pytest.param(lambda: "in a bit", 0.0, 0.0, id="malformed-ignored"),
        pytest.param(lambda: "-3", 0.0, 0.0, id="negative-ignored"),
        pytest.param(
            lambda: "86400", RETRY_AFTER_CAP, RETRY_AFTER_CAP, id="absurd-capped"
        ),
        pytest.param(
            lambda: http_date_in(10 * 86400),
            RETRY_AFTER_CAP,
            RETRY_AFTER_CAP,
            id="far-date-capped",
        ),
    ],
)
async def test_retry_after_forms_set_the_wait_before_the_retry(
    tmp_path, retry_after, low, high
):
    """An HTTP date is honoured, a malformed value is ignored (a lone 429 with
    no Retry-After waits for nothing), an absurd one is capped."""

    def too_many(request):
        return httpx.Response(429, headers={"Retry-After": retry_after()})

    router = respx.Router()
    answers: list[Any] = [too_many, httpx.Response(200, json={})]
    router.post(QUERY).side_effect = answers
    result, _, sink = await run_one(router, tmp_path, backoff=1.0)
    [requeued] = sink.of(JobRequeued)
    first, second = (e.at for e in sink.of(JobSent))
    assert low <= requeued.delay <= high
    assert second - first == pytest.approx(requeued.delay)
    assert result.status is Status.DONE


# -- Odd 2xx bodies ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "kept"),
    [
        pytest.param(b"OK, queued.", "OK, queued.", id="plain-text"),
        pytest.param(b"caf\xe9", "caf\ufffd", id="not-utf8"),
        pytest.param(b'{"rows": NaN}', '{"rows": NaN}', id="nan"),
        pytest.param(b'{"rows": 1e999}', '{"rows": 1e999}', id="overflow"),
        pytest.param(b'{"s": "\\ud800"}', '{"s": "\\ud800"}', id="lone-surrogate"),
        pytest.param(b"[" * 50_000, "[" * 50_000, id="nested-too-deep"),
        pytest.param(b"9" * 5000, "9" * 5000, id="huge-integer"),
    ],
)
async def test_2xx_bodies_that_are_not_strict_json_are_kept_as_text(
    tmp_path, content, kept
):
    """A 2xx whose body is not storable JSON is done, its body kept as text."""
    router = respx.Router()
    router.post(QUERY).respond(200, content=content)
    result, raw, _ = await run_one(router, tmp_path)
    [line] = raw.splitlines()
    stored = strict_json(line)
    assert (stored["status"], stored["response"][:1000]) == ("done", kept[:1000])
    assert result.status is Status.DONE


# Not on trio: httpx's nested body iterators, left unexhausted on purpose, would
# draw trio's ResourceWarning; asyncio (what `batchrun submit` runs on) closes them.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_huge_body_is_read_only_up_to_the_limit(tmp_path):
    """A 50 MB answer is cut after 64 KiB: the rest is never read, a note says so."""
    pulled = 0

    async def endless():
        nonlocal pulled
        for _ in range(800):
            pulled += 1
            yield b"x" * 65536

    router = respx.Router()
    router.post(QUERY).side_effect = lambda request: httpx.Response(
        200, content=endless()
    )
    result, raw, _ = await run_one(router, tmp_path)
    assert pulled <= 2
    assert len(result.response) == BODY_LIMIT
    assert (
        result.note == f"body of more than {BODY_LIMIT} bytes truncated to {BODY_LIMIT}"
    )
    assert len(raw) < 2 * BODY_LIMIT


async def test_an_answer_dripping_past_the_timeout_times_out(tmp_path):
    """A body sent a byte every 0.5 s is a timeout once --timeout is spent in all."""

    async def drip():
        for _ in range(100):
            await anyio.sleep(0.5)
            yield b" "

    router = respx.Router()
    router.post(QUERY).side_effect = lambda request: httpx.Response(200, content=drip())
    start = anyio.current_time()
    result, _, _ = await run_one(router, tmp_path, seconds=3.0, max_attempts=1)
    assert (result.status, result.error) == (
        Status.FAILED,
        "timeout (no complete answer within 3 s)",
    )
    assert anyio.current_time() - start == pytest.approx(3.0)


# -- Secrets -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            lambda request: httpx.Response(
                200, json={"headers": dict(request.headers.items())}
            ),
            id="2xx-json-echo",
        ),
        pytest.param(
            lambda request: httpx.Response(
                404, text=f"no route; you sent {request.headers['authorization']}"
            ),
            id="4xx-text-echo",
        ),
    ],
)
async def test_a_token_echoed_by_the_server_is_not_stored(tmp_path, answer):
    """A server echoing the Authorization header leaves no token in the results."""
    router = respx.Router()
    router.post(QUERY).side_effect = answer
    result, raw, _ = await run_one(router, tmp_path)
    assert TOKEN.encode() not in raw
    assert "[token]" in json.dumps(result.response)
    assert "token was echoed" in result.note


def jobs_file(tmp_path, rows):
    path = tmp_path / "jobs.csv"
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def files_holding(folder, secret: bytes):
    return [p for p in folder.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_a_whole_submit_leaves_the_token_nowhere(tmp_path):
    """After a submit, the token is in no output, results or state file."""
    path = jobs_file(tmp_path, ["a,run-query,t1,", "b,invite,t1,", "c,avatar,,"])
    server = create_app(rules=limit_table())
    state = tmp_path / "state"
    with running(server) as url:
        result = cli.invoke(
            app,
            ["submit", str(path), "--base-url", url, "--state-dir", str(state)],
            env={"BATCHRUN_TOKEN": TOKEN},
        )
    assert result.exit_code == 0, result.stderr
    assert [a.status for a in server.state.sandbox.arrivals] == [200] * 3
    assert TOKEN.encode() not in result.stdout_bytes + result.stderr_bytes
    assert any(state.rglob("*.db"))
    assert files_holding(tmp_path, TOKEN.encode()) == []


def test_an_internal_error_mid_run_shows_no_token(tmp_path, monkeypatch, capsys):
    """An unexpected exception mid-run prints one line with no token, no traceback."""
    import batchrun.cli.commands
    import batchrun.store.results

    def broken(self, result):
        msg = "disk on fire"
        raise RuntimeError(msg)

    path = jobs_file(tmp_path, ["a,run-query,t1,"])
    server = create_app(rules=limit_table())
    monkeypatch.setenv("BATCHRUN_TOKEN", TOKEN)
    monkeypatch.setattr(batchrun.store.results.ResultsFile, "write", broken)
    with running(server) as url:
        monkeypatch.setattr(
            sys,
            "argv",
            [
                "batchrun",
                "submit",
                str(path),
                "--base-url",
                url,
                "--state-dir",
                str(tmp_path / "state"),
            ],
        )
        with pytest.raises(SystemExit) as info:
            batchrun.cli.commands.main()
    out, err = capsys.readouterr()
    assert info.value.code == 70  # a bug: never 1, "some jobs failed"
    assert len(server.state.sandbox.arrivals) == 1
    assert "internal error: RuntimeError: disk on fire" in err
    assert "Traceback" not in out + err
    assert TOKEN not in out + err
    assert files_holding(tmp_path, TOKEN.encode()) == []


# -- Paths -------------------------------------------------------------------------


def test_odd_but_legal_team_ids_reach_only_their_own_endpoint(tmp_path):
    """Team ids of dots, tildes and dashes each land on their own endpoint, intact."""
    teams = {"q1": ".hidden", "q2": "a..b", "q3": "~", "i1": "x~y", "i2": "-_-."}
    rows = [
        f"{i},{'invite' if i[0] == 'i' else 'run-query'},{t}," for i, t in teams.items()
    ]
    path = jobs_file(tmp_path, [*rows, "v1,avatar,,"])
    server = create_app(rules=limit_table())
    with running(server) as url:
        result = cli.invoke(app, ["submit", str(path), "--base-url", url])
    assert result.exit_code == 0, result.stderr
    arrivals = server.state.sandbox.arrivals
    assert Counter((a.key, a.status) for a in arrivals) == {
        (LimitKey.RUN_QUERY, 200): 3,
        (LimitKey.INVITE, 200): 2,
        (LimitKey.AVATAR, 200): 1,
    }
    lines = [
        json.loads(x)
        for x in (tmp_path / "jobs.results.jsonl").read_text().splitlines()
    ]
    echoed = {x["id"]: x["response"]["data"]["team_id"] for x in lines}
    assert echoed == {**teams, "v1": None}


def test_a_team_id_that_could_leave_its_segment_stops_the_whole_file(tmp_path):
    """A file with `../x`, `a/b`, `%2e%2e` and the like is refused; nothing is sent."""
    hostile = ["../x", "a/b", "%2e%2e", "..", "a b", "a?b", "a#b", "a\\b"]
    rows = ["ok,run-query,t1,"] + [
        f"h{n},run-query,{t}," for n, t in enumerate(hostile)
    ]
    server = create_app(rules=limit_table())
    with running(server) as url:
        result = cli.invoke(
            app, ["submit", str(jobs_file(tmp_path, rows)), "--base-url", url]
        )
    assert result.exit_code == 2
    for line in range(3, 3 + len(hostile)):
        assert f"line {line}: team_id" in result.stderr
    assert server.state.sandbox.arrivals == []
