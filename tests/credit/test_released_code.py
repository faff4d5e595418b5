"""The formulas the method pages tag `[C]` (taken from the authors' released code) against that code, on each page's
own "Hand-computed case" (docs/methods/*.md): one test per page that carries the tag.

Each test holds a short transcription of the released code's math, written here in plain Python/torch (the comment
above each one names the released function it follows), checks that it gives the page's written numbers, and that
the project's function gives the same values. The hand numbers are written out with their arithmetic in comments.
Where a page says we differ from the released code in a detail, the test shows the difference with its numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from trl_agents.credit.appo import APPOParams, appo_advantages, future_kl_advantages, prefix_scale
from trl_agents.credit.canopy import CANOPYParams, canopy_advantages
from trl_agents.credit.dpepo import DPEPOParams, dpepo_advantages, weight_terms
from trl_agents.credit.sspo import SSPOParams, sspo_advantages, sspo_step_rewards
from trl_agents.credit.toolrl import off_policy_token_loss, shaped_off_policy_ratio
from trl_agents.distill.adrs import ADRSParams, adrs_advantages, adrs_eta_schedule
from trl_agents.distill.grsd import modulated_advantages, reflection_advantages, turn_logprob_gap
from trl_agents.distill.opsd import generalized_jsd, masked_token_mean, sampled_token_distillation
from trl_agents.distill.sdar import sdar_gate, sdar_token_terms
from trl_agents.rollout.topologies.appo import BranchPoint, branching_scores, future_values
from trl_agents.rollout.topologies.state_score import StateScoreTable
from trl_agents.signals import Transition
from trl_agents.trajectory import Group, Step, Trajectory


def population_std(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def bessel_std(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def per_token(values, trajectory):
    """A project advantage row (a float per step, or a list per token) as one value per action token."""
    out = []
    for value, step in zip(values, trajectory.steps, strict=True):
        out += list(value) if isinstance(value, list) else [value] * len(step.action_ids)
    return out


# ---------------------------------------------------------------- APPO (arXiv 2606.12384), docs/methods/appo.md


def released_future_values(log_ratios, gamma=1.0, clip_eps=0.2):
    # released build_appo_branch_request: S_t = Σ_{j≥t} γ^{j−t} Δ_j; Ω_t = clip(exp(clamp(S_t, ±20)), 1 − ε, 1 + ε)
    n = len(log_ratios)
    sums = [sum(gamma ** (j - t) * log_ratios[j] for j in range(t, n)) for t in range(n)]
    values = [math.exp(min(max(s, -20.0), 20.0)) for s in sums]
    return values if clip_eps is None else [min(max(v, 1.0 - clip_eps), 1.0 + clip_eps) for v in values]


def released_zscore(values):
    # released APPOBrancher's _zscore (the rollout-time brancher, the page's [C] source): (x − μ)/σ with the population
    # σ, σ := 1 when the variance is ≤ 1e-16. (The launchers' trainer-side build_appo_branch_request divides by
    # σ + 1e-6 and also scores punctuation tokens: a path the page says we do not follow.)
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / len(values)
    std = math.sqrt(variance) if variance > 1e-16 else 1.0
    return [(v - mean) / std for v in values]


def released_branching(entropies, omegas):
    # released compute_saliency_scores: BS = z(H)·z(Ω); a candidate needs z(H) > 0, z(Ω) > 0 and BS > 0
    z_h, z_o = released_zscore(entropies), released_zscore(omegas)
    scores = [h * o for h, o in zip(z_h, z_o)]
    return scores, [h > 0 and o > 0 and s > 0 for h, o, s in zip(z_h, z_o, scores)]


def released_reward_scale(split, score, score_max, length, decay=0.9):
    # released compute_reward_scale_M: M_t = 1 + (BS/BS_max)·decay^(split − t) for t ≤ split, 1 after it;
    # all 1 when BS_max ≤ 0 or BS ≤ 0
    if score_max <= 0 or score <= 0:
        return [1.0] * length
    return [1.0 + score / score_max * decay ** (split - t) if t <= split else 1.0 for t in range(length)]


def released_appo_advantages(rows, metas, score_max, decay=0.9):
    """rows: (uid, kind, token rewards) with kind "init" or "branch"; metas: (orig row, branch row, split, score).

    released apply_appo_reward_scale_M: an initial row's token rewards × the mean over its metas of M (branch rows
    keep theirs); BS_max is the largest branch_score of the batch's metas (passed in). Then compute_appo_advantage:
    row sums z-scored within (uid, kind), (R − μ)/(σ + 1e-6) with the population σ (σ = 0 for a single row); an
    initial row carries its z on every token, a branch row 0; on an initial row's tokens 0..split of each meta, the
    mean of those branches' z is added."""
    rewards = [list(r) for _, _, r in rows]
    scales = defaultdict(list)
    for orig, _, split, score in metas:
        scales[orig].append(released_reward_scale(split, score, score_max, len(rewards[orig]), decay))
    for orig, ms in scales.items():
        rewards[orig] = [r * sum(m[t] for m in ms) / len(ms) for t, r in enumerate(rewards[orig])]
    scores = [sum(r) for r in rewards]
    groups = defaultdict(list)
    for i, (uid, kind, _) in enumerate(rows):
        groups[(uid, kind)].append(i)
    base = {}
    for members in groups.values():
        values = [scores[i] for i in members]
        std = population_std(values) if len(members) > 1 else 0.0
        for i in members:
            base[i] = (scores[i] - sum(values) / len(values)) / (std + 1e-6)
    advantages = [[base[i] if kind == "init" else 0.0] * len(r) for i, (_, kind, r) in enumerate(rows)]
    aux_sum = [[0.0] * len(r) for r in rewards]
    aux_count = [[0] * len(r) for r in rewards]
    for orig, branch, split, _ in metas:
        for t in range(split + 1):
            aux_sum[orig][t] += base[branch]
            aux_count[orig][t] += 1
    return [[a + s / c if c else a for a, s, c in zip(adv, sums, counts)]
            for adv, sums, counts in zip(advantages, aux_sum, aux_count)]


def released_future_kl_weights(delta, advantages, b=1.0, gamma=1.0, clip=0.2, c=3.0, safety=4.0):
    # released compute_policy_loss_future_kl (future_kl_clip_high_only=True): Δ clamped to ±20, ratio = exp(Δ);
    # FutureKL_t = Σ_{k≥t} γ^{k−t}·1[Δ_k ≤ log c]·Δ_k; f = clip(exp(FutureKL), 1, 1 + ε); f ∈ [0.8, 1] where A < 0 and
    # ratio > 4; Ã = A·(1 + b·f)
    delta = [min(max(d, -20.0), 20.0) for d in delta]
    kept = [d if d <= math.log(c) else 0.0 for d in delta]
    n = len(delta)
    future = [sum(gamma ** (k - t) * kept[k] for k in range(t, n)) for t in range(n)]
    weights = [min(max(math.exp(s), 1.0), 1.0 + clip) for s in future]
    weights = [min(max(w, 0.8), 1.0) if a < 0 and math.exp(d) > safety else w
               for w, a, d in zip(weights, advantages, delta)]
    return future, weights, [a * (1.0 + b * w) for a, w in zip(advantages, weights)]


