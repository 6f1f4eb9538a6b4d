"""Answers by status code and latency percentiles per endpoint (core/responses.py)."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchrun.core.events import JobAnswered, JobFinished, JobSent, Status, Tee
from batchrun.core.limits import LimitKey
from batchrun.core.responses import Latencies, Responses

RQ = LimitKey.RUN_QUERY


def test_codes_are_counted_per_endpoint_in_order():
    """Codes read `200: n, 400: n, 429: n`, numerically, no answer last."""
    found = Responses()
    for status in [429, 200, 400, 200, None, 200]:
        found.add(RQ, status, 0.1)
    found.add(LimitKey.INVITE, 201, 0.1)
    assert found.keys[RQ].codes_text() == "200: 3, 400: 1, 429: 1, error: 1"
    assert found.keys[LimitKey.INVITE].codes_text() == "201: 1"


def test_as_a_sink_it_counts_answers_only():
    """Fed a run's events, it counts each JobAnswered and nothing else."""
    found = Responses()
    found.emit(JobSent(0.0, RQ, "a", 1))
    found.emit(JobAnswered(1.0, RQ, "a", 200, 0.25))
    found.emit(JobFinished(1.0, RQ, "a", Status.DONE, 1, 200, None))
    assert found.keys[RQ].codes_text() == "200: 1"
    assert found.keys[RQ].latency.max == 0.25


def test_an_attempt_without_an_answer_adds_no_latency():
    """A timeout's wait is not a server's latency: only answers are timed."""
    found = Responses()
    found.add(RQ, None, 30.0)
    found.add(RQ, 200, 0.2)
    latency = found.keys[RQ].latency
    assert latency.count == 1
    assert latency.max == 0.2


def _nearest_rank(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    rank = max(1, -(-p * len(ordered) // 100))
    return ordered[int(rank) - 1]


@given(
    st.lists(st.floats(min_value=1e-4, max_value=600.0), min_size=1, max_size=300),
    st.sampled_from([1.0, 50.0, 90.0, 95.0, 99.0, 100.0]),
)
def test_a_percentile_is_within_one_percent_of_the_samples(samples, p):
    """Whatever the samples, the histogram's percentile is the nearest-rank
    one within 1 %, and the maximum is exact."""
    latency = Latencies()
    for value in samples:
        latency.add(value)
    exact = _nearest_rank(samples, p)
    found = latency.percentile(p)
    assert found is not None
    assert abs(found - exact) <= 0.01 * exact
    assert latency.max == max(samples)


def test_percentiles_of_a_known_spread():
    """1..100 ms: p50 is 50 ms and p95 is 95 ms, to the histogram's 1 %."""
    latency = Latencies()
    values = [n / 1000 for n in range(1, 101)]
    random.Random(3).shuffle(values)
    for value in values:
        latency.add(value)
    assert latency.percentile(50) == pytest.approx(0.050, rel=0.01)
    assert latency.percentile(95) == pytest.approx(0.095, rel=0.01)
    assert latency.percentile(100) == pytest.approx(0.100, rel=0.01)
    assert Latencies().percentile(50) is None


def test_latency_text_reads_like_a_load_tester_summary():
    """`p50 …, p95 …, max …` in spoken durations; empty without an answer."""
    found = Responses()
    for ms in (100, 100, 100, 400):
        found.add(RQ, 200, ms / 1000)
    # The histogram reads p95 within 1 % of 400 ms; the maximum is exact.
    text = found.keys[RQ].latency_text()
    assert re.fullmatch(
        r"p50 (99|100|101) ms, p95 (39[6-9]|40[0-4]) ms, max 400 ms", text
    )
    found.add(LimitKey.AVATAR, None, 1.0)
    assert found.keys[LimitKey.AVATAR].latency_text() == ""


def test_the_json_form_reads_back_the_same():
    """What the run store keeps reads back to the same counts and percentiles."""
    found = Responses()
    for i in range(50):
        found.add(RQ, 200 if i % 10 else 429, 0.01 * (i + 1))
    found.add(LimitKey.INVITE, None, 1.0)
    back = Responses.from_json(json.loads(json.dumps(found.to_json())))
    assert back.to_json() == found.to_json()
    assert back.keys[RQ].latency.percentile(95) == found.keys[RQ].latency.percentile(95)
    assert back.keys[RQ].latency.count == 50


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(None, id="none"),
        pytest.param([1, 2], id="a-list"),
        pytest.param({"nope": {}}, id="unknown-key"),
        pytest.param({"invite": {"codes": 3}}, id="bad-codes"),
        pytest.param(
            {"invite": {"codes": {}, "buckets": {}, "max": "x"}}, id="bad-max"
        ),
    ],
)
def test_anything_else_reads_as_no_responses(value):
    """A store of an older batchrun (or a damaged value) shows no responses."""
    assert Responses.from_json(value).keys == {}


def test_a_tee_hands_each_event_to_every_sink():
    """Two sinks fed through a Tee count the same answers."""
    first, second = Responses(), Responses()
    tee = Tee(first, second)
    tee.emit(JobAnswered(1.0, RQ, "a", 200, 0.25))
    assert first.to_json() == second.to_json() != {}
