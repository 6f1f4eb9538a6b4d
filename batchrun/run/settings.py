"""How hard a run pushes and how it retries: the runner's `Settings`, checked when
built."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from batchrun.api.hints import RETRY_AFTER_CAP
from batchrun.core.limits import LimitKey, Pace, Rule
from batchrun.pacing.model import USUAL

# With no --concurrency, the requests a run keeps in flight follow what the
# limits need (`in_flight_cap`), from this many (the default before, enough
# for quick answers: 8 in flight of 100 ms answers send 80 a second) ...
IN_FLIGHT_LEAST = 8
# ... to this many. Past it the need is a guess: each request in flight holds a
# connection and a file descriptor (64 stay far under the usual limit of
# 1,024, and under the connections a server or a proxy gives one client:
# nginx's default worker_connections is 512), and a cap set by answer times
# seen is only as good as they are. A run that needs more says so (the live
# view and the summary), and --concurrency raises it.
IN_FLIGHT_CEILING = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How hard a run pushes and how it retries; checked when built."""

    # The most requests in flight: a hard cap when given (--concurrency); None,
    # as the limits need (`in_flight_cap`).
    concurrency: int | None = None
    max_attempts: int = 5
    backoff: float = 1.0
    backoff_cap: float = 60.0
    pace: Pace = Pace.EXACT
    # The usual window lengths, in seconds, a 429 may be explained by besides the
    # rules' own (`model.USUAL`), in the rules' time: the cli divides them as it
    # divides the windows.
    usual: tuple[float, ...] = USUAL
    # The longest Retry-After honoured beyond a key's longest window, in the
    # rules' time (`api.hints.RETRY_AFTER_CAP`, divided as the windows are).
    retry_after_cap: float = RETRY_AFTER_CAP
    # The safer rule a key falls back to if the server shows its rule is too
    # loose (--profile auto: run-query's statement B), until that is settled.
    fallback: Mapping[LimitKey, Rule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("concurrency", "max_attempts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                msg = f"{name.replace('_', '-')} must be at least 1"
                raise ValueError(msg)


def in_flight_cap(
    rules: Mapping[LimitKey, Rule], answers: Mapping[LimitKey, float]
) -> int:
    """How many requests a run with no --concurrency keeps in flight: for each
    key with answers seen, its rule's long-run rate times the slow end of its
    answer times, rounded up, plus one for the request waiting for its slot
    (Little's law: a run-query answered in 20 s under 30/1m needs 10 in
    flight, and 8 send 24 a minute); summed over keys, never below
    `IN_FLIGHT_LEAST` nor above `IN_FLIGHT_CEILING`. The pacer still keeps
    every key's windows: it never has more of a key in flight than its
    smallest window's count."""
    need = sum(
        math.ceil(answer / rules[key].interval) + 1
        for key, answer in answers.items()
        if key in rules
    )
    return max(IN_FLIGHT_LEAST, min(need, IN_FLIGHT_CEILING))


def connections(settings: Settings) -> int:
    """The connections the client may open: one per request in flight."""
    return IN_FLIGHT_CEILING if settings.concurrency is None else settings.concurrency
