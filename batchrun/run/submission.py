"""One `batchrun submit`: lock the jobs file, take it in, run it, settle the exit code.

    RunLock ─▶ RunStore.sync (validate and import in one streaming pass; exit 2 on
    any bad row, nothing sent) ─▶ recover (what a killed run left in flight)
    ─▶ Runner over the store's pending jobs, paced by the client's shared ledger
    ─▶ how it ended: the exit code from the stop and the store's counts
    (`exit_code.ending`), which the command line says.

SIGINT, SIGTERM and `--deadline` stop starting requests and wait for those in
flight (`supervisor`); either way the store stays consistent. The caller gives
the view the run is shown in (`Submission.view`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from batchrun.core.clock import MachineClock, wall_time
from batchrun.core.errors import Exit, JobsFileError, RunLocked, code_of
from batchrun.core.events import ENDED, RunTally, Status, Tee
from batchrun.core.limits import LimitKey, Rule, table_text
from batchrun.core.responses import Responses
from batchrun.ledgers.lost import HistoryLost, Loss
from batchrun.ledgers.shared_ledger import open_shared_ledger
from batchrun.pacing.ledger import Ledger, MemoryLedger
from batchrun.run.exit_code import Ending, Stop, ending
from batchrun.run.halt import HaltPolicy, HaltWatch
from batchrun.run.journal import Journal
from batchrun.run.news import News, NothingToSend, Resuming
from batchrun.run.settings import Settings
from batchrun.run.supervisor import pending_counts, supervise
from batchrun.run.view import View
from batchrun.run.wiring import Target, open_run
from batchrun.store import crosscheck, runs, stamp
from batchrun.store.generation import marker_of
from batchrun.store.paths import StatePaths
from batchrun.store.results import ResultsFile, compact
from batchrun.store.runlock import RunLock
from batchrun.store.state import RunStore

# Set while the results file may hold two lines for one id (`_compact`).
_COMPACT = "compact_results"


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """Everything one `submit` needs, as settled by the command line."""

    jobs_file: Path
    target: Target
    rules: dict[LimitKey, Rule]
    settings: Settings
    results: Path
    state: StatePaths
    # The live view or plain log the run is shown in (the command line's).
    view: View
    deadline: float | None = None
    retry_failed: bool = False
    retry_unknown: bool = False
    restart: bool = False
    # --ledger: Redis URL, or None for SQLite; out of repr, as it may hold a password.
    ledger_url: str | None = field(default=None, repr=False)
    # --run-id: a round's name; a new name sends every job again (a new night).
    run_id: str | None = None
    # --halt-after: stop starting jobs once this many failed.
    halt: HaltPolicy | None = None
    # Told the exit code the submission ends with, however it ends, unless
    # another run holds the jobs file (exit 3): the metrics file is that run's.
    ended: Callable[[int], None] | None = field(default=None, repr=False)


def submit(job: Submission, *, say: Callable[[News], None]) -> Ending:
    """Run one submission; return how it ended, with its exit code
    (docs/reference/contract.md#exit-codes), and tell `job.ended` the code, also
    when it raises. `say` is told the run's news (values: `news.News`) that its
    view does not show."""
    code: int = Exit.INTERNAL
    try:
        end = _submit(job, say)
        code = end.code
    except BaseException as exc:
        code = code_of(exc)
        raise
    finally:
        if job.ended is not None and code != RunLocked.exit_code:
            job.ended(code)
    return end


def _submit(job: Submission, say: Callable[[News], None]) -> Ending:
    """Lock the jobs file and run it; a file that cannot be taken in (missing,
    unreadable, a bad row) leaves no run folder, run store or ledger behind."""
    _readable(job.jobs_file)
    folder = job.state.run_folder(job.jobs_file)
    new = not folder.exists()
    with RunLock(job.state.make_run_folder(job.jobs_file), job.jobs_file):
        try:
            return _locked(job, say)
        except JobsFileError:
            if new:
                runs.forget_unsent(folder)
            raise


def _locked(job: Submission, say: Callable[[News], None]) -> Ending:
    with _store(job, say) as store:
        restart = runs.starts_over(
            store, restart=job.restart, run_id=job.run_id, say=say
        )
        ended = _ended(store)
        stamp.take_in(store, job.jobs_file, restart=restart)
        # The ledger is opened once the file is taken in: a bad file makes none.
        # Closing it writes the last answers for the other processes.
        notes = _Notes(say)
        with contextlib.closing(_ledger(job, notes)) as ledger:
            if getattr(ledger, "lost_history", False):
                say(HistoryLost(str(job.state.ledger), Loss.SINCE_LAST_USED))
            _prepare(store, job, restart=restart, ended=ended, say=say)
            return _send(store, job, ledger, notes)


def _readable(jobs_file: Path) -> None:
    """A jobs file that cannot be opened is refused before anything is made.

    Raises:
        JobsFileError: it is missing, a folder or unreadable (exit 2).
    """
    try:
        with jobs_file.open("rb"):
            pass
    except OSError as exc:
        reason = f"cannot read it: {exc.strerror or exc}"
        raise JobsFileError(str(jobs_file), [(0, reason)], 1) from None


def _prepare(
    store: RunStore,
    job: Submission,
    *,
    restart: bool,
    ended: int,
    say: Callable[[News], None],
) -> None:
    """Settle what the store sends this run, and record the run's settings."""
    if job.run_id is not None:
        store.set_meta("round", job.run_id)
    # --restart forgets earlier runs of the file, those of a store it has not
    # got too (a new state folder): their result lines count for none.
    over = restart or job.restart
    crosscheck.reconcile(store, job.results, starting_over=over, say=say)
    store.recover(retry_failed=job.retry_failed, retry_unknown=job.retry_unknown)
    if _ended(store) < ended:
        # Jobs that ended are sent again: their new lines replace the old.
        store.set_meta(_COMPACT, "due")
    store.set_meta("rules", table_text(job.rules))
    store.set_meta("pace", job.settings.pace)
    store.set_meta("fallback", table_text(job.settings.fallback))
    # For `status`: where this run writes, and when it started.
    store.set_meta("results", str(job.results.absolute()))
    store.set_meta("started_at", f"{wall_time():.3f}")
    _announce(store, job, say)


def _send(store: RunStore, job: Submission, ledger: Ledger, notes: _Notes) -> Ending:
    halt = None if job.halt is None else HaltWatch(job.halt)
    if pending_counts(store):
        with ResultsFile(job.results) as results:
            journal = Journal(store, results)
            stop = anyio.run(_run, job, store, ledger, journal, halt, notes)
            journal.caught_up()
        _compact(store, job.results)
    else:
        stop = None
    return ending(store, stop)


def _ended(store: RunStore) -> int:
    total = runs.totals(store)
    return sum(total[s] for s in ENDED)


def _compact(store: RunStore, path: Path) -> None:
    """One line per id in the results file, once a run sent again jobs that had
    ended (a run killed first leaves it due, for the next run)."""
    if store.get_meta(_COMPACT) == "due":
        crosscheck.seen(store, path, compact(path))
        store.set_meta(_COMPACT, "")


async def _run(
    job: Submission,
    store: RunStore,
    ledger: Ledger,
    journal: Journal,
    halt: HaltWatch | None,
    notes: _Notes,
) -> Stop | None:
    clock = MachineClock()
    say = notes.to
    total = runs.totals(store)
    earlier = {s: total[s] for s in ENDED}
    # The answers by code, counted once: kept for `status`, shown by the view;
    # and the jobs per key, counted once by the runner, read by the view.
    responses, tally = Responses(), RunTally()
    sink = job.view(
        clock=clock, notes=say, earlier=earlier, responses=responses, tally=tally
    )
    notes.to = sink.note  # the ledger's notes, in the view while it shows the run
    heard = Tee(responses, sink, *([] if halt is None else [halt]))
    try:
        async with open_run(
            job.target,
            rules=job.rules,
            settings=job.settings,
            ledger=ledger,
            clock=clock,
            sink=heard,
            recorder=journal,
            scope=runs.scope(store, job.jobs_file),
            tally=tally,
        ) as runner:
            stop = await supervise(runner, store, job.deadline, sink, halt)
    finally:
        notes.to = say
        sink.close()
    # For `status`: the latest run's answers by code, and their latencies.
    store.set_meta("responses", json.dumps(responses.to_json()))
    return stop


@contextlib.contextmanager
def _store(job: Submission, say: Callable[[News], None]) -> Iterator[RunStore]:
    """The run store of the jobs file against the target (a sandbox run's is in
    the sandbox's own state folder: `StatePaths.sandbox`)."""
    target = job.target
    path = runs.locate(
        job.state,
        job.jobs_file,
        base_url=target.base_url,
        client=target.identity.client,
        say=say,
    )
    fresh = not path.exists()
    if not job.restart and not target.identity.is_sandbox:
        runs.refuse_a_lost_store(path, job.jobs_file, job.results, job.state.root)
    with RunStore(path) as store:
        runs.mark(store, marker_of(path))
        runs.record(store, job.jobs_file, base_url=target.base_url)
        store.set_meta("client", target.identity.client)
        if fresh and target.identity.is_sandbox:
            # The results of a sandbox run kept by no store (an older batchrun's):
            # the jobs they record as ended are not sent again.
            crosscheck.seen(store, job.results, 0)
        yield store


class _Notes:
    """Where the ledger's notes go (a history it lost mid-run): the log, or the
    run's view while one shows the run."""

    def __init__(self, say: Callable[[News], None]) -> None:
        self.to = say

    def __call__(self, news: News) -> None:
        self.to(news)


def _ledger(job: Submission, notes: _Notes) -> Ledger:
    if job.target.identity.is_sandbox and job.ledger_url is None:
        return MemoryLedger()
    return open_shared_ledger(
        job.ledger_url,
        state=job.state,
        client=job.target.identity.client,
        hold=job.target.timeout,
        now=MachineClock().now,
        notice=notes,
    )


def _announce(store: RunStore, job: Submission, say: Callable[[News], None]) -> None:
    total = runs.totals(store)
    earlier = sum(total[s] for s in ENDED)
    if earlier and total[Status.PENDING]:
        say(Resuming(total))
    if total[Status.PENDING]:
        return
    say(NothingToSend(job.jobs_file, store.get_meta("round"), total))
