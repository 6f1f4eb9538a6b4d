"""Whether a key's server counts the requests it refuses (`pacing.room`)."""

from __future__ import annotations

import time
from functools import partial

import anyio
import pytest

from batchrun.core.clock import LoopClock
from batchrun.core.limits import LimitKey, Pace, Rule, parse_rule
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.learning.lessons import Lesson
from batchrun.pacing.ledger import Ledger, MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.pacer import Pacer
from batchrun.pacing.room import ROOM_SUFFIX, Room, kept, recalled
from batchrun.pacing.slots import Grant, Usage, Wait
from tests.simulation import Network, Server, carried, simulate

KEY = LimitKey.RUN_QUERY
KNOWN = f"{KEY.value}{ROOM_SUFFIX}"

RULE = parse_rule("10/2s+30/10s")


def test_a_rule_is_lifted_by_the_refusals_still_counting_in_each_window():
    """Refusals counting until 1.0 and 5.0: at 6.0 only the second is in the
    2 s window, both are in the 10 s one."""
    room = Room(refusals=[1.0, 5.0])
    assert room.lifted(RULE, Pace.EXACT, 6.0) == parse_rule("11/2s+32/10s")
    # At 11.5 the first has left the longest window: it is forgotten.
    assert room.lifted(RULE, Pace.EXACT, 11.5) == parse_rule("10/2s+31/10s")
    assert room.refusals == [5.0]
    assert room.lifted(RULE, Pace.EXACT, 15.5) is None
    assert room.refusals == []


@pytest.mark.parametrize(
    ("room", "rule", "pace"),
    [
        (Room(counted=True, refusals=[5.0]), RULE, Pace.EXACT),
        (Room(refusals=[5.0]), RULE, Pace.SPREAD),
        (Room(refusals=[5.0]), Rule(RULE.windows, burst=3), Pace.EXACT),
    ],
    ids=["they count", "spaced evenly", "a bucket"],
)
def test_nothing_is_lifted_where_refusals_count(room, rule, pace):
    assert room.lifted(rule, pace, 6.0) is None


def test_an_acceptance_past_the_refusals_says_they_do_not_count():
    room = Room()
    assert room.answered(1, True, 2.0) is False  # a refusal, as any
    assert room.refusals == [2.0]
    assert room.steady is False  # it put the rule in question
    room.past.add(2)
    assert room.answered(2, False, 2.5) is False
    assert room.counted is False
    assert room.lifted(RULE, Pace.EXACT, 3.0) == parse_rule("11/2s+31/10s")


def test_a_refused_test_says_they_count_and_is_explained():
    room = Room(refusals=[2.0])
    room.past.add(7)
    assert room.answered(7, True, 2.5) is True
    assert room.counted is True
    assert room.lifted(RULE, Pace.EXACT, 3.0) is None


def test_a_test_with_no_answer_settles_nothing():
    room = Room(refusals=[2.0])
    room.past.add(7)
    assert room.answered(7, None, 2.5) is False
    assert room.counted is None
    assert room.past == set()


def test_any_refusal_once_they_did_not_count_makes_it_unknown_again():
    """Another consumer, a changed server: they count until tested again, and
    a request sent past them before settles nothing now."""
    room = Room(counted=False)
    room.past.update({3, 4})
    assert room.answered(5, True, 2.5) is False
    assert room.counted is None
    assert room.refusals == [2.5]
    assert room.past == set()
    assert room.answered(4, True, 2.6) is False
    assert room.counted is None


def test_the_lag_is_the_longest_a_request_counted_after_its_grant():
    room = Room()
    room.sent.update({1: 1.0, 2: 1.5, 3: 2.0})
    room.answered(1, False, 1.03)
    room.answered(2, True, 1.51)
    room.answered(3, None, 9.0)  # no answer: not an exchange's length
    assert room.lag == pytest.approx(0.03)
    assert room.sent == {}


def test_what_is_known_is_kept_and_read_back():
    assert recalled(kept(False, 100.0), now=200.0, kept_for=1000.0) is False
    assert recalled(kept(True, 100.0), now=200.0, kept_for=1000.0) is True
    assert recalled(kept(None, 100.0), now=200.0, kept_for=1000.0) is None
    assert recalled(kept(False, 100.0), now=2000.0, kept_for=1000.0) is None
    for text in (None, "", "{", '{"counted": 1, "at": 5}', '{"at": 5}', "[]"):
        assert recalled(text, now=200.0, kept_for=1000.0) is None


def known(ledger: MemoryLedger) -> bool | None:
    """What `ledger` keeps of whether the server counts refusals."""
    return recalled(ledger.recall(KNOWN), now=time.time(), kept_for=86400.0)


