"""`branching`: fork K siblings from environment snapshots at chosen steps of backbone episodes (BPO, arXiv
2607.14171; docs/methods/bpo.md).

Phase 1 plays `num_generations` backbone episodes per task, recording an environment snapshot before every action.
Phase 2, once a task's backbones have all ended, ranks the steps of every healthy backbone of that task by `score`
and, at its `branch_points` best steps (ties: the earliest), forks `branch_factor − 1` new episodes from the snapshot
taken before that step: each samples its own action there and plays to the end. With the backbone's own continuation
they are the K = `branch_factor` siblings of that branch point. The shared prefix (the backbone's steps before the
branch point) is generated once and recorded once: the siblings hold the same `Step` objects
(`Trajectory.parent_id`, `fork_step`). The phase is per task and its schedule is "free": a task's branch points
depend only on its own backbones (and its own random stream), so each task branches as soon as its backbones are done;
in lockstep, all tasks branch at once and all forks of all tasks run together, one generation call per turn.

Scores (how "decisive" a step is):

* `"entropy_mean"`: the mean per-token entropy of the policy over the step's action tokens (model signal
  `entropy`, one batched no-grad forward over the backbones' recorded steps);
* `"entropy_first"`: the entropy of the action's first token;
* `"random"`: uniformly random steps, a control. Each task draws from its own stream,
  `random.Random(f"{seed}:{rollout}:{task id}")` (`base.task_random`: `rollout` counts the rollouts this topology has
  begun, the task id is the row's `task_id` or its sorted items), its backbones in episode order: the picks do not
  depend on the order in which tasks finish their backbones, nor on the other tasks of the rollout.

Example:
    >>> from trl_agents.rollout.topologies import BranchingTopology
    >>> topology = BranchingTopology(branch_points=1, branch_factor=4, score="random")
    >>> topology.begin([{"seed": 0}], num_generations=2)
    [Launch(task_index=0, count=2)]
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ...trajectory import Step, Trajectory
from .base import Fork, Launch, Request, RolloutView, Topology, task_random

BRANCH_SCORES = ("entropy_mean", "entropy_first", "random")


class BranchingTopology(Topology):
    """Backbones, then `branch_factor − 1` forks at each of the `branch_points` best steps of every backbone.

    Args:
        branch_points: Branch points per backbone (fewer when the backbone has fewer steps).
        branch_factor: K, siblings per branch point including the backbone's own continuation (>= 2).
        score: How steps are ranked (`BRANCH_SCORES`).
        seed: Seed of the `"random"` score (with the rollout's number and the task: one stream per task; before the
            per-task streams, one generator seeded by `seed` served all tasks in turn, so the random picks of a
            given seed differ from those of that older version).
    """

    name = "branching"
    schedule = "free"
    needs_snapshots = True
    required_capabilities = ("snapshot",)

    def __init__(self, branch_points: int = 1, branch_factor: int = 4, score: str = "entropy_mean", seed: int = 0):
        for field, value, low in (("branch_points", branch_points, 1), ("branch_factor", branch_factor, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{field} must be an integer >= {low}, got {value!r}")
        if score not in BRANCH_SCORES:
            raise ValueError(f"score must be one of {', '.join(map(repr, BRANCH_SCORES))}, got {score!r}")
        self.branch_points = branch_points
        self.branch_factor = branch_factor
        self.score = score
        self.model_signals = ("entropy",) if score.startswith("entropy") else ()
        self.seed = seed
        self._rollouts = 0  # rollouts begun: with the task, it seeds the task's random stream
        self._rngs: list[random.Random] = []
        self._branched: list[bool] = []  # per task: phase "branches" (True) or still "backbones"
        self._forked: list[int] = []  # per task: branch points forked
        self._asked = False  # whether when_idle was called in this rollout

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        self._rngs = [task_random(self.seed, self._rollouts, task) for task in tasks]
        self._rollouts += 1
        self._branched, self._forked, self._asked = [False] * len(tasks), [0] * len(tasks), False
        return [Launch(index, num_generations) for index in range(len(tasks))]

    def when_idle(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """The forks of the task(s) (all for None, else `task_index`) still in their backbone phase: the entropy
        signal on their healthy backbones (one call), then `branch_factor − 1` forks at each branch step."""
        indices = [index for index in view.task_indices(task_index) if not self._branched[index]]
        # In lockstep the first idle call runs the signal even with no task to decide (every process makes that
        # call at its first idle moment: a model forward may be collective).
        first_lockstep = task_index is None and not self._asked
        self._asked = True
        if not indices and not first_lockstep:
            return []
        backbones = []
        for index in indices:
            self._branched[index] = True
            backbones += [(index, t) for t in view.groups[index].trajectories
                          if t.parent_id is None and not t.failed and t.steps]
        if self.model_signals:
            view.compute_signal("entropy", [t for _, t in backbones])
        requests = []
        for index, backbone in backbones:
            for step in self.branch_steps(backbone, index):
                requests.append(Fork(index, backbone.episode_id, step, self.branch_factor - 1))
                self._forked[index] += 1
        return requests

    def branch_steps(self, backbone: Trajectory, task_index: int = 0) -> list[int]:
        """The steps of `backbone` (a backbone of task `task_index`) to branch at: the `branch_points` highest scores
        (ties: the earliest step), among the steps that have a snapshot, in step order. The `"random"` score draws
        them from the task's own stream (built by `begin`), `branch_points` of the candidates without replacement."""
        candidates = [t for t, step in enumerate(backbone.steps) if step.snapshot is not None]
        if self.score == "random":
            if not 0 <= task_index < len(self._rngs):
                raise ValueError(f"no random stream for task {task_index}: call begin() with the rollout's tasks first")
            chosen = self._rngs[task_index].sample(candidates, min(self.branch_points, len(candidates)))
        else:
            scores = {t: step_score(backbone.steps[t], self.score) for t in candidates}
            chosen = sorted(candidates, key=lambda t: (-scores[t], t))[: self.branch_points]
        return sorted(chosen)

    def stats(self, view: RolloutView) -> dict[str, float]:
        groups = view.groups
        if not groups:
            return {}
        leaves = [len(group.trajectories) for group in groups]
        return {
            "leaves_per_task": sum(leaves) / len(leaves),
            "branch_points_per_task": sum(self._forked) / len(groups),
        }


def step_score(step: Step, score: str) -> float:
    """A step's branching score from its `entropy` signal (per-token entropies of its action)."""
    entropies = step.signals.get("entropy")
    if entropies is None:
        raise ValueError(f"branch score {score!r} needs step.signals['entropy'] (the model signal 'entropy')")
    if not len(entropies):
        return float("-inf")
    if score == "entropy_first":
        return float(entropies[0])
    return float(sum(entropies) / len(entropies))
