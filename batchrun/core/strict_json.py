"""Strict JSON, as jobs files are read and answers are kept.

Python's `json` accepts NaN, Infinity and numbers it cannot hold, and builds strings
(a lone surrogate, "\\ud800") that cannot be written back as UTF-8. A value that
passes `loads` and `check_encodable` can be sent by httpx and written to a results
file that any JSON reader accepts.
"""

from __future__ import annotations

import json
import math
from typing import Any

_MAX_DIGITS = 4300  # sys.int_info.default_max_str_digits


def loads(text: str) -> Any:
    """Parse strict JSON: ValueError names what is wrong; RecursionError when
    nested too deeply."""
    return _DECODER.decode(text)


def surely_encodable(text: str) -> bool:
    """Whether the value parsed from `text` needs no `check_encodable`: without a
    \\u escape it holds no lone surrogate, and with under 100 brackets it cannot
    nest deeply enough to fail encoding. Most JSON, checked cheaply."""
    return "\\u" not in text and text.count("{") + text.count("[") < 100


def check_encodable(value: Any) -> None:
    """Raise UnicodeEncodeError if `value` holds a lone surrogate, RecursionError if
    it is nested too deeply to encode: the encoding httpx applies when sending."""
    json.dumps(value, ensure_ascii=False).encode()


def _no_constant(name: str) -> Any:
    msg = f"{name} is not a JSON value"
    raise ValueError(msg)


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        shown = repr(text) if len(text) <= 40 else f"{text[:36]!r}..."
        msg = f"the number {shown} is too large"
        raise ValueError(msg)
    return number


def _integer(text: str) -> int:
    # Python refuses longer integers with a hint about its own settings.
    digits = len(text.lstrip("-"))
    if digits > _MAX_DIGITS:
        msg = f"a number of {digits} digits is too long"
        raise ValueError(msg)
    return int(text)


_DECODER = json.JSONDecoder(
    parse_constant=_no_constant, parse_float=_finite, parse_int=_integer
)
