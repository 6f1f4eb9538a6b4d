"""The runner and client together, against respx-scripted answers on a virtual clock."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
import respx
import trio.testing

from batchrun.api.breaker import TRIP_AFTER
from batchrun.core.errors import DiskFull, LedgerLost
from batchrun.core.events import (
    Event,
    JobAnswered,
    JobFinished,
    JobRequeued,
    JobSent,
    RunFinished,
    RunTally,
    Status,
    Tally,
)
from batchrun.core.limits import LimitKey, parse_rule
from batchrun.jobs.endpoints import JobType, Method
from batchrun.jobs.job import Job
from batchrun.pacing.learner import Learner
from batchrun.pacing.ledger import MemoryLedger
from batchrun.run.exit_code import Cause
from batchrun.run.journal import Journal
from batchrun.store.results import ResultsFile
from batchrun.store.state import RunStore
from support.doubles import ListRecorder, ListSink
from tests.fakes import BASE, make_runner

QUERY = f"{BASE}/teams/t1/data/run-query"


@pytest.fixture
def anyio_backend():
    """Virtual time: backoffs and Retry-After waits cost nothing."""
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


def query(job_id: str) -> Job:
    return Job(job_id, JobType.RUN_QUERY, "t1", {"q": job_id})


async def run_jobs(router, jobs, *, rule="100/1s", recorder=None, **settings):
    """Run `jobs` (all run-query) through a Runner; return (tally, recorder, sink)."""
    sink, recorder = ListSink(), recorder or ListRecorder()
    rules = {LimitKey.RUN_QUERY: parse_rule(rule)}
    async with make_runner(
        router, rules, sink, recorder=recorder, token="s3cret", **settings
    ) as runner:
        tally = await runner.run(
            {LimitKey.RUN_QUERY: jobs}, {LimitKey.RUN_QUERY: len(jobs)}
        )
    return tally, recorder, sink


async def test_2xx_is_done_with_body_kept():
    """A 2xx marks the job done and keeps the parsed body."""
    router = respx.Router(assert_all_called=True)
    router.post(QUERY).respond(200, json={"rows": 3})
    tally, recorder, _ = await run_jobs(router, [query("a")])
    assert tally == Tally(done=1, total=1)
    [result] = recorder.results
    assert (result.status, result.attempts, result.http_status) == (Status.DONE, 1, 200)
    assert result.response == {"rows": 3}


async def test_request_carries_token_payload_and_idempotency_key():
    """The request has the bearer token, the JSON payload and an Idempotency-Key."""
    router = respx.Router()
    route = router.post(QUERY).respond(200, json={})
    await run_jobs(router, [query("a")])
    request = route.calls.last.request
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert json.loads(request.content) == {"q": "a"}
    assert request.headers["Idempotency-Key"].startswith("batchrun-")


async def test_429_with_retry_after_waits_that_long_then_retries():
    """A 429 with Retry-After: 7 requeues the job 7 s later; the retry succeeds."""
    router = respx.Router()
    route = router.post(QUERY)
    route.side_effect = [
        httpx.Response(429, headers={"Retry-After": "7"}, json={"success": False}),
        httpx.Response(200, json={}),
    ]
    start = anyio.current_time()
    tally, recorder, sink = await run_jobs(router, [query("a")])
    sends = [e.at - start for e in sink.of(JobSent)]
    assert sends == pytest.approx([0, 7])
    assert tally.rate_limited == 1
    assert recorder.results[0].attempts == 2


async def test_429_cools_the_whole_key_down():
    """After a 429, the key's other jobs wait for the delay too."""
    router = respx.Router()
    route = router.post(QUERY)
    route.side_effect = [
        httpx.Response(429, headers={"Retry-After": "5"}),
        httpx.Response(200, json={}),
        httpx.Response(200, json={}),
    ]
    start = anyio.current_time()
    _, _, sink = await run_jobs(router, [query("a"), query("b")], concurrency=1)
    sends = [e.at - start for e in sink.of(JobSent)]
    assert sends == pytest.approx([0, 5, 5])


