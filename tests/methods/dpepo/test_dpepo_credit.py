"""DPEPO's math (trl_agents.credit.dpepo): the diversity weight W on hand cases, every factor written out, and the
advantage z·W / z·(2 − W). Bases as released: α = 0.8, γ = 0.95, β = 0.95, ω = 0.8 (the launchers' value), ψ = 0.95.
"""

from __future__ import annotations

import math

import pytest

from trl_agents.credit import stat_means
from trl_agents.credit.dpepo import (
    DPEPOParams,
    consecutive_pairs,
    diversity_weight,
    dpepo_advantages,
    reweight,
    trajectory_weights,
    weight_terms,
)
from trl_agents.trajectory import Group, Step, Trajectory


def dpepo_with_stats(group, weights=None, **params):
    """DPEPO on one group (`weights`: W per step of each trajectory, None to rebuild them from the steps' info), with
    `DPEPOParams(**params)`: (advantages, the value of each stat)."""
    params = DPEPOParams(weights=None if weights is None else [weights], **params)
    (advantages,), stats = dpepo_advantages([group], params)
    return advantages, stat_means(stats)


def dpepo(group, weights=None, **params):
    """DPEPO's advantages of one group (see `dpepo_with_stats`)."""
    return dpepo_with_stats(group, weights, **params)[0]


S, D, C = "go to shelf 1", "open drawer 1", "go to cabinet 2"
HISTORIES = {1: [S, D, S, D], 2: [S, D], 3: [], 4: []}
ACTIONS = [(1, S), (2, S), (3, C)]  # copy 4 does not act this turn


def test_hand_case_every_factor():
    terms = weight_terms(ACTIONS, HISTORIES, num_envs=4)
    one, two, three = terms.envs
    # Copy 1: history s d s d, action s. C_depth = 2 (s twice); its transition is (d, s) (previous action d);
    # its own pairs (s,d) (d,s) (s,d) hold (d, s) once: M_depth = 1. Across: copy 2's s d + [s] has pairs (s,d) (d,s):
    # one (d, s); copy 3's [c] has no pair: M_width = 1 + 0 = 1.
    assert (one.c_depth, one.m_depth, one.m_width) == (2, 1, 1)
    assert one.weight == pytest.approx((0.8**2 + 0.95**1 + 0.95**1) / 3)  # (0.64 + 0.95 + 0.95) / 3 = 0.846667
    # Copy 2: history s d, action s. C_depth = 1; transition (d, s); own pairs (s,d): M_depth = 0. Across: copy 1's
    # s d s d + [s] has pairs (s,d) (d,s) (s,d) (d,s): two (d, s); copy 3: none. M_width = 2.
    assert (two.c_depth, two.m_depth, two.m_width) == (1, 0, 2)
    assert two.weight == pytest.approx((0.8**1 + 0.95**0 + 0.95**2) / 3)  # (0.8 + 1 + 0.9025) / 3 = 0.900833
    # Copy 3: empty history: nothing repeated, no previous action, no transition to match.
    assert (three.c_depth, three.m_depth, three.m_width) == (0, 0, 0) and three.weight == 1.0
    # Two copies take s this turn: C_width = 3 actions − 2 distinct = 1.
    assert terms.c_width == 1
    mean_env = (2.54 / 3 + 2.7025 / 3 + 1.0) / 3  # = 2.7475 / 3 = 0.915833
    assert terms.weight == round((0.8**1 + mean_env) / 2, 4) == 0.8579  # (0.8 + 0.915833) / 2 = 0.857917
    assert diversity_weight(dict(ACTIONS), HISTORIES, num_envs=4) == 0.8579  # a dict gives the same


def test_look_is_exempt_from_the_width_count_and_duplicates_cost_omega():
    empty = {1: [], 2: []}
    # Two copies "look" with no history: every W_env = (1 + 1 + 1)/3 = 1, C_width = 0 (look exempt): W = (1 + 1)/2.
    assert diversity_weight([(1, "look"), (2, "look")], empty, num_envs=2) == 1.0
    # Two copies take the same other action: C_width = 2 − 1 = 1: W = (0.8¹ + 1)/2 = 0.9.
    assert diversity_weight([(1, D), (2, D)], empty, num_envs=2) == 0.9
    # ω = 0.5 instead: (0.5 + 1)/2 = 0.75.
    assert diversity_weight([(1, D), (2, D)], empty, num_envs=2, omega=0.5) == 0.75
    # Whitespace does not make an action new (the released code strips actions and histories).
    assert diversity_weight([(1, f"  {D}\n"), (2, D)], empty, num_envs=2) == 0.9


