"""The house map: imports only go down between wings, and no module is in a cycle.

`WINGS` lists batchrun's subpackages from the bottom up, as docs/design/layout.md
draws them. A module may import modules of lower wings and of its own wing, never
of a higher one (function-level and type-checking imports included); inside a
wing, the imports form no cycle. The layers of a wing are read from its imports
(`layers`), not declared, so a new module needs no edit here.

`bench/` has a map of its own, checked the same way. `tests/` and `bench/` share
what both use through `support/`, and never import each other.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "batchrun"
# The wings, bottom first: a module may import only its own wing and lower ones.
WINGS = [
    "core",
    "pacing",
    "jobs",
    "api",
    "store",
    "ledgers",
    "query",
    "run",
    "sandbox",
    "cli",
]
# The package's own two files sit above every wing.
TOP = ["__init__", "__main__"]

WING_ORDER = {wing: i for i, wing in enumerate(WINGS)} | {
    name: len(WINGS) for name in TOP
}

# bench/: the same rule, one flat package.
BENCH = [
    [
        "anchors",
        "learner_cpu",
        "chart",
        "fastserver",
        "progress",
        "draws",
        "whole_api",
    ],
    ["script_pyrate", "script_limits", "script_aiolimiter", "script_sleep"],
    [
        "drivers",
        "spread",
        "ledgers",
        "ledger_lost",
        "overhead",
    ],
    ["pacing", "throughput", "stricter", "against_scripts", "arrival"],
    ["bigfile"],
    ["startup"],
    ["report"],
    ["run"],
    ["__main__", "__init__"],
]
BENCH_ORDER = {name: i for i, layer in enumerate(BENCH) for name in layer}


def imported(path: Path, package: str = "batchrun") -> set[str]:
    """The modules of `package` a module imports, anywhere in it, as dotted
    names below the package (`pacing.slots`); `from batchrun.cli import config`
    names `cli.config`."""
    found: set[str] = set()
    prefix = package + "."
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                found |= {a.name for a in node.names} - {"__version__"}
            elif node.module.startswith(prefix):
                base = node.module.removeprefix(prefix)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(
                        sub
                        if (PACKAGE / f"{sub.replace('.', '/')}.py").exists()
                        else base
                    )
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix(prefix)
                for a in node.names
                if a.name.startswith(prefix)
            }
    return found


def _modules() -> set[str]:
    return {
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" or p.parent == PACKAGE
    }


def _path(module: str) -> Path:
    return PACKAGE / f"{module.replace('.', '/')}.py"


def _wing_graph(wing: str) -> dict[str, set[str]]:
    """Each module of `wing` and the modules of `wing` it imports."""
    own = {m for m in _modules() if m.split(".")[0] == wing}
    return {m: {name for name in imported(_path(m)) if name in own} for m in own}


def layers(wing: str) -> list[list[str]]:
    """A wing's modules in layers, bottom first, as its imports put them: a
    module's layer is one above the highest it imports (names in each sorted).

    Raises:
        graphlib.CycleError: when modules of the wing import each other round.
    """
    return _layered(_wing_graph(wing))


def _layered(graph: dict[str, set[str]]) -> list[list[str]]:
    order = graphlib.TopologicalSorter(graph)
    order.prepare()
    found = []
    while order.is_active():
        ready = sorted(order.get_ready())
        found.append([m.split(".", 1)[1] for m in ready])
        order.done(*ready)
    return found


def test_every_module_is_in_a_wing():
    """Each module of the package is in one of WINGS, or at the top."""
    stray = {m for m in _modules() if m.split(".")[0] not in WING_ORDER}
    assert not stray, f"modules outside every wing: {sorted(stray)}"
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(WINGS)


def _declared(wing: str) -> set[str]:
    """The wings a wing's docstring says it may import (`May import: a, b.`)."""
    tree = ast.parse((PACKAGE / wing / "__init__.py").read_text())
    assert len(tree.body) == 1, f"{wing}/__init__.py holds more than a docstring"
    doc = ast.get_docstring(tree) or ""
    said = re.search(r"May import: (.+?)\.?$", doc, re.M)
    assert said, f"{wing}/__init__.py does not say what it may import"
    if said.group(1).startswith("nothing"):
        return set()
    if said.group(1).startswith("every lower wing"):
        return set(WINGS[: WING_ORDER[wing]])
    return {name.strip() for name in said.group(1).split(",")}


