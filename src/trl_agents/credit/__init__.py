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

from .appo import BranchPoint, appo_advantages, branching_scores, future_kl_advantages, future_values
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
from .dpepo import (
    diversity_weight,
    dpepo_advantages,
    dpepo_advantages_with_stats,
    trajectory_weights,
    weight_terms,
)
from .ecpo import AnchorEvidence, anchor_evidence, ecpo_advantages, ecpo_advantages_with_stats
from .eppo import EntropyPacer, pace_scales, task_bounds
from .gigpo import gigpo_advantages, gigpo_advantages_with_stats
from .grpo import grpo_advantages
from .ib_rl import group_advantages, ib_rl_advantages, ib_rl_advantages_with_stats, role_masks
from .igrpo import (
    igrpo_advantages,
    igrpo_advantages_with_stats,
    leaf_weights,
    selection_probabilities,
)
from .llmzero import RuleProposer, SearchTree, capacity_is_monotone, constrain, diagnose, summarise, ucb
from .patr import patr_advantages, patr_advantages_with_stats, solver_progress
from .progpo import progpo_advantages, progpo_parts
from .rloo import rloo_advantages
from .scpo import get_scorer, register_scorer, scpo_advantages, scpo_advantages_with_stats
from .sspo import StateScoreTable, allocated_rollouts, sspo_advantages, sspo_advantages_with_stats, transition_reward
from .toolrl import group_composition, off_policy_token_loss, plan_hint, shaped_off_policy_ratio, zero_reward_tasks
from .vict import trace_proof_edges, vict_advantages, vict_advantages_with_stats

__all__ = [
    "CREDIT_ESTIMATORS",
    "AnchorEvidence",
    "BellmanCredit",
    "BranchPoint",
    "EntropyPacer",
    "RuleProposer",
    "SearchTree",
    "SiblingSet",
    "StateScoreTable",
    "StepAdvantages",
    "allocated_rollouts",
    "anchor_evidence",
    "anchor_key",
    "appo_advantages",
    "bellman_credit",
    "bepo_advantages",
    "bepo_advantages_with_stats",
    "bipace_advantages",
    "bipace_advantages_with_stats",
    "bpo_advantages",
    "bpo_advantages_with_stats",
    "branching_scores",
    "canonical_action",
    "canopy_advantages",
    "canopy_advantages_with_stats",
    "capacity_is_monotone",
    "carries_signal",
    "cast_advantages",
    "cast_advantages_with_stats",
    "constrain",
    "coverage_stats",
    "diagnose",
    "discounted_returns",
    "diversity_weight",
    "dpepo_advantages",
    "dpepo_advantages_with_stats",
    "ecpo_advantages",
    "ecpo_advantages_with_stats",
    "future_kl_advantages",
    "future_values",
    "get_estimator",
    "get_scorer",
    "gigpo_advantages",
    "gigpo_advantages_with_stats",
    "greedy_cosine_clusters",
    "group_advantages",
    "group_composition",
    "group_size_for_coverage",
    "grpo_advantages",
    "ib_rl_advantages",
    "ib_rl_advantages_with_stats",
    "igrpo_advantages",
    "igrpo_advantages_with_stats",
    "leaf_weights",
    "normalize_text",
    "off_policy_token_loss",
    "pace_scales",
    "pace_step_advantages",
    "patr_advantages",
    "patr_advantages_with_stats",
    "plan_hint",
    "progpo_advantages",
    "progpo_parts",
    "register_estimator",
    "register_scorer",
    "rloo_advantages",
    "role_masks",
    "scpo_advantages",
    "scpo_advantages_with_stats",
    "selection_probabilities",
    "shaped_off_policy_ratio",
    "sibling_sets",
    "signal_probability",
    "solver_progress",
    "sspo_advantages",
    "sspo_advantages_with_stats",
    "summarise",
    "task_bounds",
    "trace_proof_edges",
    "trajectory_weights",
    "transition_reward",
    "ucb",
    "vict_advantages",
    "vict_advantages_with_stats",
    "weight_terms",
    "zero_reward_tasks",
]
