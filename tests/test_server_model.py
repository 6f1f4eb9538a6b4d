"""The simulation's server model (support/simulation.py): its outages, rule
changes, refused counts, policy headers and answer times, as the random draws of
bench/draws.py use them."""

from __future__ import annotations

import pytest

from batchrun.core.limits import parse_rule
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle
from support.script_client import script
from support.simulation import Server, ideal, simulate

SLIDING = LimiterKind.SLIDING


def test_an_outage_refuses_every_request_uncounted():
    server = Server(SLIDING, parse_rule("30/2s"), outage_from=1.0, outage_for=2.0)
    run = script(client="10/2s", server=server, count=40, seed=3)
    during = [a for a in run.arrivals if 1.0 <= a.at < 3.0]
    assert during
    assert all(a.status == 429 for a in during)
    assert all(a.status == 200 for a in run.arrivals if not 1.0 <= a.at < 3.0)


def test_a_rule_change_holds_from_its_moment_and_the_ideal_follows_it():
    tight = Server(
        SLIDING, parse_rule("30/2s"), change_to=parse_rule("10/2s"), change_at=3.0
    )
    # 30 at 0, 30 at 2; then 10 a window while the 30 of 2 s age out.
    assert ideal(tight, 120) == pytest.approx(14.0)
    loose = Server(
        SLIDING, parse_rule("10/2s"), change_to=parse_rule("30/2s"), change_at=3.0
    )
    # 10 at 0 and 2; from 3 (asked again at the change) 30 a window: 20 at 3,
    # then 10 and 20 by turns as earlier ones age out, the 110th at 8.
    assert ideal(loose, 110) == pytest.approx(8.0)
    run = script(client="30/2s", server=tight, count=60, latency=(0.001, 0.002))
    accepted = sorted(a.at for a in run.arrivals if a.status == 200)
    late = [t for t in accepted if t >= 5.0]
    assert all(sum(1 for u in late if t - 2 < u <= t) <= 10 for t in late), (
        "more than 10 accepted in a window after the change"
    )


def test_the_ideal_keeps_the_told_rule():
    """A fixed window lets 2c through at its edge; no lawful client does."""
    fixed = Server(LimiterKind.FIXED, parse_rule("30/2s"), {"origin": -1.5})
    assert ideal(fixed, 60) == pytest.approx(0.5)
    assert ideal(fixed, 60, parse_rule("30/2s")) == pytest.approx(2.0)


def test_refusals_count_where_the_model_can():
    counted = Server(SLIDING, parse_rule("10/2s"), count_refused=True)
    assert "refused count" in counted.limiter().policy
    with pytest.raises(ValueError, match="count_refused"):
        Server(LimiterKind.WEIGHTED, parse_rule("10/2s"), count_refused=True).limiter()


@pytest.mark.parametrize("style", [s for s in HeaderStyle if s is not HeaderStyle.NONE])
def test_policy_headers_reach_the_client_as_hints(style):
    server = Server(SLIDING, parse_rule("10/2s"), headers=style)
    run = simulate(client="10/2s", server=server, count=12, seed=1)
    hints = [outcome.hints for _, outcome in run.answers]
    assert all(h is not None and h.remaining is not None for h in hints)
    if style is not HeaderStyle.X_RATELIMIT:
        assert all(h is not None and h.policy for h in hints)


def test_answer_times_spread_over_the_work():
    """One in flight at zero latency: each answer comes `work` after its arrival."""
    server = Server(SLIDING, parse_rule("100/2s"), work=0.2, work_spread=0.6)
    run = script(
        client="100/2s", server=server, count=40, latency=(0.0, 0.0), concurrency=1
    )
    took = [
        at - arrival.at
        for (at, _), arrival in zip(run.answers, run.arrivals, strict=True)
    ]
    assert all(0.2 <= t <= 0.8 for t in took)
    assert max(took) - min(took) > 0.3
