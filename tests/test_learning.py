"""Learning the server's real limit: `learning.infer` over logs, and whole runs on a
virtual clock against a sandbox stricter than the client's rule."""

from __future__ import annotations

import json
import math
from collections import Counter

import anyio
import httpx
import pytest
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from batchrun.api.client import asgi_transport
from batchrun.api.hints import Hints
from batchrun.core.clock import LoopClock
from batchrun.core.events import RuleLearned
from batchrun.core.limits import (
    LimitKey,
    Pace,
    Profile,
    Rule,
    Window,
    fallbacks,
    limit_table,
    parse_override,
    parse_rule,
)
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job
from batchrun.pacing.learning.fallback import Fallback
from batchrun.pacing.learning.learner import Learner
from batchrun.pacing.learning.lessons import Lesson, candidates
from batchrun.pacing.learning.log import Sent
from batchrun.pacing.learning.readings import infer
from batchrun.pacing.learning.storage import recalled, stored
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.pacer import Pacer
from batchrun.pacing.slots import eta
from batchrun.run.lessons import Lessons
from batchrun.run.settings import Settings
from batchrun.run.wiring import Target, open_run
from batchrun.sandbox.app import create_app
from tests.fakes import ListRecorder, ListSink
from tests.test_arrival import FakeClock

WINDOWS = candidates(parse_rule("30/2s"))


def burst(
    accepted: int, refused: int, *, at: float = 0.0, rtt: float = 0.01
) -> list[Sent]:
    """A burst sent at `at`: `accepted` answered 2xx, then `refused` answered 429."""
    return [Sent(at, at + rtt, False) for _ in range(accepted)] + [
        Sent(at, at + rtt, True) for _ in range(refused)
    ]


def test_a_burst_is_explained_by_the_shortest_window_that_fits():
    """10 accepted and then refused within 0.01 s: the loosest reading is 10/1s."""
    lesson = infer(burst(10, 8), parse_rule("30/2s"), WINDOWS)
    assert lesson is not None
    assert str(lesson.rule) == "10/1s+30/2s"
    assert "8 request(s) refused after 10 accepted within 1s" in lesson.evidence


def test_a_refused_probe_rules_the_short_window_out():
    """A probe refused 1.05 s after the burst, with none accepted in the last second:
    1 s cannot be the window; 2 s is."""
    log = [*burst(10, 8), Sent(1.05, 1.06, True)]
    lesson = infer(log, parse_rule("10/1s+30/2s"), WINDOWS)
    assert lesson is not None
    assert str(lesson.rule) == "10/2s"


def test_acceptances_rule_long_windows_out():
    """10 accepted at 0 s and 10 more at 15 s, refusals each time, and a probe
    refused at 16.5 s: 10 per 10 s. Not 10 per minute (the server let 20 through
    within a minute), nor per second (the probe found the last second empty)."""
    log = [*burst(10, 5), *burst(10, 5, at=15.0), Sent(16.5, 16.51, True)]
    lesson = infer(log, parse_rule("30/1m"), candidates(parse_rule("30/1m")))
    assert lesson is not None
    assert str(lesson.rule) == "10/10s+30/1m"


def test_refusals_with_nothing_accepted_teach_nothing():
    """A server that refuses everything (a spent quota) gives no count to learn."""
    learner = Learner()
    for _ in range(3):
        entry = learner.sent("k", 0.0)
        entry.end, entry.refused = 0.01, True
    learner.episode("k", 0.0)
    assert learner.review("k", parse_rule("30/2s"), spread=False) is None


def test_refusals_under_a_rule_already_kept_switch_to_spread():
    """10 accepted in the first second, then refused at 2.5 s with 5 accepted in
    the last 2 s (a weighted counter): no window explains both, so the lesson is
    to space requests evenly."""
    learner = Learner()
    for n in range(10):
        entry = learner.sent("k", n * 0.1)
        entry.end, entry.refused = n * 0.1 + 0.01, False
    for n in range(6):
        entry = learner.sent("k", 2.0 + n * 0.1)
        entry.end, entry.refused = 2.0 + n * 0.1 + 0.01, n == 5
    lesson = reviewed(learner, "10/2s", 2.5, spread=False)
    assert lesson.spread
    assert str(lesson.rule) == "10/2s"


def test_review_waits_until_the_episode_has_settled():
    """No lesson while a request sent before the episode began is still in flight."""
    learner = Learner()
    done = [learner.sent("k", 0.0) for _ in range(3)]
    pending = learner.sent("k", 0.0)
    for entry in done:
        entry.end, entry.refused = 0.01, False
    refused = learner.sent("k", 0.0)
    refused.end, refused.refused = 0.01, True
    learner.episode("k", 0.01)
    assert learner.review("k", parse_rule("30/2s"), spread=False) is None
    pending.end, pending.refused = 0.02, True
    assert learner.review("k", parse_rule("30/2s"), spread=False) is not None


rules = st.lists(
    st.tuples(st.integers(1, 40), st.sampled_from([0.5, 1.0, 2.0, 10.0, 60.0])),
    min_size=1,
    max_size=3,
).map(lambda ws: Rule(tuple(Window(c, s) for c, s in ws)))
logs = st.lists(
    st.tuples(st.floats(0, 100), st.floats(0, 2), st.booleans()), max_size=60
).map(lambda xs: [Sent(a, a + b, r) for a, b, r in sorted(xs)])


def assert_holds_to(old: Rule, new: Rule) -> None:
    """Holding to `new` holds to every window of `old` (fewer in as long or longer)."""
    for window in old.windows:
        assert any(
            w.seconds >= window.seconds and w.count <= window.count for w in new.windows
        ), (old, new)


@given(rules, logs)
def test_a_lesson_never_loosens_the_rule(rule, log):
    """Whatever the log, the learned rule holds to every window of the old one."""
    lesson = infer(log, rule, candidates(rule))
    if lesson is None:
        return
    assert_holds_to(rule, lesson.rule)


# Whole runs, on trio's virtual clock, against the sandbox in process.


@pytest.fixture
def anyio_backend():
    """Virtual time: cool-downs and windows cost nothing."""
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


