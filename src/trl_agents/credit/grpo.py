"""GRPO and Dr. GRPO advantages: the episode return, normalised within the group, on every step of the episode.

GRPO (Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300), as TRL computes it (`scale_rewards="group"`):

    A_i = (R_i − mean_j R_j) / (std_j R_j + 1e-4)        std: Bessel-corrected

Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783) removes the std
(`scale="none"`, TRL `scale_rewards="none"`, verl `norm_adv_by_std_in_grpo=False`):

    A_i = R_i − mean_j R_j

Agent form (verl-agent `adv_estimator=grpo`): every step row of episode i gets A_i.
"""

from __future__ import annotations

from ..trajectory import Group
from .base import StepAdvantages, check_choice, check_group, episode_advantages, register_estimator


@register_estimator("grpo")
def grpo_advantages(
    group: Group,
    *,
    scale: str = "group",
    statistic: str = "trajectories",
    invalid_penalty: float = 0.1,
    eps: float = 1e-4,
) -> StepAdvantages:
    """GRPO (z-score) or Dr. GRPO (centred only) advantage of each episode, broadcast to its steps.

    Args:
        group: The healthy trajectories of one task.
        scale: "group": A = (R − μ)/(σ + ε) with Bessel std (GRPO / TRL); "none": A = R − μ (Dr. GRPO).
        statistic: "trajectories" (default, TRL): μ, σ over the n episode returns, then the invalid-action penalty
            is subtracted: A_{i,t} = norm(R_i) − λ·[invalid]. "step_rows" (verl-agent): μ, σ over one score
            s_{i,t} = R_i − λ·[invalid] per step row (longer episodes weigh more), A_{i,t} = norm(s_{i,t}).
            See docs/methods/grpo.md#equations and `trl_agents.credit.base`.
        invalid_penalty: λ, for steps with `valid=False` (verl-agent default 0.1).
        eps: ε added to the std (TRL: 1e-4).

    Returns:
        One list per trajectory, one advantage per step. A group of one episode gets 0 (plus the penalty): its
        deviation from its own mean is 0 and its std is taken as 0.

    Example:
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> group = Group(task={}, trajectories=[
        ...     Trajectory(task={}, steps=[Step("s", "a", reward=0.0), Step("s'", "b", reward=r)]) for r in (1, 0, 0, 1)
        ... ])
        >>> [[round(a, 4) for a in row] for row in grpo_advantages(group)]  # mean 0.5, std 0.5774
        [[0.8659, 0.8659], [-0.8659, -0.8659], [-0.8659, -0.8659], [0.8659, 0.8659]]
        >>> grpo_advantages(group, scale="none")[:2]
        [[0.5, 0.5], [-0.5, -0.5]]
    """
    check_choice("scale", scale, ("group", "none"))
    check_group(group, invalid_penalty)
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    return episode_advantages(
        group, scale=scale == "group", statistic=statistic, invalid_penalty=invalid_penalty, eps=eps
    )
