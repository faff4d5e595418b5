"""`branching`: fork K siblings from environment snapshots at chosen steps of backbone episodes (BPO, arXiv
2607.14171; docs/methods/bpo.md).

Phase 1 plays `num_generations` backbone episodes per task, recording an environment snapshot before every action.
Phase 2 ranks the steps of every healthy backbone by `score` and, at its `branch_points` best steps (ties: the
earliest), forks `branch_factor − 1` new episodes from the snapshot taken before that step: each samples its own
action there and plays to the end. With the backbone's own continuation they are the K = `branch_factor` siblings
of that branch point. The shared prefix (the backbone's steps before the branch point) is generated once and
recorded once: the siblings hold the same `Step` objects (`Trajectory.parent_id`, `fork_step`). All forks of all
tasks run together, one generation call per turn.

Scores (how "decisive" a step is):

* `"entropy_mean"`: the mean per-token entropy of the policy over the step's action tokens (model signal
  `entropy`, one batched no-grad forward over the backbones' recorded steps);
* `"entropy_first"`: the entropy of the action's first token;
* `"random"`: uniformly random steps (seeded), a control.

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
from .base import Fork, Launch, Request, RolloutView, Topology

BRANCH_SCORES = ("entropy_mean", "entropy_first", "random")


class BranchingTopology(Topology):
    """Backbones, then `branch_factor − 1` forks at each of the `branch_points` best steps of every backbone.

    Args:
        branch_points: Branch points per backbone (fewer when the backbone has fewer steps).
        branch_factor: K, siblings per branch point including the backbone's own continuation (>= 2).
        score: How steps are ranked (`BRANCH_SCORES`).
        seed: Seed of the `"random"` score.
    """

    name = "branching"
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
        self._rng = random.Random(seed)
        self._phase = "backbones"
        self._forked = 0

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        self._phase, self._forked = "backbones", 0
        return [Launch(index, num_generations) for index in range(len(tasks))]

    def when_idle(self, view: RolloutView) -> list[Request]:
        if self._phase != "backbones":
            return []
        self._phase = "branches"
        backbones = [(index, t) for index, group in enumerate(view.groups) for t in group.trajectories
                     if t.parent_id is None and not t.failed and t.steps]
        if self.model_signals:
            view.compute_signal("entropy", [t for _, t in backbones])
        requests = []
        for index, backbone in backbones:
            for step in self.branch_steps(backbone):
                requests.append(Fork(index, backbone.episode_id, step, self.branch_factor - 1))
        self._forked = len(requests)
        return requests

    def branch_steps(self, backbone: Trajectory) -> list[int]:
        """The steps of `backbone` to branch at: the `branch_points` highest scores (ties: the earliest step), among
        the steps that have a snapshot, in step order."""
        candidates = [t for t, step in enumerate(backbone.steps) if step.snapshot is not None]
        if self.score == "random":
            chosen = self._rng.sample(candidates, min(self.branch_points, len(candidates)))
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
            "branch_points_per_task": self._forked / len(groups),
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
