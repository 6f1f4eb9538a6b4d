"""A SQLite file's -wal and -shm, watched for being deleted or replaced in use.

Every connection to a file in WAL mode must share one -wal (the log) and one -shm
(its index and locks). A connection keeps the ones it opened even when their names
are deleted; a connection opened after that makes new ones. Then the two see
different logs and take different locks: two processes sharing a ledger would
each grant the last slot of a window (39 sends in a window of 30 were seen).

Invariant: `changed` reports a -wal or -shm whose name no longer leads to the
file this connection opened (gone, or another inode), looking at most once per
`every` seconds, so the cost is one `stat` pair a second, not one per statement.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

_SUFFIXES = ("-wal", "-shm")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


class WalFiles:
    """The -wal and -shm a connection opened, to notice them deleted or replaced."""

    def __init__(
        self,
        path: Path,
        *,
        every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._paths = [path.with_name(path.name + s) for s in _SUFFIXES]
        self._every = every
        self._clock = clock
        self._known = [_identity(p) for p in self._paths]
        self._next = clock() + every

    def changed(self) -> str | None:
        """The name of a -wal or -shm deleted or replaced since opened, if it is
        time to look and one is; else None."""
        now = self._clock()
        if now < self._next:
            return None
        self._next = now + self._every
        for path, known in zip(self._paths, self._known, strict=True):
            if known is not None and _identity(path) != known:
                return path.name
        return None
