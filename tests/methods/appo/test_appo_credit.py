"""APPO's math: future value and branching score (trl_agents.rollout.topologies.appo), prefix scale, dual-group
credit and the future-KL loss scaling (trl_agents.credit.appo), on hand-computed numbers (docs/methods/appo.md
"Hand-computed case")."""

from __future__ import annotations

import math

import pytest
import torch

from trl_agents.credit import stat_means
from trl_agents.credit.appo import (
    APPOParams,
    appo_advantages,
    decay_gamma,
    dual_clip_drops,
    future_kl,
    future_kl_advantages,
    future_kl_weights,
    group_zscores,
    prefix_scale,
)
from trl_agents.rollout.topologies.appo import (
    BranchPoint,
    branching_scores,
    future_values,
    is_punctuation,
    top_positions,
    zscores,
)
from trl_agents.trajectory import Group, Step, Trajectory


def appo(group, branch_points, **params):
    """APPO on one group with its branch points and `APPOParams(**params)`: (advantages, the value of each stat)."""
    (advantages,), stats = appo_advantages([group], APPOParams(branch_points=[branch_points], **params))
    return advantages, stat_means(stats)


def test_future_value_of_the_acceptance_case():
    # Δ = [0.1, 0, −0.1], γ = 1: suffix sums [0.1 + 0 − 0.1, 0 − 0.1, −0.1] = [0, −0.1, −0.1]; exp -> [1, .9048, .9048]
    raw = future_values([0.1, 0.0, -0.1], gamma=1.0, epsilon=None)
    assert raw == pytest.approx([1.0, math.exp(-0.1), math.exp(-0.1)])
    assert [round(v, 4) for v in raw] == [1.0, 0.9048, 0.9048]
    # clipped to [0.8, 1.2]: unchanged here; a large suffix sum is clipped (exp(1) = 2.72 -> 1.2, exp(−1) -> 0.8)
    assert future_values([0.1, 0.0, -0.1], gamma=1.0) == pytest.approx(raw)
    assert future_values([1.0, -2.0], gamma=1.0) == pytest.approx([0.8, 0.8])  # sums [−1, −2]
    assert future_values([2.0, -1.0], gamma=1.0) == pytest.approx([1.2, 0.8])  # sums [1, −1]


def test_future_value_discounts_with_gamma_and_clamps_the_exponent():
    gamma = decay_gamma(64.0)
    assert gamma == pytest.approx(2 ** (-1 / 64))
    # Δ = [0, 0.2]: S_0 = γ·0.2 = 0.19785, S_1 = 0.2
    assert future_values([0.0, 0.2], gamma=gamma, epsilon=None) == pytest.approx([math.exp(gamma * 0.2), math.exp(0.2)])
    # the default γ is the released branching's algorithm.gamma = 1: S_0 = 0 + 0.2
    assert future_values([0.0, 0.2], epsilon=None) == pytest.approx([math.exp(0.2), math.exp(0.2)])
    # exponent clamped to ±20: no inf
    assert future_values([1000.0], gamma=1.0, epsilon=None) == [pytest.approx(math.exp(20.0))]
    assert future_values([], gamma=1.0) == []


def test_branching_score_of_the_acceptance_case():
    # z(H): H = [2, .5, 1.5, .1], μ = 1.025, population σ = .7596 -> [1.2837, −.6912, .6254, −1.2178]
    # z(Ω): Ω = [1.1, 1, .9, 1.2], μ = 1.05, σ = .1118 -> [.4472, −.4472, −1.3416, 1.3416]
    scores, eligible, used_omega = branching_scores([2.0, 0.5, 1.5, 0.1], [1.1, 1.0, 0.9, 1.2])
    assert [round(s, 3) for s in scores] == [0.574, 0.309, -0.839, -1.634]
    assert eligible == [True, False, False, False]  # token 1: BS > 0 but both z < 0; tokens 2, 3: BS < 0
    assert used_omega


def test_branching_score_falls_back_to_entropy_when_omega_says_nothing():
    h = [2.0, 0.5, 1.5, 0.1]
    z_h = [1.2837, -0.6912, 0.6254, -1.2178]
    for omegas in (None, [1.0] * 4, [1.0, 1.0 + 1e-7, 1.0, 1.0], [1.0, math.nan, 1.0, 1.0], [1.0, 1.0]):
        scores, eligible, used_omega = branching_scores(h, omegas)
        assert not used_omega, omegas
        assert scores == pytest.approx(z_h, abs=1e-4)
        assert eligible == [True, False, True, False]  # z(H) > 0


