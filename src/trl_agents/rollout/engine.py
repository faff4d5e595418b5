"""The turn loop: episodes chosen by a topology, one batched generation call per turn for all active episodes.

A `Topology` (`rollout/topologies/`) decides which episodes run: by default G independent episodes per task; an
adaptive group that grows in rounds; forks from environment snapshots of recorded steps. The engine carries its
requests out and plays every active episode turn by turn: it renders each prompt, makes ONE `generator.generate`
call for all of them (every task, every branch), decodes the actions, steps the environments and records a `Step`.
Finished episodes stop generating. A `Launch` may ask for supervised episodes: `forced_actions` are taken instead of
sampled (recorded with NaN sampling log-probs), a `hint` is added to the system message of the prompt sampled from
but not of the prompt recorded; their steps are marked `step.info["supervision"]`.

Episodes launched for a task are reset with the same task row, so they start from identical states (checked: a
non-deterministic `reset` is an error, since group-relative credit would be meaningless). An environment that
raises, hangs past its timeout or whose worker dies fails its own episode (recorded with `Trajectory.error`,
excluded from training, its earlier steps kept) and the others go on.

Environment calls go through the `EnvPool` (`rollout/env_pool.py`): the resets (or snapshot restores) of a batch
of new episodes, and the steps of a turn, each form one phase that the pool runs in place, on threads, or in worker
processes or Ray actors, with per-call timeouts. Results are applied in episode order, so a rollout does not depend
on which environment answered first. The environment signals a trainer asks for (`trl_agents.signals`) are
computed in the same calls, where the environment lives, at their timing; a signal that fails fails its episode.

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

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..envs import INFO_SUCCESS, INFO_VALID, AgentEnv
from ..envs.checks import step_violation
from ..signals import EnvSignal, SignalError, Transition, get_signal
from ..trajectory import Group, PromptParts, RolloutBatch, Step, Trajectory, task_id
from .env_pool import EnvCallError, EnvPool
from .generators import Generator, SamplingParams
from .prompts import PromptRenderer, PromptTooLongError, tool_texts
from .topologies import Fork, IndependentTopology, Launch, RolloutView, Topology
from .topologies.base import SUPERVISION, Hold, Stop

logger = logging.getLogger(__name__)

ROW_FORMATS = ("step", "conversation")
_TOO_LONG_WARNED: set[int | None] = set()  # the prompt bounds whose failed episodes were explained (once each)


@dataclass(frozen=True)
class TurnProgress:
    """Where a rollout stands, as the engine's `on_turn` callback receives it.

    Args:
        turn: Turns played so far (0 right after the resets).
        max_turns: The turn budget.
        num_episodes: Episodes of the rollout (tasks × episodes per task) on this process, so far.
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

    @property
    def supervision(self) -> str | None:
        return "forced" if self.forced_actions is not None else "hinted" if self.hint is not None else None


@dataclass(frozen=True)
class _SignalPlan:
    """The environment signals to compute in an environment call, by timing (module-level data: it pickles)."""

    transition: tuple[EnvSignal, ...] = ()
    before_step: tuple[EnvSignal, ...] = ()
    episode_end: tuple[EnvSignal, ...] = ()
    snapshot: bool = False
    role: bool = False


