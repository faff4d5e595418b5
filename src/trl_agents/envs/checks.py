"""`check_env`: the contract checks every environment passes, for ours and for the ones users write.

It plays a task a few times and fails with a message naming the broken property:

- **step outputs**: every `step` returns `(observation: str, reward: finite number, done: bool, info: dict)`
  (`step_violation`; the rollout fails an episode whose environment breaks this, naming env, task, episode and step);
- **determinism**: two fresh instances given the same task row produce the same observations, rewards and `done`
  flags for the same actions (group-relative credit compares episodes that must start identical);
- **bad action**: an action the environment cannot parse is reported with `info["valid"] = False`, a non-empty
  observation, and (when the env has state keys) an unchanged state — never an exception;
- **info keys**: every step's `info` carries a bool `valid`, and the last one a bool `success`;
- **snapshot → restore → same future** (envs with `snapshot`): after restoring, the same actions give the same
  outcomes as the first time;
- **expert episode** (when an expert plan is known, from `optimal_plan()` or passed in): it ends in success.

Example:
    >>> from trl_agents.envs import make_env
    >>> from trl_agents.envs.checks import check_env
    >>> report = check_env(lambda: make_env("frozenlake"), {"seed": 3})
    >>> sorted(report)
    ['bad_action', 'determinism', 'expert_episode', 'info_keys', 'snapshot_restore', 'step_outputs']
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv

Outcome = tuple[str, float, bool]


class EnvContractError(AssertionError):
    """An environment broke the AgentEnv contract; the message names the property and the step."""


def step_violation(observation: Any, reward: Any, done: Any, info: Any) -> str | None:
    """What is wrong with the outputs of one `env.step`, or None: the observation must be a string, the reward a
    finite number (a string such as "1.0" is not coerced), `done` a bool, `info` a dict.

    >>> step_violation("ok", 1.0, False, {}) is None
    True
    >>> step_violation("ok", float("nan"), False, {})
    'reward is nan (it must be a finite number)'
    >>> step_violation(None, "1.0", 0, [])
    'observation is None (it must be a str)'
    """
    if not isinstance(observation, str):
        return f"observation is {_shown(observation)} (it must be a str)"
    if isinstance(reward, str) or not isinstance(reward, numbers.Real):
        return f"reward is {_shown(reward)} (it must be a finite number)"
    if not math.isfinite(float(reward)):
        return f"reward is {reward!r} (it must be a finite number)"
    if not (isinstance(done, bool) or type(done).__name__ == "bool_"):  # numpy's bool too
        return f"done is {_shown(done)} (it must be a bool)"
    if not isinstance(info, Mapping):
        return f"info is {_shown(info)} (it must be a dict)"
    return None


def _shown(value: Any) -> str:
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _checked_step(env: AgentEnv, action: str, step: int):
    outputs = env.step(action)
    if not isinstance(outputs, tuple) or len(outputs) != 4:
        raise EnvContractError(f"step_outputs: step {step} ({action!r}) returned {_shown(outputs)}, not a 4-tuple "
                               "(observation, reward, done, info)")
    problem = step_violation(*outputs)
    if problem is not None:
        raise EnvContractError(f"step_outputs: step {step} ({action!r}): {problem}")
    return outputs


def _play(env: AgentEnv, actions: Sequence[str]) -> list[Outcome]:
    outcomes = []
    for t, action in enumerate(actions):
        observation, reward, done, info = _checked_step(env, action, t)
        outcomes.append((observation, float(reward), bool(done)))
        if done:
            break
    return outcomes


def _default_actions(env: AgentEnv, task: dict[str, Any], max_steps: int) -> list[str]:
    """An action sequence to exercise the env with: its optimal plan, else the first admissible action each turn."""
    env.reset(copy.deepcopy(task))
    if env.supports("optimal_plan"):
        plan = env.optimal_plan()
        if plan:
            return list(plan)[:max_steps]
    actions: list[str] = []
    for _ in range(max_steps):
        admissible = env.admissible_actions()
        if not admissible:
            break
        actions.append(admissible[0])
        if env.step(admissible[0])[2]:
            break
    return actions


def check_env(
    env_factory: Callable[[], AgentEnv],
    task: dict[str, Any],
    *,
    actions: Sequence[str] | None = None,
    expert_actions: Sequence[str] | None = None,
    bad_action: str = "this is definitely not an action ~~~",
    max_steps: int = 50,
) -> dict[str, str]:
    """Run the contract checks on `task`; return `{check name: what was verified}`; raise `EnvContractError`.

    Args:
        env_factory: Builds a fresh environment (called a few times; closed after use).
        task: The task row to play.
        actions: Actions for the determinism and snapshot checks. Default: `expert_actions`, else the env's optimal
            plan, else the first admissible action at every turn.
        expert_actions: A plan that must end in success. Default: the env's `optimal_plan()` when it has one; pass
            `()` to skip the check (e.g. stochastic transitions).
        bad_action: Text the environment must reject as invalid.
        max_steps: Cap on the number of actions played per check.
    """
    envs: list[AgentEnv] = []

    def fresh() -> AgentEnv:
        env = env_factory()
        envs.append(env)
        return env

    report: dict[str, str] = {}
    try:
        if expert_actions is None:
            probe = fresh()
            if probe.supports("optimal_plan"):
                probe.reset(copy.deepcopy(task))
                plan = probe.optimal_plan()
                expert_actions = list(plan) if plan else None
        if actions is None:
            actions = list(expert_actions) if expert_actions else _default_actions(fresh(), task, max_steps)
        actions = list(actions)[:max_steps]

        # step outputs (before determinism: a NaN reward is never equal to itself)
        env = fresh()
        observation = env.reset(copy.deepcopy(task))
        if not isinstance(observation, str):
            raise EnvContractError(f"step_outputs: reset returned {_shown(observation)} as the observation (a str)")
        report["step_outputs"] = f"{len(_play(env, actions))} steps return (str, finite number, bool, dict)"

        # determinism
        first, second = fresh(), fresh()
        obs_a, obs_b = first.reset(copy.deepcopy(task)), second.reset(copy.deepcopy(task))
        if obs_a != obs_b:
            raise EnvContractError(f"determinism: two resets of the same task differ:\n{obs_a!r}\n!=\n{obs_b!r}")
        play_a, play_b = _play(first, actions), _play(second, actions)
        for t, (a, b) in enumerate(zip(play_a, play_b)):
            if a != b:
                raise EnvContractError(f"determinism: step {t} ({actions[t]!r}) differs between two instances: {a} != {b}")
        report["determinism"] = f"reset + {len(play_a)} steps identical across two instances"

        # bad action
        env = fresh()
        env.reset(copy.deepcopy(task))
        key_before = env.state_key() if env.supports("state_key") else None
        try:
            observation, _reward, _done, info = env.step(bad_action)
        except Exception as err:
            raise EnvContractError(f"bad action: step({bad_action!r}) raised {type(err).__name__}: {err}") from err
        if info.get(INFO_VALID, True) is not False:
            raise EnvContractError(f"bad action: step({bad_action!r}) did not set info['valid'] = False (info={info})")
        if not isinstance(observation, str) or not observation.strip():
            raise EnvContractError("bad action: the observation after an invalid action must say what went wrong")
        if key_before is not None and env.state_key() != key_before:
            raise EnvContractError("bad action: an invalid action changed the state key")
        report["bad_action"] = "rejected with valid=False and a feedback observation"

        # info keys
        env = fresh()
        env.reset(copy.deepcopy(task))
        last_info: dict[str, Any] = {}
        done = False
        for t, action in enumerate(actions):
            _obs, reward, done, last_info = env.step(action)
            if not isinstance(last_info.get(INFO_VALID, True), bool):
                raise EnvContractError(f"info keys: info['valid'] at step {t} is not a bool: {last_info!r}")
            if not isinstance(reward, (int, float)):
                raise EnvContractError(f"info keys: reward at step {t} is {type(reward).__name__}, not a number")
            if done:
                break
        if done and not isinstance(last_info.get(INFO_SUCCESS), bool):
            raise EnvContractError(f"info keys: the last step's info has no bool 'success': {last_info!r}")
        report["info_keys"] = "valid on every step" + (", success at the end" if done else "")

        # snapshot -> restore -> same future
        if env.supports("snapshot") and len(play_a) >= 2:
            env = fresh()
            env.reset(copy.deepcopy(task))
            split = len(play_a) // 2  # the episode is still running after `split` actions
            _play(env, actions[:split])
            snapshot = env.snapshot()
            future = _play(env, actions[split:])
            env.restore(snapshot)
            again = _play(env, actions[split:])
            if future != again:
                raise EnvContractError(f"snapshot_restore: the future after restore differs:\n{future}\n!=\n{again}")
            report["snapshot_restore"] = f"{len(future)} steps after restoring at step {split} identical"

        # expert episode
        if expert_actions:
            env = fresh()
            env.reset(copy.deepcopy(task))
            info = {}
            done = False
            for action in expert_actions:
                _obs, _reward, done, info = env.step(action)
                if done:
                    break
            if not (done and info.get(INFO_SUCCESS)):
                raise EnvContractError(f"expert_episode: the expert plan {list(expert_actions)} did not succeed")
            report["expert_episode"] = f"expert plan of {len(expert_actions)} actions succeeds"
    finally:
        for env in envs:
            env.close()
    return report
