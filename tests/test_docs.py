"""The documents tell the truth: the README's and the guide's commands run, the CLI
reference is current, the changelog names the version.

Every `sh`, `bash` or `console` block of README.md, docs/index.md and docs/guide/
carries a marker on the line before it (an HTML comment, invisible on the page):

- `<!-- run -->`: each command runs, in order, in bash, in a scratch folder that
  holds copies of sample_jobs.csv and jobs/, with HOME there too; `batchrun` is
  this checkout's. Each must exit 0, or N if the line ends with `# exit N`.
- `<!-- run: sandbox ARGS -->`: the same, while `batchrun sandbox ARGS` serves on
  a free loopback port, given as BATCHRUN_BASE_URL (the page tells the reader to
  start one).
- `<!-- skip: REASON -->`: not run (a real API, cron, Redis, a new venv), and
  the reason says so.

In a `console` block only the `$ ` lines are commands; the rest is their output,
which must have the shape of what the command prints now (stdout and stderr as a
terminal shows them): the same lines, with any time, process id, number or
duration standing for any other. A line `...` stands for any lines; a line
starting `... ` for any start of a line.

A sample of a command's output is a `console` block, so it is checked. A `text`
block says on the line before it why it cannot be: `<!-- illustration: REASON -->`
(a night's run of thousands of jobs, a home folder's paths).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from batchrun import __version__
from tests import layout_map
from tests.cli_reference import PAGE, reference
from tests.conftest import free_port

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md"]
PAGES += sorted((ROOT / "docs" / "guide").glob("*.md"))
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- (run|skip)(?::\s*(.*?))? -->$")
_ILLUSTRATION = re.compile(r"^<!-- illustration:\s*(.*?) -->$")
_EXIT = re.compile(r"#\s*exits?\s+(\d+)\b")
_SHELLS = {"sh", "bash", "console"}
_BLOCK_SECONDS = 120


@dataclass(frozen=True)
class Block:
    """A fenced shell block: where it starts, its marker, its commands, and (in a
    `console` block) the output shown under each command."""

    page: Path
    line: int
    marker: str | None
    argument: str
    commands: list[str]
    outputs: tuple[tuple[str, ...], ...] = ()

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _commands(language: str, lines: list[str]) -> list[str]:
    """The block's commands, `\\` continuations joined."""
    if language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    joined: list[str] = []
    for line in lines:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + line.strip()
        elif line.strip() and not line.lstrip().startswith("#"):
            joined.append(line)
    return joined


def _outputs(language: str, lines: list[str]) -> tuple[tuple[str, ...], ...]:
    """A console block's output under each `$ ` command (continuations skipped)."""
    if language != "console":
        return ()
    shown: list[list[str]] = []
    going_on = False
    for line in lines:
        if line.startswith("$ ") or going_on:
            if not going_on:
                shown.append([])
            going_on = line.endswith("\\")
        elif shown:
            shown[-1].append(line)
    return tuple(tuple(out) for out in shown)


def _fences(page: Path) -> Iterator[tuple[int, str, str, list[str]]]:
    """Each fenced block: its first line, its language, the line above, its body."""
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = lines.index("```", index + 1)
        above = next((ln for ln in reversed(lines[:index]) if ln.strip()), "")
        yield index + 1, fence.group(1), above.strip(), lines[index + 1 : end]
        index = end + 1


def blocks(page: Path) -> Iterator[Block]:
    """The shell blocks of a page, with the marker above each."""
    for line, language, above, body in _fences(page):
        if language in _SHELLS:
            marked = _MARKER.match(above)
            yield Block(
                page,
                line,
                marked.group(1) if marked else None,
                (marked.group(2) or "") if marked else "",
                _commands(language, body),
                _outputs(language, body),
            )


def illustrations(page: Path) -> Iterator[tuple[str, str]]:
    """Each `text` block of a page: where, and why it is only an illustration."""
    for line, language, above, _ in _fences(page):
        if language == "text":
            marked = _ILLUSTRATION.match(above)
            yield f"{page.relative_to(ROOT)}:{line}", marked.group(1) if marked else ""


_STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
_PID = re.compile(r"\[\d+\]")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_DURATION = re.compile(r"\bN (?:ms|s|m|h|d)\b(?: N (?:ms|s|m|h)\b)*")


