"""BiPACE (credit/bipace.py, trainers/bipace.py): hand-computed clusters and advantages, properties, the trainer.

The expected values are written out with their arithmetic in comments; they are not recomputed with the code under
test. Docs: docs/methods/bipace.md.
"""

from __future__ import annotations

import doctest
import math
import os
import random

import pytest
import torch
import yaml
from datasets import Dataset
from helpers import all_finite, assert_close, group_of

from trl_agents.credit import bipace as credit_bipace
from trl_agents.credit import stat_means
from trl_agents.credit.bipace import (
    BiPACEParams,
    bipace_advantages,
    greedy_cosine_clusters,
    pace_step_advantages,
    step_action_key,
    unit_gram,
)
from trl_agents.envs import AgentEnv, get_env_class, register_env
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import bipace as trainer_bipace
from trl_agents.trainers.bipace import BiPACEConfig, BiPACETrainer
from trl_agents.trajectory import Group, Step, Trajectory


def bipace_with_stats(group, hidden_states=None, **params):
    """BiPACE on one group (`hidden_states`: its step vectors, None for exact state keys): (advantages, stat values)."""
    (advantages,), stats = bipace_advantages([group], BiPACEParams(hidden_states=[hidden_states], **params))
    return advantages, stat_means(stats)


def bipace(group, hidden_states=None, **params):
    """BiPACE's advantages of one group (see `bipace_with_stats`)."""
    return bipace_with_stats(group, hidden_states, **params)[0]


TOL = 1e-4
CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs")


def episode(*steps: tuple) -> Trajectory:
    """A trajectory from (observation, action, reward) or (observation, action, reward, valid) tuples."""
    made = []
    for spec in steps:
        observation, action, reward, valid = (*spec, True) if len(spec) == 3 else spec
        made.append(
            Step(observation=observation, action_text=f"<action>{action}</action>", reward=float(reward), valid=valid)
        )
    return Trajectory(task={"task_id": "t"}, steps=made)


def unit_angle(degrees: float) -> list[float]:
    return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]


# ---------------------------------------------------------------- hand-computed case 1: 3-D hidden states
# γ = 0.5, ε = 0.05, w = 1, centroid "mean". Rows in order A0, A1, B0, B1, C0, C1:
#   A: φ (1,0,0) "left" r=0  -> φ (0,1,0)   "up"   r=1      R=1, ρ = [0.5, 1]
#   B: φ (1,.1,0) "right" r=0 -> φ (0,1,.1) "up"   r=0      R=0, ρ = [0, 0]
#   C: φ (1,0,0) "left" r=0  -> φ (0,0,1)   "down" r=0      R=0, ρ = [0, 0]
# Clustering (one pass):
#   A0 opens c0 = (1,0,0).  A1: cos to c0 = 0 -> d = 1 > ε, opens c1 = (0,1,0).
#   B0: unit (0.99504, 0.09950, 0), cos to c0 = 0.99504 -> d = 0.00496 <= ε: joins c0;
#       c0 = unit((1,0,0) + (0.99504,0.09950,0)) = (0.99876, 0.04981, 0).
#   B1: unit (0, 0.99504, 0.09950); cos to c0 = 0.04956, to c1 = 0.99504 -> d = 0.00496: joins c1;
#       c1 = (0, 0.99876, 0.04981).
#   C0: cos to c0 = 0.99876 -> d = 0.00124: joins c0.   C1 (0,0,1): cos to c1 = 0.04981 -> d = 0.95: opens c2.
#   Clusters: c0 = {A0, B0, C0}, c1 = {A1, B1}, c2 = {C1}  ->  labels [0, 1, 0, 1, 0, 2].
# A^ep (mean_norm, step rows): scores [1, 1, 0, 0, 0, 0], mean 1/3 -> A: +0.66667, B, C: -0.33333.
HIDDEN_3D = [[1, 0, 0], [0, 1, 0], [1, 0.1, 0], [0, 1, 0.1], [1, 0, 0], [0, 0, 1]]


def case_3d() -> Group:
    return group_of(
        episode(("a0", "left", 0), ("a1", "up", 1)),
        episode(("b0", "right", 0), ("b1", "up", 0)),
        episode(("c0", "left", 0), ("c1", "down", 0)),
    )


