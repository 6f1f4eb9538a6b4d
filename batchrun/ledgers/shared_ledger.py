"""The ledger every process of a client draws on, chosen by `--ledger URL`.

Invariant: one choice for `submit`, `status` and `plan` alike, so they read the
budget where it is written: no URL means the SQLite file in the state folder (every
process on this machine); `redis://` or `rediss://` means Redis (every machine that
points at it). A Redis that cannot be used is an error, never a silent fallback.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from batchrun.ledgers.lost import HistoryLost
from batchrun.ledgers.sqlite_ledger import SqliteLedger
from batchrun.pacing.ledger import Ledger, MemoryLedger
from batchrun.store.paths import StatePaths


def open_shared_ledger(
    url: str | None,
    *,
    state: StatePaths,
    client: str,
    hold: float,
    now: Callable[[], float],
    read_only: bool = False,
    notice: Callable[[HistoryLost], None] | None = None,
) -> Ledger:
    """The client's ledger: Redis at `url` if given, else SQLite in `state`.

    `read_only` (status, plan) writes nothing: a SQLite ledger not yet made reads
    as an empty one, instead of being created. `notice` is told, once, of a
    history lost mid-run; the Redis epoch this state folder last saw is kept in a
    marker beside the SQLite ledger, so that a later run notices a loss too.

    Raises:
        StateError: the ledger cannot be reached or used.
        UsageError: `url` is not a redis:// or rediss:// URL.
    """
    if url is None:
        if read_only and not state.ledger.exists():
            return MemoryLedger()
        return SqliteLedger(
            state.ledger,
            client=client,
            hold=hold,
            now=now,
            read_only=read_only,
            notice=notice,
        )
    # Imported here: only runs that share their budget through Redis load redis-py.
    from batchrun.ledgers.redis_ledger import RedisLedger, redacted

    # Per Redis and client; the URL without its password, which it never holds.
    where = hashlib.sha256(f"{redacted(url)} {client}".encode()).hexdigest()[:16]
    marker = None if read_only else state.root / f"redis-{where}.generation"
    return RedisLedger(
        url, client=client, hold=hold, now=now, notice=notice, marker=marker
    )
