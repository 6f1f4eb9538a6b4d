"""The benchmarks' progress lines, time-stamped, as every `python -m bench…` prints."""

from __future__ import annotations

import time


def say(text: str) -> None:
    """A progress line, time-stamped."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)
