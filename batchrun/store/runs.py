"""Which run store holds a jobs file's run against an API: found by the file's path
and the API's base URL, kept across a renewed token, followed across a move.

A run is what was sent of one jobs file to one API. Its store is named by the
file's path and the base URL (`core.identity.api_fingerprint`), not the token:
the budget is the client's (base URL and token), but a renewed token is the same
client, so a token rotated between two runs resumes the run. The store records
its base URL and its file's path.

A file moved (or renamed) is recognised by its jobs. When its path has no store
yet, a store of the same API whose file no longer exists, and which holds some of
the file's first `_SAMPLE` jobs unchanged and already sent, is its run: it moves
with the file and the run resumes. A store whose file still exists is another
file's run (a copy is its own run). A store of an earlier batchrun, named by base
URL and token, is renamed when the token is the same; with another token, which
API it served was not recorded, so `submit` refuses rather than guess.

A round is one pass over the file: `--run-id` names it, and a new name starts
the run over (a new night of a nightly file), as `--restart` does; both say how
many done invites go out again before any does. Each round's requests carry
Idempotency-Keys of their own, so a server does not drop them as repeats.

What it tells on the way (a run followed across a move, a run started over) are
values, which the command line says.

Invariant: no store that holds sent jobs of the file is silently passed over.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from batchrun.core.errors import BatchrunError, StateError, UsageError
from batchrun.core.events import Status
from batchrun.core.identity import api_fingerprint
from batchrun.core.limits import LimitKey
from batchrun.jobs.job import Job, scan
from batchrun.store.generation import (
    marker_of,
    new_generation,
    read_marker,
    write_marker,
)
from batchrun.store.paths import StatePaths
from batchrun.store.runlock import RunLock
from batchrun.store.state import RunStore

# How many of a file's first jobs are looked for in other stores.
_SAMPLE = 200
# A store's files: SQLite's journal beside it, and its generation marker.
_SUFFIXES = (".db", ".db-wal", ".db-shm", ".generation")


@dataclass(frozen=True, slots=True)
class Moved:
    """The run of `recorded` (the path its store recorded) resumes: its file
    moved to `jobs_file`."""

    recorded: str
    jobs_file: Path


@dataclass(frozen=True, slots=True)
class StartedOver:
    """The run starts over, every job sent again: a new round named `run_id`
    (None: --restart), after the round `before` (None: unnamed), of which
    `done` jobs were done and `never_sent` never sent."""

    run_id: str | None
    before: str | None
    done: int
    never_sent: int


@dataclass(frozen=True, slots=True)
class InvitesAgain:
    """A warning before a run starts over: `invites` invites done or unknown in
    the earlier run are sent again."""

    invites: int


def locate(
    paths: StatePaths,
    jobs_file: Path,
    *,
    base_url: str,
    client: str,
    say: Callable[[Moved], None],
) -> Path:
    """The run store of `jobs_file` against `base_url`: where it is, or where it
    moves to from a legacy name or a moved file's folder.

    Raises:
        UsageError: a store of an earlier batchrun, of an API it did not record,
            holds jobs of the file already sent (exit 2).
        RunLocked: a moved file's run is in progress in its old place (exit 3).
    """
    path = paths.run_store(jobs_file, api_fingerprint(base_url))
    if path.exists() or read_marker(marker_of(path)) is not None:
        return path
    legacy = path.with_name(f"{client}.db")
    if legacy.exists():
        _move(legacy, path)
        return path
    sample = list(itertools.islice(_jobs(jobs_file), _SAMPLE))
    if sample:
        for other in paths.run_stores():
            if other != path and _follows(other, path, jobs_file, base_url, sample):
                recorded = _meta(other, "jobs_file") or "?"
                with RunLock(other.parent, Path(recorded)):
                    _move(other, path)
                say(Moved(recorded, jobs_file))
                return path
    return path


def _jobs(jobs_file: Path) -> Iterator[Job]:
    for row in scan(jobs_file, check_duplicates=False):
        if isinstance(row, Job):
            yield row


def _follows(
    other: Path, path: Path, jobs_file: Path, base_url: str, sample: list[Job]
) -> bool:
    """Whether `other` is the run of `jobs_file` before it moved."""
    try:
        with RunStore(other) as store:
            base = store.get_meta("base_url")
            recorded = store.get_meta("jobs_file")
            if base is not None and base.rstrip("/") != base_url.rstrip("/"):
                return False
            sent = store.ended_among(sample)
    except BatchrunError:
        return False  # damaged, or of a newer batchrun: not this file's run
    if not sent:
        return False
    if base is None:
        raise UsageError(_unrecorded(other, path, jobs_file, sent))
    return recorded is not None and not Path(recorded).exists()


def _unrecorded(other: Path, path: Path, jobs_file: Path, sent: int) -> str:
    return (
        f"{sent} of the first jobs of {jobs_file} were already sent by a run of an "
        f"earlier batchrun ({other}), which did not record its API: sending them "
        "again could repeat them (invites included). If that run was against this "
        f"--base-url (with an earlier token, or before the file moved), resume it: "
        f"mv {other} {path} && mv {marker_of(other)} {marker_of(path)}; "
        "else --restart starts a new run."
    )


def forget_unsent(folder: Path) -> None:
    """Remove a run folder this submit made, when none of its stores holds a job
    that was sent (a jobs file refused before anything was sent): a run that
    sent nothing leaves nothing. Called with the folder's lock held; the lock
    file goes too, and the runs folder if that leaves it empty."""
    stores = sorted(folder.glob("*.db"))
    for path in stores:
        try:
            with RunStore(path) as store:
                total = totals(store)
        except BatchrunError:
            return  # unreadable: keep it, and let the user see it
        if any(n for state, n in total.items() if state is not Status.PENDING):
            return
    with contextlib.suppress(OSError):
        for found in folder.iterdir():
            found.unlink()
        folder.rmdir()
        folder.parent.rmdir()  # only if empty


def _meta(store_path: Path, name: str) -> str | None:
    with RunStore(store_path) as store:
        return store.get_meta(name)


def _move(source: Path, target: Path) -> None:
    """Move a store and the files beside it to `target`'s name."""
    try:
        for suffix in _SUFFIXES:
            found = source.with_suffix(suffix)
            if found.exists():
                os.replace(found, target.with_suffix(suffix))
    except OSError as exc:
        msg = f"cannot move {source} to {target}: {exc.strerror or exc}."
        raise StateError(msg) from None


