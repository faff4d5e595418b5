"""Credit estimators (GRPO, Dr. GRPO, RLOO, GiGPO) against hand-computed numbers.

The expected values are written out, with their arithmetic in comments; they are not recomputed with the formulas
under test. Reference cases: the "Hand-computed case" sections of docs/methods/{grpo,dr_grpo,rloo,gigpo}.md.
"""

from __future__ import annotations

import doctest
import random
from types import SimpleNamespace

import pytest
from helpers import all_finite, assert_close, group_credit, group_credit_and_stats

from trl_agents import credit
from trl_agents.credit import (
    CREDIT_ESTIMATORS,
    GiGPOParams,
    GRPOParams,
    discounted_returns,
    get_estimator,
    gigpo_advantages,
    grpo_advantages,
    rloo_advantages,
)
from trl_agents.credit import base as credit_base
from trl_agents.credit import gigpo as credit_gigpo
from trl_agents.credit import grpo as credit_grpo
from trl_agents.credit import rloo as credit_rloo
from trl_agents.trajectory import Group, Step, Trajectory

TOL = 1e-4


def episode(*steps: tuple) -> Trajectory:
    """A trajectory from (observation, reward) or (observation, reward, valid) tuples."""
    made = []
    for spec in steps:
        observation, reward, valid = (*spec, True) if len(spec) == 2 else spec
        made.append(Step(observation=observation, action_text="act", reward=float(reward), valid=valid))
    return Trajectory(task={"task_id": "t"}, steps=made)


def group_of(*trajectories: Trajectory) -> Group:
    return Group(task={"task_id": "t"}, trajectories=list(trajectories))


def one_step_group(*returns: float) -> Group:
    return group_of(*(episode(("s", r)) for r in returns))


# The GiGPO toy group of docs/methods/gigpo.md (γ = 0.5, rewards only at the last step):
#   A: s0 -a-> s1 -b-> success (R=1)    B: s0 -a-> s1 -c-> fail (R=0)
#   C: s0 -d-> s2 -e-> fail (R=0)       D: copy of A
# Discounted step returns (γ=0.5): A, D: [0.5, 1];  B, C: [0, 0].
# Anchor groups: s0 = {A0, B0, C0, D0} returns [0.5, 0, 0, 0.5];  s1 = {A1, B1, D1} returns [1, 0, 1];  s2 = {C1}.
def toy_group() -> Group:
    return group_of(
        episode(("s0", 0), ("s1", 1)),
        episode(("s0", 0), ("s1", 0)),
        episode(("s0", 0), ("s2", 0)),
        episode(("s0", 0), ("s1", 1)),
    )


# ---------------------------------------------------------------- GRPO / Dr. GRPO / RLOO on R = [1, 0, 0, 1]


def test_grpo_zscore_reference():
    # mean 0.5; Bessel std sqrt((4 * 0.25) / 3) = 0.57735; 0.5 / (0.57735 + 1e-4) = 0.8659
    assert_close(group_credit("grpo", one_step_group(1, 0, 0, 1)), [[0.8659], [-0.8659], [-0.8659], [0.8659]])


def test_dr_grpo_reference():
    # R - mean = R - 0.5
    assert_close(group_credit("grpo", one_step_group(1, 0, 0, 1), scale_rewards="none"), [[0.5], [-0.5], [-0.5], [0.5]])


def test_rloo_reference():
    # 1 - (0 + 0 + 1)/3 = 0.6667;  0 - (1 + 0 + 1)/3 = -0.6667
    assert_close(group_credit("rloo", one_step_group(1, 0, 0, 1)), [[0.6667], [-0.6667], [-0.6667], [0.6667]])


def test_episode_advantage_is_broadcast_to_every_step():
    group = group_of(episode(("a", 0), ("b", 0), ("c", 1)), episode(("a", 0)))
    # R = [1, 0]: Dr. GRPO ±0.5, RLOO ±1, on every step of each episode.
    assert group_credit("grpo", group, scale_rewards="none") == [[0.5, 0.5, 0.5], [-0.5]]
    assert group_credit("rloo", group) == [[1.0, 1.0, 1.0], [-1.0]]