@pytest.mark.parametrize("wing", WINGS)
def test_every_wing_says_what_it_holds_and_may_import(wing):
    """A wing's `__init__.py` is a docstring, and its "May import" is the truth:
    the wing imports no other wing than those it names."""
    declared = _declared(wing)
    used = set()
    for module in _modules():
        if module.startswith(wing + "."):
            used |= {name.split(".")[0] for name in imported(_path(module))}
    used = (used & set(WINGS)) - {wing}
    assert used <= declared, f"{wing} imports {sorted(used - declared)} unsaid"


def test_wings_import_only_lower_wings():
    """At wing level: every arrow between two wings points down, so the wings
    themselves form no cycle (and no wing imports the package's top files)."""
    arrows = set()
    for module in _modules():
        own = module.split(".")[0]
        for name in imported(_path(module)):
            other = name.split(".")[0]
            if other in WING_ORDER and own in WING_ORDER and other != own:
                arrows.add((own, other))
    upward = sorted((a, b) for a, b in arrows if WING_ORDER[b] > WING_ORDER[a])
    assert not upward, f"wings import upward: {upward}"


@pytest.mark.parametrize("wing", WINGS)
def test_no_cycle_inside_a_wing(wing):
    """Inside a wing, modules import each other without a cycle, so each has a
    layer (`layers`) and the map of docs/design/layout.md can draw it."""
    assert sum(map(len, layers(wing))) == len(_wing_graph(wing))


def test_the_cycle_check_sees_a_cycle():
    """Layering refuses two modules that import each other, and puts a module
    above the one it imports."""
    assert _layered({"w.a": {"w.b"}, "w.b": set()}) == [["b"], ["a"]]
    with pytest.raises(graphlib.CycleError):
        _layered({"w.a": {"w.b"}, "w.b": {"w.a"}})


def test_bench_imports_only_go_down():
    """bench/ has no import circle: its modules import only lower ones."""
    bench = ROOT / "bench"
    assert {p.stem for p in bench.glob("*.py")} == set(BENCH_ORDER)
    for module, level in BENCH_ORDER.items():
        upward = {
            name
            for name in imported(bench / f"{module}.py", package="bench")
            if BENCH_ORDER.get(name, 99) >= level
        }
        assert not upward, f"bench.{module} imports {sorted(upward)}, not below it"


def _top_imports(path: Path) -> set[str]:
    """The top-level packages a module imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
    return found


# Each folder, and the top-level packages it must not import.
APART = {"tests": {"bench"}, "bench": {"tests"}, "support": {"tests", "bench"}}


@pytest.mark.parametrize("folder", sorted(APART))
def test_tests_and_bench_meet_only_in_support(folder):
    """tests/ does not import bench/, nor bench/ tests/: what both use is in
    support/, which imports neither."""
    paths = sorted((ROOT / folder).rglob("*.py"))
    assert paths
    crossing = {
        str(p.relative_to(ROOT)): sorted(_top_imports(p) & APART[folder])
        for p in paths
        if _top_imports(p) & APART[folder]
    }
    assert not crossing


def test_the_apart_check_sees_a_crossing_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from bench import draws\nimport tests.fakes\n")
    assert _top_imports(path) >= {"bench", "tests"}


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker finds imports at any depth, so it cannot pass vacuously."""
    path = tmp_path / "m.py"
    path.write_text(
        "def f():\n    from batchrun.cli import commands\n    import batchrun.x.y\n"
        "from batchrun.pacing.slots import earliest_slot\n"
        "from batchrun.run import runner\n"
        "from batchrun.pacing.log import KeyLog\n"
    )
    assert imported(path) == {
        "cli.commands",
        "x.y",
        "pacing.slots",
        "run.runner",
        "pacing.log",
    }
