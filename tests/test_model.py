"""The one model of a key's server (batchrun/pacing/model.py): a test for each
promise its screen makes, on random evidence (hypothesis) and on logs that a
server model of `limiters` answered."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchrun.core.events import Because, Evidence
from batchrun.core.limits import Pace, Rule, Window, parse_rule
from batchrun.pacing.limiters import Limiter, LimiterKind, make_limiter
from batchrun.pacing.model import (
    ENDS,
    FIRST_LIFE,
    TAU,
    USUAL,
    Answer,
    Candidate,
    Family,
    Judge,
    KeyModel,
    bursts,
    choose,
    explains,
    lengths,
    named_window,
    phases_of,
    said,
)
from batchrun.pacing.slots import Usage, earliest_slot

WHY = Evidence(Because.REFUSED, 2)
GIVEN = parse_rule("30/2s")
LENGTHS = lengths(GIVEN)


def answered(server: str, kind: LimiterKind, sends: list[float], **options):
    """A log of requests sent at `sends` (arriving within 5 ms) as a server
    model of `kind` enforcing `server` answered them."""
    limiter = make_limiter(kind, parse_rule(server), **options)
    log = []
    for moment in sends:
        arrived = moment + 0.002
        ok = limiter.admit("c", "k", arrived) is None
        log.append(Answer(moment, moment + 0.005, ok))
    return log


def holds(rule: Rule, given: Rule) -> bool:
    """Whether `rule` lets through no more than `given` in any of its windows."""
    return all(
        any(w.seconds >= g.seconds and w.count <= g.count for w in rule.windows)
        for g in given.windows
    )


evidence = st.lists(
    st.tuples(st.floats(0, 20, allow_nan=False), st.floats(0, 0.2), st.booleans()).map(
        lambda t: Answer(t[0], t[0] + t[1], t[2])
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(evidence)
def test_a_lesson_never_allows_more_than_the_given_rule(answers):
    """Whatever the answers, the candidate chosen holds to every window of G."""
    chosen = choose(GIVEN, answers, LENGTHS)
    assert chosen is None or holds(chosen.rule, GIVEN)


@settings(max_examples=60, deadline=None)
@given(evidence, st.floats(0, 20, allow_nan=False))
def test_a_lone_429_never_changes_the_pace(accepted, moment):
    """Acceptances and one refusal (TAU): nothing changes."""
    answers = [a for a in accepted if a.accepted][:40]
    answers.append(Answer(moment, moment + 0.01, accepted=False))
    assert TAU == 1
    assert choose(GIVEN, answers, LENGTHS) is None


def test_refusals_the_given_rule_explains_are_no_news():
    """G's count probed over 0.86 s, the 30th answer saying none remain for
    0.615 s (a refusal of the next request, which G itself refuses), then an
    outage's first 429 where G had room, with a Retry-After of 2 s (and its
    echo): one refusal G does not explain is a lone 429, and nothing changes.
    Seed 10043 of the random draws: a weighted 29/2s explained both, and paced
    the next run evenly at 1.5 x."""
    sends = [0.0, *(0.105 + 0.0262 * n for n in range(29))]
    probes = [Answer(t, t + 0.013, True) for t in sends]
    edge = Answer(sends[-1], sends[-1] + 0.013, False, wait=0.615, said=True)
    outage = Answer(2.105, 2.114, False, wait=2.0)
    answers = [*probes, edge, outage, *said([outage])]
    assert choose(GIVEN, answers, LENGTHS, phases_of(answers)) is None


def test_a_fixed_window_is_tried_from_after_a_refusal_a_weighted_from_before():
    """A fixed window refuses at its end, so the next begins after the refusal
    arrived; a weighted counter refuses at its start, so it began before; both
    begin where a Retry-After says the window ends. Only the last two count."""
    old = Answer(0.5, 0.51, False)
    first, second = Answer(1.0, 1.02, False, wait=1.0), Answer(1.1, 1.13, False)
    accepted = Answer(1.2, 1.21, True)
    phases = phases_of([old, first, accepted, second])
    assert sorted(phases.fixed) == [1.02, 1.13, 2.02]
    assert sorted(phases.weighted) == [1.0, 1.1, 2.02]


def test_two_refusals_a_stricter_log_explains_choose_it():
    """Ten accepted at once, then two refused: the fastest candidate that
    explains both is a log of 10 per some window, never looser than G."""
    log = answered("10/2s", LimiterKind.SLIDING, [0.01 * n for n in range(12)])
    chosen = choose(GIVEN, log, LENGTHS)
    assert chosen is not None
    assert chosen.kind is LimiterKind.SLIDING
    assert min(w.count for w in chosen.rule.windows) <= 10
    assert explains(chosen, log)


@pytest.mark.parametrize("seed", range(5))
def test_a_stricter_sliding_server_is_explained_by_what_is_chosen(seed):
    """Requests at random moments against a server stricter than G: the
    candidate chosen explains every refusal, and no acceptance rules it out."""
    rng = random.Random(seed)
    sends = sorted(rng.uniform(0, 8) for _ in range(120))
    log = answered("10/2s", LimiterKind.SLIDING, sends)
    chosen = choose(GIVEN, log, LENGTHS)
    assert chosen is not None
    assert explains(chosen, log)
    assert chosen.rule.interval >= 0.2 - 1e-9  # no faster than the server


@pytest.mark.parametrize("kind", [LimiterKind.SLIDING, LimiterKind.FIXED])
def test_refusals_answered_before_the_work_of_those_sent_with_them(kind):
    """Nine requests leave together; a server of 7 a window accepts seven and
    answers them after 0.1 s of work, and refuses two at once. Each end puts
    the refusals first (the same send; an earlier latest arrival), but the
    server counted the seven before them: its own rule explains both."""
    burst = [Answer(1.0, 1.002, False), Answer(1.0, 1.003, False)]
    burst += [Answer(1.0, 1.05, True) for _ in range(7)]
    server = Family(kind, GIVEN, 0.5, origin=0.75).at(7)
    assert explains(server, burst)
    judge = Judge(Family(kind, GIVEN, 0.5, origin=0.75), burst)
    assert judge.explained(7) == {0, 1}
    assert not judge.ruled_out(7)


def test_refusals_that_no_candidate_explains_are_set_aside():
    """Refusals of requests sent while the window was all but empty (a stray
    429, an outage), after acceptances at G's full count: nothing changes."""
    full = [Answer(0.01 * n, 0.01 * n + 0.005, True) for n in range(30)]
    strays = [Answer(3.0 + n, 3.005 + n, False) for n in range(3)]
    assert choose(GIVEN, full + strays, LENGTHS) is None