class Latency(httpx.AsyncBaseTransport):
    """Half a round trip before the server sees a request, half after it answers,
    so that requests overlap in flight as they do over a network."""

    def __init__(self, inner: httpx.AsyncBaseTransport, rtt: float) -> None:
        self._inner, self._half = inner, rtt / 2

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await anyio.sleep(self._half)
        response = await self._inner.handle_async_request(request)
        await anyio.sleep(self._half)
        return response


async def run_against(
    server_rule: str,
    client_rule: str,
    jobs: int,
    rtt: float = 0.05,
    *,
    ledger: MemoryLedger | None = None,
    settings: Settings | None = None,
):
    """Run `jobs` run-query jobs at `client_rule` against a sandbox enforcing
    `server_rule`, `rtt` away; return (sandbox, sink, seconds)."""
    server = limit_table(overrides=[parse_override(f"run-query={server_rule}")])
    app = create_app(rules=server, clock=anyio.current_time)
    transport = Latency(asgi_transport(app), rtt)
    target = Target(
        base_url="http://sandbox", token=None, timeout=30.0, transport=transport
    )
    sink = ListSink()
    start = anyio.current_time()
    async with open_run(
        target,
        rules={LimitKey.RUN_QUERY: parse_rule(client_rule)},
        settings=settings or Settings(),
        ledger=MemoryLedger() if ledger is None else ledger,
        clock=LoopClock(),
        sink=sink,
        recorder=ListRecorder(),
        scope="learning",
    ) as runner:
        work = [Job(f"q{n}", JobType.RUN_QUERY, "t", {}) for n in range(jobs)]
        await runner.run({LimitKey.RUN_QUERY: work}, {LimitKey.RUN_QUERY: jobs})
    return app.state.sandbox, sink, anyio.current_time() - start


@pytest.mark.parametrize(
    ("server", "client"),
    [
        pytest.param("10/2s", "30/2s", id="3x-stricter-count"),
        pytest.param("15/1m+500/1h", "30/1m", id="profile-a-client-b-server"),
    ],
)
async def test_a_stricter_server_is_learned_and_the_run_ends_near_its_ideal(
    server, client
):
    """Every job done once, few 429s, and a makespan near the ideal under the
    server's real rule."""
    sandbox, sink, seconds = await run_against(server, client, 60)
    statuses = Counter(a.status for a in sandbox.arrivals)
    assert statuses[200] == 60
    assert statuses[429] <= 3
    assert sink.of(RuleLearned)
    # The client still keeps its own rule: the ideal holds to both.
    both = Rule(parse_rule(server).windows + parse_rule(client).windows)
    ideal = eta(60, both, now=0.0)
    assert seconds <= 1.25 * ideal, (
        seconds,
        ideal,
        [str(e.rule) for e in sink.of(RuleLearned)],
    )


async def test_a_shorter_server_window_is_learned_as_itself():
    """A 10/10s server under a 30/1m client rule is learned as 10 per 10 s, not as
    a 6x too slow 10 per minute."""
    _, sink, _ = await run_against("10/10s", "30/1m", 40)
    assert str(sink.of(RuleLearned)[-1].rule) == "10/10s+30/1m"


async def test_a_rerun_on_the_same_ledger_starts_from_what_was_learned():
    """What one run learned is kept in the ledger: the next run (or another
    process of the client) paces by it from its first request, with no 429."""
    ledger = MemoryLedger()
    await run_against("10/2s", "30/2s", 40, ledger=ledger)
    sandbox, sink, _ = await run_against("10/2s", "30/2s", 40, ledger=ledger)
    assert Counter(a.status for a in sandbox.arrivals) == {200: 40}
    (recalled,) = sink.of(RuleLearned)
    assert str(recalled.rule) == "10/2s"
    assert recalled.evidence.startswith("learned ")


async def test_a_lesson_applies_only_to_the_rule_it_was_learned_under():
    """Another rule given (another --limit or profile) means the user says
    something new: the kept lesson is not applied (so this server, stricter than
    the rule given, refuses again)."""
    ledger = MemoryLedger()
    await run_against("10/2s", "30/2s", 40, ledger=ledger)
    sandbox, sink, _ = await run_against("10/2s", "20/2s", 40, ledger=ledger)
    assert Counter(a.status for a in sandbox.arrivals)[429] >= 1
    assert not any(e.evidence.startswith("learned ") for e in sink.of(RuleLearned))


class HeaderServer:
    """A sliding-log 10/2s server on the test's clock that states its limit in
    `style` headers: "policy" (RateLimit-Policy), "remaining" (X-RateLimit-*), or
    "slowapi" (X-RateLimit-*, the reset a second or more late, as slowapi sends
    it)."""

    def __init__(self, style: str, accepted: tuple[float, ...] = ()) -> None:
        self.style = style
        # What the server accepted before: another client of the token.
        self.accepted: list[float] = list(accepted)
        self.statuses: Counter[int] = Counter()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        await anyio.sleep(0.025)
        now = anyio.current_time()
        recent = [t for t in self.accepted if t > now - 2.0]
        status = 429 if len(recent) >= 10 else 200
        if status == 200:
            self.accepted.append(now)
            recent.append(now)
        self.statuses[status] += 1
        await anyio.sleep(0.025)
        return httpx.Response(status, json={}, headers=self._headers(recent, now))

    def _headers(self, recent: list[float], now: float) -> dict[str, str]:
        if self.style == "policy":
            return {"RateLimit-Policy": "10;w=2"}
        if self.style == "both":
            reset = max(0.0, recent[0] + 2.0 - now) if recent else 0.0
            left = max(0, 10 - len(recent))
            quota = f'"q";r={left};t={math.ceil(reset)}'
            return {"RateLimit-Policy": '"q";q=10;w=2', "RateLimit": quota}
        reset = max(0.0, recent[0] + 2.0 - now) if recent else 0.0
        if self.style == "slowapi":
            reset = 1 + math.ceil(reset)  # slowapi adds a second to limits' reset
        return {
            "X-RateLimit-Remaining": str(max(0, 10 - len(recent))),
            "X-RateLimit-Reset": f"{reset:.3f}",
        }


