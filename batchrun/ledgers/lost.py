"""A ledger's lost history, as a value: the command line says it (`cli/news.py`).

A ledger that lost its history paces every window as if full; what it tells of
the loss is where the history was, and how it was lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Loss(StrEnum):
    """How a ledger's history was lost."""

    # A SQLite ledger emptied while this run used it.
    EMPTIED = "emptied"
    # A SQLite ledger emptied, deleted or replaced since a run last used it.
    SINCE_LAST_USED = "since last used"
    # Redis lost it: a restart without persistence, a flush, a failover, an
    # evicted key.
    REDIS = "redis"


@dataclass(frozen=True, slots=True)
class HistoryLost:
    """`ledger` (a SQLite file's path, or a Redis URL without its password)
    lost its history, as `loss` says."""

    ledger: str
    loss: Loss