def test_a_weighted_counter_is_kept_evenly():
    """A candidate of the weighted counter's shape is paced evenly; the others
    exactly."""
    weighted = Family(LimiterKind.WEIGHTED, GIVEN, 2.0).at(20)
    assert weighted.pace is Pace.SPREAD
    assert Family(LimiterKind.FIXED, GIVEN, 2.0).at(20).pace is Pace.EXACT


def refused_at(candidate: Candidate, answers: list[Answer]) -> list[set[int]]:
    """The answers `candidate` refuses at each of `ENDS`, each end replayed
    afresh through its server model."""
    found = []
    for at in ENDS:
        limiter, refused = candidate.limiter(), set()
        for i in sorted(range(len(answers)), key=lambda i: at(answers[i])):
            a = answers[i]
            if not limiter.replay("", "", at(a), accepted=a.accepted):
                refused.add(i)
        found.append(refused)
    return found


# Answers crowded into a few windows of 1 s, so that where each arrived matters.
crowded = st.lists(
    st.tuples(st.floats(0, 3, allow_nan=False), st.floats(0, 0.3), st.booleans()).map(
        lambda t: Answer(t[0], t[0] + t[1], t[2])
    ),
    max_size=80,
)


@settings(max_examples=100, deadline=None)
@given(
    crowded,
    st.sampled_from([LimiterKind.SLIDING, LimiterKind.FIXED, LimiterKind.WEIGHTED]),
)
def test_a_count_read_off_the_replay_is_what_a_search_finds(answers, kind):
    """A family replayed once reads its least count and its fastest off the
    replay; each is the count a search over the count finds (ruling out and
    explaining are monotone in it)."""
    judge = Judge(Family(kind, GIVEN, 1.0, origin=0.3), answers)
    most = judge.family.most
    counts = range(1, most + 1)
    standing = [n for n in counts if not judge.ruled_out(n)]
    assert judge.least() == (standing[0] if standing else None)
    refusals = frozenset(i for i, a in enumerate(answers) if not a.accepted)
    for count in (1, most // 2, most):
        early, late, last = refused_at(judge.family.at(count, alone=True), answers)
        accepted = {i for i, a in enumerate(answers) if a.accepted}
        assert judge.explained(count) == (early | late | last) - accepted
        assert judge.ruled_out(count) == bool(early & late & accepted)
    for low in (1, most // 2, most):
        explaining = [n for n in counts if n >= low and refusals <= judge.explained(n)]
        found = judge.fastest(low, refusals)
        if explaining and explaining[0] == low:
            assert found == judge.family.at(explaining[-1])
        else:
            assert found is None


def test_counts_are_searched_and_monotone():
    """A larger count accepts whatever a smaller one does: the least count no
    acceptance rules out is what was accepted in the busiest window."""
    log = answered("30/2s", LimiterKind.SLIDING, [0.05 * n for n in range(25)])
    judge = Judge(Family(LimiterKind.SLIDING, GIVEN, 2.0), log)
    assert not judge.ruled_out(25)
    assert judge.ruled_out(24)


def test_a_retry_after_says_when_a_request_would_still_be_refused():
    """A refusal with a Retry-After of 3 s is read as a refusal 2 s later too
    (a second of rounding), so a short window that would have room by then
    does not explain it."""
    refusal = Answer(1.0, 1.1, False, wait=3.0)
    [word] = said([refusal, Answer(0.5, 0.6, True)])
    assert word.sent == pytest.approx(3.1)
    assert (word.accepted, word.said, word.echo) == (False, True, True)
    assert said([Answer(1.0, 1.1, False, wait=0.5)]) == []


def test_every_lesson_is_re_tested_within_its_lifetime():
    """Adopted at t, a lesson paces the key until t + its life, then G does."""
    model = KeyModel(GIVEN, LENGTHS)
    lesson = model.adopt(Candidate(LimiterKind.SLIDING, parse_rule("10/2s")), WHY, 5.0)
    assert lesson.life == FIRST_LIFE * 2.0
    assert model.current(5.0 + lesson.life - 1e-6).rule == parse_rule("10/2s")
    assert model.current(5.0 + lesson.life).rule == GIVEN


def test_a_lesson_the_server_confirms_again_lives_twice_as_long():
    """Expired, a lesson that explains the next refusals is adopted again with
    twice its life; one that does not is not."""
    model = KeyModel(GIVEN, LENGTHS)
    ten = Candidate(LimiterKind.SLIDING, parse_rule("10/2s"))
    model.adopt(ten, WHY, 0.0)
    model.current(4.0)  # expired
    for answer in answered(
        "10/2s", LimiterKind.SLIDING, [4.0 + 0.01 * n for n in range(12)]
    ):
        model.add(answer, answer.latest)
    again = model.decide(4.2)
    assert again is not None
    assert (again.candidate, again.life) == (ten, 2 * FIRST_LIFE * 2.0)


def test_a_lessons_life_counts_in_its_own_windows_not_in_gs():
    """Told 15/2s+500/2m, a lesson of 20/10s lives two of its 10 s, not two of
    G's 2 minutes; a shape alone (G's rule, weighted) lives two of G's
    shortest."""
    given = parse_rule("15/2s+500/2m")
    model = KeyModel(given, lengths(given))
    ten = Candidate(LimiterKind.SLIDING, parse_rule("15/2s+20/10s+500/2m"))
    assert model.adopt(ten, WHY, 0.0).life == FIRST_LIFE * 10.0
    shape = Candidate(LimiterKind.WEIGHTED, given)
    assert model.adopt(shape, WHY, 0.0).life == FIRST_LIFE * 2.0


@pytest.mark.parametrize("seed", range(20))
def test_no_lesson_is_about_a_window_longer_than_its_evidence(seed):
    """Told 15/2s+500/2m and paced by the model's choice, with 10 % stray
    429s from the start of a run: no lesson's own window is longer than the
    answers span, or G's shortest. A longer one would explain any refusal, as
    each request is a new peak of it (without the bound, 9 of the first 40
    seeds learned 21/10s to 49/10s or 40/1m within 6 s)."""
    given = parse_rule("15/2s+500/2m")
    rng = random.Random(seed)
    model = KeyModel(given, lengths(given))
    sends: list[float] = []
    now = 0.0
    while now < 12.0:
        chosen = model.current(now)
        usage = Usage(0, sends, sends[-1] if sends else None)
        now = max(now, earliest_slot(usage, chosen.rule) or now)
        now += rng.uniform(0.001, 0.01)
        sends.append(now)
        accepted = rng.random() > 0.1
        model.add(Answer(now, now + 0.005, accepted), now + 0.005)
        lesson = None if accepted else model.decide(now + 0.005)
        if lesson is not None:
            span = max(now - model.answers[0].sent, given.shortest.seconds)
            assert model.own(lesson.candidate) <= span, lesson.candidate


def test_a_lesson_ends_when_the_answers_choose_g():
    """A lesson slower than the answers show (a window of G accepted in full
    since, refusals only past it) ends at the next reading: G paces again."""
    model = KeyModel(GIVEN, LENGTHS)
    model.adopt(Candidate(LimiterKind.SLIDING, parse_rule("5/2s")), WHY, 0.0)
    for answer in answered("30/2s", LimiterKind.SLIDING, [0.01 * n for n in range(34)]):
        model.add(answer, answer.latest)
    assert model.decide(0.5) is None
    assert model.current(0.5) == model.plain
    assert model.expired is not None
    assert model.expired.expires == 0.5


def test_the_evidence_keeps_to_its_horizon():
    """Answers older than the horizon leave the evidence."""
    model = KeyModel(GIVEN, LENGTHS)
    model.add(Answer(0.0, 0.01, True), 0.01)
    model.add(Answer(100.0, 100.01, True), 100.01)
    assert [a.sent for a in model.answers] == [100.0]


def test_the_horizon_is_in_gs_longest_window_not_the_longest_length_tried():
    """Under 10/40s the usual 1 m is tried too, yet the evidence keeps to 4 of
    G's 40 s (160 s), not 4 of 60 s."""
    given = parse_rule("10/40s")
    model = KeyModel(given, lengths(given))
    assert 60.0 in model.lengths
    model.add(Answer(0.0, 0.01, True), 0.01)
    model.add(Answer(200.0, 200.01, True), 200.01)
    assert [a.sent for a in model.answers] == [200.0]


def test_lengths_span_a_tenth_of_the_shortest_to_half_the_horizon():
    found = lengths(parse_rule("15/1m+500/1h"))
    assert found[0] == pytest.approx(6.0)
    assert {60.0, 3600.0} <= set(found)
    assert max(found) <= 2 * 3600.0
    # The usual lengths as a run at --time-scale 30 gives them: 1/3 s (10 s)
    # and 2 s (1 m) fall in range; 1/30 s (1 s) is under a tenth of 2 s. The
    # grid (halves down from G's 2 s) adds 1 s and 0.5 s, not 0.25 s (within
    # a square root of 2 of the tenth, 0.2 s), and nothing past G's 2 s.
    usual = [seconds / 30 for seconds in USUAL]
    found = lengths(parse_rule("30/2s"), usual=usual)
    assert found == pytest.approx((0.2, 1 / 3, 0.5, 1.0, 2.0))


def paced(
    model: KeyModel,
    server: Limiter,
    seed: int,
    more: Callable[[float, list[float]], bool],
) -> tuple[float, list[float], list[float]]:
    """Closed loop: send as the model's choice allows, against `server`,
    reading each refusal, while `more(now, refused)`; the moment it stopped,
    and when requests were accepted and refused."""
    rng = random.Random(seed)
    sends: list[float] = []
    accepted: list[float] = []
    refused: list[float] = []
    now = 0.0
    while more(now, refused):
        chosen = model.current(now)
        slot = earliest_slot(Usage(0, sends, sends[-1] if sends else None), chosen.rule)
        now = max(now, slot or now) + rng.uniform(0, 0.001)
        ok = server.admit("c", "k", now + 0.001) is None
        sends.append(now + 0.002)
        model.add(Answer(now, now + 0.002, ok), now + 0.002)
        (accepted if ok else refused).append(now)
        if not ok:
            model.decide(now + 0.002)
    return now, accepted, refused


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 20), st.sampled_from([0.5, 1.0, 2.0]), st.integers(0, 2**32 - 1))
def test_paced_by_its_choices_a_stricter_log_stops_refusing(count, seconds, seed):
    """Closed loop against a sliding log stricter than G, sending as the
    model's choice allows: each wrong choice is a candidate the next refusal
    rules out, so after a few refusals (a lone one, then at most one per
    length tried) the key sends a further window with none."""
    server = make_limiter(LimiterKind.SLIDING, Rule((Window(count, seconds),)))
    now, _, refused_at = paced(
        KeyModel(GIVEN, LENGTHS),
        server,
        seed,
        lambda now, refused: now < 40.0 and (not refused or now < refused[-1] + 4.0),
    )
    assert now < 40.0, "still refused after 40 s"
    assert len(refused_at) <= TAU + 1 + len(LENGTHS) * 2


