"""Gated-BEPO (docs/methods/bepo.md): hand-computed graphs (the GiGPO toy, a cyclic one), properties, config, trainer.

Expected values are written out with their arithmetic in comments (the toy also in docs/methods/bepo.md,
"Hand-computed case"); they are not recomputed with the code under test.
"""

from __future__ import annotations

import doctest
import math
import random
from itertools import chain

import numpy as np
import pytest
from helpers import all_finite, assert_close, group_credit, group_credit_and_stats, group_of, two_scripted_frozenlake_steps
from helpers import observation_episode as episode

from trl_agents.credit import bepo as credit_bepo
from trl_agents.credit import get_estimator, stat_means
from trl_agents.credit.bepo import BEPOParams, bellman_credit, bepo_advantages
from trl_agents.trainers import bepo as trainer_bepo
from trl_agents.trainers.bepo import BEPOConfig, BEPOTrainer
from trl_agents.trajectory import Group, Step, Trajectory

TOL = 1e-4


# ---------------------------------------------------------------- the toy graph (docs/methods/bepo.md)

# A: s0 -a-> s1 -b-> success (R=1)    B: s0 -a-> s1 -c-> fail (R=0)
# C: s0 -d-> s2 -e-> fail (R=0)       D: copy of A
# Counts: s0: a->s1 x3, d->s2 x1;  s1: b->z+ x2, c->z- x1;  s2: e->z- x1.
def toy_group() -> Group:
    return group_of(
        episode(("s0", 0, True, "a"), ("s1", 1, True, "b"), success=True),
        episode(("s0", 0, True, "a"), ("s1", 0, True, "c")),
        episode(("s0", 0, True, "d"), ("s2", 0, True, "e")),
        episode(("s0", 0, True, "a"), ("s1", 1, True, "b"), success=True),
    )


def test_toy_values_td_and_gate():
    credit = bellman_credit(toy_group(), gamma=1.0, lam=0.0)
    # β = 1: V(s1) = 2/3·1 + 1/3·0 = 2/3;  V(s2) = 0;  V(s0) = 3/4·V(s1) + 1/4·V(s2) = 0.5
    assert credit.values == pytest.approx({"s0": 0.5, "s1": 2 / 3, "s2": 0.0})
    # λ = 0: A^B = δ = Q − V:  (s0,a) = 2/3 − 1/2 = +1/6,  (s0,d) = 0 − 1/2 = −1/2,
    #                          (s1,b) = 1 − 2/3 = +1/3,    (s1,c) = 0 − 2/3 = −2/3,  (s2,e) = 0
    expected_delta = [[1 / 6, 1 / 3], [1 / 6, -2 / 3], [-1 / 2, 0.0], [1 / 6, 1 / 3]]
    assert_close(credit.td_errors, expected_delta, tol=1e-12)
    assert_close(credit.advantages, expected_delta, tol=1e-12)
    # Gate: s0 (successors s1, s2) open, s1 (z+, z-) open, s2 (z- only) closed.
    assert credit.successors == {"s0": 2, "s1": 2, "s2": 1}
    assert credit.gated == [[True, True], [True, True], [True, False], [True, True]]
    assert credit.visits == {"s0": 4, "s1": 3, "s2": 1}
    assert credit.actions is None  # read only by the actions gate
    assert bellman_credit(toy_group(), gate="actions").actions == {"s0": 2, "s1": 2, "s2": 1}


def test_toy_gae_lambda_one():
    credit = bellman_credit(toy_group(), gamma=1.0, lam=1.0)
    # λ = 1: A^B_t = δ_t + δ_{t+1}.  A: [1/6 + 1/3, 1/3] = [0.5, 0.3333];  B: [1/6 − 2/3, −2/3] = [−0.5, −0.6667]
    #        C: [−1/2 + 0, 0] = [−0.5, 0]  (= return − V(s_t): A: 1 − 0.5, 1 − 2/3; B: 0 − 0.5, 0 − 2/3)
    assert_close(credit.advantages, [[0.5, 0.3333], [-0.5, -0.6667], [-0.5, 0.0], [0.5, 0.3333]])


