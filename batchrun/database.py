"""The SQLite files of the state folder, opened, migrated and written the same way.

Each file's schema is a sequence of migrations; the file's `PRAGMA user_version`
counts those applied, so opening a file applies exactly the ones it lacks, each in
its own transaction, and a file from a newer batchrun (a higher version) is refused.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from batchrun.errors import StateError

_SETUP_TRIES = 50


def open_database(
    path: Path | str, migrations: Sequence[str], *, timeout: float = 5.0
) -> sqlite3.Connection:
    """A connection whose transactions are explicit, on a private (0600) file in
    WAL mode, brought up to the version `len(migrations)`.

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
            _migrate(db, path, migrations)
            return db
        except StateError:
            db.close()
            raise
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


def _migrate(
    db: sqlite3.Connection, path: Path | str, migrations: Sequence[str]
) -> None:
    # Read first: a file already up to date is opened without taking the write
    # lock, so `status` never waits behind a running submit.
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version == len(migrations):
        return
    with write_transaction(db):
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > len(migrations):
            msg = (
                f"{path} was written by a newer batchrun (schema {version}, this "
                f"one knows {len(migrations)}): upgrade batchrun, or use another "
                "--state-dir."
            )
            raise StateError(msg)
        for step in migrations[version:]:
            for statement in step.split(";"):
                if statement.strip():
                    db.execute(statement)
        db.execute(f"PRAGMA user_version = {len(migrations)}")