def test_hand_case_clusters():
    assert greedy_cosine_clusters(HIDDEN_3D, 0.05) == [0, 1, 0, 1, 0, 2]
    _, stats = bipace_with_stats(case_3d(), hidden_states=HIDDEN_3D, cluster_epsilon=0.05, gamma=0.5)
    # 6 rows / 3 clusters; c2 is a singleton; only c0 has two different actions (c1: "up" twice).
    assert stats["num_clusters"] == 3
    assert stats["mean_cluster_size"] == pytest.approx(2.0)
    assert stats["singleton_cluster_fraction"] == pytest.approx(1 / 3)
    assert stats["mixed_action_cluster_fraction"] == pytest.approx(1 / 3)


def test_hand_case_q_style():
    # c0: ρ A0 0.5 (left), B0 0 (right), C0 0 (left): V = 0.5/3 = 0.16667;
    #     Q(left) = (0.5 + 0)/2 = 0.25 -> A0, C0: 0.25 - 0.16667 = +0.08333;  Q(right) = 0 -> B0: -0.16667.
    # c1: A1, B1 both "up" -> Q = V -> 0.   c2: singleton -> 0.
    # A: [0.66667 + 0.08333, 0.66667] = [0.75, 0.66667];  B: [-0.33333 - 0.16667, -0.33333] = [-0.5, -0.33333];
    # C: [-0.33333 + 0.08333, -0.33333] = [-0.25, -0.33333]
    advantages = bipace(case_3d(), hidden_states=HIDDEN_3D, cluster_epsilon=0.05, gamma=0.5)
    assert_close(advantages, [[0.75, 0.66667], [-0.5, -0.33333], [-0.25, -0.33333]])


def test_hand_case_diff_peer():
    # c0: A0: 0.5 - mean{B0} = 0.5;  B0: 0 - mean{A0, C0} = -0.25;  C0: 0 - mean{B0} = 0.
    # c1, c2: no peer took another action -> 0.
    # A: [0.66667 + 0.5, 0.66667] = [1.16667, 0.66667];  B: [-0.33333 - 0.25, -0.33333] = [-0.58333, -0.33333];
    # C: [-0.33333, -0.33333]
    advantages = bipace(case_3d(), hidden_states=HIDDEN_3D, cluster_epsilon=0.05, gamma=0.5, pace_estimator="diff_peer")
    assert_close(advantages, [[1.16667, 0.66667], [-0.58333, -0.33333], [-0.33333, -0.33333]])


def test_hand_case_mean_std_norm_episode_and_omega():
    # A^ep mean_std_norm: [1,1,0,0,0,0], mean 1/3, Bessel std sqrt((2 * 4/9 + 4 * 1/9) / 5) = sqrt(12/45) = 0.516398
    #   -> A: 0.66667 / 0.516398 = 1.290994,  B, C: -0.33333 / 0.516398 = -0.645497 (Â^S is not std-normalised).
    # w = 2: A: [1.290994 + 2 * 0.08333, 1.290994] = [1.45766, 1.29099];  B: [-0.645497 - 0.33333, -0.645497];
    #        C: [-0.645497 + 0.16667, -0.645497]
    advantages = bipace(
        case_3d(), hidden_states=HIDDEN_3D, cluster_epsilon=0.05, gamma=0.5, step_advantage_w=2.0, episode_mode="mean_std_norm"
    )
    assert_close(advantages, [[1.45766, 1.29099], [-0.97883, -0.64550], [-0.47883, -0.64550]])


def test_hand_case_epsilon_zero_and_large():
    # ε = 0: only identical directions share a cluster: {A0, C0} (both (1,0,0), both "left") -> every Â^S = 0 and
    # A = A^ep: A: +0.66667, B, C: -0.33333.
    assert greedy_cosine_clusters(HIDDEN_3D, 0.0) == [0, 1, 2, 3, 0, 4]
    advantages = bipace(case_3d(), hidden_states=HIDDEN_3D, cluster_epsilon=0.0, gamma=0.5)
    assert_close(advantages, [[0.66667, 0.66667], [-0.33333, -0.33333], [-0.33333, -0.33333]])
    # ε = 2: one cluster of all six rows. V = (0.5 + 1)/6 = 0.25; Q(left) = (0.5 + 0)/2 = 0.25 -> 0;
    # Q(up) = (1 + 0)/2 = 0.5 -> +0.25; Q(right) = 0 -> -0.25; Q(down) = 0 -> -0.25.
    # A: [0.66667, 0.91667];  B: [-0.58333, -0.08333];  C: [-0.33333, -0.58333]
    advantages = bipace(case_3d(), hidden_states=HIDDEN_3D, cluster_epsilon=2.0, gamma=0.5)
    assert_close(advantages, [[0.66667, 0.91667], [-0.58333, -0.08333], [-0.33333, -0.58333]])