def test_scores_skip_punctuation_tokens():
    # Token 1 (punctuation) leaves the statistics: z over H = [2, 1.5, .1] only; it is never eligible.
    scores, eligible, _ = branching_scores([2.0, 9.0, 1.5, 0.1], None, keep=[True, False, True, True])
    assert scores[1] == 0.0 and not eligible[1]
    assert scores == pytest.approx(zscores([2.0, 0.0, 1.5, 0.1], keep=[True, False, True, True]))
    assert is_punctuation(" .") and is_punctuation("\n") and not is_punctuation("a,")


def test_zscores_guards():
    assert zscores([]) == [] and zscores([5.0]) == [0.0] and zscores([2.0, 2.0]) == [0.0, 0.0]
    assert all(math.isfinite(z) for z in zscores([1e-12, 2e-12]))  # a spread under the tolerance: 0, not 1/ε


def test_top_positions_best_first_ties_earliest():
    assert top_positions([0.5, 2.0, 2.0, 9.0], [True, True, True, False], 2) == [1, 2]
    assert top_positions([1.0], [False], 3) == [] and top_positions([], [], 2) == []


def test_prefix_scale_of_the_acceptance_case():
    # split k = 3, BS = BS_max: M_t = 1 + 0.9^(3 − t) = [1.729, 1.81, 1.9, 2.0]
    assert prefix_scale(split=3, score=2.5, score_max=2.5) == pytest.approx([1.729, 1.81, 1.9, 2.0])
    # half the best score: 1 + 0.5·0.9^(1 − t) = [1.45, 1.5]
    assert prefix_scale(split=1, score=1.0, score_max=2.0) == pytest.approx([1.45, 1.5])
    assert prefix_scale(split=1, score=1.0, score_max=0.0) == [1.0, 1.0]  # no positive BS_max: M = 1


def test_group_zscores_guards():
    # [1, 0, 0, 1]: μ = .5, population σ = .5 (the released compute_appo_advantage: std(correction=0)) -> ±1
    assert group_zscores([1.0, 0.0, 0.0, 1.0], eps=0.0) == pytest.approx([1.0, -1.0, -1.0, 1.0])
    assert group_zscores([]) == [] and group_zscores([3.0]) == [0.0] and group_zscores([2.0, 2.0]) == [0.0, 0.0]


def rollout(episode_id, reward, actions, parent=None, fork_step=0, valid=True, rewards=None):
    steps = [Step("o", "x", action_ids=list(ids), reward=0.0, valid=valid) for ids in actions]
    for step, value in zip(steps, rewards or [0.0] * len(steps)):
        step.reward = value
    if rewards is None:
        steps[-1].reward = reward
    return Trajectory(task={}, steps=steps, episode_id=episode_id, parent_id=parent, fork_step=fork_step)


def test_audit_case_matches_the_released_code():
    # 4 initial rollouts, R = [1, 0, 0, 0], one step of 6 tokens each (the reward on token 5); rollout 0 has two
    # branches (split at tokens 2 and 4, BS 1.0 and 0.5), both returning 0.
    # Released code: M acts on the token rewards; rollout 0's reward token 5 lies after both splits, so M̄ = 1 there and
    # R' = R. z-scores with the population σ: μ = .25, σ = √(.1875) = .43301 -> A_o = [1.7321, −.5774, −.5774, −.5774];
    # the branch group [0, 0] has A_b = 0, so the prefix credit A_o + mean A_b = A_o: rollout 0 is 1.7321 on all six.
    # (Before this fix: Bessel σ gave 1.5 and M multiplied the prefix: [2.3535, 2.4484, 2.5537, 2.175, 2.25, 1.5].)
    tokens = [[1, 2, 3, 4, 5, 6]]
    init = [rollout(i, r, tokens) for i, r in enumerate((1.0, 0.0, 0.0, 0.0))]
    branches = [rollout(4, 0.0, tokens, parent=0), rollout(5, 0.0, tokens, parent=0)]
    for branch in branches:
        branch.steps[0] = init[0].steps[0]
    points = [BranchPoint(0, 4, 0, 0, 2, 2, 1.0, (1, 2, 3)), BranchPoint(0, 5, 0, 0, 4, 4, 0.5, (1, 2, 3, 4, 5))]
    advantages, stats = appo(Group(task={}, trajectories=init + branches), branch_points=points)
    assert advantages[0][0] == pytest.approx([1.7320508] * 6, abs=1e-5)
    assert advantages[1] == [pytest.approx(-0.5773503, abs=1e-5)]
    assert advantages[4:] == [[0.0], [0.0]]
    assert stats["mean_reward_scale"] == 1.0  # every reward token lies after the splits


