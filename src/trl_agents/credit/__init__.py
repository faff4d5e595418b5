"""Credit assignment: per-step advantages for the trajectories of the groups (tasks) of a batch.

Every estimator is ONE pure function `x_advantages(groups, params) -> (advantages, stats)`: `groups` holds one
`Group` per task, `params` is the estimator's frozen `XParams` (field names = config field names; built with
`XParams(...)` or `XParams.from_config(args, **runtime)`), `advantages` has one entry per group (one list per
trajectory, one advantage per step) and `stats` maps diagnostic names to (total, count) summed over the groups
(`stat_means` gives their values). Every estimator is also reachable by name through `get_estimator(name)`, which
gives its function and its params class (the contract in detail: `trl_agents.credit.base`).

Example:
    >>> from trl_agents.credit import get_estimator
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> group = Group(task={}, trajectories=[Trajectory(task={}, steps=[Step("s", "a", reward=r)]) for r in (1, 0)])
    >>> rloo = get_estimator("rloo")
    >>> rloo([group], rloo.params())
    ([[[1.0], [-1.0]]], {})
"""
from .appo import APPOParams, appo_advantages, future_kl_advantages
from .base import (
    CREDIT_ESTIMATORS,
    AnchorParams,
    CreditParams,
    Estimator,
    Stats,
    StepAdvantages,
    anchor_key,
    canonical_action,
    discounted_returns,
    get_estimator,
    normalize_text,
    register_estimator,
    runtime_field,
    stat_means,
)
from .bepo import BellmanCredit, BEPOParams, bellman_credit, bepo_advantages
from .bipace import BiPACEParams, bipace_advantages, greedy_cosine_clusters, pace_step_advantages
from .bpo import BPOParams, SiblingSet, bpo_advantages, sibling_sets
from .canopy import CANOPYParams, canopy_advantages
from .cast import CASTParams, cast_advantages
from .dpepo import (
    DPEPOParams,
    diversity_weight,
    dpepo_advantages,
    trajectory_weights,
    weight_terms,
)
from .ecpo import AnchorEvidence, ECPOParams, anchor_evidence, ecpo_advantages
from .eppo import EntropyPacer, pace_scales, task_bounds
from .gigpo import GiGPOParams, gigpo_advantages
from .grpo import GRPOOutcomeParams, GRPOParams, grpo_advantages
from .ib_rl import IBRLParams, group_advantages, ib_rl_advantages, role_masks
from .igrpo import IGRPOParams, igrpo_advantages, leaf_weights
from .patr import PATRParams, patr_advantages
from .progpo import ProGPOParams, progpo_advantages, progpo_parts
from .rloo import RLOOParams, rloo_advantages
from .scpo import SCPOParams, get_scorer, register_scorer, scpo_advantages
from .sspo import SSPOParams, sspo_advantages
from .toolrl import off_policy_token_loss, shaped_off_policy_ratio, zero_reward_tasks
from .vict import VICTParams, trace_proof_edges, vict_advantages

__all__ = [
    "CREDIT_ESTIMATORS",
    "APPOParams",
    "AnchorEvidence",
    "AnchorParams",
    "BEPOParams",
    "BPOParams",
    "BellmanCredit",
    "BiPACEParams",
    "CANOPYParams",
    "CASTParams",
    "CreditParams",
    "DPEPOParams",
    "ECPOParams",
    "EntropyPacer",
    "Estimator",
    "GRPOOutcomeParams",
    "GRPOParams",
    "GiGPOParams",
    "IBRLParams",
    "IGRPOParams",
    "PATRParams",
    "ProGPOParams",
    "RLOOParams",
    "SCPOParams",
    "SSPOParams",
    "SiblingSet",
    "Stats",
    "StepAdvantages",
    "VICTParams",
    "anchor_evidence",
    "anchor_key",
    "appo_advantages",
    "bellman_credit",
    "bepo_advantages",
    "bipace_advantages",
    "bpo_advantages",
    "canonical_action",
    "canopy_advantages",
    "cast_advantages",
    "discounted_returns",
    "diversity_weight",
    "dpepo_advantages",
    "ecpo_advantages",
    "future_kl_advantages",
    "get_estimator",
    "get_scorer",
    "gigpo_advantages",
    "greedy_cosine_clusters",
    "group_advantages",
    "grpo_advantages",
    "ib_rl_advantages",
    "igrpo_advantages",
    "leaf_weights",
    "normalize_text",
    "off_policy_token_loss",
    "pace_scales",
    "pace_step_advantages",
    "patr_advantages",
    "progpo_advantages",
    "progpo_parts",
    "register_estimator",
    "register_scorer",
    "rloo_advantages",
    "role_masks",
    "runtime_field",
    "scpo_advantages",
    "shaped_off_policy_ratio",
    "sibling_sets",
    "sspo_advantages",
    "stat_means",
    "task_bounds",
    "trace_proof_edges",
    "trajectory_weights",
    "vict_advantages",
    "weight_terms",
    "zero_reward_tasks",
]
