"""The SQLite files of the state folder, opened, migrated and written the same way.

Each file's schema is a sequence of migrations; the file's `PRAGMA user_version`
counts those applied, so opening a file applies exactly the ones it lacks, each in
its own transaction, and a file from a newer batchrun (a higher version) is refused.

Invariant: no `sqlite3` error leaves this module. Every failure of a file (damaged,
full, read-only, locked) becomes a `StateError` that names the file, says what is
wrong and what to do (`explain`); a full disk is `DiskFull`, which a run turns into
a stop that the next run resumes from.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from batchrun.core.errors import DiskFull, StateError
from batchrun.store.walfiles import WalFiles

_SETUP_TRIES = 50
# sqlite3's error names (Python 3.11 sets `sqlite_errorname`), and the words of
# the same errors for one raised without a name.
_FULL = ("SQLITE_FULL", "disk is full")
_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "malformed", "not a database")
_DENIED = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "readonly", "unable")
_BROKEN_IO = ("SQLITE_IOERR", "I/O error")
_LOCKED = ("SQLITE_BUSY", "SQLITE_LOCKED", "locked")
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_DENIED_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
# Less free space than this beside a file with an I/O error: the disk is full.
_LOW_SPACE = 1 << 20


def explain(exc: sqlite3.Error | OSError, path: Path | str) -> StateError:
    """The StateError for a failure of the state file `path`: what is wrong with
    it and what to do, by the kind of failure."""
    said = f"{getattr(exc, 'sqlite_errorname', '')} {exc}"
    number = getattr(exc, "errno", None)
    full = number in _FULL_ERRNOS or any(word in said for word in _FULL)
    if full or (any(word in said for word in _BROKEN_IO) and _nearly_full(path)):
        msg = (
            f"{path}: the disk is full. Free some space (or use another "
            "--state-dir), then run the same command again: the run resumes."
        )
        return DiskFull(msg)
    if any(word in said for word in _DAMAGED):
        what, todo = "is damaged", _MOVE_ASIDE
    elif number in _DENIED_ERRNOS or any(word in said for word in _DENIED):
        what = "cannot be written (no permission, or a read-only folder)"
        todo = f"Make {Path(path).parent} writable by you, or use another --state-dir."
    elif any(word in said for word in _BROKEN_IO):
        what = "cannot be read or written (its -wal file deleted while in use?)"
        todo = (
            "Wait until no batchrun uses it and run again; if it still fails, "
            + _MOVE_ASIDE[0].lower()
            + _MOVE_ASIDE[1:]
        )
    elif any(word in said for word in _LOCKED):
        what, todo = "is locked by another process", "Try again once it is done."
    else:
        what, todo = "cannot be used", "Use another --state-dir, or report this."
    return StateError(f"{path} {what} ({exc}). {todo}")


def _nearly_full(path: Path | str) -> bool:
    """Whether the folder of `path` has almost no space left: SQLite reports a
    full disk as an I/O error when growing its -shm file."""
    try:
        found = os.statvfs(Path(path).parent)
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < _LOW_SPACE


_MOVE_ASIDE = (
    "Move it and its -wal and -shm files aside (e.g. add .damaged to their "
    "names) and run again, or use another --state-dir."
)


class Database:
    """A SQLite connection whose every failure is a `StateError` naming its file.

    Reads return all their rows at once, so that no error comes later, from a
    cursor being iterated outside the guard.
    """

    def __init__(
        self,
        db: sqlite3.Connection,
        path: Path | str,
        *,
        reconnect: Callable[[], sqlite3.Connection] | None = None,
    ) -> None:
        """`reconnect` (a file one process writes alone): how to open it again
        when its -wal or -shm is deleted or replaced; without it, that stops."""
        self._db = db
        self.path = path
        self._reconnect = reconnect
        self._wal = WalFiles(Path(path)) if _on_disk(path) else None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement; return every row it yields."""
        with self.guarded():
            return self._db.execute(sql, params).fetchall()

    def insert(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one INSERT; return the new row's id."""
        with self.guarded():
            row = self._db.execute(sql, params).lastrowid
        assert row is not None
        return row

    def changes(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one UPDATE or DELETE; return how many rows it changed."""
        with self.guarded():
            return self._db.execute(sql, params).rowcount

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.guarded():
            self._db.executemany(sql, rows)

    def close(self) -> None:
        self._wal = None  # closing is never stopped by what it would notice
        with self.guarded():
            self._db.close()

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """Turn a failure of this file into its StateError; first, between
        transactions, notice a -wal or -shm deleted or replaced."""
        try:
            if self._wal is not None and not self._db.in_transaction:
                lost = self._wal.changed()
                if lost is not None:
                    self._lost(lost)
            yield
        except (sqlite3.Error, OSError) as exc:
            raise explain(exc, self.path) from exc

    def _lost(self, name: str) -> None:
        """A -wal or -shm was deleted or replaced. This connection still holds
        the old ones: a file written by this process alone is checkpointed
        through them (nothing is lost) and opened again, with new ones. A shared
        file stops the run: the other processes may already write elsewhere."""
        if self._reconnect is not None:
            [(busy, _, _)] = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            if not busy:
                self._db.close()
                self._db = self._reconnect()
                self._wal = WalFiles(Path(self.path))
                return
        msg = (
            f"{self.path}: its {name} file was deleted or replaced while in use, "
            "so processes that share it could pace apart (together past the "
            "limits). Stop every batchrun that uses it, then run again; never "
            "delete a -wal or -shm file of a file in use."
        )
        raise StateError(msg)


def open_database(
    path: Path | str,
    migrations: Sequence[str],
    *,
    timeout: float = 5.0,
    read_only: bool = False,
    alone: bool = False,
) -> Database:
    """A connection whose transactions are explicit, on a private (0600) file in
    WAL mode, brought up to the version `len(migrations)`.

    `read_only` opens an existing file without writing anything to it or beside
    it (`mode=ro`): no chmod, no migration; one of another version is refused.
    Set-up is retried: two processes opening a new file at once can get "database
    is locked" here, where SQLite does not wait for the other.
    `alone`: only this process writes the file (a run store, under its lock), so
    a deleted -wal or -shm is mended by reopening it (see `Database`).

    Raises:
        StateError: the file cannot be opened, read, written or migrated.
    """
    if read_only:
        return _open_read_only(Path(path), migrations, timeout)

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None, timeout=timeout)

    def reconnect() -> sqlite3.Connection:
        db = connect()
        db.execute("PRAGMA synchronous=NORMAL")  # as `_set_up`: per connection
        return db

    try:
        db = connect()
        if _on_disk(path):
            Path(path).chmod(0o600)
    except (sqlite3.Error, OSError) as exc:
        raise explain(exc, path) from None
    try:
        _set_up(Database(db, path), migrations)
    except BaseException:
        db.close()
        raise
    return Database(db, path, reconnect=reconnect if alone else None)


def _on_disk(path: Path | str) -> bool:
    # ":memory:" is memory; "" a private temporary database SQLite deletes itself
    # (and Path("") would be the current folder).
    return str(path) not in (":memory:", "")


def _set_up(db: Database, migrations: Sequence[str]) -> None:
    on_disk = _on_disk(db.path)
    attempt = 0
    while True:
        attempt += 1
        try:
            if on_disk:
                db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            _migrate(db, migrations)
            return
        except StateError as exc:
            if "locked" not in exc.message or attempt == _SETUP_TRIES:
                raise
            time.sleep(0.05 + 0.05 * random.random())


def _open_read_only(path: Path, migrations: Sequence[str], timeout: float) -> Database:
    # A WAL file's reader makes -wal and -shm files beside it, and leaves them.
    # With no -wal there, no process has the file open (a writer keeps its -wal
    # while open), so it is read as immutable: nothing is made. Otherwise they
    # exist already, and a plain read-only open shares them with the writer.
    wal = path.with_name(path.name + "-wal")
    flags = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    try:
        raw = sqlite3.connect(
            f"{path.resolve().as_uri()}?{flags}",
            uri=True,
            isolation_level=None,
            timeout=timeout,
        )
    except (sqlite3.Error, OSError) as exc:
        raise explain(exc, path) from None
    db = Database(raw, path)
    try:
        [(version,)] = db.execute("PRAGMA user_version")
        _check_version(version, len(migrations), path)
    except BaseException:
        raw.close()
        raise
    return db


@contextlib.contextmanager
def write_transaction(db: Database) -> Iterator[None]:
    """`BEGIN IMMEDIATE` (the write lock at once) … `COMMIT`, rolled back on any
    exception."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled back on its own already (a full disk, say).
        with contextlib.suppress(StateError):
            db.execute("ROLLBACK")
        raise


def _migrate(db: Database, migrations: Sequence[str]) -> None:
    # Read first: a file already up to date is opened without taking the write
    # lock, so `status` never waits behind a running submit.
    [(version,)] = db.execute("PRAGMA user_version")
    if version == len(migrations):
        return
    with write_transaction(db):
        [(version,)] = db.execute("PRAGMA user_version")
        _check_version(version, len(migrations), db.path, writable=True)
        for step in migrations[version:]:
            for statement in step.split(";"):
                if statement.strip():
                    db.execute(statement)
        db.execute(f"PRAGMA user_version = {len(migrations)}")


def _check_version(
    version: int, known: int, path: Path | str, *, writable: bool = False
) -> None:
    if version > known:
        msg = (
            f"{path} was written by a newer batchrun (schema {version}, this "
            f"one knows {known}): upgrade batchrun, or use another --state-dir."
        )
        raise StateError(msg)
    if version < known and not writable:
        msg = (
            f"{path} was written by an older batchrun (schema {version}, this one "
            f"knows {known}): the next `batchrun submit` brings it up to date."
        )
        raise StateError(msg)
