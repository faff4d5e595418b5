"""Snapshots by replay, for environments that cannot copy their own state (Java/C processes, remote servers).

A snapshot is the task row plus the actions taken so far; restoring resets the environment with that task and
replays the actions. That is exact whenever the environment is deterministic given its task row (seeded), which
every built-in environment and adapter is. Restoring checks the replayed observation against the one recorded at
snapshot time, so a non-deterministic environment fails loudly instead of silently branching from the wrong state.

Replay costs one reset plus one step per recorded action, so it suits the slow third-party envs only because they
have nothing better; an environment that can copy itself should override `snapshot`/`restore` instead.

Example:
    >>> from trl_agents.envs import AgentEnv, replay_snapshots
    >>> @replay_snapshots
    ... class Counter(AgentEnv):
    ...     name = "counter-doc"
    ...     def reset(self, task):
    ...         self.n = task["start"]
    ...         return str(self.n)
    ...     def step(self, action_text):
    ...         self.n += 1
    ...         return str(self.n), 0.0, False, {"valid": True}
    >>> env = Counter()
    >>> env.reset({"start": 5}); env.step("+")[0]
    '5'
    '6'
    >>> snap = env.snapshot(); env.step("+")[0]
    '7'
    >>> env.restore(snap); env.step("+")[0]
    '7'
    >>> sorted(Counter.capabilities())
    ['restore', 'snapshot']
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypeVar

from .base import AgentEnv

E = TypeVar("E", bound=type[AgentEnv])


@dataclass(frozen=True)
class ReplaySnapshot:
    """What `replay_snapshots` records: the task row, the actions so far and the observation they led to."""

    task: dict[str, Any]
    actions: tuple[str, ...]
    observation: str


class ReplayMismatchError(RuntimeError):
    """Replaying a snapshot's actions did not reproduce its observation: the environment is not deterministic."""


def replay_snapshots(env_class: E) -> E:
    """Class decorator: give `env_class` `snapshot()`/`restore()` by recording its task and actions and replaying
    them. The environment must be deterministic given its task row. Returns a subclass with the same name.
    """
    if not (isinstance(env_class, type) and issubclass(env_class, AgentEnv)):
        raise TypeError(f"replay_snapshots expects an AgentEnv subclass, got {env_class!r}")

    class Replayed(env_class):  # type: ignore[misc,valid-type]
        def reset(self, task: dict[str, Any]) -> str:
            observation = super().reset(task)
            self._replay_task = copy.deepcopy(dict(task))
            self._replay_actions: list[str] = []
            self._replay_observation = observation
            return observation

        def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
            result = super().step(action_text)
            self._replay_actions.append(action_text)
            self._replay_observation = result[0]
            return result

        def snapshot(self) -> ReplaySnapshot:
            if not hasattr(self, "_replay_task"):
                raise RuntimeError(f"{env_class.__name__}.snapshot() called before reset()")
            return ReplaySnapshot(copy.deepcopy(self._replay_task), tuple(self._replay_actions), self._replay_observation)

        def restore(self, snapshot: ReplaySnapshot) -> None:
            if not isinstance(snapshot, ReplaySnapshot):
                raise TypeError(f"{env_class.__name__}.restore() expects a ReplaySnapshot, got {type(snapshot).__name__}")
            observation = Replayed.reset(self, snapshot.task)
            for action in snapshot.actions:
                observation = Replayed.step(self, action)[0]
            if observation != snapshot.observation:
                raise ReplayMismatchError(
                    f"{env_class.__name__}: replaying {len(snapshot.actions)} actions did not reproduce the "
                    "snapshot's observation; replay snapshots need an environment that is deterministic given its "
                    "task row (fix its seeding, or implement snapshot()/restore() directly)."
                )

    Replayed.__name__ = env_class.__name__
    Replayed.__qualname__ = env_class.__qualname__
    Replayed.__module__ = env_class.__module__
    Replayed.__doc__ = env_class.__doc__
    return Replayed  # type: ignore[return-value]
