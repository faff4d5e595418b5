"""ECPO (docs/methods/ecpo.md): the anchor case of its docs page and a two-step group by hand, properties, config,
trainer.

Expected values are written out with their arithmetic in comments (and in docs/methods/ecpo.md, "Hand-computed
case"); they are not recomputed with the code under test.
"""

from __future__ import annotations

import doctest
import math
import random

import pytest
from helpers import all_finite, assert_close, group_credit, group_credit_and_stats, group_of, two_scripted_frozenlake_steps
from helpers import observation_episode as episode

from trl_agents.credit import ecpo as credit_ecpo
from trl_agents.credit import get_estimator
from trl_agents.credit.base import INVALID_ACTION, canonical_action
from trl_agents.credit.ecpo import (
    anchor_evidence,
    ecpo_advantages,
)
from trl_agents.trainers import ecpo as trainer_ecpo
from trl_agents.trainers.ecpo import ECPOConfig, ECPOTrainer
from trl_agents.trajectory import Group, Step, Trajectory

TOL = 1e-4


# ---------------------------------------------------------------- the anchor case (docs/methods/ecpo.md)


def test_spec_anchor_evidence():
    # Anchor s: u1 once with return 1 ("lucky"), u2 three times with [0, 0, 1]; κ = 2, τ = 4.
    evidence = anchor_evidence({"u1": [1.0], "u2": [0.0, 0.0, 1.0]}, kappa=2.0, tau=4.0, scale=False)
    # μ_s = 2/4 = 0.5;  μ̃(u1) = (1·1 + 2·0.5)/3 = 0.6667;  μ̃(u2) = (3·1/3 + 2·0.5)/5 = 0.4
    assert evidence.count == 4 and evidence.mean == 0.5
    assert evidence.shrunk_means == pytest.approx({"u1": 2 / 3, "u2": 0.4})
    # A_act (F = 1): 0.6667 − 0.5 = +0.1667;  0.4 − 0.5 = −0.1   (GiGPO would give the lucky u1 +0.5)
    assert evidence.action_advantages == pytest.approx({"u1": 1 / 6, "u2": -0.1})
    # B = 1/4·(1 − 0.5)² + 3/4·(1/3 − 0.5)² = 1/16 + 1/48 = 0.0833;  W = 1/4·0 + 3/4·(2/9) = 0.1667;  B + W = 0.25
    assert evidence.between == pytest.approx(1 / 12) and evidence.within == pytest.approx(1 / 6)
    # ρ = tanh(4/4)·(1/12)/(1/4 + 1e-6) = 0.761594·0.333332 = 0.2539
    assert evidence.gate == pytest.approx(0.2539, abs=TOL)


def lucky_group() -> Group:
    """The anchor case as a group: four one-step episodes from s (u1 → 1; u2 → 0, 0, 1)."""
    return group_of(
        episode(("s", 1, True, "u1"), success=True), episode(("s", 0, True, "u2")), episode(("s", 0, True, "u2")),
        episode(("s", 1, True, "u2"), success=True),
    )


def test_spec_group_mean_norm():
    advantages, stats = group_credit_and_stats("ecpo", lucky_group())
    # A^GRPO: R = [1, 0, 0, 1] -> ±0.5/(0.57735 + 1e-4) = ±0.865875.  τ = G = 4 -> ρ = 0.253864.
    #   u1 (R=1): 0.865875 + 0.253864·0.166667 = 0.908186
    #   u2 (R=0): −0.865875 + 0.253864·(−0.1) = −0.891262;   u2 (R=1): 0.865875 − 0.025386 = 0.840489
    assert_close(advantages, [[0.9082], [-0.8913], [-0.8913], [0.8405]])
    assert stats == pytest.approx({
        "num_anchor_groups": 1, "mean_anchor_group_size": 4.0, "singleton_fraction": 0.0,
        "mean_actions_per_anchor": 2.0, "mean_gate": 0.253864,
    }, abs=1e-5)
    # τ = 4 given explicitly is the default (G = 4); τ = 8: ρ = tanh(0.5)·1/3 = 0.154038.
    assert group_credit("ecpo", lucky_group(), variance_gate_tau=4.0) == advantages
    assert_close(group_credit("ecpo", lucky_group(), variance_gate_tau=8.0), [[0.865875 + 0.154038 / 6], [-0.865875 - 0.0154038],
                                                           [-0.865875 - 0.0154038], [0.865875 - 0.0154038]])


