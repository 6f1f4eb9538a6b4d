"""Reading a jobs file: its bytes become rows of named fields, or `Problem`s.

CSV (a header row names the columns) or JSON Lines (one object per line), decoded line
by line as UTF-8 (docs/reference/contract.md#the-jobs-file). Whatever the bytes, `rows`
yields a row or a `Problem` naming the physical line (where a CSV record that spans
lines starts) and a reason; no other exception escapes. Memory stays bounded: a line or
field over `MAX_ROW` bytes is refused. What the fields must hold is `jobs.py`'s
business.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from batchrun.core import strict_json

MAX_ROW = 16 * 2**20
_COLUMNS = ("id", "type", "team_id", "payload", "method", "path")
_REQUIRED = ("id", "type")
_HEADER_HINT = "the first line must name the columns, e.g. id,type,team_id,payload"
_JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number"}
_JSON_KINDS |= {float: "a number", str: "a string", list: "an array", dict: "an object"}
_CSV_ERRORS = {
    "unexpected end of data": 'a quoted field starts here but its closing " is missing',
    "',' expected after '\"'": (
        'text follows a closing " (inside a quoted field write a quote as "")'
    ),
    "new-line character seen in unquoted field": (
        "a lone carriage return (\\r) in an unquoted field: "
        "end lines with \\n or \\r\\n, or quote the field"
    ),
    "field larger than field limit": "a field is larger than 16 MiB",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One bad row: its physical line (0 for the whole file), why it is bad, and
    its id when that much was read (a bad row still claims its id)."""

    line: int
    reason: str
    id: str | None = None


# A row as read: its line and fields, or why it could not be read at all.
Row = tuple[int, dict[str, Any]] | Problem


class _Unreadable(Exception):
    """Raised when the rest of the file cannot be read; the scan stops there."""


def rows(path: Path) -> Iterator[Row]:
    """Stream the rows of a CSV file, or of a JSON Lines file (name ends `.jsonl`)."""
    opened = _open(path)
    if isinstance(opened, Problem):
        yield opened
        return
    with opened:
        if _is_json(path) and opened.peek(64).lstrip().startswith(b"["):
            yield Problem(0, _JSON_ARRAY)
            return
        lines = _Lines(opened)
        try:
            yield from _jsonl_rows(lines) if is_jsonl(path) else _csv_rows(lines)
        except _Unreadable as exc:
            yield Problem(lines.number, str(exc))
        except OSError as exc:
            yield Problem(0, f"cannot read it: {exc.strerror or exc}")


def is_jsonl(path: Path) -> bool:
    """Whether the file holds JSON Lines (its payloads are objects, not text):
    its name ends `.jsonl` or `.ndjson`, or `.json` (unless it holds an array)."""
    return path.name.lower().endswith((".jsonl", ".ndjson")) or _is_json(path)


def _is_json(path: Path) -> bool:
    return path.name.lower().endswith(".json")


_JSON_ARRAY = (
    "this .json file holds an array; jobs are read from CSV or JSON Lines (one "
    "object per line, named .jsonl or .ndjson). Convert it: "
    "jq -c '.[]' FILE.json > FILE.jsonl"
)


def json_kind(value: Any) -> str:
    """What a JSON value is, for messages: `a string`, `an array`, `null`..."""
    return _JSON_KINDS.get(type(value), type(value).__name__)


