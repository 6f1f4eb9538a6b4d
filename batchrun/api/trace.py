"""What the transport reports of one exchange, through httpx's `trace` extension.

Holds `ExchangeTrace`, the callback httpcore calls at each step of a request; it
keeps only durations (never a header, a body or a token).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any


class ExchangeTrace:
    """What httpcore reports of one exchange (httpx's `trace` extension), in
    seconds from the start of the send: when the request's last byte was written,
    and how long the TCP connect took when the exchange opened a connection (the
    kernel answers a SYN at once: a round trip of the network alone)."""

    __slots__ = ("_began", "_connecting", "round_trip", "written")

    def __init__(self) -> None:
        self._began = time.perf_counter()
        self._connecting: float | None = None
        self.written: float | None = None
        self.round_trip: float | None = None

    async def __call__(self, name: str, info: Mapping[str, Any]) -> None:
        now = time.perf_counter()
        if name == "connection.connect_tcp.started":
            self._connecting = now
        elif name == "connection.connect_tcp.complete" and self._connecting:
            self.round_trip = now - self._connecting
        elif name.endswith(".send_request_body.complete"):
            # The last write wins: the pool may retry on another connection.
            self.written = now - self._began
