"""Reading what a server says about its limits from its response headers."""

from __future__ import annotations

import email.utils
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchrun.api.hints import Hints, read_hints
from batchrun.core.limits import Window

NOW = 1_795_429_376.0  # 2026-11-23, the capture day of the fixtures
CAP = 900.0
DATA = Path(__file__).parent / "data"
_CAPTURED = [
    (path.stem.removeprefix("ratelimit_headers_"), index, fixture)
    for path in sorted(DATA.glob("ratelimit_headers_*.json"))
    for index, fixture in enumerate(json.loads(path.read_text()))
]
# nginx's limit_req states nothing, not even Retry-After on its 429.
FIXTURES = [
    pytest.param(fixture, id=f"{source}-{index}-{fixture['status']}")
    for source, index, fixture in _CAPTURED
    if source != "nginx"
]
SILENT = [
    pytest.param(fixture, id=f"{source}-{index}-{fixture['status']}")
    for source, index, fixture in _CAPTURED
    if source == "nginx"
]


def hints(**headers: str) -> Hints:
    """`read_hints` of `headers`, written with `_` for `-`."""
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return read_hints(named, now=NOW, cap=CAP)


# --- real servers ---------------------------------------------------------------


@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_remaining_counts_down(fixture):
    """A stock limiter allowing 2 states 1 left after the 1st request, 0 on the 429."""
    found = read_hints(fixture["headers"], now=fixture["now"], cap=CAP)
    assert found.remaining == (1 if fixture["status"] == 200 else 0)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_reset_is_the_minute_window(fixture):
    """Every stock limiter's reset, delta or epoch, reads as about 60 s."""
    found = read_hints(fixture["headers"], now=fixture["now"], cap=CAP)
    assert found.reset is not None
    assert 59 <= found.reset <= 62


@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_policy_only_where_a_window_is_stated(fixture):
    """express states 2 per 60 s in RateLimit-Policy; slowapi's X- headers state no window."""
    found = read_hints(fixture["headers"], now=fixture["now"], cap=CAP)
    expected = (Window(2, 60),) if fixture["server"].startswith("express") else ()
    assert found.policy == expected


@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_retry_after(fixture):
    """Retry-After is 60 on a 429; slowapi sends it on a 200 too, express does not."""
    found = read_hints(fixture["headers"], now=fixture["now"], cap=CAP)
    on_success = fixture["server"].startswith("slowapi")
    expected = 60.0 if fixture["status"] == 429 or on_success else None
    assert found.retry_after == expected


@pytest.mark.parametrize("fixture", FIXTURES)
def test_fixture_reads_without_notes(fixture):
    """Nothing a stock limiter sends is ignored or capped."""
    assert read_hints(fixture["headers"], now=fixture["now"], cap=CAP).notes == ()


@pytest.mark.parametrize("fixture", SILENT)
def test_fixture_without_headers_states_nothing(fixture):
    """nginx's limit_req sends no rate-limit header on a 200 nor on its 429."""
    assert read_hints(fixture["headers"], now=fixture["now"], cap=CAP) == Hints()


# --- Retry-After ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param("120", 120.0, id="delta-seconds"),
        pytest.param("0", 0.0, id="zero"),
        pytest.param("1.5", 1.5, id="decimal"),
        pytest.param("60, 120", 120.0, id="repeated-takes-longest"),
        pytest.param(" 7 ", 7.0, id="spaces"),
        pytest.param(
            email.utils.formatdate(NOW + 30), 30.0, id="formatdate-minus-0000"
        ),
        pytest.param("Mon, 23 Nov 2026 10:23:26 GMT", 30.0, id="imf-fixdate"),
        pytest.param("Monday, 23-Nov-26 10:23:26 GMT", 30.0, id="rfc850"),
        pytest.param("Mon Nov 23 10:23:26 2026", 30.0, id="asctime"),
        pytest.param("Mon, 23 Nov 2026 11:23:26 +0100", 30.0, id="numeric-zone"),
        pytest.param("Sun, 06 Nov 1994 08:49:37 GMT", 0.0, id="past-date"),
    ],
)
def test_retry_after_forms(value, seconds):
    """Retry-After reads as delta-seconds or any of the three HTTP-date forms."""
    assert hints(retry_after=value).retry_after == pytest.approx(seconds)