def appo_rollout(episode_id, actions, rewards, parent=None, fork_step=0):
    steps = [Step("o", "x", action_ids=list(ids), reward=r) for ids, r in zip(actions, rewards)]
    return Trajectory(task={}, steps=steps, episode_id=episode_id, parent_id=parent, fork_step=fork_step)


def test_appo_page_hand_case_matches_the_released_code():
    # Eq. 1, future value: Δ = [0.1, 0, −0.1], γ = 1: S = [0.1 + 0 − 0.1, 0 − 0.1, −0.1] = [0, −0.1, −0.1],
    # Ω = exp(S) = [1.0, 0.9048, 0.9048] (inside [0.8, 1.2]: the clip leaves them).
    omegas = released_future_values([0.1, 0.0, -0.1])
    assert [round(v, 4) for v in omegas] == [1.0, 0.9048, 0.9048]
    assert future_values([0.1, 0.0, -0.1]) == pytest.approx(omegas, abs=1e-9)

    # Eqs. 2-3, branching score: H = [2.0, 0.5, 1.5, 0.1]: μ = 1.025, σ = 0.7596, z(H) = [1.284, −0.691, 0.625, −1.218];
    # Ω = [1.1, 1.0, 0.9, 1.2]: μ = 1.05, σ = 0.1118, z(Ω) = [0.447, −0.447, −1.342, 1.342];
    # BS = [0.574, 0.309, −0.839, −1.634]; only token 0 qualifies (token 1: BS > 0 but both z < 0).
    entropies, omegas = [2.0, 0.5, 1.5, 0.1], [1.1, 1.0, 0.9, 1.2]
    assert [round(z, 3) for z in released_zscore(entropies)] == [1.284, -0.691, 0.625, -1.218]
    assert [round(z, 3) for z in released_zscore(omegas)] == [0.447, -0.447, -1.342, 1.342]
    scores, eligible = released_branching(entropies, omegas)
    assert [round(s, 3) for s in scores] == [0.574, 0.309, -0.839, -1.634]
    assert eligible == [True, False, False, False]
    ours, ours_eligible, used_omega = branching_scores(entropies, omegas)
    assert ours == pytest.approx(scores, abs=1e-12) and ours_eligible == eligible and used_omega

    # Eq. 5, reward scale: split k = 3 with BS = BS_max: M = 1 + 0.9^(3 − t) = [1.729, 1.81, 1.9, 2.0].
    scale = released_reward_scale(3, 2.5, 2.5, 4)
    assert scale == pytest.approx([1.729, 1.81, 1.9, 2.0], abs=1e-12)
    assert prefix_scale(split=3, score=2.5, score_max=2.5) == pytest.approx(scale, abs=1e-12)

    # Eq. 7, future-KL factor: the same Δ, γ = 1: FutureKL = [0, −0.1, −0.1], exp = [1, 0.905, 0.905], high-only clip
    # to [1, 1.2]: f = [1, 1, 1], so Ã = A·(1 + 1·1) = 2A on every token (A = 0.5 here).
    future, weights, scaled = released_future_kl_weights([0.1, 0.0, -0.1], [0.5, 0.5, 0.5])
    assert future == pytest.approx([0.0, -0.1, -0.1], abs=1e-12)
    assert weights == [1.0, 1.0, 1.0] and scaled == [1.0, 1.0, 1.0]
    delta = torch.tensor([[0.1, 0.0, -0.1]], dtype=torch.float64)
    ours_scaled, ours_weights, dropped = future_kl_advantages(
        torch.full((1, 3), 0.5, dtype=torch.float64), delta, delta.exp(), torch.ones(1, 3), gamma=1.0)
    assert ours_weights.tolist() == [weights] and ours_scaled.tolist() == [scaled] and not dropped.any()

    # Eq. 6, dual group, one split per initial rollout: returns [1, 0] give A_o = ±1 (μ = 0.5, population σ = 0.5);
    # branch returns [1, 0] give A_b = ±1; splits at token 1 of a 3-token action whose reward sits on token 2 (after
    # the split: M leaves it alone): the first rollout's tokens are [1 + 1, 1 + 1, 1] = [2, 2, 1], the second's
    # [−2, −2, −1], the branches 0 (up to the released ε: 1/(0.5 + 1e-6) = 0.999998).
    rows = [("t", "init", [0, 0, 1.0]), ("t", "init", [0, 0, 0.0]), ("t", "branch", [0, 0, 1.0]),
            ("t", "branch", [0, 0, 0.0])]
    released = released_appo_advantages(rows, [(0, 2, 1, 1.0), (1, 3, 1, 1.0)], score_max=1.0)
    assert released == [pytest.approx(row, abs=1e-5) for row in ([2, 2, 1], [-2, -2, -1], [0, 0, 0], [0, 0, 0])]
    group = Group(task={}, trajectories=[appo_rollout(0, [[5, 6, 7]], [1.0]), appo_rollout(1, [[5, 6, 7]], [0.0]),
                                         appo_rollout(2, [[5, 6, 7]], [1.0], parent=0),
                                         appo_rollout(3, [[5, 6, 7]], [0.0], parent=1)])
    points = [BranchPoint(0, 2, 0, 0, 1, 1, 1.0, (5, 6)), BranchPoint(0, 3, 1, 0, 1, 1, 1.0, (5, 6))]
    (ours,), _ = appo_advantages([group], APPOParams(branch_points=[points], score_max=1.0))
    assert [per_token(row, t) for row, t in zip(ours, group.trajectories)] == [
        pytest.approx(row, abs=1e-9) for row in released]

    # Eqs. 5-6 where M matters: three initial rollouts of two steps ([5, 6, 7] then [8, 9]: the step rewards sit on
    # tokens 2 and 4) with step rewards [0.5, 0.5], [0, 0] and [0, 1]; the first has one branch split at token 3
    # with BS = BS_max = 1 (return 0.5: the step it shares with its origin), the second one at token 0 with BS = 0.5
    # (return 1).
    # M = 1 + 0.9^(3 − τ) on the first rollout: 1.9 on token 2, 1 on token 4: R' = 0.5·1.9 + 0.5 = 1.45;
    # R' = [1.45, 0, 1]: μ = 0.81667, σ = 0.60599, A_o = [1.04512, −1.34766, 0.30254]; A_b = [−1, +1].
    # The first rollout's tokens 0-3 get 1.04512 − 1 = 0.04512, token 4 keeps 1.04512; the second's token 0 gets
    # −1.34766 + 1 = −0.34766.
    # The first branch repeats its parent's first step (tokens 0-2, reward 0.5 on token 2) before its own [8, 1]: the
    # released code scores a branch's whole response, prefix included, and the project sums all its steps, so its
    # return is 0.5 + 0. The z-scores of [0.5, 1] are ±1 up to ε: with the released ε = 1e-6,
    # A_b = ±0.25/(0.25 + 1e-6) = ±0.999996 and the prefix tokens are 1.0451224 − 0.999996 = 0.0451264 (the page,
    # with ε = 0: 0.04512). The page's five decimals hold to 1e-5.
    rows = [("t", "init", [0, 0, 0.5, 0, 0.5]), ("t", "init", [0, 0, 0, 0, 0]), ("t", "init", [0, 0, 0, 0, 1.0]),
            ("t", "branch", [0, 0, 0.5, 0, 0]), ("t", "branch", [0, 0, 1.0])]
    metas = [(0, 3, 3, 1.0), (1, 4, 0, 0.5)]
    released = released_appo_advantages(rows, metas, score_max=1.0)
    assert released[0] == pytest.approx([0.04512] * 4 + [1.04512], abs=1e-5)
    assert released[1] == pytest.approx([-0.34766] + [-1.34766] * 4, abs=1e-5)
    assert released[2] == pytest.approx([0.30254] * 5, abs=1e-5)
    assert released[3:] == [[0.0] * 5, [0.0] * 3]
    init0 = appo_rollout(0, [[5, 6, 7], [8, 9]], [0.5, 0.5])
    branch3 = appo_rollout(3, [[5, 6, 7], [8, 1]], [0.0, 0.0], parent=0, fork_step=1)
    branch3.steps[0] = init0.steps[0]  # the shared step
    group = Group(task={}, trajectories=[init0, appo_rollout(1, [[5, 6, 7], [8, 9]], [0.0, 0.0]),
                                         appo_rollout(2, [[5, 6, 7], [8, 9]], [0.0, 1.0]), branch3,
                                         appo_rollout(4, [[5, 2, 2]], [1.0], parent=1)])
    points = [BranchPoint(0, 3, 0, 1, 0, 3, 1.0, (8,)), BranchPoint(0, 4, 1, 0, 0, 0, 0.5, (5,))]
    (ours,), _ = appo_advantages([group], APPOParams(branch_points=[points]))  # BS_max: the group's own (1); ε: the released 1e-6
    assert [per_token(row, t) for row, t in zip(ours[:3], group.trajectories)] == [
        pytest.approx(row, abs=1e-9) for row in released[:3]]
    assert ours[3:] == [[0.0, 0.0], [0.0]]  # a branch trains nothing

    # With BS_max = 2 from another task of the batch: M(2) = 1 + (1/2)·0.9 = 1.45, R'_0 = 0.725 + 0.5 = 1.225,
    # A_o = [0.90780, −1.39301, 0.48520].
    released = released_appo_advantages(rows, metas, score_max=2.0)
    assert [released[i][4] for i in range(3)] == pytest.approx([0.90780, -1.39301, 0.48520], abs=1e-5)
    (ours,), _ = appo_advantages([group], APPOParams(branch_points=[points], score_max=2.0))
    assert [per_token(row, t) for row, t in zip(ours[:3], group.trajectories)] == [
        pytest.approx(row, abs=1e-9) for row in released[:3]]


