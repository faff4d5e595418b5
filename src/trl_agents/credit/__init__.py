"""Credit assignment: per-step advantages for the trajectories of one group (one task).

Every estimator is a pure function `estimator(group, **options) -> StepAdvantages` (one list per trajectory, one
advantage per step), also reachable by name through `get_estimator("grpo" | "rloo" | "gigpo")`.

Example:
    >>> from trl_agents.credit import get_estimator
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> group = Group(task={}, trajectories=[Trajectory(task={}, steps=[Step("s", "a", reward=r)]) for r in (1, 0)])
    >>> get_estimator("rloo")(group)
    [[1.0], [-1.0]]
"""

from .base import CREDIT_ESTIMATORS, StepAdvantages, discounted_returns, get_estimator, register_estimator
from .gigpo import gigpo_advantages, gigpo_advantages_with_stats
from .grpo import grpo_advantages
from .rloo import rloo_advantages

__all__ = [
    "CREDIT_ESTIMATORS",
    "StepAdvantages",
    "discounted_returns",
    "get_estimator",
    "gigpo_advantages",
    "gigpo_advantages_with_stats",
    "grpo_advantages",
    "register_estimator",
    "rloo_advantages",
]