class RolloutEngine:
    """Runs the episodes a topology asks for against environments, one batched generation call per turn.

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
        record_snapshots: Store `env.snapshot()` before every action (also on when the topology needs them).
        signals: Environment signals to record (`EnvSignal`s or their registered names; see `trl_agents.signals`);
            values land in `step.signals[name]`.
        topology: Which episodes run (default `IndependentTopology()`: `num_generations` per task).
        signal_fn: `signal_fn(name, trajectories)` computes a model signal on recorded steps; topologies that need
            one mid-rollout (e.g. to rank branch points) call it through their `RolloutView`.
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
        signals: Sequence[str | EnvSignal] = (),
        topology: Topology | None = None,
        signal_fn: Callable[[str, list[Trajectory]], None] | None = None,
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
        self.signals = tuple(self._env_signal(signal) for signal in signals)
        self.topology = topology or IndependentTopology()
        self.signal_fn = signal_fn
        self.on_turn = on_turn
        self.tokenizer = renderer.tokenizer
        self.eos_token_ids = set(getattr(generator, "eos_token_ids", [self.tokenizer.eos_token_id]))

    @staticmethod
    def _env_signal(signal: str | EnvSignal) -> EnvSignal:
        if isinstance(signal, EnvSignal):
            return signal
        resolved = get_signal(signal)
        if not isinstance(resolved, EnvSignal):
            raise ValueError(
                f"signals: {signal!r} is a model signal, computed by the trainer after the rollout; the engine records "
                "environment signals only (see trl_agents.signals)."
            )
        return resolved

    @property
    def _plan(self) -> _SignalPlan:
        def timed(timing):
            return tuple(s for s in self.signals if s.timing == timing)

        return _SignalPlan(
            transition=timed("transition"),
            before_step=timed("before_step"),
            episode_end=timed("episode_end"),
            snapshot=self.record_snapshots or self.topology.needs_snapshots,
            role=bool(getattr(self.generator, "routes_by_role", False)),
        )

    def run(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> RolloutBatch:
        """Run the topology's episodes for `tasks` (`num_generations` per task with the default topology); return
        one Group per task, in task order, its trajectories in creation order (`episode_id`)."""
        tasks = [dict(task) for task in tasks]
        groups = [Group(task=dict(task)) for task in tasks]
        episodes: list[_Episode] = []
        by_trajectory: dict[int, _Episode] = {}
        stats = {"generated_tokens": 0.0, "env_steps": 0.0, "generation_calls": 0.0}
        view = RolloutView(tasks, groups, lambda t: not by_trajectory[id(t)].finished, self.signal_fn,
                           self.max_turns, is_held=lambda t: by_trajectory[id(t)].held)
        plan = self._plan
        try:
            self._serve(self.topology.begin(tasks, num_generations), groups, episodes, by_trajectory, plan)
            self._report(0, episodes)
            while True:
                active = [episode for episode in episodes if not episode.finished and not episode.held]
                if not self._any_active(active):
                    # Nothing left to play (on any process, with a collective generator: so every process asks its
                    # topology at the same moment, and a model signal it runs does not interleave with another
                    # process's generation call).
                    self._serve(self.topology.when_idle(view), groups, episodes, by_trajectory, plan)
                    active = [episode for episode in episodes if not episode.finished and not episode.held]
                    if not self._any_active(active):
                        break
                self._turn(active, plan, stats)
                view.turn += 1
                self._serve(self.topology.after_turn(view), groups, episodes, by_trajectory, plan)
                self._report(view.turn, episodes)
            held = [episode for episode in episodes if not episode.finished]  # still held: they end with the rollout
            if held:
                self._end_between_turns(held, plan)
        finally:
            for episode in episodes:
                self.env_pool.release(episode.env)
        stats["episodes"] = float(len(episodes))
        stats.update({f"topology/{k}": float(v) for k, v in self.topology.stats(view).items()})
        return RolloutBatch(groups=groups, stats=stats)

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
        the processes whose episodes have all finished, until no process has an active episode; only then do the
        topologies of all processes get asked for more (`when_idle`), together."""
        if self._collective:
            return bool(self.generator.any_active(bool(active)))
        return bool(active)

    # ---- new episodes: launches (reset) and forks (restore) -------------------------------------------------------

    def _serve(self, requests, groups, episodes, by_trajectory, plan: _SignalPlan) -> None:
        """Carry out the topology's requests: end the stopped episodes (their episode-end signals in one pool phase),
        then create the new ones: one pool phase resets the launched ones, one restores the forked ones."""
        launched, forked, stopped = [], [], []
        for request in requests:
            if isinstance(request, Hold):  # pause / resume an active episode
                episode = by_trajectory[id(groups[request.task_index].trajectory(request.episode_id))]
                episode.held = bool(request.held) and not episode.finished
                continue
            if isinstance(request, Stop):  # end an active episode between turns (a pruned tree path)
                episode = by_trajectory[id(groups[request.task_index].trajectory(request.episode_id))]
                if not episode.finished and all(episode is not other for other in stopped):
                    stopped.append(episode)
                continue
            if request.count < 0:
                raise ValueError(f"topology {self.topology.name!r} asked for {request.count} episodes")
            group = groups[request.task_index]
            for _ in range(request.count):
                env = self.env_pool.acquire(group.task)  # appended at once: released in `finally` whatever fails
                trajectory = Trajectory(task=dict(group.task), episode_id=len(group.trajectories))
                episode = _Episode(env=env, trajectory=trajectory, task_index=request.task_index)
                group.trajectories.append(trajectory)
                episodes.append(episode)
                by_trajectory[id(trajectory)] = episode
                if isinstance(request, Launch):
                    if request.hint is not None and self.row_format != "step":
                        raise ValueError("Launch(hint=...) needs row_format='step': a conversation row trains on the "
                                         "prompt it sampled from, so a sampling-only hint cannot be left out of it")
                    episode.forced_actions = None if request.forced_actions is None else tuple(request.forced_actions)
                    episode.hint = request.hint
                    launched.append(episode)
                else:  # (marked as a fork at once: a Launch of the same task in this batch checks root starts)
                    parent = by_trajectory[id(group.trajectory(request.episode_id))]
                    trajectory.parent_id, trajectory.fork_step = request.episode_id, request.step
                    forked.append((episode, parent, request))
        if stopped:
            self._end_between_turns(stopped, plan)
        if launched:
            self._start(launched, plan)
            for index in sorted({episode.task_index for episode in launched}):
                self._check_identical_starts(groups[index], by_trajectory)
        if forked:
            self._fork(forked, plan)

    def _start(self, episodes: list[_Episode], plan: _SignalPlan) -> None:
        """Reset every episode's environment (one `EnvPool.run` phase: concurrently where the pool says so)."""
        calls = [(episode.env, _reset_calls, (episode.trajectory.task, plan)) for episode in episodes]
        for episode, start in zip(episodes, self.env_pool.run(calls, "reset"), strict=True):
            if isinstance(start, BaseException) or start.error is not None:
                self._fail(episode, _failure("reset", start))
                continue
            episode.observation = episode.first_observation = start.observation
            episode.system = start.instructions if self.system_prompt is None else self.system_prompt
            episode.tools = start.tools
            episode.trajectory.task_text = start.task_text
            episode.state_values = start.state_values
            episode.role = start.role
            if self.row_format == "conversation":
                try:
                    episode.context_ids = self.renderer.conversation_prompt_ids(
                        episode.system, episode.trajectory.task_text, episode.observation, episode.tools
                    )
                except PromptTooLongError as err:  # a first observation longer than the prompt budget
                    self._fail_too_long(episode, err)
                except Exception as err:  # noqa: BLE001
                    self._fail(episode, f"reset failed: {type(err).__name__}: {err}")

    def _fork(self, forked: list[tuple[_Episode, _Episode, Fork]], plan: _SignalPlan) -> None:
        """Put every new episode in the state before step `request.step` of its parent: restore the parent's
        snapshot (one pool phase), share the parent's earlier steps, copy its prompt state."""
        calls = []
        transition_names = {signal.name for signal in plan.transition}
        for episode, parent, request in forked:
            steps = parent.trajectory.steps
            if not 0 <= request.step < len(steps):
                raise ValueError(
                    f"topology {self.topology.name!r} forked at step {request.step} of an episode with "
                    f"{len(steps)} steps"
                )
            snapshot = steps[request.step].snapshot
            if snapshot is None:
                raise ValueError(
                    f"topology {self.topology.name!r} forked at step {request.step}, which has no environment "
                    "snapshot: set `needs_snapshots = True` on the topology (or record_snapshots=True)."
                )
            calls.append((episode.env, _restore_calls, (snapshot, plan)))
        for (episode, parent, request), outcome in zip(forked, self.env_pool.run(calls, "reset"), strict=True):
            step = parent.trajectory.steps[request.step]
            trajectory = episode.trajectory
            trajectory.parent_id, trajectory.fork_step = parent.trajectory.episode_id, request.step
            trajectory.steps = parent.trajectory.steps[: request.step]  # the shared prefix: the same Step objects
            trajectory.task_text = parent.trajectory.task_text
            if isinstance(outcome, BaseException) or outcome.error is not None:
                self._fail(episode, _failure("restore", outcome))
                continue
            episode.system, episode.observation, episode.tools = parent.system, step.observation, parent.tools
            episode.history = list(parent.history[: request.step])
            episode.state_values = {n: step.signals[n].before for n in transition_names if n in step.signals}
            episode.role = outcome.role
            if self.row_format == "conversation":
                episode.context_ids = list(step.prompt_ids)
            if request.action_prefix:
                prefix = list(request.action_prefix)
                if list(step.action_ids[: len(prefix)]) == prefix:
                    episode.prefix_logprobs = list(step.action_logprobs[: len(prefix)])
                else:  # a prefix the parent did not generate: no sampling log-probs to copy
                    episode.prefix_logprobs = [float("nan")] * len(prefix)
                episode.action_prefix = prefix

    def _check_identical_starts(self, group: Group, by_trajectory: dict[int, _Episode]) -> None:
        members = [by_trajectory[id(t)] for t in group.trajectories if t.parent_id is None]
        starts = {episode.first_observation for episode in members if not episode.trajectory.failed}
        if len(starts) > 1:
            raise ValueError(
                f"Environment {members[0].env.name!r} gave different first observations for the same task "
                f"{group.task!r}. Group-relative credit needs the episodes of a task to start from the same state: "
                "make `reset(task)` deterministic given the task row (e.g. seed every random choice from "
                "task['seed'])."
            )

    # ---- one turn --------------------------------------------------------------------------------------------------

    def _prompt(self, episode: _Episode) -> tuple[list[int], PromptParts]:
        trajectory = episode.trajectory
        if self.row_format == "conversation":
            first = trajectory.steps[0].prompt_parts if trajectory.steps else None
            parts = first or PromptParts(episode.system, trajectory.task_text, (), episode.observation, episode.tools)
            return list(episode.context_ids), parts
        ids, kept = self.renderer.step_prompt(episode.system, trajectory.task_text, episode.history,
                                              episode.observation, episode.tools)
        return ids, PromptParts(episode.system, trajectory.task_text, tuple(kept), episode.observation, episode.tools)

    def _turn(self, active: list[_Episode], plan: _SignalPlan, stats: dict[str, float]) -> None:
        prompts, parts, ready, ended, recorded = [], [], [], [], []
        forced, forced_prompts, forced_parts = [], [], []
        limit = self.renderer.max_prompt_length
        for episode in active:
            try:
                prompt_ids, prompt_parts = self._prompt(episode)
                sampling_ids = self._hinted_prompt(episode) if episode.hint is not None else prompt_ids
            except PromptTooLongError as err:  # a step prompt longer than max_prompt_length even without history
                self._fail_too_long(episode, err)
                continue
            except ValueError as err:
                self._fail(episode, str(err))
                continue
            if limit is not None and len(prompt_ids) > limit:  # a conversation outgrew its context: truncate it
                ended.append(episode)
                continue
            if episode.forced_actions is not None:
                if len(episode.trajectory.steps) >= len(episode.forced_actions):  # out of forced actions
                    ended.append(episode)
                else:
                    forced.append(episode)
                    forced_prompts.append(prompt_ids)
                    forced_parts.append(prompt_parts)
                continue
            prompts.append(sampling_ids + episode.action_prefix)
            recorded.append(prompt_ids)
            parts.append(prompt_parts)
            ready.append(episode)
        if ended:
            self._end_between_turns(ended, plan)
        if not ready and not forced and not self._collective:
            return
        if ready or self._collective:
            if plan.role:
                output = self.generator.generate(prompts, self.sampling, roles=[episode.role for episode in ready])
            else:
                output = self.generator.generate(prompts, self.sampling)
            stats["generation_calls"] += 1
            stats["generated_tokens"] += sum(len(ids) for ids in output.completion_ids)
            completions = [episode.action_prefix + list(ids) for episode, ids in zip(ready, output.completion_ids,
                                                                                      strict=True)]
            logprobs = [episode.prefix_logprobs + list(lps)
                        for episode, lps in zip(ready, output.logprobs, strict=True)]
        else:
            completions, logprobs = [], []
        stats["env_steps"] += len(ready) + len(forced)
        # (Not batch_decode([]): transformers 5 decodes it as one empty sequence, [''].)
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True) if ready else []
        for episode, prompt_ids, prompt_parts in zip(forced, forced_prompts, forced_parts, strict=True):
            # A forced turn: the given action, tokenised and closed with EOS as a generated turn ends; no sampling
            # log-probs (NaN: nothing sampled these tokens).
            text = episode.forced_actions[len(episode.trajectory.steps)]
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            ready.append(episode)
            recorded.append(prompt_ids)
            parts.append(prompt_parts)
            completions.append(ids)
            logprobs.append([float("nan")] * len(ids))
            texts.append(text)
        calls = [
            # An episode's last turn (done, or out of turns) also runs the episode-end signals where the env lives.
            (episode.env, _step_calls, (text, plan, len(episode.trajectory.steps) + 1 >= self.max_turns))
            for episode, text in zip(ready, texts, strict=True)
        ]
        outcomes = self.env_pool.run(calls, "step")
        for episode, prompt_ids, prompt_parts, action_ids, action_logprobs, text, outcome in zip(
            ready, recorded, parts, completions, logprobs, texts, outcomes, strict=True
        ):
            episode.action_prefix, episode.prefix_logprobs = [], []
            step = Step(
                observation=episode.observation,
                action_text=text,
                prompt_ids=prompt_ids,
                action_ids=action_ids,
                action_logprobs=action_logprobs,
                prompt_parts=prompt_parts,
            )
            self._apply_action(episode, step, outcome, plan)
            if episode.supervision is not None:
                step.info[SUPERVISION] = episode.supervision

    def _hinted_prompt(self, episode: _Episode) -> list[int]:
        """The step prompt an episode launched with a hint samples from: the hint after its system message."""
        trajectory = episode.trajectory
        system = f"{episode.system}\n\n{episode.hint}" if episode.system else episode.hint
        ids, _ = self.renderer.step_prompt(system, trajectory.task_text, episode.history, episode.observation,
                                           episode.tools)
        return ids

    def _apply_action(self, episode: _Episode, step: Step, outcome, plan: _SignalPlan) -> None:
        """Record the step whose environment calls (`_step_calls`) returned `outcome`."""
        trajectory = episode.trajectory
        if not isinstance(outcome, BaseException):
            step.state_key, step.snapshot = outcome.state_key, outcome.snapshot
            step.signals.update(outcome.before)
        if isinstance(outcome, BaseException) or outcome.error is not None:
            message = _failure("step", outcome)
            if not isinstance(outcome, BaseException) and outcome.error.startswith(CONTRACT):
                message = (f"environment {episode.env.name!r} broke its contract on task {task_id(trajectory.task)}, "
                           f"episode {trajectory.episode_id}, step {len(trajectory.steps)}: {message}")
            trajectory.steps.append(step)  # the failed step stays in the record
            self._fail(episode, message)
            return
        for signal in plan.transition:
            step.signals[signal.name] = Transition(episode.state_values.get(signal.name), outcome.after[signal.name])
        episode.state_values = dict(outcome.after)
        episode.role = outcome.role
        step.reward, step.done, step.valid, step.info = outcome.reward, outcome.done, outcome.valid, outcome.info
        step.next_observation = outcome.observation
        trajectory.steps.append(step)
        trajectory.success = outcome.success
        episode.history.append((episode.observation, outcome.history_action))
        episode.observation = outcome.observation
        if outcome.signal_error is not None:
            self._fail(episode, outcome.signal_error)
            return
        if outcome.done or len(trajectory.steps) >= self.max_turns:
            episode.finished = True
            step.signals.update(outcome.end or {})
            return
        if self.row_format == "conversation":
            ended = bool(step.action_ids) and step.action_ids[-1] in self.eos_token_ids
            # A turn cut by the token budget did not emit EOS: close it so the chat stays well formed.
            step.env_ids = ([] if ended else [self.tokenizer.eos_token_id]) + self.renderer.env_turn_ids(
                outcome.observation
            )
            episode.context_ids = step.prompt_ids + step.action_ids + step.env_ids

    def _end_between_turns(self, episodes: list[_Episode], plan: _SignalPlan) -> None:
        """Episodes that end without a step of their own (a conversation that outgrew its context): their
        episode-end signals in one pool phase, where the environments live."""
        if not plan.episode_end:
            for episode in episodes:
                episode.finished = True
            return
        calls = [(episode.env, _end_calls, (plan,)) for episode in episodes]
        for episode, outcome in zip(episodes, self.env_pool.run(calls, "step"), strict=True):
            episode.finished = True
            if isinstance(outcome, BaseException):
                self._fail(episode, _failure("step", outcome))
                continue
            values, error = outcome
            if error is not None:
                self._fail(episode, error)
            elif episode.trajectory.steps:
                episode.trajectory.steps[-1].signals.update(values)

    def _fail_too_long(self, episode: _Episode, err: PromptTooLongError) -> None:
        """Fail an episode whose prompt does not fit in `max_prompt_length`; the first time in this process for this
        bound, also say in a warning what it is and how to change it (the episodes' own warnings then follow)."""
        limit = self.renderer.max_prompt_length
        if limit not in _TOO_LONG_WARNED:
            _TOO_LONG_WARNED.add(limit)
            logger.warning("Episodes whose prompt does not fit in max_prompt_length are failed (recorded with their "
                           "error, not trained on); the first: %s", err)
        self._fail(episode, str(err))

    def _fail(self, episode: _Episode, message: str) -> None:
        trajectory = episode.trajectory
        logger.warning("Episode %d of task %s failed: %s", trajectory.episode_id, trajectory.task, message)
        episode.trajectory.error = message
        episode.trajectory.success = False
        episode.finished = True