def test_spec_group_mean_std_norm():
    # F = σ_s + ε: Bessel std of [1, 0, 0, 1] = 0.57735 -> A_act(u1) = 0.166667/0.577351 = 0.288675,
    #   A_act(u2) = −0.1/0.577351 = −0.173205;  ρ·A_act = +0.073284 / −0.043970
    assert_close(group_credit("ecpo", lucky_group(), ecpo_mode="mean_std_norm"), [[0.9392], [-0.9098], [-0.9098], [0.8219]])


def test_kappa_zero_and_omega():
    # κ = 0: no shrinkage, A_act = Ḡ − μ: u1 +0.5, u2 −1/6;  ρ unchanged (0.253864).
    #   u1: 0.865875 + 0.126932 = 0.992807;  u2: ∓0.865875 − 0.042311
    assert_close(group_credit("ecpo", lucky_group(), shrinkage_kappa=0.0), [[0.9928], [-0.9082], [-0.9082], [0.8236]])
    # ω = 0: pure GRPO.
    assert group_credit("ecpo", lucky_group(), step_advantage_w=0.0) == group_credit("grpo", lucky_group())


# A: s0 -a-> s1 -b-> success (R=1)    B: s0 -a-> s1 -c-> fail (R=0)
# C: s0 -d-> s2 -e-> fail (R=0)       D: copy of A          (the GiGPO toy of docs/methods/gigpo.md, with actions)
def toy_group() -> Group:
    return group_of(
        episode(("s0", 0, True, "a"), ("s1", 1, True, "b"), success=True),
        episode(("s0", 0, True, "a"), ("s1", 0, True, "c")),
        episode(("s0", 0, True, "d"), ("s2", 0, True, "e")),
        episode(("s0", 0, True, "a"), ("s1", 1, True, "b"), success=True),
    )


def test_two_step_group():
    advantages = group_credit("ecpo", toy_group(), gamma=0.5)
    # Step returns (γ = 0.5): A, D: [0.5, 1];  B, C: [0, 0].  A^GRPO = ±0.865875.  τ = G = 4.
    # s0 (n = 4, μ = 0.25): a: [0.5, 0, 0.5] (Ḡ = 1/3), d: [0].
    #   A_act(a) = 3·(1/3 − 1/4)/(3 + 2) = 0.05;  A_act(d) = 1·(0 − 1/4)/(1 + 2) = −0.083333
    #   B = 3/4·(1/12)² + 1/4·(1/4)² = 1/48;  W = 3/4·(1/18) = 1/24 (B + W = 1/16, the variance of the returns)
    #   ρ = tanh(1)·(1/48)/(1/16 + 1e-6) = 0.253861
    # s1 (n = 3, μ = 2/3): b: [1, 1], c: [0].  A_act(b) = 2·(1/3)/4 = 1/6;  A_act(c) = 1·(−2/3)/3 = −2/9
    #   B = 2/3·(1/3)² + 1/3·(2/3)² = 2/9;  W = 0  ->  ρ = tanh(3/4)·(2/9)/(2/9 + 1e-6) = 0.635146
    # s2: visited once -> 0.
    #   A: [0.865875 + 0.253861·0.05, 0.865875 + 0.635146/6] = [0.878568, 0.971733]
    #   B: [−0.865875 + 0.012693, −0.865875 − 0.635146·2/9] = [−0.853182, −1.007019]
    #   C: [−0.865875 − 0.253861/12, −0.865875] = [−0.887030, −0.865875]
    assert_close(advantages, [[0.8786, 0.9717], [-0.8532, -1.0070], [-0.8870, -0.8659], [0.8786, 0.9717]])