def test_grpo_step_rows_statistic_weighs_long_episodes():
    group = group_of(episode(("a", 0), ("b", 0), ("c", 1)), episode(("a", 0)))
    # Step-row scores [1, 1, 1, 0]: mean 0.75 -> A: 0.25, B: -0.75 (vs ±0.5 over trajectories).
    assert_close(group_credit("grpo", group, scale_rewards="none", credit_statistic="step_rows"), [[0.25, 0.25, 0.25], [-0.75]])


def test_single_element_groups():
    # A group of one episode: nothing to compare with -> 0 for GRPO (both scales) and RLOO.
    single = group_of(episode(("a", 0), ("b", 3)))
    assert group_credit("grpo", single) == [[0.0, 0.0]]
    assert group_credit("grpo", single, scale_rewards="none") == [[0.0, 0.0]]
    assert group_credit("grpo", single, credit_statistic="step_rows") == [[0.0, 0.0]]
    assert group_credit("rloo", single) == [[0.0, 0.0]]
    # ... plus the penalty on an invalid step (statistic over trajectories).
    invalid = group_of(episode(("a", 0, False), ("b", 3)))
    assert_close(group_credit("grpo", invalid), [[-0.1, 0.0]])
    assert_close(group_credit("rloo", invalid), [[-0.1, 0.0]])
    # GiGPO (verl-agent): a population of one gets mean 0, std 1 -> A^E = R.
    assert group_credit("gigpo", one_step_group(3)) == [[3.0]]
    assert_close(group_credit("gigpo", one_step_group(3), gigpo_mode="mean_std_norm", episode_statistic="trajectories"), [[3.0]])


# ---------------------------------------------------------------- all-equal rewards


ALL_CONFIGS = [
    ("grpo", {"scale_rewards": "group", "credit_statistic": "trajectories"}),
    ("grpo", {"scale_rewards": "group", "credit_statistic": "step_rows"}),
    ("grpo", {"scale_rewards": "none", "credit_statistic": "trajectories"}),
    ("grpo", {"scale_rewards": "none", "credit_statistic": "step_rows"}),
    ("rloo", {}),
] + [
    ("gigpo", {"gigpo_mode": mode, "episode_statistic": statistic, "similarity_threshold": threshold})
    for mode in ("mean_norm", "mean_std_norm")
    for statistic in ("step_rows", "trajectories")
    for threshold in (None, 0.9)
]


@pytest.mark.parametrize(("name", "options"), ALL_CONFIGS)
@pytest.mark.parametrize("reward", [0.0, 1.0, 0.1, 10.0])
def test_all_equal_rewards_give_zero(name, options, reward):
    # Same rewards at the same steps -> same returns everywhere -> every advantage exactly 0 (no NaN with std = 0).
    group = group_of(*(episode(("s0", 0), (f"s{i % 2 + 1}", reward), ("s3", 0)) for i in range(4)))
    advantages = group_credit(name, group, **options)
    assert advantages == [[0.0, 0.0, 0.0]] * 4


def test_no_nan_with_mean_std_norm_and_equal_rewards():
    # Unequal lengths and shared anchors with all-zero rewards: every std is 0, every deviation 0.
    group = group_of(episode(("s0", 0)), episode(("s0", 0), ("s1", 0)), episode(("s1", 0), ("s1", 0), ("s0", 0)))
    for statistic in ("step_rows", "trajectories"):
        advantages = group_credit("gigpo", group, gigpo_mode="mean_std_norm", episode_statistic=statistic)
        assert all_finite(advantages)
        assert advantages == [[0.0], [0.0, 0.0], [0.0, 0.0, 0.0]]


# ---------------------------------------------------------------- GiGPO toy group (docs/methods/gigpo.md)

# mean_norm: the two statistics agree here (all episodes have 2 steps):
#   A^E: step rows [1,1,0,0,0,0,1,1] or trajectories [1,0,0,1] -> mean 0.5 -> A, D: +0.5; B, C: -0.5
#   A^S: s0 mean 0.25 -> A0, D0: +0.25, B0, C0: -0.25;  s1 mean 2/3 -> A1, D1: +0.3333, B1: -0.6667;  s2: 0
#   A:  step0 0.5 + 0.25 = 0.75,   step1 0.5 + 0.3333 = 0.8333
#   B:  step0 -0.5 - 0.25 = -0.75, step1 -0.5 - 0.6667 = -1.1667
#   C:  step0 -0.75,               step1 -0.5 + 0 = -0.5
TOY_MEAN_NORM = [[0.75, 0.8333], [-0.75, -1.1667], [-0.75, -0.5], [0.75, 0.8333]]