# ---- the environment calls of one reset / restore / turn, run where the environment lives (`EnvPool.run`) ----------


@dataclass
class _EnvStart:
    observation: str = ""
    instructions: str = ""
    tools: tuple[str, ...] = ()
    task_text: str = ""
    state_values: dict[str, Any] = field(default_factory=dict)
    role: str = ""
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
    before: dict[str, Any] = field(default_factory=dict)  # "before_step" signals
    after: dict[str, Any] = field(default_factory=dict)  # "transition" signals of the state after the step
    end: dict[str, Any] | None = None  # "episode_end" signals, after the episode's last step
    role: str = ""
    signal_error: str | None = None  # a signal that failed after the step (fails the episode, keeps the step)
    error: str | None = None


def _evaluate(env: AgentEnv, signals: Sequence[EnvSignal]) -> dict[str, Any]:
    """`{name: signal.fn(env)}`; a failing signal raises a SignalError naming it."""
    values = {}
    for signal in signals:
        try:
            values[signal.name] = signal.fn(env)
        except Exception as err:
            raise SignalError(f"signal {signal.name!r} failed: {type(err).__name__}: {err}") from err
    return values


def _reset_calls(env: AgentEnv, task: dict[str, Any], plan: _SignalPlan) -> _EnvStart:
    start = _EnvStart()
    try:
        start.observation = env.reset(dict(task))
        start.instructions = env.instructions
        start.tools = tool_texts(getattr(env, "tools", ()))
        start.task_text = env.task_description()
        start.state_values = _evaluate(env, plan.transition)
        if plan.role:
            start.role = env.current_role()
    except SignalError as err:
        start.error = str(err)
    except Exception as err:  # noqa: BLE001 — an env failure fails its episode, never the run
        start.error = f"{type(err).__name__}: {err}"
    return start