@pytest.mark.parametrize("counted", [None, True])
async def test_one_request_goes_past_a_refusal_to_test_whether_it_counts(counted):
    """2/60s: one accepted, one refused. Nothing goes past the refusal while
    it puts the rule in question; once a lesson stands, one request does (the
    test), unless the ledger kept that this server counts refusals."""
    ledger = MemoryLedger()
    if counted is not None:
        ledger.remember(KNOWN, kept(counted, time.time()))
    pacer = Pacer(rules={KEY: parse_rule("2/60s")}, ledger=ledger, clock=LoopClock())
    pacer.recall([KEY])
    first, second = await pacer.acquire(KEY), await pacer.acquire(KEY)
    assert pacer.release(KEY, first, refused=False) is False
    assert pacer.release(KEY, second, refused=True) is False
    with anyio.move_on_after(0.1) as waited:
        await pacer.acquire(KEY)
    assert waited.cancelled_caught
    pacer.learn(KEY, Lesson(parse_rule("2/60s"), "stands"), keep=False)
    with anyio.move_on_after(0.1) as waited:
        test = await pacer.acquire(KEY)
    assert waited.cancelled_caught is (counted is True)
    if counted is True:
        return
    with anyio.move_on_after(0.1) as waited:
        await pacer.acquire(KEY)
    assert waited.cancelled_caught  # one test at a time
    assert pacer.release(KEY, test, refused=False) is False
    assert known(ledger) is False


def _ledgers(tmp_path) -> list[Ledger]:
    """A memory ledger and a SQLite one on a clock that stands still."""
    sqlite = SqliteLedger(tmp_path / "l.db", client="c", hold=30.0, now=lambda: 0.0)
    return [MemoryLedger(), sqlite]


@pytest.mark.parametrize("which", ["memory", "sqlite"])
def test_a_ledger_read_by_the_plain_rule_keeps_what_the_lifted_one_needs(
    tmp_path, which
):
    """3/60s, refusals seen not to count: a and b accepted, c refused, d past
    c. A read by the plain rule (`Pacer.full` on "RateLimit-Remaining: 0")
    trimmed SQLite's history to 3, and the lifted 4/60s then let a fourth
    acceptance through within 60 s."""
    ledger = _ledgers(tmp_path)[which == "sqlite"]
    rule, room = parse_rule("3/60s"), Room(counted=False)

    def send(now: float, refused: bool) -> None:
        grant = room.reserve(ledger, KEY, rule, Pace.EXACT, now)
        assert isinstance(grant, Grant)
        ledger.release(grant.ticket, now + 0.05)
        room.answered(grant.ticket, refused, now + 0.05)

    send(0.0, False)
    send(0.2, False)
    send(0.4, True)
    room.steady = True
    send(1.0, False)  # past the refusal
    ledger.usage(KEY, rule)
    assert isinstance(room.reserve(ledger, KEY, rule, Pace.EXACT, 3.0), Wait)


def test_no_test_goes_while_a_request_is_in_flight():
    """It may not have reached the server yet: a counting server could see
    the test first, with room, and accept it."""
    ledger, rule = MemoryLedger(), parse_rule("3/60s")
    room = Room(refusals=[0.05])
    first = ledger.reserve(KEY, rule, Pace.EXACT, 0.0)
    assert isinstance(first, Grant)
    ledger.release(first.ticket, 0.05)
    assert isinstance(room.reserve(ledger, KEY, rule, Pace.EXACT, 59.0), Grant)
    assert isinstance(room.reserve(ledger, KEY, rule, Pace.EXACT, 59.0), Grant)
    # The rule (counting the refusal) is full until 60.05; left out, there
    # is room, but two are in flight.
    assert isinstance(room.reserve(ledger, KEY, rule, Pace.EXACT, 59.0), Wait)
    assert room.past == set()


class _Racing(MemoryLedger):
    """A shared ledger in which another process takes a slot by the plain
    3/60s right after this one read its usage, before it reserves."""

    def usage(self, key: str, rule: Rule) -> Usage:
        seen = super().usage(key, rule)
        taken = super().reserve(key, parse_rule("3/60s"), Pace.EXACT, 1.0)
        assert isinstance(taken, Grant)
        return seen