# ---------------------------------------------------------------- hand-computed case 2: the GiGPO toy group + actions
# docs/methods/gigpo.md with actions (γ = 0.5):  A: s0 -a-> s1 -b-> ✓ (R=1);  B: s0 -a-> s1 -c-> ✗;
# C: s0 -d-> s2 -e-> ✗;  D = copy of A.   ρ: A, D [0.5, 1];  B, C [0, 0].
# Clusters by state: s0 = {A0, B0, C0, D0}, s1 = {A1, B1, D1}, s2 = {C1}.
# s0: V = (0.5 + 0 + 0 + 0.5)/4 = 0.25; Q(a) = (0.5 + 0 + 0.5)/3 = 0.33333 -> A0, B0, D0: +0.08333;
#     Q(d) = 0 -> C0: -0.25
# s1: V = 2/3; Q(b) = 1 -> A1, D1: +0.33333; Q(c) = 0 -> B1: -0.66667.   s2: 0.
# A^ep (mean_norm, step rows [1,1,0,0,0,0,1,1]): ±0.5.
# A: [0.58333, 0.83333]; B: [-0.41667, -1.16667]; C: [-0.75, -0.5]; D = A.
# (GiGPO gives B0 -0.75: PACE credits B's first move, the same as the winners'.)
TOY_EXPECTED = [[0.58333, 0.83333], [-0.41667, -1.16667], [-0.75, -0.5], [0.58333, 0.83333]]


def toy_group() -> Group:
    return group_of(
        episode(("s0", "a", 0), ("s1", "b", 1)),
        episode(("s0", "a", 0), ("s1", "c", 0)),
        episode(("s0", "d", 0), ("s2", "e", 0)),
        episode(("s0", "a", 0), ("s1", "b", 1)),
    )


def test_toy_group_with_state_keys_is_the_identity_embedder():
    # hidden_states=None clusters by exact state (ε = 0, one-hot identity embedder) ...
    assert_close(bipace(toy_group(), gamma=0.5), TOY_EXPECTED)
    # ... and one-hot vectors with any ε < 1 give the same clusters.
    one_hot = {"s0": [1, 0, 0], "s1": [0, 1, 0], "s2": [0, 0, 1]}
    hidden = [one_hot[s.observation] for t in toy_group().trajectories for s in t.steps]
    assert_close(bipace(toy_group(), hidden_states=hidden, cluster_epsilon=0.5, gamma=0.5), TOY_EXPECTED)


def test_toy_group_invalid_penalty():
    # B's second step invalid (λ = 0.1): A^ep scores [1,1,0,-0.1,0,0,1,1], mean 3.9/8 = 0.4875 -> A, D: +0.5125,
    # B: [-0.4875, -0.5875], C: -0.4875.  ρ_B1 = -0.1: s1 V = (1 - 0.1 + 1)/3 = 0.63333; Q(b) = 1 -> +0.36667;
    # Q(c) = -0.1 -> -0.73333.  s0 unchanged (+0.08333 / -0.25).
    # A: [0.5125 + 0.08333, 0.5125 + 0.36667] = [0.59583, 0.87917];  B: [-0.4875 + 0.08333, -0.5875 - 0.73333] =
    # [-0.40417, -1.32083];  C: [-0.4875 - 0.25, -0.4875] = [-0.7375, -0.4875]
    group = toy_group()
    group.trajectories[1].steps[1].valid = False
    assert_close(
        bipace(group, gamma=0.5),
        [[0.59583, 0.87917], [-0.40417, -1.32083], [-0.7375, -0.4875], [0.59583, 0.87917]],
    )


# ---------------------------------------------------------------- clustering details


