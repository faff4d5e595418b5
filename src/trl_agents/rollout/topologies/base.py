"""The topology protocol: what a topology asks the rollout engine for, and what it sees of the rollout.

A topology never steps an environment or calls the generator itself. It answers the engine at three moments with
*requests*, and the engine carries them out (acquiring environments, one pool phase for all resets / restores, one
generation call per turn for every active episode of every task and branch):

* `begin(tasks, num_generations)` -> the first requests (usually `Launch`es);
* `after_turn(view, task_index=None)` -> requests to serve right away, after a turn (e.g. fork from a state just
  visited);
* `when_idle(view, task_index=None)` -> requests once nothing is active (in lockstep: no episode of this process,
  with a collective generator of any process, so that all processes ask at once; in a per-task call: no episode of
  that task) — another round of episodes, forks from finished backbones; an empty list ends the topology's part of
  the rollout (of that task, for a per-task call).

`task_index` says which tasks a call is about: None means all of them, an int that one task only; a topology walks
`view.task_indices(task_index)`. Which calls the engine makes depends on the class's `schedule` (`SCHEDULES`):

* `"free"`: every episode advances alone. `when_idle(view, i)` comes as soon as task i has no active (non-held)
  episode, and `after_turn(view, i)` after each turn of an episode of task i (a free topology normally returns []
  there). Each decision reads only task i's own group, and the requests it returns concern task i only, so the
  answers do not depend on how far the other tasks are, nor on the order in which tasks become idle.
* `"task"`: a barrier per task. `after_turn(view, i)` runs once every active, non-held episode of task i has played
  its turn, `when_idle(view, i)` once task i has nothing active; tasks proceed independently of each other (the
  same rule as "free" for what a call may read and return).
* `"global"` (the default, and what a topology that declares nothing gets): lockstep over all tasks.
  `after_turn(view)` after every global turn, `when_idle(view)` when no episode of the process is active, both with
  `task_index=None`: a decision may read and serve every task at once (e.g. a table shared by all tasks).

An engine may also drive a "free" or "task" topology in lockstep (task_index=None after every global turn and when
the whole process is idle); the built-in ones answer such a call with what per-task calls of every task would give
at that moment (token_branching's fill-ups aside, which a lockstep call may hold back one idle call: its docstring).

A trainer builds its topology once and reuses it for every training rollout: `begin` must start each rollout
afresh (state that should carry over, such as a random generator, may).

Requests:

* `Launch(task_index, count)`: `count` new episodes of a task from its initial state (`reset`); with
  `forced_actions=` they take the given actions instead of sampling (teacher forcing), with `hint=` they sample
  from a prompt whose system message carries the hint while the hint-free prompt is recorded.
* `Fork(task_index, episode_id, step, count, action_prefix=())`: `count` new episodes from the state right before
  step `step` of an episode (its snapshot is restored in a fresh environment); the new episode shares the parent's
  first `step` steps (the same `Step` objects: generated and recorded once) and samples its own action at `step`.
  `action_prefix` (token ids) makes that action continue from a token prefix instead of starting afresh.
* `Stop(task_index, episode_id)`: end an active episode now, between turns (pruning a tree path): it is kept in its
  group as an ordinary finished episode (not an infrastructure failure) with the steps it played; its episode-end
  signals run as for an episode that ends without a step of its own. A Stop of an episode that already ended is a
  no-op.
* `Hold(task_index, episode_id, held=True)`: pause an active episode (it skips turns, its environment waiting in the
  state it reached) until a `Hold(..., held=False)` resumes it; an episode still held when the rollout ends (nothing
  unheld left to play and `when_idle` asks for nothing) ends then, like a `Stop` (e.g. the unexplored siblings left
  on a depth-first frontier).

`RolloutView` is the read-only picture a topology decides from: one `Group` per task with every trajectory so far
(finished or not, in creation order), which episodes are still active, the turns played, and
`compute_signal(name, trajectories)` to run a model signal (e.g. per-token entropies) on recorded steps mid-rollout.
`stats()` (rollout-level numbers such as episodes per task) end up in `RolloutBatch.stats` and the trainer's logs.

Example (a topology that gives every task one more episode once its first ones are done, each task on its own):
    >>> from trl_agents.rollout.topologies import Launch, Topology
    >>> class OneMore(Topology):
    ...     name = "one-more"
    ...     schedule = "free"
    ...     def begin(self, tasks, num_generations):
    ...         self.added = set()
    ...         return [Launch(index, num_generations) for index in range(len(tasks))]
    ...     def when_idle(self, view, task_index=None):
    ...         new = [index for index in view.task_indices(task_index) if index not in self.added]
    ...         self.added.update(new)
    ...         return [Launch(index, 1) for index in new]
    >>> OneMore().begin([{"env": "frozenlake", "seed": 0}], 2)
    [Launch(task_index=0, count=2)]
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...trajectory import Group, Trajectory

SCHEDULES = ("free", "task", "global")
"""How the engine may schedule a topology's calls (`Topology.schedule`; the module docstring)."""