def test_transitions_need_a_previous_action():
    # Copy 1 has no history: even though copy 2's history s s + [s] holds the pair (s, s), copy 1's turn has no
    # transition (the released code compares a bare action with pairs, which never matches): M_width(1) = 0.
    terms = weight_terms([(1, S), (2, S)], {1: [], 2: [S, S]}, num_envs=2)
    first, second = terms.envs
    assert (first.c_depth, first.m_depth, first.m_width) == (0, 0, 0)
    # Copy 2: C_depth = 2, transition (s, s) made once in its history: M_depth = 1; copy 1's [] + [s] has no pair.
    assert (second.c_depth, second.m_depth, second.m_width) == (2, 1, 0)
    expected = (0.8 + (1.0 + (0.8**2 + 0.95 + 1.0) / 3) / 2) / 2  # C_width = 1: (0.8 + (1 + 0.863333)/2)/2
    assert terms.weight == round(expected, 4) == 0.8658


def test_out_of_range_numbers_and_no_action():
    histories = {1: [], 2: []}
    assert diversity_weight([], histories, num_envs=2) == 0.5  # nothing parsable: no_action_penalty
    assert diversity_weight([], histories, num_envs=2, no_action_weight=0.3) == 0.3
    # Only copy 5 of 2: no acting copy (the released code divides by zero): the no-action weight.
    assert diversity_weight([(5, D)], histories, num_envs=2) == 0.5
    # Out-of-range actions still count towards C_width: copy 1 and copy 7 both D: C_width = 1; W_env(1) = 1.
    assert diversity_weight([(1, D), (7, D)], histories, num_envs=2) == 0.9  # (0.8 + 1) / 2


def test_scienceworld_formulas():
    # "scienceworld": (ω^C_width + mean W_env + ψ^n)/3 with n = 1 rejected sub-action:
    # (0.8 + 0.915833 + 0.95) / 3 = 2.665833 / 3 = 0.888611.
    assert diversity_weight(ACTIONS, HISTORIES, num_envs=4, formula="scienceworld", invalid=1) == 0.8886
    # With n = 0 the third term is 1: (0.8 + 0.915833 + 1) / 3 = 0.905278.
    assert diversity_weight(ACTIONS, HISTORIES, num_envs=4, formula="scienceworld") == 0.9053
    # The released script's overwrite: ψ^n alone, whatever the repetition (0.95² = 0.9025; 0.95⁰ = 1).
    assert diversity_weight(ACTIONS, HISTORIES, num_envs=4, formula="scienceworld_released", invalid=2) == 0.9025
    assert diversity_weight(ACTIONS, HISTORIES, num_envs=4, formula="scienceworld_released") == 1.0
    assert diversity_weight([], HISTORIES, num_envs=4, formula="scienceworld_released") == 0.5  # no action


def test_weight_rejects_bad_bases():
    with pytest.raises(ValueError, match="alpha must be a number in"):
        diversity_weight(ACTIONS, HISTORIES, num_envs=4, alpha=0.0)
    with pytest.raises(ValueError, match="formula must be one of"):
        diversity_weight(ACTIONS, HISTORIES, num_envs=4, formula="webshop")
    with pytest.raises(ValueError, match="num_envs"):
        diversity_weight(ACTIONS, HISTORIES, num_envs=0)
    assert consecutive_pairs([]) == [] and consecutive_pairs(["a"]) == []


# ---------------------------------------------------------------- the advantage


def test_reweight_flips_for_negative_z():
    assert reweight(2.0, 0.75) == 1.5  # z ≥ 0: z·W
    assert reweight(-2.0, 0.75) == -2.5  # z < 0: z·(2 − W) = −2 · 1.25
    assert reweight(0.0, 0.75) == 0.0


def group_of(returns_and_lengths):
    trajectories = []
    for index, (ret, length) in enumerate(returns_and_lengths):
        steps = [Step("o", "x") for _ in range(length - 1)] + [Step("o", "x", reward=ret)]
        trajectories.append(Trajectory(task={}, steps=steps, episode_id=index))
    return Group(task={}, trajectories=trajectories)


def test_cross_step_z_score_and_the_sign_flip():
    # Returns 1 (2 turns) and 0 (1 turn): step-row scores [1, 1, 0]: μ = 2/3, Bessel σ = sqrt((1/9 + 1/9 + 4/9)/2)
    # = sqrt(1/3) = 0.57735. z = (1/3)/0.57735 = 0.57735 on the success, (−2/3)/0.57735 = −1.1547 on the failure.
    group = group_of([(1.0, 2), (0.0, 1)])
    sigma = math.sqrt(1 / 3) + 1e-6
    rows = dpepo(group, weights=[[0.8579, 1.0], [0.5]])
    assert rows[0] == pytest.approx([(1 / 3) / sigma * 0.8579, (1 / 3) / sigma * 1.0])  # shrunk by W
    assert rows[1] == pytest.approx([(-2 / 3) / sigma * (2 - 0.5)])  # amplified by 2 − W = 1.5: −1.7321
    assert dpepo(group, weights=[[0.8579, 1.0], [0.5]], dpepo_diversity_weight=False)[1] == pytest.approx(
        [(-2 / 3) / sigma])
    # Trajectory statistics would give ±0.7071 instead: the cross-step statistic counts the 2-turn success twice.
    assert rows[0][1] != pytest.approx(0.7071, abs=1e-3)