def test_running_mean_versus_first_member_centroid():
    # Unit vectors at 0°, 20°, 30°; ε = 0.1.  20° vs 0°: d = 1 - cos 20° = 0.0603 -> joins.
    # "mean": the centroid moves to 10°; 30° vs 10°: d = 1 - cos 20° = 0.0603 -> joins: [0, 0, 0].
    # "first": the centroid stays at 0°; 30° vs 0°: d = 1 - cos 30° = 0.1340 > 0.1 -> opens: [0, 0, 1].
    vectors = [unit_angle(0), unit_angle(20), unit_angle(30)]
    assert greedy_cosine_clusters(vectors, 0.1, "mean") == [0, 0, 0]
    assert greedy_cosine_clusters(vectors, 0.1, "first") == [0, 0, 1]


def test_nearest_centroid_wins_not_the_first_within_epsilon():
    # 0° and 30° are 0.1340 apart (> ε = 0.1): two clusters.  20°: d to 0° = 0.0603, to 30° = 1 - cos 10° = 0.0152;
    # both within ε, it joins the nearer one (cluster 1).
    assert greedy_cosine_clusters([unit_angle(0), unit_angle(30), unit_angle(20)], 0.1) == [0, 1, 1]


def test_cosine_ignores_scale_and_zero_vectors_stay_apart():
    # (2,0) and (0.5,0) point the same way: one cluster.  (0,0) is at distance 1 from everything: its own cluster
    # even with ε = 0.99, and it does not poison later rows.
    assert greedy_cosine_clusters([[2, 0], [0.5, 0], [0, 0], [0, 0], [3, 0]], 0.99) == [0, 0, 1, 2, 0]


def test_action_keys():
    assert step_action_key(Step("s", "<think>hmm</think><action>Go To  Desk 1</action>")) == "go to desk 1"
    assert step_action_key(Step("s", "  UP ")) == "up"  # no tag: the reply without <think> blocks
    # The env's canonical action wins (e.g. Sokoban parses "<action>Up</action>" and "up!" to "up").
    assert step_action_key(Step("s", "<action>Up</action>", info={"action": "up"})) == "up"
    assert step_action_key(Step("s", "push up now", info={"action": "up"})) == "up"
    # info["action"] = None (an invalid reply) falls back to the text.
    assert step_action_key(Step("s", "<action>fly</action>", info={"action": None})) == "fly"
    step = Step("s", "x", action_ids=list(range(12)))
    assert step_action_key(step, "first_tokens") == tuple(range(8))


def test_pace_with_first_token_keys():
    # Same text key, different first tokens: "first_tokens" separates them. Two steps of one state (one-hot),
    # returns 1 and 0: Q(own key) - V = ±0.5 with first-token keys, 0 with the (equal) text keys. A^ep = ±0.5.
    first = Trajectory(task={}, steps=[Step("s", "<action>up</action>", action_ids=[5, 6], reward=1.0)])
    second = Trajectory(task={}, steps=[Step("s", "<action>up</action>", action_ids=[7, 6], reward=0.0)])
    group = group_of(first, second)
    assert_close(bipace(group, hidden_states=[[1, 0], [1, 0]], action_key="first_tokens"), [[1.0], [-1.0]])
    assert_close(bipace(group, hidden_states=[[1, 0], [1, 0]]), [[0.5], [-0.5]])


def test_pace_step_advantages_directly():
    # One cluster, actions x, x, y with returns 3, 1, 2: V = 2; Q(x) = 2 -> 0, 0; Q(y) = 2 -> 0 (q_style).
    assert pace_step_advantages([3.0, 1.0, 2.0], [0, 0, 0], ["x", "x", "y"]) == [0.0, 0.0, 0.0]
    # diff_peer: 3 - 2 = 1, 1 - 2 = -1, 2 - mean(3, 1) = 0.
    assert pace_step_advantages([3.0, 1.0, 2.0], [0, 0, 0], ["x", "x", "y"], "diff_peer") == [1.0, -1.0, 0.0]


# ---------------------------------------------------------------- properties

ESTIMATOR_CONFIGS = [
    {"pace_estimator": estimator, "episode_mode": mode, "episode_statistic": statistic, "centroid": centroid}
    for estimator in ("q_style", "diff_peer")
    for mode in ("mean_norm", "mean_std_norm")
    for statistic in ("step_rows", "trajectories")
    for centroid in ("mean", "first")
]


