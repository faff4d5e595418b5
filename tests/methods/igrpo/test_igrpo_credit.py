"""IGRPO math: selection probabilities and suppression (trl_agents/rollout/topologies/igrpo.py), leaf weights, the
teacher-weighted advantage, and how it reaches shared steps of a tree (trl_agents/credit/igrpo.py). Hand numbers in the comments; docs/methods/igrpo.md has the
same cases."""

from __future__ import annotations

import math
import random

import pytest
from helpers import group_credit, group_credit_and_stats

from trl_agents.credit.igrpo import (
    leaf_weights,
    weighted_advantages,
    weighted_mean_std,
)
from trl_agents.rollout.topologies.igrpo import (
    GOLD_LIKELIHOOD,
    gold_likelihood,
    node_indices,
    path_information,
    sample_index,
    selection_probabilities,
    update_strikes,
)
from trl_agents.training.credit_phase import step_values
from trl_agents.trajectory import Group, Step, Trajectory


def search(p, **kw):
    """A search step (valid, the episode goes on) whose prompt has gold-answer likelihood p."""
    return Step("obs", "search[q]", signals={GOLD_LIKELIHOOD: p}, **kw)


def answer(p, reward, **kw):
    return Step("obs", "answer[x]", reward=reward, done=True, signals={GOLD_LIKELIHOOD: p}, **kw)


def leaf(likelihoods, reward, episode_id=0, **kw):
    """A path: searches at the given likelihoods, then an answer step whose prompt has the last likelihood."""
    *searches, last = likelihoods
    return Trajectory(task={}, steps=[search(p) for p in searches] + [answer(last, reward)], episode_id=episode_id,
                      **kw)


# ---------------------------------------------------------------- selection and suppression


def test_acceptance_selection_probabilities():
    # I = [0.3, 0.0, −0.1], T_I = 0.1: I/T = [3, 0, −1]; e^3 = 20.0855, e^0 = 1, e^−1 = 0.3679, sum 21.4534
    # 20.0855/21.4534 = 0.9362, 1/21.4534 = 0.0466, 0.3679/21.4534 = 0.0171
    probabilities = selection_probabilities([0.3, 0.0, -0.1], temperature=0.1)
    assert probabilities == pytest.approx([0.9362, 0.0466, 0.0171], abs=5e-5)
    assert sum(probabilities) == pytest.approx(1.0, abs=1e-12)


def test_selection_guards_overflow_and_bad_temperatures():
    assert selection_probabilities([100.0, 0.0], temperature=1e-3) == [1.0, 0.0]  # e^(1e5) would overflow
    assert selection_probabilities([], 0.1) == []
    for bad in (0.0, -0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="temperature"):
            selection_probabilities([0.1], temperature=bad)
    with pytest.raises(ValueError, match="finite"):
        selection_probabilities([math.nan], 0.1)


def test_sampling_follows_the_probabilities():
    # inverse CDF: [0, 0.9362) -> 0, [0.9362, 0.9828) -> 1, the rest -> 2
    probabilities = selection_probabilities([0.3, 0.0, -0.1])
    assert [sample_index(probabilities, u) for u in (0.0, 0.9, 0.95, 0.99, 0.9999999)] == [0, 0, 1, 2, 2]
    rng = random.Random(0)
    draws = [sample_index(probabilities, rng.random()) for _ in range(20000)]
    assert [draws.count(i) / len(draws) for i in range(3)] == pytest.approx([0.9362, 0.0466, 0.0171], abs=0.01)


def test_suppression_after_two_non_positive_rounds():
    # I ≤ 0 adds a strike, I > 0 clears them; the second consecutive strike suppresses.
    strikes, suppressed = update_strikes(0, 0.0)
    assert (strikes, suppressed) == (1, False)
    strikes, suppressed = update_strikes(strikes, -0.05)
    assert (strikes, suppressed) == (2, True)
    assert update_strikes(1, 0.01) == (0, False)  # not consecutive: a positive round in between clears
    assert update_strikes(0, 0.2) == (0, False)
    assert update_strikes(0, 0.0, suppress_after=1) == (1, True)
    with pytest.raises(ValueError, match="suppress_after"):
        update_strikes(0, 0.0, suppress_after=0)