@pytest.mark.parametrize(("rate", "burst"), [(15, 1), (10, 1), (12, 5), (7, 2)])
@pytest.mark.parametrize("seed", range(2))
def test_a_bucket_slower_than_g_is_read_as_a_bucket(rate, burst, seed):
    """Closed loop against an nginx bucket that drains `rate` per 2 s, slower
    than G's 30/2s: the key is paced by a bucket at that rate, or at no less
    than half of it, with a burst no larger than the server's; and it sends a
    further window with no refusal."""
    server = make_limiter(LimiterKind.LEAKY, Rule((Window(rate, 2.0),)), burst=burst)
    model = KeyModel(GIVEN, LENGTHS)
    now, _, _ = paced(
        model,
        server,
        seed,
        lambda now, refused: now < 40.0 and (not refused or now < refused[-1] + 4.0),
    )
    assert now < 40.0, "still refused after 40 s"
    model.current(now)
    last = model.lesson or model.expired  # what paced the window with none
    assert last is not None
    chosen = last.candidate
    assert chosen.kind is LimiterKind.LEAKY
    assert rate / 2 <= chosen.rule.shortest.count <= rate
    assert chosen.rule.shortest.seconds == 2.0
    assert (chosen.rule.burst or 0) <= burst


def test_a_slower_bucket_is_tried_at_bursts_that_are_powers_of_two():
    """Below G's shortest count: 30 gives five bursts, 10 four, 1 none (a
    bucket of no burst is a window of one, a length on the grid)."""
    assert bursts(GIVEN) == [1, 2, 4, 8, 16]
    assert bursts(parse_rule("10/10s+500/1h")) == [1, 2, 4, 8]
    assert bursts(parse_rule("1/1s")) == []


