"""Where environments keep generated files (compiled TextWorld games, ALFWorld-style problems, indexes).

Everything an environment writes goes under `cache_dir(name)`: `$TRL_AGENTS_CACHE/<name>` when that variable is
set, else `~/.cache/trl_agents/<name>`. Tests point `HOME` at a temporary directory, so nothing leaks out of them.

Example:
    >>> import os, tempfile
    >>> os.environ["TRL_AGENTS_CACHE"] = tempfile.mkdtemp()
    >>> cache_dir("textworld").name
    'textworld'
    >>> del os.environ["TRL_AGENTS_CACHE"]
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The (created) cache folder for `parts`, e.g. `cache_dir("textworld", "games")`."""
    root = os.environ.get("TRL_AGENTS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_agents")
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