def random_group(rng: random.Random, size: int = 6, reward_choices=(0, 0, 1), invalid_rate: float = 0.2):
    trajectories = [
        episode(
            *(
                (f"s{rng.randrange(3)}", rng.choice(["up", "down", "left"]), rng.choice(reward_choices),
                 rng.random() > invalid_rate)
                for _ in range(rng.randint(1, 5))
            )
        )
        for _ in range(size)
    ]
    return group_of(*trajectories)


def prototype_vectors(group: Group, rng: random.Random, noise: float = 1e-3) -> list[list[float]]:
    """Well-separated directions (one per state) plus tiny noise: clusters that do not depend on the row order."""
    prototypes = {"s0": [1, 0, 0, 0], "s1": [0, 1, 0, 0], "s2": [0, 0, 1, 0]}
    return [
        [x + rng.uniform(-noise, noise) for x in prototypes[s.observation]]
        for t in group.trajectories
        for s in t.steps
    ]


@pytest.mark.parametrize("options", ESTIMATOR_CONFIGS)
@pytest.mark.parametrize("reward", [0.0, 1.0, 10.0])
def test_all_equal_rewards_give_zero(options, reward):
    # Same rewards at the same turns, every action valid: A^ep = 0; states s0 (turn 0) and s1, s2 (turn 1) have
    # their own directions, so a cluster holds equal returns ρ -> Q̂ = V̂ -> Â^S = 0 (module docstring).
    group = group_of(*(episode(("s0", "up", 0), (f"s{i % 2 + 1}", ["up", "down"][i % 2], reward)) for i in range(4)))
    hidden = prototype_vectors(group, random.Random(1))
    assert bipace(group, hidden_states=hidden, cluster_epsilon=0.05, **options) == [[0.0, 0.0]] * 4
    assert bipace(group, **options) == [[0.0, 0.0]] * 4  # exact state keys


@pytest.mark.parametrize("options", ESTIMATOR_CONFIGS)
def test_all_zero_rewards_give_zero_whatever_the_clusters(options):
    # All returns 0: every cluster, however mixed (random vectors, ε up to 2), has ρ = 0 everywhere.
    rng = random.Random(2)
    group = random_group(rng, reward_choices=(0,), invalid_rate=0.0)
    rows = sum(t.num_steps for t in group.trajectories)
    for epsilon in (0.0, 0.5, 2.0):
        hidden = [[rng.gauss(0, 1) for _ in range(5)] for _ in range(rows)]
        advantages = bipace(group, hidden_states=hidden, cluster_epsilon=epsilon, **options)
        assert advantages == [[0.0] * t.num_steps for t in group.trajectories]


@pytest.mark.parametrize("options", ESTIMATOR_CONFIGS)
def test_permuting_trajectories_permutes_advantages(options):
    rng = random.Random(0)
    group = random_group(rng)
    hidden = prototype_vectors(group, rng)
    rows_of, offset = [], 0
    for traj in group.trajectories:
        rows_of.append(hidden[offset : offset + traj.num_steps])
        offset += traj.num_steps
    order = [3, 0, 5, 1, 4, 2]
    advantages = bipace(group, hidden_states=hidden, cluster_epsilon=0.05, **options)
    permuted_group = group_of(*(group.trajectories[i] for i in order))
    permuted_hidden = [row for i in order for row in rows_of[i]]
    permuted = bipace(permuted_group, hidden_states=permuted_hidden, cluster_epsilon=0.05, **options)
    assert_close(permuted, [advantages[i] for i in order], tol=1e-12)