def test_dual_group_credit_by_hand():
    # Three initial rollouts of two steps ([5, 6, 7] then [8, 9]: the steps' rewards sit on positions 2 and 4):
    # o0 rewards [.5, .5], o1 [0, 0], o2 [0, 1]. Branches: b3 of o0 split at position 3 (step 1, token 0), BS 1,
    # return 0; b4 of o1 split at position 0, BS .5, return 1.
    # Reward scale (released apply_appo_reward_scale_M, BS_max = 1): o0's only branch gives M(τ) = 1 + .9^(3 − τ) for
    # τ ≤ 3, 1 after: M(2) = 1.9, M(4) = 1, so R'_0 = .5·1.9 + .5·1 = 1.45; o1's rewards are 0: R'_1 = 0; R'_2 = 1.
    # Initial z-scores (population σ, ε = 0): μ = .81667, σ = .60599 -> A = [1.04512, −1.34766, .30254].
    # Branch z-scores [0, 1] -> A_b = [−1, +1].
    # o0: positions 0..3 get A_o + A_b3 = .04512, position 4 keeps 1.04512; o1: position 0 gets −1.34766 + 1 = −.34766.
    init0 = rollout(0, 0.0, [[5, 6, 7], [8, 9]], rewards=[0.5, 0.5])
    init1 = rollout(1, 0.0, [[5, 6, 7], [8, 9]])
    init2 = rollout(2, 0.0, [[5, 6, 7], [8, 9]], rewards=[0.0, 1.0])
    b3 = rollout(3, 0.0, [[5, 6, 7], [8, 1]], parent=0, fork_step=1)
    b3.steps[0] = init0.steps[0]  # the shared step (the same object)
    b4 = rollout(4, 1.0, [[5, 2, 2]], parent=1, fork_step=0)
    group = Group(task={}, trajectories=[init0, init1, init2, b3, b4])
    points = [BranchPoint(0, 3, 0, 1, 0, 3, 1.0, (8,)), BranchPoint(0, 4, 1, 0, 0, 0, 0.5, (5,))]
    advantages, stats = appo(group, branch_points=points, appo_std_eps=0.0)
    assert advantages[0][0] == pytest.approx([0.0451241] * 3, abs=1e-6)
    assert advantages[0][1] == pytest.approx([0.0451241, 1.0451241], abs=1e-6)
    assert advantages[1][0] == pytest.approx([-0.3476600, -1.3476600, -1.3476600], abs=1e-6)
    assert advantages[1][1] == pytest.approx(-1.3476600, abs=1e-6)
    assert advantages[2] == pytest.approx([0.3025359, 0.3025359], abs=1e-6)
    assert advantages[3:] == [[0.0, 0.0], [0.0]]  # branches train nothing
    assert stats["branches"] == 2 and stats["init_rollouts"] == 3 and stats["branch_points"] == 2
    assert stats["prefix_tokens"] == 5  # 4 of o0, 1 of o1
    # BS_max is the batch's (here 2, from another task): M(2) = 1 + (1/2)·.9 = 1.45, R'_0 = .725 + .5 = 1.225,
    # μ = .74167, σ = .53243 -> A = [.90780, −1.39301, .48520].
    advantages, _ = appo(group, branch_points=points, score_max=2.0, appo_std_eps=0.0)
    assert advantages[0][1] == pytest.approx([0.9078027 - 1.0, 0.9078027], abs=1e-6)
    assert advantages[2] == pytest.approx([0.4852049, 0.4852049], abs=1e-6)


