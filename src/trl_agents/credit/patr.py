"""PATR: GRPO over the B leaves of a process-scorer guided rollout tree.

PATR (process-scorer guided adaptive tree rollout; Li, Li, Zhang, …, Shang 2026, arXiv 2607.15610;
docs/methods/patr.md). A budget of B leaves per task; a frontier of partial trajectories started from n₀ roots. After
every turn a process scorer gives each active partial trajectory h a score q(h) ∈ [0, 1]; the best-scored ones are
expanded into b children (forks from an environment snapshot, the prefix shared), the middle ones go on with one
child, and a path is pruned only when it is degenerate; a pruned path is kept in the group as a failed leaf. The
tree's leaves are then trained with standard GRPO on the task reward:

    R_ℓ   = episode return of leaf ℓ's root-to-leaf path;  R_ℓ = r_prune (0) when ℓ was pruned        [P, S]
    A_ℓ   = (R_ℓ − mean_ℓ' R_ℓ') / (std_ℓ' R_ℓ' + ε)   over the B leaves, Bessel std, ε = 1e-4      [P: GRPO]
    A_ℓ,t = A_ℓ on every step t of ℓ's path − λ_inv·[step t invalid and owned by ℓ]                 [D]

Tree rows train a shared step once with the sum of the A_ℓ of the leaves through it (docs/topologies.md), which is
what training every leaf's path as its own sequence gives at importance ratio 1 ("shared-prefix tokens once per
leaf"). Since Σ_ℓ A_ℓ = 0, a step shared by every leaf of the tree (the root's first steps) gets 0 net.

The process scores q ∈ [0, 1] (the solver's progress, a judge, a reward model) are the process scorers of
`trl_agents/judges.py` (`solver_progress`, `SolverProgressScorer`, `JudgeScorer`, `RewardModelScorer`,
`CallableScorer`); the expansion and pruning rules, and the `PRUNED` / `SCORE` marks they leave on the steps, are the
`patr` topology's (`rollout/topologies/patr.py`). This file holds the credit.

Guards: an empty group gives []; a single leaf, or leaves with equal returns, give 0 (no NaN: the std of fewer than
two values is 0 and equal values are centred exactly); non-finite rewards and scores are refused (scores: None).

Example (B = 4 leaves, one of them pruned; the returns 1, 0, 1 and the pruned 0):
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> root = [Step("s0", "a")]
    >>> leaves = [Trajectory(task={}, steps=root + [Step("s1", "b", reward=r)], episode_id=i,
    ...                      parent_id=None if i == 0 else 0, fork_step=0 if i == 0 else 1)
    ...           for i, r in enumerate((1.0, 0.0, 1.0, 0.0))]
    >>> leaves[3].steps[-1].signals[PRUNED] = "low_score"
    >>> (advantages,), _ = patr_advantages([Group(task={}, trajectories=leaves)], PATRParams())
    >>> [round(a[0], 4) for a in advantages]  # mean 0.5, std 0.5774
    [0.8659, -0.8659, 0.8659, -0.8659]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..rollout.topologies.patr import PRUNED
from ..trajectory import Group, Trajectory
from .base import (CreditParams, Stats, StepAdvantages, batch_result, check_choice, check_group, check_positive,
                   mean_std, normalize, register_estimator, runtime_field)

PATR_STATS = ("num_leaves", "pruned_fraction", "zero_signal", "num_forks", "mean_fork_step", "success_rate")


# ---- GRPO over the leaves -----------------------------------------------------------------------------------------


def leaf_return(trajectory: Trajectory, pruned_return: float = 0.0) -> float:
    """R_ℓ: the path's return, or `pruned_return` when the path was pruned (its last step carries `PRUNED`)."""
    if trajectory.steps and trajectory.steps[-1].signals.get(PRUNED):
        return float(pruned_return)
    return trajectory.episode_return


@dataclass(frozen=True, kw_only=True)
class PATRParams(CreditParams):
    """Settings of `patr_advantages` (config fields of `PATRConfig`).

    Attributes:
        scale_rewards: "group": z-score (GRPO, TRL's `scale_rewards="group"`); "none": centred only (Dr. GRPO).
        patr_pruned_return: R of a pruned leaf (PATR: failures are kept with reward 0).
        invalid_action_penalty: λ_inv, subtracted on invalid steps by the leaf that owns them (t ≥ fork_step) only,
            so a shared invalid step is charged once (default 0 here).
        eps: ε added to the std (TRL: 1e-4); not a config field.
    """

    invalid_action_penalty: float = 0.0
    scale_rewards: str = "group"
    patr_pruned_return: float = 0.0
    eps: float = runtime_field(1e-4)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("scale", self.scale_rewards, ("group", "none"))
        if not math.isfinite(self.patr_pruned_return):
            raise ValueError(f"pruned_return must be finite, got {self.patr_pruned_return}")
        check_positive("eps", self.eps)


@register_estimator("patr", PATRParams)
def patr_advantages(groups: Sequence[Group], params: PATRParams) -> tuple[list[StepAdvantages], Stats]:
    """GRPO over the leaves of each task's tree (module docstring), plus diagnostics.

    Each group holds the healthy leaves of one task (each trajectory a root-to-leaf path; `parent_id` / `fork_step`).

    Returns:
        (advantages, stats): per group, one value per step of each leaf's full path; stats per group, then averaged
        over the groups: "num_leaves", "pruned_fraction", "zero_signal" (1 when every leaf returned the same),
        "num_forks", "mean_fork_step" (over forked leaves), "success_rate"; all 0 for an empty group.
    """
    return batch_result((_patr_group(group, params) for group in groups), PATR_STATS)


def _patr_group(group: Group, params: PATRParams) -> tuple[StepAdvantages, dict[str, float]]:
    """PATR on one group: its advantages and its diagnostics."""
    check_group(group)
    pruned_return, invalid_penalty, eps = params.patr_pruned_return, params.invalid_action_penalty, params.eps
    leaves = group.trajectories
    returns = [leaf_return(t, pruned_return) for t in leaves]
    mean, std = mean_std(returns)  # Bessel std; 0 for one leaf; exact 0 deviations for equal returns
    values = normalize(returns, mean, std, scale=params.scale_rewards == "group", eps=eps)  # A_ℓ = (R_ℓ − μ)/(σ + ε)
    advantages = []
    for a, leaf in zip(values, leaves, strict=True):
        path = [a] * len(leaf.steps)  # A_ℓ on every step of the path, shared prefix included
        for t in range(leaf.fork_step, len(path)):
            if not leaf.steps[t].valid:
                path[t] -= invalid_penalty  # charged by the owner only
        advantages.append(path)
    forks = [t for t in leaves if t.parent_id is not None]
    pruned = sum(bool(t.steps and t.steps[-1].signals.get(PRUNED)) for t in leaves)
    stats = {
        "num_leaves": float(len(leaves)),
        "pruned_fraction": pruned / len(leaves) if leaves else 0.0,
        "zero_signal": float(bool(leaves) and all(r == returns[0] for r in returns)),
        "num_forks": float(len(forks)),
        "mean_fork_step": sum(t.fork_step for t in forks) / len(forks) if forks else 0.0,
        "success_rate": sum(t.success for t in leaves) / len(leaves) if leaves else 0.0,
    }
    return advantages, stats
