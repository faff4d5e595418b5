"""GRPO and Dr. GRPO advantages: the episode return, normalised within the group, on every step of the episode.

GRPO (Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300), as TRL computes it (`scale_rewards="group"`):

    A_i = (R_i − mean_j R_j) / (std_j R_j + 1e-4)        std: Bessel-corrected

Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783) removes the std
(`scale="none"`, TRL `scale_rewards="none"`, verl `norm_adv_by_std_in_grpo=False`):

    A_i = R_i − mean_j R_j

Agent form (verl-agent `adv_estimator=grpo`): every step row of episode i gets A_i.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..trajectory import Group
from .base import (STATISTICS, CreditParams, Stats, StepAdvantages, check_choice, check_group, check_positive,
                   episode_advantages, register_estimator, runtime_field)

GRPO_EPS = 1e-4  # TRL's ε in (R − μ)/(σ + ε)


@dataclass(frozen=True, kw_only=True)
class GRPOOutcomeParams(CreditParams):
    """GRPO's settings (config fields of `AgentGRPOConfig`), for `grpo_advantages` and the estimators that add to
    GRPO's episode advantage (`episode_advantages`).

    Attributes:
        scale_rewards: "group": A = (R − μ)/(σ + ε) with Bessel std (GRPO / TRL); "none": A = R − μ (Dr. GRPO).
        credit_statistic: "trajectories" (default, TRL): μ, σ over the n episode returns, then the invalid-action
            penalty is subtracted: A_{i,t} = norm(R_i) − λ·[invalid]. "step_rows" (verl-agent): μ, σ over one score
            s_{i,t} = R_i − λ·[invalid] per step row (longer episodes weigh more), A_{i,t} = norm(s_{i,t}).
            See docs/methods/grpo.md#equations and `trl_agents.credit.base`.
        invalid_action_penalty: λ, for steps with `valid=False` (verl-agent default 0.1).
    """

    scale_rewards: str = "group"
    credit_statistic: str = "trajectories"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("scale", self.scale_rewards, ("group", "none"))
        check_choice("statistic", self.credit_statistic, STATISTICS)

    def episode_advantages(self, group: Group, eps: float = GRPO_EPS) -> StepAdvantages:
        """GRPO's advantages of one group with these settings (ε: TRL's 1e-4); it rejects non-finite rewards."""
        check_group(group)
        return episode_advantages(
            group, scale=self.scale_rewards == "group", statistic=self.credit_statistic,
            invalid_penalty=self.invalid_action_penalty, eps=eps,
        )


@dataclass(frozen=True, kw_only=True)
class GRPOParams(GRPOOutcomeParams):
    """Settings of `grpo_advantages`: GRPO's (`GRPOOutcomeParams`), and `eps`, the ε added to the std (TRL: 1e-4;
    not a config field)."""

    eps: float = runtime_field(GRPO_EPS)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("eps", self.eps)


@register_estimator("grpo", GRPOParams)
def grpo_advantages(groups: Sequence[Group], params: GRPOParams) -> tuple[list[StepAdvantages], Stats]:
    """GRPO (z-score) or Dr. GRPO (centred only) advantage of each episode, broadcast to its steps.

    Returns:
        (advantages, stats): per group, one list per trajectory, one advantage per step; no stats. A group of one
        episode gets 0 (plus the penalty): its deviation from its own mean is 0 and its std is taken as 0.

    Example:
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> group = Group(task={}, trajectories=[
        ...     Trajectory(task={}, steps=[Step("s", "a", reward=0.0), Step("s'", "b", reward=r)]) for r in (1, 0, 0, 1)
        ... ])
        >>> (advantages,), _ = grpo_advantages([group], GRPOParams())
        >>> [[round(a, 4) for a in row] for row in advantages]  # mean 0.5, std 0.5774
        [[0.8659, 0.8659], [-0.8659, -0.8659], [-0.8659, -0.8659], [0.8659, 0.8659]]
        >>> grpo_advantages([group], GRPOParams(scale_rewards="none"))[0][0][:2]
        [[0.5, 0.5], [-0.5, -0.5]]
    """
    return [params.episode_advantages(group, params.eps) for group in groups], {}
