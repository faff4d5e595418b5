"""The state of one episode in a rollout, and the environment calls run where its environment lives.

`RolloutEngine` (lockstep) and `EpisodeScheduler` (per-episode scheduling) share these: an `Episode` is what the
rollout knows of one episode between calls, a `Turn` one prepared turn, and `reset_calls` / `restore_calls` /
`step_calls` / `end_calls` are the module-level functions (they pickle, for `process` and `ray` workers) that an
`EnvPool` runs in the environment's own thread, process or actor: the environment's method and the signals timed with
it, each failure caught and returned as an outcome, never raised.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..envs import INFO_SUCCESS, INFO_VALID, AgentEnv
from ..envs.checks import step_violation
from ..signals import EnvSignal, SignalError
from ..trajectory import PromptParts, Trajectory
from .env_pool import EnvCallError
from .prompts import tool_texts


@dataclass
class Episode:
    """What a rollout knows of one episode between its environment calls (owned by one thread: the engine's, or
    the scheduler's event loop)."""

    env: AgentEnv
    trajectory: Trajectory
    task_index: int
    system: str = ""
    tools: tuple[str, ...] = ()  # the environment's tool schemas as JSON text (`AgentEnv.tools`)
    observation: str = ""
    first_observation: str = ""  # what reset returned (checked equal across the episodes of a task)
    history: list[tuple[str, str]] = field(default_factory=list)
    context_ids: list[int] = field(default_factory=list)  # conversation format: everything so far
    finished: bool = False
    state_values: dict[str, Any] = field(default_factory=dict)  # "transition" signals of the current state
    role: str = ""  # the role acting next (two-role environments)
    action_prefix: list[int] = field(default_factory=list)  # token-level fork: the next action starts with these
    prefix_logprobs: list[float] = field(default_factory=list)
    held: bool = False  # paused by the topology (`Hold`): skips turns until resumed
    forced_actions: tuple[str, ...] | None = None  # `Launch(forced_actions=...)`: given actions, no sampling
    hint: str | None = None  # `Launch(hint=...)`: appended to the system message of the sampling prompt only
    busy: str = ""  # per-episode scheduling: what the episode waits for ("env", "generation", "turn"); "" = nothing
    stop_requested: bool = False  # per-episode scheduling: a `Stop` arrived while a call of the episode ran

    @property
    def supervision(self) -> str | None:
        return "forced" if self.forced_actions is not None else "hinted" if self.hint is not None else None


@dataclass
class Turn:
    """One episode's next turn, prepared (`RolloutEngine._prepare`): the prompt recorded and the one sampled from."""

    episode: Episode
    prompt_ids: list[int]  # recorded (and trained on)
    parts: PromptParts
    sampling_ids: list[int]  # what the generator continues: the hinted prompt when hinted, then the action prefix
    forced: str | None = None  # the action of a forced turn
    ended: bool = False  # no turn: the episode ends here (context outgrown, forced actions used up)


@dataclass(frozen=True)
class SignalPlan:
    """The environment signals to compute in an environment call, by timing (module-level data: it pickles)."""

    transition: tuple[EnvSignal, ...] = ()
    before_step: tuple[EnvSignal, ...] = ()
    episode_end: tuple[EnvSignal, ...] = ()
    snapshot: bool = False
    role: bool = False


# ---- the environment calls of one reset / restore / turn, run where the environment lives (`EnvPool.run`) ----------


@dataclass
class EnvStart:
    observation: str = ""
    instructions: str = ""
    tools: tuple[str, ...] = ()
    task_text: str = ""
    state_values: dict[str, Any] = field(default_factory=dict)
    role: str = ""
    error: str | None = None  # "ValueError: ..." when an environment call raised


@dataclass
class EnvTurn:
    state_key: Any = None
    snapshot: Any = None
    observation: str = ""
    reward: float = 0.0
    done: bool = False
    valid: bool = True
    success: bool = False
    history_action: str = ""  # the env's canonical action when it gives one (verl-agent stores the parsed action)
    info: dict[str, Any] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)  # "before_step" signals
    after: dict[str, Any] = field(default_factory=dict)  # "transition" signals of the state after the step
    end: dict[str, Any] | None = None  # "episode_end" signals, after the episode's last step
    role: str = ""
    signal_error: str | None = None  # a signal that failed after the step (fails the episode, keeps the step)
    error: str | None = None


