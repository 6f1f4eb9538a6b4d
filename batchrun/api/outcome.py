"""What one attempt of a job came to: `Kind` and `Outcome`, free of any HTTP library.

The client makes Outcomes, the runner acts on them; neither needs the other's imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from batchrun.api.hints import Hints


class Kind(StrEnum):
    """What an answer means for its job (docs/reference/contract.md#the-outcomes)."""

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
    # Seconds after the send began that the request's last byte left, when the
    # transport reports it (httpx's trace extension); None when it does not.
    written: float | None = None
    # The TCP connect's round trip, when this attempt opened its connection.
    round_trip: float | None = None
    # A configuration fault, named by what is to fix: every request would meet
    # this answer the same way, so it says nothing of the job. "token" (401, a
    # 403 that is not a rate limit), "tls" (trust or handshake), "proxy" (it
    # refused), "network" (no such name, connection refused). The breaker counts
    # these; the job is tried again, and left pending when the breaker trips.
    fault: str | None = None
    # For a body kept as text (not JSON, or cut short): its Content-Type, and
    # its whole size in bytes when only part of it is kept.
    content_type: str | None = None
    size: int | None = None


def says_rate_limited(hints: Hints) -> bool:
    """Whether a 403 says it is a rate limit, as GitHub's do: a wait named
    (Retry-After), or a quota with none remaining. A 403 without either is a
    refusal of the token or its rights: a configuration fault ("token")."""
    return hints.retry_after is not None or hints.remaining == 0


def rate_limited_wait(hints: Hints) -> float | None:
    """How long a 429 says to wait: Retry-After, else the reset of a quota the
    server says is spent."""
    if hints.retry_after is not None:
        return hints.retry_after
    return hints.reset if hints.remaining == 0 else None