# ---------------------------------------------------------------- Tool-RL (arXiv 2606.26027), docs/methods/toolrl.md


def released_off_policy_loss(pi, advantage, clip=0.2, dual_clip=3.0):
    # released compute_token_on_off_policy_loss, off-policy tokens: f = π/(π + 0.1), clamped to at most 1 + ε, then
    # to at least 1 − ε (ε: the symmetric clip_ratio); ℓ = max(−A·f, −A·clip(f)); where A < 0, ℓ = min(−A·c, ℓ).
    # (Its actor passes no off_clip_ratio_c, so c is None there and −A·c raises; with c = 3, as the page reads it,
    # the dual clip never binds: clip(f) ≤ 1 < 3.)
    f = pi / (pi + 0.1)
    f_clipped = torch.clamp(torch.clamp(f, max=1.0 + clip), min=1.0 - clip)
    loss = torch.maximum(-advantage * f, -advantage * f_clipped)
    return torch.where(advantage < 0, torch.minimum(-advantage * dual_clip, loss), loss)


def released_gradient(pi, advantage):
    logp = torch.tensor(math.log(pi), dtype=torch.float64, requires_grad=True)
    released_off_policy_loss(logp.exp(), torch.tensor(advantage, dtype=torch.float64)).backward()
    return float(logp.grad)


def project_gradient(pi, advantage):
    logp = torch.tensor([[math.log(pi)]], dtype=torch.float64, requires_grad=True)
    off_policy_token_loss(logp, torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 1),
                          clip=(0.8, 1.2)).sum().backward()
    return float(logp.grad)


def test_toolrl_page_hand_case_matches_the_released_code():
    # LUFFY shaping, γ = 0.1, π = [0.1, 0.4, 0.9]: f = [0.1/0.2, 0.4/0.5, 0.9/1.0] = [0.5, 0.8, 0.9]; clamped to
    # [0.8, 1.2]: [0.8, 0.8, 0.9].
    pi = torch.tensor([0.1, 0.4, 0.9], dtype=torch.float64)
    f = pi / (pi + 0.1)
    assert f.tolist() == pytest.approx([0.5, 0.8, 0.9], abs=1e-12)
    assert shaped_off_policy_ratio(pi.log()).tolist() == pytest.approx(f.tolist(), abs=1e-12)
    assert shaped_off_policy_ratio(pi.log(), clip=(0.8, 1.2)).tolist() == pytest.approx([0.8, 0.8, 0.9], abs=1e-12)

    # The released pessimistic form, A = 2: max(−2f, −2·clip(f)) = max([−1, −1.6, −1.8], [−1.6, −1.6, −1.8])
    # = [−1, −1.6, −1.8].
    released = released_off_policy_loss(pi, torch.tensor(2.0, dtype=torch.float64))
    assert released.tolist() == pytest.approx([-1.0, -1.6, -1.8], abs=1e-12)
    ours = off_policy_token_loss(pi.log().unsqueeze(0), torch.tensor([2.0], dtype=torch.float64), torch.ones(1, 3),
                                 clip=(0.8, 1.2))
    assert ours.tolist() == [pytest.approx(released.tolist(), abs=1e-12)]

    # Below the clip the max keeps −A·f, so d ℓ/d log π = −A·γπ/(π + γ)²: A = 1, π = 0.05: −0.1·0.05/0.15² = −0.2222;
    # π = 0.39: −0.1624; π = 0.6 (f = 0.857, inside the clip): −0.1224. A = −1, π = 0.2: the max keeps −A·0.8
    # (a constant): 0.
    for p, a, expected in ((0.05, 1.0, -0.2222), (0.39, 1.0, -0.1624), (0.6, 1.0, -0.1224), (0.2, -1.0, 0.0)):
        assert round(released_gradient(p, a), 4) == expected, (p, a)
        assert project_gradient(p, a) == pytest.approx(released_gradient(p, a), abs=1e-12), (p, a)

    # LUFFY in the loss: two rows of two tokens, row 2 teacher forced, A = [1, −2], π = [0.1, 0.5] in both rows.
    # The released total is the token mean over all four tokens of off·ℓ_off + (1 − off)·ℓ_on. Row 1 is on-policy
    # (ratio 1): ℓ_on = −1, −1. Row 2, A = −2: f = [0.5, 0.8333], clip(f) = [0.8, 0.8333]:
    # ℓ_off = max(2f, 2·clip(f)) = [1.6, 1.6667] (the dual clip 2·3 = 6 does not bind).
    # Forced tokens' share of the mean: (1.6 + 1.6667)/4 = 0.81667; the whole loss (−1 − 1 + 1.6 + 1.6667)/4 = 0.31667.
    # (The page also gives 0.6667 = 2·(0.5 + 0.8333)/4 for `toolrl_luffy_clip: false`, LUFFY's plain −A·f, which the
    # released code does not have: it always clips.)
    forced_pi = torch.tensor([0.1, 0.5], dtype=torch.float64)
    forced = released_off_policy_loss(forced_pi, torch.tensor(-2.0, dtype=torch.float64))
    assert forced.tolist() == pytest.approx([1.6, 2 * 0.5 / 0.6], abs=1e-12)
    assert float(forced.sum()) / 4 == pytest.approx(0.81667, abs=1e-5)
    assert (-1.0 - 1.0 + float(forced.sum())) / 4 == pytest.approx(0.31667, abs=1e-5)
    logps = torch.log(torch.tensor([[0.1, 0.5], [0.1, 0.5]], dtype=torch.float64))
    mask = torch.tensor([[0, 0], [1, 1]])
    advantages = torch.tensor([1.0, -2.0], dtype=torch.float64)
    ours = off_policy_token_loss(logps, advantages, mask, clip=(0.8, 1.2))
    assert float(ours.sum()) / 4 == pytest.approx(float(forced.sum()) / 4, abs=1e-12)
    assert float(off_policy_token_loss(logps, advantages, mask).sum()) / 4 == pytest.approx(0.6667, abs=1e-4)