async def test_429_without_retry_after_backs_off_exponentially():
    """A lone 429 with no Retry-After waits for nothing (the learner reads it;
    a lone 429 never changes the pace); the next ones in a row wait from the
    interval of the rule in force (0.6 s at 100/1m, longer once the learner
    reads a stricter one), doubling, with jitter, never past its longest
    window."""
    router = respx.Router()
    route = router.post(QUERY)
    route.side_effect = [httpx.Response(429)] * 3 + [httpx.Response(200, json={})]
    _, _, sink = await run_jobs(router, [query("a")], rule="100/1m", backoff=1.0)
    delays = [e.delay for e in sink.of(JobRequeued)]
    assert delays[0] == 0.0
    assert 0.3 <= delays[1] <= 0.6
    assert delays[1] <= delays[2] <= 60.0
    assert all(e.rate_limited for e in sink.of(JobRequeued))


async def test_429_backoff_is_bounded_by_the_keys_longest_window():
    """Without Retry-After, a key never cools down longer than its longest window."""
    router = respx.Router()
    route = router.post(QUERY)
    route.side_effect = [httpx.Response(429)] * 12 + [httpx.Response(200, json={})]
    _, _, sink = await run_jobs(router, [query("a")], rule="100/2s", backoff=1.0)
    delays = [e.delay for e in sink.of(JobRequeued)]
    assert max(delays) <= 2.0
    # From 0.02 s, the eighth doubling passes the window: half of it, with jitter.
    assert min(delays[9:]) >= 1.0


async def test_a_burst_of_concurrent_429s_is_one_cool_down():
    """Eight requests in flight all answered 429 deepen the backoff once, not eight
    times: each is requeued to the end of the one cool-down."""
    calls = 0

    async def refuse_the_second_eight(request):
        nonlocal calls
        calls += 1
        if calls <= 8:
            return httpx.Response(200, json={})  # the server takes 8 per second
        await anyio.sleep(0.1)  # so that the next eight are in flight together
        return httpx.Response(429 if calls <= 16 else 200, json={})

    router = respx.Router()
    router.post(QUERY).side_effect = refuse_the_second_eight
    jobs = [query(f"j{n}") for n in range(16)]
    _, _, sink = await run_jobs(router, jobs, rule="8/1s", backoff=1.0)
    requeued = sink.of(JobRequeued)
    assert len(requeued) == 8
    # One 429 of the streak, not eight: a lone one waits for nothing, and the
    # seven sent before it began only wait for that.
    assert [e.delay for e in requeued] == [0.0] * 8


# 13 to 19 s alone on a busy 2-core machine (1,100 answers, each read).
@pytest.mark.timeout(180)
async def test_a_server_that_answers_429_for_ever_does_not_crash_the_backoff():
    """1,100 consecutive 429s (an exhausted daily quota) back off without overflow."""
    router = respx.Router()
    route = router.post(QUERY)
    route.side_effect = [httpx.Response(429)] * 1100 + [httpx.Response(200, json={})]
    tally, _, _ = await run_jobs(router, [query("a")], rule="100/1s", backoff=1.0)
    assert (tally.done, tally.rate_limited) == (1, 1100)


async def test_5xx_then_2xx_retries_and_succeeds():
    """A 503 is retried with backoff, and the job ends done after 2 attempts."""
    router = respx.Router()
    router.post(QUERY).side_effect = [httpx.Response(503), httpx.Response(200, json={})]
    tally, recorder, _ = await run_jobs(router, [query("a")])
    assert (tally.done, tally.retried) == (1, 1)
    assert recorder.results[0].attempts == 2


async def test_other_4xx_fails_without_retry():
    """A 404 fails the job at once, keeping the status, body and server's word."""
    router = respx.Router()
    route = router.post(QUERY).respond(404, json={"error": "no team"})
    tally, recorder, _ = await run_jobs(router, [query("a")])
    assert route.call_count == 1
    assert tally == Tally(failed=1, total=1)
    [result] = recorder.results
    assert result.error == "HTTP 404 Not Found; no team"
    assert result.response == {"error": "no team"}