def test_invalid_penalty_enters_grpo_and_the_step_return():
    # Two one-step episodes from s, both rejected (one canonical action '<invalid>'), R = [1, 0]:
    # ρ = R − 0.1 = [0.9, −0.1], one action -> Ḡ = μ -> A_act = 0, B = 0 -> only A^GRPO: ±0.707007 − 0.1.
    group = group_of(episode(("s", 1, False), success=True), episode(("s", 0, False)))
    assert_close(group_credit("ecpo", group), [[0.7070 - 0.1], [-0.7070 - 0.1]])
    # Told apart by their text (merge off): two actions of one visit each.  ρ = [0.9, −0.1], μ = 0.4,
    #   A_act = 1·(±0.5)/3 = ±0.166667;  B = 0.25, W = 0  ->  ρ_VG = tanh(2/2)·0.25/(0.25 + 1e-6) = 0.761591
    group.trajectories[1].steps[0].action_text = "other"
    assert_close(group_credit("ecpo", group, merge_invalid_actions=False),
                 [[0.7070 - 0.1 + 0.126932], [-0.7070 - 0.1 - 0.126932]])


# ---------------------------------------------------------------- canonical actions


def test_canonical_action():
    assert canonical_action(Step("s", "<action>UP</action>", info={"action": "up"})) == "up"
    assert canonical_action(Step("s", "x", info={"command": "go to desk 1"})) == "go to desk 1"  # ALFWorld
    assert canonical_action(Step("s", "x", info={"action": None, "command": "open drawer 2"})) == "open drawer 2"
    assert canonical_action(Step("s", "  Take  The Mug\n")) == "take the mug"
    assert canonical_action(Step("s", "x", info={"action": ["a", 1]})) == '["a", 1]'  # hashable
    assert canonical_action(Step("s", "nonsense", valid=False), merge_invalid=True) == INVALID_ACTION
    assert canonical_action(Step("s", "Non  sense", valid=False), merge_invalid=False) == "non sense"
    # The parsed action wins over the text: two phrasings of "up" are one action.
    group = group_of(episode(("s", 1, True, "up"), success=True), episode(("s", 0, True, "up")))
    group.trajectories[0].steps[0].action_text = "I move up"
    assert group_credit_and_stats("ecpo", group)[1]["mean_actions_per_anchor"] == 1.0


# ---------------------------------------------------------------- properties


def random_group(rng: random.Random, size: int = 6, states: int = 3) -> Group:
    trajectories = []
    for _ in range(size):
        steps = [(f"s{rng.randrange(states)}", rng.choice([0, 0, 1]), rng.random() > 0.2, rng.choice("abc"))
                 for _ in range(rng.randint(1, 5))]
        trajectories.append(episode(*steps, success=rng.random() < 0.5))
    return group_of(*trajectories)


@pytest.mark.parametrize("seed", range(5))
def test_evidence_decomposes_the_variance(seed):
    rng = random.Random(seed)
    returns = {u: [rng.choice([0.0, 0.5, 1.0]) for _ in range(rng.randint(1, 4))] for u in "abc"}
    evidence = anchor_evidence(returns, kappa=2.0, tau=3.0, scale=False)
    pooled = [v for values in returns.values() for v in values]
    mean = sum(pooled) / len(pooled)
    variance = sum((v - mean) ** 2 for v in pooled) / len(pooled)
    # B + W = the population variance of the anchor's returns; 0 <= ρ <= tanh(n/τ); Σ_u n_u·A_act = 0 (κ-weighted
    # shrinkage keeps the sign of Ḡ − μ and shrinks its size).
    assert evidence.between + evidence.within == pytest.approx(variance, abs=1e-12)
    assert 0.0 <= evidence.gate <= math.tanh(len(pooled) / 3.0) + 1e-12
    for u, values in returns.items():
        raw = sum(values) / len(values) - mean
        assert abs(evidence.action_advantages[u]) <= abs(raw) + 1e-12
        assert evidence.action_advantages[u] * raw >= 0


