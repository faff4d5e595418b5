"""RLOO advantages: each episode's return minus the mean return of the OTHER episodes of its group.

REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740; TRL `RLOOTrainer`):

    A_i = R_i − 1/(n−1) · Σ_{j≠i} R_j          (= n/(n−1) · (R_i − mean_j R_j),  Σ_i A_i = 0)

broadcast to every step of episode i. The baseline is over trajectories, so the invalid-action penalty is subtracted
afterwards: A_{i,t} = A_i − λ·[invalid_{i,t}] (see `trl_agents.credit.base`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..trajectory import Group
from .base import CreditParams, StepAdvantages, Stats, broadcast_to_steps, check_group, register_estimator


@dataclass(frozen=True, kw_only=True)
class RLOOParams(CreditParams):
    """Settings of `rloo_advantages`: `invalid_action_penalty` λ, subtracted after the baseline on steps with
    `valid=False`."""


@register_estimator("rloo", RLOOParams)
def rloo_advantages(groups: Sequence[Group], params: RLOOParams) -> tuple[list[StepAdvantages], Stats]:
    """Leave-one-out baseline advantage of each episode, broadcast to its steps.

    Returns:
        (advantages, stats): per group, one list per trajectory, one advantage per step; no stats. A group of one
        episode has no other episode to compare with: its advantage is 0 (plus the penalty).

    Example:
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> group = Group(task={}, trajectories=[
        ...     Trajectory(task={}, steps=[Step("s", "a", reward=r)]) for r in (1, 0, 0, 1)
        ... ])
        >>> (advantages,), _ = rloo_advantages([group], RLOOParams())
        >>> [[round(a, 4) for a in row] for row in advantages]  # 1 − (0+0+1)/3, 0 − (1+0+1)/3
        [[0.6667], [-0.6667], [-0.6667], [0.6667]]
    """
    advantages = []
    for group in groups:
        check_group(group)
        trajectories = group.trajectories
        n = len(trajectories)
        if n < 2:
            baseline_advantages = [0.0] * n
        else:
            # Work on deviations from the first return so that equal returns give exactly 0.
            shift = trajectories[0].episode_return
            deviations = [traj.episode_return - shift for traj in trajectories]
            total = sum(deviations)
            baseline_advantages = [d - (total - d) / (n - 1) for d in deviations]  # R_i − mean_{j≠i} R_j
        advantages.append(broadcast_to_steps(baseline_advantages, group, params.invalid_action_penalty))
    return advantages, {}