def test_dual_group_credit_guards():
    # No branch: plain z-scores of the init group; equal returns: 0; a failed branch (absent) is ignored.
    group = Group(task={}, trajectories=[rollout(0, 1.0, [[1, 2]]), rollout(1, 1.0, [[1, 2]])])
    points = [BranchPoint(0, 7, 0, 0, 0, 0, 1.0, (1,))]
    advantages, stats = appo(group, branch_points=points)
    assert advantages == [[0.0], [0.0]] and stats["branch_points"] == 0
    assert appo(Group(task={}, trajectories=[]), branch_points=[]) == ([], {
        "init_rollouts": 0.0, "branches": 0.0, "branch_points": 0.0, "init_success_rate": 0.0,
        "branch_success_rate": 0.0, "mean_reward_scale": 1.0, "prefix_tokens": 0.0})
    # invalid steps of init rollouts pay λ after the z-score: [1, 0] -> ±1 (population σ = .5)
    group = Group(task={}, trajectories=[rollout(0, 1.0, [[1]], valid=False), rollout(1, 0.0, [[1]])])
    advantages, _ = appo(group, branch_points=[], appo_std_eps=0.0, invalid_action_penalty=0.1)
    assert advantages == [[pytest.approx(0.9)], [pytest.approx(-1.0)]]
    with pytest.raises(ValueError, match="non-finite"):
        appo(Group(task={}, trajectories=[rollout(0, math.nan, [[1]])]), branch_points=[])


def test_future_kl_multiplier_of_the_acceptance_case():
    # Δ = [0.1, 0, −0.1], γ = 1: FutureKL = [0, −.1, −.1], exp -> [1, .905, .905], high-only clip [1, 1.2] -> 1:
    # Ã = A·(1 + 1·1) = 2A everywhere.
    delta = torch.tensor([[0.1, 0.0, -0.1]])
    assert future_kl(delta, torch.ones(1, 3), gamma=1.0) == pytest.approx(torch.tensor([[0.0, -0.1, -0.1]]),
                                                                          abs=1e-6)
    advantages = torch.tensor([[0.5, 0.5, 0.5]])
    scaled, weights, dropped = future_kl_advantages(advantages, delta, torch.ones(1, 3), torch.ones(1, 3), gamma=1.0)
    assert torch.equal(weights, torch.ones(1, 3)) and torch.allclose(scaled, 2 * advantages)
    assert not dropped.any()
    # Without high-only clipping the lower side shows: f = [1, .905, .905]
    low = future_kl_weights(future_kl(delta, torch.ones(1, 3), 1.0), advantages, torch.ones(1, 3), high_only=False)
    assert low == pytest.approx(torch.tensor([[1.0, math.exp(-0.1), math.exp(-0.1)]]))


def test_future_kl_filter_mask_safety_and_drops():
    # Δ_0 = 2 > log 3 = 1.0986: it takes no part; Δ_1 = .1 counts: FutureKL = [.1, .1] (γ = 1); masked tokens add 0.
    delta = torch.tensor([[2.0, 0.1, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert future_kl(delta, mask, gamma=1.0) == pytest.approx(torch.tensor([[0.1, 0.1, 0.0]]))
    # f = exp(.1) = 1.1052 (within [1, 1.2]); a negative-advantage token with ratio 5 > 4 gets f clamped to ≤ 1.
    future = torch.tensor([[0.1, 0.1]])
    weights = future_kl_weights(future, torch.tensor([[-1.0, 1.0]]), torch.tensor([[5.0, 5.0]]))
    assert weights == pytest.approx(torch.tensor([[1.0, math.exp(0.1)]]))
    # A row with two tokens A < 0 and ratio > 3 is dropped (advantages 0); one such token is not enough.
    ratio = torch.tensor([[3.5, 3.5, 1.0], [3.5, 1.0, 1.0]])
    advantages = -torch.ones(2, 3)
    assert dual_clip_drops(advantages, ratio, torch.ones(2, 3)).tolist() == [True, False]
    assert dual_clip_drops(advantages, ratio, torch.tensor([[1, 0, 1], [1, 1, 1]])).tolist() == [False, False]
    scaled, _, dropped = future_kl_advantages(advantages, torch.zeros(2, 3), ratio, torch.ones(2, 3))
    assert dropped.tolist() == [True, False]
    assert torch.equal(scaled[0], torch.zeros(3)) and torch.allclose(scaled[1], -2 * torch.ones(3))
    # huge Δ: no inf
    scaled, weights, _ = future_kl_advantages(torch.ones(1, 2), torch.tensor([[-1e4, 1e4]]), torch.ones(1, 2),
                                              torch.ones(1, 2))
    assert torch.isfinite(scaled).all() and torch.isfinite(weights).all()
