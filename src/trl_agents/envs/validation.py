"""Argument checks shared by the environments: bad constructor arguments and task fields fail with a message naming
the field, never deep inside generation code.

Example:
    >>> check_int("size", 6, 3)
    6
    >>> check_int("size", 2, 3)
    Traceback (most recent call last):
    ...
    ValueError: `size` must be an integer >= 3, got 2
"""

from __future__ import annotations

import numbers
from typing import Any


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """`value` as an int in [minimum, maximum], or a ValueError naming `name`."""
    # numbers.Integral also admits numpy integers, which task rows read back from a dataset may hold.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"`{name}` must be an integer <= {maximum}, got {value!r}")
    return int(value)


def check_text(name: str, value: Any) -> str:
    """`value` if it is a string, or a ValueError naming `name` (e.g. a task row's `layout`).

    >>> check_text("layout", "S F G")
    'S F G'
    """
    if not isinstance(value, str):
        raise ValueError(f"`{name}` must be a string, got {type(value).__name__} {value!r}"[:200])
    return value