@pytest.mark.parametrize("options", ESTIMATOR_CONFIGS)
def test_edge_groups_are_finite(options):
    # Empty group, zero-step trajectory, singleton group, length-1 trajectories, all-invalid actions, zero vectors.
    assert bipace(group_of(), hidden_states=[], **options) == []
    assert bipace(group_of(), **options) == []
    assert bipace(group_of(Trajectory(task={})), hidden_states=[], **options) == [[]]
    mixed = bipace(
        group_of(Trajectory(task={}), episode(("s0", "up", 0), ("s1", "up", 1))), hidden_states=[[1, 0], [0, 1]],
        **options,
    )
    assert [len(row) for row in mixed] == [0, 2] and all_finite(mixed)
    singleton = bipace(group_of(episode(("s0", "up", 1))), hidden_states=[[1.0, 2.0]], **options)
    assert all_finite(singleton) and len(singleton) == 1
    length_one = group_of(*(episode(("s0", a, r)) for a, r in [("up", 1), ("down", 0), ("up", 0)]))
    assert all_finite(bipace(length_one, hidden_states=[[1, 0]] * 3, **options))
    invalid = group_of(*(episode(("s0", "fly", 0, False), ("s1", "swim", 0, False)) for _ in range(3)))
    advantages = bipace(invalid, hidden_states=[[1, 0], [0, 1]] * 3, **options)
    assert all_finite(advantages)
    zeros = bipace(length_one, hidden_states=[[0, 0]] * 3, **options)
    assert all_finite(zeros)


def test_singleton_group_follows_gigpo():
    # One step row in the group: A^ep gets μ = 0, σ = 1 (verl-agent), so A = R; a singleton cluster: Â^S = 0.
    assert bipace(group_of(episode(("s0", "up", 3))), hidden_states=[[1, 0]]) == [[3.0]]


def test_random_groups_are_finite():
    rng = random.Random(3)
    for _ in range(50):
        group = random_group(rng, size=rng.randint(1, 8), reward_choices=(0, 1, 10, -1))
        rows = sum(t.num_steps for t in group.trajectories)
        hidden = [[rng.gauss(0, 1) for _ in range(6)] for _ in range(rows)]
        for options in ESTIMATOR_CONFIGS[::3]:
            assert all_finite(bipace(group, hidden_states=hidden, cluster_epsilon=rng.uniform(0, 1), **options))