_NO_WAIT = "neither seconds nor an HTTP date"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param("-5", "a negative wait", id="negative"),
        pytest.param("nan", _NO_WAIT, id="nan"),
        pytest.param("inf", _NO_WAIT, id="inf"),
        pytest.param("1e3", _NO_WAIT, id="exponent"),
        pytest.param("soon", _NO_WAIT, id="word"),
        pytest.param("", _NO_WAIT, id="empty"),
        pytest.param("60, soon", _NO_WAIT, id="repeated-with-junk"),
        pytest.param("Mon, 32 Nov 2026 10:23:26 GMT", _NO_WAIT, id="bad-day"),
    ],
)
def test_retry_after_malformed_is_ignored_with_a_note(value, why):
    """A Retry-After that is no wait is ignored and named in a note."""
    found = hints(retry_after=value)
    assert found.retry_after is None
    assert found.notes == (f"Retry-After {value!r} ignored: {why}",)


def test_retry_after_beyond_cap_is_capped_with_a_note():
    """A wait longer than the cap is cut to it, and the note says so."""
    found = hints(retry_after="86400")
    assert found.retry_after == CAP
    assert found.notes == ("Retry-After of 86400 s capped at 900 s",)


def test_retry_after_too_long_for_a_float_is_capped():
    """A delta with more digits than a float holds is a very long wait, so capped."""
    assert hints(retry_after="9" * 400).retry_after == CAP


def test_note_shortens_a_long_value():
    """A note quotes at most 40 characters of the header's value."""
    (note,) = hints(retry_after="x" * 500).notes
    assert repr("x" * 39 + "…") in note
    assert "x" * 41 not in note


# --- IETF RateLimit, draft 08 on ------------------------------------------------


def test_structured_policy_states_every_window():
    """Each `q`/`w` item of RateLimit-Policy is a window, names quoted or not."""
    found = hints(ratelimit_policy='"burst";q=100;w=60, daily;q=1000;w=86400')
    assert found.policy == (Window(100, 60), Window(1000, 86400))


def test_structured_ratelimit_states_remaining_and_reset():
    """RateLimit's `r` and `t` are the requests left and the seconds to the reset."""
    found = hints(ratelimit='"burst";r=50;t=30')
    assert (found.remaining, found.reset) == (50, 30.0)


def test_structured_ratelimit_keeps_the_fewest_left():
    """Of several RateLimit items, the one with the fewest requests left counts."""
    found = hints(ratelimit='"burst";r=50;t=30, "daily";r=7;t=600')
    assert (found.remaining, found.reset) == (7, 600.0)


@pytest.mark.parametrize(
    "unit",
    [
        pytest.param('"requests"', id="requests"),
        pytest.param('"request"', id="request-as-registered"),
        pytest.param("requests", id="token"),
    ],
)
def test_policy_in_requests_is_kept(unit):
    """A policy whose quota unit counts requests is a window."""
    found = hints(ratelimit_policy=f'"p";q=5;w=1;qu={unit}')
    assert found.policy == (Window(5, 1),)


def test_policy_in_other_units_is_ignored_with_a_note():
    """A quota of content bytes is no request rate, so it is left out, with a note."""
    found = hints(ratelimit_policy='"bytes";q=1000;w=1;qu="content-bytes"')
    assert found.policy == ()
    assert found.notes == (
        'RateLimit-Policy \'"bytes";q=1000;w=1;qu="content-bytes"\' ignored: '
        "quota unit 'content-bytes' is not requests",
    )


@pytest.mark.parametrize(
    "value",
    [
        pytest.param('"p";q=10', id="no-window"),
        pytest.param('"p";q=0;w=60', id="zero-quota"),
        pytest.param('"p";q=10;w=0', id="zero-window"),
        pytest.param('"p";q=-1;w=60', id="negative-quota"),
        pytest.param('"p";w=60', id="no-quota"),
    ],
)
def test_policy_without_a_usable_window_is_ignored_with_a_note(value):
    """A policy that is no valid window is left out and named in a note."""
    found = hints(ratelimit_policy=value)
    assert found.policy == ()
    assert found.notes[0].startswith("RateLimit-Policy ")


def test_policy_name_may_hold_separators():
    """A quoted policy name may hold commas, semicolons and escaped quotes."""
    found = hints(ratelimit_policy='"a\\"b,c;d";q=3;w=9, "e";q=4;w=8')
    assert found.policy == (Window(3, 9), Window(4, 8))


@pytest.mark.parametrize(
    "value",
    [
        pytest.param('"b";q=100;w=60, "d";q=1000;W=86400', id="uppercase-key"),
        pytest.param('"b";q=100;w=60, "d";q=1000;w=86400;n="open', id="unclosed"),
        pytest.param('"b"; q = 100; w = 60, "d";q=1000;w=86400', id="spaces"),
    ],
)
def test_a_field_written_loosely_still_states_its_windows(value):
    """A strict RFC 9651 parser drops the whole field for any of these; the
    reader keeps every window it can read (why api/fields.py is not http-sf)."""
    assert hints(ratelimit_policy=value).policy == (
        Window(100, 60),
        Window(1000, 86400),
    )