async def run_through(server, jobs: int, sink: ListSink | None = None) -> float:
    """Run `jobs` run-query jobs at 30/2s through `server` (a MockTransport
    handler) on the test's clock; return how long it took."""
    target = Target(
        base_url="http://api",
        token=None,
        timeout=30.0,
        transport=httpx.MockTransport(server),
    )
    start = anyio.current_time()
    async with open_run(
        target,
        rules={LimitKey.RUN_QUERY: parse_rule("30/2s")},
        settings=Settings(),
        ledger=MemoryLedger(),
        clock=LoopClock(),
        sink=sink or ListSink(),
        recorder=ListRecorder(),
        scope="headers",
    ) as runner:
        work = [Job(f"q{n}", JobType.RUN_QUERY, "t", {}) for n in range(jobs)]
        await runner.run({LimitKey.RUN_QUERY: work}, {LimitKey.RUN_QUERY: jobs})
    return anyio.current_time() - start


@pytest.mark.parametrize("style", ["policy", "remaining", "slowapi"])
async def test_stated_limits_are_followed_without_a_429(style):
    """A server that states its policy, or its remaining budget and reset, is
    kept to with no 429 at all, although the client's rule is 3x looser; "none
    remaining" teaches the window as a 429 would, so a reset rounded up to whole
    seconds is waited for once, not once a window."""
    server = HeaderServer(style)
    sink = ListSink()
    seconds = await run_through(server, 40, sink)
    assert server.statuses == {200: 40}
    if style == "policy":
        assert "states 10/2s" in sink.of(RuleLearned)[0].evidence
    # Four windows of 10: the last opens at 6 s at the earliest; a late reset
    # is waited for once (then the window learned from it paces the key).
    assert seconds <= 6.0 + 2.0
    if style == "slowapi":
        said = "the server said none remained after 10 within 2s"
        assert said in sink.of(RuleLearned)[0].evidence


class ExpressServer:
    """express-rate-limit's way, on the test's clock: fixed 10/2s windows from 0,
    `RateLimit-Policy` and a `RateLimit` field whose reset is rounded up to whole
    seconds, as express sends it."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.statuses: Counter[int] = Counter()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        await anyio.sleep(0.025)
        now = anyio.current_time()
        window = int(now // 2.0)
        status = 429 if self.counts[window] >= 10 else 200
        self.counts[window] += status == 200
        self.statuses[status] += 1
        await anyio.sleep(0.025)
        reset = math.ceil((window + 1) * 2.0 - now)
        remaining = max(0, 10 - self.counts[window])
        headers = {
            "RateLimit-Policy": "10;w=2",
            "RateLimit": f"limit=10, remaining={remaining}, reset={reset}",
        }
        return httpx.Response(status, json={}, headers=headers)


async def test_a_reset_rounded_up_does_not_slow_a_run_the_ledger_paces():
    """When the budget the server says is spent is the client's own (the ledger
    holds it), the rule waits to the moment; holding until a reset rounded up to
    whole seconds would lose up to a second a window."""
    server = ExpressServer()
    seconds = await run_through(server, 60)
    assert server.statuses == {200: 60}
    # Six windows of 10: the last opens at 10 s (the ideal), answered 50 ms on.
    assert seconds <= 1.15 * 10.0


# What a ledger keeps of a lesson.


def test_a_kept_lesson_reads_back_at_any_time_scale():
    """Windows are kept unscaled: a lesson learned at --time-scale 10 reads back
    as the same real limit at scale 1 and at scale 10."""
    lesson = Lesson(parse_rule("10/0.2s"), "3 of 8 refused", spread=True)
    given = parse_rule("30/200ms")
    text = stored(lesson, given=given, time_scale=10.0, at=0.0)
    assert json.loads(text)["windows"] == [[10, 2.0]]
    assert json.loads(text)["given"] == [[30, 2.0]]
    for scale, rule, expected in [
        (1.0, "30/2s", "10/2s"),
        (10.0, "30/200ms", "10/200ms"),
    ]:
        back = recalled(parse_rule(rule), text, time_scale=scale, now=0.0)
        assert back is not None
        assert str(back.rule) == expected
        assert back.spread
        assert "3 of 8 refused" in back.evidence


VALID = {
    "windows": [[10, 2.0]],
    "spread": False,
    "why": "w",
    "given": [[30, 2.0]],
    "at": 1000.0,
}


def test_a_valid_kept_text_is_read():
    """The base every damaged text below differs from in one field."""
    back = recalled(parse_rule("30/2s"), json.dumps(VALID), time_scale=1, now=1000)
    assert back is not None
    assert str(back.rule) == "10/2s"


@pytest.mark.parametrize(
    "damage",
    [
        {"windows": "x"},
        {"windows": [[0, 2.0]]},
        {"windows": [[10, -1]]},
        {"windows": [[10, 1e308]]},  # no such window: would stall the key
        {"windows": [[10, 1e-300]]},
        {"windows": [[10, float("inf")]]},
        {"windows": [[10, 7.0]]},  # not a length a lesson of 30/2s can hold
        {"at": "soon"},
        {"at": 1000.0 + 2 * 86400},  # from the future: a damaged stamp
        {"at": 1000.0 - 31 * 86400},  # too old to trust
        {"given": 7},
        {"given": [[20, 2.0]]},  # learned under another rule than 30/2s
        {"why": None, "spread": None, "given": None},
    ],
)
def test_damaged_kept_text_is_ignored(damage):
    text = json.dumps({**VALID, **damage})
    assert recalled(parse_rule("30/2s"), text, time_scale=1.0, now=1000.0) is None


@pytest.mark.parametrize("text", [None, "", "{}", "not json", "[]", "null"])
def test_missing_kept_text_is_ignored(text):
    assert recalled(parse_rule("30/2s"), text, time_scale=1.0, now=0.0) is None


def test_a_rule_written_in_another_order_is_the_same_rule():
    given = [[500, 3600.0], [15, 60.0]]
    text = json.dumps({**VALID, "windows": [[10, 60.0]], "given": given})
    back = recalled(parse_rule("15/1m+500/1h"), text, time_scale=1.0, now=1000.0)
    assert back is not None


@given(
    rules,
    st.lists(
        st.tuples(st.integers(1, 100), st.sampled_from([0.5, 1.0, 2.0, 10.0, 60.0])),
        min_size=1,
        max_size=3,
    ),
    st.booleans(),
)
def test_a_kept_lesson_never_loosens_the_rule(rule, kept, spread):
    """Whatever a ledger holds (another version, a hand edit), every window of
    the rule in force is still kept."""
    given = [[w.count, w.seconds] for w in rule.windows]
    kept_text = {"windows": kept, "spread": spread, "why": "w", "given": given}
    text = json.dumps({**kept_text, "at": 0})
    back = recalled(rule, text, time_scale=1.0, now=0.0)
    if back is None:
        return
    assert_holds_to(rule, back.rule)


# --profile auto: statement A, falling back to B.

A, B = parse_rule("30/1m"), parse_rule("15/1m+500/1h")
AUTO = Settings(fallback={LimitKey.RUN_QUERY: B})


async def test_auto_against_a_b_server_takes_b_for_one_429():
    """The 16th request in a minute is refused: B is taken whole (its hourly
    window too), for one 429, and the run ends near B's ideal."""
    ledger = MemoryLedger()
    sandbox, sink, seconds = await run_against(
        str(B), str(A), 60, ledger=ledger, settings=AUTO
    )
    statuses = Counter(a.status for a in sandbox.arrivals)
    assert statuses == {200: 60, 429: 1}
    (lesson,) = sink.of(RuleLearned)
    assert lesson.rule == B
    assert "the server enforces 15/1m+500/1h, not 30/1m" in lesson.evidence
    assert seconds <= 1.25 * eta(60, B, now=0.0)
    # Kept: the next run starts from B.
    sandbox, sink, _ = await run_against(
        str(B), str(A), 30, ledger=ledger, settings=AUTO
    )
    assert Counter(a.status for a in sandbox.arrivals) == {200: 30}
    assert sink.of(RuleLearned)[0].kept