@pytest.mark.parametrize("statistic", ["step_rows", "trajectories"])
def test_gigpo_toy_mean_norm(statistic):
    advantages = group_credit("gigpo", toy_group(), gamma=0.5, step_advantage_w=1.0, gigpo_mode="mean_norm", episode_statistic=statistic)
    assert_close(advantages, TOY_MEAN_NORM)


# mean_std_norm (Bessel std, ε = 1e-6):
#   A^E step rows: [1,1,0,0,0,0,1,1], mean 0.5, std sqrt(8 * 0.25 / 7) = 0.5345 -> ±0.5 / 0.5345 = ±0.9354
#   A^E trajectories: [1,0,0,1], mean 0.5, std sqrt(4 * 0.25 / 3) = 0.5774     -> ±0.5 / 0.5774 = ±0.8660
#   A^S s0: [0.5,0,0,0.5], mean 0.25, std sqrt(4 * 0.0625 / 3) = 0.2887 -> ±0.25 / 0.2887 = ±0.8660
#   A^S s1: [1,0,1], mean 2/3, std sqrt((1/9 + 4/9 + 1/9) / 2) = 0.5774 -> A1, D1: 0.3333 / 0.5774 = +0.5774,
#           B1: -0.6667 / 0.5774 = -1.1547;   s2 singleton: 0
TOY_MEAN_STD_STEP_ROWS = [
    [0.9354 + 0.8660, 0.9354 + 0.5774],  # [1.8014, 1.5128]
    [-0.9354 - 0.8660, -0.9354 - 1.1547],  # [-1.8014, -2.0901]
    [-0.9354 - 0.8660, -0.9354 + 0.0],  # [-1.8014, -0.9354]
    [0.9354 + 0.8660, 0.9354 + 0.5774],
]
TOY_MEAN_STD_TRAJECTORIES = [
    [0.8660 + 0.8660, 0.8660 + 0.5774],  # [1.7320, 1.4434]
    [-0.8660 - 0.8660, -0.8660 - 1.1547],  # [-1.7320, -2.0207]
    [-0.8660 - 0.8660, -0.8660 + 0.0],  # [-1.7320, -0.8660]
    [0.8660 + 0.8660, 0.8660 + 0.5774],
]


@pytest.mark.parametrize(
    ("statistic", "expected"),
    [("step_rows", TOY_MEAN_STD_STEP_ROWS), ("trajectories", TOY_MEAN_STD_TRAJECTORIES)],
)
def test_gigpo_toy_mean_std_norm(statistic, expected):
    advantages = group_credit("gigpo", toy_group(), gamma=0.5, gigpo_mode="mean_std_norm", episode_statistic=statistic)
    assert_close(advantages, expected, tol=2e-4)  # 4-decimal sums above


def test_gigpo_toy_stats():
    _, stats = group_credit_and_stats("gigpo", toy_group(), gamma=0.5)
    # anchor groups s0 (4 rows), s1 (3 rows), s2 (1 row): 8 rows / 3 groups; 1 of 3 groups is a singleton.
    assert stats["num_anchor_groups"] == 3
    assert stats["mean_anchor_group_size"] == pytest.approx(8 / 3)
    assert stats["singleton_anchor_fraction"] == pytest.approx(1 / 3)


def test_gigpo_omega_scales_step_level_only():
    # ω = 0 leaves A^E only: ±0.5 on every step (GiGPO reduces to Dr. GRPO over step rows).
    assert_close(
        group_credit("gigpo", toy_group(), gamma=0.5, step_advantage_w=0.0), [[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5], [0.5, 0.5]]
    )
    # ω = 2: A: step0 0.5 + 2 * 0.25 = 1.0, step1 0.5 + 2 * 0.3333 = 1.1667; C step1 stays -0.5 (singleton).
    advantages = group_credit("gigpo", toy_group(), gamma=0.5, step_advantage_w=2.0)
    assert_close(advantages, [[1.0, 1.1667], [-1.0, -1.8333], [-1.0, -0.5], [1.0, 1.1667]])