def test_policy_ignores_unknown_parameters():
    """Extra parameters such as express's partition key `pk` do not matter."""
    found = hints(ratelimit_policy='"2-in-1min"; q=2; w=60; pk=:MTJjYTE3YjQ5YWYy:')
    assert found.policy == (Window(2, 60),)


def test_ratelimit_reset_beyond_cap_is_capped_with_a_note():
    """RateLimit's `t` longer than the cap is cut to it, with a note."""
    found = hints(ratelimit='"daily";r=0;t=3000')
    assert found.reset == CAP
    assert found.notes == ("RateLimit reset of 3000 s capped at 900 s",)


# --- IETF RateLimit, up to draft 07 (and express-rate-limit) -----------------------


@pytest.mark.parametrize(
    ("value", "windows"),
    [
        pytest.param("100;w=900", (Window(100, 900),), id="one"),
        pytest.param(
            "10;w=1, 100;w=60", (Window(10, 1), Window(100, 60)), id="several"
        ),
        pytest.param("10;w=1,10;w=1", (Window(10, 1),), id="repeated"),
    ],
)
def test_older_policy_states_windows(value, windows):
    """The older `COUNT;w=SECONDS` policy items are windows, each stated once."""
    assert hints(ratelimit_policy=value).policy == windows


def test_separate_fields_state_remaining_and_reset():
    """RateLimit-Remaining and RateLimit-Reset (delta seconds) state the quota."""
    found = hints(ratelimit_limit="100", ratelimit_remaining="3", ratelimit_reset="42")
    assert (found.remaining, found.reset) == (3, 42.0)


def test_limit_alone_states_no_window():
    """A count with no window is not a rule."""
    assert hints(ratelimit_limit="100").policy == ()


def test_limit_with_window_states_a_window():
    """Drafts 01-02 put policies in RateLimit-Limit: `10, 10;w=1, 50;w=60`."""
    found = hints(ratelimit_limit="10, 10;w=1, 50;w=60")
    assert found.policy == (Window(10, 1), Window(50, 60))


def test_dictionary_ratelimit_states_remaining_and_reset():
    """express's draft-7 `RateLimit: limit=10, remaining=0, reset=2` is read."""
    found = hints(ratelimit="limit=10, remaining=0, reset=2")
    assert (found.remaining, found.reset, found.policy) == (0, 2.0, ())


def test_malformed_remaining_is_ignored_with_a_note():
    """A remaining count that is no whole number is ignored, naming the header."""
    found = hints(ratelimit_remaining="lots")
    assert found.remaining is None
    assert found.notes == (
        "RateLimit-Remaining 'lots' ignored: not a whole number of requests",
    )


# --- X-RateLimit-* ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reset", "seconds"),
    [
        pytest.param("30", 30.0, id="delta"),
        pytest.param(str(int(NOW) + 30), 30.0, id="epoch-seconds-github"),
        pytest.param(f"{NOW + 30.25}", 30.25, id="epoch-float-slowapi"),
        pytest.param(str(int(NOW * 1000) + 30_000), 30.0, id="epoch-milliseconds"),
        pytest.param(str(int(NOW) - 5), 0.0, id="epoch-past"),
    ],
)
def test_x_reset_forms(reset, seconds):
    """X-RateLimit-Reset is read as delta, epoch seconds or epoch ms by magnitude."""
    found = hints(x_ratelimit_remaining="0", x_ratelimit_reset=reset)
    assert found.reset == pytest.approx(seconds)


def test_x_limit_states_no_window():
    """X-RateLimit-Limit has no window, so it gives no policy, yet remaining counts,
    and the count is stated beside them (the learner reads its window)."""
    found = hints(x_ratelimit_limit="60", x_ratelimit_remaining="59")
    assert (found.policy, found.remaining, found.limit) == ((), 59, 60)


@pytest.mark.parametrize(
    ("headers", "limit"),
    [
        ({"ratelimit_limit": "100", "ratelimit_remaining": "3"}, 100),
        ({"ratelimit": "limit=10, remaining=0, reset=2"}, 10),
        ({"x_rate_limit_limit": "15", "x_rate_limit_remaining": "4"}, 15),
        (
            {"x_ratelimit_limit_requests": "60", "x_ratelimit_remaining_requests": "9"},
            60,
        ),
    ],
)
def test_each_dialect_states_its_count_with_its_quota(headers, limit):
    """The count of the quota `remaining` and `reset` describe, in each dialect."""
    assert hints(**headers).limit == limit


