"""End to end: a damaged, full or unwritable state folder gets a clear message and
exit 74, never a traceback or exit 1; a full disk mid-run stops the run, and a rerun
after space is freed resumes with nothing lost.

A full disk is simulated by SQLite connections that fail every write with SQLite's
own "database or disk is full" once told to (no root needed for a tiny tmpfs).
"""

from __future__ import annotations

import errno
import io
import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from batchrun.cli.commands import app
from batchrun.core.errors import DiskFull
from batchrun.core.limits import limit_table, parse_override
from batchrun.sandbox.app import create_app
from batchrun.sandbox.serving import running
from batchrun.store import generation, runlock

pytestmark = pytest.mark.e2e
RULE = "run-query=100/1s"
JOBS = 20


class Disk:
    """Makes SQLite writes fail as on a full disk: at once (`full`), or from the
    `after`-th job outcome written on."""

    def __init__(self, *, full: bool = False, after: int | None = None) -> None:
        self.full = full
        self.after = after
        self.outcomes = 0

    def check(self, sql: str) -> None:
        if sql.startswith("UPDATE jobs SET state = ?, attempts"):
            self.outcomes += 1
            self.full |= self.after is not None and self.outcomes >= self.after
        if self.full and sql.split()[0].upper() in {"INSERT", "UPDATE", "DELETE"}:
            msg = "database or disk is full"
            raise sqlite3.OperationalError(msg)


