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

That is the lockstep schedule (`schedule="lockstep"`, the default). With `schedule="free"` or `"task"` the same
episodes are played by `EpisodeScheduler` (`rollout/scheduler.py`): each advances on its own, its environment calls
and generation requests as futures, so no episode waits for the slowest one of its turn (docs/async.md); the
per-episode steps below (`_prepare`, `_sample`, `_record`, `_apply_start`, ...) are shared by both.

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

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..names import check_choice
from ..signals import EnvSignal, Transition, get_signal
from ..trajectory import Group, PromptParts, RolloutBatch, Step, Trajectory, task_id
from .env_pool import EnvPool
from .episode import (
    CONTRACT,
    Episode,
    SignalPlan,
    Turn,
    end_calls,
    failure,
    reset_calls,
    restore_calls,
    step_calls,
)
from .generators import Generator, SamplingParams
from .prompts import PromptRenderer, PromptTooLongError
from .scheduler import EpisodeScheduler
from .topologies import Fork, IndependentTopology, Launch, RolloutView, Topology
from .topologies.base import SUPERVISION, Hold, Stop

logger = logging.getLogger(__name__)

ROW_FORMATS = ("step", "conversation")
ROLLOUT_SCHEDULES = ("lockstep", "task", "free")
SEED_RANGE = 2**31  # sampling seeds are in [0, 2**31): what every backend (torch, vLLM requests) accepts
_TOO_LONG_WARNED: set[int | None] = set()  # the prompt bounds whose failed episodes were explained (once each)
_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.info(message)


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
            `RolloutProgress.update`, a live progress display); under per-episode scheduling, as episodes advance
            (at most every `PROGRESS_INTERVAL` seconds), with `turn` the most turns any episode has played.
        schedule: `"lockstep"` (every active episode plays turn t, in one generation call, before any plays t+1),
            or per-episode scheduling (`rollout/scheduler.py`): `"free"` lets every episode advance alone, `"task"`
            keeps a turn barrier per task. A topology runs under the stricter of this and its own
            `Topology.schedule` class (`"task"` for a tree pruned per depth, lockstep for one that declares none).
        deterministic_sampling: Give every generation request its own seed, a hash of (`seed`, rollout, task,
            episode, turn), so what a turn samples does not depend on the other requests of its call (the generator
            must declare `per_request_seeds`). None: on under per-episode scheduling when the generator supports
            it, off under lockstep (today's sampling from the global random state).
        seed: The run seed in the request seeds.
        generation_window: Per-episode scheduling with a batch generator: the longest a request waits for others
            to join its generation call while environment calls are still running (seconds); None: the fixed cost
            of one call, measured as the rollout goes (`CallCost`).
        sharded_model: The policy is sharded over processes (FSDP, DeepSpeed): its forwards are collectives that
            every process must make together, so per-episode scheduling runs in lockstep when the policy itself
            generates (the built-in generator) or the topology computes model signals mid-rollout; a vLLM server
            (request-level generator) with a topology without model signals still runs per episode.
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
        schedule: str = "lockstep",
        deterministic_sampling: bool | None = None,
        seed: int = 0,
        generation_window: float | None = None,
        sharded_model: bool = False,
    ):
        if row_format not in ROW_FORMATS:
            raise ValueError(f"row_format must be one of {ROW_FORMATS}, got {row_format!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        check_choice("schedule", schedule, ROLLOUT_SCHEDULES)
        if generation_window is not None and not generation_window >= 0:
            raise ValueError(f"generation_window must be a number of seconds >= 0 or None, got {generation_window!r}")
        seeded = bool(getattr(generator, "per_request_seeds", False))
        if deterministic_sampling and not seeded:
            raise ValueError(
                f"deterministic_sampling=True needs a generator that takes a seed per request; "
                f"{type(generator).__name__} does not declare `per_request_seeds` (turn deterministic_sampling off)."
            )
        self.schedule = schedule
        self.deterministic_sampling = (seeded and schedule != "lockstep") if deterministic_sampling is None \
            else bool(deterministic_sampling)
        self.seed = seed
        self.generation_window = generation_window
        self.sharded_model = sharded_model
        self.rollout_index: int | str = 0  # the rollout played (in the request seeds): `run(rollout_index=)` or a count
        self._runs = 0
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
        self._plan_role = False

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
    def _plan(self) -> SignalPlan:
        def timed(timing):
            return tuple(s for s in self.signals if s.timing == timing)

        return SignalPlan(
            transition=timed("transition"),
            before_step=timed("before_step"),
            episode_end=timed("episode_end"),
            snapshot=self.record_snapshots or self.topology.needs_snapshots,
            role=bool(getattr(self.generator, "routes_by_role", False)),
        )

    @property
    def effective_schedule(self) -> str:
        """The scheduling class the next rollout runs under: `"global"` (lockstep), `"task"` or `"free"`."""
        if self.schedule == "lockstep":
            return "global"
        ranks = {"global": 0, "task": 1, "free": 2}
        declared = getattr(self.topology, "schedule", "global")
        chosen = min(declared if declared in ranks else "global", self.schedule, key=ranks.__getitem__)
        if chosen == "global":
            return chosen
        if self._collective and not getattr(self.generator, "request_level", False):
            _log_once("The generator is a collective (every process must call it together), so per-episode "
                      "scheduling is off: the rollout runs in lockstep.")
            return "global"
        if self.sharded_model and (self.topology.model_signals or not getattr(self.generator, "request_level", False)):
            _log_once("The policy is sharded over processes (FSDP, DeepSpeed), so its forwards (generation with the "
                      "built-in generator, a topology's model signals) are collectives every process makes together: "
                      "the rollout runs in lockstep.")
            return "global"
        return chosen

    def run(self, tasks: Sequence[dict[str, Any]], num_generations: int,
            rollout_index: int | str | None = None) -> RolloutBatch:
        """Run the topology's episodes for `tasks` (`num_generations` per task with the default topology); return
        one Group per task, in task order, its trajectories in creation order (`episode_id`). `rollout_index` (in
        the request seeds of deterministic sampling) defaults to the number of rollouts this engine ran before."""
        self.rollout_index = self._runs if rollout_index is None else rollout_index
        self._runs += 1
        tasks = [dict(task) for task in tasks]
        groups = [Group(task=dict(task)) for task in tasks]
        episodes: list[Episode] = []
        by_trajectory: dict[int, Episode] = {}
        stats = {"generated_tokens": 0.0, "env_steps": 0.0, "generation_calls": 0.0, "generation_seconds": 0.0}
        view = RolloutView(tasks, groups, lambda t: not by_trajectory[id(t)].finished, self.signal_fn,
                           self.max_turns, is_held=lambda t: by_trajectory[id(t)].held)
        plan = self._plan
        self._plan_role = plan.role
        schedule = self.effective_schedule
        try:
            if schedule == "global":
                self._lockstep(tasks, num_generations, groups, episodes, by_trajectory, view, plan, stats)
            else:
                EpisodeScheduler(self, schedule, groups, episodes, by_trajectory, view, plan, stats).play(
                    tasks, num_generations)
        finally:
            for episode in episodes:
                if episode.busy:  # a call may still be running in it (the rollout raised): never reuse it
                    self.env_pool.discard(episode.env)
                else:
                    self.env_pool.release(episode.env)
        stats["episodes"] = float(len(episodes))
        stats.update({f"topology/{k}": float(v) for k, v in self.topology.stats(view).items()})
        return RolloutBatch(groups=groups, stats=stats)

    def _lockstep(self, tasks, num_generations, groups, episodes, by_trajectory, view, plan, stats) -> None:
        """Play the rollout turn by turn: every active episode's turn in one generation call and one pool phase."""
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

    def _report(self, turns_played: int, episodes: list[Episode]) -> None:
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

    def _any_active(self, active: list[Episode]) -> bool:
        """Whether to play another turn. A collective generator (vLLM server mode under several processes) needs
        every process to call it the same number of times per turn, so the loop goes on, with empty prompt lists on
        the processes whose episodes have all finished, until no process has an active episode; only then do the
        topologies of all processes get asked for more (`when_idle`), together."""
        if self._collective:
            return bool(self.generator.any_active(bool(active)))
        return bool(active)

    # ---- new episodes: launches (reset) and forks (restore) -------------------------------------------------------

    def _serve(self, requests, groups, episodes, by_trajectory, plan: SignalPlan) -> None:
        """Carry out the topology's requests: end the stopped episodes (their episode-end signals in one pool phase),
        then create the new ones: one pool phase resets the launched ones, one restores the forked ones."""
        launched, forked, stopped = self._create(requests, groups, episodes, by_trajectory)
        if stopped:
            self._end_between_turns(stopped, plan)
        if launched:
            self._start(launched, plan)
            for index in sorted({episode.task_index for episode in launched}):
                self._check_identical_starts(groups[index], by_trajectory)
        if forked:
            self._fork(forked, plan)

    def _create(self, requests, groups, episodes, by_trajectory):
        """Apply the topology's `Hold`s and make the episodes its `Launch`es and `Fork`s ask for (environment
        acquired, trajectory appended to its group: episode ids follow the order of the requests, never the order in
        which calls finish); return (launched, forked as (episode, parent, request), stopped) for the caller to run."""
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
                episode = Episode(env=env, trajectory=trajectory, task_index=request.task_index)
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
        return launched, forked, stopped

    def _start(self, episodes: list[Episode], plan: SignalPlan) -> None:
        """Reset every episode's environment (one `EnvPool.run` phase: concurrently where the pool says so)."""
        calls = [(episode.env, reset_calls, (episode.trajectory.task, plan)) for episode in episodes]
        for episode, start in zip(episodes, self.env_pool.run(calls, "reset"), strict=True):
            self._apply_start(episode, start)

    def _apply_start(self, episode: Episode, start) -> None:
        """Set an episode up from what its reset calls (`reset_calls`) returned."""
        if isinstance(start, BaseException) or start.error is not None:
            self._fail(episode, failure("reset", start))
            return
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

    def _fork(self, forked: list[tuple[Episode, Episode, Fork]], plan: SignalPlan) -> None:
        """Put every new episode in the state before step `request.step` of its parent: restore the parent's
        snapshot (one pool phase), share the parent's earlier steps, copy its prompt state."""
        calls = [self._fork_call(episode, parent, request, plan) for episode, parent, request in forked]
        for (episode, parent, request), outcome in zip(forked, self.env_pool.run(calls, "reset"), strict=True):
            self._apply_fork(episode, parent, request, outcome, plan)

    def _fork_call(self, episode: Episode, parent: Episode, request: Fork, plan: SignalPlan):
        """The restore call of a fork (a ValueError when the topology forked where it cannot)."""
        steps = parent.trajectory.steps
        if not 0 <= request.step < len(steps):
            raise ValueError(
                f"topology {self.topology.name!r} forked at step {request.step} of an episode with {len(steps)} steps"
            )
        snapshot = steps[request.step].snapshot
        if snapshot is None:
            raise ValueError(
                f"topology {self.topology.name!r} forked at step {request.step}, which has no environment "
                "snapshot: set `needs_snapshots = True` on the topology (or record_snapshots=True)."
            )
        return episode.env, restore_calls, (snapshot, plan)

    def _apply_fork(self, episode: Episode, parent: Episode, request: Fork, outcome, plan: SignalPlan) -> None:
        """Share the parent's first `request.step` steps and copy its prompt state, once the snapshot is restored."""
        transition_names = {signal.name for signal in plan.transition}
        step = parent.trajectory.steps[request.step]
        trajectory = episode.trajectory
        trajectory.parent_id, trajectory.fork_step = parent.trajectory.episode_id, request.step
        trajectory.steps = parent.trajectory.steps[: request.step]  # the shared prefix: the same Step objects
        trajectory.task_text = parent.trajectory.task_text
        if isinstance(outcome, BaseException) or outcome.error is not None:
            self._fail(episode, failure("restore", outcome))
            return
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

    def _check_identical_starts(self, group: Group, by_trajectory: dict[int, Episode],
                                members: list[Episode] | None = None) -> None:
        """Raise when the root episodes of a task (or `members`: those whose reset has returned) started apart."""
        if members is None:
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

    def _prompt(self, episode: Episode) -> tuple[list[int], PromptParts]:
        trajectory = episode.trajectory
        if self.row_format == "conversation":
            first = trajectory.steps[0].prompt_parts if trajectory.steps else None
            parts = first or PromptParts(episode.system, trajectory.task_text, (), episode.observation, episode.tools)
            return list(episode.context_ids), parts
        ids, kept = self.renderer.step_prompt(episode.system, trajectory.task_text, episode.history,
                                              episode.observation, episode.tools)
        return ids, PromptParts(episode.system, trajectory.task_text, tuple(kept), episode.observation, episode.tools)

    def _prepare(self, episode: Episode) -> Turn | None:
        """An episode's next turn: its prompts, or None when it ended without one (failed: its prompt cannot be
        built; `ended`: a conversation outgrew its context, or a forced episode ran out of actions; the caller then
        runs its episode-end calls)."""
        try:
            prompt_ids, prompt_parts = self._prompt(episode)
            sampling_ids = self._hinted_prompt(episode) if episode.hint is not None else prompt_ids
        except PromptTooLongError as err:  # a step prompt longer than max_prompt_length even without history
            self._fail_too_long(episode, err)
            return None
        except ValueError as err:
            self._fail(episode, str(err))
            return None
        limit, played, given = self.renderer.max_prompt_length, len(episode.trajectory.steps), episode.forced_actions
        ended = (limit is not None and len(prompt_ids) > limit  # a conversation outgrew its context: truncate it
                 or given is not None and played >= len(given))  # a forced episode out of actions
        forced = None if ended or given is None else given[played]
        return Turn(episode, prompt_ids, prompt_parts, sampling_ids + episode.action_prefix, forced, ended)

    def _seed(self, episode: Episode) -> int:
        """The sampling seed of an episode's next turn: a hash of (run seed, rollout, task, episode, turn), so what
        a turn samples does not depend on which other requests share its generation call, or when it is made."""
        trajectory = episode.trajectory
        key = (f"{self.seed}:{self.rollout_index}:{task_id(trajectory.task)}:{trajectory.episode_id}:"
               f"{len(trajectory.steps)}")
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % SEED_RANGE

    def _sample(self, turns: list[Turn], stats: dict[str, float]) -> tuple[list[tuple[list[int], list[float], str]],
                                                                           float]:
        """One generation call for `turns` (a collective generator is called with none too), counted in `stats`:
        each turn's sampled ids and log-probs (after its episode's action prefix) and decoded text, and the call's
        seconds."""
        prompts = [turn.sampling_ids for turn in turns]
        kwargs: dict[str, Any] = {}
        if self._plan_role:
            kwargs["roles"] = [turn.episode.role for turn in turns]
        if self.deterministic_sampling:
            kwargs["seeds"] = [self._seed(turn.episode) for turn in turns]
        started = time.perf_counter()
        output = self.generator.generate(prompts, self.sampling, **kwargs)
        seconds = time.perf_counter() - started
        stats["generation_seconds"] += seconds
        stats["generation_calls"] += 1
        stats["generated_tokens"] += sum(len(ids) for ids in output.completion_ids)
        sampled = [
            (turn.episode.action_prefix + list(ids), turn.episode.prefix_logprobs + list(lps))
            for turn, ids, lps in zip(turns, output.completion_ids, output.logprobs, strict=True)
        ]
        # (Not batch_decode([]): transformers 5 decodes it as one empty sequence, [''].)
        texts = self.tokenizer.batch_decode([ids for ids, _ in sampled], skip_special_tokens=True) if turns else []
        return [(ids, lps, text) for (ids, lps), text in zip(sampled, texts, strict=True)], seconds

    def _forced(self, turn: Turn) -> tuple[list[int], list[float], str]:
        """A forced turn: the given action, tokenised and closed with EOS as a generated turn ends; no sampling
        log-probs (NaN: nothing sampled these tokens)."""
        ids = self.tokenizer.encode(turn.forced, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return ids, [float("nan")] * len(ids), turn.forced

    def _step_call(self, turn: Turn, text: str, plan: SignalPlan):
        """The environment calls of a turn. An episode's last turn (done, or out of turns) also runs the episode-end
        signals where the env lives."""
        episode = turn.episode
        return episode.env, step_calls, (text, plan, len(episode.trajectory.steps) + 1 >= self.max_turns)

    def _record(self, turn: Turn, action_ids, action_logprobs, text: str, outcome, plan: SignalPlan) -> None:
        """Record a played turn whose environment calls returned `outcome`."""
        episode = turn.episode
        episode.action_prefix, episode.prefix_logprobs = [], []
        step = Step(
            observation=episode.observation,
            action_text=text,
            prompt_ids=turn.prompt_ids,
            action_ids=action_ids,
            action_logprobs=action_logprobs,
            prompt_parts=turn.parts,
        )
        self._apply_action(episode, step, outcome, plan)
        if episode.supervision is not None:
            step.info[SUPERVISION] = episode.supervision

    def _turn(self, active: list[Episode], plan: SignalPlan, stats: dict[str, float]) -> None:
        ready, forced, ended = [], [], []
        for episode in active:
            turn = self._prepare(episode)
            if turn is not None:
                (ended if turn.ended else forced if turn.forced is not None else ready).append(turn)
        if ended:
            self._end_between_turns([turn.episode for turn in ended], plan)
        if not ready and not forced and not self._collective:
            return
        played = []
        if ready or self._collective:
            sampled, _ = self._sample(ready, stats)
            played = [(turn, *outcome) for turn, outcome in zip(ready, sampled, strict=True)]
        played += [(turn, *self._forced(turn)) for turn in forced]
        stats["env_steps"] += len(played)
        outcomes = self.env_pool.run([self._step_call(turn, text, plan) for turn, _, _, text in played], "step")
        for (turn, ids, lps, text), outcome in zip(played, outcomes, strict=True):
            self._record(turn, ids, lps, text, outcome, plan)

    def _hinted_prompt(self, episode: Episode) -> list[int]:
        """The step prompt an episode launched with a hint samples from: the hint after its system message."""
        trajectory = episode.trajectory
        system = f"{episode.system}\n\n{episode.hint}" if episode.system else episode.hint
        ids, _ = self.renderer.step_prompt(system, trajectory.task_text, episode.history, episode.observation,
                                           episode.tools)
        return ids

    def _apply_action(self, episode: Episode, step: Step, outcome, plan: SignalPlan) -> None:
        """Record the step whose environment calls (`step_calls`) returned `outcome`."""
        trajectory = episode.trajectory
        if not isinstance(outcome, BaseException):
            step.state_key, step.snapshot = outcome.state_key, outcome.snapshot
            step.signals.update(outcome.before)
        if isinstance(outcome, BaseException) or outcome.error is not None:
            message = failure("step", outcome)
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

    def _end_between_turns(self, episodes: list[Episode], plan: SignalPlan) -> None:
        """Episodes that end without a step of their own (a conversation that outgrew its context): their
        episode-end signals in one pool phase, where the environments live."""
        if not plan.episode_end:
            for episode in episodes:
                episode.finished = True
            return
        calls = [(episode.env, end_calls, (plan,)) for episode in episodes]
        for episode, outcome in zip(episodes, self.env_pool.run(calls, "step"), strict=True):
            self._apply_end(episode, outcome)

    def _apply_end(self, episode: Episode, outcome) -> None:
        """Finish an episode that ended between turns, with what its episode-end calls (`end_calls`) returned."""
        episode.finished = True
        if isinstance(outcome, BaseException):
            self._fail(episode, failure("step", outcome))
            return
        values, error = outcome
        if error is not None:
            self._fail(episode, error)
        elif episode.trajectory.steps:
            episode.trajectory.steps[-1].signals.update(values)

    def _fail_too_long(self, episode: Episode, err: PromptTooLongError) -> None:
        """Fail an episode whose prompt does not fit in `max_prompt_length`; the first time in this process for this
        bound, also say in a warning what it is and how to change it (the episodes' own warnings then follow)."""
        limit = self.renderer.max_prompt_length
        if limit not in _TOO_LONG_WARNED:
            _TOO_LONG_WARNED.add(limit)
            logger.warning("Episodes whose prompt does not fit in max_prompt_length are failed (recorded with their "
                           "error, not trained on); the first: %s", err)
        self._fail(episode, str(err))

    def _fail(self, episode: Episode, message: str) -> None:
        trajectory = episode.trajectory
        logger.warning("Episode %d of task %s failed: %s", trajectory.episode_id, trajectory.task, message)
        episode.trajectory.error = message
        episode.trajectory.success = False
        episode.finished = True