def test_the_count_goes_with_the_quota_with_fewest_left():
    """Two quotas: the count stated is that of the one with the fewest left."""
    found = hints(
        ratelimit_limit="100",
        ratelimit_remaining="50",
        x_ratelimit_limit="10",
        x_ratelimit_remaining="2",
    )
    assert (found.remaining, found.limit) == (2, 10)


@pytest.mark.parametrize("value", ["0", "-3", "many", "10, 1000"])
def test_a_count_below_one_or_no_count_is_ignored_with_a_note(value):
    """A count of no requests states nothing; the note names the header."""
    found = hints(x_ratelimit_limit=value, x_ratelimit_remaining="0")
    assert (found.limit, found.remaining) == (None, 0)
    assert any("X-RateLimit-Limit" in note for note in found.notes), found.notes


def test_x_reset_after_is_read():
    """Discord's X-RateLimit-Reset-After gives seconds to the reset."""
    found = hints(x_ratelimit_remaining="0", x_ratelimit_reset_after="1.25")
    assert found.reset == 1.25


def test_x_rate_limit_spelling_is_read():
    """Twitter's X-Rate-Limit-* spelling is read like X-RateLimit-*."""
    found = hints(x_rate_limit_remaining="4", x_rate_limit_reset=str(int(NOW) + 9))
    assert (found.remaining, found.reset) == (4, 9.0)


@pytest.mark.parametrize(
    ("reset", "seconds"),
    [
        pytest.param("6m0s", 360.0, id="minutes-seconds"),
        pytest.param("1s", 1.0, id="seconds"),
        pytest.param("20ms", 0.02, id="milliseconds"),
        pytest.param("0h2m3.5s", 123.5, id="all-units"),
        pytest.param("0", 0.0, id="bare-zero"),
    ],
)
def test_openai_request_reset_durations(reset, seconds):
    """OpenAI's X-RateLimit-Reset-Requests is a Go-style duration such as "6m0s"."""
    found = hints(x_ratelimit_remaining_requests="0", x_ratelimit_reset_requests=reset)
    assert found.reset == pytest.approx(seconds)


def test_malformed_x_reset_is_ignored_with_a_note():
    """A reset that is no number is ignored and named in a note."""
    found = hints(x_ratelimit_remaining="0", x_ratelimit_reset="tomorrow")
    assert (found.remaining, found.reset) == (0, None)
    assert found.notes == (
        "X-RateLimit-Reset 'tomorrow' ignored: not a number of seconds of 0 or more",
    )


# --- several sources --------------------------------------------------------------


def test_fewest_remaining_wins_across_sources():
    """Of the quotas several headers state, the one with the fewest left counts."""
    found = hints(
        ratelimit='"a";r=9;t=5', x_ratelimit_remaining="2", x_ratelimit_reset="50"
    )
    assert (found.remaining, found.reset) == (2, 50.0)


def test_none_remaining_keeps_the_latest_reset():
    """When two quotas have none left, the later reset is the one to wait for."""
    found = hints(ratelimit='"a";r=0;t=5, "b";r=0;t=80')
    assert (found.remaining, found.reset) == (0, 80.0)


def test_no_headers_no_hints():
    """A response without rate-limit headers says nothing."""
    assert read_hints({"content-type": "text/plain"}, now=NOW, cap=CAP) == Hints()


_NAMES = st.sampled_from(
    [
        "retry-after",
        "retry-after-ms",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-reset-after",
        "x-rate-limit-remaining",
        "x-rate-limit-reset",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ]
)
_VALUES = st.one_of(
    st.text(),
    st.text(alphabet='0123456789.,;=-"qwrt :', max_size=40),
    st.integers().map(str),
    st.floats().map(str),
    st.from_regex(r"([0-9]{1,3}(\.[0-9])?(ms|h|m|s)){1,3}", fullmatch=True),
)


@given(headers=st.dictionaries(st.one_of(_NAMES, st.text()), _VALUES))
def test_read_hints_never_raises(headers):
    """Whatever the headers hold, read_hints returns waits within [0, cap]."""
    found = read_hints(headers, now=NOW, cap=CAP)
    for wait in (found.retry_after, found.reset):
        assert wait is None or (math.isfinite(wait) and 0 <= wait <= CAP)
    assert found.limit is None or found.limit >= 1
