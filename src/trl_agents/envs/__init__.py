"""Environments: the `AgentEnv` contract, the registry, and the built-in environments (one file each)."""

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv, VerifierAtom
from .registry import get_env_class, list_envs, make_env, register_env

# Built-in environments register themselves on import.
from . import frozenlake, sokoban  # noqa: F401  isort: skip

__all__ = [
    "INFO_SUCCESS",
    "INFO_VALID",
    "AgentEnv",
    "VerifierAtom",
    "get_env_class",
    "list_envs",
    "make_env",
    "register_env",
]
