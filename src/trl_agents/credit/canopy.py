"""CANOPY: size each task's group until it carries signal; credit is GRPO's z-score over the healthy episodes.

CANOPY (Coverage-ANchored On-PolicY RL; Pu, Li, Liu, Cao, Yang 2026, "Explore More, Drift Less: Outcome-Only
Reinforcement Learning Can Suffice for Long-Horizon Interactive Agents", arXiv 2609.01245; reference code
github.com/AlibabaResearch/CANOPY-RL) adds no loss term. It is a recipe: sample enough episodes per task that the
group mixes outcomes, train strictly on-policy (one update per rollout batch) with a small KL anchor to the initial
model and the loss on the agent's own action tokens only, and remove infrastructure-failed episodes. The trainer
holds the on-policy / KL / masking part; the `adaptive` topology (`rollout/topologies/adaptive.py`) holds the
arithmetic of coverage (P_sig, the group size for a coverage target, whether a group carries signal, the coverage
diagnostics); this file holds the credit.

The advantage is GRPO's (`trl_agents.credit.grpo`, `scale_rewards="group"`): A_i = (R_i − μ)/(σ + ε) over the group's
healthy episodes. Infrastructure-failed episodes (`Trajectory.error` set: the env crashed, hung or timed out) are
REMOVED from the statistic and from training (`failed_episodes="drop"`, the paper's wording). The reference code
instead keeps a placeholder sample with reward 0 and no loss tokens (`failed_episodes="zero"`): it trains nothing,
but its 0 enters μ and σ and pulls the baseline of a group with successes down. Agent-caused ends (turn or context
limit) are not failures: they keep their reward 0 and are scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..rollout.topologies.adaptive import carries_signal
from ..trajectory import Group, Trajectory
from .base import (CreditParams, Stats, StepAdvantages, batch_result, check_choice, check_positive, register_estimator,
                   runtime_field)
from .grpo import GRPOOutcomeParams

FAILED_EPISODES = ("drop", "zero")


# ---- credit --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CANOPYParams(CreditParams):
    """Settings of `canopy_advantages` (config fields of `CANOPYConfig`).

    Attributes:
        invalid_action_penalty: λ, subtracted after normalisation on steps with `valid=False` (CANOPY uses none: 0).
        failed_episodes: "drop" (default, the paper's wording): failed episodes are left out of μ and σ. "zero": as
            the reference code, each failed episode counts as a return of 0 in μ and σ (its placeholder sample has
            no loss tokens); it needs the groups with their failed episodes. Not a config field.
        eps: ε added to the Bessel std (TRL: 1e-4); not a config field.
    """

    invalid_action_penalty: float = 0.0
    failed_episodes: str = runtime_field("drop")
    eps: float = runtime_field(1e-4)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("failed_episodes", self.failed_episodes, FAILED_EPISODES)
        check_positive("eps", self.eps)


@register_estimator("canopy", CANOPYParams, metrics=())
def canopy_advantages(groups: Sequence[Group], params: CANOPYParams) -> tuple[list[StepAdvantages], Stats]:
    """GRPO z-score advantages over the healthy episodes of each group, plus whether the group carried signal.

    The trainer passes healthy episodes only; failed ones passed here get 0 on every step (they are not trained).

    Returns:
        (advantages, stats): per group, one list per trajectory (same order), one value per step; and the stats,
        per group then averaged over the groups: "carries_signal" (1.0 or 0.0), "healthy_episodes",
        "failed_episodes". A trainer logs none of them (the `adaptive` topology logs the coverage).

    Example (returns [1, 0] and one infrastructure failure):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(r, error=None):
        ...     return Trajectory(task={}, steps=[Step("s", "a", reward=r)], error=error)
        >>> group = Group(task={}, trajectories=[episode(1.0), episode(0.0), episode(0.0, error="env timeout")])
        >>> (advantages,), _ = canopy_advantages([group], CANOPYParams())
        >>> [[round(a, 4) for a in row] for row in advantages]  # over [1, 0]: ±0.5 / (0.7071 + 1e-4)
        [[0.707], [-0.707], [0.0]]
        >>> (advantages,), _ = canopy_advantages([group], CANOPYParams(failed_episodes="zero"))  # over [1, 0, 0]
        >>> [[round(a, 4) for a in row] for row in advantages]
        [[1.1545], [-0.5773], [0.0]]
    """
    names = ("carries_signal", "healthy_episodes", "failed_episodes")
    return batch_result((_canopy_group(group, params) for group in groups), names)


def _canopy_group(group: Group, params: CANOPYParams) -> tuple[StepAdvantages, dict[str, float]]:
    """CANOPY on one group: its advantages and its diagnostics."""
    failed_episodes = params.failed_episodes
    if failed_episodes == "drop":
        scored = [traj for traj in group.trajectories if not traj.failed]
    else:  # a stand-in without steps: return 0 in the statistic, nothing to train
        scored = [Trajectory(task=traj.task) if traj.failed else traj for traj in group.trajectories]
    population = Group(task=group.task, trajectories=scored)
    grpo = GRPOOutcomeParams(invalid_action_penalty=params.invalid_action_penalty)  # z-score over trajectories
    rows = iter(grpo.episode_advantages(population, params.eps))
    advantages: StepAdvantages = []
    for traj in group.trajectories:
        if traj.failed:
            if failed_episodes == "zero":
                next(rows)
            advantages.append([0.0] * len(traj.steps))
        else:
            advantages.append(next(rows))
    failed = sum(traj.failed for traj in group.trajectories)
    stats = {
        "carries_signal": float(carries_signal(group)),
        "healthy_episodes": len(group) - failed,
        "failed_episodes": failed,
    }
    return advantages, stats
