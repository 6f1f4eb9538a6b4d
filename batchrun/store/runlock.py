"""One run per jobs file: an exclusive `flock` on a file in the run's folder.

The kernel drops a flock when its process dies, so a lock left by a killed run never
blocks the next one; the file names the holder's pid for the message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO, Self

from batchrun.core.errors import RunLocked
from batchrun.store.database import explain


class RunLock:
    """One run per jobs file: an exclusive flock, which dies with its process."""

    def __init__(self, folder: Path, jobs_file: Path) -> None:
        self._path = folder / "lock"
        self._jobs_file = jobs_file
        self._file: IO[str] | None = None

    def __enter__(self) -> Self:
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise explain(exc, self._path) from None
        file = os.fdopen(fd, "r+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = file.read().strip() or "another process"
            file.close()
            msg = (
                f"another batchrun ({holder}) is already working on "
                f"{self._jobs_file}; wait for it to finish, or stop it."
            )
            raise RunLocked(msg) from None
        try:
            file.truncate(0)
            file.write(f"pid {os.getpid()}")
            file.flush()
        except OSError as exc:
            # Closing flushes the same bytes again, and fails the same way.
            with contextlib.suppress(OSError):
                file.close()
            raise explain(exc, self._path) from None
        self._file = file
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._file is not None:
            self._file.close()  # closing releases the flock


_PROC_LOCKS = Path("/proc/locks")


def is_held(folder: Path) -> bool:
    """Whether a run holds the lock in `folder` now, for `status` (which writes
    nothing). Linux lists every flock in /proc/locks, so no lock is taken; taking
    one, even shared for an instant, could make a starting run exit 3. Elsewhere
    the lock is probed with a shared lock, released at once."""
    path = folder / "lock"
    try:
        info = path.stat()
    except OSError:
        return False
    name = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        table = _PROC_LOCKS.read_text()
    except OSError:
        return _probe(path)
    # "1: FLOCK  ADVISORY  WRITE 4321 08:01:1234567 0 EOF": MAJOR:MINOR:INODE.
    return any(
        fields[1] == "FLOCK" and fields[5] == name
        for fields in (line.split() for line in table.splitlines())
        if len(fields) > 5 and fields[1] != "->"
    )


def _probe(path: Path) -> bool:
    try:
        with path.open() as file:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False