def test_toy_fused_advantages():
    advantages, stats = group_credit_and_stats("bepo", toy_group(), gamma=1.0, gae_lambda=1.0, bellman_std_floor=0.0)  # the bare σ_B
    # A^GRPO: R = [1, 0, 0, 1], mean 0.5, Bessel std 0.57735 -> ±0.5/(0.57735 + 1e-4) = ±0.86588
    # Gated A^B (all rows but C1): [0.5, 1/3, −0.5, −2/3, −0.5, 0.5, 1/3]: mean 0,
    #   Bessel var (4·0.25 + 2·1/9 + 4/9)/6 = 5/18 -> σ_B = 0.527046
    # w = min(1, N/4): s0 (4 visits) 1, s1 (3 visits) 0.75
    #   A0: 0.86588 + 1·0.5/0.527047 = 0.86588 + 0.94868 = 1.81456
    #   A1: 0.86588 + 0.75·(1/3)/0.527047 = 0.86588 + 0.47434 = 1.34022
    #   B0: −0.86588 − 0.94868 = −1.81456;  B1: −0.86588 + 0.75·(−2/3)/0.527047 = −0.86588 − 0.94868 = −1.81456
    #   C0: −1.81456;  C1: gate closed -> pure A^GRPO −0.86588
    assert_close(advantages, [[1.8146, 1.3402], [-1.8146, -1.8146], [-1.8146, -0.8659], [1.8146, 1.3402]])
    assert stats["num_states"] == 3
    assert stats["gated_row_fraction"] == pytest.approx(7 / 8)
    assert stats["bellman_std"] == pytest.approx(math.sqrt(5 / 18))


def test_toy_fixed_mixing_and_no_norm():
    # mixing "fixed" (w = 1) and no normalisation: A = A^GRPO + A^B on gated rows.
    #   A: [0.86588 + 0.5, 0.86588 + 0.3333];  B: [−0.86588 − 0.5, −0.86588 − 0.6667];  C: [−0.86588 − 0.5, −0.86588]
    advantages = group_credit("bepo", toy_group(), gamma=1.0, gae_lambda=1.0, bepo_mixing="fixed", bellman_norm="none")
    assert_close(advantages, [[1.3659, 1.1992], [-1.3659, -1.5325], [-1.3659, -0.8659], [1.3659, 1.1992]])


# ---------------------------------------------------------------- a cyclic graph (states revisited)

# A: s0 -> s1 -> s0 -> s1 -> success (rewards 0, 0, 0, 1)     B: s0 -> s1 -> fail (rewards 0, 0)
# Edges: s0 -> s1 x3 (A0, A2, B0);  s1 -> s0 (A1), s1 -> z+ with r = 1 (A3), s1 -> z- (B1).
def cyclic_group() -> Group:
    return group_of(episode(("s0", 0), ("s1", 0), ("s0", 0), ("s1", 1), success=True), episode(("s0", 0), ("s1", 0)))


def test_cyclic_values_beta_one():
    credit = bellman_credit(cyclic_group(), gamma=1.0, lam=1.0)
    # V(s0) = V(s1);  V(s1) = 1/3·V(s0) + 1/3·1 + 1/3·0  ->  2/3·V(s1) = 1/3  ->  V(s1) = V(s0) = 1/2
    # (well posed at β = 1: every node reaches an exit)
    assert credit.values == pytest.approx({"s0": 0.5, "s1": 0.5})
    # δ: A = [0 + 1/2 − 1/2, 0 + 1/2 − 1/2, 0, 1 + 0 − 1/2] = [0, 0, 0, 0.5];  B = [0, 0 − 1/2] = [0, −0.5]
    assert_close(credit.td_errors, [[0, 0, 0, 0.5], [0, -0.5]], tol=1e-12)
    # λ = 1: suffix sums.  A: [0.5, 0.5, 0.5, 0.5];  B: [−0.5, −0.5]
    assert_close(credit.advantages, [[0.5, 0.5, 0.5, 0.5], [-0.5, -0.5]], tol=1e-12)
    # s0 has one successor (s1): closed; s1 has three (s0, z+, z-): open.
    assert credit.successors == {"s0": 1, "s1": 3}
    assert credit.gated == [[False, True, False, True], [False, True]]


