"""BPO advantages: leave-one-out credit among the siblings of a branch point of a rollout tree.

BPO (Branching Policy Optimization; He, Chen, Zhang, Liu 2026, "Branching Policy Optimization: Sandbox-Native
Language Agent Reinforcement Learning", arXiv 2607.14171; no code released). A branching topology rolls a backbone
episode, restores the environment snapshot taken before a chosen step b, and samples K − 1 other actions there, each
rolled out to the end. The K paths that leave that state (the parent's own continuation and its children forked at
b) are siblings: they share the prefix steps[:b] exactly, so comparing their returns removes the variance the prefix
explains. With R_i the return of path i (`episode_return`, the whole root-to-leaf path; the paper's equation numbers
are not known to us):

    S(p, b)   = {p} ∪ {c : parent(c) = p, fork_step(c) = b},   K = |S| ≥ 2          sibling set of a branch point
    A_i^S     = R_i − 1/(K−1)·Σ_{j∈S, j≠i} R_j                 (Σ_{i∈S} A_i^S = 0)  sibling leave-one-out advantage
    A^B_r     = ω_B·(R_r − 1/(n_B−1)·Σ_{r'≠r} R_r')           over the n_B roots (backbones) of the group
    A_{i,t}   = Σ_{S ∋ i, b_S ≤ t} A_i^S  +  [i is a root]·A^B_i  −  λ_inv·[invalid_{i,t}]·[t ≥ fork_step(i)]

A path in several sibling sets (a backbone branched at several steps, or a child that was itself branched) adds up
its contributions. The backbone term ω_B·A^B (`backbone_weight`) compares the backbones of one task with each other
when the topology rolls several (`num_generations` of them); it is our choice, 0 with a single backbone. A group
without any branch (independent episodes) is all backbones: BPO then is RLOO scaled by ω_B.

Tree rows and the sum rule. Every trajectory's `steps` is its full root-to-leaf path, and `bpo_advantages` returns,
for every trajectory, one value per step of that path: the path's contribution. The row builder trains each `Step`
object once, with the SUM of the values of every path that contains it — what treating each path as its own
sequence gives at importance ratio 1. Two consequences:

* The invalid-action penalty is charged by the trajectory that owns the step (t ≥ `fork_step`) only, so a shared
  invalid step is penalised once, not once per path through it.
* No prefix propagation. The paper (as described) also gives a shared-prefix step d actions before b the value
  λ^d·A_i^S on every sibling's path (λ = 0.95). Leave-one-out values sum to 0 over a sibling set and all K siblings
  hold the same prefix steps, so under the sum rule that step would be trained with Σ_{i∈S} λ^d·A_i^S = 0 from the
  set, whatever λ: the propagation cannot change what is trained, and we do not compute it (there is no λ to set).
  What a set does pass on is the comparison at the branch point itself: the action at step b of each sibling is its
  own step and gets A_i^S. The shared prefix learns from the backbone term (several backbones per task) and from
  the sets of earlier branch points.

Example (a backbone branched once at step 2 into K = 4 siblings with returns [1, 0, 0, 1]: A^S = ±2/3 on step 2; the
shared steps 0 and 1 get 0 from the set — the paper's per-path λ^d·A^S, ±0.6333 and ±0.6017, sum to 0 over the four
paths — and from the single backbone):
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> prefix = [Step("s0", "a"), Step("s1", "b")]
    >>> paths = [
    ...     Trajectory(task={}, steps=prefix + [Step("s2", "c", reward=r)], episode_id=i,
    ...                parent_id=None if i == 0 else 0, fork_step=0 if i == 0 else 2)
    ...     for i, r in enumerate((1, 0, 0, 1))
    ... ]
    >>> sibling_sets(Group(task={}, trajectories=paths))
    [SiblingSet(parent_id=0, fork_step=2, members=(0, 1, 2, 3))]
    >>> (advantages,), _ = bpo_advantages([Group(task={}, trajectories=paths)], BPOParams())
    >>> [[round(a, 4) for a in row] for row in advantages]
    [[0.0, 0.0, 0.6667], [0.0, 0.0, -0.6667], [0.0, 0.0, -0.6667], [0.0, 0.0, 0.6667]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..trajectory import Group
from .base import CreditParams, Stats, StepAdvantages, batch_result, check_group, register_estimator

BPO_METRICS = ("num_sibling_sets", "mean_siblings", "zero_advantage_set_fraction", "mean_fork_step")
BPO_STATS = (*BPO_METRICS, "mean_abs_sibling_advantage", "num_backbones", "num_branches")


@dataclass(frozen=True)
class SiblingSet:
    """The K ≥ 2 paths that leave one state of a rollout tree: a parent's continuation and its children forked there.

    Args:
        parent_id: `episode_id` of the trajectory the children forked from.
        fork_step: The branch point b: the siblings share `steps[:b]` and differ from step b on.
        members: The sibling episode ids, ascending: the parent (when it is in the group) and its children forked
            at `fork_step`.
    """

    parent_id: int
    fork_step: int
    members: tuple[int, ...]

    @property
    def size(self) -> int:
        """K, the number of siblings."""
        return len(self.members)


def leave_one_out(returns: Sequence[float]) -> list[float]:
    """A_i = R_i − mean_{j≠i} R_j for each value (0 for fewer than two values). The values sum to 0.

    Computed on deviations from the first value, so equal values give exactly 0.

    >>> [round(a, 4) for a in leave_one_out([1.0, 0.0, 0.0, 1.0])]  # 1 − (0 + 0 + 1)/3, 0 − (1 + 0 + 1)/3
    [0.6667, -0.6667, -0.6667, 0.6667]
    """
    n = len(returns)
    if n < 2:
        return [0.0] * n
    shift = returns[0]
    deviations = [r - shift for r in returns]
    total = sum(deviations)
    return [d - (total - d) / (n - 1) for d in deviations]


def sibling_sets(group: Group) -> list[SiblingSet]:
    """The sibling sets of a tree group, sorted by (parent_id, fork_step); [] when no trajectory forked.

    For every (parent p, fork step b) with at least one child forked from p at b, the set holds p and those
    children. A parent missing from the group (dropped as infrastructure-failed) leaves its children, if two or
    more, as a set of their own — they still left the same state — our choice. Sets of one path are not sets.

    Raises:
        ValueError: on episode ids that repeat in a tree group, a trajectory listed as its own parent, or a
            `fork_step` outside its path (or longer than its parent's path).
    """
    if not group.is_tree:
        return []
    by_id = {}
    for traj in group.trajectories:
        if traj.episode_id in by_id:
            raise ValueError(
                f"episode_id {traj.episode_id} appears twice in the tree group of task {group.task_id}; tree "
                "topologies must give every trajectory of a group its own episode_id"
            )
        by_id[traj.episode_id] = traj
    children: dict[tuple[int, int], list[int]] = {}
    for traj in group.trajectories:
        if not 0 <= traj.fork_step <= len(traj.steps):
            raise ValueError(
                f"episode {traj.episode_id} has fork_step {traj.fork_step} but {len(traj.steps)} steps; fork_step "
                "must be within 0..len(steps)"
            )
        if traj.parent_id is None:
            continue
        if traj.parent_id == traj.episode_id:
            raise ValueError(f"episode {traj.episode_id} names itself as parent_id; a fork needs another parent")
        parent = by_id.get(traj.parent_id)
        if parent is not None and traj.fork_step > len(parent.steps):
            raise ValueError(
                f"episode {traj.episode_id} forked at step {traj.fork_step} from episode {traj.parent_id}, which has "
                f"{len(parent.steps)} steps; fork_step must be at most the parent's number of steps"
            )
        children.setdefault((traj.parent_id, traj.fork_step), []).append(traj.episode_id)
    sets = []
    for (parent_id, fork_step), kids in sorted(children.items()):
        members = sorted(kids + ([parent_id] if parent_id in by_id else []))
        if len(members) >= 2:
            sets.append(SiblingSet(parent_id=parent_id, fork_step=fork_step, members=tuple(members)))
    return sets


@dataclass(frozen=True, kw_only=True)
class BPOParams(CreditParams):
    """Settings of `bpo_advantages` (config fields of `BPOConfig`).

    Attributes:
        bpo_backbone_weight: ω_B ≥ 0, weight of the leave-one-out advantage among the group's roots, given to every
            step of a root's path (our choice, 1.0; 0 with a single root).
        invalid_action_penalty: λ_inv, subtracted on invalid steps by the trajectory that owns them (t ≥ fork_step)
            only (default 0 here).
    """

    invalid_action_penalty: float = 0.0
    bpo_backbone_weight: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        weight = self.bpo_backbone_weight
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"backbone_weight must be a finite number >= 0, got {weight}")


@register_estimator("bpo", BPOParams, metrics=BPO_METRICS)
def bpo_advantages(groups: Sequence[Group], params: BPOParams) -> tuple[list[StepAdvantages], Stats]:
    """BPO advantages for every step of every path of every group (a tree, via `parent_id` / `fork_step`, or
    independent episodes).

    Returns:
        (advantages, stats): per group, for every trajectory (same order), one value per step of its full path — its
        contribution under the sum rule; stats over all groups (per group, then averaged): "num_sibling_sets",
        "mean_siblings" (K per set), "zero_advantage_set_fraction" (sets whose returns are all equal: no signal),
        "mean_fork_step" (b per set), "mean_abs_sibling_advantage" (|A_i^S| per membership), "num_backbones"
        (roots), "num_branches" (forked trajectories); all 0 for an empty group. A trainer logs the first four.
    """
    return batch_result((_bpo_group(group, params) for group in groups), BPO_STATS)


def _bpo_group(group: Group, params: BPOParams) -> tuple[StepAdvantages, dict[str, float]]:
    """BPO on one group: the per-path values and the group's diagnostics."""
    check_group(group)
    backbone_weight, invalid_penalty = params.bpo_backbone_weight, params.invalid_action_penalty
    trajectories = group.trajectories
    values = [[0.0] * len(traj.steps) for traj in trajectories]
    sets = sibling_sets(group)
    row_of = {traj.episode_id: row for row, traj in enumerate(trajectories)} if sets else {}

    # Sibling sets, in (parent_id, fork_step) order, so that a path's sum does not depend on the group's order.
    zero_sets, abs_sum = 0, 0.0
    for sibling_set in sets:
        rows = [row_of[member] for member in sibling_set.members]
        returns = [trajectories[row].episode_return for row in rows]
        zero_sets += all(r == returns[0] for r in returns)
        b = sibling_set.fork_step
        for row, a in zip(rows, leave_one_out(returns), strict=True):  # A_i^S = R_i − mean_{j≠i} R_j
            abs_sum += abs(a)
            path = values[row]
            for t in range(b, len(path)):
                path[t] += a  # the branch action and everything after it: A_i^S (the shared prefix: nothing)

    # Backbone term: leave-one-out among the roots (by episode_id), ω_B·A^B_r on every step of a root's path.
    roots = sorted(
        (row for row, traj in enumerate(trajectories) if traj.parent_id is None),
        key=lambda row: trajectories[row].episode_id,
    )
    if backbone_weight:
        for row, a in zip(roots, leave_one_out([trajectories[r].episode_return for r in roots]), strict=True):
            values[row] = [v + backbone_weight * a for v in values[row]]

    # Invalid-action penalty, charged once: by the owner of the step (t ≥ fork_step).
    for traj, path in zip(trajectories, values, strict=True):
        for t in range(traj.fork_step, len(path)):
            if not traj.steps[t].valid:
                path[t] -= invalid_penalty

    num_sets = len(sets)
    memberships = sum(s.size for s in sets)
    stats = {
        "num_sibling_sets": num_sets,
        "mean_siblings": memberships / num_sets if num_sets else 0.0,
        "zero_advantage_set_fraction": zero_sets / num_sets if num_sets else 0.0,
        "mean_fork_step": sum(s.fork_step for s in sets) / num_sets if num_sets else 0.0,
        "mean_abs_sibling_advantage": abs_sum / memberships if memberships else 0.0,
        "num_backbones": len(roots),
        "num_branches": len(trajectories) - len(roots),
    }
    return values, stats
