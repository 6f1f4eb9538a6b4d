"""Resuming an unchanged jobs file skips its re-import; any change imports it."""

from __future__ import annotations

import os

import pytest

from batchrun.core.limits import LimitKey
from batchrun.jobs import job
from batchrun.store import stamp
from batchrun.store.state import RunStore

HEADER = "id,type,team_id,payload\n"


@pytest.fixture
def scans(monkeypatch):
    """How many times the jobs file was read row by row."""
    count = [0]
    real = job.scan

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(stamp, "scan", counted)
    return count


def pending(store):
    return [found.id for found in store.pending(LimitKey.RUN_QUERY)]


def test_an_unchanged_file_is_not_read_again(tmp_path, scans):
    """The second take-in of the same file reads no row."""
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + "a,run-query,t,\n")
    with RunStore(tmp_path / "run.db") as store:
        assert stamp.take_in(store, path, restart=False)
        assert not stamp.take_in(store, path, restart=False)
    assert scans[0] == 1


def test_a_change_that_keeps_size_and_time_is_imported(tmp_path, scans):
    """Same size, modification time put back: the hash tells, the file is read."""
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + "a,run-query,t,\n")
    with RunStore(tmp_path / "run.db") as store:
        stamp.take_in(store, path, restart=False)
        before = path.stat()
        path.write_text(HEADER + "b,run-query,t,\n")
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert stamp.take_in(store, path, restart=False)
        assert pending(store) == ["b"]
    assert scans[0] == 2


def test_a_row_added_is_imported_and_restart_always_reads(tmp_path, scans):
    """A new row is taken in; --restart reads even an unchanged file."""
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + "a,run-query,t,\n")
    with RunStore(tmp_path / "run.db") as store:
        stamp.take_in(store, path, restart=False)
        with path.open("a") as file:
            file.write("b,run-query,t,\n")
        assert stamp.take_in(store, path, restart=False)
        assert pending(store) == ["a", "b"]
        assert stamp.take_in(store, path, restart=True)
    assert scans[0] == 3