# ---------------------------------------------------------------- 3SPO (arXiv 2606.09961), docs/methods/3spo.md


class ReleasedStateScores:
    """released StateScoreManager (get_score, get_omega) on a fixed table: state -> (N, N⁺), counter t."""

    def __init__(self, counts, t, alpha=1.0, xi=10.0, zeta=0.1, eps=1e-6):
        self.counts, self.t, self.alpha, self.xi, self.zeta, self.eps = counts, t, alpha, xi, zeta, eps

    def score(self, state):
        # get_score: 1 if N = 0; SR = N⁺/(N + ε), λ = α·log t; 0 unless N − N⁺ < ξ or SR > ζ; else exp(−λ·SR)
        n, n_plus = self.counts.get(state, (0, 0))
        if n == 0:
            return 1.0
        rate = n_plus / (n + self.eps)
        if not (n - n_plus < self.xi or rate > self.zeta):
            return 0.0
        return math.exp(-self.alpha * math.log(self.t) * rate)

    def omega(self, state, k=0.1):
        # get_omega: 0.5·exp(−k·N)
        return 0.5 * math.exp(-k * self.counts.get(state, (0, 0))[0])

    def step_reward(self, state, next_state, success):
        # compute_3spo_step_reward: ω·1[h(s) ≠ h(s')] + (0.5 − ω)·(S(s) − S(s')) + 0.5·R_success
        w = self.omega(state)
        novel = 1.0 if state != next_state else 0.0
        return w * novel + (0.5 - w) * (self.score(state) - self.score(next_state)) + 0.5 * success


def released_mean_norm(rewards, uids):
    # step_norm_reward with remove_std=True (compute_3spo_advantage): reward − mean of its uid (a singleton: 0)
    members = defaultdict(list)
    for r, u in zip(rewards, uids):
        members[u].append(r)
    return [r - sum(members[u]) / len(members[u]) for r, u in zip(rewards, uids)]


def sspo_table():
    table = StateScoreTable(alpha=1.0, t=5)
    for state, counts in {"s0": [4, 2], "s1": [2, 2], "s2": [12, 0]}.items():
        table.counts[table.key(state, "t")] = counts
    return table


def sspo_group(*episodes):
    return Group(task={"task_id": "t"}, trajectories=[Trajectory(task={"task_id": "t"}, steps=list(steps),
                                                                 success=success) for steps, success in episodes])


def keyed(state, reached=None, reward=0.0):
    step = Step(observation=f"view of {state}", action_text="act", reward=reward, state_key=state)
    if reached is not None:
        step.signals["state_key"] = Transition(state, reached)
    return step


def test_3spo_page_hand_case_matches_the_released_code():
    # Table (α = 1, ξ = 10, ζ = 0.1, ω_k = 0.1, t = 5, λ = log 5 = 1.6094379):
    #   s0: N = 4, N⁺ = 2 -> SR = 0.4999999 -> S = exp(−λ·SR) = 0.4472137;  s1: N = 2, N⁺ = 2 -> S = 0.2000002;
    #   s2: N = 12, N⁺ = 0 -> N_fail 12 ≥ ξ and SR 0 ≤ ζ -> S = 0;  s3: never visited -> S = 1.
    #   ω = 0.5·exp(−0.1·N): s0 0.3351600, s1 0.4093654, s2 0.1505971, s3 0.5.
    released = ReleasedStateScores({"s0": (4, 2), "s1": (2, 2), "s2": (12, 0)}, t=5)
    states = ("s0", "s1", "s2", "s3")
    assert [round(released.score(s), 7) for s in states] == [0.4472137, 0.2000002, 0.0, 1.0]
    assert [round(released.omega(s), 7) for s in states] == [0.3351600, 0.4093654, 0.1505971, 0.5]
    table = sspo_table()
    assert [table.score(s, "t") for s in states] == pytest.approx([released.score(s) for s in states], abs=1e-12)
    assert [table.omega(s, "t") for s in states] == pytest.approx([released.omega(s) for s in states], abs=1e-12)

    # Group (λ_inv = 0.1): A: s0 -> s1 -> success; B: s0 -> s2 -> fail; C: s0 (invalid, stays) -> s0 -> s3 -> fail.
    #   A0 = 0.3351600 + 0.1648400·(0.4472137 − 0.2000002) = 0.3759107
    #   B0 = 0.3351600 + 0.1648400·(0.4472137 − 0)         = 0.4088787
    #   C0 = 0 (not novel, no score change), ρ = −0.1
    #   C1 = 0.3351600 + 0.1648400·(0.4472137 − 1)         = 0.2440387
    # Siblings at s0 = {A0, B0, C0, C1}: ρ = [0.3759107, 0.4088787, −0.1, 0.2440387], mean 0.2322070;
    # mean_norm: [0.1437037, 0.1766717, −0.3322070, 0.0118317]. The last steps (A1 at s1, B1 at s2, C2 at s3) are
    # singletons: 0, whatever their reward.
    a0, b0 = released.step_reward("s0", "s1", 0), released.step_reward("s0", "s2", 0)
    c0, c1 = released.step_reward("s0", "s0", 0), released.step_reward("s0", "s3", 0)
    assert [round(r, 7) for r in (a0, b0, c0, c1)] == [0.3759107, 0.4088787, 0.0, 0.2440387]
    rho = [a0, 0.0, b0, 0.0, c0 - 0.1, c1, 0.0]  # the singletons' rewards do not matter
    centred = released_mean_norm(rho, ["s0", "s1", "s0", "s2", "s0", "s0", "s3"])
    assert [round(a, 7) for a in centred] == [0.1437037, 0.0, 0.1766717, 0.0, -0.3322070, 0.0118317, 0.0]
    group = sspo_group(([Step("s0", "act"), Step("s1", "act", reward=1.0)], True),
                       ([Step("s0", "act"), Step("s2", "act")], False),
                       ([Step("s0", "act", valid=False), Step("s0", "act"), Step("s3", "act")], False))
    rewards, _ = sspo_step_rewards(group, sspo_table())
    assert [rewards[0][0], rewards[1][0], rewards[2][0], rewards[2][1]] == pytest.approx([a0, b0, c0, c1], abs=1e-12)
    (ours,), _ = sspo_advantages([group], SSPOParams(state_scores=sspo_table()))
    assert [a for row in ours for a in row] == pytest.approx(centred, abs=1e-12)

    # The state after a last action, looked up in the table: A': s0 -> s1 -> its last action reaches "goal" (never
    # seen, S = 1), success; B': s0 -> s1 -> reaches s2 (S = 0).
    #   A'1 = 0.4093654 + 0.0906346·(0.2000002 − 1) + 0.5 = 0.8368577;  B'1 = 0.4093654 + 0.0906346·(0.2000002 − 0)
    #   = 0.4274923; siblings at s1: mean 0.6321750 -> ±0.2046827 (A'0 = B'0 = 0.3759107: 0).
    a1, b1 = released.step_reward("s1", "goal", 1), released.step_reward("s1", "s2", 0)
    assert [round(a1, 7), round(b1, 7)] == [0.8368577, 0.4274923]
    centred = released_mean_norm([a0, a1, a0, b1], ["s0", "s1", "s0", "s1"])
    assert [round(a, 7) for a in centred] == [0.0, 0.2046827, 0.0, -0.2046827]
    group = sspo_group(([keyed("s0"), keyed("s1", reached="goal", reward=1.0)], True),
                       ([keyed("s0"), keyed("s1", reached="s2")], False))
    rewards, _ = sspo_step_rewards(group, sspo_table())
    assert [r for row in rewards for r in row] == pytest.approx([a0, a1, a0, b1], abs=1e-12)
    (ours,), _ = sspo_advantages([group], SSPOParams(state_scores=sspo_table()))
    assert [a for row in ours for a in row] == pytest.approx(centred, abs=1e-12)


