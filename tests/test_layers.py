"""The module map: imports only go down, so there is no cycle and no upward arrow.

`LAYERS` lists batchrun's modules from the bottom up, as the README's map draws
them; a module may import only modules listed before it (function-level and
type-checking imports included). A new module must be placed here to pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "batchrun"
LAYERS = [
    # values and seams, no I/O
    ["errors", "clock", "strict_json"],
    ["durations", "database", "generation"],
    ["limits"],
    ["hints"],
    ["endpoints", "slots", "outcome", "limiters"],
    ["counters"],
    ["learning"],
    ["events", "jobfile", "policy_headers", "breaker"],
    ["jobs", "paths", "runlock"],
    ["config"],
    # state and sending
    ["ledger"],
    ["sqlite_ledger", "redis_ledger", "pacer", "results"],
    ["state", "shared_ledger"],
    ["journal", "client", "runner", "runs"],
    # what people see
    ["board"],
    ["progress", "overview"],
    ["reports", "crontab"],
    ["faults", "serving"],
    ["sandbox"],
    # the edge
    ["submission"],
    ["arguments"],
    ["cli"],
    ["__main__", "__init__"],
]
ORDER = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def imported(path: Path) -> set[str]:
    """The batchrun modules a module imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "batchrun":
                found |= {alias.name for alias in node.names} - {"__version__"}
            elif node.module.startswith("batchrun."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {
                a.name.split(".")[1]
                for a in node.names
                if a.name.startswith("batchrun.")
            }
    return found


def test_every_module_has_a_place_in_the_map():
    """Each module of the package is in LAYERS, and LAYERS names no missing one."""
    assert {p.stem for p in PACKAGE.glob("*.py")} == set(ORDER)


@pytest.mark.parametrize("module", sorted(ORDER))
def test_imports_only_go_down(module):
    """A module imports only modules of lower layers."""
    path = PACKAGE / f"{module}.py"
    upward = {name for name in imported(path) if ORDER.get(name, 99) >= ORDER[module]}
    assert not upward, f"{module} imports {sorted(upward)}, which are not below it"


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker finds imports at any depth, so it cannot pass vacuously."""
    path = tmp_path / "m.py"
    path.write_text(
        "def f():\n    from batchrun.cli import app\n    import batchrun.x\n"
    )
    assert imported(path) == {"cli", "x"}