def shape(line: str) -> str:
    """A line with any time, process id, number or duration as any other, and runs
    of spaces as one (a table's columns are as wide as its numbers)."""
    line = _PID.sub("[P]", _STAMP.sub("T", line.rstrip()))
    return " ".join(_DURATION.sub("D", _NUMBER.sub("N", line)).split())


def fits(sample: tuple[str, ...], real: list[str]) -> bool:
    """Whether the real lines have the sample's shape: `...` for any lines, `... `
    at the start of a line for any start."""
    wanted = [ln if ln == "..." else shape(ln) for ln in sample]
    found = [shape(ln) for ln in real]

    def same(want: str, got: str) -> bool:
        if want.startswith("... "):
            return got.endswith(want[4:])
        return want == got

    @cache
    def from_(i: int, j: int) -> bool:
        if i == len(wanted):
            return j == len(found)
        if wanted[i] == "...":
            return any(from_(i + 1, k) for k in range(j, len(found) + 1))
        return j < len(found) and same(wanted[i], found[j]) and from_(i + 1, j + 1)

    return from_(0, 0)


def _script(block: Block) -> str:
    """Bash that runs each command and stops at the first unexpected exit code."""
    steps = []
    for number, command in enumerate(block.commands, 1):
        found = _EXIT.search(command)
        expected = found.group(1) if found else "0"
        said = f"command {number} ({command[:60]!r})".replace("'", "")
        steps.append(
            f"{command}\nrc=$?\nif [ $rc -ne {expected} ]; then "
            f'echo "{said}: exit $rc, expected {expected}" >&2; exit 99; fi'
        )
    return "set -o pipefail\n" + "\n".join(steps) + "\n"


def _environment(scratch: Path) -> dict[str, str]:
    """A new user's environment: no BATCHRUN_* setting, HOME in the scratch folder,
    this checkout's `batchrun` first on PATH."""
    shims = scratch / ".bin"
    shims.mkdir(exist_ok=True)
    shim = shims / "batchrun"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m batchrun "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    env.update(XDG_STATE_HOME=str(home / ".local" / "state"), NO_COLOR="1")
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    # This checkout's batchrun, whether or not one is installed.
    env["PYTHONPATH"] = str(ROOT)
    return env