# ---------------------------------------------------------------- nodes and their gains


def test_gold_likelihood_is_the_geometric_mean_token_probability():
    # exp((ln 0.5 + ln 0.125)/2) = exp(ln(1/16)/2) = 1/4
    assert gold_likelihood([math.log(0.5), math.log(0.125)]) == pytest.approx(0.25)
    assert gold_likelihood([]) == 0.0
    assert gold_likelihood([-math.inf]) == 0.0


def test_nodes_follow_tool_calls_and_gains_telescope():
    steps = [search(0.1), Step("o", "jump", valid=False, signals={GOLD_LIKELIHOOD: 0.15}), search(0.3),
             search(0.25), answer(0.6, 1.0)]
    trajectory = Trajectory(task={}, steps=steps)
    # nodes: the root 0, after the searches at 0, 2 and 3 -> 1, 3, 4; not after the invalid step 1
    assert node_indices(trajectory) == [0, 1, 3, 4]
    gains = path_information(trajectory)
    # I: 0.15 − 0.1, 0.25 − 0.15, 0.6 − 0.25 (the previous NODE, not the previous step); the sum is 0.6 − 0.1
    assert [j for j, _ in gains] == [1, 3, 4]
    assert [g for _, g in gains] == pytest.approx([0.05, 0.1, 0.35])
    assert sum(g for _, g in gains) == pytest.approx(0.6 - 0.1)


# ---------------------------------------------------------------- leaf weights and advantages


def test_leaf_weights_sum_to_one_and_follow_the_gains():
    # S/T = [1, 0, 0, −1]: e^1, 1, 1, e^−1 = 2.7183, 1, 1, 0.3679 over 5.0862
    weights = leaf_weights([0.1, 0.0, 0.0, -0.1], temperature=0.1)
    assert weights == pytest.approx([0.5344, 0.1966, 0.1966, 0.0723], abs=5e-5)
    rng = random.Random(1)
    for _ in range(50):
        gains = [rng.uniform(-1, 1) for _ in range(rng.randint(1, 9))]
        assert sum(leaf_weights(gains, rng.choice([0.01, 0.1, 1.0]))) == pytest.approx(1.0, abs=1e-12)
    assert leaf_weights([0.7, 0.7, 0.7]) == [1 / 3] * 3  # equal gains: exactly uniform
    assert leaf_weights([50.0, 0.0], temperature=0.01) == [1.0, 0.0]  # e^5000 would overflow


def test_hand_case_weighted_advantage():
    # w = [0.5344, 0.1966, 0.1966, 0.0723] (above), R = [1, 0, 1, 0]
    # μ_w = 0.5344 + 0.1966 = 0.7311
    # scale none: A = L·w·(R − μ_w) = 4·0.5344·0.2689 = 0.5749, 4·0.1966·(−0.7311) = −0.5749, 4·0.1966·0.2689 = 0.2115,
    #             4·0.0723·(−0.7311) = −0.2115 (Σ w(R − μ_w) = 0)
    # σ_w² = Σ w (R − μ_w)² / (1 − Σ w²) = 0.1966 / 0.6318 = 0.3112, σ_w = 0.5578; scale group: A / (0.5578 + 1e-4)
    weights = leaf_weights([0.1, 0.0, 0.0, -0.1])
    returns = [1.0, 0.0, 1.0, 0.0]
    mean, std = weighted_mean_std(returns, weights)
    assert (mean, std) == pytest.approx((0.7311, 0.5578), abs=5e-5)
    assert weighted_advantages(returns, weights, scale="none") == pytest.approx([0.5749, -0.5749, 0.2115, -0.2115],
                                                                                abs=5e-5)
    assert weighted_advantages(returns, weights, scale="group") == pytest.approx([1.0305, -1.0305, 0.3791, -0.3791],
                                                                                 abs=5e-5)
    # The same numbers from the trajectories: paths whose likelihood goes from 0.2 (root) to 0.3, 0.2, 0.2, 0.1.
    group = Group(task={}, trajectories=[leaf([0.2, p], r, i) for i, (p, r) in enumerate(
        zip((0.3, 0.2, 0.2, 0.1), returns))])
    values, stats = group_credit_and_stats("igrpo", group, scale_rewards="none")
    assert [row[-1] for row in values] == pytest.approx([0.5749, -0.5749, 0.2115, -0.2115], abs=5e-5)
    assert stats["max_weight"] == pytest.approx(0.5344, abs=5e-5)
    assert stats["mean_info_gain"] == pytest.approx((0.1 + 0 + 0 - 0.1) / 4)
    # effective leaves 1/Σw² = 1/0.3682 = 2.716 of 4
    assert stats["effective_leaf_fraction"] == pytest.approx(1 / (1 - 0.6318227) / 4, abs=1e-4)