async def test_transient_errors_fail_after_max_attempts():
    """Timeouts retry, then fail after --max-attempts tries."""
    router = respx.Router()
    route = router.post(QUERY)
    route.side_effect = httpx.ReadTimeout("slow")
    tally, recorder, _ = await run_jobs(router, [query("a")], max_attempts=3)
    assert route.call_count == 3
    assert tally == Tally(failed=1, retried=2, total=1)
    assert recorder.results[0].attempts == 3


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(httpx.ConnectError("refused"), id="connect-error"),
        pytest.param(httpx.Response(401), id="401"),
        pytest.param(httpx.Response(403), id="403"),
    ],
)
async def test_a_fault_every_request_meets_leaves_its_jobs_to_send(answer):
    """A configuration fault fails no job, even past --max-attempts: the breaker
    trips after TRIP_AFTER in a row and every job, those in flight included, is
    left to send (requeued, never finished)."""
    router = respx.Router()
    route = router.post(QUERY)
    if isinstance(answer, Exception):
        route.side_effect = answer
    else:
        route.side_effect = lambda request: answer
    jobs = [query(f"q{i}") for i in range(8)]
    sink, recorder = ListSink(), ListRecorder()
    rules = {LimitKey.RUN_QUERY: parse_rule("100/1s")}
    async with make_runner(
        router, rules, sink, recorder=recorder, max_attempts=1, concurrency=3
    ) as runner:
        tally = await runner.run({LimitKey.RUN_QUERY: jobs}, {LimitKey.RUN_QUERY: 8})
    assert runner.breaker.tripped is not None
    assert runner.stopped.reason(Cause.BREAKER) == runner.breaker.tripped
    assert recorder.results == []
    assert (tally.done, tally.failed, tally.unknown) == (0, 0, 0)
    assert TRIP_AFTER <= route.call_count < TRIP_AFTER + 3


async def test_a_403_for_one_team_alone_ends_its_job_failed():
    """A 403 that other requests do not meet is the job's: it ends failed after
    TRIP_AFTER tries (at least --max-attempts), the others done, no trip."""
    router = respx.Router()
    refused = router.post(f"{BASE}/teams/t2/data/run-query").respond(403)
    router.post(QUERY).respond(200, json={})
    other = Job("x", JobType.RUN_QUERY, "t2", {})
    jobs = [other, *(query(f"q{i}") for i in range(20))]
    tally, recorder, _ = await run_jobs(router, jobs, max_attempts=2)
    assert refused.call_count == TRIP_AFTER
    assert (tally.done, tally.failed) == (20, 1)
    [failed] = [r for r in recorder.results if r.status is Status.FAILED]
    assert (failed.id, failed.http_status) == ("x", 403)


INVITE = f"{BASE}/teams/t1/members/invite"


async def run_invites(router, jobs, **settings):
    """Run invite jobs through a Runner; return (tally, recorder)."""
    sink, recorder = ListSink(), ListRecorder()
    rules = {LimitKey.INVITE: parse_rule("100/1s")}
    async with make_runner(router, rules, sink, recorder=recorder, **settings) as run:
        tally = await run.run({LimitKey.INVITE: jobs}, {LimitKey.INVITE: len(jobs)})
    return tally, recorder


def invite(job_id: str) -> Job:
    return Job(job_id, JobType.INVITE, "t1", {"email": f"{job_id}@x.test"})


async def invite_answered(answer):
    """One invite whose first try gets `answer` and any next one a 200, at most
    3 attempts; return (route, tally, recorder)."""
    router = respx.Router()
    route = router.post(INVITE)
    route.side_effect = [answer, httpx.Response(200, json={})]
    tally, recorder = await run_invites(router, [invite("i")], max_attempts=3)
    return route, tally, recorder


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(httpx.ReadTimeout("slow"), id="read-timeout"),
        pytest.param(httpx.RemoteProtocolError("cut"), id="dropped"),
        pytest.param(httpx.Response(500), id="500"),
        pytest.param(httpx.Response(503), id="503-without-retry-after"),
    ],
)
async def test_an_invite_that_may_have_been_processed_is_unknown_at_once(answer):
    """After a timeout, a dropped answer or a 5xx, an invite is not sent again."""
    route, tally, recorder = await invite_answered(answer)
    assert route.call_count == 1
    assert tally == Tally(unknown=1, total=1)
    [result] = recorder.results
    assert result.status is Status.UNKNOWN
    assert "--retry-unknown" in (result.note or "")


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(httpx.ConnectError("refused"), id="connect-refused"),
        pytest.param(httpx.ConnectTimeout("no syn-ack"), id="connect-timeout"),
        pytest.param(
            httpx.Response(503, headers={"Retry-After": "1"}), id="503-retry-after"
        ),
    ],
)
async def test_an_invite_that_never_reached_the_server_is_retried(answer):
    """A connection never made, or a 503 with Retry-After, retries an invite."""
    route, tally, recorder = await invite_answered(answer)
    assert route.call_count == 2
    assert (tally.done, tally.unknown) == (1, 0)
    assert recorder.maybe_processed == [False]


