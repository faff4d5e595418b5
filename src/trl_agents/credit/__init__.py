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

from .base import (
    CREDIT_ESTIMATORS,
    StepAdvantages,
    anchor_key,
    canonical_action,
    discounted_returns,
    get_estimator,
    normalize_text,
    register_estimator,
)
from .bepo import BellmanCredit, bellman_credit, bepo_advantages, bepo_advantages_with_stats
from .bipace import bipace_advantages, bipace_advantages_with_stats, greedy_cosine_clusters, pace_step_advantages
from .bpo import SiblingSet, bpo_advantages, bpo_advantages_with_stats, sibling_sets
from .canopy import (
    canopy_advantages,
    canopy_advantages_with_stats,
    carries_signal,
    coverage_stats,
    group_size_for_coverage,
    signal_probability,
)
from .cast import cast_advantages, cast_advantages_with_stats
from .ecpo import AnchorEvidence, anchor_evidence, ecpo_advantages, ecpo_advantages_with_stats
from .gigpo import gigpo_advantages, gigpo_advantages_with_stats
from .grpo import grpo_advantages
from .progpo import progpo_advantages, progpo_parts
from .rloo import rloo_advantages
from .scpo import get_scorer, register_scorer, scpo_advantages, scpo_advantages_with_stats
from .sspo import StateScoreTable, sspo_advantages, sspo_advantages_with_stats
from .vict import trace_proof_edges, vict_advantages, vict_advantages_with_stats

__all__ = [
    "CREDIT_ESTIMATORS",
    "AnchorEvidence",
    "BellmanCredit",
    "SiblingSet",
    "StateScoreTable",
    "StepAdvantages",
    "anchor_evidence",
    "anchor_key",
    "bellman_credit",
    "bepo_advantages",
    "bepo_advantages_with_stats",
    "bipace_advantages",
    "bipace_advantages_with_stats",
    "bpo_advantages",
    "bpo_advantages_with_stats",
    "canonical_action",
    "canopy_advantages",
    "canopy_advantages_with_stats",
    "carries_signal",
    "cast_advantages",
    "cast_advantages_with_stats",
    "coverage_stats",
    "discounted_returns",
    "ecpo_advantages",
    "ecpo_advantages_with_stats",
    "get_estimator",
    "get_scorer",
    "gigpo_advantages",
    "gigpo_advantages_with_stats",
    "greedy_cosine_clusters",
    "group_size_for_coverage",
    "grpo_advantages",
    "normalize_text",
    "pace_step_advantages",
    "progpo_advantages",
    "progpo_parts",
    "register_estimator",
    "register_scorer",
    "rloo_advantages",
    "scpo_advantages",
    "scpo_advantages_with_stats",
    "sibling_sets",
    "signal_probability",
    "sspo_advantages",
    "sspo_advantages_with_stats",
    "trace_proof_edges",
    "vict_advantages",
    "vict_advantages_with_stats",
]