@pytest.mark.parametrize("scale", ["group", "none"])
def test_equal_gains_give_exactly_grpo(scale):
    # Equal I on every leaf -> w = 1/L -> L·w = 1: GRPO's advantage on the same leaves, invalid penalty included.
    # "group" is GRPO's z-score (TRL's Bessel std, ε = 1e-4; the library's and TRL's default), "none" Dr. GRPO.
    rng = random.Random(3)
    trajectories = []
    for i in range(6):
        steps = [search(0.2), Step("o", "x", valid=bool(i % 2), signals={GOLD_LIKELIHOOD: 0.2}), search(0.5),
                 answer(0.5, float(rng.random() < 0.5) + 0.25 * i)]
        trajectories.append(Trajectory(task={}, steps=steps, episode_id=i))
    group = Group(task={}, trajectories=trajectories)
    expected = group_credit("grpo", group, scale_rewards=scale, invalid_action_penalty=0.1)
    assert group_credit("igrpo", group, scale_rewards=scale, invalid_action_penalty=0.1) == expected  # bit for bit
    # The weighted formula itself, with explicit uniform weights, agrees to rounding.
    returns = [t.episode_return for t in trajectories]
    ours = weighted_advantages(returns, [1 / 6] * 6, scale=scale)
    assert ours == pytest.approx([row[0] for row in expected], abs=1e-12)  # step 0 is a valid search: no penalty


def test_weighted_std_is_bessel_when_uniform():
    returns = [1.0, 0.0, 0.0, 1.0, 0.5]
    mean, std = weighted_mean_std(returns, [0.2] * 5)
    assert mean == pytest.approx(0.5) and std == pytest.approx(0.5)  # Σ(R − μ)² = 4·0.25 = 1, /(n − 1 = 4), √0.25


def test_shared_prefix_gets_its_subtrees_weighted_advantage():
    # Root r (steps s0 s1 s2) forked at step 1 into c1 (s0 + own s1' s2'), and at step 2 into c2 (s0 s1 + own s2'').
    # s0 is on all 3 leaves: it gets Σ_ℓ A_ℓ = L/σ·Σ w(R − μ_w) = 0. s1 is on r and c2: it gets A_r + A_c2.
    s0, s1 = search(0.2), search(0.4)
    r = Trajectory(task={}, steps=[s0, s1, answer(0.6, 1.0)], episode_id=0)
    c1 = Trajectory(task={}, steps=[s0, search(0.4), answer(0.1, 0.0)], episode_id=1, parent_id=0, fork_step=1)
    c2 = Trajectory(task={}, steps=[s0, s1, answer(0.6, 0.0)], episode_id=2, parent_id=0, fork_step=2)
    group = Group(task={}, trajectories=[r, c1, c2])
    values = group_credit("igrpo", group, scale_rewards="none")
    summed = step_values([group], [values])
    assert summed[id(s0)] == pytest.approx(0.0, abs=1e-12)
    # S = [0.4, −0.1, 0.4] (p at the last node minus 0.2): w ∝ [e^4, e^−1, e^4] -> [0.4983, 0.0034, 0.4983]
    weights = leaf_weights([0.4, -0.1, 0.4])
    mean = weights[0] * 1.0  # μ_w = 0.4983
    # s1's subtree D = {r, c2}: L·W_D·(μ_D − μ_w) = 3·0.9966·(0.5 − 0.4983)
    assert summed[id(s1)] == pytest.approx(3 * (weights[0] + weights[2]) * (0.5 - mean), abs=1e-12)
    assert values[0] == [values[0][0]] * 3  # one value per leaf on its whole path


