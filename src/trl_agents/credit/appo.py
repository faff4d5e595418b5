"""APPO: agentic procedural policy optimization (arXiv 2606.12384; docs/methods/appo.md) — the math.

Three pieces, each a pure function (lists in, lists out; the loss-side ones on tensors):

1. **Where to branch** (rollout side): the future value Ω, the branching score BS = z(H)·z(Ω) and the split points
   are the `token_branching` topology's (`rollout/topologies/appo.py`: `future_values`, `branching_scores`,
   `top_positions`, and the `BranchPoint` each split leaves for the credit). A branch continues an initial rollout's
   own tokens y_0..y_t with a fresh sample.

2. **Dual-group credit** (`appo_advantages`, the released `apply_appo_reward_scale_M` + `compute_appo_advantage`).
   First the reward scale: each reward of an initial rollout o sits on a token (a step's reward on the last token
   of its action) and is multiplied there by

       M̄_{o,τ} = mean over ALL of o's branches b of M_{b,τ},   M_{b,τ} = 1 + (BS_b / BS_max) · 0.9^{t_b − τ} (τ ≤ t_b),
                                                                        1 after the split point t_b    (`prefix_scale`)

   with BS_max the largest split score of the whole batch; then returns R'_o = Σ_τ M̄_{o,τ} r_{o,τ}. Returns are
   z-scored separately inside the initial group (the scaled R') and inside the branch group of the same task, with
   the population σ: (R − μ)/(σ + ε). Branches train nothing (advantage 0); each initial rollout keeps its own
   advantage A_o and, on its tokens up to a split point t_b of one of its branches b, receives

       A_τ = A_o + mean_{b: τ ≤ t_b} A_b

   (M moves a return only where a reward sits at or before a split point: with one reward at the end of an
   episode it changes nothing, as in the released code).

3. **Future-KL scaling in the loss** (`future_kl`, `future_kl_weights`, `dual_clip_drops`): per token,
   Ã_t = A_t · (1 + b·f_t), f_t = clip(exp(FutureKL_t), 1, 1 + ε_f) (high-only: never below 1),
   FutureKL_t = Σ_{k≥t} γ^{k−t} 1[Δ_k ≤ log c] Δ_k, γ = 2^{−1/64}, c = 3 (the dual-clip constant);
   negative-advantage tokens whose ratio exceeds the safety threshold (4) get f clamped into [0.8, 1]; a row with more
   than one dual-clipped negative-advantage token (A < 0 and ratio > c) is dropped.

Numerical guards: a return group of one episode, or of equal returns, gets advantage 0 (centred returns are exactly
0, whatever ε; the released code's (R − μ)/(0 + 1e-6) gives the same 0); the exponent of f is clamped to ±20 (no
inf); BS_max ≤ 0 gives M = 1; empty inputs give empty outputs. Nothing here produces NaN or inf from finite inputs.

Example (the acceptance numbers, docs/methods/appo.md "Hand-computed case"):
    >>> [round(m, 3) for m in prefix_scale(split=3, score=1.0, score_max=1.0)]
    [1.729, 1.81, 1.9, 2.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..rollout.topologies.appo import EXP_CLAMP, BranchPoint, token_offsets
from ..trajectory import Group, Trajectory
from .base import CreditParams, Stats, batch_result, check_group, register_estimator, runtime_field

DEFAULT_DECAY_RATE = 64.0  # γ = 2^(−1/64) of FutureKL in the loss: its half-life is 64 tokens (APPO scripts)
APPO_STATS = ("init_rollouts", "branches", "branch_points", "init_success_rate", "branch_success_rate",
              "mean_reward_scale", "prefix_tokens")

if TYPE_CHECKING:  # the loss-side functions take tensors; torch is imported where they run
    import torch


def decay_gamma(decay_rate: float) -> float:
    """γ = 2^(−1/decay_rate): a future term `decay_rate` tokens ahead weighs one half.

    >>> round(decay_gamma(64.0), 6)
    0.989228
    """
    return 2.0 ** (-1.0 / decay_rate)


# ---- 2. dual-group credit --------------------------------------------------------------------------------------------


def prefix_scale(split: int, score: float, score_max: float, decay: float = 0.9) -> list[float]:
    """M_τ = 1 + (BS / BS_max)·decay^{split − τ} for τ = 0..split (BS_max ≤ 0 or BS ≤ 0: all 1).

    >>> [round(m, 3) for m in prefix_scale(split=3, score=1.0, score_max=1.0)]  # 1 + .9^3, 1 + .9^2, 1 + .9, 2
    [1.729, 1.81, 1.9, 2.0]
    """
    ratio = score / score_max if score_max > 0 and score > 0 else 0.0
    return [1.0 + ratio * decay ** (split - tau) for tau in range(split + 1)]


def group_zscores(returns: Sequence[float], eps: float = 1e-6) -> list[float]:
    """(R − μ)/(σ + ε) with the population σ (the released `compute_appo_advantage`: `std(correction=0)`); one return,
    or equal returns, give 0.

    >>> [round(a, 4) for a in group_zscores([1.0, 0.0, 0.0, 1.0])]  # μ = .5, σ = .5
    [1.0, -1.0, -1.0, 1.0]
    >>> group_zscores([1.0]), group_zscores([0.5, 0.5])
    ([0.0], [0.0, 0.0])
    """
    if not returns:
        return []
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns))
    return [(r - mean) / (std + eps) for r in returns]


def reward_scales(trajectory: Trajectory, points: Sequence[BranchPoint], score_max: float,
                  decay: float = 0.9) -> list[float]:
    """M̄ on each step's reward token (the last token of its action; 1 for a step without action tokens): the mean
    over ALL the rollout's branch points of M_b at that token, M_b = 1 after b's split (released
    `apply_appo_reward_scale_M`: each branch's M over the whole response, then their mean).

    >>> from trl_agents.trajectory import Step
    >>> rollout = Trajectory(task={}, steps=[Step("o", "x", action_ids=[1, 2]), Step("o", "y", action_ids=[3])])
    >>> points = [BranchPoint(0, 2, 0, 1, 0, 2, 1.0, (3,)), BranchPoint(0, 3, 0, 0, 0, 0, 1.0, (1,))]
    >>> # step 0's reward token is position 1: M = 1 + .9^(2−1) = 1.9 (split 2) and 1 (split 0, before it): 1.45
    >>> [round(m, 4) for m in reward_scales(rollout, points, score_max=1.0)]
    [1.45, 1.5]
    """
    if not points:
        return [1.0] * len(trajectory.steps)
    scales = [prefix_scale(point.position, point.score, score_max, decay) for point in points]
    offsets = token_offsets(trajectory)
    result = []
    for index, step in enumerate(trajectory.steps):
        if not step.action_ids:
            result.append(1.0)
            continue
        tau = offsets[index] + len(step.action_ids) - 1
        result.append(sum(m[tau] if tau < len(m) else 1.0 for m in scales) / len(scales))
    return result


@dataclass(frozen=True, kw_only=True)
class APPOParams(CreditParams):
    """Settings of `appo_advantages` (config fields of `APPOConfig`).

    Attributes:
        appo_prefix_decay: The 0.9 of M_{b,τ} = 1 + (BS_b / BS_max)·0.9^{t_b − τ} (`prefix_scale`).
        appo_std_eps: ε of the z-scores (R − μ)/(σ + ε) (the released code: 1e-6).
        invalid_action_penalty: λ, subtracted on the invalid steps of initial rollouts (default 0 here).
        branch_points: Run-time input: per group, the `BranchPoint`s the `token_branching` topology recorded for its
            task; None: no branch point anywhere.
        score_max: Run-time input: BS_max, the largest split score of the whole batch (every process: the trainer
            takes the maximum over processes); None: each group's own.
    """

    invalid_action_penalty: float = 0.0
    appo_prefix_decay: float = 0.9
    appo_std_eps: float = 1e-6
    branch_points: Sequence[Sequence[BranchPoint]] | None = runtime_field(compare=False, repr=False)
    score_max: float | None = runtime_field()


@register_estimator("appo", APPOParams)
def appo_advantages(groups: Sequence[Group], params: APPOParams) -> tuple[list[list[list[float | list[float]]]], Stats]:
    """APPO's dual-group advantages of each task's trajectories, and diagnostics (the released code's math: module
    docstring, part 2).

    An initial rollout's step rewards are first scaled by `reward_scales` (BS_max = `score_max`, the batch's largest
    split score; None: the group's), its return R' is their sum. Initial rollouts (no parent; z-scores of R') and
    branches (forked; z-scores of their plain returns) are z-scored separately (`group_zscores`, population σ).
    Every step of a branch's path gets 0 (branches give a contrast, not a gradient). An initial rollout o gets A_o
    on its steps, replaced on each action token τ at or before the split position t_b of one of its branches by
    A_o + mean_b A_b (the branches covering τ); then −λ on its invalid steps. Branch points whose branch is not in
    the group (failed) are ignored.

    Returns:
        (advantages, stats): per group, per trajectory one value per step: a float, or a list with one value per
        action token on the steps that hold prefix tokens; stats per group, then averaged over the groups:
        "init_rollouts", "branches", "branch_points", "init_success_rate", "branch_success_rate",
        "mean_reward_scale" (M̄ on the reward tokens of initial rollouts), "prefix_tokens".

    >>> from trl_agents.trajectory import Step
    >>> def rollout(episode_id, reward, parent=None, fork_step=0):
    ...     steps = [Step("o", "x", action_ids=[5, 6, 7], reward=reward)]
    ...     return Trajectory(task={}, steps=steps, episode_id=episode_id, parent_id=parent, fork_step=fork_step)
    >>> group = Group(task={}, trajectories=[rollout(0, 1.0), rollout(1, 0.0), rollout(2, 1.0, 0), rollout(3, 0.0, 1)])
    >>> points = [BranchPoint(0, 2, 0, 0, 1, 1, 1.0, (5, 6)), BranchPoint(0, 3, 1, 0, 1, 1, 1.0, (5, 6))]
    >>> (advantages,), stats = appo_advantages([group], APPOParams(branch_points=[points], appo_std_eps=0.0))
    >>> # A_o = ±1, A_b = ±1 (population σ = .5); tokens 0, 1 (≤ split 1): A_o + A_b = ±2; token 2: A_o. The rewards
    >>> # sit on token 2, after the split: M leaves them unchanged.
    >>> advantages[0], advantages[1], advantages[2], advantages[3]
    ([[2.0, 2.0, 1.0]], [[-2.0, -2.0, -1.0]], [0.0], [0.0])
    """
    points = [[] for _ in groups] if params.branch_points is None else list(params.branch_points)
    if len(points) != len(groups):
        raise ValueError(f"branch_points has {len(points)} entries for {len(groups)} groups (one per group)")
    results = (_appo_group(group, own, params) for group, own in zip(groups, points, strict=True))
    return batch_result(results, APPO_STATS)


def _appo_group(
    group: Group, branch_points: Sequence[BranchPoint], params: APPOParams
) -> tuple[list[list[float | list[float]]], dict[str, float]]:
    """APPO on one group (`branch_points`: those of its task): its advantages and its diagnostics."""
    check_group(group)
    score_max, prefix_decay, eps = params.score_max, params.appo_prefix_decay, params.appo_std_eps
    invalid_penalty = params.invalid_action_penalty
    trajectories = group.trajectories
    init = [t for t in trajectories if t.parent_id is None]
    branches = [t for t in trajectories if t.parent_id is not None]
    branch_adv = dict(zip((t.episode_id for t in branches), group_zscores([t.episode_return for t in branches], eps)))
    init_ids = {t.episode_id for t in init}
    points = [p for p in branch_points if p.episode_id in branch_adv and p.origin in init_ids]
    if score_max is None:
        score_max = max((p.score for p in points), default=0.0)
    by_origin: dict[int, list[BranchPoint]] = {}
    for point in points:
        by_origin.setdefault(point.origin, []).append(point)

    # R'_o = Σ_s M̄_{o, τ_s}·r_s (released: M on the token-level rewards before they are summed)
    scaled_returns, scales = [], []
    for trajectory in init:
        factors = reward_scales(trajectory, by_origin.get(trajectory.episode_id, []), score_max, prefix_decay)
        scaled_returns.append(sum(m * step.reward for m, step in zip(factors, trajectory.steps, strict=True)))
        scales += [m for m, step in zip(factors, trajectory.steps, strict=True) if step.action_ids]
    init_adv = dict(zip((t.episode_id for t in init), group_zscores(scaled_returns, eps)))

    advantages: list[list[float | list[float]]] = []
    prefix_tokens = 0
    for trajectory in trajectories:
        if trajectory.parent_id is not None:
            advantages.append([0.0] * len(trajectory.steps))
            continue
        base = init_adv[trajectory.episode_id]
        offsets = token_offsets(trajectory)
        # Per prefix token τ: the advantages of the branches whose split is at or after τ.
        covering: dict[int, list[float]] = {}
        for point in by_origin.get(trajectory.episode_id, []):
            for tau in range(point.position + 1):
                covering.setdefault(tau, []).append(branch_adv[point.episode_id])
        prefix_tokens += len(covering)
        values: list[float | list[float]] = []
        for index, step in enumerate(trajectory.steps):
            penalty = invalid_penalty if not step.valid else 0.0
            tokens = range(offsets[index], offsets[index] + len(step.action_ids))
            if not any(tau in covering for tau in tokens):
                values.append(base - penalty)
                continue
            values.append([
                base + sum(covering[tau]) / len(covering[tau]) - penalty if tau in covering else base - penalty
                for tau in tokens
            ])
        advantages.append(values)

    stats = {
        "init_rollouts": float(len(init)),
        "branches": float(len(branches)),
        "branch_points": float(len(points)),
        "init_success_rate": sum(t.success for t in init) / len(init) if init else 0.0,
        "branch_success_rate": sum(t.success for t in branches) / len(branches) if branches else 0.0,
        "mean_reward_scale": sum(scales) / len(scales) if scales else 1.0,
        "prefix_tokens": float(prefix_tokens),
    }
    return advantages, stats


# ---- 3. future-KL scaling in the loss (tensors) ----------------------------------------------------------------------


def future_kl(delta: torch.Tensor, mask: torch.Tensor, gamma: float, dual_clip: float = 3.0) -> torch.Tensor:
    """FutureKL_t = Σ_{k≥t} γ^{k−t} 1[Δ_k ≤ log c]·m_k·Δ_k per row of (B, T) `delta` (Δ = log π_θ − log π_old, masked
    by `mask`; tokens with Δ > log c, c = `dual_clip`, do not take part).

    >>> import torch
    >>> future_kl(torch.tensor([[0.1, 0.0, -0.1]]), torch.ones(1, 3), gamma=1.0)
    tensor([[ 0.0000, -0.1000, -0.1000]])
    """
    import torch

    keep = (delta <= math.log(dual_clip)) & mask.bool()
    terms = torch.where(keep, delta, torch.zeros_like(delta))
    sums = torch.zeros_like(terms)
    running = torch.zeros_like(terms[:, 0])
    for t in range(terms.size(1) - 1, -1, -1):
        running = terms[:, t] + gamma * running
        sums[:, t] = running
    return sums


def future_kl_weights(
    future: torch.Tensor,
    advantages: torch.Tensor,
    ratio: torch.Tensor,
    clip_ratio: float = 0.2,
    high_only: bool = True,
    safety_ratio: float = 4.0,
) -> torch.Tensor:
    """f_t = clip(exp(clamp(FutureKL_t, ±20)), 1 (high-only) or 1 − ε_f, 1 + ε_f); tokens with A < 0 and ratio >
    `safety_ratio` get f clamped into [0.8, 1] (with high-only clipping: exactly 1).

    >>> import torch
    >>> future_kl_weights(torch.tensor([[0.0, -0.1, -0.1]]), torch.ones(1, 3), torch.ones(1, 3))
    tensor([[1., 1., 1.]])
    >>> future_kl_weights(torch.tensor([[1.0, 0.1]]), -torch.ones(1, 2), torch.tensor([[5.0, 1.0]]))
    tensor([[1.0000, 1.1052]])
    """
    import torch

    raw = torch.exp(future.clamp(-EXP_CLAMP, EXP_CLAMP))
    weights = raw.clamp(min=1.0 if high_only else 1.0 - clip_ratio, max=1.0 + clip_ratio)
    risky = (advantages < 0) & (ratio > safety_ratio)
    return torch.where(risky, weights.clamp(min=0.8, max=1.0), weights)


def dual_clip_drops(advantages: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor, dual_clip: float = 3.0):
    """Rows (B,) with more than one dual-clipped token (A < 0 and ratio > c): dropped from the loss.

    >>> import torch
    >>> dual_clip_drops(-torch.ones(2, 3), torch.tensor([[4.0, 5.0, 1.0], [4.0, 1.0, 1.0]]), torch.ones(2, 3))
    tensor([ True, False])
    """
    clipped = (advantages < 0) & (ratio > dual_clip) & mask.bool()
    return clipped.sum(dim=1) > 1


def future_kl_advantages(
    advantages: torch.Tensor,
    delta: torch.Tensor,
    ratio: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = decay_gamma(DEFAULT_DECAY_RATE),
    weight: float = 1.0,
    clip_ratio: float = 0.2,
    high_only: bool = True,
    dual_clip: float = 3.0,
    safety_ratio: float = 4.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Ã, f, dropped rows): Ã_t = A_t·(1 + b·f_t) with f from `future_kl_weights`, 0 on the rows `dual_clip_drops`
    drops. Everything detached (a per-token factor of the advantages, not a path for gradients).

    >>> import torch
    >>> adv, f, dropped = future_kl_advantages(torch.ones(1, 3), torch.tensor([[0.1, 0.0, -0.1]]), torch.ones(1, 3),
    ...                                        torch.ones(1, 3), gamma=1.0)
    >>> adv, dropped  # f = clip([1, .905, .905], 1, 1.2) = 1: multiplier 1 + 1·1 = 2 everywhere
    (tensor([[2., 2., 2.]]), tensor([False]))
    """
    import torch

    delta, ratio = delta.detach(), ratio.detach()
    future = future_kl(delta, mask, gamma, dual_clip)
    weights = future_kl_weights(future, advantages, ratio, clip_ratio, high_only, safety_ratio)
    dropped = dual_clip_drops(advantages, ratio, mask, dual_clip)
    scaled = advantages * (1.0 + weight * weights)
    scaled = torch.where(dropped.unsqueeze(1), torch.zeros_like(scaled), scaled)
    return scaled, weights, dropped
