"""The turn loop: B tasks x G episodes, one batched generation call per turn for all active episodes.

Every episode of a group is reset with the same task row, so the G episodes start from identical states (checked:
a non-deterministic `reset` is an error, since group-relative credit would be meaningless). Each turn the engine
renders the prompt of every active episode, makes ONE `generator.generate` call, decodes the actions, steps the
environments and records a `Step`. Finished episodes stop generating. An environment that raises, hangs past its
timeout or whose worker dies fails its own episode (recorded with `Trajectory.error`, excluded from training, its
earlier steps kept) and the others go on.

Environment calls go through the `EnvPool` (`rollout/env_pool.py`): all resets of a rollout, and all steps of a
turn, form one phase that the pool runs in place, on threads, or in worker processes or Ray actors, with per-call
timeouts. Results are applied in episode order, so a rollout does not depend on which environment answered first.

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

from ..envs import INFO_SUCCESS, INFO_VALID, AgentEnv
from ..trajectory import Group, RolloutBatch, Step, Trajectory
from .env_pool import EnvCallError, EnvPool
from .generators import Generator, SamplingParams
from .prompts import PromptRenderer

logger = logging.getLogger(__name__)

ROW_FORMATS = ("step", "conversation")
RECORDABLE_SIGNALS = ("solver_value", "verify")


@dataclass(frozen=True)
class TurnProgress:
    """Where a rollout stands, as the engine's `on_turn` callback receives it.

    Args:
        turn: Turns played so far (0 right after the resets).
        max_turns: The turn budget.
        num_episodes: Episodes of the rollout (tasks × episodes per task) on this process.
        finished: Episodes that ended: done, out of turns, or failed.
        successes: Finished episodes that solved their task.
        failed: Finished episodes that failed for infrastructure reasons (`Trajectory.error`).
    """

    turn: int
    max_turns: int
    num_episodes: int
    finished: int
    successes: int
    failed: int


@dataclass
class _Episode:
    env: AgentEnv
    trajectory: Trajectory
    system: str = ""
    observation: str = ""
    history: list[tuple[str, str]] = field(default_factory=list)
    context_ids: list[int] = field(default_factory=list)  # conversation format: everything so far
    finished: bool = False
    solver_value: float | None = None  # cost-to-go of the current state, when recorded


class RolloutEngine:
    """Runs groups of episodes against environments with one batched generation call per turn.

    Args:
        generator: The policy (`Generator` protocol).
        renderer: Builds prompt token ids from environment text.
        max_turns: Turn budget of an episode (an episode still running then is truncated: not a success).
        sampling: Sampling parameters of every turn.
        row_format: `"step"` (each turn is a fresh prompt with a history window) or `"conversation"` (one growing
            chat per episode).
        env_pool: Where environments come from and how their calls run (default: `EnvPool()`, environments from
            `make_env(task["env"])` stepped one after the other on this thread; see `EnvPool` for concurrency,
            timeouts and the process/Ray backends).
        system_prompt: Overrides the environment's `instructions` as the system message when not None.
        record_snapshots: Store `env.snapshot()` before every action (for branching topologies).
        record_signals: Environment capabilities to record for credit methods that need them:
            `"solver_value"` puts the cost-to-go before and after every action in `step.info["solver_value"]` and
            `step.info["solver_value_next"]` (CAST; one solver call per step), `"verify"` puts the atoms of
            `env.verify()` at the episode's end in the last step's `info["verifier_atoms"]` (VICT).
        on_turn: Called with a `TurnProgress` once the environments are reset and after every turn (e.g.
            `RolloutProgress.update`, a live progress display).
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
        on_turn: Callable[[TurnProgress], None] | None = None,
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
                first = len(episodes)
                for index in range(num_generations):
                    env = self.env_pool.acquire(group.task)  # appended at once: released in `finally` whatever fails
                    episodes.append(_Episode(env=env, trajectory=Trajectory(task=dict(group.task), episode_id=index)))
                group.trajectories = [episode.trajectory for episode in episodes[first:]]
            self._start(episodes)
            for index, group in enumerate(groups):
                start = index * num_generations
                self._check_identical_starts(group.task, episodes[start : start + num_generations])
            self._report(0, episodes)
            for turn in range(self.max_turns):
                active = [episode for episode in episodes if not episode.finished]
                if not self._any_active(active):
                    break
                self._turn(active)
                self._report(turn + 1, episodes)
        finally:
            for episode in episodes:
                self.env_pool.release(episode.env)
        return RolloutBatch(groups=groups)

    def _report(self, turns_played: int, episodes: list[_Episode]) -> None:
        if self.on_turn is None:
            return
        finished = [episode.trajectory for episode in episodes if episode.finished]
        self.on_turn(
            TurnProgress(
                turn=turns_played,
                max_turns=self.max_turns,
                num_episodes=len(episodes),
                finished=len(finished),
                successes=sum(t.success for t in finished),
                failed=sum(t.failed for t in finished),
            )
        )

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

    def _start(self, episodes: list[_Episode]) -> None:
        """Reset every episode's environment (one `EnvPool.run` phase: concurrently where the pool says so)."""
        record_solver_value = "solver_value" in self.record_signals
        calls = [(episode.env, _reset_calls, (episode.trajectory.task, record_solver_value)) for episode in episodes]
        for episode, start in zip(episodes, self.env_pool.run(calls, "reset"), strict=True):
            if isinstance(start, BaseException) or start.error is not None:
                self._fail(episode, _failure("reset", start))
                continue
            episode.observation = start.observation
            episode.system = start.instructions if self.system_prompt is None else self.system_prompt
            episode.trajectory.task_text = start.task_text
            episode.solver_value = start.solver_value
            if self.row_format == "conversation":
                try:
                    episode.context_ids = self.renderer.conversation_prompt_ids(
                        episode.system, episode.trajectory.task_text, episode.observation
                    )
                except Exception as err:  # noqa: BLE001 — e.g. a first observation longer than the prompt budget
                    self._fail(episode, f"reset failed: {type(err).__name__}: {err}")

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
        return self.renderer.step_prompt_ids(
            episode.system, episode.trajectory.task_text, episode.history, episode.observation
        )

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
        flags = (self.record_snapshots, "solver_value" in self.record_signals, "verify" in self.record_signals)
        calls = [
            # An episode's last turn (done, or out of turns) also runs `verify()` where the env lives, in this phase.
            (episode.env, _step_calls, (text, *flags, len(episode.trajectory.steps) + 1 >= self.max_turns))
            for episode, text in zip(ready, texts, strict=True)
        ]
        outcomes = self.env_pool.run(calls, "step")
        for episode, prompt_ids, action_ids, logprobs, text, outcome in zip(
            ready, prompts, output.completion_ids, output.logprobs, texts, outcomes, strict=True
        ):
            self._apply_action(episode, prompt_ids, list(action_ids), list(logprobs), text, outcome)

    def _apply_action(self, episode: _Episode, prompt_ids, action_ids, logprobs, text: str, outcome) -> None:
        """Record the step whose environment calls (`_step_calls`) returned `outcome`."""
        step = Step(
            observation=episode.observation,
            action_text=text,
            prompt_ids=prompt_ids,
            action_ids=action_ids,
            action_logprobs=logprobs,
        )
        trajectory = episode.trajectory
        if not isinstance(outcome, BaseException):
            step.state_key, step.snapshot = outcome.state_key, outcome.snapshot
        if isinstance(outcome, BaseException) or outcome.error is not None:
            trajectory.steps.append(step)  # the failed step stays in the record
            self._fail(episode, _failure("step", outcome))
            return
        info = outcome.info
        if "solver_value" in self.record_signals:
            info["solver_value"], info["solver_value_next"] = episode.solver_value, outcome.solver_value_next
            episode.solver_value = outcome.solver_value_next
        step.reward, step.done, step.valid, step.info = outcome.reward, outcome.done, outcome.valid, info
        trajectory.steps.append(step)
        trajectory.success = outcome.success
        episode.history.append((episode.observation, outcome.history_action))
        episode.observation = outcome.observation
        if outcome.done or len(trajectory.steps) >= self.max_turns:
            self._finish(episode, outcome)
            return
        if self.row_format == "conversation":
            ended = bool(action_ids) and action_ids[-1] in self.eos_token_ids
            # A turn cut by the token budget did not emit EOS: close it so the chat stays well formed.
            step.env_ids = ([] if ended else [self.tokenizer.eos_token_id]) + self.renderer.env_turn_ids(
                outcome.observation
            )
            episode.context_ids = prompt_ids + action_ids + step.env_ids

    def _finish(self, episode: _Episode, last_turn: _EnvTurn | None = None) -> None:
        """End the episode; with `verify` recorded, put the atoms of `env.verify()` on its last step (computed by the
        last turn's environment calls, or here when the episode ends between turns: a prompt past its limit)."""
        episode.finished = True
        steps = episode.trajectory.steps
        if "verify" not in self.record_signals or not steps:
            return
        if last_turn is None:
            last_turn = _EnvTurn()
            _verify(episode.env, last_turn)
        if last_turn.verify_error is not None:
            self._fail(episode, f"verify failed: {last_turn.verify_error}")
            return
        steps[-1].info["verifier_atoms"] = last_turn.verifier_atoms

    def _fail(self, episode: _Episode, message: str) -> None:
        trajectory = episode.trajectory
        logger.warning("Episode %d of task %s failed: %s", trajectory.episode_id, trajectory.task, message)
        episode.trajectory.error = message
        episode.trajectory.success = False
        episode.finished = True