def test_invalid_penalty_is_charged_once_by_the_owner():
    bad = Step("o", "x", valid=False, signals={GOLD_LIKELIHOOD: 0.3})
    root = Trajectory(task={}, steps=[search(0.3), bad, answer(0.3, 1.0)], episode_id=0)
    fork = Trajectory(task={}, steps=[root.steps[0], bad, answer(0.3, 0.0)], episode_id=1, parent_id=0, fork_step=2)
    values = group_credit("igrpo", Group(task={}, trajectories=[root, fork]), invalid_action_penalty=0.5)
    # equal gains: GRPO z-scores ±0.7070 (R = [1, 0], μ 0.5, σ 0.7071); the shared invalid step: −0.5 once, by root
    assert values[0][1] == pytest.approx(values[0][0] - 0.5)
    assert values[1][1] == pytest.approx(values[1][0])


def test_edge_groups_are_finite():
    assert group_credit_and_stats("igrpo", Group(task={}))[0] == []
    single = Group(task={}, trajectories=[leaf([0.1, 0.9], 1.0)])
    assert group_credit("igrpo", single) == [[0.0, 0.0]]  # a lone leaf: deviation 0
    all_failed = Group(task={}, trajectories=[leaf([0.1, p], 0.0, i) for i, p in enumerate((0.9, 0.1, 0.5))])
    values, stats = group_credit_and_stats("igrpo", all_failed)
    assert values == [[0.0, 0.0]] * 3 and stats["zero_advantage_group"] == 1.0
    # nearly all weight on one leaf: S/T = [1000, 0], 1 − Σ w² ≈ 0 -> σ_w = 0, everything finite
    concentrated = Group(task={}, trajectories=[leaf([0.0, 1.0], 1.0, 0), leaf([0.0, 0.0], 0.0, 1)])
    values = group_credit("igrpo", concentrated, igrpo_temperature=1e-3)
    assert all(math.isfinite(v) for row in values for v in row)
    assert values[0][0] == 0.0 and abs(values[1][0]) < 1e-12
    zero_steps = Group(task={}, trajectories=[Trajectory(task={}, steps=[]), leaf([0.1, 0.2], 1.0, 1)])
    assert group_credit("igrpo", zero_steps, scale_rewards="none")[0] == []


def test_bad_inputs_are_rejected():
    missing = Trajectory(task={}, steps=[Step("o", "search[q]"), answer(0.1, 1.0)])
    with pytest.raises(ValueError, match="gold_likelihood"):
        group_credit("igrpo", Group(task={}, trajectories=[missing]))
    with pytest.raises(ValueError, match="finite likelihood"):
        group_credit("igrpo", Group(task={}, trajectories=[leaf([0.1, math.nan], 1.0)]))
    with pytest.raises(ValueError, match="scale must be one of"):
        group_credit("igrpo", Group(task={}, trajectories=[leaf([0.1, 0.2], 1.0)]), scale_rewards="batch")
    with pytest.raises(ValueError, match="temperature"):
        group_credit("igrpo", Group(task={}, trajectories=[leaf([0.1, 0.2], 1.0)]), igrpo_temperature=0)
    with pytest.raises(ValueError, match="non-finite reward"):
        group_credit("igrpo", Group(task={}, trajectories=[leaf([0.1, 0.2], math.inf)]))
