"""Registries' and configs' shared wording: the closest known name, for the one-line error of a name that is not
registered, and the one-line error of a value outside its choices (`check_choice`).

Example:
    >>> did_you_mean("gigpp", ["gigpo", "grpo", "rloo"])
    " Did you mean 'gigpo'?"
    >>> did_you_mean("xyz", ["gigpo"])
    ''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`" Did you mean 'x'?"` for the known name closest to `name`, or "" when none is close."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def check_choice(argument: str, value: str, choices: Sequence[str]) -> None:
    """Raise a ValueError naming the allowed values when `value` is not one of `choices`.

    >>> check_choice("mode", "mean", ("mean", "max"))
    """
    if value not in choices:
        raise ValueError(f"{argument} must be one of {', '.join(map(repr, choices))}, got {value!r}")