# ---------------------------------------------------------------- SDAR (arXiv 2605.15155), docs/methods/sdar.md


def released_sdar_loss(student, teacher, mask, beta=5.0):
    # released compute_sdar_loss: g = sg(σ(β·(log π_T − sg(log π_θ)))), loss = token-mean of g·(log π_T − log π_θ)
    # (verl masked_mean: Σ m·x / (Σ m + 1e-8))
    teacher = teacher.detach()
    gate = torch.sigmoid(beta * (teacher - student.detach())).detach()
    terms = gate * (teacher - student)
    return gate, terms, (terms * mask).sum() / (mask.sum() + 1e-8)


def test_sdar_page_hand_case_matches_the_released_code():
    # Δ = [1, −1, 0, 0.2], β = 5: g = [σ(5), σ(−5), σ(0), σ(1)] = [0.99331, 0.00669, 0.5, 0.73106];
    # ℓ = g·Δ = [0.99331, −0.00669, 0, 0.14621]; ∂ℓ/∂log π_θ = −g.
    # Masked mean over tokens {0, 1, 3}: (0.99331 − 0.00669 + 0.14621)/3 = 0.37761, gradient −g/3 on those tokens.
    delta = torch.tensor([[1.0, -1.0, 0.0, 0.2]], dtype=torch.float64)
    student_values = torch.tensor([[-2.0, -1.0, -1.5, -1.2]], dtype=torch.float64)
    teacher = student_values + delta
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    student = student_values.clone().requires_grad_()
    gate, terms, loss = released_sdar_loss(student, teacher, mask)
    assert [round(g, 5) for g in gate[0].tolist()] == [0.99331, 0.00669, 0.5, 0.73106]
    assert [round(t, 5) for t in terms[0].tolist()] == [0.99331, -0.00669, 0.0, 0.14621]
    assert round(float(loss.detach()), 5) == 0.37761
    (released_grad,) = torch.autograd.grad(loss, student)
    assert released_grad[0].tolist() == pytest.approx([-0.99331 / 3, -0.00669 / 3, 0.0, -0.73106 / 3], abs=1e-5)

    assert sdar_gate(delta).flatten().tolist() == pytest.approx(gate.flatten().tolist(), abs=1e-12)
    student = student_values.clone().requires_grad_()
    ours_terms = sdar_token_terms(student, teacher, beta=5.0)
    ours_loss = masked_token_mean(ours_terms, mask)
    assert ours_terms.flatten().tolist() == pytest.approx(terms.flatten().tolist(), abs=1e-12)
    assert float(ours_loss.detach()) == pytest.approx(float(loss.detach()), abs=1e-8)  # /3 against /(3 + 1e-8)
    (ours_grad,) = torch.autograd.grad(ours_loss, student)
    assert ours_grad.flatten().tolist() == pytest.approx(released_grad.flatten().tolist(), abs=1e-8)

    # β = 0 (the GRPO+OPSD ablation): g = 0.5 everywhere, ℓ = 0.5·Δ = [0.5, −0.5, 0, 0.1].
    _, terms, _ = released_sdar_loss(student_values, teacher, mask, beta=0.0)
    assert terms[0].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.1], abs=1e-12)
    assert sdar_token_terms(student_values, teacher, beta=0.0).flatten().tolist() == pytest.approx(
        terms.flatten().tolist(), abs=1e-12)


# ---------------------------------------------------------------- OPSD (arXiv 2601.18734), docs/methods/opsd.md


def released_jsd(student_logits, teacher_logits, beta, temperature=1.0, top_k=None):
    # released generalized_jsd_loss (per position, before the token mean): both logits / τ; top_k: the teacher's k
    # largest, the student gathered at the same ids, both renormalised; β = 0: KL(p_T‖p_S); β = 1: KL(p_S‖p_T);
    # else log M = logsumexp(log p_S + log(1 − β), log p_T + log β), β·KL(p_T‖M) + (1 − β)·KL(p_S‖M)
    student, teacher = student_logits / temperature, teacher_logits / temperature
    if top_k:
        ids = torch.topk(teacher, k=top_k, dim=-1).indices
        student, teacher = student.gather(-1, ids), teacher.gather(-1, ids)
    log_s, log_t = torch.log_softmax(student, -1), torch.log_softmax(teacher, -1)

    def kl(log_p, log_q):  # Σ p·(log p − log q)
        return (log_p.exp() * (log_p - log_q)).sum(-1)

    if beta == 0:
        return kl(log_t, log_s)
    if beta == 1:
        return kl(log_s, log_t)
    log_m = torch.logsumexp(torch.stack([log_s + math.log(1 - beta), log_t + math.log(beta)]), dim=0)
    return beta * kl(log_t, log_m) + (1 - beta) * kl(log_s, log_m)