async def test_auto_against_an_a_server_keeps_a_without_a_429():
    """The 16th request in a minute is accepted: B is ruled out, A kept."""
    ledger = MemoryLedger()
    sandbox, sink, seconds = await run_against(
        str(A), str(A), 60, ledger=ledger, settings=AUTO
    )
    assert Counter(a.status for a in sandbox.arrivals) == {200: 60}
    (lesson,) = sink.of(RuleLearned)
    assert lesson.rule == A
    # More than 45 within 2 m: more than B lets through in any counting.
    assert "46 accepted within 2m, more than 15/1m+500/1h allows" in lesson.evidence
    assert seconds <= 1.25 * eta(60, A, now=0.0)
    _, sink, _ = await run_against(str(A), str(A), 10, ledger=ledger, settings=AUTO)
    (kept,) = sink.of(RuleLearned)
    assert (kept.kept, kept.rule) == (True, A)


def test_auto_falls_back_only_for_run_query_and_not_when_told():
    assert fallbacks(Profile.AUTO) == {LimitKey.RUN_QUERY: B}
    assert fallbacks(Profile.AUTO, time_scale=30) == {LimitKey.RUN_QUERY: B.scaled(30)}
    assert fallbacks(Profile.A) == fallbacks(Profile.B) == {}
    told = [(LimitKey.RUN_QUERY, parse_rule("10/1m"))]
    assert fallbacks(Profile.AUTO, told) == {}
    assert limit_table(profile=Profile.AUTO)[LimitKey.RUN_QUERY] == A


def test_a_kept_lesson_is_trusted_for_30_days():
    """Servers change their limits: past 30 days a kept lesson is learned again."""
    lesson, given = Lesson(parse_rule("10/2s"), "why"), parse_rule("30/2s")
    text = stored(lesson, given=given, time_scale=1.0, at=0.0)
    day = 86400.0
    assert recalled(parse_rule("30/2s"), text, time_scale=1.0, now=29 * day)
    assert not recalled(parse_rule("30/2s"), text, time_scale=1.0, now=31 * day)


# A leaky bucket's reading.


def settled_review(
    log: list[Sent], rule: Rule, *, safer: Fallback | None = None
) -> Lesson | None:
    return read(first_review(log, rule, safer=safer))


def first_review(
    log: list[Sent], rule: Rule, *, safer: Fallback | None = None
) -> Lesson | None:
    """The review of `log`'s episode, as the learner gives it."""
    learner = Learner()
    for entry in log:
        learner.sent("k", entry.start)
        kept = learner._logs["k"].sent[-1]
        learner.answered("k", kept, entry.end or entry.start, refused=entry.refused)
        kept.wait = entry.wait
    learner.episode("k", log[-1].start)
    return learner.review("k", rule, spread=False, safer=safer)


def test_one_refusal_alone_changes_nothing_yet():
    """11 accepted at once, the 12th refused, no Retry-After: a trial. The rule
    stands, not even spaced evenly, with the bucket's reading in doubt behind
    it (and 11/2s behind that), never kept; a Retry-After that fits a window
    of 11 is a second word, and the window is learned at once."""
    lesson = first_review(burst(11, 1), parse_rule("30/2s"))
    assert lesson is not None
    assert lesson.trial
    assert (str(lesson.rule), lesson.spread) == ("30/2s", False)
    assert lesson.fallback is not None
    assert lesson.fallback.rule.burst == 10
    told = burst(11, 1)
    told[-1].wait = 2.0
    lesson = first_review(told, parse_rule("30/2s"))
    assert lesson is not None
    assert not lesson.trial
    assert any(w.count == 11 for w in lesson.rule.windows)


def read(lesson: Lesson | None) -> Lesson | None:
    """The reading of a review: of one refusal alone, the trial's fallback
    (the rule stands until a second refusal agrees)."""
    if lesson is not None and lesson.trial and lesson.fallback is not None:
        return lesson.fallback
    return lesson


def test_a_refused_burst_is_read_as_a_leaky_bucket_first():
    """11 accepted at once, the 12th refused, no Retry-After: a bucket of burst 10
    draining at the rule's rate is tried first, then 11/1s, then 11/2s: the
    readings the burst fits, fastest first."""
    lesson = settled_review(burst(11, 1), parse_rule("30/2s"))
    assert lesson is not None
    assert lesson.rule == Rule((Window(30, 2.0),), 10)
    assert "read as a leaky bucket that lets 11 through at once" in lesson.evidence
    assert lesson.fallback is not None
    assert str(lesson.fallback.rule) == "11/1s+30/2s"
    assert lesson.fallback.fallback is not None
    assert str(lesson.fallback.fallback.rule) == "11/2s"