def evaluate_signals(env: AgentEnv, signals: Sequence[EnvSignal]) -> dict[str, Any]:
    """`{name: signal.fn(env)}`; a failing signal raises a SignalError naming it."""
    values = {}
    for signal in signals:
        try:
            values[signal.name] = signal.fn(env)
        except Exception as err:
            raise SignalError(f"signal {signal.name!r} failed: {type(err).__name__}: {err}") from err
    return values


def reset_calls(env: AgentEnv, task: dict[str, Any], plan: SignalPlan) -> EnvStart:
    start = EnvStart()
    try:
        start.observation = env.reset(dict(task))
        start.instructions = env.instructions
        start.tools = tool_texts(getattr(env, "tools", ()))
        start.task_text = env.task_description()
        start.state_values = evaluate_signals(env, plan.transition)
        if plan.role:
            start.role = env.current_role()
    except SignalError as err:
        start.error = str(err)
    except Exception as err:  # noqa: BLE001 — an env failure fails its episode, never the run
        start.error = f"{type(err).__name__}: {err}"
    return start


def restore_calls(env: AgentEnv, snapshot: Any, plan: SignalPlan) -> EnvStart:
    start = EnvStart()
    try:
        env.restore(snapshot)
        if plan.role:
            start.role = env.current_role()
    except Exception as err:  # noqa: BLE001
        start.error = f"{type(err).__name__}: {err}"
    return start


def step_calls(env: AgentEnv, action_text: str, plan: SignalPlan, last_turn: bool) -> EnvTurn:
    turn = EnvTurn()
    try:
        if env.supports("state_key"):
            turn.state_key = env.state_key()
        if plan.snapshot and env.supports("snapshot"):
            turn.snapshot = env.snapshot()
        turn.before = evaluate_signals(env, plan.before_step)
        outputs = env.step(action_text)
        problem = (step_violation(*outputs) if isinstance(outputs, tuple) and len(outputs) == 4
                   else f"step returned {type(outputs).__name__}, not (observation, reward, done, info)")
        if problem is not None:
            turn.error = f"{CONTRACT}{problem}"
            return turn
        observation, reward, done, info = outputs
        info = dict(info)
        turn.observation, turn.reward, turn.done = observation, float(reward), bool(done)
        turn.valid, turn.success = bool(info.get(INFO_VALID, True)), bool(info.get(INFO_SUCCESS, False))
        turn.history_action = str(info.get("action") or action_text.strip())
        turn.info = json_safe(info)  # also what lets the info travel back from a worker process
    except SignalError as err:
        turn.error = str(err)
        return turn
    except Exception as err:  # noqa: BLE001
        turn.error = f"{type(err).__name__}: {err}"
        return turn
    try:  # after the step: a failing signal fails the episode but the step is recorded whole
        turn.after = evaluate_signals(env, plan.transition)
        if plan.role:
            turn.role = env.current_role()
        if turn.done or last_turn:
            turn.end = evaluate_signals(env, plan.episode_end)
    except SignalError as err:
        turn.signal_error = str(err)
    except Exception as err:  # noqa: BLE001
        turn.signal_error = f"{type(err).__name__}: {err}"
    return turn


def end_calls(env: AgentEnv, plan: SignalPlan) -> tuple[dict[str, Any], str | None]:
    try:
        return evaluate_signals(env, plan.episode_end), None
    except SignalError as err:
        return {}, str(err)


CONTRACT = "env contract: "  # the start of `EnvTurn.error` when a step's outputs break the AgentEnv contract


def failure(kind: str, outcome: Any) -> str:
    """The `Trajectory.error` of a failed reset, restore or step: the pool's own message (timeout, dead worker) or
    what the environment raised."""
    if isinstance(outcome, EnvCallError):
        return str(outcome)
    if isinstance(outcome, BaseException):
        return f"{kind} failed: {type(outcome).__name__}: {outcome}"
    if outcome.error.startswith("signal "):
        return outcome.error
    return f"{kind} failed: {outcome.error}"


def json_safe(info: dict[str, Any]) -> dict[str, Any]:
    """Keep what JSON can store (info is written to trajectory datasets); stringify the rest."""
    safe = {}
    for key, value in info.items():
        try:
            json.dumps(value)
            safe[key] = value
        except (TypeError, ValueError):
            safe[key] = repr(value)
    return safe
