"""The state files' SQLite layer: every failure a StateError that says what to do."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from batchrun.core.errors import DiskFull, StateError
from batchrun.store import database
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

    monkeypatch.setattr(database.os, "statvfs", lambda path: Found())
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
