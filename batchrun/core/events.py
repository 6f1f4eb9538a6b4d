"""What the runner reports while it works: frozen event values and the sink protocol.

The runner emits; sinks (the Rich view, plain log lines, tests) only listen. Events
carry no token and no payload, so no sink can leak either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from batchrun.core.limits import LimitKey, Pace, Rule


class Status(StrEnum):
    """Where a job stands: the one job-status type, of the run store, the results
    file and the events alike. A job ends done, failed or unknown."""

    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    DONE = "done"
    FAILED = "failed"
    # The request may or may not have been processed; resent only when asked.
    UNKNOWN = "unknown"


# The states a job ends in.
ENDED = (Status.DONE, Status.FAILED, Status.UNKNOWN)


@dataclass(slots=True)
class Tally:
    """What a run (or one key of it) achieved, as counts."""

    total: int = 0
    done: int = 0
    failed: int = 0
    rate_limited: int = 0
    retried: int = 0
    unknown: int = 0

    @property
    def ended(self) -> int:
        return self.done + self.failed + self.unknown

    @property
    def left(self) -> int:
        return self.total - self.ended

    def add(self, other: Tally) -> None:
        """Count `other` in too."""
        self.total += other.total
        self.done += other.done
        self.failed += other.failed
        self.rate_limited += other.rate_limited
        self.retried += other.retried
        self.unknown += other.unknown


@dataclass(frozen=True, slots=True)
class RunStarted:
    """A run begins: how many jobs each key has to send, under which rule, and the
    moments of the requests that already fill its windows (other processes,
    earlier runs: the client's ledger), so that an ETA counts the whole budget."""

    at: float
    totals: Mapping[LimitKey, int]
    rules: Mapping[LimitKey, Rule]
    pace: Pace
    used: Mapping[LimitKey, Sequence[float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobSent:
    """A request left: `attempt` counts from 1."""

    at: float
    key: LimitKey
    job_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class JobAnswered:
    """An attempt ended after `latency` s: the server's HTTP status, or None when
    no answer came (a timeout, a refused or dropped connection)."""

    at: float
    key: LimitKey
    job_id: str
    status: int | None
    latency: float


@dataclass(frozen=True, slots=True)
class JobRequeued:
    """A job will be tried again after `delay` s; `reason` is "429" or the error."""

    at: float
    key: LimitKey
    job_id: str
    delay: float
    rate_limited: bool
    reason: str


@dataclass(frozen=True, slots=True)
class JobFinished:
    """A job reached its end: done, or failed or unknown with `error`."""

    at: float
    key: LimitKey
    job_id: str
    status: Status
    attempts: int
    http_status: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class SlotWait:
    """The next request of `key` may not leave before `until` (None: an answer)."""

    at: float
    key: LimitKey
    until: float | None


class Because(StrEnum):
    """Why a key is paced by a rule other than its own (`Evidence`)."""

    # That many requests were refused, as the rule explains.
    REFUSED = "refused"
    # A lesson that had expired explains that many refusals again.
    AGAIN = "again"
    # The server states the rule's windows in its rate-limit headers.
    STATED = "stated"
    # --profile auto starts from the safer statement, until the server settles it.
    SAFER = "safer"


@dataclass(frozen=True, slots=True)
class Evidence:
    """Why a key is paced by a learned rule, as a value (`cli` words it):
    `refused` requests (REFUSED, AGAIN), or the `rule` the server stated or
    the safer statement (STATED, SAFER)."""

    because: Because
    refused: int = 0
    rule: Rule | None = None


@dataclass(frozen=True, slots=True)
class RuleLearned:
    """The server showed it allows less than `key`'s rule: it now paces by `rule`
    (and evenly, if `spread`), because of `evidence`; `kept`: an earlier run (or
    another process of the client) learned it, and the ledger kept it."""

    at: float
    key: LimitKey
    rule: Rule
    spread: bool
    evidence: Evidence
    kept: bool = False


@dataclass(frozen=True, slots=True)
class InFlightCapped:
    """The cap on requests in flight, not the limit, holds requests back: `cap`
    in flight (`given`: --concurrency's; else as the limits need, up to its
    ceiling). `lasted` None: it begins; else it ended after that many s."""

    at: float
    cap: int
    given: bool
    lasted: float | None = None


@dataclass(frozen=True, slots=True)
class RunFinished:
    """A run ended; `stopped` is True when it stopped early with jobs left. Its
    counts are the run's `Tally`, which `Runner.run` returns."""

    at: float
    stopped: bool


Event = (
    RunStarted
    | JobSent
    | JobAnswered
    | JobRequeued
    | JobFinished
    | SlotWait
    | RuleLearned
    | InFlightCapped
    | RunFinished
)


class EventSink(Protocol):
    """Anything that listens to a run's events. `emit` must not block or raise."""

    def emit(self, event: Event) -> None: ...


@dataclass(slots=True)
class RunTally:
    """A run's counts, per key: the one tally of a run, which the runner (its
    first listener), `--halt-after`, the views and the metrics file read.
    Counted from the run's events: each key's total from `RunStarted`, its 429s
    and retries from each `JobRequeued`, how its jobs ended from each
    `JobFinished`."""

    keys: dict[LimitKey, Tally] = field(default_factory=dict)

    def emit(self, event: Event) -> None:
        """As an event sink: count `event`."""
        match event:
            case RunStarted():
                for key, total in event.totals.items():
                    self.of(key).total = total
            case JobRequeued():
                counts = self.of(event.key)
                counts.rate_limited += event.rate_limited
                counts.retried += not event.rate_limited
            case JobFinished():
                counts = self.of(event.key)
                counts.done += event.status is Status.DONE
                counts.failed += event.status is Status.FAILED
                counts.unknown += event.status is Status.UNKNOWN

    def of(self, key: LimitKey) -> Tally:
        """`key`'s counts: the same object for the whole run, so that a reader
        may keep it."""
        return self.keys.setdefault(key, Tally())

    def whole(self) -> Tally:
        """The run's counts, every key's added up."""
        total = Tally()
        for counts in self.keys.values():
            total.add(counts)
        return total


class Tee:
    """An event sink that hands each event to several, in order."""

    def __init__(self, *sinks: EventSink) -> None:
        self._sinks = sinks

    def emit(self, event: Event) -> None:
        for sink in self._sinks:
            sink.emit(event)
