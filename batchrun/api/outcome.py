"""What one attempt of a job came to: `Kind` and `Outcome`, free of any HTTP library.

The client makes Outcomes, the runner acts on them; neither needs the other's imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from batchrun.api.hints import Hints


class Kind(StrEnum):
    """What an answer means for its job (CONTRACT.md section 4)."""

    DONE = "done"
    RATE_LIMITED = "rate-limited"
    TRANSIENT = "transient"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The meaning of one attempt: its kind, HTTP status, body and any server delay.

    `maybe_processed` is False only when the request provably never reached the
    server's handler (no connection, a 429, a 503 asking to come back later): only
    then may a job that is not safe to repeat (an invite) be sent again unasked.
    """

    kind: Kind
    status: int | None = None
    body: Any = None
    retry_after: float | None = None
    error: str | None = None
    note: str | None = None
    # What the answer's headers said about the server's limits.
    hints: Hints | None = None
    maybe_processed: bool = True
    # False when the request never reached the server (no connection was made).
    reached: bool = True
