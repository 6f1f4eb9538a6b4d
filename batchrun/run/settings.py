"""How hard a run pushes and how it retries: the runner's `Settings`, checked when
built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from batchrun.core.limits import LimitKey, Pace, Rule


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """How hard a run pushes and how it retries; checked when built."""

    concurrency: int = 8
    max_attempts: int = 5
    backoff: float = 1.0
    backoff_cap: float = 60.0
    pace: Pace = Pace.EXACT
    # Windows are divided by this (demos, tests): so are the windows a 429 may be
    # explained by.
    time_scale: float = 1.0
    # The safer rule a key falls back to if the server shows its rule is too
    # loose (--profile auto: run-query's statement B), until that is settled.
    fallback: Mapping[LimitKey, Rule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("concurrency", "max_attempts"):
            if getattr(self, name) < 1:
                msg = f"{name.replace('_', '-')} must be at least 1"
                raise ValueError(msg)
