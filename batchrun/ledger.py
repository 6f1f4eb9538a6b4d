"""Where send times live: the `Ledger` protocol and its in-memory implementation.

A ledger records every request of a key from the moment its slot is granted until its
answer arrives, and grants a slot only if `pacer.earliest_slot` allows it now. Check
and record happen in one step (`reserve`), so that every sender drawing on one ledger
shares one budget. The memory ledger serves one process; a SQLite ledger in the state
folder serves every process of a client on the machine.
"""

from __future__ import annotations

import bisect
import math
import random
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from batchrun.limits import Rule
from batchrun.pacer import Grant, Pace, Usage, Wait, earliest_slot


class Ledger(Protocol):
    """The send log of one client, shared by everything that sends for it."""

    def reserve(self, key: str, rule: Rule, pace: Pace, now: float) -> Grant | Wait:
        """Atomically grant and record a slot for `key` at `now`, or say when."""
        ...

    def release(self, ticket: int, now: float) -> None:
        """Record that the request of `ticket` got its answer (or failed) at `now`."""
        ...

    def usage(self, key: str, rule: Rule) -> Usage:
        """The key's history as the pacer sees it (for status and plans)."""
        ...


@dataclass(slots=True)
class _KeyLog:
    """One key's history in memory: a `pacer.History`."""

    finished: list[float] = field(default_factory=list)
    in_flight: int = 0
    last_start: float | None = None


class MemoryLedger:
    """One process's ledger: per key, the newest completions and the in-flight count.

    Only the last `rule.deepest` completions can bind, so that is all it keeps.
    """

    def __init__(self) -> None:
        self._logs: defaultdict[str, _KeyLog] = defaultdict(_KeyLog)
        self._tickets: dict[int, str] = {}
        self._last_ticket = 0

    def reserve(self, key: str, rule: Rule, pace: Pace, now: float) -> Grant | Wait:
        log = self._logs[key]
        if len(log.finished) > rule.deepest:
            del log.finished[: -rule.deepest]
        slot = earliest_slot(log, rule, pace)
        if slot is None or slot > now:
            return Wait(slot)
        log.in_flight += 1
        log.last_start = now
        self._last_ticket = ticket = self._last_ticket + 1
        self._tickets[ticket] = key
        return Grant(ticket)

    def release(self, ticket: int, now: float) -> None:
        log = self._logs[self._tickets.pop(ticket)]
        log.in_flight -= 1
        # Completions arrive in time order, unless the clock stepped back.
        if log.finished and now < log.finished[-1]:
            bisect.insort(log.finished, now)
        else:
            log.finished.append(now)

    def usage(self, key: str, rule: Rule) -> Usage:
        log = self._logs[key]
        return Usage(log.in_flight, log.finished, log.last_start)


_LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, client TEXT NOT NULL, key TEXT NOT NULL,
    start REAL NOT NULL, end REAL, expires REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS requests_by_version ON requests (client, version);
CREATE INDEX IF NOT EXISTS requests_by_end
    ON requests (client, key, coalesce(end, expires));
CREATE TABLE IF NOT EXISTS versions (
    id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL
);
INSERT OR IGNORE INTO versions VALUES (1, 0);
CREATE TRIGGER IF NOT EXISTS request_sent AFTER INSERT ON requests BEGIN
    UPDATE versions SET last = last + 1;
    UPDATE requests SET version = (SELECT last FROM versions) WHERE id = NEW.id;
END;
CREATE TRIGGER IF NOT EXISTS request_answered AFTER UPDATE OF end ON requests BEGIN
    UPDATE versions SET last = last + 1;
    UPDATE requests SET version = (SELECT last FROM versions) WHERE id = NEW.id;
