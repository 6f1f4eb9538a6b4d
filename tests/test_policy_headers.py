"""The rate-limit headers the sandbox states: their exact form, and that the
client's reader (`hints.read_hints`) takes back what they state, never looser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchrun.api.hints import read_hints
from batchrun.core.limits import Window
from batchrun.pacing.limiters import Quota
from batchrun.sandbox.policy_headers import HeaderStyle, policy_headers

QUOTAS = (
    Quota(Window(10, 60.0), 3, 12.0),
    Quota(Window(500, 3600.0), 0, 0.2),
)


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        pytest.param(HeaderStyle.NONE, {}, id="none"),
        pytest.param(
            HeaderStyle.IETF,
            {
                "RateLimit-Policy": '"10/1m";q=10;w=60, "500/1h";q=500;w=3600',
                "RateLimit": '"10/1m";r=3;t=12, "500/1h";r=0;t=0.2',
            },
            id="ietf",
        ),
        pytest.param(
            HeaderStyle.DRAFT7,
            {
                "RateLimit-Policy": "10;w=60, 500;w=3600",
                "RateLimit": "limit=500, remaining=0, reset=0.2",
            },
            id="draft7",
        ),
        pytest.param(
            HeaderStyle.X_RATELIMIT,
            {
                "X-RateLimit-Limit": "500",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": "0.2",
            },
            id="x-ratelimit",
        ),
    ],
)
def test_each_style_writes_its_fields(style, expected):
    """Each style writes its fields; the single-quota ones state the tightest quota."""
    assert policy_headers(style, QUOTAS) == expected


@pytest.mark.parametrize(
    ("seconds", "written"),
    [
        pytest.param(2.0, "2", id="whole"),
        pytest.param(2.0000000001, "2", id="float-noise"),
        pytest.param(0.2, "0.2", id="tenths"),
        pytest.param(6.0240963, "6.025", id="rounded-up"),
        pytest.param(1 / 15, "0.067", id="third-decimal"),
        pytest.param(-0.5, "0", id="never-negative"),
    ],
)
def test_times_are_rounded_up_to_the_millisecond(seconds, written):
    """A stated window or reset is never shorter than the real one."""
    quota = Quota(Window(1, 1.0), 1, seconds)
    fields = policy_headers(HeaderStyle.X_RATELIMIT, [quota])
    assert fields["X-RateLimit-Reset"] == written


def test_no_quota_states_nothing():
    """A key without a rule has no quota, so no header is written."""
    assert policy_headers(HeaderStyle.IETF, []) == {}


_quotas = st.lists(
    st.builds(
        Quota,
        st.builds(Window, st.integers(1, 1000), st.floats(0.001, 86_400)),
        st.integers(0, 1000),
        st.floats(0.0, 86_400),
    ),
    min_size=1,
    max_size=3,
)


@pytest.mark.parametrize(
    "style", [HeaderStyle.IETF, HeaderStyle.DRAFT7, HeaderStyle.X_RATELIMIT]
)
@given(quotas=_quotas)
def test_the_client_reads_back_what_is_stated(style, quotas):
    """read_hints finds the fewest requests left, a reset no earlier than the
    tightest quota's, and (except X-RateLimit) every window, none shorter."""
    fields = {
        name.lower(): value for name, value in policy_headers(style, quotas).items()
    }
    hints = read_hints(fields, now=1.8e9, cap=10**6)
    assert hints.notes == ()
    tightest = min(quotas, key=lambda q: (q.remaining, -q.reset))
    assert hints.remaining == tightest.remaining
    assert hints.reset is not None
    # Rounded up to the ms, past float noise of a nanosecond.
    assert tightest.reset - 1e-9 <= hints.reset < tightest.reset + 0.001
    if style is HeaderStyle.X_RATELIMIT:
        assert hints.policy == ()
        return
    for quota in quotas:
        count, seconds = quota.window.count, quota.window.seconds
        assert any(
            w.count == count and seconds - 1e-9 <= w.seconds < seconds + 0.001
            for w in hints.policy
        )
