"""The exit code a submission ends with, from the store's counts and how the run
stopped (CONTRACT.md section 4).

A signal's (130 for SIGINT, 143 for SIGTERM) wins, so that a shell loop stops;
then 69 if the circuit breaker stopped the run (every request failed the same
way: 401/403, or the server unreachable); then 1 if any job failed or is unknown,
even with jobs left; then 75 if jobs are left (deadline, ledger lost); else 0.
"""

from __future__ import annotations

from collections.abc import Callable

from batchrun.core.errors import (
    EXIT_OK,
    EXIT_SOME_FAILED,
    EXIT_STOPPED,
    StoppedEarly,
)
from batchrun.store.state import JobState, RunStore

_RESUME = "run the same command to resume."
# The in-process sandbox's runs live in a temporary folder (see `_store`).
_NOT_KEPT = (
    "sandbox runs are not kept (their state is temporary), so running the "
    "command again starts over."
)


def exit_code(
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
