"""Environments: the `AgentEnv` contract, the registry, and the built-in environments (one file each)."""

from .base import INFO_ROLE, INFO_ROLE_REWARDS, INFO_SUCCESS, INFO_VALID, AgentEnv, VerifierAtom
from .cache import cache_dir
from .registry import get_env_class, list_envs, make_env, register_env
from .replay import ReplaySnapshot, replay_snapshots

# Built-in environments register themselves on import.
from . import (  # noqa: F401  isort: skip
    alfworld, corridor, dealnodeal, frozenlake, minesweeper, rushhour, scienceworld, searchqa, sokoban, textcraft, textworld,
    webshop,
)
from . import telesales  # noqa: F401  isort: skip  (two-role vehicle telesales dialogue, IB-RL's setting)
from . import prediction  # noqa: F401  isort: skip  (the `predict` wrapper: any env + next-observation predictions)
from . import parallel  # noqa: F401  isort: skip  (the `parallel` wrapper: K copies of any env, one answer)
from . import tool_sandbox  # noqa: F401  isort: skip  (shell-tasks and code-tasks: the model's commands in a sandbox)
from . import adapters  # noqa: F401  isort: skip

__all__ = [
    "INFO_ROLE",
    "INFO_ROLE_REWARDS",
    "INFO_SUCCESS",
    "INFO_VALID",
    "AgentEnv",
    "VerifierAtom",
    "cache_dir",
    "get_env_class",
    "list_envs",
    "make_env",
    "register_env",
    "replay_snapshots",
    "ReplaySnapshot",
]
