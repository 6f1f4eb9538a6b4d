"""A key's cool-down after a 429: when it began and ends, and its probe.

During a cool-down the pacer grants no slot of the key; then it is half-open,
as a circuit breaker is: one probe, and nothing more until the probe's answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Cooling:
    """A key's cool-down episode: when it began and ends, and its probe."""

    began: float = -math.inf
    until: float = -math.inf
    half_open: bool = False
    probe: int | None = None
    # The server named its end (Retry-After): then no lesson shortens it.
    asked: bool = False

    def extend(self, now: float, until: float, *, asked: bool) -> None:
        """Cool down until `until`, then probe; one that starts while another
        runs extends that episode. `asked`: the server named `until`."""
        if now >= self.until:
            self.began, self.asked = now, False
        self.until = max(self.until, until)
        self.asked = self.asked or asked
        self.half_open = True

    def hold(self, until: float) -> None:
        """No slot before `until`, as the server asked; no probe follows."""
        self.until, self.asked = max(self.until, until), True
