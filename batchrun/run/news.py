"""What a run tells the person running it, as values; the command line says them.

The command line words them (`cli/news.py`), in the view while one shows the
run, else in the log.

Each kind of news is one small value: those of the run itself here (resuming,
nothing to send, stopping early), those of the modules below it beside what
tells them (a moved run, a run started over, results recovered, a ledger's lost
history). `News` is every one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from batchrun.core.events import Status
from batchrun.ledgers.lost import HistoryLost
from batchrun.run.exit_code import Cause, Why
from batchrun.store.crosscheck import Recovered
from batchrun.store.runs import InvitesAgain, Moved, StartedOver


@dataclass(frozen=True, slots=True)
class Resuming:
    """A run resumes: the file's jobs by state (`total`), some ended earlier,
    some left to send."""

    total: Mapping[Status, int]


@dataclass(frozen=True, slots=True)
class NothingToSend:
    """Every job of `jobs_file` ended in an earlier run (of the round `round`,
    if named): the file's jobs by state (`total`)."""

    jobs_file: Path
    round: str | None
    total: Mapping[Status, int]


@dataclass(frozen=True, slots=True)
class Stopping:
    """The run stops early because of `cause` (`why`: its reason): said when
    the run starts no new requests (a signal, the deadline, --halt-after), or
    once those in flight ended (the breaker, the ledger lost). `at_once`: a
    second Ctrl-C, which does not wait for them."""

    cause: Cause
    why: Why = ""
    at_once: bool = False


News = (
    Resuming
    | NothingToSend
    | Stopping
    | Moved
    | StartedOver
    | InvitesAgain
    | Recovered
    | HistoryLost
)
