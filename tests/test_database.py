"""The state files' SQLite layer: every failure a StateError that says what to do."""

from __future__ import annotations

import errno
import os
import sqlite3
import time

import pytest

from batchrun.core.errors import DiskFull, StateError
from batchrun.store import walfiles
from batchrun.store.database import Database, explain, open_database, write_transaction

SCHEMA = ("CREATE TABLE t (x INTEGER);",)


@pytest.mark.parametrize(
    ("error", "says"),
    [
        pytest.param(
            sqlite3.OperationalError("database or disk is full"),
            "the disk is full. Free some space",
            id="full",
        ),
        pytest.param(
            OSError(errno.ENOSPC, "No space left on device"),
            "the disk is full",
            id="enospc",
        ),
        pytest.param(
            sqlite3.DatabaseError("file is not a database"),
            "is damaged",
            id="garbled",
        ),
        pytest.param(
            sqlite3.DatabaseError("database disk image is malformed"),
            "is damaged",
            id="cut-short",
        ),
        pytest.param(
            sqlite3.OperationalError("attempt to write a readonly database"),
            "writable by you",
            id="read-only",
        ),
        pytest.param(
            PermissionError(errno.EACCES, "Permission denied"),
            "writable by you",
            id="eacces",
        ),
        pytest.param(
            sqlite3.OperationalError("disk I/O error"),
            "-wal file deleted while in use",
            id="wal-deleted",
        ),
        pytest.param(
            sqlite3.OperationalError("database is locked"),
            "locked by another process",
            id="locked",
        ),
    ],
)
def test_each_failure_names_the_file_what_is_wrong_and_what_to_do(
    tmp_path, error, says
):
    """explain() names the file, the problem and a way out, by kind of failure."""
    found = explain(error, tmp_path / "ledger.db")
    assert isinstance(found, StateError)
    assert found.exit_code == 74
    assert str(tmp_path / "ledger.db") in found.message
    assert says in found.message


def test_a_full_disk_is_its_own_error(tmp_path):
    """A full disk is DiskFull, which a run turns into a stop to resume from."""
    full = sqlite3.OperationalError("database or disk is full")
    assert isinstance(explain(full, tmp_path / "x.db"), DiskFull)
    damaged = sqlite3.DatabaseError("file is not a database")
    assert not isinstance(explain(damaged, tmp_path / "x.db"), DiskFull)


def test_an_io_error_on_a_nearly_full_disk_is_a_full_disk(tmp_path, monkeypatch):
    """SQLite reports no room to grow its -shm as "disk I/O error": with less than
    1 MiB left beside the file, that is DiskFull, not a deleted -wal."""

    class Found:
        f_frsize = 4096
        f_bavail = 8

    monkeypatch.setattr(os, "statvfs", lambda path: Found())
    found = explain(sqlite3.OperationalError("disk I/O error"), tmp_path / "x.db")
    assert isinstance(found, DiskFull)
    assert "the disk is full" in found.message


def test_a_garbled_file_is_a_state_error_at_open(tmp_path):
    """Opening a file that is not SQLite raises StateError, not DatabaseError."""
    path = tmp_path / "run.db"
    path.write_bytes(b"not a database, clearly " * 200)
    with pytest.raises(StateError, match="is damaged"):
        open_database(path, SCHEMA)


def test_a_read_only_open_makes_no_file(tmp_path):
    """read_only opens no -wal or -shm beside the file, and refuses a missing one."""
    path = tmp_path / "run.db"
    open_database(path, SCHEMA).close()
    before = sorted(p.name for p in tmp_path.iterdir())
    db = open_database(path, SCHEMA, read_only=True)
    assert db.execute("SELECT count(*) FROM t") == [(0,)]
    db.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    with pytest.raises(StateError):
        open_database(tmp_path / "missing.db", SCHEMA, read_only=True)
    assert not (tmp_path / "missing.db").exists()


def test_a_failed_commit_rolls_back_and_says_why(tmp_path):
    """A transaction whose statement fails leaves nothing behind and raises
    StateError, even when SQLite has already rolled back on its own."""
    db = open_database(tmp_path / "run.db", SCHEMA)

    def half_written():
        with write_transaction(db):
            db.execute("INSERT INTO t VALUES (1)")
            db.execute("INSERT INTO nowhere VALUES (1)")

    with pytest.raises(StateError):
        half_written()
    assert db.execute("SELECT count(*) FROM t") == [(0,)]
    db.execute("BEGIN")  # no transaction was left open
    db.execute("ROLLBACK")


def test_a_sqlite_error_from_any_statement_becomes_a_state_error(tmp_path):
    """Database.execute lets no sqlite3 error through."""
    db: Database = open_database(tmp_path / "run.db", SCHEMA)
    with pytest.raises(StateError, match=r"run\.db"):
        db.execute("SELECT * FROM nowhere")


@pytest.fixture
def look_each_time(monkeypatch):
    """-wal and -shm looked at before every statement, not once a second."""
    real = walfiles.WalFiles.__init__

    def every_time(self, path, *, every=1.0, clock=time.monotonic):
        real(self, path, every=0.0, clock=clock)

    monkeypatch.setattr(walfiles.WalFiles, "__init__", every_time)


@pytest.mark.parametrize("name", ["-wal", "-shm"])
def test_a_shared_file_whose_wal_or_shm_was_deleted_stops(
    tmp_path, look_each_time, name
):
    """A ledger's -wal or -shm deleted while two connections share it: the next
    statement is a StateError naming it, before a second -shm can pace apart."""
    path = tmp_path / "ledger.db"
    first = open_database(path, SCHEMA)
    first.execute("INSERT INTO t VALUES (1)")
    other = open_database(path, SCHEMA)
    path.with_name(path.name + name).unlink()
    with pytest.raises(StateError, match=f"its ledger.db{name} file was deleted"):
        first.execute("INSERT INTO t VALUES (2)")
    other.close()
    first.close()


def test_a_file_written_alone_is_mended_and_loses_nothing(tmp_path, look_each_time):
    """A run store's -wal deleted in use: it is checkpointed through the deleted
    one and reopened; a new connection (a later process) sees every write."""
    path = tmp_path / "run.db"
    db = open_database(path, SCHEMA, alone=True)
    db.execute("INSERT INTO t VALUES (1)")
    path.with_name("run.db-wal").unlink()
    db.execute("INSERT INTO t VALUES (2)")
    assert path.with_name("run.db-wal").exists()
    later = sqlite3.connect(path)
    assert later.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
    later.close()
    db.close()


def test_the_files_are_looked_at_once_a_second_at_most(tmp_path):
    """WalFiles stats nothing until `every` has passed on its clock."""
    path = tmp_path / "x.db"
    now = [0.0]
    open_database(path, SCHEMA).close()
    path.with_name("x.db-wal").write_bytes(b"")
    files = walfiles.WalFiles(path, clock=lambda: now[0])
    path.with_name("x.db-wal").unlink()
    assert files.changed() is None
    now[0] = 1.0
    assert files.changed() == "x.db-wal"
