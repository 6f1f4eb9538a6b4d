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
    """The lines of a function's body, from its first statement after the
    docstring to the end of its last."""
    body = node.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    end = body[-1].end_lineno or body[-1].lineno
    return end - body[0].lineno + 1


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


def test_a_body_is_measured_without_signature_or_docstring():
    """A long signature and a docstring do not count; the statements do."""
    signature = "def f(\n" + "    a: int,\n" * 50 + "):\n"
    docstring = '    """Doc.\n\n' + "    more\n" * 50 + '    """\n'
    fits = signature + docstring + "    x = 1\n" * 40
    assert long_functions(fits) == []
    over = "class C:\n    async def g(self):\n" + "        y = 2\n" * 41
    assert long_functions(over) == ["g (41 lines)"]