def test_cyclic_values_beta_half():
    credit = bellman_credit(cyclic_group(), gamma=0.5, lam=0.5)
    # V(s0) = 0.5·V(s1);  V(s1) = 1/3·(0.5·V(s0)) + 1/3·1 = V(s1)/12 + 1/3  ->  V(s1) = 4/11, V(s0) = 2/11
    assert credit.values == pytest.approx({"s0": 2 / 11, "s1": 4 / 11})
    # δ: A0 = 0.5·4/11 − 2/11 = 0;  A1 = 0.5·2/11 − 4/11 = −3/11;  A2 = 0;  A3 = 1 − 4/11 = 7/11
    #    B0 = 0;  B1 = 0 − 4/11 = −4/11        (the δ at s1 sum to 0: the fixed point is the mean backup)
    assert_close(credit.td_errors, [[0, -3 / 11, 0, 7 / 11], [0, -4 / 11]], tol=1e-12)
    # GAE with βλ = 0.25:  A3 = 7/11;  A2 = 0 + 0.25·7/11 = 7/44;  A1 = −3/11 + 0.25·7/44 = −41/176;
    #                      A0 = 0.25·(−41/176) = −41/704;  B1 = −4/11;  B0 = 0.25·(−4/11) = −1/11
    assert_close(credit.advantages, [[-41 / 704, -41 / 176, 7 / 44, 7 / 11], [-1 / 11, -4 / 11]], tol=1e-12)


def test_cyclic_fused_advantages():
    advantages = group_credit("bepo", cyclic_group(), gamma=1.0, gae_lambda=1.0, bellman_std_floor=0.0)
    # A^GRPO: R = [1, 0] -> ±0.5/(0.707107 + 1e-4) = ±0.707007
    # Gated rows (s1): A1 = 0.5, A3 = 0.5, B1 = −0.5: mean 1/6, Bessel var (2·(1/3)² + (2/3)²)/2 = 1/3, σ_B = 0.57735
    # w(s1) = 3/4:  Â = 0.75·0.5/(0.57735 + 1e-6) = 0.649519
    #   A: [0.707007, 0.707007 + 0.649519, 0.707007, 1.356526];  B: [−0.707007, −1.356526]
    assert_close(advantages, [[0.7070, 1.3565, 0.7070, 1.3565], [-0.7070, -1.3565]])


def test_self_loops_of_invalid_actions_are_cycles():
    # An invalid action leaves the state unchanged (s -> s): a self-loop, solved exactly like any cycle.
    # A: s0 (invalid) -> s0 -> s1 -> success (r = 1 on the last step);  B: s0 -> s2 -> fail
    group = group_of(episode(("s0", 0, False), ("s0", 0), ("s1", 1), success=True), episode(("s0", 0), ("s2", 0)))
    credit = bellman_credit(group, gamma=1.0, lam=1.0)
    # V(s1) = 1, V(s2) = 0;  V(s0) = 1/3·V(s0) + 1/3·V(s1) + 1/3·V(s2)  ->  V(s0) = 1/2
    assert credit.values == pytest.approx({"s0": 0.5, "s1": 1.0, "s2": 0.0})
    assert credit.successors == {"s0": 3, "s1": 1, "s2": 1}
    # The penalty enters A^GRPO only: the GRPO part of row A0 is 0.707007 − 0.1.
    advantages = group_credit("bepo", group, gamma=1.0, gae_lambda=1.0, bellman_std_floor=0.0)
    grpo = group_credit("grpo", group)
    assert grpo[0][0] == pytest.approx(0.707007 - 0.1, abs=TOL)
    # Gated rows (s0): A^B = return − V(s0): A0 = 0.5, A1 = 0.5, B0 = −0.5 -> σ_B = 0.57735, w = 3/4 -> ±0.649519
    assert_close(advantages, [[0.6070 + 0.6495, 0.7070 + 0.6495, 0.7070], [-0.7070 - 0.6495, -0.7070]])


