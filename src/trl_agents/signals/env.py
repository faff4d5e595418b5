"""Built-in environment signals: facts only the environment knows, recorded where it lives during the rollout.

| name                  | timing        | value on the step                                        | capability           |
|-----------------------|---------------|----------------------------------------------------------|----------------------|
| `solver_value`        | transition    | `Transition(N(s_t), N(s_t+1))`, the exact cost-to-go     | `solver_value`       |
| `verifier_atoms`      | episode_end   | the atoms of `env.verify()` as dicts (last step only)    | `verify`             |
| `privileged_context`  | before_step   | `env.privileged_context()`: text only a teacher may see  | `privileged_context` |
| `admissible_actions`  | before_step   | `env.admissible_actions()` (None when it cannot list)    | none                 |
| `state_key`           | transition    | `Transition(key(s_t), key(s_t+1))` of `env.state_key()`   | `state_key`          |

Each function is module-level, so that it pickles to process and Ray workers, and returns JSON-able values (they
travel back from workers and are written to the trajectory records).

Example:
    >>> from trl_agents.envs import make_env
    >>> from trl_agents.signals.env import solver_value
    >>> env = make_env("frozenlake")
    >>> _ = env.reset({"seed": 0})
    >>> solver_value(env)
    6.0
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import EnvSignal, register_signal


def solver_value(env) -> float:
    """N(s): the number of actions an optimal solver still needs from the current state (inf: unsolvable)."""
    return float(env.solver_value())


def verifier_atoms(env) -> list[dict[str, Any]]:
    """The atoms of `env.verify()` (name, status, witness step, dependencies) as JSON-able dicts."""
    return [dataclasses.asdict(atom) if dataclasses.is_dataclass(atom) else dict(atom) for atom in env.verify()]


def privileged_context(env) -> str:
    """`env.privileged_context()`: hints, skills, the solution — text a teacher sees and the policy does not."""
    context = env.privileged_context()
    if not isinstance(context, str):
        raise TypeError(f"privileged_context() must return a str, got {type(context).__name__}")
    return context


def state_key(env):
    """`env.state_key()`: the canonical key of the current state; as a transition signal, the last step of an episode
    gets the key of the state its action reached (the engine records a step's own key only before the action)."""
    return env.state_key()


def admissible_actions(env) -> list[str] | None:
    """`env.admissible_actions()`: the actions valid in the current state, or None when the env cannot list them."""
    actions = env.admissible_actions()
    return None if actions is None else [str(a) for a in actions]


SOLVER_VALUE = EnvSignal(
    "solver_value", solver_value, "transition", "solver_value",
    "cost-to-go N(s_t), N(s_t+1) of every step (one solver call per step)",
)
VERIFIER_ATOMS = EnvSignal(
    "verifier_atoms", verifier_atoms, "episode_end", "verify",
    "env.verify() atoms (status, witness step, dependencies) at the episode's end",
)
PRIVILEGED_CONTEXT = EnvSignal(
    "privileged_context", privileged_context, "before_step", "privileged_context",
    "env.privileged_context() before every action (text only a teacher sees)",
)
ADMISSIBLE_ACTIONS = EnvSignal(
    "admissible_actions", admissible_actions, "before_step", None,
    "env.admissible_actions() before every action (None where the env cannot list them)",
)

STATE_KEY = EnvSignal(
    "state_key", state_key, "transition", "state_key",
    "env.state_key() before and after every step (the state an episode's last action reached)",
)

for _signal in (SOLVER_VALUE, VERIFIER_ATOMS, PRIVILEGED_CONTEXT, ADMISSIBLE_ACTIONS, STATE_KEY):
    register_signal(_signal.name, _signal)