# ---------------------------------------------------------------- unequal trajectory lengths (γ = 0.5, mean_norm)
#   A: s0 -> success at once (r=1), 1 step, R=1;   B: s0 -> s1 -> s2, all 0, 3 steps, R=0;
#   C: s0 -> s1 -> success (r=1 at step 1), 2 steps, R=1.
#   A^E step rows: scores [1 | 0,0,0 | 1,1], mean 3/6 = 0.5     -> A: +0.5, B: -0.5, C: +0.5
#   A^E trajectories: [1, 0, 1], mean 2/3                       -> A: +0.3333, B: -0.6667, C: +0.3333
#   Step returns: A [1]; B [0, 0, 0]; C [0.5, 1].
#   A^S s0: [1, 0, 0.5] mean 0.5 -> A0 +0.5, B0 -0.5, C0 0;  s1: [0, 1] mean 0.5 -> B1 -0.5, C1 +0.5;  s2: B2 0.
def unequal_group() -> Group:
    return group_of(
        episode(("s0", 1)),
        episode(("s0", 0), ("s1", 0), ("s2", 0)),
        episode(("s0", 0), ("s1", 1)),
    )


def test_gigpo_unequal_lengths_step_rows():
    # A: 0.5 + 0.5 = 1.0;  B: -0.5 - 0.5, -0.5 - 0.5, -0.5 + 0;  C: 0.5 + 0, 0.5 + 0.5
    advantages = group_credit("gigpo", unequal_group(), gamma=0.5, episode_statistic="step_rows")
    assert_close(advantages, [[1.0], [-1.0, -1.0, -0.5], [0.5, 1.0]])


def test_gigpo_unequal_lengths_trajectories():
    # A: 0.3333 + 0.5 = 0.8333;  B: -0.6667 - 0.5, -0.6667 - 0.5, -0.6667 + 0;  C: 0.3333 + 0, 0.3333 + 0.5
    advantages = group_credit("gigpo", unequal_group(), gamma=0.5, episode_statistic="trajectories")
    assert_close(advantages, [[0.8333], [-1.1667, -1.1667, -0.6667], [0.3333, 0.8333]])


# ---------------------------------------------------------------- invalid-action penalty (λ = 0.1)
# Group: A: (s0, valid, r=0) -> (s1, valid, r=1), R=1;  B: (s0, valid, r=0) -> (s1, INVALID, r=0), R=0.
def penalty_group() -> Group:
    return group_of(episode(("s0", 0), ("s1", 1)), episode(("s0", 0), ("s1", 0, False)))


def test_grpo_penalty_trajectories_statistic():
    # Over trajectories [1, 0]: mean 0.5, then -0.1 on B's invalid step.
    assert_close(group_credit("grpo", penalty_group(), scale_rewards="none"), [[0.5, 0.5], [-0.5, -0.6]])
    # z-score: std sqrt(0.5) = 0.70711, 0.5 / (0.70711 + 1e-4) = 0.7070; B1: -0.7070 - 0.1 = -0.8070
    assert_close(group_credit("grpo", penalty_group()), [[0.7070, 0.7070], [-0.7070, -0.8070]])
    # RLOO: 1 - 0 = 1, 0 - 1 = -1, then -0.1 on B1.
    assert_close(group_credit("rloo", penalty_group()), [[1.0, 1.0], [-1.0, -1.1]])


def test_grpo_penalty_step_rows_statistic():
    # Scores s = R - λ[invalid] = [1, 1 | 0, -0.1]; mean 1.9 / 4 = 0.475.
    # none: [0.525, 0.525 | -0.475, -0.575]
    assert_close(
        group_credit("grpo", penalty_group(), scale_rewards="none", credit_statistic="step_rows"), [[0.525, 0.525], [-0.475, -0.575]]
    )
    # group: Σd² = 2 * 0.525² + 0.475² + 0.575² = 1.1075; std sqrt(1.1075 / 3) = 0.60759;
    #   0.525 / 0.60769 = 0.8639, -0.475 / 0.60769 = -0.7816, -0.575 / 0.60769 = -0.9462
    assert_close(group_credit("grpo", penalty_group(), credit_statistic="step_rows"), [[0.8639, 0.8639], [-0.7816, -0.9462]])