def _restore_calls(env: AgentEnv, snapshot: Any, plan: _SignalPlan) -> _EnvStart:
    start = _EnvStart()
    try:
        env.restore(snapshot)
        if plan.role:
            start.role = env.current_role()
    except Exception as err:  # noqa: BLE001
        start.error = f"{type(err).__name__}: {err}"
    return start


def _step_calls(env: AgentEnv, action_text: str, plan: _SignalPlan, last_turn: bool) -> _EnvTurn:
    turn = _EnvTurn()
    try:
        if env.supports("state_key"):
            turn.state_key = env.state_key()
        if plan.snapshot and env.supports("snapshot"):
            turn.snapshot = env.snapshot()
        turn.before = _evaluate(env, plan.before_step)
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
        turn.info = _json_safe(info)  # also what lets the info travel back from a worker process
    except SignalError as err:
        turn.error = str(err)
        return turn
    except Exception as err:  # noqa: BLE001
        turn.error = f"{type(err).__name__}: {err}"
        return turn
    try:  # after the step: a failing signal fails the episode but the step is recorded whole
        turn.after = _evaluate(env, plan.transition)
        if plan.role:
            turn.role = env.current_role()
        if turn.done or last_turn:
            turn.end = _evaluate(env, plan.episode_end)
    except SignalError as err:
        turn.signal_error = str(err)
    except Exception as err:  # noqa: BLE001
        turn.signal_error = f"{type(err).__name__}: {err}"
    return turn


def _end_calls(env: AgentEnv, plan: _SignalPlan) -> tuple[dict[str, Any], str | None]:
    try:
        return _evaluate(env, plan.episode_end), None
    except SignalError as err:
        return {}, str(err)


CONTRACT = "env contract: "  # the start of `_EnvTurn.error` when a step's outputs break the AgentEnv contract


def _failure(kind: str, outcome: Any) -> str:
    """The `Trajectory.error` of a failed reset, restore or step: the pool's own message (timeout, dead worker) or
    what the environment raised."""
    if isinstance(outcome, EnvCallError):
        return str(outcome)
    if isinstance(outcome, BaseException):
        return f"{kind} failed: {type(outcome).__name__}: {outcome}"
    if outcome.error.startswith("signal "):
        return outcome.error
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
