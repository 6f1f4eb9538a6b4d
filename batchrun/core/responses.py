"""What the server answered, per endpoint: counts by HTTP status, and latencies.

vegeta's and k6's summaries show both: `200: 1180, 400: 12, 429: 3` and the
p50/p95/max of the round trips. `Responses` counts every attempt's answer (a 429
and a retried 5xx included), so the codes add up to the requests sent; an attempt
with no answer (a timeout, a refused connection) counts under `error` and adds no
latency.

Latencies go into logarithmic buckets 2 % wide (the layout of HdrHistogram and
DDSketch): memory stays a few hundred counts however long the run, two runs'
histograms add up, and a percentile read from them is within 1 % of the true
sample. The maximum is kept exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from batchrun.core import durations
from batchrun.core.events import Event, JobAnswered
from batchrun.core.limits import LimitKey

# A bucket's upper bound is this much above its lower one.
_GROWTH = 1.02
_LOG_GROWTH = math.log(_GROWTH)
# Below a microsecond a latency is a clock's rounding: it shares one bucket.
_FLOOR = 1e-6
# The code of an attempt that got no HTTP answer.
NO_ANSWER = "error"
PERCENTILES = (50.0, 95.0)


@dataclass(slots=True)
class Latencies:
    """Round-trip times in seconds, as a logarithmic histogram."""

    buckets: Counter[int] = field(default_factory=Counter)
    count: int = 0
    max: float = 0.0

    def add(self, seconds: float) -> None:
        self.buckets[_bucket(seconds)] += 1
        self.count += 1
        self.max = max(self.max, seconds)

    def percentile(self, p: float) -> float | None:
        """The nearest-rank `p`th percentile (None without a sample): the value
        at least `p` % of the samples are at or below, within 1 %."""
        if not self.count:
            return None
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                return min(_middle(index), self.max)
        return self.max  # pragma: no cover - the counts always reach the rank

    def merge(self, other: Latencies) -> None:
        self.buckets.update(other.buckets)
        self.count += other.count
        self.max = max(self.max, other.max)


def _bucket(seconds: float) -> int:
    return math.ceil(math.log(max(seconds, _FLOOR)) / _LOG_GROWTH)


def _middle(index: int) -> float:
    """The geometric middle of a bucket: at most 1 % from any value in it."""
    return float(_GROWTH ** (index - 0.5))


@dataclass(slots=True)
class KeyResponses:
    """One endpoint's answers: how many of each status code, and their latencies."""

    codes: Counter[str] = field(default_factory=Counter)
    latency: Latencies = field(default_factory=Latencies)

    def codes_text(self) -> str:
        """`200: 1,180, 400: 12, 429: 3`, codes in order, `error` last."""
        return ", ".join(f"{code}: {n:,}" for code, n in self.ordered())

    def ordered(self) -> list[tuple[str, int]]:
        return sorted(self.codes.items(), key=lambda item: _code_order(item[0]))

    def latency_text(self) -> str:
        """`p50 120 ms, p95 340 ms, max 1.2 s` (empty without an answer)."""
        if not self.latency.count:
            return ""
        shown = [
            f"p{p:g} {durations.spoken(self.latency.percentile(p) or 0.0)}"
            for p in PERCENTILES
        ]
        return ", ".join([*shown, f"max {durations.spoken(self.latency.max)}"])


def _code_order(code: str) -> tuple[int, str]:
    return (int(code), "") if code.isdigit() else (1000, code)


@dataclass(slots=True)
class Responses:
    """Every endpoint's answers in a run."""

    keys: dict[LimitKey, KeyResponses] = field(default_factory=dict)

    def emit(self, event: Event) -> None:
        """As an event sink: count each `JobAnswered`."""
        if isinstance(event, JobAnswered):
            self.add(event.key, event.status, event.latency)

    def add(self, key: LimitKey, status: int | None, latency: float) -> None:
        """Count one attempt: its HTTP status (None: no answer) after `latency` s."""
        found = self.keys.setdefault(key, KeyResponses())
        found.codes[NO_ANSWER if status is None else str(status)] += 1
        if status is not None:
            found.latency.add(latency)

    def to_json(self) -> dict[str, object]:
        """A JSON-able form that `from_json` reads back (kept in the run store)."""
        return {
            key.value: {
                "codes": dict(found.ordered()),
                "buckets": {
                    str(i): n for i, n in sorted(found.latency.buckets.items())
                },
                "max": found.latency.max,
            }
            for key, found in self.keys.items()
        }

    @classmethod
    def from_json(cls, value: object) -> Responses:
        """What `to_json` made; anything else (an older store) reads as none."""
        found = cls()
        if not isinstance(value, Mapping):
            return found
        for name, item in value.items():
            try:
                found.keys[LimitKey(name)] = _key_from_json(item)
            except (ValueError, TypeError):
                continue
        return found


def _key_from_json(item: object) -> KeyResponses:
    if not isinstance(item, Mapping):
        raise TypeError(item)
    codes, buckets, top = item.get("codes"), item.get("buckets"), item.get("max")
    if not (isinstance(codes, Mapping) and isinstance(buckets, Mapping)):
        raise TypeError(item)
    if isinstance(top, bool) or not isinstance(top, int | float):
        raise TypeError(item)
    latency = Latencies(Counter({int(i): int(n) for i, n in buckets.items()}))
    latency.count = sum(latency.buckets.values())
    latency.max = float(top)
    return KeyResponses(Counter({str(c): int(n) for c, n in codes.items()}), latency)
