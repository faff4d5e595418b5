"""Registries' shared wording: the closest known name, for the one-line error of a name that is not registered.

Example:
    >>> did_you_mean("gigpp", ["gigpo", "grpo", "rloo"])
    " Did you mean 'gigpo'?"
    >>> did_you_mean("xyz", ["gigpo"])
    ''
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`" Did you mean 'x'?"` for the known name closest to `name`, or "" when none is close."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
