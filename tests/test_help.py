"""What `--help` shows at 80 columns: whole words, nothing cut, sandbox-only flags
last, and bad choices said as the flag and its choices."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from batchrun.cli.commands import app

runner = CliRunner()
_BOX = re.compile(r"[│╭╮╰╯─]")


def _help(*args: str) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _words(text: str) -> set[str]:
    return set(_BOX.sub(" ", text).split())


def _said(command: list[str]) -> set[str]:
    """Every word --help should show whole: the help texts and the metavars."""
    click_app = typer.main.get_command(app)
    target = click_app.commands[command[0]] if command else click_app  # type: ignore[attr-defined]
    words = set((target.help or "").split())
    for param in target.params:
        words |= set((getattr(param, "help", None) or "").split())
        if param.metavar:
            words.add(param.metavar)
    return {w.replace("\\[", "[") for w in words}


@pytest.mark.parametrize("command", [[], ["submit"], ["sandbox"]], ids=str)
def test_help_at_80_columns_breaks_and_cuts_no_word(command):
    """Every word of every help text and metavar shows whole: none folded mid-word,
    none cut with an ellipsis."""
    shown = _help(*command)
    assert "…" not in shown
    missing = _said(command) - _words(shown)
    assert not missing, f"broken or cut in --help: {sorted(missing)}"


def test_help_shows_no_bool_metavar():
    """No flag shows `<bool>`: on/off flags show no value, --help included."""
    for command in ([], ["submit"], ["sandbox"], ["status"]):
        assert "<bool>" not in _help(*command)


def test_submit_usage_names_the_jobs_file():
    """The usage line reads JOBS_FILE, as the summary does."""
    assert "Usage: batchrun submit [OPTIONS] JOBS_FILE" in _help("submit")


def test_submit_help_ends_with_the_sandbox_panel():
    """The flags that act only with --sandbox are in the last panel, after State."""
    shown = _help("submit")
    panels = re.findall(r"╭─ (.+?) ─", shown)
    assert panels[-1] == "With --sandbox"
    sandbox_panel = shown[shown.index("╭─ With --sandbox") :]
    for flag in ("--server-limit", "--server-counting", "--server-headers", "--inject"):
        assert flag in sandbox_panel
        assert flag not in shown[: shown.index("╭─ With --sandbox")]


def test_metrics_extra_survives_rich_markup():
    """`[metrics]` is not read as Rich markup, and names the checkout's install."""
    shown = " ".join(_words(_help("submit")))
    assert "'.[metrics]'." in shown
    assert "\\[" not in shown


def test_top_level_summaries_are_one_line_each():
    """Each command's summary in `batchrun --help` is one sentence, not a line
    broken where its docstring was."""
    click_app = typer.main.get_command(app)
    for name, command in click_app.commands.items():  # type: ignore[attr-defined]
        first = (command.help or "").split("\n\n")[0]
        assert "\n" not in first.strip(), f"{name}: {first!r}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["submit", "x.csv", "--profile", "c"],
            "--profile must be a, b or auto, not 'c'.",
            id="profile",
        ),
        pytest.param(
            ["plan", "x.csv", "--pace", "fast"],
            "--pace must be exact or spread, not 'fast'.",
            id="pace",
        ),
        pytest.param(
            ["sandbox", "--profile", "auto"],
            "--profile must be a or b, not 'auto'.",
            id="sandbox-profile",
        ),
    ],
)
def test_a_bad_choice_names_the_flag_and_its_choices(args, message):
    """A value outside a flag's choices says which ones it takes, exit 2."""
    result = runner.invoke(app, args, env={"COLUMNS": "120"})
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Value error" not in result.stderr


def test_sandbox_profile_offers_no_auto():
    """`sandbox --help` offers a|b: auto means nothing for a server."""
    shown = _help("sandbox")
    assert "a|b " in shown
    assert "auto" not in shown