@contextmanager
def _sandbox(arguments: str, env: dict[str, str]) -> Iterator[str]:
    """`batchrun sandbox ARGS` on a free loopback port; yields its URL."""
    port = free_port()
    command = [sys.executable, "-m", "batchrun", "sandbox", "--port", str(port)]
    server = subprocess.Popen(
        [*command, *arguments.split()],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, f"sandbox {arguments!r} did not start"
                assert time.monotonic() < deadline, "sandbox not listening in 20 s"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


@contextmanager
def _served(block: Block, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The environment the block runs in: with BATCHRUN_BASE_URL if it asks for a
    sandbox."""
    if not block.argument.startswith("sandbox"):
        yield env
        return
    with _sandbox(block.argument.removeprefix("sandbox"), env) as url:
        yield env | {"BATCHRUN_BASE_URL": url}


def _run_shown(block: Block, scratch: Path, env: dict[str, str]) -> None:
    """Each command on its own, its output (stdout and stderr, as a terminal shows
    them) checked against the shape of the page's."""
    with _served(block, env) as served:
        for command, sample in zip(block.commands, block.outputs, strict=True):
            found = _EXIT.search(command)
            done = subprocess.run(
                ["bash", "-c", f"set -o pipefail\n{command}"],
                cwd=scratch,
                env=served,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=_BLOCK_SECONDS,
            )
            real = done.stdout.splitlines()
            expected = int(found.group(1)) if found else 0
            assert done.returncode == expected, f"{block.where}: {done.stdout[-2000:]}"
            shown = "\n".join(real)
            assert fits(sample, real), f"{block.where}: {command!r} printed\n{shown}"


def _run(block: Block, scratch: Path, env: dict[str, str]) -> None:
    if block.outputs and any(block.outputs):
        _run_shown(block, scratch, env)
        return
    with _served(block, env) as served:
        done = subprocess.run(
            ["bash", "-c", _script(block)],
            cwd=scratch,
            env=served,
            capture_output=True,
            text=True,
            timeout=_BLOCK_SECONDS,
        )
    assert done.returncode == 0, f"{block.where}: {done.stderr[-2000:]}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shell_block_is_marked(page):
    """Each shell block says whether the test runs it, and a skip says why."""
    for block in blocks(page):
        assert block.marker, f"{block.where}: no <!-- run --> or <!-- skip: why -->"
        if block.marker == "skip":
            assert block.argument, f"{block.where}: a skip must say why"
        else:
            assert block.commands, f"{block.where}: a run block with no command"
            said = block.argument
            assert not said or said.startswith("sandbox"), f"{block.where}: {said}?"


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_commands_run(page, tmp_path):
    """The page's runnable blocks run, in order, each command with the exit code
    the page gives it."""
    shutil.copy(ROOT / "sample_jobs.csv", tmp_path)
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs")
    env = _environment(tmp_path)
    for block in blocks(page):
        if block.marker == "run":
            _run(block, tmp_path, env)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_text_block_says_why_it_is_not_a_run(page):
    """A sample output is a `console` block under the command, checked against a
    run; a `text` block says why it cannot be."""
    for where, why in illustrations(page):
        assert why, f"{where}: a console block, or <!-- illustration: why -->"


@pytest.mark.parametrize(
    ("sample", "real", "fit"),
    [
        pytest.param(
            ("2026-11-25 10:59:24 batchrun[9927] x.csv: 90 done in 10.0 s.",),
            ["2027-01-02 03:04:05 batchrun[1] x.csv: 1,200 done in 2 m 5 s."],
            True,
            id="times-pids-numbers-durations",
        ),
        pytest.param(
            ("Results: sample_jobs.results.jsonl",),
            ["Results: sample_jobs.sandbox.results.jsonl"],
            False,
            id="a-stale-name",
        ),
        pytest.param(("a", "...", "z"), ["a", "b", "c", "z"], True, id="elided"),
        pytest.param(("a", "z"), ["a", "b", "z"], False, id="a-line-missing"),
        pytest.param(("a", "z"), ["a", "z", "more"], False, id="a-line-more"),
        pytest.param(("... 0 left.",), ["T x: 0 left."], True, id="elided-start"),
    ],
)
def test_a_sample_fits_a_run_of_its_shape(sample, real, fit):
    """The shape check: times, numbers and durations vary; words and lines do not."""
    assert fits(sample, real) is fit


def test_the_readme_begins_with_the_demo_and_the_suite():
    """The README's first block is the two commands a fresh machine runs."""
    first = next(blocks(ROOT / "README.md"))
    assert first.commands == [
        "python3 -m venv .venv && .venv/bin/pip install . && "
        ".venv/bin/batchrun submit sample_jobs.csv --sandbox --time-scale 30",
        'python3 -m venv .venv && .venv/bin/pip install ".[test]" && .venv/bin/pytest',
    ]


def test_the_pages_point_at_the_sandboxs_default_port():
    """The README's and the guide's sandbox URL is the sandbox's default port, and
    that port is not 8000, which `mkdocs serve` (also in the README) takes."""
    from batchrun.cli.defaults import SANDBOX_PORT

    assert SANDBOX_PORT != 8000
    for page in (ROOT / "README.md", ROOT / "docs" / "guide" / "resume-and-cron.md"):
        ports = re.findall(
            r"BATCHRUN_BASE_URL=http://127\.0\.0\.1:(\d+)", page.read_text()
        )
        assert ports == [str(SANDBOX_PORT)], page


# The arrival bound's page is still to condense (issue 36's arrival work).
_REPLACED = {"arrival.md"}
_READ_PAGES = [
    page
    for folder in ("design", "benchmarks")
    for page in sorted((ROOT / "docs" / folder).glob("*.md"))
    if page.name not in _REPLACED
]


def _prose(page: Path) -> str:
    """A page's text without its generated module map (a reference list)."""
    text = page.read_text()
    start, end = "<!-- map: generated", "<!-- end of map -->"
    if start in text:
        text = text[: text.index(start)] + text[text.index(end) :]
    return text


@pytest.mark.parametrize("page", _READ_PAGES, ids=lambda p: p.name)
def test_a_design_or_benchmark_page_opens_with_a_summary_and_stays_short(page):
    """Each page says what it found first ("In short"), and stays under about
    1,500 words: history lives in git, not on the page."""
    paragraphs = [p for p in page.read_text().split("\n\n") if p.strip()]
    assert paragraphs[1].startswith("**In short:**"), page.name
    assert len(_prose(page).split()) <= 1600, page.name


@pytest.mark.parametrize(
    "page", sorted((ROOT / "docs" / "guide").glob("*.md")), ids=lambda p: p.name
)
def test_a_guide_page_opens_with_what_it_is_for(page):
    """A guide page's first screen is prose that says what to do, not a heading."""
    paragraphs = [p for p in page.read_text().split("\n\n") if p.strip()]
    assert paragraphs[0].startswith("# ")
    assert not paragraphs[1].startswith(("#", "```", "|", "<!--")), page.name


def test_no_insider_titles():
    """Titles say what a page holds in a user's words, not the project's slang."""
    config = (ROOT / "mkdocs.yml").read_text()
    titles = config[config.index("\nnav:") :]
    titles += "".join(
        p.read_text().splitlines()[0] for p in (ROOT / "docs").rglob("*.md")
    )
    titles += (ROOT / "docs" / "index.md").read_text()
    for slang in ("anchors", "What a grant costs", "wings"):
        assert slang not in titles, slang


def test_the_home_pages_code_fits_without_scrolling():
    """No line of a code block on the home page is wider than 80 columns."""
    inside = False
    for line in (ROOT / "docs" / "index.md").read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            assert len(line) <= 80, line


def test_bench_keeps_its_records_in_one_folder():
    """bench/ holds code; every result record is in bench/results/, the latest
    of each benchmark, named after it (history is in git and the docs pages)."""
    bench = ROOT / "bench"
    records = [
        p.relative_to(bench)
        for p in bench.rglob("*")
        if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts
    ]
    assert records
    assert [p for p in records if p.parts[0] != "results"] == []
    modules = {p.stem for p in bench.glob("*.py")}
    # `python -m bench` (bench/run.py) writes results.json and timeline.png.
    named = {"results": "run", "timeline": "run"}
    for record in records:
        stem = record.stem
        owner = named.get(stem) or next(
            (m for m in sorted(modules) if stem == m or stem.startswith(m + "_")), None
        )
        assert owner in modules, record
        assert "before" not in stem, record


def test_the_big_file_figures_are_quoted_from_one_place():
    """The million-row figures are measured by `python -m bench --only bigfile`,
    kept in bench/results/results.json, and stated on one page only."""
    import json

    figures = json.loads((ROOT / "bench" / "results" / "results.json").read_text())
    validate = figures["bigfile"]["validate"]
    page = (ROOT / "docs" / "benchmarks" / "big-files.md").read_text()
    said = f"| `batchrun validate` (wall) | {validate['wall_s']:.3f} | "
    assert f"{said}{validate['peak_rss_mib']:.1f} |" in page
    for other in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        if other.name not in ("big-files.md", *_REPLACED):
            assert not re.search(r"\d+ ?(MB|MiB)\b", other.read_text()), other


def test_the_readme_says_how_long_the_suite_takes():
    """The suite's line says how long it runs, and its default output has no
    coverage table while the coverage floor still holds."""
    import tomllib

    readme = (ROOT / "README.md").read_text()
    assert re.search(r"# 2\. The whole test suite \(about \d+ minutes", readme)
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    addopts = pytest_options["pytest"]["ini_options"]["addopts"]
    assert "--cov-report=" in addopts
    assert any(opt.startswith("--cov-fail-under=") for opt in addopts)
    assert not any(opt.startswith("--cov-report=term") for opt in addopts)


def test_the_cli_reference_is_current():
    """docs/reference/cli.md is what `python -m tests.cli_reference` writes."""
    assert PAGE.read_text() == reference(), "run `python -m tests.cli_reference`"


def test_the_module_map_is_current():
    """docs/design/layout.md's map of every module is what `python -m
    tests.layout_map` writes from the layer map and the modules' docstrings."""
    assert layout_map.current() == layout_map.table(), "run python -m tests.layout_map"


def test_the_changelog_names_the_version():
    """CHANGELOG.md names the version `batchrun --version` prints."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{__version__}] - " in changelog or f"as {__version__}" in changelog
