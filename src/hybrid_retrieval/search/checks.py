"""Field checks shared by every parameter dataclass of the search layer, and compact number text.

A check names the field and the valid range in its `SpecError`, so a request, a manifest, a CLI flag
and an evaluation spec string all fail with the same message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, cast, overload

from hybrid_retrieval.common.errors import SpecError


@overload
def number(
    field: str, value: object, low: float | None = None, high: float | None = None, *, integer: Literal[True], above: bool = False
) -> int: ...
@overload
def number(
    field: str, value: object, low: float | None = None, high: float | None = None, *, integer: Literal[False] = False, above: bool = False
) -> float: ...
def number(
    field: str, value: object, low: float | None = None, high: float | None = None, *, integer: bool = False, above: bool = False
) -> float | int:
    """`value` as a finite int/float within [low, high] (`above`: strictly above `low`), else SpecError."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field, f"must be {kind}, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer beyond float range
        finite = False
    if not finite:
        raise SpecError(field, f"must be a finite number, got {str(value)[:40]}")
    if integer and not float(value).is_integer():
        raise SpecError(field, f"must be {kind}, got {value!r}")
    too_low = low is not None and (value <= low if above else value < low)
    if too_low or (high is not None and value > high):
        if high is None:
            raise SpecError(field, f"must be {'>' if above else '>='} {compact(cast(float, low))}, got {compact(value)}")
        # every caller that gives `high` gives `low` too (with low None, compact would raise TypeError here)
        raise SpecError(field, f"must be between {compact(cast(float, low))} and {compact(high)}, got {compact(value)}")
    return int(value) if integer else float(value)


def choice(field: str, value: object, valid: Sequence[str]) -> str:
    if value not in valid:
        raise SpecError(field, f"unknown value {value!r}; valid: {', '.join(valid)}")
    return cast(str, value)  # equal to one of `valid`


def flag(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SpecError(field, f"must be true or false, got {value!r}")
    return value


def compact(value: float) -> str:
    """Shortest text that parses back to the same number: 60 for 60.0, 0.45 for 0.45, 1e16 (no "+", which
    separates the parts of a spec string)."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value).replace("e+", "e")


def parse_number(field: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SpecError(field, f"not a number: {text!r}") from None