@pytest.mark.parametrize("racing", [True, False], ids=["raced", "alone"])
def test_only_a_test_goes_past_the_refusals_while_unknown(racing):
    """3/60s: a accepted at 0, then this process's refusal (counting to 0.45).
    At 1.0 the rule has one slot. Alone, the request takes it. Raced, another
    process takes it between this one's read and its reserve: the request
    waits for the window, not granted past the refusal unmarked (by the
    lifted 4/60s, where a counting server refuses it and the learner reads
    that as news of the limit)."""
    ledger, rule = (_Racing() if racing else MemoryLedger()), parse_rule("3/60s")
    for sent in (0.0, 0.4):
        grant = MemoryLedger.reserve(ledger, KEY, rule, Pace.EXACT, sent)
        assert isinstance(grant, Grant)
        ledger.release(grant.ticket, sent + 0.05)
    room = Room(refusals=[0.45])
    assert room.lifted(rule, Pace.EXACT, 1.0) == parse_rule("4/60s")
    answer = room.reserve(ledger, KEY, rule, Pace.EXACT, 1.0)
    assert room.past == set()
    if racing:
        # Until a slot leaves the window; the other process's request is in
        # flight, and none of this one's.
        assert answer == Wait(60.05)
        assert MemoryLedger.usage(ledger, KEY, rule).in_flight == 1
        assert room.sent == {}
    else:
        assert isinstance(answer, Grant)
        assert set(room.sent) == {answer.ticket}


def test_a_request_waits_for_another_process_s_answer_only_until_it_expires(
    tmp_path,
):
    """3/60s in a shared SQLite ledger: this process's refusal at 0, and
    three requests of another process in flight (paced past refusals of its
    own, by 4/60s). Nothing is a test (requests are in flight), so it waits
    by the rule, whose every slot waits on an answer: the ledger names the
    moment the other process's first lease expires, since no answer of this
    process is coming (before, the wait named no moment, and the pacer slept
    on this process's answers alone)."""
    path = tmp_path / "l.db"
    mine = SqliteLedger(path, client="c", hold=30.0, now=lambda: 0.0)
    other = SqliteLedger(path, client="c", hold=30.0, now=lambda: 0.0)
    rule = parse_rule("3/60s")
    refused = mine.reserve(KEY, rule, Pace.EXACT, 0.0)
    assert isinstance(refused, Grant)
    mine.release(refused.ticket, 0.05)
    for _ in range(3):
        past = other.reserve(KEY, parse_rule("4/60s"), Pace.EXACT, 0.1)
        assert isinstance(past, Grant)
    room = Room(refusals=[0.05])
    assert room.lifted(rule, Pace.EXACT, 1.0) == parse_rule("4/60s")
    # Leased for 30 s (`hold`) on the ledgers' clock, which stands at 0.
    assert room.reserve(mine, KEY, rule, Pace.EXACT, 1.0) == Wait(30.0)
    mine.close()
    other.close()


# Told 30/2s, a 10/2s server without Retry-After, 60 jobs: six windows exactly,
# so a refusal that holds a slot for nothing costs the last job a window.
STRICTER = partial(
    simulate,
    client="30/2s",
    count=60,
    latency=(0.002, 0.01),
    network=Network(traced=True),
)


def _server(*, count_refused: bool, retry_after: bool = False) -> Server:
    limiter = {"count_refused": count_refused}
    rule = parse_rule("10/2s")
    return Server(LimiterKind.SLIDING, rule, limiter, retry_after=retry_after)


@pytest.mark.parametrize("seed", [0, 2])
def test_refusals_the_server_does_not_count_take_no_room(seed):
    """The first refusals teach 10/2s; the next window tests one request past
    them, accepted: they take no room. The re-test's refusal later in the run
    makes it unknown again (they count), until the next steady window's test.
    Before, each refusal held a slot: 1.106 x."""
    ledger = MemoryLedger()
    run = STRICTER(server=_server(count_refused=False), seed=seed, ledger=ledger)
    assert run.finished
    assert run.ratio <= 1.03
    assert known(ledger) is not True


@pytest.mark.parametrize("retry_after", [False, True])
def test_a_server_that_counts_refusals_is_learned_once(retry_after):
    """The test is refused: the refusals count, as before, and the next run
    knows it and starts from the lesson at full speed. The refused test is
    not read by the learner: read, it taught "counts in another way", kept
    spaced evenly (the next run 1.21 x with Retry-After). Sent without the
    margin, a test a few milliseconds before the rule's own slot was accepted
    (with Retry-After) and the ledger said they do not count."""
    ledger = MemoryLedger()
    server = _server(count_refused=True, retry_after=retry_after)
    run = STRICTER(server=server, seed=0, ledger=ledger)
    assert run.finished
    assert sum(run.rate_limited.values()) <= 5
    assert run.ratio <= 1.25
    assert known(ledger) is True
    then = STRICTER(server=server, seed=0, ledger=carried(ledger))
    assert sum(then.rate_limited.values()) == 0
    assert then.ratio <= 1.01