END;
"""
# History older than this (or than the rule's longest window) is pruned.
_KEEP = 3600.0
_PRUNE_EVERY = 1000


@dataclass(slots=True)
class _SharedLog:
    """One key's requests as this process last read them from the shared table.

    `open` maps each unanswered request to its expiry; one past its expiry counts
    as answered then (`lapsed`) until its real answer, if any, replaces it.
    """

    open: dict[int, float] = field(default_factory=dict)
    lapsed: dict[int, float] = field(default_factory=dict)
    finished: list[float] = field(default_factory=list)
    last_start: float = -math.inf

    def sent(self, ticket: int, start: float, expires: float) -> None:
        self.open[ticket] = expires
        self.last_start = max(self.last_start, start)

    def answered(self, ticket: int, start: float, end: float) -> None:
        self.open.pop(ticket, None)
        expired = self.lapsed.pop(ticket, None)
        if expired is not None:
            at = bisect.bisect_left(self.finished, expired)
            if at < len(self.finished) and self.finished[at] == expired:
                del self.finished[at]
        self.last_start = max(self.last_start, start)
        bisect.insort(self.finished, end)

    def usage(self, rule: Rule, now: float) -> Usage:
        for ticket, expires in list(self.open.items()):
            if expires <= now:
                del self.open[ticket]
                self.lapsed[ticket] = expires
                bisect.insort(self.finished, expires)
        del self.finished[: -rule.deepest]
        last = self.last_start if self.last_start > -math.inf else None
        return Usage(len(self.open), self.finished, last)


class SqliteLedger:
    """The send log of one client, shared by every process on the machine.

    `reserve` reads and records in one `BEGIN IMMEDIATE` transaction, so two
    processes can never both take the last slot of a window. Times are wall-clock
    seconds, which processes share. A request whose process died before its answer
    counts as in flight until `start + hold` (the request timeout), then as answered
    at that moment.

    Every insert and answer gets the next number from `versions` (by trigger, in
    the writer's transaction), so each process keeps a copy of the client's log in
    memory and reads only the rows changed since it last looked: a reserve costs
    the same with ten rows in the table or a million.
    """

    def __init__(
        self, path: Path, *, client: str, hold: float, now: Callable[[], float]
    ) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, timeout=60)
        path.chmod(0o600)
        _set_up(self._db)
        self._client = client
        self._hold = hold
        self._now = now
        self._reserves = 0
        self._seen = 0
        self._logs: defaultdict[str, _SharedLog] = defaultdict(_SharedLog)

    def close(self) -> None:
        self._db.close()

    def reserve(self, key: str, rule: Rule, pace: Pace, now: float) -> Grant | Wait:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            result = self._reserve(key, rule, pace, now)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return result

    def _reserve(self, key: str, rule: Rule, pace: Pace, now: float) -> Grant | Wait:
        self._reserves += 1
        if self._reserves % _PRUNE_EVERY == 1:
            self._prune(key, now - max(_KEEP, rule.longest))
        self._catch_up()
        log = self._logs[key]
        slot = earliest_slot(log.usage(rule, now), rule, pace)
        if slot is None:
            # Every slot waits on an answer; one from another process may come
            # only as its expiry.
            return Wait(min(log.open.values(), default=None))
        if slot > now:
            return Wait(slot)
        cursor = self._db.execute(
            "INSERT INTO requests (client, key, start, expires) VALUES (?, ?, ?, ?)",
            (self._client, key, now, now + self._hold),
        )
        assert cursor.lastrowid is not None
        return Grant(cursor.lastrowid)

    def release(self, ticket: int, now: float) -> None:
        self._db.execute("UPDATE requests SET end = ? WHERE id = ?", (now, ticket))

    def usage(self, key: str, rule: Rule) -> Usage:
        self._db.execute("BEGIN")
        try:
            self._catch_up()
        finally:
            self._db.execute("COMMIT")
        return self._logs[key].usage(rule, self._now())

    def _catch_up(self) -> None:
        """Apply every insert and answer of this client since the last look."""
        rows = self._db.execute(
            "SELECT id, key, start, end, expires, version FROM requests "
            "WHERE client = ? AND version > ? ORDER BY version",
            (self._client, self._seen),
        ).fetchall()
        for ticket, key, start, end, expires, _ in rows:
            log = self._logs[key]
            if end is None:
                log.sent(ticket, start, expires)
            else:
                log.answered(ticket, start, end)
        if rows:
            self._seen = rows[-1][5]

    def _prune(self, key: str, before: float) -> None:
        self._db.execute(
            "DELETE FROM requests WHERE client = ? AND key = ? "
            "AND coalesce(end, expires) < ?",
            (self._client, key, before),
        )


def _set_up(db: sqlite3.Connection, *, tries: int = 50) -> None:
    """WAL mode and the schema, retried: two processes opening a new ledger at once
    can get "database is locked" here at once, without SQLite's busy wait."""
    for attempt in range(tries):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_LEDGER_SCHEMA)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == tries - 1:
                raise
            time.sleep(0.05 + 0.05 * random.random())
