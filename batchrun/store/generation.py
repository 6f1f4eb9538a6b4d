"""Generations: a random id kept inside a state file and in a marker file beside it.

Invariant: a marker that names another generation than its file holds (or names
one while the file is missing or empty) means the file was deleted, emptied or
replaced since it was last used; a file that lost its history is never taken for
a fresh start. The marker is written atomically (write, then rename), 0600.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from batchrun.core.errors import StateError
from batchrun.store.database import explain


def new_generation() -> str:
    """A fresh id for a new file."""
    return uuid.uuid4().hex


def marker_of(path: Path) -> Path:
    """The marker beside `path`: `ledger.db` → `ledger.generation`."""
    return path.with_suffix(".generation")


def read_marker(marker: Path) -> str | None:
    """The generation `marker` names; None if there is no marker.

    Raises:
        StateError: the marker exists but cannot be read.
    """
    try:
        return marker.read_text(encoding="ascii").strip() or None
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read {marker}: {exc}. Move it aside if it is damaged."
        raise StateError(msg) from None


def write_marker(marker: Path, generation: str) -> None:
    """Make `marker` name `generation`.

    Raises:
        StateError: the state folder cannot be written.
    """
    temporary = marker.with_name(f".{marker.name}.{os.getpid()}")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as file:
            file.write(generation + "\n")
        temporary.replace(marker)
    except OSError as exc:
        # Removed on failure, so a full disk does not keep the half-written name.
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise explain(exc, marker) from None