def test_opsd_page_hand_case_matches_the_released_code():
    # Two-token vocabulary: student logits [0, 0] -> p_S = [0.5, 0.5]; teacher [ln 3, 0] -> p_T = [0.75, 0.25].
    student = torch.zeros(1, 1, 2, dtype=torch.float64)
    teacher = torch.tensor([[[math.log(3.0), 0.0]]], dtype=torch.float64)
    # β = 0.5: M = [0.625, 0.375], KL(p_T‖M) = 0.035375, KL(p_S‖M) = 0.032269, L = 0.033822
    # β = 0: KL(p_T‖p_S) = 0.75·ln 1.5 + 0.25·ln 0.5 = 0.130812;  β = 1: KL(p_S‖p_T) = 0.143841
    # β = 0.25: M = [0.5625, 0.4375], L = 0.25·0.075858 + 0.75·0.007874 = 0.024870
    for beta, expected in ((0.5, 0.033822), (0.0, 0.130812), (1.0, 0.143841), (0.25, 0.024870)):
        released = released_jsd(student, teacher, beta)
        assert round(float(released), 6) == expected, beta
        assert float(generalized_jsd(student, teacher, beta=beta)) == pytest.approx(float(released), abs=1e-9)

    # β = 0: gradient w.r.t. the student logits p_S − p_T = [−0.25, 0.25].
    logits = student.clone().requires_grad_()
    (grad,) = torch.autograd.grad(released_jsd(logits, teacher, 0.0).sum(), logits)
    assert grad.flatten().tolist() == pytest.approx([-0.25, 0.25], abs=1e-12)
    logits = student.clone().requires_grad_()
    (ours_grad,) = torch.autograd.grad(generalized_jsd(logits, teacher, beta=0.0).sum(), logits)
    assert ours_grad.flatten().tolist() == pytest.approx(grad.flatten().tolist(), abs=1e-9)

    # τ = 2 on teacher logits [2 ln 3, 0] gives the β = 0.5 value again; τ = 1 on them: p_T = [0.9, 0.1], L = 0.101750
    # (0.1017492: the page's sixth decimal is one unit high, so it holds to 1e-6).
    doubled = 2 * teacher
    for temperature, expected in ((2.0, 0.033822), (1.0, 0.101750)):
        released = released_jsd(student, doubled, 0.5, temperature=temperature)
        assert float(released) == pytest.approx(expected, abs=1e-6), temperature
        assert float(generalized_jsd(student, doubled, beta=0.5, temperature=temperature)) == pytest.approx(
            float(released), abs=1e-9)

    # top_k = 2 on teacher [ln 3, 0, −5], student [0, 0, 7]: both renormalised over tokens {0, 1} -> 0.033822.
    wide_teacher = torch.tensor([[[math.log(3.0), 0.0, -5.0]]], dtype=torch.float64)
    wide_student = torch.tensor([[[0.0, 0.0, 7.0]]], dtype=torch.float64)
    released = released_jsd(wide_student, wide_teacher, 0.5, top_k=2)
    assert round(float(released), 6) == 0.033822
    assert float(generalized_jsd(wide_student, wide_teacher, beta=0.5, top_k=2)) == pytest.approx(
        float(released), abs=1e-9)

    # Sampled-token variant (released compute_loss with use_thinking_machines_loss): A = sg(log p_T − log p_S),
    # ℓ = −A·log p_S. log p_T − log p_S = +1 on every token -> ℓ_t = −log p_S(y_t), gradient −1 per token.
    student_logps = torch.tensor([[-2.0, -0.5, -1.25]], dtype=torch.float64)
    teacher_logps = student_logps + 1.0
    logps = student_logps.clone().requires_grad_()
    released = -(teacher_logps - logps).detach() * logps
    (grad,) = torch.autograd.grad(released.sum(), logps)
    assert released.detach().tolist() == [[2.0, 0.5, 1.25]] and grad.tolist() == [[-1.0] * 3]
    logps = student_logps.clone().requires_grad_()
    ours = sampled_token_distillation(logps, teacher_logps)
    (ours_grad,) = torch.autograd.grad(ours.sum(), logps)
    assert ours.detach().tolist() == released.detach().tolist() and ours_grad.tolist() == grad.tolist()


# ---------------------------------------------------------------- GRSD (arXiv 2607.28076), docs/methods/grsd.md


def released_turn_advantages(advantages, teacher_turns, student_turns, mixed, lam=0.5, eta=0.0, g_max=0.2):
    # released compute_grsd_turn_advantage, one group: δ = mean teacher log-prob − mean student log-prob of the turn;
    # q = sign(A)·δ; e = expm1(clamp(q, ±20)); ν = e/(mean over the group's valid rows of |e| + 1e-6);
    # g = ν where |ν| > η else 0; ĝ = clamp(g·m, ±g_max); Â = A·max(1 + λ·ĝ·m, 0.1)
    m = 1.0 if mixed else 0.0
    deltas = [sum(t) / len(t) - sum(s) / len(s) for t, s in zip(teacher_turns, student_turns)]
    e = [math.expm1(min(max(math.copysign(1.0, a) * d if a else 0.0, -20.0), 20.0)) for a, d in zip(advantages, deltas)]
    scale = sum(abs(v) for v in e) * m / max(len(e) * m, 1.0)
    nu = [v / (scale + 1e-6) for v in e]
    g = [v if abs(v) > eta else 0.0 for v in nu]
    g_hat = [min(max(v * m, -g_max), g_max) for v in g]
    return deltas, e, nu, [a * max(1.0 + lam * v * m, 0.1) for a, v in zip(advantages, g_hat)]


def released_reflection_advantages(scores, valid):
    # released compute_group_normalized_advantage, one group: (s − mean)/(std + 1e-6) over the valid scores
    # (numpy's population std); an invalid row gets 0 and stays in the reflection batch (its tokens count in the
    # token mean); fewer than two valid scores: all 0
    kept = [s for s, v in zip(scores, valid) if v]
    if len(kept) < 2:
        return [0.0] * len(scores)
    mean = sum(kept) / len(kept)
    return [(s - mean) / (population_std(kept) + 1e-6) if v else 0.0 for s, v in zip(scores, valid)]


def test_grsd_page_hand_case_matches_the_released_code():
    # One mixed group, two step rows, A = [+1, −1], δ = [0.2, 0.1] (turn means: teacher [−1.0, −0.6] vs student
    # [−1.2, −0.8]; teacher [−0.5] vs student [−0.6]), λ = 0.5, η = 0, g_max = 0.2:
    #   q = sign(A)·δ = [0.2, −0.1];  e = expm1(q) = [0.221403, −0.095163];  mean|e| = 0.158283
    #   ν = e/(0.158283 + 1e-6) = [1.3988, −0.6012];  ĝ = clip(ν, ±0.2) = [0.2, −0.2]
    #   factor = max(1 + 0.5·ĝ, 0.1) = [1.1, 0.9];  Â = A·factor = [+1.1, −0.9]
    teacher_turns, student_turns = [[-1.0, -0.6], [-0.5]], [[-1.2, -0.8], [-0.6]]
    deltas, e, nu, released = released_turn_advantages([1.0, -1.0], teacher_turns, student_turns, mixed=True)
    assert [round(d, 6) for d in deltas] == [0.2, 0.1]
    assert [round(v, 6) for v in e] == [0.221403, -0.095163]
    assert [round(v, 4) for v in nu] == [1.3988, -0.6012]
    assert released == pytest.approx([1.1, -0.9], abs=1e-12)
    ours_deltas = [turn_logprob_gap(t, s) for t, s in zip(teacher_turns, student_turns)]
    assert ours_deltas == pytest.approx(deltas, abs=1e-12)
    assert modulated_advantages([1.0, -1.0], ours_deltas, mixed=True) == pytest.approx(released, abs=1e-12)
    # Without a success/failure mix (m_x = 0): Â = A = [+1, −1].
    _, _, _, released = released_turn_advantages([1.0, -1.0], teacher_turns, student_turns, mixed=False)
    assert released == [1.0, -1.0] and modulated_advantages([1.0, -1.0], ours_deltas, mixed=False) == released

    # Reflection advantages, scores [3, 1, invalid, 2]: mean 2, population std √(2/3) = 0.816497
    # -> 1/(0.816497 + 1e-6) = 1.224743: [1.224743, −1.224743, 0 (invalid), 0]; a group with one valid score gives 0.
    released = released_reflection_advantages([3.0, 1.0, 0.0, 2.0], [True, True, False, True])
    assert released == pytest.approx([1.224743, -1.224743, 0.0, 0.0], abs=1e-6)
    ours = reflection_advantages([3, 1, None, 2])
    assert [ours[i] for i in (0, 1, 3)] == pytest.approx([released[i] for i in (0, 1, 3)], abs=1e-12)
    assert released_reflection_advantages([2.0, 0.0], [True, False]) == [0.0, 0.0]
    assert reflection_advantages([2, None])[0] == 0.0
    # The invalid one: 0, kept in the reflection batch (its tokens count in the token mean), in both.
    assert ours[2] == released[2] == 0.0


