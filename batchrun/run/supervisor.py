"""Running until done, a deadline or a signal.

SIGINT, SIGTERM and `--deadline` stop starting requests and wait for those in
flight; a second SIGINT stops at once. The view is ticked in quiet spells.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import anyio

from batchrun.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_SOME_FAILED,
    EXIT_STOPPED,
    EXIT_TERMINATED,
    EXIT_UNAVAILABLE,
    LedgerLost,
)
from batchrun.core.limits import LimitKey
from batchrun.run.halt import HaltWatch
from batchrun.run.runner import Runner
from batchrun.run.view import QUIET, ProgressSink
from batchrun.store.state import JobState, RunStore


def pending_counts(store: RunStore) -> dict[LimitKey, int]:
    """Each key's count of jobs still to send, by key."""
    counts = store.counts()
    pending = {k: n for (k, s), n in counts.items() if s is JobState.PENDING and n}
    return dict(sorted(pending.items()))


def _rank(code: int | None) -> int:
    """Which stop's code a run ends with: a signal's over a halt's (1, some jobs
    failed) over the deadline's (75)."""
    return {None: 0, EXIT_STOPPED: 1, EXIT_SOME_FAILED: 2}.get(code, 3)


async def supervise(
    runner: Runner,
    store: RunStore,
    deadline: float | None,
    sink: ProgressSink,
    halt: HaltWatch | None = None,
) -> int | None:
    """Run until done, a deadline, a halt (`--halt-after`) or a signal; the exit
    code it stopped early with."""
    say = sink.note
    pending = pending_counts(store)
    sources = {key: store.pending(key) for key in pending}
    stopped: int | None = None

    def stop(why: str, code: int) -> None:
        nonlocal stopped
        if stopped is None:
            say(f"{why}: starting no new requests, waiting for those in flight.")
        # A signal after the deadline still stops a shell loop around batchrun.
        if _rank(code) > _rank(stopped):
            stopped = code
        runner.stop()

    if halt is not None:
        halt.stop = lambda why: stop(f"Halted: {why}", EXIT_SOME_FAILED)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_on_signals, stop, tasks.cancel_scope, say)
        tasks.start_soon(_heartbeat, sink.tick)
        if deadline is not None:
            tasks.start_soon(_after, deadline, stop)
        await runner.run(sources, pending)
        tasks.cancel_scope.cancel()
    return _ended(runner, stopped, say)


def _ended(
    runner: Runner, stopped: int | None, say: Callable[[str], None]
) -> int | None:
    """The exit code a run that stopped early with `stopped` ends with, once the
    breaker and a lost ledger have had their say; a halted state raises."""
    if runner.breaker.tripped is not None:
        say(f"Circuit breaker: {runner.breaker.tripped}")
        return EXIT_UNAVAILABLE if _rank(stopped) < _rank(EXIT_INTERRUPTED) else stopped
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
