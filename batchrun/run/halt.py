"""When a run stops starting jobs because too many of them fail: `--halt-after`.

A payload bug that the server answers 400 for every job would otherwise spend a
whole night's quota on failures. As GNU parallel's `--halt soon,fail=N` (and
`fail=P%`), `--halt-after N` stops after N jobs of this run failed, and
`--halt-after P%` once P % of this run's ended jobs failed, counted from
`MIN_ENDED` ended jobs on, so that the first unlucky answers do not stop a night.
A job counts as failed when it ended failed or unknown: both make the run exit 1.

`HaltWatch` is an event sink: on each `JobFinished` it reads the run's tally and
calls its `stop` (both given by whoever runs it) once, with the reason (`Halted`:
the policy and the counts that met it, which the command line says), the moment
the policy is met. The run then starts no new jobs, waits for those in flight,
and exits 1 with the rest left for a resume.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from batchrun.core.errors import UsageError
from batchrun.core.events import Event, JobFinished, RunTally

# A share is judged only once this many jobs of the run have ended.
MIN_ENDED = 20
_POLICY = re.compile(r"^\s*(?:(\d+)|(\d+(?:\.\d+)?|\.\d+)\s*%)\s*$")
_HINT = "e.g. --halt-after 10 (ten failed jobs) or --halt-after 5% (of at least 20)"


@dataclass(frozen=True, slots=True)
class HaltPolicy:
    """Halt after `count` failed jobs, or once `percent` % of the ended ones
    (at least `MIN_ENDED`) failed; exactly one of the two is set."""

    count: int | None = None
    percent: float | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.percent is None):
            msg = "a halt policy is a count or a percentage, not both or neither"
            raise ValueError(msg)
        if self.count is not None and self.count < 1:
            msg = f"--halt-after must be at least 1 failed job, got {self.count}"
            raise UsageError(msg)
        if self.percent is not None and not 0 < self.percent <= 100:
            msg = f"--halt-after must be a share above 0% and up to 100%, got {self}"
            raise UsageError(msg)

    @classmethod
    def parse(cls, text: str) -> HaltPolicy:
        """`N` (a count of failed jobs) or `P%` (a share of the ended jobs).

        Raises:
            UsageError: for anything else, or 0, or a share over 100 %.
        """
        match = _POLICY.match(text)
        if match is None:
            msg = f"bad --halt-after {text!r}: {_HINT}."
            raise UsageError(msg)
        count, percent = match.groups()
        if count is not None:
            return cls(count=int(count))
        return cls(percent=float(percent))

    def __str__(self) -> str:
        return f"{self.count}" if self.percent is None else f"{self.percent:g}%"

    def reason(self, *, failed: int, ended: int) -> Halted | None:
        """Why the run should halt now, with `failed` of its `ended` jobs failed;
        None while it should go on."""
        if self.count is not None:
            if failed < self.count:
                return None
            return Halted(self, failed, ended)
        assert self.percent is not None
        if ended < MIN_ENDED or not failed or failed * 100 < self.percent * ended:
            return None
        return Halted(self, failed, ended)


@dataclass(frozen=True, slots=True)
class Halted:
    """Why a run halted: `failed` of its `ended` jobs failed, which met `policy`."""

    policy: HaltPolicy
    failed: int
    ended: int


class HaltWatch:
    """An event sink that calls `stop(reason)` once the policy is met by the run's
    tally; both are given by whoever runs it (`watch`)."""

    def __init__(self, policy: HaltPolicy) -> None:
        self._policy = policy
        self._watched: tuple[RunTally, Callable[[Halted], None]] | None = None
        # Set once the policy was met: why the run halted.
        self.reason: Halted | None = None

    def watch(self, tally: RunTally, stop: Callable[[Halted], None]) -> None:
        """Judge `tally`, the run's (which counts each `JobFinished` before the
        watch hears it), and halt the run through `stop`."""
        self._watched = (tally, stop)

    def emit(self, event: Event) -> None:
        if not isinstance(event, JobFinished) or self.reason is not None:
            return
        if self._watched is None:
            msg = "a HaltWatch must be given the run's tally and stop before the run"
            raise RuntimeError(msg)
        watched, stop = self._watched
        tally = watched.whole()
        failed = tally.failed + tally.unknown
        self.reason = self._policy.reason(failed=failed, ended=tally.ended)
        if self.reason is not None:
            stop(self.reason)