def test_numpy_and_torch_gram_agree():
    # The trainer passes torch tensors (Gram computed where they live); lists and arrays go through numpy.
    vectors = [[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [-1.0, 0.5, 3.0]]
    expected = unit_gram(vectors)
    assert expected[0, 0] == pytest.approx(1.0) and expected[1].tolist() == [0.0, 0.0, 0.0]
    assert unit_gram(torch.tensor(vectors)) == pytest.approx(expected, abs=1e-7)


def test_accelerator_tensor_path(monkeypatch):
    # Tensors on an accelerator are checked and multiplied where they live; run that branch on CPU tensors.
    monkeypatch.setattr(credit_bipace, "_is_host_tensor", lambda tensor: False)
    hidden = torch.tensor(HIDDEN_3D, dtype=torch.float32)
    advantages = bipace(case_3d(), hidden_states=hidden, cluster_epsilon=0.05, gamma=0.5)
    assert_close(advantages, [[0.75, 0.66667], [-0.5, -0.33333], [-0.25, -0.33333]])
    assert unit_gram(hidden) == pytest.approx(unit_gram(HIDDEN_3D), abs=1e-7)
    with pytest.raises(ValueError, match="NaN"):
        bipace(case_3d(), hidden_states=torch.full((6, 3), float("nan")))
    with pytest.raises(ValueError, match="one vector per step"):
        bipace(case_3d(), hidden_states=hidden[:4])
    assert bipace(group_of(), hidden_states=torch.zeros((0, 0))) == []


def test_torch_and_bfloat16_hidden_states_are_accepted():
    hidden = torch.tensor(HIDDEN_3D, dtype=torch.bfloat16)
    advantages = bipace(case_3d(), hidden_states=hidden, cluster_epsilon=0.05, gamma=0.5)
    assert_close(advantages, [[0.75, 0.66667], [-0.5, -0.33333], [-0.25, -0.33333]])


def test_bad_arguments_are_rejected():
    group = case_3d()
    with pytest.raises(ValueError, match="estimator"):
        bipace(group, hidden_states=HIDDEN_3D, pace_estimator="v_style")
    with pytest.raises(ValueError, match="action_key"):
        bipace(group, hidden_states=HIDDEN_3D, action_key="verb")
    with pytest.raises(ValueError, match="centroid"):
        bipace(group, hidden_states=HIDDEN_3D, centroid="median")
    with pytest.raises(ValueError, match="episode_mode"):
        bipace(group, hidden_states=HIDDEN_3D, episode_mode="std")
    for epsilon in (-0.1, 2.5, float("nan")):
        with pytest.raises(ValueError, match="epsilon"):
            bipace(group, hidden_states=HIDDEN_3D, cluster_epsilon=epsilon)
    with pytest.raises(ValueError, match="one vector per step"):
        bipace(group, hidden_states=HIDDEN_3D[:5])
    with pytest.raises(ValueError, match="one vector per step"):
        bipace(group, hidden_states=[1.0] * 6)
    with pytest.raises(ValueError, match="NaN"):
        bipace(group, hidden_states=[[float("nan"), 0, 0]] + HIDDEN_3D[1:])
    with pytest.raises(ValueError, match="non-finite"):
        bipace(group_of(episode(("s", "up", float("inf")))), hidden_states=[[1, 0]])


@pytest.mark.parametrize("module", [credit_bipace, trainer_bipace])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


# ---------------------------------------------------------------- config


def test_config_rejects_bad_values(tmp_path):
    for field, value in [
        ("pace_estimator", "v_style"), ("action_key", "verb"), ("pooling", "max"), ("centroid", "median"),
        ("episode_mode", "std"), ("episode_statistic", "rows"), ("hidden_state_source", "cache"),
        ("cluster_epsilon", 3.0), ("gamma", 1.5),
    ]:
        with pytest.raises(ValueError, match=field):
            BiPACEConfig(str(tmp_path), **{field: value})
    with pytest.raises(ValueError, match="hidden_layer"):
        BiPACEConfig(str(tmp_path), hidden_layer="last")


@pytest.fixture
def bipace_registered():
    """Register BiPACE in the method registry for this test only (the shared registry entry is added separately)."""
    from trl_agents.trainers import METHODS

    return METHODS["bipace"]  # registered by BiPACETrainer's own declaration


@pytest.mark.parametrize("name", ["bipace_alfworld.yaml", "bipace_sokoban_tiny.yaml"])
def test_yaml_configs_parse(name, bipace_registered):
    from trl import ModelConfig, TrlParser

    from trl_agents.run import RunArguments
    from trl_agents.trainers import get_method

    path = os.path.join(CONFIGS, name)
    with open(path) as handle:
        assert yaml.safe_load(handle)["method"] == "bipace"
    method = get_method("bipace")
    run, config, model = TrlParser((RunArguments, method.config_class, ModelConfig)).parse_args_and_config(
        ["--config", path]
    )
    assert isinstance(config, BiPACEConfig) and config.env_name and (run.tiny_model or model.model_name_or_path)
    if name == "bipace_alfworld.yaml":  # the README's Qwen2.5-1.5B column (docs/methods/bipace.md, "Defaults")
        assert (config.hidden_layer, config.cluster_epsilon) == (-12, 0.05)
        assert (config.num_generations, config.max_turns) == (8, 50)
        assert (config.pace_estimator, config.action_key, config.gamma) == ("q_style", "action_tag", 0.95)


# ---------------------------------------------------------------- trainer (tiny model)

TASKS = [{"env": "test-keyword", "seed": s} for s in range(8)]


@register_env
class StatelessKeyword(get_env_class("test-keyword")):  # the toy env of conftest.py without any capability
    name = "test-bipace-stateless"
    state_key = AgentEnv.state_key


def make_config(tmp_path, **overrides) -> BiPACEConfig:
    return tiny_training_config(
        BiPACEConfig, tmp_path / "out",
        # the conftest model has one decoder layer
        **{"hidden_layer": -1, "cluster_epsilon": 0.05, **overrides},
    )


@pytest.mark.slow
@pytest.mark.parametrize("source", ["rollout", "forward"])
def test_two_training_steps(source, tiny_model, tokenizer, tmp_path):
    # The stateless env also shows that BiPACE needs no environment capability (required_env_capabilities = ()).
    assert StatelessKeyword.capabilities() == frozenset() and BiPACETrainer.required_env_capabilities == ()
    tasks = [{"env": "test-bipace-stateless", "seed": s} for s in range(8)]
    config = make_config(tmp_path, hidden_state_source=source)
    trainer = BiPACETrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list(tasks),
                            processing_class=tokenizer)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter moved"
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == 2 and logs[0]["train_rows"] == 16  # 8 episodes x 2 turns, step rows
    for log in logs:
        for key in ("bipace/mean_cluster_size", "bipace/singleton_cluster_fraction",
                    "bipace/mixed_action_cluster_fraction", "bipace/hidden_state_seconds"):
            assert key in log and math.isfinite(log[key]), key
        # Every step prompt's hidden state came from the rollout's prefill, or none did (extra forward).
        assert log["bipace/rollout_hidden_state_fraction"] == (1.0 if source == "rollout" else 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["generate", "static"])
