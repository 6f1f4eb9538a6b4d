"""What submit's flags mean: one typed `SubmitOptions`, each --limit parsed once."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from batchrun.cli import arguments
from batchrun.cli.commands import submit
from batchrun.core.errors import UsageError
from batchrun.core.limits import (
    LimitKey,
    Pace,
    Profile,
    limit_table,
    parse_override,
    parse_rule,
)
from batchrun.pacing.model import USUAL

# Where the warnings of these submits go (none is asserted on).
WARNINGS: list[str] = []


def options(tmp_path, **changes):
    """`submit jobs.csv --sandbox` with every other flag at its default."""
    defaults = {
        name: p.default
        for name, p in inspect.signature(submit).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    given = {
        **defaults,
        "jobs_file": tmp_path / "jobs.csv",
        "limit": [],
        "sandbox": True,
        "state_dir": tmp_path / "state",
    }
    return arguments.SubmitOptions(**{**given, **changes})


def test_every_submit_flag_is_a_field_of_submit_options():
    """The command's parameters (but Typer's context) and the dataclass's fields
    are one list, in one order: no flag is dropped on the way."""
    flags = [name for name in inspect.signature(submit).parameters if name != "ctx"]
    fields = [f.name for f in dataclasses.fields(arguments.SubmitOptions)]
    assert flags == fields


def test_each_limit_is_parsed_once_for_one_submit(tmp_path, monkeypatch):
    """One submit parses each --limit once, though its rules, the fallback, the
    settings and the sandbox's rules all follow from it."""
    calls = []
    real = parse_override

    def counted(text):
        calls.append(text)
        return real(text)

    monkeypatch.setattr(arguments, "parse_override", counted)
    given = options(
        tmp_path,
        profile=Profile.AUTO,
        limit=["run-query=10/1m", "invite=3/1m"],
        server_limit=["run-query=5/1m"],
    )
    job = arguments.submission(given, stdin=lambda *_: tmp_path, warn=WARNINGS.append)
    assert calls == ["run-query=10/1m", "invite=3/1m", "run-query=5/1m"]
    assert job.rules[LimitKey.INVITE] == parse_rule("3/1m")
    assert job.settings.pace is Pace.EXACT


def test_time_scale_divides_every_window():
    """--time-scale 30 turns 15/1m+500/1h into 15/2s+500/2m."""
    table = arguments.scaled(limit_table(), 30)
    assert str(table[LimitKey.RUN_QUERY]) == "15/2s+500/2m"


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan")])
def test_time_scale_must_be_positive(scale):
    """A time scale not above 0 is refused."""
    with pytest.raises(UsageError, match="time-scale"):
        arguments.scaled(limit_table(), scale)


def test_the_time_scale_is_applied_when_the_flags_are_read(tmp_path):
    """At --time-scale 30, what the run is given comes scaled: the rules, the
    fallback, backoff and its cap, the Retry-After cap, and the usual window
    lengths the learner tries; nothing below the cli is told the scale."""
    given = options(tmp_path, profile=Profile.AUTO, time_scale=30.0)
    job = arguments.submission(given, stdin=lambda *_: tmp_path, warn=WARNINGS.append)
    assert job.rules[LimitKey.RUN_QUERY] == parse_rule("30/2s")
    assert job.settings.fallback == {LimitKey.RUN_QUERY: parse_rule("15/2s+500/2m")}
    assert (job.settings.backoff, job.settings.backoff_cap) == (1 / 30, 2.0)
    assert job.settings.retry_after_cap == 30.0
    assert job.settings.usual == tuple(seconds / 30 for seconds in USUAL)
    plain = arguments.submission(
        options(tmp_path), stdin=lambda *_: tmp_path, warn=WARNINGS.append
    )
    assert plain.settings.usual == USUAL
    assert plain.settings.retry_after_cap == 900.0


def test_a_sandbox_submit_keeps_its_state_apart(tmp_path):
    """A --sandbox run's state is in the sandbox's folder, and its target is the
    sandbox, served in process."""
    job = arguments.submission(
        options(tmp_path), stdin=lambda *_: tmp_path, warn=WARNINGS.append
    )
    assert job.state.root == tmp_path / "state" / "sandbox"
    assert job.target.identity.is_sandbox
    assert job.target.transport is not None


def test_sandbox_flags_without_sandbox_are_refused(tmp_path):
    """--server-limit without --sandbox is a usage error naming the flag."""
    given = options(
        tmp_path,
        sandbox=False,
        base_url="http://127.0.0.1:9",
        server_limit=["run-query=5/1m"],
    )
    with pytest.raises(UsageError, match="--server-limit"):
        arguments.submission(given, stdin=lambda *_: tmp_path, warn=WARNINGS.append)


def test_resolving_the_shared_options_makes_no_folder(tmp_path):
    """`status`, `plan` and `show` resolve the state folder without making it:
    only a command that writes calls `made`."""
    common = arguments.resolve(state_dir=tmp_path / "state", base_url="http://x")
    assert common.state.root == tmp_path / "state"
    assert not common.state.root.exists()
    assert common.state.made().root.is_dir()
