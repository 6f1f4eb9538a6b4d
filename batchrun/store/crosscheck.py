"""The results file as the run's second record: checked against the run store when
a run resumes.

A job's result line is written (and flushed) before its state in the run store.
So when the store lost its latest writes (its -wal deleted while in use, then the
run killed; a state folder restored from a backup), the results file still says
which jobs ended. On resume, a job the store would send again but whose last
result line says done, failed or unknown takes that state instead: it is never
sent again unasked (`--retry-failed`, `--retry-unknown` still ask).

Only the lines written since the store last caught up are read: the store keeps
that offset (`results_seen`: the results file's path and size), moved on while a
run writes and set to the file's end when a run starts over, so lines of an
earlier round never count for this one.

Invariant: every result line before the offset is reflected in the store that
holds the offset (both are written in the store, so a store that loses writes
loses the offset's moves with them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from batchrun.core.events import Status
from batchrun.store.results import ends_since
from batchrun.store.state import RunStore

_SEEN = "results_seen"


@dataclass(frozen=True, slots=True)
class Recovered:
    """Jobs the results file `results` records as ended, which the run store
    still had to send, took their ends: how many by state (`ended`), how many
    of them not safe to send twice (`unsafe`), and whether those are all
    invites."""

    results: Path
    ended: Mapping[Status, int]
    unsafe: int
    invites: bool


def seen(store: RunStore, results: Path, offset: int) -> None:
    """Record that the store reflects every line of `results` before `offset`."""
    where = {"path": str(results.absolute()), "offset": offset}
    store.set_meta(_SEEN, json.dumps(where))


def _size(results: Path) -> int:
    try:
        return results.stat().st_size
    except OSError:
        return 0


def _offset(store: RunStore, results: Path) -> int | None:
    """Where to read `results` from; None if the store never recorded it."""
    text = store.get_meta(_SEEN)
    if text is None:
        return None
    kept = json.loads(text)
    # Another results file, or this one cut short or replaced: read it whole.
    if kept["path"] != str(results.absolute()) or kept["offset"] > _size(results):
        return 0
    return int(kept["offset"])


def reconcile(
    store: RunStore,
    results: Path,
    *,
    starting_over: bool,
    say: Callable[[Recovered], None],
) -> None:
    """Settle the jobs the results file records as ended but the store does not;
    a run that starts over (or a store that never recorded the file) reads
    nothing, and begins at the file's end."""
    offset = None if starting_over else _offset(store, results)
    if offset is None:
        seen(store, results, _size(results))
        return
    end, ends = ends_since(results, offset)
    changed = store.settle(ends)
    seen(store, results, end)
    if changed:
        say(_recovered(changed, results))


def _recovered(
    changed: dict[tuple[str, bool, Status], int], results: Path
) -> Recovered:
    by_state = {
        s: sum(n for (_, _, st), n in changed.items() if st is s) for s in Status
    }
    unsafe = sum(n for (_, flag, _), n in changed.items() if flag)
    kinds = {kind for (kind, flag, _) in changed if flag}
    return Recovered(results, by_state, unsafe, invites=kinds == {"invite"})