def test_gate_successors_versus_actions():
    # A slippery state: one action "up" from s0 lands in s1 or s2 (2 successors, 1 action).
    group = group_of(
        episode(("s0", 0, True, "up"), ("s1", 1, True, "up"), success=True),
        episode(("s0", 0, True, "up"), ("s2", 0, True, "up")),
    )
    assert bellman_credit(group, gate="successors").gated == [[True, False], [True, False]]
    assert bellman_credit(group, gate="actions").gated == [[False, False], [False, False]]
    assert bellman_credit(group, gate="none").gated == [[True, True], [True, True]]
    # With the actions gate closed everywhere, Gated-BEPO is GRPO.
    assert group_credit("bepo", group, bepo_gate="actions") == group_credit("grpo", group)


def test_rejected_actions_merge_for_the_actions_gate():
    # Two rejected texts at s0: one canonical action '<invalid>' (merged) or two (told apart by their text).
    group = group_of(episode(("s0", 0, False, None), ("s1", 0)), episode(("s0", 0, False, None), ("s1", 1)))
    group.trajectories[1].steps[0].action_text = "something else"
    assert bellman_credit(group, gate="actions").actions["s0"] == 1
    assert bellman_credit(group, gate="actions", merge_invalid_actions=False).actions["s0"] == 2


# ---------------------------------------------------------------- properties


def random_group(rng: random.Random, size: int = 6, states: int = 4) -> Group:
    trajectories = []
    for _ in range(size):
        steps = [("s0", rng.choice([0, 0, 0.5]), rng.random() > 0.2)]
        for _ in range(rng.randint(0, 6)):
            steps.append((f"s{rng.randrange(states)}", rng.choice([0, 0, 1]), rng.random() > 0.2))
        trajectories.append(episode(*steps, success=rng.random() < 0.5))
    return group_of(*trajectories)