# ---- the environment calls of one reset / one turn, run where the environment lives (`EnvPool.run`) ----------------


@dataclass
class _EnvStart:
    observation: str = ""
    instructions: str = ""
    task_text: str = ""
    solver_value: float | None = None
    error: str | None = None  # "ValueError: ..." when an environment call raised


@dataclass
class _EnvTurn:
    state_key: Any = None
    snapshot: Any = None
    observation: str = ""
    reward: float = 0.0
    done: bool = False
    valid: bool = True
    success: bool = False
    history_action: str = ""  # the env's canonical action when it gives one (verl-agent stores the parsed action)
    info: dict[str, Any] = field(default_factory=dict)
    solver_value_next: float | None = None
    verifier_atoms: list[dict[str, Any]] | None = None  # `env.verify()` after the step, when asked
    verify_error: str | None = None
    error: str | None = None


def _reset_calls(env: AgentEnv, task: dict[str, Any], record_solver_value: bool) -> _EnvStart:
    start = _EnvStart()
    try:
        start.observation = env.reset(dict(task))
        start.instructions = env.instructions
        start.task_text = env.task_description()
        if record_solver_value:
            start.solver_value = float(env.solver_value())
    except Exception as err:  # noqa: BLE001 — an env failure fails its episode, never the run
        start.error = f"{type(err).__name__}: {err}"
    return start