def test_grpo_penalty_not_divided_by_zero_std():
    # All returns 0, one invalid step: over trajectories the penalty stays exactly -λ, never -λ / 1e-4.
    group = group_of(episode(("s0", 0), ("s1", 0, False)), episode(("s0", 0), ("s1", 0)))
    assert_close(group_credit("grpo", group), [[0.0, -0.1], [0.0, 0.0]])
    assert_close(group_credit("grpo", group, invalid_action_penalty=0.0), [[0.0, 0.0], [0.0, 0.0]])


def test_gigpo_penalty_step_rows():
    # γ = 0.5. A^E: scores [1, 1 | 0, -0.1], mean 0.475 -> A: [0.525, 0.525], B: [-0.475, -0.575].
    # ρ: A [0.5, 1]; B [0, 0 - 0.1] (local, after discounting: B0 stays 0, not -0.05).
    # A^S s0: [0.5, 0] mean 0.25 -> A0 +0.25, B0 -0.25;  s1: [1, -0.1] mean 0.45 -> A1 +0.55, B1 -0.55.
    # A: [0.525 + 0.25, 0.525 + 0.55] = [0.775, 1.075];  B: [-0.475 - 0.25, -0.575 - 0.55] = [-0.725, -1.125]
    advantages = group_credit("gigpo", penalty_group(), gamma=0.5, episode_statistic="step_rows")
    assert_close(advantages, [[0.775, 1.075], [-0.725, -1.125]])


def test_gigpo_penalty_trajectories():
    # A^E over trajectories [1, 0]: ±0.5, then -0.1 on B1 -> A: [0.5, 0.5], B: [-0.5, -0.6]; A^S as above.
    # A: [0.5 + 0.25, 0.5 + 0.55] = [0.75, 1.05];  B: [-0.5 - 0.25, -0.6 - 0.55] = [-0.75, -1.15]
    advantages = group_credit("gigpo", penalty_group(), gamma=0.5, episode_statistic="trajectories")
    assert_close(advantages, [[0.75, 1.05], [-0.75, -1.15]])


def test_gigpo_penalty_changes_only_the_invalid_row_return():
    # With λ = 0 the same group gives A: [0.75, 1.0], B: [-0.75, -1.0] (s1: [1, 0] mean 0.5).
    advantages = group_credit("gigpo", penalty_group(), gamma=0.5, episode_statistic="trajectories", invalid_action_penalty=0.0)
    assert_close(advantages, [[0.75, 1.0], [-0.75, -1.0]])


# ---------------------------------------------------------------- anchors and similarity clustering

MUG = "You are in the kitchen. On the counter 1, you see a mug."
MUD = "You are in the kitchen. On the counter 1, you see a mud."  # one character differs: ratio 55/56 = 0.982


def test_similarity_clustering_threshold():
    group = group_of(episode((MUG, 1)), episode((MUD, 0)))
    # Exact keys: two singletons -> A^S = 0, A = A^E = R - 0.5 = ±0.5.
    assert_close(group_credit("gigpo", group), [[0.5], [-0.5]])
    # ratio 0.982 >= 0.9: one cluster [1, 0], mean 0.5 -> A^S = ±0.5 -> A = ±1.0
    advantages, stats = group_credit_and_stats("gigpo", group, similarity_threshold=0.9)
    assert_close(advantages, [[1.0], [-1.0]])
    assert stats == {"num_anchor_groups": 1, "mean_anchor_group_size": 2.0, "singleton_anchor_fraction": 0.0}
    # ratio 0.982 < 0.999: two singletons again.
    advantages, stats = group_credit_and_stats("gigpo", group, similarity_threshold=0.999)
    assert_close(advantages, [[0.5], [-0.5]])
    assert stats == {"num_anchor_groups": 2, "mean_anchor_group_size": 1.0, "singleton_anchor_fraction": 1.0}


