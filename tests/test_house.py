"""The house rules that no linter checks: the README is a user guide of at most 12 KB,
and only the cli knows --time-scale.

Size is not capped: ruff's C901, PLR0912 and PLR0915 (pyproject.toml) guard each
function's complexity, and a module is as long as its concept needs.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_readme_is_a_guide_of_at_most_12_kb():
    """README.md is a user guide: at most 12,288 bytes; the rest is in docs/."""
    assert len((ROOT / "README.md").read_bytes()) <= 12288


def test_only_the_cli_knows_the_time_scale():
    """--time-scale is applied where the command line is read (the rules, backoff
    and the learner's usual window lengths come down scaled), so the ledger keeps
    the lengths a run paced by: no module outside `batchrun/cli/` names it."""
    package = ROOT / "batchrun"
    named = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if path.relative_to(package).parts[0] != "cli"
        and "time_scale" in path.read_text()
    ]
    assert named == []
