"""Some jobs of a jobs file as a jobs file of their own: the failed ones, to fix
and submit again (`status --failed-as-jobs`).

The copy has the source's format and columns: a CSV file keeps its header (extra
columns included) and each kept row's fields; a JSON Lines file keeps each kept
object. Rows are streamed, so memory holds only the ids asked for. The copy is
written to a temporary file beside the destination and renamed over it, so a
reader never sees half of it; the source is never written.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from batchrun.core.errors import UsageError
from batchrun.jobs.jobfile import MAX_ROW, Problem, is_jsonl, rows

_Write = Callable[[dict[str, Any]], object]


@dataclass(frozen=True, slots=True)
class Extracted:
    """What a copy holds: how many rows were written, and the asked-for ids the
    source no longer has (a file edited since its run)."""

    written: int
    missing: frozenset[str]


def extract(source: Path, dest: Path, ids: Collection[str]) -> Extracted:
    """Write the rows of `source` whose id is in `ids` to `dest`, in file order.

    Raises:
        UsageError: when `dest` is the source, names the other format, or cannot
            be written.
    """
    _check_dest(source, dest)
    temporary = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8", newline="") as out:
            found = _copy(source, out, set(ids))
        temporary.replace(dest)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        msg = f"cannot write {dest}: {exc.strerror or exc}."
        raise UsageError(msg) from None
    return Extracted(len(found), frozenset(ids) - found)


def _check_dest(source: Path, dest: Path) -> None:
    if dest.resolve() == source.resolve():
        msg = f"{dest} is the jobs file itself: name another file for the copy."
        raise UsageError(msg)
    if is_jsonl(dest) != is_jsonl(source):
        kind = "JSON Lines (.jsonl)" if is_jsonl(source) else "CSV (.csv)"
        msg = f"{dest}: the jobs file {source.name} is {kind}; name the copy so too."
        raise UsageError(msg)


def _copy(source: Path, out: IO[str], ids: set[str]) -> set[str]:
    """Write the wanted rows to `out`; return the ids written."""
    written: set[str] = set()
    write = _json_writer(out) if is_jsonl(source) else _csv_writer(source, out)
    for row in rows(source):
        if isinstance(row, Problem):
            continue
        fields = row[1]
        job_id = str(fields.get("id", "")).strip()
        if job_id in ids and job_id not in written:
            write(fields)
            written.add(job_id)
    return written


def _json_writer(out: IO[str]) -> _Write:
    def write(fields: dict[str, Any]) -> None:
        out.write(json.dumps(fields, ensure_ascii=False) + "\n")

    return write


def _csv_writer(source: Path, out: IO[str]) -> _Write:
    writer = csv.DictWriter(
        out, fieldnames=_header(source), restval="", extrasaction="ignore"
    )
    writer.writeheader()
    return writer.writerow


def _header(source: Path) -> list[str]:
    """The CSV header as `jobfile.rows` reads it (names stripped; a BOM dropped)."""
    csv.field_size_limit(MAX_ROW)
    with source.open(encoding="utf-8-sig", newline="") as file:
        for record in csv.reader(file):
            if any(cell.strip() for cell in record):
                return [name.strip() for name in record]
    return ["id", "type", "team_id", "payload"]