async def test_the_store_is_told_a_requeued_request_may_have_been_processed():
    """A run-query retried after a 5xx is requeued as maybe processed."""
    router = respx.Router()
    router.post(QUERY).side_effect = [httpx.Response(500), httpx.Response(200)]
    _, recorder, _ = await run_jobs(router, [query("a")])
    assert recorder.maybe_processed == [True]


async def test_timeout_error_is_named_in_the_result():
    """A job that timed out says so in its error."""
    router = respx.Router()
    router.post(QUERY).side_effect = httpx.ReadTimeout("slow")
    _, recorder, _ = await run_jobs(router, [query("a")], max_attempts=1)
    assert recorder.results[0].error == "timeout (ReadTimeout)"


async def test_concurrency_bounds_requests_in_flight():
    """With --concurrency 2, never more than 2 requests are in flight (once six
    quick answers have shown the server takes six per second)."""
    in_flight = peak = calls = 0

    async def slow(request):
        nonlocal in_flight, peak, calls
        calls += 1
        if calls <= 6:
            return httpx.Response(200, json={})
        in_flight += 1
        peak = max(peak, in_flight)
        await anyio.sleep(1)
        in_flight -= 1
        return httpx.Response(200, json={})

    router = respx.Router()
    router.post(QUERY).side_effect = slow
    tally, _, _ = await run_jobs(
        router, [query(str(i)) for i in range(12)], concurrency=2
    )
    assert (tally.done, peak) == (12, 2)


async def test_pacing_holds_under_the_runner():
    """The runner's sends keep to the rule: 5 jobs at 2/1s leave at 0, 0, 1, 1, 2."""
    router = respx.Router()
    router.post(QUERY).respond(200, json={})
    start = anyio.current_time()
    jobs = [query(str(i)) for i in range(5)]
    _, _, sink = await run_jobs(router, jobs, rule="2/1s")
    assert [e.at - start for e in sink.of(JobSent)] == pytest.approx([0, 0, 1, 1, 2])


async def test_stop_before_run_sends_nothing_and_reports_left():
    """A runner stopped before it starts sends nothing and says jobs are left."""
    router = respx.Router()
    route = router.post(QUERY).respond(200, json={})
    sink = ListSink()
    rules = {LimitKey.RUN_QUERY: parse_rule("1/1s")}
    async with make_runner(router, rules, sink) as runner:
        runner.stop()
        tally = await runner.run(
            {LimitKey.RUN_QUERY: [query("a")]}, {LimitKey.RUN_QUERY: 1}
        )
    assert route.call_count == 0
    assert sink.of(RunFinished)[0].stopped
    assert tally.left == 1


async def test_results_file_holds_one_json_line_per_job(tmp_path):
    """Every finished job is one JSON line in the results file."""
    router = respx.Router()
    router.post(QUERY).side_effect = [
        httpx.Response(200, json={"ok": 1}),
        httpx.Response(400, text="bad query"),
    ]
    path = tmp_path / "jobs.results.jsonl"
    with ResultsFile(path) as results, RunStore(":memory:") as store:
        journal = Journal(store, results)
        await run_jobs(
            router, [query("a"), query("b")], recorder=journal, concurrency=1
        )
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(x["id"], x["status"], x["http_status"]) for x in lines] == [
        ("a", "done", 200),
        ("b", "failed", 400),
    ]
    assert lines[1]["response"] == "bad query"
    assert "s3cret" not in path.read_text()


async def test_state_is_recorded_before_the_send_and_after_the_answer():
    """The recorder hears of a start before the request leaves, then of its end."""
    seen = []
    recorder = ListRecorder()

    async def answer(request):
        seen.append(list(recorder.log))
        return httpx.Response(429) if len(seen) == 1 else httpx.Response(200, json={})

    router = respx.Router()
    router.post(QUERY).side_effect = answer
    await run_jobs(router, [query("a")], recorder=recorder)
    assert seen[0] == [("started", "a")]
    assert recorder.log == [
        ("started", "a"),
        ("requeued", "a"),
        ("started", "a"),
        ("finished", "a"),
    ]