def json_error(exc: Exception) -> str:
    """Why text is not JSON, from what `strict_json.loads` raised."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos + 1}"
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def shown(text: str) -> str:
    """`text` quoted for a message, shortened to about 60 characters."""
    quoted = repr(text)
    return quoted if len(quoted) <= 60 else f"{quoted[:56]}...{quoted[0]}"


def _open(path: Path) -> io.BufferedReader | Problem:
    try:
        if path.is_dir():
            return Problem(0, "this is a folder, not a jobs file")
        return path.open("rb")
    except FileNotFoundError:
        return Problem(0, "no such file")
    except OSError as exc:
        return Problem(0, f"cannot read it: {exc.strerror or exc}")
    except ValueError as exc:  # e.g. a NUL in the name
        return Problem(0, f"not a usable file name ({exc})")


def _csv_rows(lines: _Lines) -> Iterator[Row]:
    records = _records(lines)
    first = next(records, None)
    if first is None:
        yield Problem(0, f"the file is empty: expected a header row ({_HEADER_HINT})")
        return
    header = first if isinstance(first, Problem) else _header(*first)
    if isinstance(header, Problem):
        yield header
        return
    for record in records:
        if isinstance(record, Problem):
            yield record
        else:
            yield record[0], dict(zip(header, record[1], strict=False))


def _records(lines: _Lines) -> Iterator[tuple[int, list[str]] | Problem]:
    """Non-blank CSV records with the line each starts on."""
    # Payloads may be large JSON documents; the csv module's default cap is 128 KiB.
    # The cap is the process's, so it is raised where a jobs file is read, not at
    # import.
    csv.field_size_limit(MAX_ROW)
    # strict: an unclosed quote is an error, not a field that swallows the file.
    reader = csv.reader(lines, strict=True)
    while True:
        # The reader pulls lines only as a record needs them, so this is its start.
        start = lines.number + 1
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            lines.take_flaw()
            yield Problem(start, _csv_error(exc))
            continue
        flaw = lines.take_flaw()
        if flaw is not None:
            yield flaw
        elif any(cell.strip() for cell in record):
            yield start, record


def _header(line: int, record: list[str]) -> list[str] | Problem:
    names = [name.strip() for name in record]
    missing = [name for name in _REQUIRED if name not in names]
    if missing:
        found = shown(",".join(names))
        reason = f"the header {found} lacks column(s) {', '.join(missing)}"
        return Problem(line, f"{reason}: {_HEADER_HINT}")
    counts = Counter(names)
    twice = [name for name in _COLUMNS if counts[name] > 1]
    if twice:
        return Problem(line, f"the header names {', '.join(twice)} more than once")
    return names


def _jsonl_rows(lines: _Lines) -> Iterator[Row]:
    for text in lines:
        flaw = lines.take_flaw()
        if flaw is not None:
            yield flaw
        elif text.strip():
            yield _json_object(lines.number, text)


def _json_object(line: int, text: str) -> Row:
    try:
        value = strict_json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Problem(line, f"not valid JSON ({json_error(exc)})")
    if not isinstance(value, dict):
        kind = json_kind(value)
        return Problem(line, f"expected one JSON object {{...}} per line, got {kind}")
    return line, value


def _csv_error(exc: csv.Error) -> str:
    text = str(exc)
    reason = next((v for k, v in _CSV_ERRORS.items() if text.startswith(k)), None)
    return reason or f"not readable as CSV ({text})"


class _Lines:
    """Decodes a binary file line by line, counting physical lines.

    Each line is decoded on its own, so a bad byte is named by its line and reading
    goes on; only `\\n` splits lines (the csv module sees `\\r\\n` as it should).
    """

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.number = 0
        self._flaw: Problem | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        raw = self._file.readline(MAX_ROW + 1)
        if not raw:
            raise StopIteration
        self.number += 1
        if len(raw) > MAX_ROW:
            msg = "a line is longer than 16 MiB: this does not look like a jobs file"
            raise _Unreadable(msg)
        codec = "utf-8-sig" if self.number == 1 else "utf-8"
        try:
            return raw.decode(codec)
        except UnicodeDecodeError as exc:
            if self._flaw is None:
                self._flaw = Problem(self.number, _not_utf8(exc))
            return raw.decode(codec, errors="replace")

    def take_flaw(self) -> Problem | None:
        """The first undecodable line since the last call, if any."""
        flaw, self._flaw = self._flaw, None
        return flaw


def _not_utf8(exc: UnicodeDecodeError) -> str:
    where = f"byte 0x{exc.object[exc.start]:02x}, column {exc.start + 1}"
    return f"not UTF-8 text ({where}): save the file as UTF-8"
