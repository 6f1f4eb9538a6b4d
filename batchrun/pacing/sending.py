"""How one key sends now: the rule and the way it is paced by, and its cool-down.

The pacer holds one `Sending` a key. After a 429 the key cools down, and then
is half-open, as a circuit breaker is: it grants one probe and nothing more
until the probe's answer, so a server that still refuses costs one 429, not a
burst of them. A cool-down the server named (Retry-After, or a spent budget
until its reset) is kept; one the client guessed ends when a new rule comes,
which says better when the server has room again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchrun.core.limits import Pace, Rule
from batchrun.pacing.slots import Grant, Wait


@dataclass(slots=True)
class Sending:
    """A key's rule and pace, and its cool-down episode: when it began and
    ends, whether a probe goes next, and the probe on its way."""

    rule: Rule
    pace: Pace
    began: float = -math.inf
    until: float = -math.inf
    half_open: bool = False
    probe: int | None = None
    # The server named `until`: no new rule shortens it.
    asked: bool = False

    def pace_by(self, rule: Rule, pace: Pace, now: float) -> None:
        """Send by `rule`, `pace` from `now`; a guessed cool-down ends (a probe
        still goes first, half-open)."""
        self.rule, self.pace = rule, pace
        if not self.asked:
            self.until = min(self.until, now)

    def cool_down(self, now: float, until: float, *, asked: bool) -> None:
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

    def waits(self, now: float) -> Wait | None:
        """Why no request may leave now (cooling down, or a probe's answer is
        awaited); None: the rule decides."""
        if now < self.until:
            return Wait(self.until)
        return None if self.probe is None else Wait(None)

    def granted(self, grant: Grant | Wait) -> None:
        """A slot was granted: when half-open, it is the probe."""
        if self.half_open and isinstance(grant, Grant):
            self.probe = grant.ticket

    def answered(self, ticket: int, *, sent: bool) -> None:
        """The answer of `ticket` came: a probe's closes the circuit, unless it
        never reached the server (it proves nothing: another goes) or a 429's
        `cool_down` follows."""
        if self.probe == ticket:
            self.probe = None
            self.half_open = not sent
