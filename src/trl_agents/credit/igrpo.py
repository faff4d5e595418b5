"""IGRPO credit: teacher-weighted leaf advantages over an information-gain tree (the tree: `info_gain` topology).

IGRPO (Zhang, Xu, Ding, ..., Fu, Wang 2026, "information-gain-based adaptive tree rollout", arXiv 2607.06223; only
the abstract was available to us, docs/methods/igrpo.md). The abstract says: a rollout tree per question under a
fixed rollout budget, more informative branches expanded more, unpromising ones progressively suppressed, and a
policy target given by the teacher distribution the allocation induces. The information gain is borrowed from IGPO
(arXiv 2510.14967): the change in the policy's likelihood of the gold answer a* after a tool observation.
Everything below the abstract is our design [D].

A *node* is a state reached right after a tool observation (on Search-QA: after a `search[...]` step); the node
rule, the gold-answer likelihood p(h), the information gain I(n) = p(h_n) − p(h_parent(n)) of a node and the
budgeted selection softmax(I/T_I) are the `info_gain` topology's (`rollout/topologies/igrpo.py`: `is_node_step`,
`gold_likelihood`, `path_information`, `selection_probabilities`). Credit, per leaf ℓ (one root-to-leaf path):

    S_ℓ       = Σ_{n ∈ path(ℓ)} I(n)   (= p(last node of ℓ) − p(root): the sum telescopes)
    q(ℓ)      ∝ π_old(ℓ)·exp(S_ℓ / T_I)                                    induced teacher distribution over leaves
    w_ℓ       = (q(ℓ)/π_old(ℓ)) / Σ_ℓ' (q(ℓ')/π_old(ℓ')) = softmax_ℓ(S_ℓ / T_I)   self-normalised, Σ w = 1
    μ_w       = Σ_ℓ w_ℓ R_ℓ,   σ_w² = Σ_ℓ w_ℓ (R_ℓ − μ_w)² / (1 − Σ_ℓ w_ℓ²)    weighted mean and (reliability-
                weights, Bessel-corrected) variance
    A_ℓ       = L·w_ℓ·(R_ℓ − μ_w) / (σ_w + ε)   (scale="group";  L·w_ℓ·(R_ℓ − μ_w) with scale="none")

The spec's target is A_ℓ = w_ℓ·(R_ℓ − Σ w R). We multiply by L (the number of leaves) so that the weights average
1 — uniform weights then give exactly GRPO's advantage on the same leaves, with the same `scale`: "group" is
GRPO's z-score with TRL's Bessel std and ε = 1e-4 (`credit.grpo`, the library's and TRL's default), "none" is the
centred return (Dr. GRPO). Equal gains give w = 1/L and are computed by GRPO's own code path (bit-for-bit). The
invalid-action penalty λ is subtracted after normalisation (GRPO's "trajectories" statistic), charged by the
trajectory that owns the step (t ≥ fork_step), so that a shared invalid step is penalised once.

Tree rows. Every trajectory is one root-to-leaf path and gets A_ℓ on every step of its path; the row builder trains a
shared step once with the SUM over the leaves through it. A step shared by a set D of leaves therefore gets
L/(σ_w + ε) · W_D · (μ_D − μ_w), W_D = Σ_{ℓ∈D} w_ℓ, μ_D the weighted mean return of D: its subtree's weight mass
times how much better the subtree does than the tree. A step shared by every leaf gets exactly 0 (Σ w (R − μ_w) = 0).

Numerical guards: the weights' softmax subtracts the maximum (no overflow for any finite gain or temperature); a
single leaf, or weights concentrated on one leaf (1 − Σ w² ≈ 0), get σ_w = 0 and an advantage of 0 for the dominant
leaf; equal returns give exactly 0 deviations; empty groups give []; non-finite likelihoods or rewards raise a
ValueError.

Example (the leaf weights softmax(S_ℓ/T_I) of path gains S_ℓ = 0.2, 0.1, 0.1, 0 at T_I = 0.1):
    >>> [round(w, 4) for w in leaf_weights([0.2, 0.1, 0.1, 0.0])]
    [0.5344, 0.1966, 0.1966, 0.0723]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..rollout.topologies.igrpo import GOLD_LIKELIHOOD, check_temperature, is_node_step, path_information, softmax
from ..trajectory import Group, Step
from .base import (CreditParams, Stats, StepAdvantages, batch_result, check_choice, check_group, mean_std, normalize,
                   register_estimator, runtime_field)

SCALES = ("group", "none")
STAT_NAMES = ("num_leaves", "num_nodes", "mean_info_gain", "positive_gain_fraction", "mean_path_gain",
              "max_weight", "effective_leaf_fraction", "zero_advantage_group")


# ---- leaf weights and the weighted advantage ---------------------------------------------------------------------


def leaf_weights(path_gains: Sequence[float], temperature: float = 0.1) -> list[float]:
    """w_ℓ = q(ℓ)/π_old(ℓ) self-normalised = softmax(S_ℓ / T_I): they sum to 1; equal gains give 1/L.

    >>> [round(w, 4) for w in leaf_weights([0.2, 0.1, 0.1, 0.0])]  # e^2, e^1, e^1, e^0 over 13.8256
    [0.5344, 0.1966, 0.1966, 0.0723]
    """
    if len(path_gains) and all(g == path_gains[0] for g in path_gains):
        return [1.0 / len(path_gains)] * len(path_gains)
    return softmax(path_gains, temperature)


def weighted_mean_std(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float]:
    """μ_w = Σ w v and σ_w = sqrt(Σ w (v − μ_w)² / (1 − Σ w²)) for weights summing to 1 (reliability weights: with
    w = 1/n this is the Bessel std). σ_w = 0 when 1 − Σ w² ≤ 1e-12 (a single leaf, or all weight on one leaf).

    >>> weighted_mean_std([1.0, 0.0, 0.0, 1.0], [0.25] * 4)  # = mean_std: (0.5, 0.5774)
    (0.5, 0.5773502691896257)
    """
    if not len(values):
        return 0.0, 0.0
    shift = values[0]  # deviations from the first value: equal values give exactly 0
    mean = shift + sum(w * (v - shift) for v, w in zip(values, weights, strict=True))
    spread = 1.0 - sum(w * w for w in weights)
    if spread <= 1e-12:
        return mean, 0.0
    variance = sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True)) / spread
    return mean, math.sqrt(max(variance, 0.0))


def weighted_advantages(
    returns: Sequence[float], weights: Sequence[float], scale: str = "group", eps: float = 1e-4
) -> list[float]:
    """A_ℓ = L·w_ℓ·(R_ℓ − μ_w)/(σ_w + ε) ("group") or L·w_ℓ·(R_ℓ − μ_w) ("none").

    >>> [round(a, 4) for a in weighted_advantages([1.0, 0.0], [0.75, 0.25], scale="none")]  # μ_w = 0.75
    [0.375, -0.375]
    """
    check_choice("scale", scale, SCALES)
    if len(returns) != len(weights):
        raise ValueError(f"{len(returns)} returns but {len(weights)} weights")
    n = len(returns)
    mean, std = weighted_mean_std(returns, weights)
    shift = returns[0] if n else 0.0
    centred = [(r - shift) - (mean - shift) for r in returns]  # equal returns: exactly 0
    values = [n * w * c for w, c in zip(weights, centred, strict=True)]
    if scale == "group":
        values = [v / (std + eps) for v in values]
    return values


@dataclass(frozen=True, kw_only=True)
class IGRPOParams(CreditParams):
    """Settings of `igrpo_advantages` (config fields of `IGRPOConfig`).

    Attributes:
        igrpo_temperature: T_I of the weights (0.1).
        scale_rewards: "group" (z-score with the weighted std, GRPO's default) or "none" (centred only, Dr. GRPO).
        invalid_action_penalty: λ, subtracted on invalid steps by the trajectory that owns them (t ≥ fork_step).
        eps: ε added to σ_w (TRL: 1e-4); not a config field.
        signal: Name of the likelihood signal; not a config field.
        is_node: Which steps lead to a node (`is_node_step`); not a config field.
    """

    igrpo_temperature: float = 0.1
    scale_rewards: str = "group"
    eps: float = runtime_field(1e-4)
    signal: str = runtime_field(GOLD_LIKELIHOOD)
    is_node: Callable[[Step], bool] = runtime_field(is_node_step, compare=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("scale", self.scale_rewards, SCALES)
        check_temperature(self.igrpo_temperature)
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps must be a finite number > 0, got {self.eps}")


@register_estimator("igrpo", IGRPOParams)
def igrpo_advantages(groups: Sequence[Group], params: IGRPOParams) -> tuple[list[StepAdvantages], Stats]:
    """Teacher-weighted leaf advantages plus diagnostics.

    Each group holds the healthy trajectories of one task (a tree from the `info_gain` topology, or independent
    episodes), with the gold-answer likelihood on every node step (`step.signals[signal]`).

    Returns:
        (advantages, stats): per group, one value per step of each trajectory's full path; stats per group, then
        averaged over the groups: "num_leaves", "num_nodes" (non-root nodes, each once), "mean_info_gain" (mean I over
        those nodes), "positive_gain_fraction", "mean_path_gain" (mean S_ℓ), "max_weight", "effective_leaf_fraction"
        ((1/Σw²)/L: 1 for uniform weights), "zero_advantage_group" (1 when every leaf returned the same); zeros for
        an empty group.
    """
    return batch_result((_igrpo_group(group, params) for group in groups), STAT_NAMES)


def _igrpo_group(group: Group, params: IGRPOParams) -> tuple[StepAdvantages, dict[str, float]]:
    """IGRPO on one group: its advantages and its diagnostics."""
    check_group(group)
    temperature, scale, invalid_penalty, eps = (params.igrpo_temperature, params.scale_rewards,
                                                params.invalid_action_penalty, params.eps)
    signal, is_node = params.signal, params.is_node
    trajectories = group.trajectories
    if not trajectories:
        return [], dict.fromkeys(STAT_NAMES, 0.0)
    node_gains: dict[int, float] = {}  # id(step j) of a node's first occurrence -> I; shared nodes counted once
    path_gains = []
    for trajectory in trajectories:
        gains = path_information(trajectory, signal, is_node)
        for j, gain in gains:
            node_gains.setdefault(id(trajectory.steps[j - 1]), gain)  # the node is the state after step j − 1
        path_gains.append(sum(gain for _, gain in gains))  # S_ℓ = Σ_{n ∈ path} I(n)
    returns = [t.episode_return for t in trajectories]
    weights = leaf_weights(path_gains, temperature)
    if all(g == path_gains[0] for g in path_gains):
        # Uniform weights (w = 1/L): exactly GRPO's computation on the leaves (credit.base.mean_std / normalize).
        mean, std = mean_std(returns)
        episode_values = normalize(returns, mean, std, scale=scale == "group", eps=eps)
    else:
        episode_values = weighted_advantages(returns, weights, scale=scale, eps=eps)
    values = []
    for trajectory, a in zip(trajectories, episode_values, strict=True):
        path = [a] * len(trajectory.steps)
        for t in range(trajectory.fork_step, len(path)):  # the penalty, charged once: by the owner of the step
            if not trajectory.steps[t].valid:
                path[t] -= invalid_penalty
        values.append(path)
    gains = list(node_gains.values())
    stats = {
        "num_leaves": float(len(trajectories)),
        "num_nodes": float(len(gains)),
        "mean_info_gain": sum(gains) / len(gains) if gains else 0.0,
        "positive_gain_fraction": sum(g > 0 for g in gains) / len(gains) if gains else 0.0,
        "mean_path_gain": sum(path_gains) / len(path_gains),
        "max_weight": max(weights),
        "effective_leaf_fraction": 1.0 / sum(w * w for w in weights) / len(weights),
        "zero_advantage_group": float(all(r == returns[0] for r in returns)),
    }
    return values, stats


