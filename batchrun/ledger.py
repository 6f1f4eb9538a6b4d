"""Where send times live: the `Ledger` protocol and its in-memory implementation.

A ledger records every request of a key from the moment its slot is granted until its
answer arrives, and grants a slot only if `pacer.earliest_slot` allows it now. Check
and record happen in one step (`reserve`), so that every sender drawing on one ledger
shares one budget. The memory ledger serves one process; a SQLite ledger in the state
folder serves every process of a client on the machine.
"""

from __future__ import annotations

import bisect
import itertools
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
        self._next = itertools.count(1)

    def reserve(self, key: str, rule: Rule, pace: Pace, now: float) -> Grant | Wait:
        log = self._logs[key]
        del log.finished[: -rule.deepest]
        slot = earliest_slot(self.usage(key, rule), rule, pace)
        if slot is None or slot > now:
            return Wait(slot)
        log.in_flight += 1
        log.last_start = now
        ticket = next(self._next)
        self._tickets[ticket] = key
        return Grant(ticket)

    def release(self, ticket: int, now: float) -> None:
        log = self._logs[self._tickets.pop(ticket)]
        log.in_flight -= 1
        # Completions arrive in time order, so this is an append unless the clock
        # stepped back.
        bisect.insort(log.finished, now)

    def usage(self, key: str, rule: Rule) -> Usage:
        log = self._logs[key]
        return Usage(log.in_flight, log.finished, log.last_start)


_LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS sends (
    id INTEGER PRIMARY KEY, client TEXT NOT NULL, key TEXT NOT NULL,
    start REAL NOT NULL, end REAL, expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sends_by_end
    ON sends (client, key, coalesce(end, expires));
CREATE INDEX IF NOT EXISTS sends_in_flight
    ON sends (client, key, expires) WHERE end IS NULL;
CREATE INDEX IF NOT EXISTS sends_by_start ON sends (client, key, start);
"""
# History older than this (or than the rule's longest window) is pruned.
_KEEP = 3600.0
_PRUNE_EVERY = 1000


class SqliteLedger:
    """The send log of one client, shared by every process on the machine.

    `reserve` reads and records in one `BEGIN IMMEDIATE` transaction, so two
    processes can never both take the last slot of a window. Times are wall-clock
    seconds, which processes share. A request whose process died before its answer
    counts as in flight until `start + hold` (the request timeout), then as answered
    at that moment.
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
        slot = earliest_slot(self._usage(key, rule, now), rule, pace)
        if slot is None:
            return Wait(self._soonest_expiry(key, now))
        if slot > now:
            return Wait(slot)
        cursor = self._db.execute(
            "INSERT INTO sends (client, key, start, expires) VALUES (?, ?, ?, ?)",
            (self._client, key, now, now + self._hold),
        )
        assert cursor.lastrowid is not None
        return Grant(cursor.lastrowid)

    def release(self, ticket: int, now: float) -> None:
        self._db.execute("UPDATE sends SET end = ? WHERE id = ?", (now, ticket))

    def usage(self, key: str, rule: Rule) -> Usage:
        return self._usage(key, rule, self._now())

    def _usage(self, key: str, rule: Rule, now: float) -> Usage:
        who = (self._client, key)
        # Each lookup walks one index, so a reserve stays cheap however long the log.
        (in_flight,) = self._db.execute(
            "SELECT count(*) FROM sends WHERE client = ? AND key = ? "
            "AND end IS NULL AND expires > ?",
            (*who, now),
        ).fetchone()
        (last_start,) = self._db.execute(
            "SELECT max(start) FROM sends WHERE client = ? AND key = ?", who
        ).fetchone()
        rows = self._db.execute(
            "SELECT coalesce(end, expires) AS ended FROM sends WHERE client = ? "
            "AND key = ? AND (end IS NOT NULL OR expires <= ?) "
            "ORDER BY ended DESC LIMIT ?",
            (*who, now, rule.deepest),
        ).fetchall()
        return Usage(in_flight, [r[0] for r in reversed(rows)], last_start)

    def _soonest_expiry(self, key: str, now: float) -> float | None:
        (soonest,) = self._db.execute(
            "SELECT min(expires) FROM sends WHERE client = ? AND key = ? "
            "AND end IS NULL AND expires > ?",
            (self._client, key, now),
        ).fetchone()
        return None if soonest is None else float(soonest)

    def _prune(self, key: str, before: float) -> None:
        self._db.execute(
            "DELETE FROM sends WHERE client = ? AND key = ? "
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
