"""The SQLite files of the state folder, opened and written the same way."""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

_SETUP_TRIES = 50


def open_database(
    path: Path | str, schema: str, *, timeout: float = 5.0
) -> sqlite3.Connection:
    """A connection whose transactions are explicit, on a private (0600) file in
    WAL mode, with `schema` applied.

    Set-up is retried: two processes opening a new file at once can get "database
    is locked" here, where SQLite does not wait for the other.
    """
    db = sqlite3.connect(path, isolation_level=None, timeout=timeout)
    on_disk = str(path) != ":memory:"
    if on_disk:
        Path(path).chmod(0o600)
    attempt = 0
    while True:
        attempt += 1
        try:
            if on_disk:
                db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(schema)
            return db
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == _SETUP_TRIES:
                db.close()
                raise
            time.sleep(0.05 + 0.05 * random.random())


@contextlib.contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[None]:
    """`BEGIN IMMEDIATE` (the write lock at once) … `COMMIT`, rolled back on any
    exception."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
