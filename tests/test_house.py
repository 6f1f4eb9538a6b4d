"""The house rules on size: no module of `batchrun/` over 350 lines, no function
or method body over 40 lines.

A body runs from its first statement after the docstring to its last line, so a
Typer command's long signature does not count, and its body does.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "batchrun"
MAX_MODULE_LINES = 350
MAX_BODY_LINES = 40


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of a function's body, docstring included, from its first line
    after the signature to the end of its last statement."""
    end = node.body[-1].end_lineno or node.body[-1].lineno
    return end - node.body[0].lineno + 1


def long_functions(source: str, limit: int = MAX_BODY_LINES) -> list[str]:
    """`name (n lines)` for each function or method whose body is over `limit`."""
    return [
        f"{node.name} ({body_lines(node)} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and body_lines(node) > limit
    ]


def test_no_module_is_over_350_lines():
    """Every module of batchrun/ has at most 350 lines."""
    offenders = [
        f"{_name(path)} ({n} lines)"
        for path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines: {offenders}"


def test_no_function_body_is_over_40_lines():
    """Every function or method body of batchrun/ has at most 40 lines."""
    offenders = [
        f"{_name(path)}: {name}"
        for path in _modules()
        for name in long_functions(path.read_text())
    ]
    assert not offenders, f"bodies over {MAX_BODY_LINES} lines: {offenders}"


def test_a_body_is_measured_without_its_signature():
    """A long signature does not count; the docstring and the statements do."""
    signature = "def f(\n" + "    a: int,\n" * 50 + "):\n"
    docstring = '    """Doc.\n\n' + "    more\n" * 10 + '    """\n'
    fits = signature + "    x = 1\n" * 40
    assert long_functions(fits) == []
    assert long_functions(signature + docstring + "    x = 1\n" * 30) == [
        "f (43 lines)"
    ]
    over = "class C:\n    async def g(self):\n" + "        y = 2\n" * 41
    assert long_functions(over) == ["g (41 lines)"]


def test_the_readme_is_a_guide_of_at_most_12_kb():
    """README.md is a user guide: at most 12,288 bytes; the rest is in docs/."""
    assert len((ROOT / "README.md").read_bytes()) <= 12288