@pytest.mark.parametrize("server", ["3/2.5s", "4/3s", "2/1.5s", "3/3.5s"])
@pytest.mark.parametrize("seed", range(2))
def test_a_window_between_the_usual_lengths_is_paced_within_twice(server, seed):
    """Told 15/10s, a sliding log whose window is none of the lengths G or the
    usual ones name: the grid of lengths holds one within twice it, so once
    the refusals are read the key has at least half the server's rate
    accepted (in the next usual length up, 10 s, it had less than half)."""
    given, rule = parse_rule("15/10s"), parse_rule(server)
    limiter = make_limiter(LimiterKind.SLIDING, rule)
    model = KeyModel(given, lengths(given))
    _, accepted, _ = paced(model, limiter, seed, lambda now, _: now < 60.0)
    late = sum(moment > 40.0 for moment in accepted) / 20.0
    assert late >= 0.5 / rule.interval


@given(
    given_rule=st.sampled_from(["30/2s", "120/60s", "15/60s+500/3600s"]),
    data=st.data(),
)
def test_a_stated_count_is_read_in_the_window_of_its_first_reset(given_rule, data):
    """A sliding log's first answer states its reset `elapsed` after the request
    arrived (up to a tenth of the window), and the answer comes `trip` after
    the send: for every candidate length, that reset names that window."""
    rule = parse_rule(given_rule)
    found = lengths(rule)
    window = data.draw(st.sampled_from(found))
    elapsed = data.draw(st.floats(0.0, 0.1)) * window
    trip = elapsed + data.draw(st.floats(0.0, 0.1)) * window
    named = named_window(10, window - elapsed, trip, found)
    assert named == Window(10, window)


@pytest.mark.parametrize(
    ("given_rule", "reset", "trip", "seconds"),
    [
        ("120/60s", 61.0, 0.05, 60.0),  # slowapi: a second late, in whole seconds
        ("30/2s", 2.93, 0.01, 2.0),  # the same, with windows scaled
        ("30/2s", 2.0, 0.1, 2.0),  # stamped as it arrived, read at the answer
        ("30/2s", 0.067, 0.02, None),  # a bucket's: until one more fits
        ("120/60s", 45.0, 0.2, None),  # a window of no length tried
    ],
)
def test_a_reset_names_a_window_only_where_a_length_is_tried(
    given_rule, reset, trip, seconds
):
    """Within its rounding below, or its answer's time above, a reset names a
    candidate length; where it names none, the count joins no rule."""
    named = named_window(10, reset, trip, lengths(parse_rule(given_rule)))
    assert named == (None if seconds is None else Window(10, seconds))
