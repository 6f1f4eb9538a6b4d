"""The send log of one client in SQLite, shared by every process on the machine.

Invariant: a process grants a slot only if `slots.earliest_slot` allows it over
every send and answer any process of the client has written (an answer row holds
the moment its request counts until: the answer, or its bounded arrival), read
and written in one `BEGIN IMMEDIATE` transaction, so two processes never both take
the last slot of a window. A request whose answer is not (yet) written counts as
in flight until its start + the request timeout, then as answered at that moment.

Stamps are on the machine clock (`clock.MachineClock`, seconds since boot), each
with the id of its boot, never on the wall clock, which can be stepped. A stamp is
never read as later than now. A stamp of an earlier boot is read as the start of
this boot (that request was answered before the machine restarted). A history that
was lost (the file emptied, deleted or replaced, which its generation marker beside
it tells) is read as full: every window of every key counts as full at the moment
the loss was noticed (the horizon). So is one lost mid-run: every reserve first
checks that the file at the path is still the one opened and, in its transaction,
that its log still holds the newest row this process read (and its generation).
Emptied in place, the horizon is set in the file for every process, and this one
goes on; deleted or replaced, the run stops (`LedgerLost`): the processes that
shared it can no longer meet in one file, and the next run reads the horizon.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from batchrun.core.clock import boot_id
from batchrun.core.errors import LedgerLost, StateError
from batchrun.core.limits import Pace, Rule
from batchrun.ledgers.lost import HistoryLost, Loss
from batchrun.pacing.ledger import KeyHistory
from batchrun.pacing.slots import Grant, Usage, Wait, earliest_slot, reach
from batchrun.store.database import open_database, write_transaction
from batchrun.store.generation import (
    marker_of,
    new_generation,
    read_marker,
    write_marker,
)

# An append-only log: a send is one row, its answer another, so a write touches one
# page and needs no index. A send's `seq` is its ticket; an answer names it.
_MIGRATIONS = (
    """
CREATE TABLE IF NOT EXISTS send_log (
    seq INTEGER PRIMARY KEY,
    client TEXT NOT NULL,
    key TEXT NOT NULL,
    ticket INTEGER,
    at REAL NOT NULL,
    expires REAL,
    keep_until REAL NOT NULL
);
""",
    # Learned limits (`remember`): one opaque text per client and key.
    """
CREATE TABLE IF NOT EXISTS learned (
    client TEXT NOT NULL,
    key TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (client, key)
);
""",
    # The boot of each stamp; NULL marks a row of an older batchrun, stamped on the
    # wall clock. The file's generation and horizon live in `ledger_meta`.
    """