@dataclass(frozen=True)
class Launch:
    """Start `count` new episodes of task `task_index` (an index into the rollout's tasks) from its initial state.

    Two optional kinds of supervised episode (both marked `step.info["supervision"]`, see `SUPERVISION`):

    * `forced_actions`: teacher forcing. The episode does not sample: at turn t it takes `forced_actions[t]` (e.g.
      the ground-truth action), tokenised and closed with EOS as the generator would end it, and steps the
      environment with it; its sampling log-probs are NaN (nothing sampled them: no importance-sampling
      correction). An episode that runs out of forced actions before it is done ends there.
    * `hint`: sampling-only guidance. The prompt the policy samples from has `hint` appended to its system message;
      the recorded prompt (what is trained on) is the hint-free one. Step rows only.
    """

    task_index: int
    count: int
    forced_actions: tuple[str, ...] | None = field(default=None, repr=False)
    hint: str | None = field(default=None, repr=False)


SUPERVISION = "supervision"  # step.info key of supervised episodes' steps: "forced" (forced_actions) or "hinted"


@dataclass(frozen=True)
class Fork:
    """Start `count` new episodes from the state before step `step` of episode `episode_id` of task `task_index`.

    The parent's environment snapshot taken before that step is restored in a fresh environment; each new episode
    shares the parent's steps `[:step]` and samples its own action at `step` (from `action_prefix`, token ids, when
    given: token-level branching).
    """

    task_index: int
    episode_id: int
    step: int
    count: int
    action_prefix: tuple[int, ...] = ()


@dataclass(frozen=True)
class Stop:
    """End the active episode `episode_id` of task `task_index` now, between turns (e.g. a pruned tree path).

    It stays in its group as a finished episode with the steps it played (not an infrastructure failure); an episode
    that has already ended is left as it is.
    """

    task_index: int
    episode_id: int


@dataclass(frozen=True)
class Hold:
    """Pause (`held=True`) or resume (`held=False`) the active episode `episode_id` of task `task_index`: a held
    episode skips turns until resumed; one still held when the rollout ends is ended then, like a `Stop`."""

    task_index: int
    episode_id: int
    held: bool = True


Request = Launch | Fork | Stop | Hold


def task_random(seed: Any, rollout: int, task: dict[str, Any]) -> random.Random:
    """A random stream of its own for one task of one rollout, seeded by `"{seed}:{rollout}:{task id}"` (the task id:
    the row's `task_id`, else its sorted items), so that a task's draws do not depend on the other tasks of the
    rollout nor on the order in which tasks are decided (how tasks are split between processes, which task becomes
    idle first). `rollout` counts the rollouts a topology has begun, so that a reused topology draws afresh.

    >>> task_random(0, 0, {"seed": 3}).random() == task_random(0, 0, {"seed": 3}).random()
    True
    >>> task_random(0, 0, {"seed": 3}).random() == task_random(0, 1, {"seed": 3}).random()
    False
    """
    return random.Random(f"{seed}:{rollout}:{task.get('task_id', sorted(task.items()))}")