def test_the_burst_is_what_did_not_drain():
    """20 accepted one at a time over 0.7 s at 15/s: 10.5 of them drained, so
    the bucket surely holds a burst of 9 (the stretch is taken at its longest)."""
    log = [Sent(n * 0.035, n * 0.035 + 0.03, False) for n in range(20)]
    log.append(Sent(0.7, 0.73, True))
    lesson = settled_review(log, parse_rule("30/2s"))
    assert lesson is not None
    assert lesson.rule.burst == 9


def test_a_retry_after_longer_than_one_drain_rules_the_bucket_out():
    """A bucket has room again one interval (1/15 s) after a refusal; a server
    that asks for 2 s counts in windows."""
    log = burst(11, 1)
    log[-1].wait = 2.0
    lesson = settled_review(log, parse_rule("30/2s"))
    assert lesson is not None
    assert lesson.rule.burst is None


def test_a_bucket_is_not_read_while_another_reading_is_in_doubt():
    safer = Fallback(Lesson(parse_rule("11/2s"), "the safe reading"))
    log = [*burst(11, 1), *probe(0.01)]
    lesson = settled_review(log, parse_rule("30/2s"), safer=safer)
    assert lesson is not None
    assert lesson.rule.burst is None


def test_a_refused_bucket_reading_is_not_read_again():
    """Refused again under the bucket reading: a window is learned, no burst."""
    rule = Rule((Window(30, 2.0),), 10)
    log = [*burst(11, 1), Sent(0.1, 0.11, True)]
    lesson = settled_review(log, rule)
    assert lesson is not None
    assert lesson.rule.burst is None


def test_a_kept_bucket_reading_reads_back_with_its_safer_reading():
    """Kept with the window reading behind it, so the next run still falls back."""
    given = parse_rule("30/2s")
    safer = Lesson(parse_rule("11/2s"), "s")
    lesson = Lesson(Rule(given.windows, 10), "a bucket", fallback=safer)
    text = stored(lesson, given=given, time_scale=1.0, at=1000.0)
    back = recalled(given, text, time_scale=1.0, now=1000.0)
    assert back is not None
    assert back.rule == lesson.rule
    assert back.fallback is not None
    assert back.fallback.rule == parse_rule("11/2s")


@pytest.mark.parametrize(
    "damage",
    [
        {"burst": -1},
        {"burst": 29},  # 30 at once: no bucket 30/2s does not already hold to
        {"burst": "x"},
        {"safer": [[11, 7.0]]},  # not a length a lesson of 30/2s can hold
        {"safer": "x"},
    ],
)
def test_a_damaged_bucket_reading_is_ignored(damage):
    text = json.dumps({**VALID, "windows": [[30, 2.0]], **damage})
    assert recalled(parse_rule("30/2s"), text, time_scale=1.0, now=1000.0) is None


def test_a_bucket_reading_is_ruled_in_past_twice_its_safer_count_in_a_window():
    """More than 22 accepted within 1 s is more than 11/1s lets through in any
    counting: the bucket reading holds."""
    learner = Learner()
    for n in range(23):
        entry = learner.sent("k", n * 0.04)
        learner.answered("k", entry, n * 0.04 + 0.001, refused=False)
    given = Rule((Window(30, 2.0),), 10)
    fallback = Fallback(Lesson(parse_rule("11/1s+30/2s"), "s"))
    lesson = fallback.ruled_out(learner, "k", given)
    assert lesson is not None
    assert lesson.rule == given
    assert "23 accepted within 1s" in lesson.evidence


def test_taking_a_fallback_drops_the_burst_and_keeps_the_next_fallback():
    safest = Lesson(parse_rule("11/2s"), "safest")
    fallback = Fallback(Lesson(parse_rule("11/1s+30/2s"), "safe", fallback=safest))
    given = Rule((Window(30, 2.0),), 10)
    taken = fallback.taken(Lesson(given, "refused", spread=True), given)
    assert taken.rule == parse_rule("11/1s+30/2s")
    assert taken.fallback is safest


async def test_none_remaining_under_a_stated_policy_teaches_no_count():
    """Another client of the token spent 6 of the stated 10/2s: "none remaining"
    comes after our 4th, while our own ledger has room. The policy explains it,
    so the key waits for the reset and learns no count of 4 (which it would keep
    for 30 days); the run sends no 429."""
    server = HeaderServer("both", accepted=(0.0,) * 6)
    sink = ListSink()
    await run_through(server, 20, sink)
    assert server.statuses == {200: 20}
    learned = [str(e.rule) for e in sink.of(RuleLearned)]
    assert learned == ["10/2s"]


def test_a_bucket_is_not_read_while_spaced_evenly():
    """Spaced at the rule's interval, no burst can be used: nothing to gain."""
    learner = Learner()
    for entry in burst(11, 1):
        sent = learner.sent("k", entry.start)
        learner.answered("k", sent, entry.end or 0.0, refused=entry.refused)
    lesson = reviewed(learner, "30/2s", 0.0)
    assert lesson.rule.burst is None


