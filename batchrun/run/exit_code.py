"""The exit code a submission ends with, from the store's counts and how the run
stopped (CONTRACT.md section 4).

A signal's (130 for SIGINT, 143 for SIGTERM) wins, so that a shell loop stops;
then 69 if the circuit breaker stopped the run (every request failed the same
way: the token refused, TLS, a proxy, or the server unreachable; the jobs are
left, and the message says to fix that and run again); then 1 if any job failed
or is unknown, even with jobs left; then 75 if jobs are left (deadline, ledger
lost); else 0.
"""

from __future__ import annotations

from collections.abc import Callable

from batchrun.core.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SOME_FAILED,
    EXIT_STOPPED,
    EXIT_UNAVAILABLE,
    BatchrunError,
    StateError,
    StoppedEarly,
)
from batchrun.store.state import JobState, RunStore

_RESUME = "run the same command to resume."
# After the breaker, whose message names the cause and its fix.
_FIX_THEN_RESUME = "once that is fixed, run the same command to send them."


def exit_code(
    store: RunStore,
    *,
    stop: int | None,
    say: Callable[[str], None],
    halted: str | None = None,
) -> int:
    """The exit code, saying what is left and why; `halted` is why `--halt-after`
    stopped the run, if it did.

    Raises:
        StoppedEarly: when jobs are left and none failed (75), or after a signal.
    """
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
        then = _FIX_THEN_RESUME if stop == EXIT_UNAVAILABLE else _RESUME
        why = "" if halted is None else f"Halted: {halted}. "
        message = f"{why}Stopped early with {left} job(s) left: {then}"
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


def code_of(exc: BaseException) -> int:
    """The exit code the command line ends with when a submission raises `exc`:
    a BatchrunError's own (of a group's, a StateError's first), 130 for Ctrl-C,
    else 70 (a bug)."""
    leaves = _leaves(exc)
    if all(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        return EXIT_INTERRUPTED
    errors = [leaf for leaf in leaves if isinstance(leaf, BatchrunError)]
    if len(errors) < len(leaves):
        return EXIT_INTERNAL
    return min(errors, key=lambda e: not isinstance(e, StateError)).exit_code


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