# ---------------------------------------------------------------- DPEPO (arXiv 2604.24320), docs/methods/dpepo.md


def released_weight(histories, actions, alpha=0.8, gamma=0.95, beta=0.95, omega=0.8, invalid=None, psi=0.95):
    """released calculate_penalties (ALFWorld loop; with `invalid`, the ScienceWorld loop's)."""
    acting = [e for e in actions if 1 <= e <= len(histories)]

    def pairs(seq):
        return list(zip(seq, seq[1:]))

    per_env = []
    for e in acting:
        past, action = histories[e], actions[e]
        c_depth = past.count(action)  # calculate_depth_repeat: the action anywhere in the copy's history
        last = (past[-1], action) if past else action  # a bare string (no pair can match) when the history is empty
        m_depth = pairs(past).count(last)  # calculate_transition_repeat within the copy
        m_width = sum(pairs(histories[w] + [actions[w]]).count(last) for w in acting if w != e)  # other acting copies
        per_env.append((alpha**c_depth + gamma**m_depth + beta**m_width) / 3)
    counted = [a for a in actions.values() if a != "look"]
    w_width = omega ** (len(counted) - len(set(counted)))  # the same action in several copies this turn
    if invalid is None:
        return round((w_width + sum(per_env) / len(per_env)) / 2, 4)
    return round((w_width + sum(per_env) / len(per_env) + psi**invalid) / 3, 4)


def released_dpepo_advantages(returns_per_row, weights):
    # released compute_grpo_outcome_advantage (cross-step statistics, add_step_penalty): z over every step row of
    # the group, (R − μ)/(σ + 1e-6), Bessel σ; then × (2 − W) if z < 0, else × W
    mean, std = sum(returns_per_row) / len(returns_per_row), bessel_std(returns_per_row)
    z = [(r - mean) / (std + 1e-6) for r in returns_per_row]
    return [v * ((2 - w) if v < 0 else w) for v, w in zip(z, weights)]


def test_dpepo_page_hand_case_matches_the_released_code():
    # s = "go to shelf 1", d = "open drawer 1", c = "go to cabinet 2"; K = 4; histories: copy 1 [s, d, s, d],
    # copy 2 [s, d], copies 3 and 4 []. The turn acts copy 1 -> s, copy 2 -> s, copy 3 -> c.
    #   copy 1: C_depth 2, M_depth 1 (pair (d, s) once), M_width 1: W_env = (0.8² + 0.95 + 0.95)/3 = 0.846667
    #   copy 2: C_depth 1, M_depth 0, M_width 2 (copy 1's [s, d, s, d, s] holds (d, s) twice):
    #           W_env = (0.8 + 1 + 0.95²)/3 = 0.900833
    #   copy 3: empty history: W_env = 1
    #   C_width = 3 − 2 = 1: 0.8¹; W = (0.8 + (0.846667 + 0.900833 + 1)/3)/2 = 0.857917 -> 0.8579
    #   ScienceWorld, one rejected sub-action: (0.8 + 0.915833 + 0.95)/3 = 0.8886; the released overwrite: 0.95.
    s, d, c = "go to shelf 1", "open drawer 1", "go to cabinet 2"
    histories = {1: [s, d, s, d], 2: [s, d], 3: [], 4: []}
    actions = {1: s, 2: s, 3: c}
    assert released_weight(histories, actions) == 0.8579
    assert released_weight(histories, actions, invalid=1) == 0.8886
    assert round(0.95**1, 4) == 0.95  # calculate_invalid_actions_penalties: ψ^n alone
    for formula, expected in (("alfworld", 0.8579), ("scienceworld", 0.8886), ("scienceworld_released", 0.95)):
        assert weight_terms(list(actions.items()), histories, num_envs=4, formula=formula, invalid=1).weight \
            == expected, formula

    # Episode A (2 turns, R = 1, W = 0.8579 then 1), episode B (1 turn, R = 0, nothing parsed: W = 0.5).
    # Step-row scores [1, 1, 0]: μ = 2/3, σ = √((1/9 + 1/9 + 4/9)/2) = 0.57735; z_A = +0.57735, z_B = −1.1547.
    # A = [0.57735·0.8579, 0.57735·1] = [0.4953, 0.5773]; B = −1.1547·(2 − 0.5) = −1.7320.
    released = released_dpepo_advantages([1.0, 1.0, 0.0], [0.8579, 1.0, 0.5])
    assert [round(a, 4) for a in released] == [0.4953, 0.5773, -1.732]
    group = Group(task={}, trajectories=[
        Trajectory(task={}, steps=[Step("o", "x"), Step("o", "y", reward=1.0)]),
        Trajectory(task={}, steps=[Step("o", "z")], episode_id=1)])
    (ours,), _ = dpepo_advantages([group], DPEPOParams(weights=[[[0.8579, 1.0], [0.5]]]))
    assert [a for row in ours for a in row] == pytest.approx(released, abs=1e-9)


# ---------------------------------------------------------------- ADRS (arXiv 2608.03223), docs/methods/adrs.md


def released_adrs(teacher_rows, returns, eta, eta_eff, clip=0.2, tau=2.0, temperature=1.0):
    """Rows of one task group, one step each. released compute_teacher_reward (baseline_mode="step",
    normalize_mode="per_seq"), compute_completion_level_tva (the fix5 launchers' tva_level=L2), compute_adrs_reward
    (q = η·σ(τ·TVA)·r̂, added to the token rewards) and compute_grpo_outcome_advantage (the fix5 additive branch)."""
    # r̂: centred within the step, divided by the row's population std + 1e-8
    r_hat = []
    for scores in teacher_rows:
        centred = [x - sum(scores) / len(scores) for x in scores]
        r_hat.append([x / (population_std(centred) + 1e-8) for x in centred])
    # TVA (L2): c_i = mean ℓ^T of the row; α = σ((c − mean_batch c)/T); TVA = Σα·R/(Σα + 1e-8) − Σ(1−α)·R/(Σ(1−α) + 1e-8)
    c = [sum(scores) / len(scores) for scores in teacher_rows]
    alpha = [1 / (1 + math.exp(-(x - sum(c) / len(c)) / temperature)) for x in c]
    tva = (sum(a * r for a, r in zip(alpha, returns)) / (sum(alpha) + 1e-8)
           - sum((1 - a) * r for a, r in zip(alpha, returns)) / (sum(1 - a for a in alpha) + 1e-8))
    gate = 1 / (1 + math.exp(-tau * tva))
    q = [[eta * gate * x for x in row] for row in r_hat]
    # GRPO z over the rows (the row sum of q is 0), Bessel σ, ε = 1e-6
    scores = [r + sum(row) for r, row in zip(returns, q)]
    sigma = bessel_std(scores)
    z = [(x - sum(scores) / len(scores)) / (sigma + 1e-6) for x in scores]
    # within-group standardisation of q over all the group's tokens (Bessel variance, + 1e-8), × η_eff, clipped to
    # c·min(1, σ_g/(median σ + 1e-6)) (one group: its own σ is the median)
    flat = [x for row in q for x in row]
    mean = sum(flat) / len(flat)
    scale = math.sqrt(sum((x - mean) ** 2 for x in flat) / (len(flat) - 1) + 1e-8)
    bound = clip * min(1.0, sigma / (sigma + 1e-6))
    terms = [[min(max(eta_eff * (x - mean) / scale, -bound), bound) for x in row] for row in q]
    return r_hat, tva, gate, z, bound, [[zi + t for t in row] for zi, row in zip(z, terms)]