class RolloutView:
    """What a topology sees of a rollout in progress (built by the engine; read it, do not change it).

    Attributes:
        tasks: The task rows of the rollout, in order.
        groups: One `Group` per task with every trajectory so far, in creation order (`episode_id` order).
        turn: Turns played so far.
        max_turns: The engine's turn budget per episode.
    """

    def __init__(
        self,
        tasks: Sequence[dict[str, Any]],
        groups: list[Group],
        is_active: Callable[[Trajectory], bool],
        signal_fn: Callable[[str, list[Trajectory]], None] | None,
        max_turns: int,
        is_held: Callable[[Trajectory], bool] | None = None,
    ):
        self._is_held = is_held
        self.tasks = list(tasks)
        self.groups = groups
        self.turn = 0
        self.max_turns = max_turns
        self._is_active = is_active
        self._signal_fn = signal_fn

    def is_active(self, trajectory: Trajectory) -> bool:
        """Whether the episode is still being played."""
        return self._is_active(trajectory)

    def is_held(self, trajectory: Trajectory) -> bool:
        """Whether the episode is paused by a `Hold` (it is still active: not finished)."""
        return self._is_held is not None and self._is_held(trajectory)

    def active(self, task_index: int) -> list[Trajectory]:
        return [t for t in self.groups[task_index].trajectories if self.is_active(t)]

    def finished(self, task_index: int) -> list[Trajectory]:
        return [t for t in self.groups[task_index].trajectories if not self.is_active(t)]

    def task_indices(self, task_index: int | None) -> range | list[int]:
        """The tasks a call is about: every task index for None, else `[task_index]` (checked in range), so that a
        topology writes `for index in view.task_indices(task_index): ...` for both kinds of call."""
        if task_index is None:
            return range(len(self.groups))
        if isinstance(task_index, bool) or not isinstance(task_index, int) or not 0 <= task_index < len(self.groups):
            raise IndexError(f"task_index {task_index!r} is not a task of this rollout ({len(self.groups)} tasks)")
        return [task_index]

    def compute_signal(self, name: str, trajectories: list[Trajectory]) -> None:
        """Run the model signal `name` on the steps of `trajectories` (values land in `step.signals[name]`)."""
        if self._signal_fn is None:
            raise ValueError(
                f"This topology needs the model signal {name!r} during the rollout, but the engine was built "
                "without a signal function (`RolloutEngine(signal_fn=...)`; trainers pass theirs)."
            )
        self._signal_fn(name, trajectories)


class Topology:
    """Base class of the rollout topologies (see the module docstring). Subclasses set `name` and override
    `begin`, and `after_turn` / `when_idle` where they add episodes.

    Class attributes:
        name: Registry name (`AgentGRPOConfig.topology`).
        schedule: How the engine may call `after_turn` / `when_idle` (`SCHEDULES`): `"free"` (per task, every episode
            on its own: `when_idle(view, i)` as soon as task i has nothing active), `"task"` (per task, a turn barrier
            within each task) or `"global"` (lockstep over all tasks, `task_index=None`; the default, for topologies
            that do not declare one).
        needs_snapshots: The engine records an environment snapshot before every action (forks restore them).
        required_capabilities: Environment capabilities the topology needs (checked at start-up).
        model_signals: Model signals the topology computes mid-rollout through `RolloutView.compute_signal`.
    """

    name: ClassVar[str] = ""
    schedule: ClassVar[str] = "global"
    needs_snapshots: ClassVar[bool] = False
    required_capabilities: ClassVar[tuple[str, ...]] = ()
    model_signals: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.schedule not in SCHEDULES:
            raise ValueError(f"{cls.__name__}.schedule must be one of {', '.join(map(repr, SCHEDULES))}, "
                             f"got {cls.schedule!r}")

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        raise NotImplementedError

    def after_turn(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """Requests after a turn: of every task (`task_index=None`, lockstep) or of task `task_index` alone."""
        return []

    def when_idle(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """Requests once nothing is active: in every task (`task_index=None`, lockstep) or in task `task_index`
        (which then has no active, non-held episode; the others may still play)."""
        return []

    def stats(self, view: RolloutView) -> dict[str, float]:
        """Rollout-level numbers to log under `topology/` (e.g. episodes per task); {} by default. The trainer
        reduces them over processes by name, so every process must return the same keys: means over this process's
        tasks (averaged over processes), or `max_*` / `rounds` (the largest on any process)."""
        return {}