@pytest.mark.parametrize("gamma", [0.5, 0.95, 1.0])
@pytest.mark.parametrize("seed", range(5))
def test_values_solve_the_mean_backup(gamma, seed):
    # V(s) = mean over the visits of s of (r + β·V(next)), V(exit) = 0: the mean-backup fixed point, cycles included.
    group = random_group(random.Random(seed))
    credit = bellman_credit(group, gamma=gamma)
    targets: dict[str, list[float]] = {}
    for traj in group.trajectories:
        for t, step in enumerate(traj.steps):
            nxt = credit.values[traj.steps[t + 1].observation] if t + 1 < len(traj.steps) else 0.0
            targets.setdefault(step.observation, []).append(step.reward + gamma * nxt)
    for state, values in targets.items():
        assert credit.values[state] == pytest.approx(sum(values) / len(values), abs=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_gae_limits(seed):
    group = random_group(random.Random(seed))
    gamma = 0.9
    one = bellman_credit(group, gamma=gamma, lam=1.0)
    zero = bellman_credit(group, gamma=gamma, lam=0.0)
    for i, traj in enumerate(group.trajectories):
        rewards = [s.reward for s in traj.steps]
        for t, step in enumerate(traj.steps):
            discounted = sum(gamma**k * r for k, r in enumerate(rewards[t:]))
            # λ = 1: discounted return − V(s_t);  λ = 0: the TD residual itself.
            assert one.advantages[i][t] == pytest.approx(discounted - one.values[step.observation], abs=1e-9)
            assert zero.advantages[i][t] == zero.td_errors[i][t]


def test_action_labels_do_not_change_values():
    # μ(a|s)·P(x|s,a) summed over a is N(s->x)/N(s): relabelling actions changes neither V nor A (successors gate).
    group = random_group(random.Random(7))
    relabelled = random_group(random.Random(7))
    for k, traj in enumerate(relabelled.trajectories):
        for t, step in enumerate(traj.steps):
            step.info = {"action": f"a{(k + t) % 3}"}
    assert bellman_credit(group).values == bellman_credit(relabelled).values
    assert group_credit("bepo", group) == group_credit("bepo", relabelled)


def test_no_repeated_state_reduces_to_grpo():
    # Every state seen once: one successor each, every gate closed -> A^GRPO exactly.
    group = group_of(episode(("a", 0), ("b", 1), success=True), episode(("c", 0), ("d", 0)), episode(("e", 2)))
    assert group_credit("bepo", group) == group_credit("grpo", group)
    assert group_credit_and_stats("bepo", group)[1]["gated_row_fraction"] == 0.0


def test_all_zero_rewards_give_zero():
    # No reward anywhere: V = 0, δ = 0, A^B = 0, A^GRPO = 0 -> every advantage exactly 0, cycles and gates included.
    group = group_of(episode(("s0", 0), ("s1", 0), ("s0", 0)), episode(("s0", 0), ("s2", 0)), episode(("s0", 0)))
    for gate in ("successors", "actions", "none"):
        assert group_credit("bepo", group, bepo_gate=gate) == [[0.0, 0.0, 0.0], [0.0, 0.0], [0.0]]


@pytest.mark.parametrize("reward", [1.0, 0.1, 10.0])
def test_all_equal_rewards_give_zero(reward):
    # Same rewards at the same steps (test_credit.py's group): every Bellman residual and A^GRPO are 0 (up to the
    # rounding of the linear solve, divided by σ_B + ε).
    group = group_of(*(episode(("s0", 0), (f"s{i % 2 + 1}", reward), ("s3", 0)) for i in range(4)))
    advantages = group_credit("bepo", group)
    assert_close(advantages, [[0.0, 0.0, 0.0]] * 4, tol=1e-9)


OPTIONS = [
    {},
    {"bepo_gate": "actions"},
    {"bepo_gate": "none", "bepo_mixing": "fixed"},
    {"bellman_norm": "none", "gae_lambda": 0.0},
    {"scale_rewards": "none", "credit_statistic": "step_rows"},
    {"anchor": "observation", "gamma": 1.0, "gae_lambda": 1.0},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_permuting_trajectories_permutes_advantages(options):
    trajectories = random_group(random.Random(3)).trajectories
    order = [3, 0, 5, 1, 4, 2]
    advantages = group_credit("bepo", group_of(*trajectories), **options)
    permuted = group_credit("bepo", group_of(*(trajectories[i] for i in order)), **options)
    assert_close(permuted, [advantages[i] for i in order], tol=1e-9)


@pytest.mark.parametrize("options", OPTIONS)
def test_degenerate_groups(options):
    assert group_credit("bepo", group_of(), **options) == []
    assert group_credit_and_stats("bepo", group_of(), **options)[1] == {
        "num_states": 0, "gated_row_fraction": 0.0, "bellman_std": 0.0
    }
    assert group_credit("bepo", group_of(Trajectory(task={})), **options) == [[]]
    mixed = group_credit("bepo", group_of(Trajectory(task={}), episode(("s0", 0), ("s1", 1))), **options)
    assert [len(row) for row in mixed] == [0, 2] and all_finite(mixed)
    # Singleton group: nothing to compare with -> A^GRPO = 0; a lone state has one successor (gate closed), and with
    # the gate forced open its Bellman residuals are 0 (up to the rounding of the solve).
    assert_close(group_credit("bepo", group_of(episode(("s0", 0), ("s1", 3))), **options), [[0.0, 0.0]], tol=1e-9)
    # Length-1 trajectories from one shared state: s0 -> z+ / z- is a gated state.
    ones = group_of(episode(("s0", 1), success=True), episode(("s0", 0)), episode(("s0", 0)))
    ones = group_credit("bepo", ones, **options)
    assert all_finite(ones) and ones[0][0] > 0 > ones[1][0]
    # All actions invalid (self-loops everywhere, no reward): only the penalty remains, finite.
    invalid = group_of(*(episode(("s0", 0, False), ("s0", 0, False), ("s0", 0, False)) for _ in range(3)))
    advantages = group_credit("bepo", invalid, **options)
    assert all_finite(advantages)
    expected = -0.1 if options.get("credit_statistic") != "step_rows" else 0.0  # step rows: penalty inside μ
    assert_close(advantages, [[expected] * 3] * 3, tol=1e-9)
    # A long random group with cycles stays finite.
    assert all_finite(group_credit("bepo", random_group(random.Random(11), size=16, states=3), **options))


def test_similarity_clustering_merges_nodes():
    # "room 1." and "room 1!" cluster into one node at threshold 0.8.
    group = group_of(
        episode(("room 1.", 0), ("goal reached", 1), success=True), episode(("room 1!", 0), ("fell in a hole", 0))
    )
    assert len(bellman_credit(group).values) == 4
    clustered = bellman_credit(group, similarity_threshold=0.8)
    assert len(clustered.values) == 3 and clustered.gated[0][0]


def test_bad_arguments_are_rejected():
    group = toy_group()
    for kwargs, name in [
        ({"gamma": 0.0}, "gamma"), ({"gamma": 1.5}, "gamma"), ({"gae_lambda": -0.1}, "lam"),
        ({"gae_lambda": 2.0}, "lam"), ({"bepo_gate": "states"}, "gate"), ({"bepo_mixing": "adaptive"}, "mixing"),
        ({"mixing_n0": 0.0}, "n0"), ({"bellman_norm": "batch"}, "bellman_norm"), ({"anchor": "history"}, "anchor"),
        ({"similarity_threshold": 1.0}, "similarity_threshold"), ({"eps": 0.0}, "eps"),
        ({"scale_rewards": "batch"}, "scale"),
    ]:
        with pytest.raises(ValueError, match=name):
            group_credit("bepo", group, **kwargs)
    with pytest.raises(ValueError, match="non-finite"):
        group_credit("bepo", group_of(episode(("s", float("nan")))))
    with pytest.raises(ValueError, match="finite step rewards"):
        bellman_credit(group_of(episode(("s", 0), ("t", float("inf")))))


def test_registry_and_docstrings():
    assert get_estimator("bepo").function is bepo_advantages
    for module in (credit_bepo, trainer_bepo):
        assert doctest.testmod(module).failed == 0


# ---------------------------------------------------------------- config and trainer


def test_config_validation(tmp_path):
    base = {"output_dir": str(tmp_path), "report_to": "none", "num_generations": 2, "per_device_train_batch_size": 2}
    config = BEPOConfig(**base)
    assert (config.gamma, config.gae_lambda, config.bepo_gate, config.mixing_n0) == (0.95, 0.95, "successors", 4.0)
    for field_name, value in [
        ("gamma", 0.0), ("gamma", 1.01), ("gae_lambda", 1.5), ("bepo_gate", "always"), ("bepo_mixing", "adaptive"),
        ("mixing_n0", 0.0), ("bellman_norm", "batch"), ("anchor", "history"), ("similarity_threshold", 1.0),
        ("gamma", "high"),
    ]:
        with pytest.raises(ValueError, match=field_name):
            BEPOConfig(**base, **{field_name: value})
    for name in ("gamma", "gae_lambda", "bepo_gate", "bepo_mixing", "mixing_n0", "bellman_norm"):
        help_text = BEPOConfig.__dataclass_fields__[name].metadata["help"]
        assert "docs/methods/bepo.md" in help_text
    for name in ("gae_lambda", "bepo_gate", "bepo_mixing", "mixing_n0", "bellman_norm", "merge_invalid_actions"):
        assert "our choice" in BEPOConfig.__dataclass_fields__[name].metadata["help"].lower()


@pytest.mark.slow
def test_two_training_steps_on_frozenlake(tiny_model, tokenizer, scripted, tmp_path):
    # The scripted episodes of helpers.FROZENLAKE_PLANS (two successes, a detour, a run that starts invalid).
    trainer, logs = two_scripted_frozenlake_steps(BEPOTrainer, BEPOConfig, tiny_model, tokenizer, scripted, tmp_path / "out",
                                                  "bepo/gated_row_fraction")
    for log in logs:
        # Nodes (0,0) (1,0) (0,1) (1,1) (2,1) (1,2). Gated: (0,0) -> {(1,0), (0,1), (0,0)}: 5 rows;
        # (1,1) -> {(2,1), (1,2), z-}: 4 rows; (1,2) -> {z+, z-}: 2 rows. 11 of 16 rows.
        assert log["bepo/num_states"] == 6.0
        assert log["bepo/gated_row_fraction"] == pytest.approx(11 / 16)
        assert log["bepo/bellman_std"] > 0
    batch = trainer.last_rollout.groups[0]
    assert [t.success for t in batch.trajectories] == [True, True, False, False]


def blow_up_group(copies: int = 1) -> Group:
    # s0 (r=2) → s1 (−1) → s0 (1) → s1 (0), success; λ_inv = 0. s0 → s1 twice: one successor, gate closed; s1 → s0
    # then s1 → z⁺: two successors, so the two visits of s1 are the gated rows, with A^B = −0.3794 and −0.3872.
    def episode():
        rewards = [("s0", 2.0), ("s1", -1.0), ("s0", 1.0), ("s1", 0.0)]
        steps = [Step(state, "a", reward=r, state_key=state) for state, r in rewards]
        steps[-1].done = True
        return Trajectory({}, steps, success=True)

    return Group({}, [episode() for _ in range(copies)])


def test_a_tiny_bellman_std_does_not_blow_the_advantage_up():
    group = blow_up_group()
    credit = bellman_credit(group)
    assert credit.gated == [[False, True, False, True]]
    assert_close(credit.advantages, [[0.1576, -0.3794, -0.8495, -0.3872]])
    # The bare std over the two gated rows: σ_B = |−0.3794 − (−0.3872)|/√2 = 0.0055, and with w = min(1, 2/4) = 0.5
    # the Bellman term is 0.5 · (−0.3794)/0.0055 = −34.28 (A^GRPO = 0 for a group of one): the reported blow-up.
    raw, stats = group_credit_and_stats("bepo", group, invalid_action_penalty=0.0, bellman_std_floor=0.0)
    assert stats["bellman_std"] == pytest.approx(0.005533, abs=1e-5)
    assert_close(raw, [[0.0, -34.2799, 0.0, -34.9869]])
    # The default floor σ_min = 1 > σ_B: the term is 0.5 · (−0.3794)/(1 + 1e-6) = −0.1897: never amplified.
    floored = group_credit("bepo", group, invalid_action_penalty=0.0)
    assert_close(floored, [[0.0, -0.1897, 0.0, -0.1936]])
    # The trainer's default, the batch std (here over this group and a second one with spread-out credit):
    # σ_B of the four gated rows is above the floor, so the batch's spread sets the scale.
    spread = Group({}, [Trajectory({}, [Step("t0", "a", reward=5.0, state_key="t0"),
                                        Step("t1", "a", reward=0.0, state_key="t1", done=True)], success=True),
                        Trajectory({}, [Step("t0", "b", reward=-5.0, state_key="t0"),
                                        Step("t2", "a", reward=0.0, state_key="t2", done=True)], success=False)])
    batch, batch_stats = bepo_advantages([group, spread], BEPOParams(bellman_norm="batch_std", invalid_action_penalty=0.0))
    values = [v for part in (group, spread) for v, g in zip(chain.from_iterable(bellman_credit(part).advantages),
                                                              chain.from_iterable(bellman_credit(part).gated))
              if g]
    sigma = float(np.std(values, ddof=1))
    assert sigma > 1 and stat_means(batch_stats)["bellman_std"] == pytest.approx(sigma)
    assert_close(batch[0], [[0.0, 0.5 * -0.3794 / sigma, 0.0, 0.5 * -0.3872 / sigma]])
    for advantages in (floored, *batch):
        assert all_finite(advantages) and max(abs(v) for row in advantages for v in row) < 5