@pytest.fixture
def disk(monkeypatch):
    """A Disk that every SQLite connection batchrun opens from now on writes to."""
    state = Disk()
    real = sqlite3.connect

    class Connection(sqlite3.Connection):
        def execute(self, sql, parameters=(), /):
            state.check(sql)
            return super().execute(sql, parameters)

        def executemany(self, sql, parameters, /):
            state.check(sql)
            return super().executemany(sql, parameters)

    def connect(*args, **kwargs):
        return real(*args, factory=Connection, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    return state


@pytest.fixture
def server():
    """A loopback sandbox at 100/1s; its `arrivals` count every request."""
    app_ = create_app(rules=limit_table(overrides=[parse_override(RULE)]))
    with running(app_) as url:
        yield app_.state.sandbox, url


@pytest.fixture
def jobs(tmp_path):
    path = tmp_path / "jobs.csv"
    rows = [f"q{i},run-query,t," for i in range(JOBS)]
    path.write_text("id,type,team_id,payload\n" + "\n".join(rows) + "\n")
    return path


def submit(jobs, url, *extra):
    args = ["submit", str(jobs), "--base-url", url, "--limit", RULE, *extra]
    return CliRunner().invoke(app, args)


def store_of(tmp_path):
    [store] = (tmp_path / "state" / "runs").glob("*/*.db")
    return store


def last_status(jobs):
    lines = jobs.with_name("jobs.results.jsonl").read_text().splitlines()
    return {r["id"]: r["status"] for r in map(json.loads, lines)}


def test_a_garbled_run_store_exits_74_naming_it(tmp_path, server, jobs):
    """A run store overwritten with junk: submit and status name the file, say it
    is damaged and how to get past it; exit 74, no traceback."""
    _, url = server
    assert submit(jobs, url).exit_code == 0
    store = store_of(tmp_path)
    store.write_bytes(b"\x00garbage" * 4096)
    for args in (["submit", str(jobs), "--base-url", url], ["status", str(jobs)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 74, result.output
        assert f"{store} is damaged" in result.stderr
        assert "aside" in result.stderr
        assert "Traceback" not in result.output


def test_a_ledger_cut_short_exits_74_naming_it(tmp_path, server, jobs):
    """A ledger cut to its first pages is reported as damaged, exit 74."""
    _, url = server
    assert submit(jobs, url).exit_code == 0
    ledger = tmp_path / "state" / "ledger.db"
    ledger.write_bytes(ledger.read_bytes()[:4096] + b"\xff" * 100)
    result = submit(jobs, url, "--restart")
    assert result.exit_code == 74, result.output
    assert str(ledger) in result.stderr


def test_a_state_folder_it_may_not_write_exits_74(monkeypatch, server, jobs):
    """A read-only state folder (simulated: the tests run as root) exits 74 with
    what to do, not PermissionError."""
    _, url = server

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(runlock, "os", FakeOs(denied))
    result = submit(jobs, url)
    assert result.exit_code == 74, result.output
    assert "cannot be written" in result.stderr
    assert "writable by you, or use another --state-dir" in result.stderr


class FakeOs:
    """The os module as a store module sees it, with `open` (and `fdopen`)
    replaced."""

    def __init__(self, open_, *, fdopen=os.fdopen) -> None:
        self.open = open_
        self.fdopen = fdopen

    def __getattr__(self, name):
        return getattr(os, name)


def test_an_existing_state_folder_is_not_chmodded(tmp_path, server, jobs):
    """A folder the user made keeps its mode; the folders batchrun makes are 0700."""
    _, url = server
    (tmp_path / "state").mkdir(mode=0o755)
    (tmp_path / "state").chmod(0o755)
    assert submit(jobs, url).exit_code == 0
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o755
    assert store_of(tmp_path).parent.stat().st_mode & 0o777 == 0o700


def test_a_full_disk_at_start_exits_74_and_sends_nothing(server, jobs, disk):
    """No space at start: exit 74 saying so and how to resume; nothing sent."""
    sandbox, url = server
    disk.full = True
    result = submit(jobs, url)
    assert result.exit_code == 74, result.output
    assert "the disk is full" in result.stderr
    assert sandbox.arrivals == []


def test_a_disk_full_mid_run_stops_and_a_rerun_loses_nothing(server, jobs, disk):
    """The disk fills after 5 outcomes: no new request starts, the run exits 74
    saying so; once space is free the rerun sends the rest, each job done."""
    sandbox, url = server
    disk.after = 5
    first = submit(jobs, url, "--concurrency", "2")
    assert first.exit_code == 74, first.output
    assert "the disk is full" in first.stderr
    assert "started no new requests" in first.stderr
    sent_before = len(sandbox.arrivals)
    # Those in flight when the disk filled end; nothing starts after them.
    assert sent_before <= 5 + 2
    disk.full, disk.after = False, None
    again = submit(jobs, url, "--concurrency", "2")
    assert again.exit_code == 0, again.output
    assert set(last_status(jobs).values()) == {"done"}
    assert len(last_status(jobs)) == JOBS
    # Only the jobs whose answer could not be recorded are sent a second time.
    keys = Counter(a.idempotency_key for a in sandbox.arrivals)
    assert len(keys) == JOBS
    assert sum(keys.values()) - JOBS <= sent_before - 4


class _NoSpace(io.FileIO):
    """A file on a full disk: every write fails with ENOSPC."""

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_fdopen(fd, mode="r", *args, **kwargs):
    """`os.fdopen` on a full disk: buffered as open() makes it, so the data is
    flushed (and fails) at flush() and again at close()."""
    return io.TextIOWrapper(io.BufferedRandom(_NoSpace(fd, "r+")))


def test_no_space_for_the_lock_file_exits_74_as_mid_run(monkeypatch, server, jobs):
    """ENOSPC writing the run's lock file at start: exit 74 with the message of a
    full disk mid-run (free space, run again), not 70 for an OSError."""
    sandbox, url = server
    monkeypatch.setattr(runlock, "os", FakeOs(os.open, fdopen=_full_fdopen))
    result = submit(jobs, url)
    assert result.exit_code == 74, result.output
    assert "the disk is full. Free some space" in result.stderr
    assert "run the same command again: the run resumes" in result.stderr
    assert sandbox.arrivals == []


def test_no_space_for_a_generation_marker_says_the_disk_is_full(monkeypatch, tmp_path):
    """ENOSPC writing a marker is a full disk, and leaves no temporary file."""
    monkeypatch.setattr(generation, "os", FakeOs(os.open, fdopen=_full_fdopen))
    marker = tmp_path / "x.generation"
    with pytest.raises(DiskFull, match="the disk is full"):
        generation.write_marker(marker, "abc")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["status", "plan", "validate"])
def test_read_only_commands_create_and_write_nothing(tmp_path, server, jobs, command):
    """status, plan and validate make no state folder where there is none, and
    leave an existing one byte for byte as it was."""
    _, url = server
    result = CliRunner().invoke(app, [command, str(jobs)])
    # status of a file never run says so, exit 2; the others work from the file.
    assert result.exit_code == (2 if command == "status" else 0), result.output
    assert not (tmp_path / "state").exists()
    assert submit(jobs, url).exit_code == 0
    before = snapshot(tmp_path / "state")
    client = [] if command == "validate" else ["--base-url", url]
    result = CliRunner().invoke(app, [command, str(jobs), *client])
    assert result.exit_code == 0, result.output
    assert snapshot(tmp_path / "state") == before


def snapshot(folder):
    return {
        p.relative_to(folder): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
    }


def test_a_ledger_whose_wal_was_deleted_in_use_exits_74(tmp_path, server, jobs):
    """Another process holds the ledger open and its -wal file is deleted: the
    next run names the ledger and what to do, exit 74, no traceback."""
    _, url = server
    assert submit(jobs, url).exit_code == 0
    ledger = tmp_path / "state" / "ledger.db"
    command = [sys.executable, "-c", HOLD_OPEN, str(ledger)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "holding"
            ledger.with_name("ledger.db-wal").unlink()
            result = submit(jobs, url, "--restart")
        finally:
            holder.kill()
    assert result.exit_code == 74, result.output
    assert f"{ledger} cannot be read or written" in result.stderr
    assert "Wait until no batchrun uses it" in result.stderr
    assert "Traceback" not in result.output


# A process that writes to the ledger and keeps it open (and its -wal with it).
HOLD_OPEN = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("INSERT INTO learned VALUES ('x', 'y', 'z')")
print("holding", flush=True)
time.sleep(60)
"""