def test_rollout_capture_equals_the_extra_forward(backend, tiny_model, tokenizer, tmp_path):
    # Left-padded prefill vectors (several prompt lengths per batch) = the extra forward's vectors, with plain
    # `generate` and with the static-cache backend (whose prefill mask spans the whole cache). The capture is the
    # `hidden_states` signal's, entered by AgentGRPOTrainer around the rollout's generation calls.
    for pooling in ("last_token", "mean"):
        config = make_config(tmp_path, pooling=pooling, generation_backend=backend)
        trainer = BiPACETrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
        signal = trainer.model_signal("hidden_states")
        signal.reset()
        trainer.signal_phase.capturing = True
        batch = trainer._engine().run(TASKS[:2], num_generations=4)
        trainer.signal_phase.capturing = False
        trainer.compute_signals(batch.groups)
        matrices = trainer.step_hidden_states(batch.groups)
        assert signal.stats["rollout_fraction"] == 1.0 and [tuple(m.shape) for m in matrices] == [(8, 32), (8, 32)]
        prompts = [tuple(s.prompt_ids) for g in batch.groups for t in g.trajectories for s in t.steps]
        assert len({len(p) for p in prompts}) > 1  # prompts of several lengths (history windows)
        forward = torch.stack(signal.forward(prompts, trainer.signal_context))
        assert torch.allclose(torch.cat(matrices), forward, atol=1e-5)


@pytest.mark.slow
def test_external_generator_falls_back_to_the_extra_forward(tiny_model, tokenizer, scripted, tmp_path):
    # A generator that is not the trainer's (e.g. a vLLM server) runs no local prefill: the extra forward serves.
    generator = scripted(lambda prompt, call, row, size: "a" if row % 2 else "b")
    trainer = BiPACETrainer(model=tiny_model, args=make_config(tmp_path, max_steps=1), train_dataset=TASKS,
                            processing_class=tokenizer, generator=generator)
    trainer.train()
    log = next(h for h in trainer.state.log_history if "bipace/rollout_hidden_state_fraction" in h)
    assert log["bipace/rollout_hidden_state_fraction"] == 0.0
    # Within a state, "a" earns 1 and "b" 0: every cluster with both actions is mixed.
    assert log["bipace/mixed_action_cluster_fraction"] > 0


@pytest.mark.slow
def test_start_up_error_for_a_layer_the_model_lacks(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"hidden_layer=-12 is out of range for a model with 1 decoder layers"):
        BiPACETrainer(model=tiny_model, args=make_config(tmp_path, hidden_layer=-12), train_dataset=TASKS,
                      processing_class=tokenizer)


def test_the_prefill_recorder_keeps_prompts_generate_passes_without_a_mask(tiny_model):
    """Prompts of one length have no padding, and transformers' generate (>= 5.18) then calls the backbone without an
    attention mask: the prefill still counts (all ones), and a one-token decode step still does not."""
    from trl_agents.signals.model import PrefillRecorder

    recorder = PrefillRecorder(layer_index=-1, pooling="last_token")
    prompts = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with recorder.recording(tiny_model), torch.no_grad():
        tiny_model(input_ids=prompts)  # the prefill, no mask
        tiny_model(input_ids=torch.tensor([[11], [12]]))  # a decode-like one-token call, no mask
    vectors = recorder.take()
    assert set(vectors) == {(5, 6, 7), (8, 9, 10)}
    with recorder.recording(tiny_model), torch.no_grad():
        tiny_model(input_ids=prompts, attention_mask=torch.ones_like(prompts))  # the same prefill, mask given
    assert all(torch.equal(vectors[key], vector) for key, vector in recorder.take().items())