def refuse_a_lost_store(
    path: Path, jobs_file: Path, results: Path, state_root: Path
) -> None:
    """Refuse to take a run store that is missing or empty for a fresh start when
    its marker, or a results file of the jobs file, says jobs were sent before.

    Raises:
        UsageError: the store was lost (exit 2); `--restart` sends every job.
    """
    if path.exists() and path.stat().st_size > 0:
        return
    if read_marker(marker_of(path)) is not None:
        msg = (
            f"the run store of {jobs_file} ({path}) was deleted or emptied after "
            "an earlier run: which jobs ended is lost, and sending again could repeat "
            "them (invites included). Restore it from a backup, or use --restart to "
            f"send every job again (earlier results are in {results})."
        )
        raise UsageError(msg)
    ended = _result_lines(results)
    if ended:
        msg = (
            f"{results} holds {ended} result(s) of earlier runs of "
            f"{jobs_file}, but the state folder {state_root} has no run of "
            "it for this API: sending again could repeat them (invites included). "
            "If the state folder moved, point --state-dir at it; if those results "
            "came from another API (or an older batchrun's --sandbox, which wrote "
            "them there too), or every job should go again, use --restart."
        )
        raise UsageError(msg)


def _result_lines(path: Path) -> int:
    try:
        with path.open(encoding="utf-8", errors="replace") as file:
            return sum(1 for line in file if line.strip())
    except FileNotFoundError:
        return 0
    except OSError as exc:
        msg = f"cannot read the results file {path}: {exc.strerror or exc}."
        raise UsageError(msg) from None


def mark(store: RunStore, marker: Path) -> None:
    """Keep the store's generation in the marker beside it (made on first use)."""
    generation = store.get_meta("generation")
    if generation is None:
        generation = new_generation()
        store.set_meta("generation", generation)
    if read_marker(marker) != generation:
        write_marker(marker, generation)


def record(store: RunStore, jobs_file: Path, *, base_url: str) -> None:
    """Write in the store what it is the run of: its API and its file. The
    Idempotency-Key scope is the file's first path, kept when the file moves."""
    where = str(jobs_file.resolve())
    store.set_meta("base_url", base_url.rstrip("/"))
    store.set_meta("jobs_file", where)
    if store.get_meta("scope") is None:
        store.set_meta("scope", where)


def totals(store: RunStore) -> dict[Status, int]:
    counts = store.counts()
    return {s: sum(n for (_, st), n in counts.items() if st is s) for s in Status}


def starts_over(
    store: RunStore,
    *,
    restart: bool,
    run_id: str | None,
    say: Callable[[StartedOver | InvitesAgain], None],
) -> bool:
    """Whether the run starts over: --restart, or a --run-id other than the
    store's round. Says what is sent again, invites first."""
    total = totals(store)
    if not any(total.values()):
        return False
    before = store.get_meta("round")
    new_round = run_id is not None and run_id != before
    if not (restart or new_round):
        return False
    invites = sum(
        n
        for (key, state), n in store.counts().items()
        if key is LimitKey.INVITE and state in (Status.DONE, Status.UNKNOWN)
    )
    left = total[Status.PENDING] + total[Status.IN_FLIGHT]
    say(StartedOver(run_id if new_round else None, before, total[Status.DONE], left))
    if invites:
        say(InvitesAgain(invites))
    return True


def scope(store: RunStore, jobs_file: Path) -> str:
    """The Idempotency-Key scope: the file's first path (kept when it moves), and
    the round, so a new round's requests are not taken for repeats."""
    scope = store.get_meta("scope") or str(jobs_file.resolve())
    round_ = store.get_meta("round")
    return scope if round_ is None else f"{scope}\0{round_}"