async def test_a_key_waiting_for_its_slot_does_not_hold_up_another():
    """Invites at 1/10s wait their turn while every query goes at once."""
    router = respx.Router()
    router.post(QUERY).respond(200, json={})
    router.post(INVITE).respond(200, json={})
    rules = {
        LimitKey.RUN_QUERY: parse_rule("100/1s"),
        LimitKey.INVITE: parse_rule("1/10s"),
    }
    sink = ListSink()
    start = anyio.current_time()
    jobs = {
        LimitKey.INVITE: [invite(f"i{n}") for n in range(3)],
        LimitKey.RUN_QUERY: [query(f"q{n}") for n in range(20)],
    }
    async with make_runner(router, rules, sink, concurrency=2) as runner:
        tally = await runner.run(jobs, {k: len(v) for k, v in jobs.items()})
    assert tally.done == 23
    sent = {e.job_id: e.at - start for e in sink.of(JobSent)}
    assert max(sent[f"q{n}"] for n in range(20)) == pytest.approx(0)
    assert [sent[f"i{n}"] for n in range(3)] == pytest.approx([0, 10, 20])


async def test_the_tally_counts_each_key_before_a_listener_hears_of_it():
    """The run's tally (one its view reads too) counts each key's jobs from the
    runner's events before the sink hears them: a listener reads each end
    counted. `run` returns every key's counts added up."""
    router = respx.Router()
    router.post(QUERY).respond(200, json={})
    router.post(INVITE).respond(400, json={})
    rules = {
        LimitKey.RUN_QUERY: parse_rule("100/1s"),
        LimitKey.INVITE: parse_rule("100/1s"),
    }
    tally = RunTally()
    ended: list[int] = []

    class Reader:
        def emit(self, event: Event) -> None:
            if isinstance(event, JobFinished):
                ended.append(tally.whole().ended)

    jobs = {
        LimitKey.INVITE: [invite("i")],
        LimitKey.RUN_QUERY: [query("a"), query("b")],
    }
    async with make_runner(router, rules, Reader(), tally=tally) as runner:
        whole = await runner.run(jobs, {k: len(v) for k, v in jobs.items()})
    assert runner.tally is tally
    assert tally.keys == {
        LimitKey.RUN_QUERY: Tally(total=2, done=2),
        LimitKey.INVITE: Tally(total=1, failed=1),
    }
    assert whole == Tally(total=3, done=2, failed=1)
    assert ended == [1, 2, 3]


async def test_stop_ends_the_waits_and_lets_requests_in_flight_finish():
    """Stopped while one request is in flight and others wait for slots: the one in
    flight ends done, nothing more is sent, and the run returns at once."""
    answered = anyio.Event()

    async def slow(request):
        await anyio.sleep(5)
        answered.set()
        return httpx.Response(200, json={})

    router = respx.Router()
    router.post(QUERY).side_effect = slow
    router.post(INVITE).side_effect = slow
    rules = {
        LimitKey.RUN_QUERY: parse_rule("1/1m"),
        LimitKey.INVITE: parse_rule("1/1m"),
    }
    sink = ListSink()
    jobs = {
        LimitKey.RUN_QUERY: [query(f"q{n}") for n in range(3)],
        LimitKey.INVITE: [invite(f"i{n}") for n in range(3)],
    }
    start = anyio.current_time()
    async with (
        make_runner(router, rules, sink, concurrency=4) as runner,
        anyio.create_task_group() as tasks,
    ):

        async def stop_soon() -> None:
            await anyio.sleep(1)
            runner.stop()

        tasks.start_soon(stop_soon)
        tally = await runner.run(jobs, {k: len(v) for k, v in jobs.items()})
    assert answered.is_set()
    assert (tally.done, tally.left) == (2, 4)
    assert anyio.current_time() - start == pytest.approx(5)
    assert sink.of(RunFinished)[0].stopped


def test_a_queue_hands_out_its_retry_even_if_the_clock_stepped_back():
    """Checked as due at 10 s, taken at 9 s (the wall clock stepped back): the
    retry is handed out, not lost."""
    from batchrun.run.queues import Attempt, KeyQueue

    queue = KeyQueue(iter([]))
    retry = Attempt(query("a"), attempts=1)
    queue.retries.append((10.0, 0, retry))
    assert queue.due() == 10.0
    assert queue.pop(9.0) is retry
    assert queue.due() is None