def _step_calls(
    env: AgentEnv, action_text: str, record_snapshot: bool, record_solver_value: bool, verify: bool, last_turn: bool
) -> _EnvTurn:
    turn = _EnvTurn()
    try:
        if env.supports("state_key"):
            turn.state_key = env.state_key()
        if record_snapshot and env.supports("snapshot"):
            turn.snapshot = env.snapshot()
        observation, reward, done, info = env.step(action_text)
        info = dict(info or {})
        turn.observation, turn.reward, turn.done = observation, float(reward), bool(done)
        turn.valid, turn.success = bool(info.get(INFO_VALID, True)), bool(info.get(INFO_SUCCESS, False))
        turn.history_action = str(info.get("action") or action_text.strip())
        turn.info = _json_safe(info)  # also what lets the info travel back from a worker process
        if record_solver_value:
            turn.solver_value_next = float(env.solver_value())
    except Exception as err:  # noqa: BLE001
        turn.error = f"{type(err).__name__}: {err}"
        return turn
    if verify and (turn.done or last_turn):
        _verify(env, turn)
    return turn


def _verify(env: AgentEnv, turn: _EnvTurn) -> None:
    """`env.verify()` as JSON-able atoms on `turn` (or the error it raised)."""
    try:
        turn.verifier_atoms = [dataclasses.asdict(atom) for atom in env.verify()]
    except Exception as err:  # noqa: BLE001
        turn.verify_error = f"{type(err).__name__}: {err}"


def _failure(kind: str, outcome: Any) -> str:
    """The `Trajectory.error` of a failed reset or step: the pool's own message (timeout, dead worker) or what the
    environment raised."""
    if isinstance(outcome, EnvCallError):
        return str(outcome)
    if isinstance(outcome, BaseException):
        return f"{kind} failed: {type(outcome).__name__}: {outcome}"
    return f"{kind} failed: {outcome.error}"


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