def adrs_step(logps, reward):
    return Step("o", "a", action_ids=list(range(len(logps))), reward=reward, signals={"teacher_logprobs": list(logps)})


def test_adrs_page_hand_case_matches_the_released_code():
    # One group of two one-step episodes, η = 0.02: A scores ℓ^T = [−1, −3] and returns 1; B [−0.5, −1.5], returns 0.
    #   r̂: A mean −2, centred [1, −1], std 1 -> [1, −1];  B mean −1, centred [0.5, −0.5], std 0.5 -> [1, −1]
    #   c = [−2, −1], mean −1.5 -> α = [σ(−0.5), σ(0.5)] = [0.377541, 0.622459]
    #   TVA = 0.377541·1/1 − 0.622459·1/1 = −0.244919;  m = σ(−0.489837) = 0.379932
    #   z: scores [1, 0]: μ = 0.5, σ = 0.707107 -> ±0.707106
    #   q = 0.02·0.379932·[1, −1, 1, −1] = ±0.00759864; ẑ = ±0.865969; c_g = 0.2·0.707107/(0.707107 + 1e-6)
    #   = 0.199999717
    #   A = ±0.707106 + clip(0.02·ẑ = ±0.0173194) -> A: [0.724425, 0.689786], B: [−0.689786, −0.724425]
    #   (0.7071058 + 0.0173194 = 0.7244252)
    teacher_rows, returns = [[-1.0, -3.0], [-0.5, -1.5]], [1.0, 0.0]
    r_hat, tva, gate, z, bound, released = released_adrs(teacher_rows, returns, eta=0.02, eta_eff=0.02)
    assert r_hat == [pytest.approx([1.0, -1.0], abs=1e-7)] * 2
    assert (round(tva, 6), round(gate, 6)) == (-0.244919, 0.379932)
    assert [round(v, 6) for v in z] == [0.707106, -0.707106]
    assert round(bound, 9) == 0.199999717
    assert released == [pytest.approx(row, abs=1e-6) for row in ([0.724425, 0.689786], [-0.689786, -0.724425])]
    group = Group(task={}, trajectories=[Trajectory(task={}, steps=[adrs_step(lp, r)])
                                         for lp, r in zip(teacher_rows, returns)])
    ours, stats = adrs_advantages([group], ADRSParams(adrs_eta=0.02, eta_eff=0.02))
    assert [[a for s in traj for a in s] for traj in ours[0]] == [pytest.approx(row, abs=1e-7) for row in released]
    assert stats["tva"][0] == pytest.approx(tva, abs=1e-7) and stats["gate"][0] == pytest.approx(gate, abs=1e-7)

    # η_eff = 1: the term ±0.865969 is clipped to ±0.199999717 -> A: [0.907105, 0.507106].
    *_, released = released_adrs(teacher_rows, returns, eta=0.02, eta_eff=1.0)
    assert released[0] == pytest.approx([0.907105, 0.507106], abs=1e-6)
    ours, _ = adrs_advantages([group], ADRSParams(adrs_eta=0.02, eta_eff=1.0))
    assert [[a for s in traj for a in s] for traj in ours[0]] == [pytest.approx(row, abs=1e-7) for row in released]

    # The schedule (released fit loop, wn_warmup_steps = 20, wn_active_steps = 50): η_eff at steps 20 / 21 / 70 / 71
    # = 0 / 0.02 / 0.02 / 0.
    def released_eta(step, eta=0.02, warmup=20, active=50):
        return 0.0 if step <= warmup or (active > 0 and step > warmup + active) else eta

    assert [released_eta(s) for s in (20, 21, 70, 71)] == [0.0, 0.02, 0.02, 0.0]
    assert [adrs_eta_schedule(s, 0.02) for s in (20, 21, 70, 71)] == [released_eta(s) for s in (20, 21, 70, 71)]


# ---------------------------------------------------------------- CANOPY (arXiv 2609.01245), docs/methods/canopy.md


def released_grpo(returns, eps=1e-6):
    # verl compute_grpo_outcome_advantage (the released AppWorld launcher: adv_estimator=grpo,
    # norm_adv_by_std_in_grpo=True, ε left at its default 1e-6): (R − μ)/(σ + ε), Bessel σ (torch.std)
    mean, std = sum(returns) / len(returns), bessel_std(returns)
    return [(r - mean) / (std + eps) for r in returns]


def test_canopy_page_hand_case_matches_the_released_code():
    # Failed episode scored 0, as the released code does (build_fake_agent_data: reward 0, response_mask all 0; the
    # placeholder enters the group statistic), returns [1, 0, failed]:
    # over [1, 0, 0]: mean 1/3, Bessel std √(1/3) = 0.5773503; with the released ε = 1e-6:
    # (2/3)/0.5773513 = 1.1546985 and (−1/3)/0.5773513 = −0.5773493 (the placeholder trains nothing).
    released = released_grpo([1.0, 0.0, 0.0])
    assert [round(a, 7) for a in released[:2]] == [1.1546985, -0.5773493]

    def episode(reward, error=None):
        return Trajectory(task={}, steps=[Step("s", "a", reward=reward)], error=error)

    group = Group(task={}, trajectories=[episode(1.0), episode(0.0), episode(0.0, error="env timeout")])
    # With the released ε the project's credit reproduces the released code: the formula is the same.
    assert [row[0] for row in canopy_advantages([group], CANOPYParams(failed_episodes="zero", eps=1e-6))[0][0]] == pytest.approx(
        released[:2] + [0.0], abs=1e-9)
    # ε itself is TRL's 1e-4 in the project (the page says so; it is not tagged [C]): (2/3)/0.5774503 = 1.1545006 and
    # (−1/3)/0.5774503 = −0.5772503, within a relative 2e-4 of the released values.
    ours = [row[0] for row in canopy_advantages([group], CANOPYParams(failed_episodes="zero"))[0][0]]
    assert ours[:2] == pytest.approx([1.1545006, -0.5772503], abs=1e-7)
    assert ours[:2] == pytest.approx(released[:2], rel=2e-4)
