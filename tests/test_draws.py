"""The random-draw benchmark (bench/draws.py): it runs, and its checks can fail."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import pytest

from batchrun.core.limits import parse_rule
from batchrun.pacing.limiters import LimiterKind
from batchrun.sandbox.policy_headers import HeaderStyle
from bench import draws
from bench.draws import Figures, Result, checks
from tests.script_client import script
from tests.simulation import Server, ideal, simulate

GOOD = Figures(ratio=1.0, refused=0)


def result(seed: int = 1, **changes: object) -> Result:
    """A made-up draw where every check holds, but for `changes`."""
    base = Result(seed, "made up", True, True, GOOD, GOOD, GOOD, GOOD)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_every_check_holds_on_a_perfect_result():
    assert all(
        check["holds"] for check in checks([result(n) for n in range(10)]).values()
    )


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ({"b1": Figures(1.2, 0), "s1": Figures(1.1, 0)}, "a run 1"),
        ({"b2": Figures(1.2, 0), "s2": Figures(1.0, 0)}, "a run 2"),
        ({"b1": Figures(1.0, 5), "s1": Figures(1.0, 4)}, "b:"),
        ({"b2": Figures(1.0, 1)}, "c:"),
        ({"b2": Figures(1.06, 0), "s2": Figures(1.06, 0)}, "c:"),
    ],
)
def test_each_check_fails_on_a_result_that_violates_it(change, check):
    found = checks([result(1, **change), result(2)])
    failed = [name for name, c in found.items() if not c["holds"]]
    assert any(name.startswith(check) for name in failed), failed
    assert all(found[n]["seeds"] == [1] for n in failed if "seeds" in found[n])


def test_the_checks_pass_where_they_should():
    """Near the script, or a server not stricter / not quiet: no violation."""
    near = result(1, b1=Figures(1.3, 0), s1=Figures(1.29, 0))
    loose = result(2, stricter=False, b1=Figures(1.0, 9), s1=Figures(1.0, 0))
    noisy = result(3, quiet=False, b2=Figures(1.0, 3), s2=Figures(1.0, 3))
    found = checks([near, loose, noisy] + [result(n) for n in range(4, 30)])
    assert all(check["holds"] for check in found.values())


def test_p90_fails_when_a_tenth_and_more_are_slow():
    slow = [result(n, b1=Figures(1.2, 0), s1=Figures(1.2, 0)) for n in range(2)]
    found = checks(slow + [result(n) for n in range(2, 12)])
    assert not found["d: p90 of the ratio <= 1.10, run 1"]["holds"]
    assert found["d: p90 of the ratio <= 1.10, run 2"]["holds"]


def test_a_draw_is_one_server_for_one_seed():
    assert draws.draw(10_007) == draws.draw(10_007)
    assert draws.draw(10_007).words != draws.draw(10_008).words


def test_three_draws_run_and_are_written(tmp_path, capsys):
    path = tmp_path / "draws.json"
    draws.main(["--draws", "3", "--seed", "2", "--jobs", "40", "--json", str(path)])
    record = json.loads(path.read_text())
    assert [d["seed"] for d in record["draws"]] == [20_000, 20_001, 20_002]
    assert set(record["summary"]) == set(draws.RUNS)
    assert all(d["b1"]["finished"] and d["s1"]["finished"] for d in record["draws"])
    out = capsys.readouterr().out
    assert "Worst by batchrun run 1 ratio" in out


def test_one_draw_reruns_alone_with_its_trace(capsys):
    draws.main(["--only", "20001", "--jobs", "40", "--trace"])
    out = capsys.readouterr().out
    assert out.count("#### ") == 4
    assert "| 20001 |" in out


def test_a_named_case_runs(tmp_path, capsys):
    path = str(tmp_path / "cases.json")
    draws.main(["--cases", "--only-case", "weighted", "--seeds", "1", "--json", path])
    assert "weighted" in capsys.readouterr().out


# --- The server model's new options ---------------------------------------------

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


def test_a_run_over_the_cpu_cap_is_stopped_and_fails_every_check():
    server = Server(SLIDING, parse_rule("10/2s"))
    run = partial(simulate, client="30/2s", server=server, count=400, seed=1)
    assert draws.capped(run, 0.05) is None
    assert draws.capped(partial(run, count=5), 30.0) is not None
    over = draws.CAPPED
    found = checks([result(1, b1=over, b2=over), *(result(n) for n in range(2, 12))])
    assert found["a run 1: within 0.02 x ideal of the script or <= 1.05"]["seeds"] == [
        1
    ]
    assert found["b: stricter server, run 1 429s <= max(4, script's)"]["seeds"] == [1]
    assert found["c: quiet by run 2, run 2 0 x 429 and <= 1.05"]["seeds"] == [1]
    assert (
        draws.summary([result(1, b1=over), result(2)])["batchrun run 1"]["capped"] == 1
    )
