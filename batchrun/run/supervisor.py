"""Running until done, a deadline or a signal.

SIGINT, SIGTERM and `--deadline` stop starting requests and wait for those in
flight; a second SIGINT stops at once. The view is ticked in quiet spells.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import anyio

from batchrun.core.events import Status
from batchrun.core.limits import LimitKey
from batchrun.run.exit_code import Cause, Stop, Why
from batchrun.run.halt import HaltWatch
from batchrun.run.news import News, Stopping
from batchrun.run.runner import Runner
from batchrun.run.view import QUIET, ProgressSink
from batchrun.store.state import RunStore


def pending_counts(store: RunStore) -> dict[LimitKey, int]:
    """Each key's count of jobs still to send, by key."""
    counts = store.counts()
    pending = {k: n for (k, s), n in counts.items() if s is Status.PENDING and n}
    return dict(sorted(pending.items()))


async def supervise(
    runner: Runner,
    store: RunStore,
    deadline: float | None,
    sink: ProgressSink,
    halt: HaltWatch | None = None,
) -> Stop | None:
    """Run until done, a deadline, a halt (`--halt-after`) or a signal; why it
    stopped early (the runner's own stops too), None if it did not."""
    say = sink.note
    pending = pending_counts(store)
    sources = {key: store.pending(key) for key in pending}
    said = False

    def stop(cause: Cause, why: Why = "") -> None:
        nonlocal said
        if not said:
            said = True
            say(Stopping(cause, why))
        runner.stop(Stop.of(cause, why))

    if halt is not None:
        halt.watch(runner.tally, lambda halted: stop(Cause.HALT, halted))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_on_signals, stop, tasks.cancel_scope, say)
        tasks.start_soon(_heartbeat, sink.tick)
        if deadline is not None:
            tasks.start_soon(_after, deadline, stop)
        await runner.run(sources, pending)
        tasks.cancel_scope.cancel()
    return _ended(runner.stopped, say)


def _ended(stopped: Stop | None, say: Callable[[News], None]) -> Stop | None:
    """Say what the runner's own stop was, once those in flight have ended: the
    breaker, or a lost ledger; a state file that could not be written raises,
    unless the breaker stopped the run."""
    if stopped is None:
        return None
    breaker = stopped.reason(Cause.BREAKER)
    lost = stopped.reason(Cause.LEDGER_LOST)
    if breaker is not None:
        say(Stopping(Cause.BREAKER, breaker))
    elif lost is not None:
        say(Stopping(Cause.LEDGER_LOST, lost))
    elif stopped.error is not None:
        msg = (
            f"{stopped.error.message}\nThe run stopped: it started no new requests, "
            "and those in flight ended and were recorded where the state folder "
            "allowed."
        )
        raise type(stopped.error)(msg)
    return stopped


async def _on_signals(
    stop: Callable[[Cause], None],
    everything: anyio.CancelScope,
    say: Callable[[News], None],
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        interrupts = 0
        async for signum in signals:
            interrupts += signum == signal.SIGINT
            if interrupts >= 2:
                say(Stopping(Cause.SIGINT, at_once=True))
                everything.cancel()
                return
            stop(Cause.SIGINT if signum == signal.SIGINT else Cause.SIGTERM)


async def _heartbeat(tick: Callable[[], None]) -> None:
    # Checked ten times per quiet spell, so a quiet log speaks within QUIET + 10 %.
    while True:
        await anyio.sleep(QUIET / 10)
        tick()


async def _after(seconds: float, stop: Callable[[Cause], None]) -> None:
    await anyio.sleep(seconds)
    stop(Cause.DEADLINE)
