"""ECPO advantages: the GRPO episode advantage plus a shrunk, variance-gated advantage of the canonical action taken.

ECPO (Li, Zhou, Duan, Chen 2026, "evidence-calibrated policy optimization", arXiv 2606.05885), as specified in
docs/methods/ecpo.md (formulas from secondary summaries of the paper [S]; no code was released). Steps are grouped
by anchor state s, as GiGPO does; within an anchor, by the canonical action u the step took:

    ρ_{i,t}   = Σ_{k≥t} γ^{k−t} r_{i,k} − λ·[invalid]      step return, as GiGPO Eq. 5 (penalty local to the step)
    n_{s,u}, Ḡ_{s,u}                                       visits of (s, u) and the mean of their step returns
    n_s, μ_s, σ_s                                          visits of s, mean and (Bessel) std of all their returns
    μ̃_{s,u}   = (n_{s,u}·Ḡ_{s,u} + κ·μ_s)/(n_{s,u} + κ)   step 2  shrinkage toward the anchor mean
    A_act     = (μ̃_{s,u} − μ_s)/F                          step 3  shared by every visit of (s, u); F = 1 or σ_s + ε
    B_s       = Σ_u (n_{s,u}/n_s)(Ḡ_{s,u} − μ_s)²           step 4  between-action variance
    W_s       = Σ_u (n_{s,u}/n_s)·Var_{s,u}                 step 4  within-action variance (population variances)
    ρ_VG(s)   = tanh(n_s/τ)·B_s/(B_s + W_s + ε)             step 4  variance gate
    Â_{i,t}   = A^GRPO_i + ω·ρ_VG(s)·A_act(s, u)           step 5

`A^GRPO_i` is GRPO's advantage (`grpo_advantages`: z-score or mean-only, over trajectories or step rows, with its
invalid-action rule).
The shrinkage is computed as μ̃ − μ_s = n_{s,u}(Ḡ_{s,u} − μ_s)/(n_{s,u} + κ) (the same number), so that equal
returns give exactly 0. An anchor visited once has B = W = 0, hence ρ_VG = 0 and A_act = 0: ECPO reduces to GRPO when
no state repeats, and when all returns at every anchor are equal (e.g. all-equal rewards along the same states).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..trajectory import Group
from .base import (AnchorParams, Stats, StepAdvantages, anchor_key, batch_result, canonical_action, check_choice,
                   check_positive, discounted_returns, mean_std, register_estimator, runtime_field)
from .gigpo import cluster_similar_texts
from .grpo import GRPOOutcomeParams

ECPO_METRICS = ("mean_anchor_group_size", "singleton_fraction", "mean_actions_per_anchor", "mean_gate")


def group_anchors(group: Group, anchor: str, similarity_threshold: float | None) -> list[Hashable]:
    """The anchor of every step row of `group` (rows flattened trajectory by trajectory), as GiGPO Eq. 6 forms them:
    exact keys, or greedy text-similarity cluster labels when `similarity_threshold` is set."""
    anchors = [anchor_key(step, anchor) for traj in group.trajectories for step in traj.steps]
    if similarity_threshold is not None:
        return cluster_similar_texts(anchors, similarity_threshold)
    return anchors


@dataclass(frozen=True)
class AnchorEvidence:
    """ECPO's statistics of one anchor state s (docs/methods/ecpo.md#equations, steps 2-4).

    Attributes:
        count: n_s, visits of the anchor.
        mean: μ_s, mean step return over all visits.
        shrunk_means: μ̃_{s,u} per canonical action u.
        action_advantages: A_act(s, u) = (μ̃_{s,u} − μ_s)/F per canonical action u.
        between: B_s, between-action variance of the returns.
        within: W_s, within-action variance of the returns.
        gate: ρ_VG(s) = tanh(n_s/τ)·B_s/(B_s + W_s + ε).
    """

    count: int
    mean: float
    shrunk_means: dict[Hashable, float]
    action_advantages: dict[Hashable, float]
    between: float
    within: float
    gate: float


def anchor_evidence(
    returns_by_action: Mapping[Hashable, Sequence[float]],
    *,
    kappa: float,
    tau: float,
    scale: bool,
    eps: float = 1e-6,
) -> AnchorEvidence:
    """Shrunk action advantages and the variance gate of one anchor, from the step returns of each action taken there.

    Example (docs/methods/ecpo.md#hand-computed-case: u1 once with return 1, u2 three times with [0, 0, 1], κ = 2,
    τ = 4):
        >>> e = anchor_evidence({"u1": [1.0], "u2": [0.0, 0.0, 1.0]}, kappa=2.0, tau=4.0, scale=False)
        >>> e.mean, {u: round(m, 4) for u, m in e.shrunk_means.items()}
        (0.5, {'u1': 0.6667, 'u2': 0.4})
        >>> {u: round(a, 4) for u, a in e.action_advantages.items()}, round(e.between, 4), round(e.within, 4)
        ({'u1': 0.1667, 'u2': -0.1}, 0.0833, 0.1667)
        >>> round(e.gate, 4)
        0.2539
    """
    pooled = [value for values in returns_by_action.values() for value in values]
    n_s = len(pooled)
    mu_s, sigma_s = mean_std(pooled)
    scale_factor = sigma_s + eps if scale else 1.0
    shrunk, advantages = {}, {}
    between = within = 0.0
    for action, values in returns_by_action.items():
        n_u = len(values)
        mean_u, _ = mean_std(values)
        deviation = mean_u - mu_s
        shrunk_deviation = n_u * deviation / (n_u + kappa)  # μ̃_{s,u} − μ_s    (step 2)
        shrunk[action] = mu_s + shrunk_deviation
        advantages[action] = shrunk_deviation / scale_factor  # A_act           (step 3)
        variance_u = sum((v - mean_u) ** 2 for v in values) / n_u  # population variance Var_{s,u}
        between += n_u / n_s * deviation**2  # B_s                              (step 4)
        within += n_u / n_s * variance_u  # W_s
    gate = math.tanh(n_s / tau) * between / (between + within + eps)  # ρ_VG(s)
    return AnchorEvidence(n_s, mu_s, shrunk, advantages, between, within, gate)


@dataclass(frozen=True, kw_only=True)
class ECPOParams(AnchorParams, GRPOOutcomeParams):
    """Settings of `ecpo_advantages` (config fields of `ECPOConfig`).

    Attributes:
        gamma: γ of the step returns (as GiGPO).
        step_advantage_w: ω, weight of the gated action advantage (our choice: 1.0 as GiGPO, step 5 [D]).
        shrinkage_kappa: κ ≥ 0, pseudo-count of the shrinkage toward the anchor mean (2.0 in the paper, step 2 [S]);
            0 = no shrinkage.
        variance_gate_tau: τ > 0, visit scale of the gate's confidence tanh(n_s/τ); None = the group size G, the
            number of trajectories of the group (our choice, step 4 [D]: τ was not recovered).
        ecpo_mode: F of A_act: "mean_norm" (F = 1) or "mean_std_norm" (F = σ_s + ε, Bessel std of the anchor's
            returns); our choice, following GiGPO's mode (step 3 [D]).
        scale_rewards, credit_statistic: A^GRPO (`GRPOOutcomeParams`).
        anchor, similarity_threshold: How step rows are grouped into anchor states (`AnchorParams`).
        merge_invalid_actions: Count every rejected action as the one canonical action `INVALID_ACTION` (our
            choice, step 1; docs/methods/ecpo.md#our-choices); else rejected actions are told apart by their
            normalised text.
        invalid_action_penalty: λ, for steps with `valid=False`: in A^GRPO and in the step return ρ (as GiGPO).
        eps: ε of F and of the gate's denominator; not a config field.
    """

    gamma: float = 0.95
    step_advantage_w: float = 1.0
    shrinkage_kappa: float = 2.0
    variance_gate_tau: float | None = None
    ecpo_mode: str = "mean_norm"
    merge_invalid_actions: bool = True
    eps: float = runtime_field(1e-6)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("mode", self.ecpo_mode, ("mean_norm", "mean_std_norm"))
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not math.isfinite(self.step_advantage_w):
            raise ValueError(f"omega must be finite, got {self.step_advantage_w}")
        kappa, tau = self.shrinkage_kappa, self.variance_gate_tau
        if not (math.isfinite(kappa) and kappa >= 0):
            raise ValueError(f"kappa must be a finite number >= 0, got {kappa}")
        if tau is not None and not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"tau must be > 0 (or None for the group size), got {tau}")
        check_positive("eps", self.eps)


@register_estimator("ecpo", ECPOParams, metrics=ECPO_METRICS)
def ecpo_advantages(groups: Sequence[Group], params: ECPOParams) -> tuple[list[StepAdvantages], Stats]:
    """ECPO advantages Â = A^GRPO + ω·ρ_VG·A_act for every step of every trajectory of every group.

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats over the groups
        with steps: "num_anchor_groups", "mean_anchor_group_size" (step rows per anchor), "singleton_fraction"
        (anchors visited once: ρ_VG = 0), "mean_actions_per_anchor" (distinct canonical actions), "mean_gate" (ρ_VG
        averaged over step rows). A trainer logs all but the first.

    Example (docs/methods/ecpo.md#hand-computed-case: four one-step episodes from state s; action u1 once, return 1
    (lucky); u2 three times, returns 0, 0, 1):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(action, reward):
        ...     return Trajectory(task={}, steps=[Step("s", "", reward=reward, info={"action": action})])
        >>> group = Group(task={}, trajectories=[episode(*c) for c in [("u1", 1), ("u2", 0), ("u2", 0), ("u2", 1)]])
        >>> (advantages,), _ = ecpo_advantages([group], ECPOParams())  # GRPO ±0.8659, ρ_VG = 0.2539 (τ = G = 4)
        >>> [[round(a, 4) for a in row] for row in advantages]
        [[0.9082], [-0.8913], [-0.8913], [0.8405]]
    """
    results = (_ecpo_group(group, params) for group in groups)
    return batch_result(results, ("num_anchor_groups", *ECPO_METRICS), counted=lambda stats: stats["num_anchor_groups"])


def _ecpo_group(group: Group, params: ECPOParams) -> tuple[StepAdvantages, dict[str, float]]:
    """ECPO on one group: the advantages and the group's diagnostics (all 0 for a group without steps)."""
    gamma, omega, kappa, tau, eps = (params.gamma, params.step_advantage_w, params.shrinkage_kappa,
                                     params.variance_gate_tau, params.eps)
    invalid_penalty = params.invalid_action_penalty
    tau = float(len(group.trajectories)) if tau is None else tau

    # A^GRPO_i (with its invalid-action rule), broadcast to the steps of episode i; it rejects non-finite rewards.
    episode = params.episode_advantages(group)

    # Step returns ρ (GiGPO Eq. 5 plus the local penalty), anchors (GiGPO Eq. 6) and canonical actions, per row.
    step_returns: list[float] = []
    actions: list[Hashable] = []
    for traj in group.trajectories:
        returns = discounted_returns([step.reward for step in traj.steps], gamma)
        for step, ret in zip(traj.steps, returns, strict=True):
            step_returns.append(ret - invalid_penalty if not step.valid else ret)
            actions.append(canonical_action(step, merge_invalid=params.merge_invalid_actions))
    anchors = group_anchors(group, params.anchor, params.similarity_threshold)

    # Rows of each anchor s, split by canonical action u.
    rows_by_anchor: dict[Hashable, dict[Hashable, list[int]]] = {}
    try:
        for row, (key, action) in enumerate(zip(anchors, actions, strict=True)):
            rows_by_anchor.setdefault(key, {}).setdefault(action, []).append(row)
    except TypeError as err:
        raise ValueError(f"ECPO anchors and actions must be hashable: {err}") from None

    # Steps 2-4 per anchor; ρ_VG(s)·A_act(s, u) is shared by every visit of (s, u).
    gated_action_advantage = [0.0] * len(step_returns)
    gates = [0.0] * len(step_returns)
    singletons = num_actions = 0
    for by_action in rows_by_anchor.values():
        if len(by_action) == 1 and len(next(iter(by_action.values()))) == 1:
            singletons += 1  # visited once: B = W = 0, so ρ_VG = 0 and A_act = 0
            num_actions += 1
            continue
        evidence = anchor_evidence(
            {u: [step_returns[r] for r in rows] for u, rows in by_action.items()},
            kappa=kappa,
            tau=tau,
            scale=params.ecpo_mode == "mean_std_norm",
            eps=eps,
        )
        num_actions += len(by_action)
        for action, rows in by_action.items():
            for r in rows:
                gates[r] = evidence.gate
                gated_action_advantage[r] = evidence.gate * evidence.action_advantages[action]

    # Step 5: Â = A^GRPO + ω·ρ_VG·A_act.
    advantages: StepAdvantages = []
    offset = 0
    for episode_row in episode:
        advantages.append([a + omega * gated_action_advantage[offset + t] for t, a in enumerate(episode_row)])
        offset += len(episode_row)

    num_groups = len(rows_by_anchor)
    rows = len(step_returns)
    stats = {
        "num_anchor_groups": num_groups,
        "mean_anchor_group_size": rows / num_groups if num_groups else 0.0,
        "singleton_fraction": singletons / num_groups if num_groups else 0.0,
        "mean_actions_per_anchor": num_actions / num_groups if num_groups else 0.0,
        "mean_gate": sum(gates) / rows if rows else 0.0,
    }
    return advantages, stats
