"""One run per jobs file: an exclusive lock on a file in the run's folder (filelock).

The system drops the lock when its process dies (`flock` on Unix, `LockFileEx` on
Windows), so a lock left by a killed run never blocks the next one; a file beside it
names the holder's pid for the message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

import filelock

from batchrun.core.errors import RunLocked
from batchrun.store.database import explain


def _lock(path: Path) -> filelock.BaseFileLock:
    """The lock at `path`: never waited for, owned by the object rather than a
    thread, and never a soft lock (a marker file would outlive a killed run)."""
    return filelock.FileLock(
        path, timeout=0, mode=0o600, thread_local=False, fallback_to_soft=False
    )


class RunLock:
    """One run per jobs file: an exclusive lock, which dies with its process."""

    def __init__(self, folder: Path, jobs_file: Path) -> None:
        self._path = folder / "lock"
        self._holder = folder / "lock.pid"
        self._jobs_file = jobs_file
        self._lock = _lock(self._path)

    def __enter__(self) -> Self:
        try:
            self._lock.acquire()
        except filelock.Timeout:
            msg = (
                f"another batchrun ({self._holder_name()}) is already working on "
                f"{self._jobs_file}; wait for it to finish, or stop it."
            )
            raise RunLocked(msg) from None
        except OSError as exc:
            raise explain(exc, self._path) from None
        try:
            fd = os.open(self._holder, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(f"pid {os.getpid()}")
        except OSError as exc:
            self._lock.release()
            raise explain(exc, self._holder) from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()

    def _holder_name(self) -> str:
        try:
            return self._holder.read_text().strip() or "another process"
        except OSError:
            return "another process"


_PROC_LOCKS = Path("/proc/locks")


def is_held(folder: Path) -> bool:
    """Whether a run holds the lock in `folder` now, for `status` (which writes
    nothing). Linux lists every flock in /proc/locks, so no lock is taken; taking
    one, even for an instant, could make a starting run exit 3. Elsewhere the lock
    is probed: taken and released at once."""
    path = folder / "lock"
    try:
        info = path.stat()
    except OSError:
        return False
    try:
        table = _PROC_LOCKS.read_text()
    except OSError:
        return _probe(path)
    name = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    # "1: FLOCK  ADVISORY  WRITE 4321 08:01:1234567 0 EOF": MAJOR:MINOR:INODE.
    return any(
        fields[1] == "FLOCK" and fields[5] == name
        for fields in (line.split() for line in table.splitlines())
        if len(fields) > 5 and fields[1] != "->"
    )


def _probe(path: Path) -> bool:
    lock = _lock(path)
    try:
        lock.acquire()
    except filelock.Timeout:
        return True
    except OSError:
        return False
    lock.release()
    return False
