"""The turn loop: B tasks x G episodes, one batched generation call per turn for all active episodes.

Every episode of a group is reset with the same task row, so the G episodes start from identical states (checked:
a non-deterministic `reset` is an error, since group-relative credit would be meaningless). Each turn the engine
renders the prompt of every active episode, makes ONE `generator.generate` call, decodes the actions, steps the
environments and records a `Step`. Finished episodes stop generating. An environment that raises fails its own
episode (recorded with `Trajectory.error`, excluded from training) and the others go on.

Example:
    >>> from trl_agents.rollout import RolloutEngine, PromptRenderer, SamplingParams, TransformersGenerator
    >>> from trl_agents.testing import build_tiny_tokenizer, build_tiny_model
    >>> tokenizer = build_tiny_tokenizer()
    >>> engine = RolloutEngine(
    ...     TransformersGenerator(build_tiny_model(tokenizer), tokenizer), PromptRenderer(tokenizer),
    ...     max_turns=3, sampling=SamplingParams(max_new_tokens=4))
    >>> batch = engine.run([{"env": "frozenlake", "seed": 0}], num_generations=2)
    >>> len(batch.groups), len(batch.groups[0].trajectories)
    (1, 2)
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..envs import INFO_SUCCESS, INFO_VALID, AgentEnv, make_env
from ..trajectory import Group, RolloutBatch, Step, Trajectory
from .generators import Generator, SamplingParams
from .prompts import PromptRenderer

logger = logging.getLogger(__name__)

ROW_FORMATS = ("step", "conversation")
RECORDABLE_SIGNALS = ("solver_value", "verify")


@dataclass
class _Episode:
    env: AgentEnv
    trajectory: Trajectory
    system: str = ""
    task_text: str = ""
    observation: str = ""
    history: list[tuple[str, str]] = field(default_factory=list)
    context_ids: list[int] = field(default_factory=list)  # conversation format: everything so far
    finished: bool = False
    solver_value: float | None = None  # cost-to-go of the current state, when recorded


class EnvPool:
    """Reusable environment instances by name (constructing some environments is expensive; resetting is not)."""

    def __init__(self, env_kwargs: dict[str, Any] | None = None, default_env: str | None = None):
        self.env_kwargs = dict(env_kwargs or {})
        self.default_env = default_env
        self._free: dict[str, list[AgentEnv]] = {}

    def env_name(self, task: dict[str, Any]) -> str:
        name = task.get("env", self.default_env)
        if not name:
            raise ValueError(
                f"Task {task!r} does not name an environment: add an 'env' column to the dataset or set the "
                "config field `env_name`."
            )
        return name

    def acquire(self, task: dict[str, Any]) -> AgentEnv:
        name = self.env_name(task)
        free = self._free.get(name)
        return free.pop() if free else make_env(name, **self.env_kwargs)

    def release(self, env: AgentEnv) -> None:
        self._free.setdefault(env.name, []).append(env)

    def close(self) -> None:
        for envs in self._free.values():
            for env in envs:
                env.close()
        self._free.clear()


class RolloutEngine:
    """Runs groups of episodes against environments with one batched generation call per turn.

    Args:
        generator: The policy (`Generator` protocol).
        renderer: Builds prompt token ids from environment text.
        max_turns: Turn budget of an episode (an episode still running then is truncated: not a success).
        sampling: Sampling parameters of every turn.
        row_format: `"step"` (each turn is a fresh prompt with a history window) or `"conversation"` (one growing
            chat per episode).
        env_pool: Where environments come from (default: `make_env(task["env"])`).
        system_prompt: Overrides the environment's `instructions` as the system message when not None.
        record_snapshots: Store `env.snapshot()` before every action (for branching topologies).
        record_signals: Environment capabilities to record for credit methods that need them:
            `"solver_value"` puts the cost-to-go before and after every action in `step.info["solver_value"]` and
            `step.info["solver_value_next"]` (CAST; one solver call per step), `"verify"` puts the atoms of
            `env.verify()` at the episode's end in the last step's `info["verifier_atoms"]` (VICT).
        on_turn: Called after every turn with (turn index, number of active episodes); used for progress display.
    """

    def __init__(
        self,
        generator: Generator,
        renderer: PromptRenderer,
        max_turns: int = 10,
        sampling: SamplingParams | None = None,
        row_format: str = "step",
        env_pool: EnvPool | None = None,
        system_prompt: str | None = None,
        record_snapshots: bool = False,
        record_signals: Sequence[str] = (),
        on_turn: Callable[[int, int], None] | None = None,
    ):
        if row_format not in ROW_FORMATS:
            raise ValueError(f"row_format must be one of {ROW_FORMATS}, got {row_format!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.generator = generator
        self.renderer = renderer
        self.max_turns = max_turns
        self.sampling = sampling or SamplingParams()
        self.row_format = row_format
        self.env_pool = env_pool or EnvPool()
        self.system_prompt = system_prompt
        self.record_snapshots = record_snapshots
        unknown = set(record_signals) - set(RECORDABLE_SIGNALS)
        if unknown:
            raise ValueError(f"record_signals: unknown {sorted(unknown)}; choose from {RECORDABLE_SIGNALS}")
        self.record_signals = tuple(record_signals)
        self.on_turn = on_turn
        self.tokenizer = renderer.tokenizer
        self.eos_token_ids = set(getattr(generator, "eos_token_ids", [self.tokenizer.eos_token_id]))

    def run(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> RolloutBatch:
        """Run `num_generations` episodes of every task; return one Group per task, in task order."""
        groups = [Group(task=dict(task)) for task in tasks]
        episodes: list[_Episode] = []
        try:
            for group in groups:
                members = [self._start(group.task, index) for index in range(num_generations)]
                self._check_identical_starts(group.task, members)
                group.trajectories = [episode.trajectory for episode in members]
                episodes.extend(members)
            for turn in range(self.max_turns):
                active = [episode for episode in episodes if not episode.finished]
                if not self._any_active(active):
                    break
                self._turn(active)
                if self.on_turn is not None:
                    self.on_turn(turn, len(active))
        finally:
            for episode in episodes:
                self.env_pool.release(episode.env)
        return RolloutBatch(groups=groups)

    @property
    def _collective(self) -> bool:
        return bool(getattr(self.generator, "collective", False))

    def _any_active(self, active: list[_Episode]) -> bool:
        """Whether to play another turn. A collective generator (vLLM server mode under several processes) needs
        every process to call it the same number of times per turn, so the loop goes on, with empty prompt lists on
        the processes whose episodes have all finished, until no process has an active episode."""
        if self._collective:
            return bool(self.generator.any_active(bool(active)))
        return bool(active)

    # ---- one episode ---------------------------------------------------------------------------------------------

    def _start(self, task: dict[str, Any], episode_id: int) -> _Episode:
        env = self.env_pool.acquire(task)
        episode = _Episode(env=env, trajectory=Trajectory(task=dict(task), episode_id=episode_id))
        try:
            episode.observation = env.reset(dict(task))
            episode.system = env.instructions if self.system_prompt is None else self.system_prompt
            episode.task_text = env.task_description()
            if self.row_format == "conversation":
                episode.context_ids = self.renderer.conversation_prompt_ids(
                    episode.system, episode.task_text, episode.observation
                )
            if "solver_value" in self.record_signals:
                episode.solver_value = float(env.solver_value())
        except Exception as err:  # noqa: BLE001 — an env failure fails its episode, never the run
            self._fail(episode, f"reset failed: {type(err).__name__}: {err}")
        return episode

    @staticmethod
    def _check_identical_starts(task: dict[str, Any], members: list[_Episode]) -> None:
        starts = {episode.observation for episode in members if not episode.trajectory.failed}
        if len(starts) > 1:
            raise ValueError(
                f"Environment {members[0].env.name!r} gave different first observations for the same task {task!r}. "
                "Group-relative credit needs the G episodes of a task to start from the same state: make "
                "`reset(task)` deterministic given the task row (e.g. seed every random choice from task['seed'])."
            )

    def _prompt_ids(self, episode: _Episode) -> list[int]:
        if self.row_format == "conversation":
            return list(episode.context_ids)
        return self.renderer.step_prompt_ids(episode.system, episode.task_text, episode.history, episode.observation)

    def _turn(self, active: list[_Episode]) -> None:
        prompts, ready = [], []
        limit = self.renderer.max_prompt_length
        for episode in active:
            try:
                prompt_ids = self._prompt_ids(episode)
            except ValueError as err:  # a step prompt longer than max_prompt_length even without history
                self._fail(episode, str(err))
                continue
            if limit is not None and len(prompt_ids) > limit:  # a conversation outgrew its context: truncate it
                self._finish(episode)
                continue
            prompts.append(prompt_ids)
            ready.append(episode)
        if not ready and not self._collective:
            return
        output = self.generator.generate(prompts, self.sampling)
        # (Not batch_decode([]): transformers 5 decodes it as one empty sequence, [''].)
        texts = self.tokenizer.batch_decode(output.completion_ids, skip_special_tokens=True) if ready else []
        for episode, prompt_ids, action_ids, logprobs, text in zip(
            ready, prompts, output.completion_ids, output.logprobs, texts, strict=True
        ):
            self._apply_action(episode, prompt_ids, list(action_ids), list(logprobs), text)

    def _apply_action(self, episode: _Episode, prompt_ids, action_ids, logprobs, text: str) -> None:
        env = episode.env
        step = Step(
            observation=episode.observation,
            action_text=text,
            prompt_ids=prompt_ids,
            action_ids=action_ids,
            action_logprobs=logprobs,
        )
        try:
            if env.supports("state_key"):
                step.state_key = env.state_key()
            if self.record_snapshots and env.supports("snapshot"):
                step.snapshot = env.snapshot()
            observation, reward, done, info = env.step(text)
            info = dict(info or {})
            if "solver_value" in self.record_signals:
                value_next = float(env.solver_value())
                info["solver_value"], info["solver_value_next"] = episode.solver_value, value_next
                episode.solver_value = value_next
        except Exception as err:  # noqa: BLE001
            episode.trajectory.steps.append(step)
            self._fail(episode, f"step failed: {type(err).__name__}: {err}")
            return
        step.reward, step.done, step.valid = float(reward), bool(done), bool(info.get(INFO_VALID, True))
        step.info = _json_safe(info)
        trajectory = episode.trajectory
        trajectory.steps.append(step)
        trajectory.success = bool(info.get(INFO_SUCCESS, False))
        # History shows the env's canonical action when it has one (verl-agent stores the parsed action).
        episode.history.append((episode.observation, str(info.get("action") or text.strip())))
        episode.observation = observation
        if done or len(trajectory.steps) >= self.max_turns:
            self._finish(episode)
            return
        if self.row_format == "conversation":
            ended = bool(action_ids) and action_ids[-1] in self.eos_token_ids
            # A turn cut by the token budget did not emit EOS: close it so the chat stays well formed.
            step.env_ids = ([] if ended else [self.tokenizer.eos_token_id]) + self.renderer.env_turn_ids(observation)
            episode.context_ids = prompt_ids + action_ids + step.env_ids

    def _finish(self, episode: _Episode) -> None:
        episode.finished = True
        steps = episode.trajectory.steps
        if "verify" in self.record_signals and steps:
            try:
                atoms = episode.env.verify()
            except Exception as err:  # noqa: BLE001
                self._fail(episode, f"verify failed: {type(err).__name__}: {err}")
                return
            steps[-1].info["verifier_atoms"] = [dataclasses.asdict(atom) for atom in atoms]

    def _fail(self, episode: _Episode, message: str) -> None:
        logger.warning("Episode %d of task %s failed: %s", episode.trajectory.episode_id, episode.trajectory.task, message)
        episode.trajectory.error = message
        episode.trajectory.success = False
        episode.finished = True


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    """Keep what JSON can store (info is written to trajectory datasets); stringify the rest."""
    safe = {}
    for key, value in info.items():
        try:
            json.dumps(value)
            safe[key] = value
        except (TypeError, ValueError):
            safe[key] = repr(value)
    return safe
