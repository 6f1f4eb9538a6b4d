"""One `batchrun submit`: lock the jobs file, take it in, run it, settle the exit code.

    RunLock ─▶ RunStore.sync (validate and import in one streaming pass; exit 2 on
    any bad row, nothing sent) ─▶ recover (what a killed run left in flight)
    ─▶ Runner over the store's pending jobs, paced by the client's shared ledger
    ─▶ exit code from the store's counts.

SIGINT, SIGTERM and `--deadline` stop starting requests and wait for those in
flight; a second SIGINT stops at once. Either way the store stays consistent.

The exit code: a signal's (130 for SIGINT, 143 for SIGTERM) wins, so that a shell
loop stops; then 69 if the circuit breaker stopped the run (every request failed
the same way: 401/403, or the server unreachable); then 1 if any job failed or is
unknown, even with jobs left; then 75 if jobs are left (deadline, ledger lost);
else 0.
"""

from __future__ import annotations

import contextlib
import random
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from batchrun.api.client import Client
from batchrun.cli.progress import QUIET, ProgressSink, log_tag, open_progress
from batchrun.core.clock import Clock, MachineClock, wall_time
from batchrun.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SOME_FAILED,
    EXIT_STOPPED,
    EXIT_TERMINATED,
    EXIT_UNAVAILABLE,
    LedgerLost,
    StoppedEarly,
)
from batchrun.core.events import EventSink
from batchrun.core.limits import LimitKey, Rule, table_text
from batchrun.ledgers.shared_ledger import open_shared_ledger
from batchrun.pacing.ledger import Ledger, MemoryLedger
from batchrun.pacing.pacer import Pacer
from batchrun.run.journal import Journal
from batchrun.run.runner import Recorder, Runner, Settings
from batchrun.store import crosscheck, runs, stamp
from batchrun.store.generation import marker_of
from batchrun.store.paths import StatePaths, client_fingerprint
from batchrun.store.results import ResultsFile
from batchrun.store.runlock import RunLock
from batchrun.store.state import JobState, RunStore


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where requests go: a base URL, or the in-process sandbox (`transport`)."""

    base_url: str
    # Kept out of repr, so no message that shows a Target can show the token.
    token: str | None = field(repr=False)
    timeout: float
    transport: Any = None
    ca_bundle: Path | None = None

    @property
    def client(self) -> str:
        return client_fingerprint(self.base_url, self.token)

    @property
    def is_sandbox(self) -> bool:
        return self.transport is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Submission:
    """Everything one `submit` needs, as settled by the command line."""

    jobs_file: Path
    target: Target
    rules: dict[LimitKey, Rule]
    settings: Settings
    results: Path
    state: StatePaths
    deadline: float | None = None
    retry_failed: bool = False
    retry_unknown: bool = False
    restart: bool = False
    # --ledger: Redis URL, or None for SQLite; out of repr, as it may hold a password.
    ledger_url: str | None = field(default=None, repr=False)
    color: bool = True
    # -1 --quiet (failures and the summary), 0, 1 --verbose (every requeue).
    verbosity: int = 0
    # --run-id: a round's name; a new name sends every job again (a new night).
    run_id: str | None = None


def submit(job: Submission, *, say: Callable[[str], None]) -> int:
    """Run one submission; return its exit code (CONTRACT.md section 4).

    Raises:
        StoppedEarly: when jobs are left after a deadline, a lost ledger or a
            signal, and none failed (exit 75), or after a signal (130, 143).
    """
    lock = RunLock(job.state.make_run_folder(job.jobs_file), job.jobs_file)
    # A ledger that cannot be used stops the run before the jobs file is read;
    # closing it writes the last answers for the other processes.
    with lock, _store(job, say) as store, contextlib.closing(_ledger(job)) as ledger:
        if getattr(ledger, "lost_history", False):
            say(
                f"The send ledger {job.state.ledger} was emptied, deleted or replaced "
                "since it was last used: each window is paced as if it were full."
            )
        restart = runs.starts_over(
            store, restart=job.restart, run_id=job.run_id, say=say
        )
        stamp.take_in(store, job.jobs_file, restart=restart)
        if job.run_id is not None:
            store.set_meta("round", job.run_id)
        crosscheck.reconcile(store, job.results, starting_over=restart, say=say)
        store.recover(retry_failed=job.retry_failed, retry_unknown=job.retry_unknown)
        store.set_meta("rules", table_text(job.rules))
        store.set_meta("pace", job.settings.pace)
        store.set_meta("fallback", table_text(job.settings.fallback))
        # For `status`: where this run writes, and when it started.
        store.set_meta("results", str(job.results.absolute()))
        store.set_meta("started_at", f"{wall_time():.3f}")
        _announce(store, job, say)
        if _pending(store):
            with ResultsFile(job.results) as results:
                journal = Journal(store, results)
                stop = anyio.run(_run, job, store, ledger, journal, say)
                journal.caught_up()
            say(f"Results: {job.results}")
        else:
            stop = None
        kept = not job.target.is_sandbox
        return _exit_code(store, stop=stop, kept=kept, say=say)


async def _run(
    job: Submission,
    store: RunStore,
    ledger: Ledger,
    journal: Journal,
    say: Callable[[str], None],
) -> int | None:
    clock = MachineClock()
    sink = open_progress(
        sys.stdout,
        clock=clock,
        notes=say,
        color=job.color,
        tag=log_tag(job.jobs_file),
        verbosity=job.verbosity,
    )
    try:
        async with open_run(
            job.target,
            rules=job.rules,
            settings=job.settings,
            ledger=ledger,
            clock=clock,
            sink=sink,
            recorder=journal,
            scope=runs.scope(store, job.jobs_file),
        ) as runner:
            return await _supervised(runner, store, job.deadline, sink)
    finally:
        sink.close()


@contextlib.asynccontextmanager
async def open_run(
    target: Target,
    *,
    rules: Mapping[LimitKey, Rule],
    settings: Settings,
    ledger: Ledger,
    clock: Clock,
    sink: EventSink,
    recorder: Recorder,
    scope: str,
    rng: random.Random | None = None,
) -> AsyncIterator[Runner]:
    """A Runner wired to a Client of `target` and a Pacer over `ledger`: the one
    wiring that `submit`, the benchmarks and the tests share.

    `scope` names the jobs file in each job's Idempotency-Key.
    """
    client = Client(
        base_url=target.base_url,
        token=target.token,
        scope=scope,
        timeout=target.timeout,
        connections=settings.concurrency,
        transport=target.transport,
        ca_bundle=target.ca_bundle,
    )
    pacer = Pacer(
        rules=rules,
        ledger=ledger,
        clock=clock,
        pace=settings.pace,
        sink=sink,
        time_scale=settings.time_scale,
    )
    async with client:
        yield Runner(
            sender=client,
            pacer=pacer,
            clock=clock,
            sink=sink,
            recorder=recorder,
            settings=settings,
            rng=rng,
        )


async def _supervised(
    runner: Runner, store: RunStore, deadline: float | None, sink: ProgressSink
) -> int | None:
    """Run until done, a deadline or a signal; the exit code it stopped early with."""
    say = sink.note
    pending = _pending(store)
    sources = {key: store.pending(key) for key in pending}
    stopped: int | None = None

    def stop(why: str, code: int) -> None:
        nonlocal stopped
        if stopped is None:
            say(f"{why}: starting no new requests, waiting for those in flight.")
        # A signal after the deadline still stops a shell loop around batchrun.
        if stopped in (None, EXIT_STOPPED):
            stopped = code
        runner.stop()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_on_signals, stop, tasks.cancel_scope, say)
        tasks.start_soon(_heartbeat, sink.tick)
        if deadline is not None:
            tasks.start_soon(_after, deadline, stop)
        await runner.run(sources, pending)
        tasks.cancel_scope.cancel()
    if runner.breaker.tripped is not None:
        say(f"Circuit breaker: {runner.breaker.tripped}")
        return stopped if stopped not in (None, EXIT_STOPPED) else EXIT_UNAVAILABLE
    halted = runner.halted
    if isinstance(halted, LedgerLost):
        lost = halted.message
        say(f"Ledger lost: {lost}\nStarted no new requests; those in flight ended.")
        return stopped or EXIT_STOPPED
    if halted is not None:
        msg = (
            f"{halted.message}\nThe run stopped: it started no new requests, and "
            "those in flight ended and were recorded where the state folder allowed."
        )
        raise type(halted)(msg)
    return stopped


async def _on_signals(
    stop: Callable[[str, int], None],
    everything: anyio.CancelScope,
    say: Callable[[str], None],
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        interrupts = 0
        async for signum in signals:
            interrupts += signum == signal.SIGINT
            if interrupts >= 2:
                say(
                    "Second Ctrl-C: stopping now; in-flight jobs are settled on resume."
                )
                everything.cancel()
                return
            if signum == signal.SIGINT:
                stop("Ctrl-C (again to stop at once)", EXIT_INTERRUPTED)
            else:
                stop("SIGTERM (Ctrl-C to stop at once)", EXIT_TERMINATED)


async def _heartbeat(tick: Callable[[], None]) -> None:
    # Checked ten times per quiet spell, so a quiet log speaks within QUIET + 10 %.
    while True:
        await anyio.sleep(QUIET / 10)
        tick()


async def _after(seconds: float, stop: Callable[[str, int], None]) -> None:
    await anyio.sleep(seconds)
    stop("Deadline reached", EXIT_STOPPED)


@contextlib.contextmanager
def _store(job: Submission, say: Callable[[str], None]) -> Iterator[RunStore]:
    if not job.target.is_sandbox:
        target = job.target
        path = runs.locate(
            job.state,
            job.jobs_file,
            base_url=target.base_url,
            client=target.client,
            say=say,
        )
        if not job.restart:
            runs.refuse_a_lost_store(path, job.jobs_file, job.results, job.state.root)
        with RunStore(path) as store:
            runs.mark(store, marker_of(path))
            runs.record(store, job.jobs_file, base_url=target.base_url)
            store.set_meta("client", target.client)
            yield store
        return
    # The in-process sandbox forgets its limits when it stops: so do its runs.
    # A file, not memory, so that a huge jobs file does not fill the memory.
    with (
        tempfile.TemporaryDirectory() as folder,
        RunStore(Path(folder) / "run.db") as store,
    ):
        yield store


def _ledger(job: Submission) -> Ledger:
    if job.target.is_sandbox and job.ledger_url is None:
        return MemoryLedger()
    return open_shared_ledger(
        job.ledger_url,
        state=job.state,
        client=job.target.client,
        hold=job.target.timeout,
        now=MachineClock().now,
    )


def _pending(store: RunStore) -> dict[LimitKey, int]:
    counts = store.counts()
    pending = {k: n for (k, s), n in counts.items() if s is JobState.PENDING and n}
    return dict(sorted(pending.items()))


def _announce(store: RunStore, job: Submission, say: Callable[[str], None]) -> None:
    total = runs.totals(store)
    earlier = total[JobState.DONE] + total[JobState.FAILED] + total[JobState.UNKNOWN]
    if earlier and total[JobState.PENDING]:
        say(
            f"Resuming: {total[JobState.DONE]} done earlier, {total[JobState.PENDING]}"
            f" to send, {total[JobState.FAILED]} failed (--retry-failed retries"
            f" them), {total[JobState.UNKNOWN]} unknown (--retry-unknown)."
        )
    if total[JobState.PENDING]:
        return
    round_ = store.get_meta("round")
    named = f" (round {round_})" if round_ else ""
    say(
        f"Nothing to send: every job of {job.jobs_file} ended in an earlier run"
        f"{named}: {total[JobState.DONE]} done, {total[JobState.FAILED]} failed "
        f"(--retry-failed), {total[JobState.UNKNOWN]} unknown (--retry-unknown). "
        "To send every job again as a new round, give a new --run-id (--run-id %F: "
        "one round a day); --restart forgets the run."
    )


_RESUME = "run the same command to resume."
# The in-process sandbox's runs live in a temporary folder (see `_store`).
_NOT_KEPT = (
    "sandbox runs are not kept (their state is temporary), so running the "
    "command again starts over."
)


def _exit_code(
    store: RunStore, *, stop: int | None, kept: bool, say: Callable[[str], None]
) -> int:
    counts = store.counts()
    by_state = {s: sum(n for (_, st), n in counts.items() if st is s) for s in JobState}
    left = by_state[JobState.PENDING] + by_state[JobState.IN_FLIGHT]
    if by_state[JobState.UNKNOWN]:
        say(
            f"{by_state[JobState.UNKNOWN]} invite(s) may or may not have been sent "
            "(a timeout, a server error or a run that died mid-request): check "
            "them, then --retry-unknown to resend."
        )
    failed = by_state[JobState.FAILED] + by_state[JobState.UNKNOWN]
    code = _code(stop, failed=failed, left=left)
    if left:
        then = _RESUME if kept else _NOT_KEPT
        message = f"Stopped early with {left} job(s) left: {then}"
        if code != EXIT_SOME_FAILED:
            raise StoppedEarly(message, exit_code=code)
        say(message)
    return code


def _code(stop: int | None, *, failed: int, left: int) -> int:
    """A signal's code first, then the breaker's, then failures (never hidden by a
    stop), then a stop."""
    if stop is not None and stop != EXIT_STOPPED:
        return stop
    if failed:
        return EXIT_SOME_FAILED
    return EXIT_STOPPED if stop is not None or left else EXIT_OK
