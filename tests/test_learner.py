"""The one owner of a run's learning (batchrun/pacing/learner.py) and the one text
format the ledger keeps (batchrun/pacing/kept.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import anyio
import pytest
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from batchrun.core.clock import LoopClock, wall_time
from batchrun.core.events import Because, Evidence, RuleLearned
from batchrun.core.limits import LimitKey, Pace, Rule, Window, parse_rule
from batchrun.pacing.kept import (
    KEPT_FOR,
    RECORD_SUFFIX,
    Kept,
    lesson_text,
    read_lesson,
)
from batchrun.pacing.learner import Learner
from batchrun.pacing.ledger import MemoryLedger
from batchrun.pacing.limiters import LimiterKind
from batchrun.pacing.model import Candidate, holds, joined
from batchrun.pacing.pacer import Pacer
from support.doubles import ListSink


@pytest.fixture
def anyio_backend():
    """Virtual time: the lifetimes these tests wait out cost nothing."""
    return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})


KEY = LimitKey.RUN_QUERY
GIVEN = parse_rule("30/2s")
TEN = Candidate(LimiterKind.SLIDING, parse_rule("10/2s"))


def kept(candidate: Candidate = TEN, *, began: float, life: float = 4.0) -> Kept:
    return Kept(candidate, Evidence(Because.REFUSED, 2), began, began + life, life)


def test_a_lesson_reads_back_as_kept_for_its_own_rule_only():
    now = wall_time()
    text = lesson_text(kept(began=now), given=GIVEN)
    back = read_lesson(text, given=GIVEN, now=now)
    assert back is not None
    assert (back.candidate, back.life) == (TEN, 4.0)
    assert read_lesson(text, given=parse_rule("20/2s"), now=now) is None
    assert read_lesson("{not json", given=GIVEN, now=now) is None
    old = lesson_text(kept(began=now - KEPT_FOR - 60), given=GIVEN)
    assert read_lesson(old, given=GIVEN, now=now) is None


def test_why_a_lesson_was_learned_is_kept_as_a_value():
    """The evidence reads back as it was kept: the refusals, or the rule the
    server stated; a kind of evidence no batchrun wrote reads as nothing."""
    now = wall_time()
    stated = Evidence(Because.STATED, rule=parse_rule("10/2s+500/1h"))
    for why in (Evidence(Because.AGAIN, 7), stated):
        lesson = replace(kept(began=now), why=why)
        back = read_lesson(lesson_text(lesson, given=GIVEN), given=GIVEN, now=now)
        assert back is not None
        assert back.why == why
    fields = json.loads(lesson_text(kept(began=now), given=GIVEN))
    fields["because"] = "a hunch"
    assert read_lesson(json.dumps(fields), given=GIVEN, now=now) is None


def test_a_kept_text_looser_than_the_given_rule_reads_as_nothing():
    """A hand edit or a damaged row cannot loosen a key past its rule."""
    now = wall_time()
    fields = json.loads(lesson_text(kept(began=now), given=GIVEN))
    fields["windows"] = [[40, 2.0]]
    assert read_lesson(json.dumps(fields), given=GIVEN, now=now) is None


def test_windows_are_kept_as_the_run_paced_by_them():
    """A lesson keeps the lengths its run paced by: learned under 30/2s (30/1m
    at --time-scale 30), it reads back as 10/2s for 30/2s, and as nothing for
    30/1m (a demo's lesson never paces the real API)."""
    now = wall_time()
    text = lesson_text(kept(began=now), given=GIVEN)
    fields = json.loads(text)
    assert (fields["given"], fields["windows"], fields["life"]) == (
        [[30, 2.0]],
        [[10, 2.0]],
        4.0,
    )
    back = read_lesson(text, given=GIVEN, now=now)
    assert back is not None
    assert (back.candidate.rule, back.life) == (parse_rule("10/2s"), 4.0)
    assert read_lesson(text, given=GIVEN.scaled(1 / 30), now=now) is None


def _learner(ledger: MemoryLedger, **options) -> tuple[Pacer, Learner, ListSink]:
    pacer = Pacer(rules={KEY: GIVEN}, ledger=ledger, clock=LoopClock())
    sink = ListSink()
    learner = Learner(pacer=pacer, clock=LoopClock(), sink=sink, **options)
    return pacer, learner, sink


async def test_a_kept_lesson_paces_the_next_run_until_it_expires():
    """Alive in the ledger, a lesson paces the run from its start and is
    reported as kept; by its end G paces again."""
    ledger = MemoryLedger()
    ledger.remember(
        KEY.value,
        lesson_text(kept(began=wall_time(), life=4.0), given=GIVEN),
    )
    pacer, learner, _ = _learner(ledger)
    [said] = learner.recall([KEY])
    assert isinstance(said, RuleLearned)
    assert said.kept
    assert pacer.rules[KEY] == parse_rule("10/2s")
    await anyio.sleep(4.1)
    entry = learner.sent(KEY, anyio.current_time())
    learner.answered(KEY, entry, anyio.current_time() + 0.01, refused=False)
    assert pacer.rules[KEY] == GIVEN


async def test_profile_auto_starts_from_the_safer_rule_for_a_lifetime():
    safer = parse_rule("15/2s+500/2m")
    pacer, learner, _ = _learner(MemoryLedger(), fallback={KEY: safer})
    learner.recall([KEY])
    assert pacer.rules[KEY] == safer


async def test_a_stated_policy_joins_the_given_rule_and_caps_the_record():
    """What the server states paces the key at once, and what the server was
    seen to accept is capped by it: a rerun never sends past the policy."""
    ledger = MemoryLedger()
    pacer, learner, sink = _learner(ledger)
    learner.recall([KEY])
    now = anyio.current_time()
    for n in range(20):
        entry = learner.sent(KEY, now + 0.01 * n)
        learner.answered(KEY, entry, now + 0.01 * n + 0.005, refused=False)
    learner.stated(KEY, (Window(10, 2.0),))
    assert pacer.rules[KEY] == parse_rule("10/2s")
    assert sink.of(RuleLearned)
    record = json.loads(ledger.recall(f"{KEY.value}{RECORD_SUFFIX}") or "{}")
    assert max(count for count, _ in record["seen"]) <= 10


async def test_a_stated_count_is_paced_in_the_window_its_reset_names():
    """X-RateLimit's count of 10 with a reset of 1.999 s, said 0.1 s after the
    send, paces the key by 10/2s from that answer; a fixed window's later,
    shorter reset (its countdown) leaves it so."""
    pacer, learner, sink = _learner(MemoryLedger())
    learner.recall([KEY])
    learner.stated(KEY, (), limit=10, reset=1.999, trip=0.1)
    assert pacer.rules[KEY] == parse_rule("10/2s")
    assert [e.evidence.because for e in sink.of(RuleLearned)] == [Because.STATED]
    learner.stated(KEY, (), limit=10, reset=0.45, trip=0.1)
    assert pacer.rules[KEY] == parse_rule("10/2s")


async def test_a_statement_stands_two_of_its_windows_then_a_looser_one_is_followed():
    """What the server states stands for two of its windows after it last
    said it: a stricter statement joins at once, a looser one (a plan raised
    mid-run) once the stricter has gone unsaid that long; in every dialect,
    and never past the given rule."""
    pacer, learner, _ = _learner(MemoryLedger())
    learner.recall([KEY])
    learner.stated(KEY, (Window(10, 2.0),))
    learner.stated(KEY, (Window(20, 2.0),))
    assert pacer.rules[KEY] == parse_rule("10/2s")
    await anyio.sleep(4.1)
    learner.stated(KEY, (Window(20, 2.0),))
    assert pacer.rules[KEY] == parse_rule("20/2s")
    learner.stated(KEY, (), limit=5, reset=2.0, trip=0.01)
    assert pacer.rules[KEY] == parse_rule("5/2s")
    await anyio.sleep(4.1)
    learner.stated(KEY, (), limit=25, reset=2.0, trip=0.01)
    assert pacer.rules[KEY] == parse_rule("25/2s")
    learner.stated(KEY, (Window(90, 2.0),))
    assert pacer.rules[KEY] == parse_rule("25/2s")
    await anyio.sleep(4.1)
    learner.stated(KEY, (Window(90, 2.0),))
    assert pacer.rules[KEY] == GIVEN


async def test_a_server_stating_its_tightest_quota_keeps_each_it_named():
    """X-RateLimit names one quota an answer, the one with the fewest left: a
    server enforcing 10/2s and 8/1s names each in turn. Both hold, and the
    key is not paced again at each turn."""
    pacer, learner, sink = _learner(MemoryLedger())
    learner.recall([KEY])
    for _ in range(5):
        learner.stated(KEY, (), limit=10, reset=1.999, trip=0.01)
        learner.stated(KEY, (), limit=8, reset=0.999, trip=0.01)
    assert pacer.rules[KEY] == parse_rule("8/1s+10/2s")
    assert len(sink.of(RuleLearned)) == 2


async def test_a_count_no_longer_stated_stands_two_of_its_windows():
    """A count read in 2 s stands while stated, and for two of its windows
    after: a server that loosened (3 to 7) is followed once the old count
    has gone unsaid that long, though the new one names a shorter window."""
    pacer, learner, _ = _learner(MemoryLedger())
    learner.recall([KEY])
    learner.stated(KEY, (), limit=3, reset=1.999, trip=0.01)
    await anyio.sleep(1.0)
    learner.stated(KEY, (), limit=7, reset=0.999, trip=0.01)
    assert pacer.rules[KEY] == parse_rule("3/2s")
    await anyio.sleep(3.5)
    learner.stated(KEY, (), limit=7, reset=0.999, trip=0.01)
    assert pacer.rules[KEY] == parse_rule("7/1s+30/2s")


async def test_a_policy_the_server_loosens_ends_what_was_learned_under_it():
    """A lesson learned from refusals (10/2s) outlives a stricter statement
    that it already holds to (20/2s), but not the server loosening it (back to
    30/2s, once 20/2s has gone unsaid two of its windows): what the refusals
    showed is old news, and the given rule paces."""
    ledger = MemoryLedger()
    lesson = kept(began=wall_time(), life=60.0)
    ledger.remember(KEY.value, lesson_text(lesson, given=GIVEN))
    pacer, learner, _ = _learner(ledger)
    learner.recall([KEY])
    learner.stated(KEY, (Window(20, 2.0),))
    assert pacer.rules[KEY] == parse_rule("10/2s")
    await anyio.sleep(4.1)
    learner.stated(KEY, (Window(30, 2.0),))
    assert pacer.rules[KEY] == GIVEN


async def test_a_statement_holds_a_lesson_that_paces_slower_but_bursts_more():
    """A lesson of 15/2s paces slower than a stated 5/250ms, yet sends 15 at
    once: the statement joins it, and the key keeps both."""
    ledger = MemoryLedger()
    fifteen = Candidate(LimiterKind.SLIDING, parse_rule("15/2s"))
    lesson = kept(fifteen, began=wall_time(), life=60.0)
    ledger.remember(KEY.value, lesson_text(lesson, given=GIVEN))
    pacer, learner, _ = _learner(ledger)
    learner.recall([KEY])
    learner.stated(KEY, (Window(5, 0.25),))
    assert pacer.rules[KEY] == parse_rule("5/250ms+15/2s")


@given(
    policy=st.lists(
        st.builds(Window, st.integers(1, 100), st.sampled_from([0.5, 1.0, 2.0, 7.0])),
        max_size=3,
    )
)
def test_a_stated_policy_never_allows_more_than_the_given_rule(policy):
    """Whatever the server states, every window of the given rule still holds."""
    rule = joined(GIVEN, tuple(policy))
    assert all(any(holds(w, g) for w in rule.windows) for g in GIVEN.windows)
    assert all(any(holds(w, p) for w in rule.windows) for p in policy)


async def test_none_remaining_teaches_the_count_without_a_429():
    """Ten answers, the tenth saying none remain for 1.9 s: read as a refusal of
    the next request and of one 0.9 s later (a reset in whole seconds may be
    rounded up by one), the key is paced by at most 10 per second before any
    429 (10 per 2 s is as plain a reading; the faster one goes first)."""
    pacer, learner, _ = _learner(MemoryLedger())
    learner.recall([KEY])
    now = anyio.current_time()
    for n in range(10):
        entry = learner.sent(KEY, now + 0.01 * n)
        at = now + 0.01 * n + 0.005
        learner.answered(KEY, entry, at, refused=False, spent=1.9 if n == 9 else None)
    # A lone word is no lesson (TAU); the second agreeing one is.
    later = now + 2.5
    for n in range(10):
        entry = learner.sent(KEY, later + 0.01 * n)
        at = later + 0.01 * n + 0.005
        learner.answered(KEY, entry, at, refused=False, spent=1.9 if n == 9 else None)
    rule = pacer.rules[KEY]
    assert rule != GIVEN
    assert rule.interval >= 0.1 - 1e-9, rule
    assert pacer.pace(KEY) in (Pace.EXACT, Pace.SPREAD)


def test_a_rule_is_kept_with_the_given_rule_it_tightened():
    """`Rule` of a kept lesson always holds to every window of the given one."""
    now = wall_time()
    text = lesson_text(kept(began=now), given=GIVEN)
    back = read_lesson(text, given=GIVEN, now=now)
    assert back is not None
    rule: Rule = back.candidate.rule
    assert all(any(w.count <= g.count for w in rule.windows) for g in GIVEN.windows)