def test_similarity_joins_first_matching_cluster():
    # ratio(a, b) = 0; ratio(c, a) = ratio(c, b) = 2 * 5 / 20 = 0.5 -> at 0.5, c joins a's cluster (created first).
    a, b, c = "aaaaaaaaaa", "bbbbbbbbbb", "aaaaabbbbb"
    group = group_of(episode((a, 1)), episode((b, 0)), episode((c, 0)))
    # A^E: R = [1, 0, 0], mean 1/3 -> [0.6667, -0.3333, -0.3333]
    # A^S: {a, c} returns [1, 0] mean 0.5 -> a +0.5, c -0.5;  {b} singleton -> 0
    advantages = group_credit("gigpo", group, similarity_threshold=0.5)
    assert_close(advantages, [[1.1667], [-0.3333], [-0.8333]])


def test_singleton_anchors_reduce_gigpo_to_grpo():
    # No state repeats: every A^S = 0, so GiGPO = Dr. GRPO (mean_norm) / GRPO z-score with ε = 1e-6 over step rows.
    group = group_of(episode(("a", 0), ("b", 1)), episode(("c", 0), ("d", 0)))
    advantages, stats = group_credit_and_stats("gigpo", group, gamma=0.5)
    assert_close(advantages, [[0.5, 0.5], [-0.5, -0.5]])  # scores [1, 1, 0, 0], mean 0.5
    assert stats["singleton_anchor_fraction"] == 1.0
    # mean_std_norm: std sqrt(4 * 0.25 / 3) = 0.5774 -> ±0.8660
    assert_close(group_credit("gigpo", group, gigpo_mode="mean_std_norm"), [[0.8660, 0.8660], [-0.8660, -0.8660]])


def test_anchor_state_key_versus_observation():
    # Different observation texts, same state_key: one anchor group with "state_key", two with "observation".
    first, second = episode(("view 1", 1)), episode(("view 2", 0))
    first.steps[0].state_key = second.steps[0].state_key = (2, 3)
    group = group_of(first, second)
    assert_close(group_credit("gigpo", group, anchor="state_key"), [[1.0], [-1.0]])  # A^E ±0.5 + A^S ±0.5
    assert_close(group_credit("gigpo", group, anchor="observation"), [[0.5], [-0.5]])  # singletons
    # Similarity needs text anchors.
    with pytest.raises(TypeError, match="text anchors"):
        group_credit("gigpo", group, anchor="state_key", similarity_threshold=0.9)
    assert_close(group_credit("gigpo", group, anchor="observation", similarity_threshold=0.5), [[1.0], [-1.0]])


# ---------------------------------------------------------------- structure and edge cases


# Greedy similarity clustering depends on the row order by design: exact anchors only.
EXACT_ANCHOR_CONFIGS = [(name, options) for name, options in ALL_CONFIGS if not options.get("similarity_threshold")]


@pytest.mark.parametrize(("name", "options"), EXACT_ANCHOR_CONFIGS)
def test_permuting_trajectories_permutes_advantages(name, options):
    rng = random.Random(0)
    trajectories = [
        episode(
            *((f"s{rng.randrange(3)}", rng.choice([0, 0, 1]), rng.random() > 0.2) for _ in range(rng.randint(1, 5)))
        )
        for _ in range(6)
    ]
    order = [3, 0, 5, 1, 4, 2]
    advantages = group_credit(name, group_of(*trajectories), **options)
    permuted = group_credit(name, group_of(*(trajectories[i] for i in order)), **options)
    assert_close(permuted, [advantages[i] for i in order], tol=1e-12)


@pytest.mark.parametrize(("name", "options"), ALL_CONFIGS)
def test_empty_group_and_zero_step_trajectories(name, options):
    assert group_credit(name, group_of(), **options) == []
    assert group_credit(name, group_of(Trajectory(task={})), **options) == [[]]
    mixed = group_credit(name, group_of(Trajectory(task={}), episode(("s0", 0), ("s1", 1))), **options)
    assert [len(row) for row in mixed] == [0, 2]
    assert all_finite(mixed)


def test_gigpo_stats_empty_group():
    assert group_credit_and_stats("gigpo", group_of()) == (
        [],
        {"num_anchor_groups": 0, "mean_anchor_group_size": 0.0, "singleton_anchor_fraction": 0.0},
    )


