"""The house rules that no linter checks: the README is a user guide of at most 12 KB.

Size is not capped: ruff's C901, PLR0912 and PLR0915 (pyproject.toml) guard each
function's complexity, and a module is as long as its concept needs.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_readme_is_a_guide_of_at_most_12_kb():
    """README.md is a user guide: at most 12,288 bytes; the rest is in docs/."""
    assert len((ROOT / "README.md").read_bytes()) <= 12288