def test_numerical_guards():
    assert dpepo(Group(task={}, trajectories=[]), weights=[]) == []
    # All failed / all solved: σ = 0, every z = 0 exactly (no 0/1e-6 residue), whatever W.
    for ret in (0.0, 1.0):
        rows = dpepo(group_of([(ret, 2), (ret, 3)]), weights=[[0.5, 0.5], [0.9, 0.9, 0.9]])
        assert rows == [[0.0, 0.0], [0.0, 0.0, 0.0]]
    # One row in the group: verl-agent's μ = 0, σ = 1: z = R; W = 0.9 applies (z ≥ 0).
    assert dpepo(group_of([(1.0, 1)]), weights=[[0.9]])[0] == pytest.approx([1.0 / (1 + 1e-6) * 0.9])
    with pytest.raises(ValueError, match="one value per step"):
        dpepo(group_of([(1.0, 2)]), weights=[[0.9]])
    with pytest.raises(ValueError, match="non-finite reward"):
        dpepo(group_of([(math.nan, 1), (0.0, 1)]), weights=[[1.0], [1.0]])


def parallel_step(actions, applied, reward=0.0, invalid=0, num_envs=4):
    info = {"env_actions": [list(p) for p in actions], "applied": list(applied), "invalid_count": invalid,
            "num_envs": num_envs}
    return Step("o", "answer", reward=reward, info=info)


def test_weights_are_rebuilt_from_the_step_info():
    # Turn 0: copies 1, 2 take s (C_width 1: W = (0.8 + 1)/2 = 0.9). Turn 1: copy 1 takes d; copy 3 (ended, not
    # applied) takes s. Turn 2: copy 1 takes s again: history s d -> C_depth = 1, transition (d, s) not seen before:
    # M_depth = 0; W_env = (0.8 + 1 + 1)/3 = 0.933333; C_width = 0: W = (1 + 0.933333)/2 = 0.966667.
    steps = [
        parallel_step([(1, S), (2, S)], [1, 2]),
        parallel_step([(1, D), (3, S)], [1]),  # copy 3 had ended: its s joins no history
        parallel_step([(1, S)], [1], reward=1.0),
        parallel_step([], []),  # nothing parsable
    ]
    trajectory = Trajectory(task={}, steps=steps)
    # Turn 1: copy 1 (history s) takes d: W_env = 1; copy 3 (no history) takes s: W_env = 1; C_width = 0: W = 1.
    assert trajectory_weights(trajectory) == [0.9, 1.0, 0.9667, 0.5]
    # Had copy 3's s been applied at turn 1, C_depth would still be 0 for it, but it would be in copy 3's history.
    with pytest.raises(ValueError, match="parallel-environment info"):
        trajectory_weights(Trajectory(task={}, steps=[Step("o", "up")]))


def test_estimator_and_stats_from_recorded_steps():
    good = Trajectory(task={}, steps=[parallel_step([(1, S), (2, S)], [1, 2]),
                                      parallel_step([(1, D)], [1], reward=1.0)], episode_id=0)
    bad = Trajectory(task={}, steps=[parallel_step([], [])], episode_id=1)
    group = Group(task={}, trajectories=[good, bad])
    rows = dpepo(group)
    sigma = math.sqrt(1 / 3) + 1e-6  # scores [1, 1, 0] as above
    assert rows == [pytest.approx([(1 / 3) / sigma * 0.9, (1 / 3) / sigma * 1.0]),
                    pytest.approx([(-2 / 3) / sigma * 1.5])]
    advantages, stats = dpepo_with_stats(group)
    assert advantages == rows
    assert stats["mean_weight"] == pytest.approx((0.9 + 1.0 + 0.5) / 3)
    assert stats["no_action_fraction"] == pytest.approx(1 / 3)
    assert stats["mean_envs_per_step"] == pytest.approx(3 / 3)  # 2 + 1 + 0 copies stepped over 3 turns
    assert stats["amplified_fraction"] == pytest.approx(1 / 3)  # the failure's turn, W = 0.5 < 1