def test_a_safer_reading_is_ruled_out_over_as_many_windows_as_it_takes():
    """20/2s behind a bucket paced under 30/2s: never more than 40 within 2 s
    nor 60 within 4 s, but 90 within 6 s is more than 20/2s allows in any
    counting (80)."""
    learner = Learner()
    for n in range(90):
        moment = (n // 30) * 2.1 + (n % 30) * 0.05
        entry = learner.sent("k", moment)
        learner.answered("k", entry, moment + 0.001, refused=False)
    given = Rule((Window(30, 2.0),), 10)
    lesson = Fallback(Lesson(parse_rule("20/2s"), "s")).ruled_out(learner, "k", given)
    assert lesson is not None
    assert "90 accepted within 6s" in lesson.evidence


def test_a_fallback_the_joined_rule_already_holds_to_is_dropped():
    """Taking 5/1s+30/2s, joined with a fallback of 5/2s, gives 5/2s: a further
    fallback of 5/2s would be nothing in doubt (and would never settle)."""
    fallback = Fallback(Lesson(parse_rule("5/2s"), "safe"))
    lesson = Lesson(parse_rule("5/1s+30/2s"), "refused", fallback=fallback.reading)
    taken = fallback.taken(lesson, Rule((Window(30, 2.0),), 3))
    assert str(taken.rule) == "5/2s"
    assert taken.fallback is None


def test_a_deeply_nested_kept_text_is_ignored():
    text = "[" * 100_000
    assert recalled(parse_rule("30/2s"), text, time_scale=1.0, now=0.0) is None


def test_a_kept_safer_reading_that_adds_nothing_is_dropped():
    text = json.dumps({**VALID, "safer": [[10, 2.0]]})
    back = recalled(parse_rule("30/2s"), text, time_scale=1.0, now=1000.0)
    assert back is not None
    assert back.fallback is None


def test_acceptances_before_a_lesson_count_against_its_safer_reading():
    """A lesson starts the careful proof again, but what the server accepted
    before it is still evidence: 7 before and 6 after, within 2 s, are more than
    6/2s lets through in any counting."""
    learner = Learner()
    for n in range(7):
        entry = learner.sent("k", n * 0.01)
        learner.answered("k", entry, n * 0.01 + 0.001, refused=False)
    learner._logs["k"].rearm()
    for n in range(6):
        entry = learner.sent("k", 0.5 + n * 0.07)
        learner.answered("k", entry, 0.5 + n * 0.07 + 0.001, refused=False)
    assert learner._logs["k"].proven(2.0) == 6  # the proof starts again
    given = Rule((Window(30, 2.0),), 5)
    lesson = Fallback(Lesson(parse_rule("6/2s"), "s")).ruled_out(learner, "k", given)
    assert lesson is not None
    assert "13 accepted within 2s" in lesson.evidence


def logged(learner: Learner, log: list[Sent], key: str = "k") -> None:
    """Send and answer `log` through `learner`, for `key`."""
    for entry in log:
        sent = learner.sent(key, entry.start)
        end = entry.start + 0.01 if entry.end is None else entry.end
        learner.answered(key, sent, end, refused=entry.refused, wait=entry.wait)


def spaced(count: int, step: float, *, at: float, refused_last: bool) -> list[Sent]:
    """`count` requests `step` apart from `at`; the last refused if asked."""
    return [
        Sent(at + n * step, at + n * step + 0.01, refused_last and n == count - 1)
        for n in range(count)
    ]


def test_a_retry_after_that_comes_early_keeps_the_rules_own_window_behind():
    """10 accepted in a burst at 0.1 s, refused with Retry-After 1 s: a 1 s sliding
    window fits, and so does a fixed 2 s one resetting at 1.1 s, and a bucket
    (one drain, rounded up to whole seconds). Fastest first: the bucket, then
    the 1 s window, with 10/2s, the safe reading, behind both (it was 10/1s
    alone, twice the fixed window's count)."""
    learner = Learner()
    log = [*burst(10, 0, at=0.1), Sent(0.1, 0.11, True, wait=1.0)]
    logged(learner, log)
    lesson = reviewed(learner, "30/2s", 0.1, spread=False)
    assert str(lesson.rule) == "30/2s, bursts of 10"
    assert lesson.fallback is not None
    assert str(lesson.fallback.rule) == "10/1s+30/2s"
    assert lesson.fallback.fallback is not None
    assert str(lesson.fallback.fallback.rule) == "10/2s"


def reviewed(learner: Learner, rule: str, at: float, *, spread: bool = True) -> Lesson:
    """The lesson of key "k"'s episode begun at `at`, under `rule`."""
    learner.episode("k", at)
    lesson = read(learner.review("k", parse_rule(rule), spread=spread))
    assert lesson is not None
    return lesson


def straddled(learner: Learner) -> None:
    """16 let through in a burst (a fixed 10/2s window reset in the middle of
    it), then spaced evenly at 16 per 2 s from 2.2 s: refused after 10."""
    logged(learner, burst(16, 1))
    logged(learner, spaced(11, 0.127, at=2.2, refused_last=True))
    logged(learner, probe(2.2 + 10 * 0.127 + 0.01))
    learner.episode("k", 2.2 + 10 * 0.127)


def probe(answered: float) -> list[Sent]:
    """A request sent just after a refusal answered at `answered`, refused too:
    the second word a lesson needs (`evidence`)."""
    return [Sent(answered + 0.02, answered + 0.03, True)]


def test_spaced_evenly_and_refused_lowers_the_count_to_what_was_accepted():
    """No window explains both the burst and the refusal after 10 within the
    last 2 s, spaced evenly: the count is lowered to 10, not by one at a time."""
    learner = Learner()
    straddled(learner)
    lesson = learner.review("k", parse_rule("16/2s"), spread=True)
    assert lesson is not None
    assert (str(lesson.rule), lesson.spread) == ("10/2s", True)
    assert "after 10 accepted within 2s" in lesson.evidence


def test_a_refusal_after_fewer_than_half_the_count_lowers_it_by_one():
    """Refused after 3 within 2 s under 16/2s: a weighted counter may still have
    counted an older burst, or the 429 was a stray one (another client of the
    token): the count is lowered by one, not to 3. Four such strays cost four
    steps, not the pace."""
    learner = Learner()
    logged(learner, burst(16, 0))
    logged(learner, spaced(4, 0.6, at=10.0, refused_last=True))
    logged(learner, probe(11.81))
    lesson = reviewed(learner, "16/2s", 11.8)
    assert str(lesson.rule) == "15/2s"


def test_a_refusal_soon_after_a_burst_lowers_the_count_by_one():
    """The key was told to space evenly right after a burst: a refusal within
    the next window may be the burst's weight on a weighted counter, so the
    count it came at says little; it is lowered by one."""
    learner = Learner()
    logged(learner, [*burst(6, 0), *burst(5, 0, at=1.0), Sent(1.95, 1.96, True)])
    learner.episode("k", 1.95)
    first = learner.review("k", parse_rule("11/2s"), spread=False)
    assert first is not None
    assert first.trial  # in doubt: the rule stands, spacing evenly behind it
    assert first.fallback is not None
    assert first.fallback.spread
    trial = Fallback(first.fallback, trial=True)
    logged(learner, [Sent(1.97, 1.98, True)])  # a second refusal agrees
    learner.episode("k", 1.97)
    switch = learner.review("k", parse_rule("11/2s"), spread=False, safer=trial)
    assert switch is not None
    assert switch.spread
    assert not switch.trial
    # 7 within the 2 s before the refusal (half the count or more): spaced
    # evenly all along, the count would be lowered to 7.
    logged(learner, spaced(3, 0.2, at=2.2, refused_last=True))
    logged(learner, probe(2.61))
    lesson = reviewed(learner, "11/2s", 2.6)
    assert str(lesson.rule) == "10/2s"


def test_a_refused_probe_with_nothing_accepted_since_the_last_lesson_teaches_nothing():
    """After a count was lowered, probes refused in the same full window add
    nothing: lowering again at each would walk the count down for nothing."""
    learner = Learner()
    straddled(learner)
    assert learner.review("k", parse_rule("16/2s"), spread=True) is not None
    logged(learner, [Sent(3.6, 3.61, True)])
    learner.episode("k", 3.6)
    assert learner.review("k", parse_rule("10/2s"), spread=True) is None


def test_a_quota_spaced_evenly_is_learned_as_its_longer_window():
    """15/1m spaced evenly, then refused after 45 within 5 minutes (3 times the
    minute's count): a quota, learned as its window, not as a lower count."""
    learner = Learner()
    logged(learner, spaced(46, 4.05, at=0.0, refused_last=True))
    logged(learner, probe(45 * 4.05 + 0.01))
    lesson = reviewed(learner, "15/1m", 45 * 4.05)
    assert str(lesson.rule) == "15/1m+45/5m"


@pytest.mark.parametrize(
    ("log", "reading", "safer"),
    [
        # One accepted, the next refused with Retry-After 2 s: a bucket with no
        # burst (nginx `rate=30r/m`) drains one request in 2 s: it is tried
        # first, then that window of one (the usual lengths would give one per
        # second, refused, then one per minute), then one per minute.
        pytest.param(
            [Sent(0.0, 0.01, False), Sent(0.0, 0.01, True, wait=2.0)],
            "30/1m, bursts of 1",
            "1/2s+30/1m",
            id="window-of-one",
        ),
        # 6 at once, the 7th refused with Retry-After 4 s: longer than one drain
        # at the rule's rate (2 s), shorter than the window reading's spacing
        # (10 s for 6/1m): a bucket that drains one per 4 s.
        pytest.param(
            [*burst(6, 0), Sent(0.0, 0.01, True, wait=4.0)],
            "15/1m, bursts of 6",
            "6/1m",
            id="slower-bucket",
        ),
    ],
)
def test_a_retry_after_names_a_reading_with_the_safe_one_behind(log, reading, safer):
    """Under 30/1m, what the server asks to wait names a faster reading than
    the window the burst fits, tried first with that window to fall back to."""
    lesson = settled_review(log, parse_rule("30/1m"))
    assert lesson is not None
    assert str(lesson.rule) == reading
    assert lesson.fallback is not None
    assert str(lesson.fallback.rule) == safer


def test_a_retry_after_after_a_burst_names_no_window():
    """11 accepted at once, then refused with Retry-After 2 s: a bucket's burst
    drains one request in that time, a window's count more; no window of 11
    per 2 s is read from it."""
    log = [*burst(11, 0), Sent(0.0, 0.01, True, wait=2.0)]
    lesson = settled_review(log, parse_rule("30/1m"))
    assert lesson is not None
    assert all(w.seconds in (1.0, 10.0, 60.0) for w in lesson.rule.windows)


def test_a_kept_window_a_retry_after_named_is_recalled():
    text = json.dumps(
        {**VALID, "windows": [[1, 2.0], [30, 60.0]], "given": [[30, 60.0]]}
    )
    back = recalled(parse_rule("30/1m"), text, time_scale=1.0, now=1000.0)
    assert back is not None
    assert str(back.rule) == "1/2s+30/1m"


def test_the_shortest_gap_the_server_let_through_names_a_window_of_one():
    """Spaced 2 s apart under 30/1m, every other request refused: the server
    let no two through closer than 4 s, so one per 4 s explains the log (a
    bucket with no burst at half the rule's rate), where no usual length does.
    The window is a millisecond short of the gap: both ends in it would count
    two."""
    learner = Learner()
    logged(learner, [Sent(n * 2.0, n * 2.0 + 0.01, n % 2 == 1) for n in range(6)])
    lesson = reviewed(learner, "30/1m", 10.0)
    assert str(lesson.rule) == "1/3.999s+30/1m"


def test_a_retry_after_of_about_the_window_reads_no_bucket():
    """Refused with Retry-After 59 s: a window server's answer, as slow as the
    window reading or slower: no bucket."""
    log = [*burst(6, 0), Sent(0.0, 0.01, True, wait=59.0)]
    lesson = settled_review(log, parse_rule("30/1m"))
    assert lesson is not None
    assert lesson.rule.burst is None


def test_a_longer_window_the_log_hardly_covers_is_no_limit():
    """Profile B against a weighted 15/1m: 15 at 0 s, 10 more at 60.1 s, then
    refused (the last minute still weighs). 25 within B's hour fits, but the
    log covers a minute of it: 25 is how long the log is, not an hourly limit
    (it would pace the run at 25 an hour). The counter counts another way."""
    log = [
        *burst(15, 0),
        *burst(10, 0, at=60.1),
        Sent(60.1, 60.11, True, wait=4.0),
    ]
    lesson = settled_review(log, parse_rule("15/1m+500/1h"))
    assert lesson is not None
    assert (str(lesson.rule), lesson.spread) == ("15/1m+500/1h", True)


def test_a_quota_is_learned_from_a_log_shorter_than_its_window():
    """45 within 5 minutes under 15/1m, from a log of 2 of them: three minutes'
    worth, a quota whatever the log covers."""
    learner = Learner()
    logged(learner, spaced(46, 2.7, at=0.0, refused_last=True))
    logged(learner, probe(45 * 2.7 + 0.01))
    lesson = reviewed(learner, "15/1m", 45 * 2.7)
    assert str(lesson.rule) == "15/1m+45/5m"


# Aligned counters (`counters.read`).


def test_a_burst_that_straddled_a_fixed_reset_is_read_as_a_fixed_window():
    """8 accepted across a fixed 4/2s server's reset, read as 8/2s; a request a
    sliding log of 8/2s let go is refused too. A fixed window explains both
    refusals with a lower count: it is learned, paced exactly (a sliding log of
    a count holds a fixed window of it at any phase)."""
    times = (0.5, 0.6, 0.7, 0.8, 1.1, 1.2, 1.3, 1.4)
    log = [Sent(t - 0.005, t + 0.005, False) for t in times]
    log += [Sent(1.495, 1.505, True), Sent(2.545, 2.555, True)]
    lesson = settled_review(log, parse_rule("8/2s"))
    assert lesson is not None
    assert (str(lesson.rule), lesson.spread) == ("7/2s", False)
    assert "read as a fixed window of 7/2s" in lesson.evidence


def test_a_weighted_counter_at_the_rules_count_is_spaced_not_the_safer_taken():
    """Refused past what the safer 5/4s allows, but a weighted counter of the
    rule's own 5/2s explains every answer: spacing evenly is tried first (the
    runner keeps the fallback behind it), as 5/4s would halve the pace for
    good."""
    answers = [(1.0, 0), (1.2, 0), (1.4, 0), (1.6, 0), (2.1, 0), (2.2, 1)]
    answers += [(3.0, 0), (3.1, 0), (3.2, 1)]
    log = [Sent(t - 0.005, t + 0.005, bool(r)) for t, r in answers]
    safer = Fallback(Lesson(parse_rule("5/4s"), "the safer"))
    lesson = settled_review(log, parse_rule("5/2s"), safer=safer)
    assert lesson is not None
    assert (str(lesson.rule), lesson.spread) == ("5/2s", True)


@pytest.mark.parametrize(
    ("rule", "gap", "after"),
    [("30/1m", 0.1, "10/1s+30/1m"), ("30/2s", 0.05, "10/1s+30/2s")],
    ids=["6x-faster", "2x-faster"],
)
def test_a_shorter_window_is_tried_behind_a_bucket(rule, gap, after):
    """10 accepted one after another, then refused, no Retry-After: a bucket is
    tried first, then the shorter window that fits, faster than the rule's
    own, whatever it saves (before, only at 3 x or more: a 5/1s server was
    kept at 5/2s)."""
    log = [Sent(n * gap, n * gap + gap / 2, False) for n in range(10)]
    log.append(Sent(10 * gap, 10 * gap + gap / 2, True))
    lesson = settled_review(log, parse_rule(rule))
    assert lesson is not None
    assert lesson.rule.burst is not None
    assert lesson.fallback is not None
    assert str(lesson.fallback.rule) == after


def test_a_stated_policy_is_kept_without_a_trial_standing_behind_the_rule():
    """One refusal read as 13/2s (in doubt, a trial), then a rate-limit header
    stating 100/1m: the policy is adopted and kept on its own; the trial's
    reading, one refusal's, is neither joined into it nor kept."""
    key, clock = LimitKey.RUN_QUERY, FakeClock()
    ledger = MemoryLedger()
    pacer = Pacer(rules={key: parse_rule("30/2s")}, ledger=ledger, clock=clock)
    lessons = Lessons(pacer=pacer, clock=clock, sink=ListSink(), fallback={})
    learner = pacer.learner
    later = [Sent(3.0, 3.01, False), Sent(3.0, 3.01, False), Sent(3.0, 3.01, True)]
    logged(learner, [*burst(11, 1), *later], key=key)
    learner.episode(key, 3.01)
    clock.set(3.02)
    lessons.review(key)
    assert str(pacer.rules[key]) == "30/2s"  # in doubt: the rule stands
    assert ledger.recall(key.value) is None
    lessons.heed(key, Hints(policy=(Window(100, 60.0),)), None)
    kept = json.loads(ledger.recall(key.value) or "{}")
    assert kept["windows"] == [[30, 2.0], [100, 60.0]]


def test_spacing_evenly_learned_settles_the_trial_it_answers():
    """A lone refusal read as "space evenly" stands as a trial; the next
    refusal's lesson, the first to space the same rule evenly, answers it, and
    the trial goes. It stood for the rest of the run before (no count rules out
    a reading of the rule's own window), and every lone 429 after it was set
    aside: a 10/2s server that tightened to 8/2s for good in the middle of a
    run cost 28 429s, with 10/2s kept, instead of 22, with 8/2s."""
    key, clock = LimitKey.RUN_QUERY, FakeClock()
    rule = parse_rule("10/2s")
    pacer = Pacer(rules={key: rule}, ledger=MemoryLedger(), clock=clock)
    lessons = Lessons(pacer=pacer, clock=clock, sink=ListSink(), fallback={})
    why = "429s came although requests kept to the rule"
    reading = Lesson(rule, why, spread=True)
    doubt = Lesson(rule, f"a 429 in doubt: {why}", fallback=reading, trial=True)
    lessons._learned(key, doubt)
    assert lessons._fallback[key].trial
    lessons._learned(key, reading)
    assert key not in lessons._fallback
    assert pacer.pace(key) is Pace.SPREAD


def test_a_bucket_slower_than_the_shorter_window_is_not_tried_before_it():
    """Under 30/1m, 6 spread over 6 s, then refused with Retry-After 4 s: a
    bucket draining one per 4 s fits, and so does 6/10s, which allows one per
    2 s: the faster window is tried first, the bucket dropped (it stood in
    front of the window, which could then never be tried)."""
    log = [Sent(n * 1.0, n * 1.0 + 0.01, False) for n in range(6)]
    log.append(Sent(6.0, 6.01, True, wait=4.0))
    lesson = settled_review(log, parse_rule("30/1m"))
    assert lesson is not None
    assert lesson.rule.burst is None
    assert str(lesson.rule) == "6/10s+30/1m"