ALTER TABLE send_log ADD COLUMN boot TEXT;
CREATE TABLE IF NOT EXISTS ledger_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
""",
)
# History older than this (or than the rule's longest window) is pruned, from the
# oldest rows, a bounded batch at a time.
_KEEP = 3600.0
_PRUNE_EVERY = 500
_PRUNE_BATCH = 2000


class SqliteLedger:
    """The send log of one client, shared by every process on the machine.

    `reserve` reads and records in one `BEGIN IMMEDIATE` transaction, so two
    processes can never both take the last slot of a window. Times are seconds on
    the machine clock, which processes share. A request whose process died before
    its answer counts as in flight until `start + hold` (the request timeout), then
    as answered at that moment.

    The file is an append-only log of sends and answers. Each process keeps a copy
    of its client's history in memory and reads only the rows written since it last
    looked, so a reserve costs the same with ten rows in the log or a million.
    Answers are written with the next reserve (or at `close`): until then other
    processes count the request as still in flight, which is never less safe.
    """

    def __init__(
        self,
        path: Path,
        *,
        client: str,
        hold: float,
        now: Callable[[], float],
        boot: str | None = None,
        read_only: bool = False,
        notice: Callable[[HistoryLost], None] | None = None,
    ) -> None:
        """`now` is the machine clock (`clock.MachineClock().now`) and `boot` the
        id of the boot it counts from (`clock.boot_id()` unless given).
        `read_only` (status, plan) writes nothing, not even to settle a lost
        history: the next run that writes notices that. `notice` is told of a
        history lost mid-run, once per loss.

        Raises:
            StateError: the file or its generation marker cannot be used.
        """
        self._db = open_database(path, _MIGRATIONS, timeout=60, read_only=read_only)
        self._path = path
        self._file = _identity(path)
        self._notice = notice
        self._generation: str | None = None
        self._looked = now()  # when the log was last seen whole
        self._read_only = read_only
        self._client = client
        self._hold = hold
        self._now = now
        self._boot = boot_id() if boot is None else boot
        self._reserves = 0
        self._seen = 0
        # (key, ticket, answered at, never sent: the same moment, keep until)
        self._answers: list[tuple[str, int, float, float | None, float]] = []
        self._logs: defaultdict[str, KeyHistory] = defaultdict(KeyHistory)
        self._keys: dict[int, tuple[str, float]] = {}
        self.lost_history = False
        try:
            if read_only:
                self._horizon = self._read_horizon(now())
            else:
                with write_transaction(self._db):
                    self._horizon = self._settle(marker_of(path), now())
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        """Write the answers not yet written, and close the file.

        An answer that cannot be written (a full disk) only leaves its request
        counted as in flight until its expiry, which is never less safe.
        """
        try:
            if self._answers and not self._read_only:
                with write_transaction(self._db):
                    self._write_answers()
        except StateError:
            pass
        finally:
            self._db.close()

    def reserve(
        self, key: str, rule: Rule, pace: Pace, now: float, hold: float | None = None
    ) -> Grant | Wait:
        """Grant and record a slot, or say when (see the class docstring); its
        lease lasts `hold`, if shorter than the request timeout.

        Raises:
            LedgerLost: the file was deleted or replaced since it was opened.
        """
        if _identity(self._path) != self._file:
            msg = (
                f"{self._path} was deleted or replaced while in use, so the "
                "processes that share it could pace apart (together past the "
                "limits). The next run reads every window as full until its "
                "longest has passed, and resumes."
            )
            raise LedgerLost(msg)
        with write_transaction(self._db):
            self._check_whole(now)
            return self._reserve(key, rule, pace, now, hold)

    def _check_whole(self, now: float) -> None:
        """Notice a log emptied in place since the last look (its newest row read
        is gone, or its generation changed): the horizon is set, for every
        process, at `now` (or when another process noticed since), and the log
        is read again from its start."""
        [(generation, newest)] = self._db.execute(
            "SELECT (SELECT value FROM ledger_meta WHERE name = 'generation'), "
            "(SELECT max(seq) FROM send_log)"
        )
        looked, self._looked = self._looked, now
        if generation == self._generation and (newest or 0) >= self._seen:
            return
        noticed = self._read_horizon(now)
        if noticed is not None and noticed >= looked:
            self._horizon = noticed  # another process noticed the same loss
        else:
            self._horizon = now
            self._db.execute(
                "INSERT OR REPLACE INTO ledger_meta VALUES ('horizon', ?)",
                (json.dumps({"boot": self._boot, "at": now}),),
            )
        self._generation = self._settle_generation(marker_of(self._path))
        self._seen = 0
        if self._notice is not None:
            self._notice(HistoryLost(str(self._path), Loss.EMPTIED))

    def _reserve(
        self, key: str, rule: Rule, pace: Pace, now: float, hold: float | None
    ) -> Grant | Wait:
        keep = max(_KEEP, reach(rule))
        self._reserves += 1
        if self._reserves % _PRUNE_EVERY == 1:
            self._prune(now)
        self._write_answers()
        self._catch_up(now)
        log = self._logs[key]
        slot = earliest_slot(log.usage(rule, now, self._horizon), rule, pace)
        if slot is None:
            # Every slot waits on an answer, or on a lease's expiry (one of
            # another process may come only so).
            return Wait(log.next_expiry())
        if slot > now:
            return Wait(slot)
        expires = now + (self._hold if hold is None else min(hold, self._hold))
        ticket = self._db.insert(
            "INSERT INTO send_log (client, key, at, expires, keep_until, boot) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (self._client, key, now, expires, expires + keep, self._boot),
        )
        self._keys[ticket] = (key, keep)
        return Grant(ticket)

    def release(self, ticket: int, now: float, *, sent: bool = True) -> None:
        key, keep = self._keys.pop(ticket)
        # An answer row with `expires` set says the request never left.
        self._answers.append((key, ticket, now, None if sent else now, now + keep))

    def usage(self, key: str, rule: Rule) -> Usage:
        now = self._now()
        if self._read_only:
            self._catch_up(now)
        else:
            with write_transaction(self._db):
                self._write_answers()
                self._catch_up(now)
        return self._logs[key].usage(rule, now, self._horizon)

    def recall(self, key: str) -> str | None:
        """The text last remembered for `key` by any process of this client."""
        rows = self._db.execute(
            "SELECT text FROM learned WHERE client = ? AND key = ?", (self._client, key)
        )
        return str(rows[0][0]) if rows else None

    def remember(self, key: str, text: str) -> None:
        """Keep `text` for `key`; kept until replaced (the file has no expiry)."""
        with write_transaction(self._db):
            self._db.execute(
                "INSERT OR REPLACE INTO learned (client, key, text) VALUES (?, ?, ?)",
                (self._client, key, text),
            )

    def _write_answers(self) -> None:
        self._db.executemany(
            "INSERT INTO send_log (client, key, ticket, at, expires, keep_until, boot) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(self._client, *answer, self._boot) for answer in self._answers],
        )
        self._answers.clear()

    def _catch_up(self, now: float) -> None:
        """Apply every send and answer of this client written since the last look."""
        rows = self._db.execute(
            "SELECT seq, key, ticket, at, expires, boot FROM send_log "
            "WHERE seq > ? AND client = ? ORDER BY seq",
            (self._seen, self._client),
        )
        for seq, key, ticket, at, expires, boot in rows:
            at = self._stamp(at, boot, now)
            if ticket is None:
                expires = self._stamp(expires, boot, now + self._hold)
                self._logs[key].sent(seq, at, expires)
            elif expires is not None:
                self._logs[key].withdrawn(ticket)
            else:
                self._logs[key].answered(ticket, at)
        if rows:
            self._seen = rows[-1][0]

    def _stamp(self, at: float, boot: str | None, latest: float) -> float:
        """A stamp on this boot's clock: never after `latest`; one of an earlier
        boot (or a row of an older batchrun) at the start of this boot."""
        return min(at, latest) if boot == self._boot else min(0.0, latest)

    def _settle(self, marker: Path, now: float) -> float | None:
        """Notice a lost history, and return the horizon (None if there is none).

        Lost: the marker names another generation than the file's (the file was
        emptied, deleted or replaced), or rows of an older batchrun are on the
        wall clock, which cannot be read on this one (they are deleted).
        """
        kept = read_marker(marker)
        generation = self._settle_generation(None)
        legacy = self._db.changes("DELETE FROM send_log WHERE boot IS NULL")
        if legacy or kept not in (None, generation):
            self.lost_history = True
            horizon = json.dumps({"boot": self._boot, "at": now})
            self._db.execute(
                "INSERT OR REPLACE INTO ledger_meta VALUES ('horizon', ?)", (horizon,)
            )
        if kept != generation:
            write_marker(marker, generation)
        self._generation = generation
        return self._read_horizon(now)

    def _settle_generation(self, marker: Path | None) -> str:
        """The file's generation, a new one if it has none; kept in `marker`."""
        self._db.execute(
            "INSERT OR IGNORE INTO ledger_meta VALUES ('generation', ?)",
            (new_generation(),),
        )
        [(generation,)] = self._db.execute(
            "SELECT value FROM ledger_meta WHERE name = 'generation'"
        )
        if marker is not None:
            write_marker(marker, str(generation))
        return str(generation)

    def _read_horizon(self, now: float) -> float | None:
        """The moment a lost history was noticed, on this boot's clock, if ever."""
        rows = self._db.execute("SELECT value FROM ledger_meta WHERE name = 'horizon'")
        if not rows:
            return None
        kept_horizon = json.loads(rows[0][0])
        return self._stamp(float(kept_horizon["at"]), kept_horizon["boot"], now)

    def _prune(self, now: float) -> None:
        """Delete rows that no window needs any more, from the oldest.

        The newest row always stays, so `seq` only grows and no process's last
        look is ever overtaken by a reused number.
        """
        # A row of an earlier boot counts from the start of this one (0).
        self._db.execute(
            "DELETE FROM send_log WHERE seq IN (SELECT seq FROM send_log "
            "ORDER BY seq LIMIT ?) AND (CASE WHEN boot IS ? THEN keep_until "
            "ELSE keep_until - coalesce(expires, at) END) < ? "
            "AND seq < (SELECT max(seq) FROM send_log)",
            (_PRUNE_BATCH, self._boot, now),
        )


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file `path` names (device and inode); None if none."""
    with contextlib.suppress(OSError):
        found = os.stat(path)
        return found.st_dev, found.st_ino
    return None