def test_singleton_anchors_reduce_to_grpo():
    group = group_of(episode(("a", 0), ("b", 1), success=True), episode(("c", 0), ("d", 0)), episode(("e", 2)))
    assert group_credit("ecpo", group) == group_credit("grpo", group)
    assert group_credit_and_stats("ecpo", group)[1]["singleton_fraction"] == 1.0


@pytest.mark.parametrize("reward", [0.0, 1.0, 0.1, 10.0])
def test_all_equal_rewards_give_zero(reward):
    # Same rewards at the same steps (test_credit.py's group): equal returns at every anchor -> B = 0, A_act = 0.
    group = group_of(*(episode(("s0", 0, True, "ab"[i % 2]), (f"s{i % 2 + 1}", reward), ("s3", 0)) for i in range(4)))
    for mode in ("mean_norm", "mean_std_norm"):
        assert group_credit("ecpo", group, ecpo_mode=mode) == [[0.0, 0.0, 0.0]] * 4


OPTIONS = [
    {},
    {"ecpo_mode": "mean_std_norm"},
    {"shrinkage_kappa": 0.0, "variance_gate_tau": 1.0},
    {"scale_rewards": "none", "credit_statistic": "step_rows"},
    {"merge_invalid_actions": False, "gamma": 1.0},
    {"anchor": "observation", "step_advantage_w": 2.0},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_permuting_trajectories_permutes_advantages(options):
    trajectories = random_group(random.Random(3)).trajectories
    order = [3, 0, 5, 1, 4, 2]
    advantages = group_credit("ecpo", group_of(*trajectories), **options)
    permuted = group_credit("ecpo", group_of(*(trajectories[i] for i in order)), **options)
    assert_close(permuted, [advantages[i] for i in order], tol=1e-12)


@pytest.mark.parametrize("options", OPTIONS)
def test_degenerate_groups(options):
    assert group_credit("ecpo", group_of(), **options) == []
    assert group_credit_and_stats("ecpo", group_of(), **options)[1] == {
        "num_anchor_groups": 0, "mean_anchor_group_size": 0.0, "singleton_fraction": 0.0,
        "mean_actions_per_anchor": 0.0, "mean_gate": 0.0,
    }
    assert group_credit("ecpo", group_of(Trajectory(task={})), **options) == [[]]
    mixed = group_credit("ecpo", group_of(Trajectory(task={}), episode(("s0", 0), ("s1", 1))), **options)
    assert [len(row) for row in mixed] == [0, 2] and all_finite(mixed)
    # Singleton group: A^GRPO = 0 and every anchor visited once (or with equal returns) -> 0.
    assert group_credit("ecpo", group_of(episode(("s0", 0), ("s1", 3))), **options) == [[0.0, 0.0]]
    # Length-1 trajectories from one state with two actions.
    ones = group_credit("ecpo", group_of(
            episode(("s0", 1, True, "a"), success=True), episode(("s0", 0, True, "b")), episode(("s0", 0, True, "b"))
        ), **options)
    assert all_finite(ones) and ones[0][0] > 0 > ones[1][0]
    # All actions invalid, no reward: every return is −0.1 at the one anchor -> only the penalty of A^GRPO remains.
    invalid = group_of(*(episode(("s0", 0, False), ("s0", 0, False)) for _ in range(3)))
    expected = -0.1 if options.get("credit_statistic") != "step_rows" else 0.0  # step rows: penalty inside μ
    advantages = group_credit("ecpo", invalid, **options)
    assert all_finite(advantages)
    assert_close(advantages, [[expected] * 2] * 3, tol=1e-12)
    assert all_finite(group_credit("ecpo", random_group(random.Random(11), size=16), **options))


def test_similarity_clustering_groups_anchors():
    group = group_of(episode(("room 1.", 1, True, "a"), success=True), episode(("room 1!", 0, True, "b")))
    assert group_credit_and_stats("ecpo", group)[1]["num_anchor_groups"] == 2
    assert group_credit_and_stats("ecpo", group, similarity_threshold=0.8)[1]["num_anchor_groups"] == 1


def test_bad_arguments_are_rejected():
    group = lucky_group()
    for kwargs, name in [
        ({"gamma": -0.1}, "gamma"), ({"gamma": 1.5}, "gamma"), ({"step_advantage_w": math.inf}, "omega"),
        ({"shrinkage_kappa": -1.0}, "kappa"), ({"variance_gate_tau": 0.0}, "tau"), ({"ecpo_mode": "std"}, "mode"),
        ({"anchor": "history"}, "anchor"), ({"similarity_threshold": 0.0}, "similarity_threshold"),
        ({"eps": 0.0}, "eps"), ({"credit_statistic": "rows"}, "statistic"),
    ]:
        with pytest.raises(ValueError, match=name):
            group_credit("ecpo", group, **kwargs)
    with pytest.raises(ValueError, match="non-finite"):
        group_credit("ecpo", group_of(episode(("s", float("inf")))))


def test_registry_and_docstrings():
    assert get_estimator("ecpo").function is ecpo_advantages
    for module in (credit_ecpo, trainer_ecpo):
        assert doctest.testmod(module).failed == 0


# ---------------------------------------------------------------- config and trainer


def test_config_validation(tmp_path):
    base = {"output_dir": str(tmp_path), "report_to": "none", "num_generations": 2, "per_device_train_batch_size": 2}
    config = ECPOConfig(**base)
    assert (config.gamma, config.shrinkage_kappa, config.variance_gate_tau, config.ecpo_mode) == (
        0.95, 2.0, None, "mean_norm"
    )
    for field_name, value in [
        ("gamma", 1.5), ("step_advantage_w", math.nan), ("shrinkage_kappa", -1.0), ("variance_gate_tau", 0.0),
        ("ecpo_mode", "std"), ("anchor", "history"), ("similarity_threshold", 1.0), ("shrinkage_kappa", "two"),
    ]:
        with pytest.raises(ValueError, match=field_name):
            ECPOConfig(**base, **{field_name: value})
    for name in ("step_advantage_w", "variance_gate_tau", "ecpo_mode", "merge_invalid_actions"):
        help_text = ECPOConfig.__dataclass_fields__[name].metadata["help"]
        assert "our choice" in help_text.lower() and "docs/methods/ecpo.md" in help_text


@pytest.mark.slow
def test_two_training_steps_on_frozenlake(tiny_model, tokenizer, scripted, tmp_path):
    # The scripted episodes of helpers.FROZENLAKE_PLANS (two successes, a detour, a run that starts invalid).
    trainer, logs = two_scripted_frozenlake_steps(ECPOTrainer, ECPOConfig, tiny_model, tokenizer, scripted, tmp_path / "out",
                                                  "ecpo/mean_gate")
    for log in logs:
        # 16 rows over 6 anchors; (2,1) and (0,1) are visited once. Canonical actions per anchor:
        # (0,0): down, right, <invalid>;  (1,0): right;  (0,1): down;  (1,1): down, right, up;  (2,1): right;
        # (1,2): down, left  -> 11 / 6.
        assert log["ecpo/mean_anchor_group_size"] == pytest.approx(16 / 6)
        assert log["ecpo/singleton_fraction"] == pytest.approx(2 / 6)
        assert log["ecpo/mean_actions_per_anchor"] == pytest.approx(11 / 6)
        assert 0 < log["ecpo/mean_gate"] < 1
    assert [t.success for t in trainer.last_rollout.groups[0].trajectories] == [True, True, False, False]