class LosingLedger(MemoryLedger):
    """A ledger whose shared store goes away after `grants` grants."""

    def __init__(self, grants: int) -> None:
        super().__init__()
        self.left = grants

    def reserve(self, key, rule, pace, now, hold=None):
        if self.left == 0:
            msg = "cannot use the ledger at redis://h:6379/0: gone"
            raise LedgerLost(msg)
        self.left -= 1
        return super().reserve(key, rule, pace, now, hold)


async def test_a_ledger_lost_mid_run_stops_starting_requests():
    """LedgerLost from a slot: the requests in flight end, no other starts, and
    the runner says why it stopped."""
    router = respx.Router(assert_all_called=True)
    router.post(QUERY).respond(200, json={})
    sink, recorder = ListSink(), ListRecorder()
    rules = {LimitKey.RUN_QUERY: parse_rule("100/1s")}
    jobs = [query(str(n)) for n in range(6)]
    async with make_runner(
        router, rules, sink, recorder=recorder, ledger=LosingLedger(2), concurrency=2
    ) as runner:
        tally = await runner.run({LimitKey.RUN_QUERY: jobs}, {LimitKey.RUN_QUERY: 6})
    assert tally == Tally(done=2, total=6)
    assert len(sink.of(JobSent)) == 2
    assert runner.stopped is not None
    assert runner.stopped.cause is Cause.LEDGER_LOST
    assert "redis://h:6379/0" in runner.stopped.reason(Cause.LEDGER_LOST)


async def test_a_ledger_write_of_the_learner_that_fails_stops_the_run(monkeypatch):
    """A full disk as the learner keeps a lesson in the ledger stops the run as a
    lost slot does: the answers in flight are settled, and no error escapes the
    run (it used to end it at once, saying nothing of the stop)."""

    def full(*args, **kwargs):
        msg = "/state/ledger.db: the disk is full"
        raise DiskFull(msg)

    monkeypatch.setattr(Learner, "answered", full)
    router = respx.Router()
    router.post(QUERY).respond(200, json={})
    sink, recorder = ListSink(), ListRecorder()
    rules = {LimitKey.RUN_QUERY: parse_rule("100/1s")}
    jobs = [query(str(n)) for n in range(6)]
    async with make_runner(
        router, rules, sink, recorder=recorder, concurrency=2
    ) as runner:
        tally = await runner.run({LimitKey.RUN_QUERY: jobs}, {LimitKey.RUN_QUERY: 6})
    assert runner.stopped is not None
    assert runner.stopped.cause is Cause.STATE
    assert isinstance(runner.stopped.error, DiskFull)
    assert 1 <= tally.done == len(recorder.results) <= 2


async def test_transient_backoff_is_capped():
    """Server errors back off exponentially up to --backoff-cap, never beyond."""
    router = respx.Router()
    route = router.post(QUERY)
    route.side_effect = [httpx.Response(500)] * 7 + [httpx.Response(200, json={})]
    _, _, sink = await run_jobs(
        router, [query("a")], backoff=1.0, backoff_cap=4.0, max_attempts=10
    )
    delays = [e.delay for e in sink.of(JobRequeued)]
    assert len(delays) == 7
    assert max(delays) <= 4.0
    assert min(delays[3:]) >= 2.0  # steps 8, 16, ... capped to 4, halved by jitter


async def test_backoff_is_jittered_between_half_and_all_of_the_step():
    """Equal jitter: first retries of many jobs spread over [step/2, step], so
    they do not come back all at once."""
    router = respx.Router()
    seen: set[str] = set()

    def first_fails(request):
        key = request.headers["Idempotency-Key"]
        if key in seen:
            return httpx.Response(200, json={})
        seen.add(key)
        return httpx.Response(500)

    router.post(QUERY).side_effect = first_fails
    jobs = [query(f"j{n}") for n in range(20)]
    _, _, sink = await run_jobs(router, jobs, backoff=2.0, concurrency=20)
    delays = [e.delay for e in sink.of(JobRequeued)]
    assert len(delays) == 20
    assert all(1.0 <= d <= 2.0 for d in delays)
    assert max(delays) - min(delays) > 0.5  # spread, not one moment


