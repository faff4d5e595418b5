"""Plain helpers shared by test modules: `from helpers import free_port, checkout_env` (pytest's default import mode
puts this folder on sys.path, as for `envs_for_pools`)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

import trl_agents

# The folder holding the trl_agents under test (this checkout's `src`), whatever the installed one is.
PACKAGE_PARENT = str(Path(trl_agents.__file__).resolve().parents[1])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (free when this returns; tests may run side by side)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def checkout_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) for a subprocess that must import the trl_agents under test: its
    package folder goes first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(path for path in (PACKAGE_PARENT, env.get("PYTHONPATH")) if path)
    return env
