"""What a server states about its rate limits in response headers: the sandbox's side.

Holds `HeaderStyle` (the formats a server may use) and `policy_headers`, which writes
a limiter's `Quota`s in one style. `hints` is the client's reader of the same formats:

- `ietf`: draft-ietf-httpapi-ratelimit-headers from draft 08 on, one member per window:
  `RateLimit-Policy: "10/2s";q=10;w=2` and `RateLimit: "10/2s";r=3;t=1.5`;
- `draft7`: express-rate-limit's `standardHeaders: 'draft-7'`: `RateLimit-Policy:
  10;w=2` (every window) and `RateLimit: limit=10, remaining=3, reset=1.5` (the
  quota with the fewest requests left);
- `x-ratelimit`: `X-RateLimit-Limit`, `-Remaining`, `-Reset` (seconds from now) of
  that same quota; it states no window, so a client can only wait for its reset;
- `none`: nothing beyond the `Retry-After` of a 429.

Invariant: a stated window is never looser than the one enforced and a stated reset
never earlier: windows and resets that are not whole seconds (time-scaled ones) are
written as decimals rounded up to the millisecond, the 3 decimals RFC 8941 allows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

from batchrun.pacing.limiters import Quota


class HeaderStyle(StrEnum):
    """Which rate-limit header fields a server sends (see the module docstring)."""

    NONE = "none"
    IETF = "ietf"
    DRAFT7 = "draft7"
    X_RATELIMIT = "x-ratelimit"


def policy_headers(style: HeaderStyle, quotas: Sequence[Quota]) -> dict[str, str]:
    """The header fields that state `quotas` in `style`; none for no quota."""
    if style is HeaderStyle.NONE or not quotas:
        return {}
    if style is HeaderStyle.IETF:
        return _ietf(quotas)
    tightest = _tightest(quotas)
    limit, left = str(tightest.window.count), str(tightest.remaining)
    reset = _decimal(tightest.reset)
    if style is HeaderStyle.DRAFT7:
        policy = ", ".join(
            f"{q.window.count};w={_decimal(q.window.seconds)}" for q in quotas
        )
        ratelimit = f"limit={limit}, remaining={left}, reset={reset}"
        return {"RateLimit-Policy": policy, "RateLimit": ratelimit}
    return {
        "X-RateLimit-Limit": limit,
        "X-RateLimit-Remaining": left,
        "X-RateLimit-Reset": reset,
    }


def _ietf(quotas: Sequence[Quota]) -> dict[str, str]:
    names = [f'"{q.window}"' for q in quotas]
    policy = ", ".join(
        f"{name};q={q.window.count};w={_decimal(q.window.seconds)}"
        for name, q in zip(names, quotas, strict=True)
    )
    state = ", ".join(
        f"{name};r={q.remaining};t={_decimal(q.reset)}"
        for name, q in zip(names, quotas, strict=True)
    )
    return {"RateLimit-Policy": policy, "RateLimit": state}


def _tightest(quotas: Sequence[Quota]) -> Quota:
    """The fewest requests left; among equals, the one that refills last."""
    return min(quotas, key=lambda q: (q.remaining, -q.reset))


def _decimal(seconds: float) -> str:
    """Seconds rounded up to the millisecond, as an RFC 8941 integer or decimal.

    The ms are rounded first to 6 digits, so float noise (2.0000000001) does not
    round a whole second up.
    """
    ms = math.ceil(round(max(seconds, 0.0) * 1000, 6))
    whole, part = divmod(ms, 1000)
    return str(whole) if part == 0 else f"{whole}.{part:03d}".rstrip("0")
