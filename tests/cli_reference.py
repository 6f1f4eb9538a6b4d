"""The CLI reference page (docs/reference/cli.md), generated from the Typer app.

Regenerate it after changing a command, an option or a help text:

    python -m tests.cli_reference

`tests/test_docs.py` fails while the committed page differs from what this writes.
It lives with the tests because only `batchrun/cli/commands.py` of the package may
import Typer, and the page is a check on that module as much as a document.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
import typer.cli
import typer.main

from batchrun.cli.commands import app

PAGE = Path(__file__).parents[1] / "docs" / "reference" / "cli.md"
_NOTE = (
    "<!-- Generated from the Typer app by `python -m tests.cli_reference`: "
    "do not edit by hand. -->\n\n"
)


def reference() -> str:
    """The page's Markdown: every command with its usage, arguments and options."""
    command = typer.main.get_command(app)
    # Each command's summary whole: Click cuts a help text's first line at 45
    # characters, but not a short_help.
    for sub in getattr(command, "commands", {}).values():
        sub.short_help = sub.short_help or (sub.help or "").split("\n\n")[0]
    # A context with no markup mode in `obj`: help texts are written as they are
    # (Typer would HTML-escape them for its own Rich markup otherwise).
    context = typer.Context(command, info_name="batchrun")
    text = typer.cli.get_docs_for_click(
        obj=command, ctx=context, name="batchrun", title="CLI reference"
    )
    # `\[` keeps Rich from reading `[metrics]` as markup in --help.
    return _NOTE + text.strip().replace("\\[", "[") + "\n"


def main() -> None:
    """Write the page; `--check`: exit 1 if the committed page is stale."""
    if "--check" in sys.argv[1:]:
        if PAGE.read_text() != reference():
            sys.exit(f"{PAGE} is stale: run `python -m tests.cli_reference`")
        return
    PAGE.write_text(reference())


if __name__ == "__main__":
    main()
