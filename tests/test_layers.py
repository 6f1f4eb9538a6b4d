"""The house map: imports only go down, between wings and inside each wing.

`WINGS` lists batchrun's subpackages from the bottom up, and each wing's modules
from the bottom up, as docs/design/layout.md draws them. A module may import a module
of a lower wing, or of a lower layer of its own wing; never its own layer, never
upward (function-level and type-checking imports included). So there is no
cycle anywhere. A new module must be placed here to pass.

`bench/` has a map of its own, checked the same way.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "batchrun"
# wing: its modules in layers, bottom first; a module may import only those of
# the layers before its own (and of lower wings).
WINGS: list[tuple[str, list[list[str]]]] = [
    (
        "core",
        [
            ["errors", "clock", "strict_json"],
            ["durations", "identity"],
            ["limits"],
            ["events"],
            ["responses"],
        ],
    ),
    (
        "pacing",
        [
            ["slots", "limiters", "arrival", "cooling", "log"],
            ["ledger", "model"],
            ["kept", "pacer"],
            ["learner"],
        ],
    ),
    ("jobs", [["endpoints", "jobfile"], ["target"], ["job", "extract"]]),
    ("api", [["fields", "trace"], ["hints"], ["outcome"], ["breaker", "client"]]),
    (
        "store",
        [
            ["walfiles", "paths"],
            ["database"],
            ["generation", "runlock", "results", "intake"],
            ["state"],
            ["runs", "crosscheck", "stamp"],
        ],
    ),
    ("ledgers", [["sqlite_ledger", "redis_ledger"], ["shared_ledger"]]),
    (
        "run",
        [
            ["journal", "queues", "settings", "view", "exit_code", "halt"],
            ["settlement"],
            ["runner"],
            ["wiring", "supervisor"],
            ["submission"],
        ],
    ),
    ("sandbox", [["faults", "policy_headers", "serving"], ["app"]]),
    (
        "cli",
        [
            ["config", "crontab", "board", "helps", "budget"],
            ["plain_log", "overview", "learned", "defaults", "metrics"],
            ["progress", "metrics_file"],
            ["reports", "terminal"],
            ["arguments", "flags"],
            ["read_commands"],
            ["commands"],
        ],
    ),
]
# The package's own two files sit above every wing.
TOP = ["__init__", "__main__"]

WING_ORDER = {wing: i for i, (wing, _) in enumerate(WINGS)}
ORDER: dict[str, tuple[int, int]] = {
    f"{wing}.{module}": (w, layer)
    for w, (wing, layers) in enumerate(WINGS)
    for layer, modules in enumerate(layers)
    for module in modules
}
ORDER |= {name: (len(WINGS), 0) for name in TOP}

# bench/: the same rule, one flat package.
BENCH = [
    [
        "anchors",
        "oracle",
        "stock",
        "chart",
        "fastserver",
        "case_server",
        "progress",
        "draws",
        "whole_api",
    ],
    ["script_pyrate", "script_limits", "script_aiolimiter", "script_sleep"],
    ["slowapi_server"],
    [
        "drivers",
        "spread",
        "ledgers",
        "ledger_lost",
        "overhead",
        "script_cases",
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


def test_every_module_has_a_place_in_the_map():
    """Each module of the package is in WINGS, and WINGS names no missing one."""
    assert _modules() == set(ORDER)


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
        return {w for w, _ in WINGS[: WING_ORDER[wing]]}
    return {name.strip() for name in said.group(1).split(",")}


@pytest.mark.parametrize("wing", [w for w, _ in WINGS])
def test_every_wing_says_what_it_holds_and_may_import(wing):
    """A wing's `__init__.py` is a docstring, and its "May import" is the truth:
    the wing imports no other wing than those it names."""
    declared = _declared(wing)
    used = set()
    for module in ORDER:
        if module.startswith(wing + "."):
            path = PACKAGE / f"{module.replace('.', '/')}.py"
            used |= {name.split(".")[0] for name in imported(path)}
    used = (used & set(WING_ORDER)) - {wing}
    assert used <= declared, f"{wing} imports {sorted(used - declared)} unsaid"


def _place(name: str) -> tuple[int, int] | None:
    """Where an imported name sits: a module, or a whole wing (its top)."""
    if name in ORDER:
        return ORDER[name]
    if name in WING_ORDER:
        return (WING_ORDER[name], 99)
    return None


@pytest.mark.parametrize("module", sorted(ORDER))
def test_imports_only_go_down(module):
    """A module imports only modules of lower wings or lower layers of its wing."""
    path = PACKAGE / f"{module.replace('.', '/')}.py"
    wing, layer = ORDER[module]
    upward = set()
    for name in imported(path):
        place = _place(name)
        if place is None or place[0] > wing or (place[0] == wing and place[1] >= layer):
            upward.add(name)
    assert not upward, f"{module} imports {sorted(upward)}, which are not below it"


def test_wings_import_only_lower_wings():
    """At wing level: every arrow between two wings points down, so the wings
    themselves form no cycle."""
    arrows = set()
    for module in ORDER:
        own = module.split(".")[0]
        for name in imported(PACKAGE / f"{module.replace('.', '/')}.py"):
            other = name.split(".")[0]
            if other in WING_ORDER and own in WING_ORDER and other != own:
                arrows.add((own, other))
    upward = sorted((a, b) for a, b in arrows if WING_ORDER[b] > WING_ORDER[a])
    assert not upward, f"wings import upward: {upward}"


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
