"""Name -> environment class registry (`make_env("sokoban", size=6)`), instead of an if/elif chain.

Example:
    >>> from trl_agents.envs import AgentEnv, register_env, make_env
    >>> @register_env
    ... class Echo(AgentEnv):
    ...     name = "echo-doc"
    ...     def reset(self, task): return "say something"
    ...     def step(self, action_text): return action_text, 0.0, True, {"valid": True, "success": True}
    >>> make_env("echo-doc").reset({})
    'say something'
"""

from __future__ import annotations

from typing import Any

from ..names import did_you_mean
from .base import AgentEnv

_REGISTRY: dict[str, type[AgentEnv]] = {}


def register_env(cls: type[AgentEnv]) -> type[AgentEnv]:
    """Class decorator: register an `AgentEnv` subclass under its `name`."""
    if not (isinstance(cls, type) and issubclass(cls, AgentEnv)):
        raise TypeError(f"register_env expects an AgentEnv subclass, got {cls!r}")
    if not cls.name:
        raise ValueError(f"{cls.__name__} must set the class attribute `name` to be registered")
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls and existing.__qualname__ != cls.__qualname__:
        raise ValueError(f"an environment named {cls.name!r} is already registered ({existing.__qualname__})")
    _REGISTRY[cls.name] = cls
    return cls


def get_env_class(name: str) -> type[AgentEnv]:
    """The registered class for `name`, or a ValueError listing the known names and the closest match."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = sorted(_REGISTRY)
        hint = did_you_mean(name, known)
        raise ValueError(
            f"Unknown environment {name!r}.{hint} Known environments: {', '.join(known)}. "
            "Register your own with `@trl_agents.envs.register_env` on an AgentEnv subclass."
        ) from None


def make_env(name: str, **env_kwargs: Any) -> AgentEnv:
    """Instantiate the environment registered under `name` with its constructor keyword arguments."""
    cls = get_env_class(name)
    try:
        return cls(**env_kwargs)
    except TypeError as err:
        raise ValueError(f"Bad arguments for environment {name!r} ({cls.__name__}): {err}") from err


def list_envs() -> dict[str, type[AgentEnv]]:
    """All registered environments by name."""
    return dict(sorted(_REGISTRY.items()))