async def test_the_429_streak_resets_after_an_answer_that_is_not_429():
    """After a 2xx, the next 429 starts the streak again: lone, it waits for
    nothing."""
    router = respx.Router()
    route = router.post(QUERY)
    no = httpx.Response(429)
    ok = httpx.Response(200, json={})
    route.side_effect = [no, no, no, ok, no, ok]
    _, _, sink = await run_jobs(
        router, [query("a"), query("b")], rule="100/1m", backoff=1.0, concurrency=1
    )
    delays = [e.delay for e in sink.of(JobRequeued)]
    assert len(delays) == 4
    assert 0 < delays[1] <= delays[2]  # the second and third in a row back off
    assert delays[3] == 0.0  # after the 2xx: a lone one again


async def test_a_request_that_never_reached_the_server_spends_no_budget():
    """At 2/1m, two refused connections and then two answers take no minute: the
    refused ones never reached the server, so their slots are given back."""
    router = respx.Router()
    route = router.post(QUERY)
    route.side_effect = [
        httpx.ConnectError("refused"),
        httpx.ConnectError("refused"),
        httpx.Response(200, json={}),
        httpx.Response(200, json={}),
    ]
    sink = ListSink()
    rules = {LimitKey.RUN_QUERY: parse_rule("2/1m")}
    jobs = [Job(f"q{i}", JobType.RUN_QUERY, "t1", {}) for i in range(2)]
    start = anyio.current_time()
    async with make_runner(router, rules, sink, backoff=0.01) as runner:
        tally = await runner.run({LimitKey.RUN_QUERY: jobs}, {LimitKey.RUN_QUERY: 2})
    assert tally.done == 2
    assert anyio.current_time() - start < 30.0


async def test_every_attempt_reports_its_answer_and_latency():
    """Each attempt is followed by a JobAnswered with its HTTP status (None with no
    answer) and its round trip on the run's clock: a 429, then a 200 after a
    second's wait on the server."""

    tries = []

    async def answer(request):
        tries.append(request)
        if len(tries) == 1:
            return httpx.Response(429, headers={"Retry-After": "1"})
        await anyio.sleep(1.0)
        return httpx.Response(200, json={})

    router = respx.Router(assert_all_called=True)
    router.post(QUERY).mock(side_effect=answer)
    _, _, sink = await run_jobs(router, [query("a")])
    answers = sink.of(JobAnswered)
    assert [(a.job_id, a.status) for a in answers] == [("a", 429), ("a", 200)]
    assert answers[1].latency == pytest.approx(1.0, abs=0.01)


async def test_an_attempt_without_an_answer_reports_no_status():
    """A refused connection is reported as an answer of no HTTP status."""
    router = respx.Router(assert_all_called=True)
    router.post(QUERY).mock(
        side_effect=[httpx.ConnectError("refused"), httpx.Response(200, json={})]
    )
    _, _, sink = await run_jobs(router, [query("a")])
    assert [a.status for a in sink.of(JobAnswered)] == [None, 200]


async def test_the_key_that_bounds_the_run_sends_first():
    """With a key whose jobs take longest under its rule listed last, its first
    window's sends still go before any of the other key's: the run ends one
    round trip after its ideal, not after the other key's sends too."""
    router = respx.Router()
    router.post(QUERY).respond(200, json={})
    router.get(f"{BASE}/r").respond(200, json={})
    sink = ListSink()
    rules = {
        LimitKey.GLOBAL: parse_rule("100/1s"),
        LimitKey.RUN_QUERY: parse_rule("5/10s"),
    }
    others = [
        Job(f"g{n}", JobType.REQUEST, None, {}, n, Method.GET, "/r") for n in range(20)
    ]
    queries = [query(f"q{n}") for n in range(10)]
    async with make_runner(router, rules, sink, concurrency=1) as runner:
        await runner.run(
            {LimitKey.GLOBAL: others, LimitKey.RUN_QUERY: queries},
            {LimitKey.GLOBAL: 20, LimitKey.RUN_QUERY: 10},
        )
    order = [e.key for e in sink.of(JobSent)]
    assert order[:5] == [LimitKey.RUN_QUERY] * 5
    assert order.count(LimitKey.GLOBAL) == 20
