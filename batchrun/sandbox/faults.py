"""Faults the sandbox injects on purpose: which, how often, and from which seed.

`parse_faults` reads `--inject NAME=NUMBER` values; `Faults` checks them when built
(rates within 0..1 adding up to at most 1) and draws them in a fixed order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from batchrun.core.errors import UsageError

_FAULT_FIELDS = {
    "429": "rate_429",
    "5xx": "rate_5xx",
    "drop": "rate_drop",
    "slow": "rate_slow",
    "slow-seconds": "slow_seconds",
}
_FAULT_HINT = (
    "expected NAME=NUMBER, NAME one of 429, 5xx, drop, slow, slow-seconds, seed "
    "(rates are fractions: 429=0.05; slow-seconds=2; seed=7)"
)
# The sum of fault rates is rounded to this many digits first, so float noise
# (1.0000000000000002) does not round up.
NOISE_DIGITS = 6
_N = TypeVar("_N", int, float)


class Fault(StrEnum):
    """The ways an accepted request can be answered badly on purpose."""

    TOO_MANY = "429"
    SERVER_ERROR = "5xx"
    DROP = "drop"
    SLOW = "slow"


@dataclass(frozen=True, slots=True)
class Faults:
    """Fractions of accepted requests answered badly on purpose, drawn in this order."""

    rate_429: float = 0.0
    rate_5xx: float = 0.0
    rate_drop: float = 0.0
    rate_slow: float = 0.0
    slow_seconds: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        rates = self.rates()
        total = round(math.fsum(rates.values()), NOISE_DIGITS)
        if not all(0 <= r <= 1 for r in rates.values()) or total > 1:
            shown = ", ".join(f"{name}={r:g}" for name, r in rates.items() if r)
            msg = (
                f"fault rates must each be within 0..1 and add up to at most 1: {shown}"
            )
            raise UsageError(msg)
        if not (math.isfinite(self.slow_seconds) and self.slow_seconds >= 0):
            msg = f"slow-seconds must be a number >= 0, got {self.slow_seconds:g}"
            raise UsageError(msg)

    def drawn(self, draw: float) -> Fault | None:
        """The fault that a uniform `draw` in [0, 1) lands on, if any."""
        for fault, rate in self.rates().items():
            if draw < rate:
                return Fault(fault)
            draw -= rate
        return None

    def rates(self) -> dict[str, float]:
        """Each fault's rate, by its `--inject` name, in the order they are drawn."""
        return {
            Fault.TOO_MANY: self.rate_429,
            Fault.SERVER_ERROR: self.rate_5xx,
            Fault.DROP: self.rate_drop,
            Fault.SLOW: self.rate_slow,
        }


def parse_faults(specs: Iterable[str]) -> Faults:
    """Read `--inject` values: 429=0.05, 5xx=0.1, drop=0.05, slow=0.1, slow-seconds=2,
    seed=7. Raises UsageError naming the bad value, with a hint."""
    numbers: dict[str, float] = {}
    seed: int | None = None
    for spec in specs:
        name, text = _fault_spec(spec)
        if name == "seed":
            seed = _number(spec, text, int)
        else:
            numbers[_FAULT_FIELDS[name]] = _number(spec, text, float)
    try:
        return Faults(seed=seed, **numbers)
    except UsageError as exc:
        msg = f"bad --inject values: {exc.message}"
        raise UsageError(msg) from None


def _fault_spec(spec: str) -> tuple[str, str]:
    name, sep, text = spec.partition("=")
    name = name.strip()
    if not sep or (name not in _FAULT_FIELDS and name != "seed"):
        msg = f"bad --inject {spec!r}: {_FAULT_HINT}"
        raise UsageError(msg)
    return name, text.strip()


def _number(spec: str, text: str, kind: Callable[[str], _N]) -> _N:
    try:
        return kind(text)
    except ValueError:
        msg = f"bad --inject {spec!r}: {text!r} is not a number; {_FAULT_HINT}"
        raise UsageError(msg) from None