def test_discounted_returns():
    # γ = 0.5: R2 = 4; R1 = 0 + 0.5 * 4 = 2; R0 = 1 + 0.5 * 2 = 2
    assert discounted_returns([1.0, 0.0, 4.0], 0.5) == [2.0, 2.0, 4.0]
    assert discounted_returns([], 0.95) == []


def test_bad_arguments_are_rejected():
    group = toy_group()
    with pytest.raises(ValueError, match="scale"):
        group_credit("grpo", group, scale_rewards="batch")
    with pytest.raises(ValueError, match="statistic"):
        group_credit("grpo", group, credit_statistic="rows")
    with pytest.raises(ValueError, match="mode"):
        group_credit("gigpo", group, gigpo_mode="std")
    with pytest.raises(ValueError, match="anchor"):
        group_credit("gigpo", group, anchor="history")
    for threshold in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="similarity_threshold"):
            group_credit("gigpo", group, similarity_threshold=threshold)
    with pytest.raises(ValueError, match="non-finite"):
        group_credit("grpo", one_step_group(1.0, float("nan")))
    with pytest.raises(ValueError, match="non-finite"):
        group_credit("gigpo", one_step_group(1.0, float("inf")))


# ---------------------------------------------------------------- registry


def test_registry():
    assert {"grpo", "rloo", "gigpo"} <= set(CREDIT_ESTIMATORS)
    assert all(get_estimator(name) is entry for name, entry in CREDIT_ESTIMATORS.items())
    assert get_estimator("grpo").function is grpo_advantages
    assert get_estimator("rloo").function is rloo_advantages
    assert get_estimator("gigpo").function is gigpo_advantages


def test_params_come_from_a_config_and_are_checked_once():
    # Params fields are config fields: `from_config` reads them off a config; run-time inputs come as keywords.
    config = SimpleNamespace(invalid_action_penalty=0.2, scale_rewards="none", credit_statistic="step_rows")
    assert GRPOParams.from_config(config) == GRPOParams(
        invalid_action_penalty=0.2, scale_rewards="none", credit_statistic="step_rows"
    )
    assert GRPOParams.from_config(config, eps=1e-3).eps == 1e-3
    with pytest.raises(ValueError, match="'gamma'"):  # a config without GiGPO's fields
        GiGPOParams.from_config(config)
    with pytest.raises(TypeError, match="'omega'"):  # not a field
        GRPOParams.from_config(config, omega=1.0)
    with pytest.raises(ValueError, match="scale"):  # validated when built, not on every call
        GRPOParams(scale_rewards="batch")
    with pytest.raises(TypeError, match="takes GiGPOParams"):
        get_estimator("gigpo")([toy_group()], GRPOParams())


def test_stats_are_totals_over_the_groups_of_a_call():
    # GiGPO's anchor stats are over the groups that have anchor states (the empty group is not counted); a trainer
    # logs Σ total / Σ count of the stats the estimator declares (`metrics`), not its other diagnostics.
    estimator = get_estimator("gigpo")
    advantages, stats = estimator([toy_group(), group_of()], estimator.params(gamma=0.5))
    assert advantages[0] == group_credit("gigpo", toy_group(), gamma=0.5) and advantages[1] == []
    assert stats["num_anchor_groups"] == (3, 1) and stats["mean_anchor_group_size"] == (8 / 3, 1)
    assert set(estimator.logged(stats)) == {"mean_anchor_group_size", "singleton_anchor_fraction"}
    assert get_estimator("grpo")([toy_group()], GRPOParams())[1] == {}


def test_unknown_estimator_message():
    with pytest.raises(ValueError, match=r"Unknown credit estimator 'gipgo'\. Known: .*gigpo, grpo, .*rloo") as info:
        get_estimator("gipgo")
    assert "Did you mean 'gigpo'?" in str(info.value)
    with pytest.raises(ValueError, match="Known: .*gigpo, grpo, .*rloo") as info:
        get_estimator("ppo-with-a-critic")
    assert "Did you mean" not in str(info.value)


@pytest.mark.parametrize("module", [credit, credit_base, credit_grpo, credit_rloo, credit_gigpo])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.failed == 0
