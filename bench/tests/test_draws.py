"""The random-draw benchmark (bench/draws.py): it runs, and its checks can fail."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import pytest

from batchrun.core.limits import parse_rule
from batchrun.pacing.limiters import LimiterKind
from bench import draws
from bench.draws import Figures, Result, checks
from support.simulation import Server, simulate

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


def test_a_run_over_the_cpu_cap_is_stopped_and_fails_every_check():
    server = Server(LimiterKind.SLIDING, parse_rule("10/2s"))
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
