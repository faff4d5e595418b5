"""ProGPO (docs/methods/progpo.md): hand-computed credit, properties, trainer wiring and a 2-iteration run.

Expected numbers are written out with their arithmetic in comments; they are not recomputed with the code under test.
"""

from __future__ import annotations

import doctest
import math
import os
import random

import pytest
import torch
from datasets import Dataset
from helpers import all_finite, assert_close, group_credit, group_of

from trl_agents.credit import get_estimator
from trl_agents.credit import progpo as credit_progpo
from trl_agents.credit.base import canonical_action
from trl_agents.credit.progpo import (
    ProGPOParams,
    combine_parts,
    fuse_inverse_variance,
    progpo_advantages,
    progpo_parts,
    transition_scale,
)
from trl_agents.envs import AgentEnv, register_env
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.progpo import ProGPOConfig, ProGPOTrainer
from trl_agents.trajectory import Step, Trajectory


def parts_of(group, **params):
    """`progpo_parts` of one group with `ProGPOParams(**params)`."""
    return progpo_parts(group, ProGPOParams(**params))


TOL = 1e-4
CONFIGS_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs")


def episode(states, actions, won, rewards=None, valid=None):
    """An episode through `states` (observations) taking `actions`; reward 1 on the last step when `won` unless
    `rewards` are given."""
    rewards = rewards if rewards is not None else [0.0] * (len(states) - 1) + [float(won)]
    valid = valid if valid is not None else [True] * len(states)
    steps = [
        Step(observation=o, action_text=a, reward=float(r), valid=v, done=t == len(states) - 1)
        for t, (o, a, r, v) in enumerate(zip(states, actions, rewards, valid, strict=True))
    ]
    return Trajectory(task={"task_id": "t"}, steps=steps, success=won)


# The GiGPO toy of docs/methods/gigpo.md and docs/methods/progpo.md (rewards only at the last step):
#   A: s0 -a-> s1 -b-> success    B: s0 -a-> s1 -c-> fail    C: s0 -d-> s2 -e-> fail    D: copy of A
def toy_group():
    return group_of(
        episode(["s0", "s1"], ["a", "b"], True),
        episode(["s0", "s1"], ["a", "c"], False),
        episode(["s0", "s2"], ["d", "e"], False),
        episode(["s0", "s1"], ["a", "b"], True),
    )


EXACT = {"gamma": 1.0, "potential_depth": 0, "potential_smoothing": False}  # the setting of docs/methods/progpo.md's hand case


# ---------------------------------------------------------------- (a) hand-computed cases (docs/methods/progpo.md)


def test_inverse_variance_fusion_reference():
    # Φ̂_0 = 0.6 (n = 10) -> Var 0.6·0.4/10 = 0.024;  Φ̂_1 = 0.9 (n = 2) -> Var 0.9·0.1/2 = 0.045
    # Φ = (0.6/0.024 + 0.9/0.045)/(1/0.024 + 1/0.045) = (25 + 20)/(41.667 + 22.222) = 0.7043
    assert fuse_inverse_variance([(0.6, 0.024), (0.9, 0.045)]) == pytest.approx(0.7043, abs=TOL)
    assert fuse_inverse_variance([(0.3, 0.5)]) == 0.3  # one depth: the estimate itself
    with pytest.raises(ValueError, match="variances must be > 0"):
        fuse_inverse_variance([(0.5, 0.0)])
    with pytest.raises(ValueError, match="at least one"):
        fuse_inverse_variance([])


def test_toy_potentials_and_transition_credit():
    # K = 0, no smoothing, γ = 1: Φ(s0) = 2/4 = 0.5, Φ(s1) = 2/3, Φ(s2) = 0/1 = 0; after the last step
    # Φ = 1[won].
    # A^tr: s0->s1 = 2/3 − 1/2 = +1/6, s0->s2 = −0.5, s1->won = 1 − 2/3 = +1/3, s1->lost = −2/3, s2->lost = 0.
    parts = parts_of(toy_group(), **EXACT)
    assert_close(parts.potentials, [[0.5, 2 / 3], [0.5, 2 / 3], [0.5, 0.0], [0.5, 2 / 3]])
    assert_close(parts.transition, [[1 / 6, 1 / 3], [1 / 6, -2 / 3], [-0.5, 0.0], [1 / 6, 1 / 3]])


def test_toy_peer_and_episode_terms():
    # γ = 1: step returns A, D: [1, 1]; B, C: [0, 0].
    # Peers: t = 0 all four (same first observation): mean 0.5 -> ±0.5 (mean_norm) or ±0.5/0.57735 = ±0.8660 (z-score).
    #        t = 1: {A, B, D} share (s0, a, s1): mean 2/3 -> A, D +1/3, B −2/3;  C alone (s0, d, s2) -> 0.
    parts = parts_of(toy_group(), progpo_mode="mean_norm", **EXACT)
    assert_close(parts.peer, [[0.5, 1 / 3], [-0.5, -2 / 3], [-0.5, 0.0], [0.5, 1 / 3]])
    assert_close(parts.episode, [[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5], [0.5, 0.5]])  # R = [1, 0, 0, 1], mean 0.5
    z = parts_of(toy_group(), progpo_mode="mean_std_norm", **EXACT)
    # t = 1 group [1, 0, 1]: std sqrt((1/9 + 4/9 + 1/9)/2) = 0.57735 -> (1/3)/0.57735 = 0.5774, (−2/3)/0.57735 = −1.1547
    assert_close(z.peer, [[0.8660, 0.5774], [-0.8660, -1.1547], [-0.8660, 0.0], [0.8660, 0.5774]])
    assert_close(z.episode, [[0.8660, 0.8660], [-0.8660, -0.8660], [-0.8660, -0.8660], [0.8660, 0.8660]])
    assert parts.stats["prefix_groups"] == 3 and parts.stats["peer_fraction"] == pytest.approx(7 / 8)


def test_toy_full_advantages():
    # A = A^E + A^peer + A^tr/σ_tr (mean_norm, γ = 1, K = 0, no smoothing).
    # σ_tr = 1:  A: [0.5 + 0.5 + 1/6, 0.5 + 1/3 + 1/3] = [1.1667, 1.1667];  B: [−0.5 − 0.5 + 1/6, −0.5 − 2/3 − 2/3]
    #            = [−0.8333, −1.8333];  C: [−0.5 − 0.5 − 0.5, −0.5 + 0 + 0] = [−1.5, −0.5].
    options = dict(progpo_mode="mean_norm", **EXACT)
    expected_none = [[1.1667, 1.1667], [-0.8333, -1.8333], [-1.5, -0.5], [1.1667, 1.1667]]
    assert_close(group_credit("progpo", toy_group(), transition_norm="none", **options), expected_none)
    # σ_tr of this group: the 8 credits sum to 0; squares 3/36 + 2/9 + 4/9 + 1/4 = 1 -> std sqrt(1/7) = 0.377964.
    # A: step 0: 1 + (1/6)/0.377964 = 1.440959; step 1: 0.833333 + (1/3)/0.377964 = 1.715250
    # B: step 0: −1 + 0.440959 = −0.559041;    step 1: −1.166667 − (2/3)/0.377964 = −2.930501
    # C: step 0: −1 − 0.5/0.377964 = −2.322876; step 1: −0.5
    expected_group = [[1.440959, 1.715250], [-0.559041, -2.930501], [-2.322876, -0.5], [1.440959, 1.715250]]
    assert_close(group_credit("progpo", toy_group(), transition_norm="group", **options), expected_group)
    assert transition_scale([v for row in parts_of(toy_group(), **EXACT).transition for v in row]) == (
        pytest.approx(math.sqrt(1 / 7))
    )
    # A scale given by the caller (the trainer's batch std) wins: σ_tr = 0.5 -> A's step 0 = 1 + (1/6)/0.5 = 1.3333
    given = group_credit("progpo", toy_group(), transition_std=0.5, **options)
    assert given[0][0] == pytest.approx(4 / 3)


def test_smoothed_potentials():
    # Beta(1, 1): Φ̂ = (succ + 1)/(n + 2):  s0: 3/6 = 0.5;  s1: 3/5 = 0.6;  s2: 1/3.
    # A^tr (γ = 1): A: [0.6 − 0.5, 1 − 0.6] = [0.1, 0.4];  B: [0.1, 0 − 0.6];  C: [1/3 − 0.5, 0 − 1/3] = [−1/6, −1/3].
    parts = parts_of(toy_group(), gamma=1.0, potential_depth=0, potential_smoothing=True)
    assert_close(parts.potentials, [[0.5, 0.6], [0.5, 0.6], [0.5, 1 / 3], [0.5, 0.6]])
    assert_close(parts.transition, [[0.1, 0.4], [0.1, -0.6], [-1 / 6, -1 / 3], [0.1, 0.4]])


def test_fusion_across_history_depths():
    # E1, E4: s0 -> sA -> s1 -> success;  E2, E3: s0 -> sB -> s1 -> fail. K = 1, smoothing, ε₀ ≈ 0.
    # s1 at depth 0: n = 4, succ = 2 -> Φ̂ = 3/6 = 0.5,  Var = 0.25/4 = 0.0625 (weight 16)
    # (sA, s1) at depth 1: n = 2, succ = 2 -> Φ̂ = 3/4 = 0.75, Var = 0.1875/2 = 0.09375 (weight 10.667)
    #   fused: (0.5·16 + 0.75·10.667)/(26.667) = 0.6;   (sB, s1): Φ̂ = 1/4 -> (8 + 2.667)/26.667 = 0.4
    # sA, sB at t = 1: depth 0 and depth 1 (s0, sA) have the same counts -> 0.75 and 0.25; s0: 0.5.
    # A^tr (γ = 1): E1: [0.75 − 0.5, 0.6 − 0.75, 1 − 0.6] = [0.25, −0.15, 0.4];  E2: [−0.25, 0.15, −0.4].
    group = group_of(
        episode(["s0", "sA", "s1"], ["a", "b", "c"], True),
        episode(["s0", "sB", "s1"], ["d", "b", "c"], False),
        episode(["s0", "sB", "s1"], ["d", "b", "c"], False),
        episode(["s0", "sA", "s1"], ["a", "b", "c"], True),
    )
    parts = parts_of(group, gamma=1.0, potential_depth=1, potential_smoothing=True, potential_variance_floor=1e-12)
    assert_close(parts.potentials, [[0.5, 0.75, 0.6], [0.5, 0.25, 0.4], [0.5, 0.25, 0.4], [0.5, 0.75, 0.6]])
    assert_close(parts.transition, [[0.25, -0.15, 0.4], [-0.25, 0.15, -0.4], [-0.25, 0.15, -0.4], [0.25, -0.15, 0.4]])
    # K = 0 ignores the history: Φ(s1) = 0.5 for both paths.
    flat = parts_of(group, gamma=1.0, potential_depth=0, potential_smoothing=True, potential_variance_floor=1e-12)
    assert flat.potentials[0][2] == pytest.approx(0.5) and flat.potentials[1][2] == pytest.approx(0.5)


def test_interaction_prefix_versus_action_prefix():
    # Same action "a" from s0 lands in x for P, Q and in y for R (a stochastic env); then all take "b".
    # γ = 1, mean_norm. Returns P: [1, 1], Q: [0, 0], R: [1, 1].
    group = group_of(
        episode(["s0", "x"], ["a", "b"], True),
        episode(["s0", "x"], ["a", "b"], False),
        episode(["s0", "y"], ["a", "b"], True),
    )
    # "interaction": t = 1 peers are {P, Q} (same observation x): mean 0.5 -> ±0.5; R alone -> 0.
    interaction = parts_of(group, progpo_mode="mean_norm", prefix="interaction", **EXACT)
    assert [row[1] for row in interaction.peer] == pytest.approx([0.5, -0.5, 0.0])
    # "actions": all three share the action prefix (a): mean 2/3 -> [1/3, −2/3, 1/3].
    actions = parts_of(group, progpo_mode="mean_norm", prefix="actions", **EXACT)
    assert [row[1] for row in actions.peer] == pytest.approx([1 / 3, -2 / 3, 1 / 3])


def test_canonical_action_prefers_the_parsed_action():
    assert canonical_action(Step("o", "<think>hm</think><action>Up</action>", info={"action": "up"})) == "up"
    assert canonical_action(Step("o", "<action>go to sink 1</action>", info={"command": "go to sink 1"})) == (
        "go to sink 1"
    )
    assert canonical_action(Step("o", "  Go   LEFT ", info={"action": None})) == "go left"  # invalid: the reply text
    # Two replies with different wording but the same parsed action are peers at the next step.
    first = episode(["s0", "s1"], ["<action>UP</action> now", "b"], True)
    second = episode(["s0", "s1"], ["I go up", "b"], False)
    for traj in (first, second):
        traj.steps[0].info = {"action": "up"}
    parts = parts_of(group_of(first, second), progpo_mode="mean_norm", **EXACT)
    assert [row[1] for row in parts.peer] == pytest.approx([0.5, -0.5])


def test_invalid_action_penalty():
    # λ = 0.1, mean_norm, γ = 1, K = 0. P: s0 -a(invalid)-> s0 -b-> won; Q: s0 -c-> s1 -d-> lost.
    # A^E (trajectories): R = [1, 0] -> ±0.5, then −λ on P's invalid step: P [0.4, 0.5], Q [−0.5, −0.5].
    # Peers t = 0 (both at s0): ρ = [1 − 0.1, 0] -> mean 0.45 -> [0.45, −0.45]; t = 1 different prefixes -> 0.
    group = group_of(
        episode(["s0", "s0"], ["a", "b"], True, valid=[False, True]),
        episode(["s0", "s1"], ["c", "d"], False),
    )
    parts = parts_of(group, progpo_mode="mean_norm", invalid_action_penalty=0.1, **EXACT)
    assert_close(parts.episode, [[0.4, 0.5], [-0.5, -0.5]])
    assert_close(parts.peer, [[0.45, 0.0], [-0.45, 0.0]])


# ---------------------------------------------------------------- (b) properties


def test_without_peer_and_transition_terms_progpo_is_dr_grpo():
    rng = random.Random(1)
    trajectories = [
        episode([f"s{rng.randrange(3)}" for _ in range(3)], ["a", "b", "c"], won)
        for won in (True, False, False, True, False)
    ]
    group = group_of(*trajectories)
    progpo = group_credit("progpo", group, progpo_mode="mean_norm", peer_weight=0.0, transition_weight=0.0)
    assert_close(progpo, group_credit("grpo", group, scale_rewards="none"), tol=1e-12)


@pytest.mark.parametrize("reward", [0.0, 1.0])
@pytest.mark.parametrize("options", [{}, {"progpo_mode": "mean_norm", "transition_norm": "none"}, {"potential_depth": 0}])
def test_all_equal_rewards_give_zero(reward, options):
    # Identical outcomes and step rewards: no episode contrast, no peer contrast, and no transition credit (the
    # documented rule: a group without outcome contrast gets A^tr ≡ 0, even with γ < 1 and smoothing).
    won = reward > 0
    group = group_of(*(episode(["s0", f"t{i}", "s9"], ["a", f"b{i}", "c"], won, [reward] * 3) for i in range(4)))
    advantages = group_credit("progpo", group, **options)
    assert advantages == [[0.0] * 3] * 4


def test_permuting_trajectories_permutes_advantages():
    rng = random.Random(0)
    trajectories = []
    for _ in range(6):
        length = rng.randint(1, 5)
        won = rng.random() < 0.5
        trajectories.append(
            episode(
                [f"s{rng.randrange(3)}" for _ in range(length)], [rng.choice("ab") for _ in range(length)], won,
                valid=[rng.random() > 0.2 for _ in range(length)],
            )
        )
    order = [3, 0, 5, 1, 4, 2]
    for options in ({}, {"progpo_mode": "mean_norm", "episode_statistic": "step_rows", "prefix": "actions"}):
        advantages = group_credit("progpo", group_of(*trajectories), **options)
        permuted = group_credit("progpo", group_of(*(trajectories[i] for i in order)), **options)
        assert_close(permuted, [advantages[i] for i in order], tol=1e-12)


def test_edge_cases_are_finite():
    assert group_credit("progpo", group_of()) == []
    assert group_credit("progpo", group_of(Trajectory(task={}))) == [[]]
    mixed = group_credit("progpo", group_of(Trajectory(task={}), episode(["s0", "s1"], ["a", "b"], True)))
    assert [len(row) for row in mixed] == [0, 2] and all_finite(mixed)
    # A singleton group: no contrast at all -> 0 (minus λ on invalid steps).
    assert group_credit("progpo", group_of(episode(["s0", "s1"], ["a", "b"], True))) == [[0.0, 0.0]]
    assert group_credit("progpo", group_of(episode(["s0"], ["a"], True, valid=[False]))) == [[-0.1]]
    # Length-1 episodes: A^tr = γ·outcome − Φ(s0).
    one_step = group_credit("progpo", group_of(*(episode(["s0"], ["a"], won) for won in (True, False, False))))
    assert all_finite(one_step) and one_step[0][0] > 0 > one_step[1][0]
    # All actions invalid, mixed outcomes, every setting.
    invalid = group_of(*(episode(["s0", "s0"], ["x", "y"], won, valid=[False, False]) for won in (True, False)))
    for options in ({}, {"potential_smoothing": False, "potential_depth": 0}, {"episode_statistic": "step_rows"},
                    {"prefix": "actions"}):
        assert all_finite(group_credit("progpo", invalid, **options))


def test_bad_arguments_are_rejected():
    group = toy_group()
    for options, field in [
        ({"progpo_mode": "std"}, "mode"),
        ({"prefix": "history"}, "prefix"),
        ({"anchor": "hash"}, "anchor"),
        ({"gamma": 1.5}, "gamma"),
        ({"potential_depth": -1}, "max_depth"),
        ({"potential_variance_floor": 0.0}, "variance_floor"),
        ({"transition_norm": "global"}, "transition_norm"),
        ({"transition_std": 0.0}, "transition scale"),
        ({"invalid_action_penalty": float("nan")}, "invalid_penalty"),
    ]:
        with pytest.raises(ValueError, match=field):
            group_credit("progpo", group, **options)
    with pytest.raises(ValueError, match="non-finite"):
        group_credit("progpo", group_of(episode(["s0"], ["a"], True, rewards=[float("inf")])))


def test_combine_parts_weights():
    parts = parts_of(toy_group(), progpo_mode="mean_norm", **EXACT)
    only_transition = combine_parts(parts, peer_weight=0.0, transition_weight=2.0, scale=1.0)
    # A's step 0: A^E 0.5 + 2·(1/6) = 0.8333
    assert only_transition[0][0] == pytest.approx(0.5 + 2 / 6)


def test_registry_and_docstrings():
    assert get_estimator("progpo").function is progpo_advantages
    assert doctest.testmod(credit_progpo).failed == 0


# ---------------------------------------------------------------- trainer wiring


def test_config_validation(tmp_path):
    base = {"output_dir": str(tmp_path), "report_to": "none", "num_generations": 2, "per_device_train_batch_size": 2}
    for field, value in [("transition_norm", "global"), ("progpo_mode", "z"), ("prefix", "obs"),
                         ("anchor", "text"), ("episode_statistic", "rows"), ("gamma", 2.0),
                         ("potential_depth", -1), ("potential_variance_floor", 0.0), ("peer_weight", float("inf"))]:
        with pytest.raises(ValueError, match=field):
            ProGPOConfig(**base, **{field: value})
    with pytest.raises(ValueError, match="potential_depth"):
        ProGPOConfig(**base, potential_depth=1.5)  # type-checked by AgentGRPOConfig
    config = ProGPOConfig(**base)
    assert (config.transition_norm, config.progpo_mode, config.potential_depth) == ("batch", "mean_std_norm", 2)


def make_config(tmp_path, **overrides):
    return tiny_training_config(ProGPOConfig, tmp_path / "out", **overrides)


def test_batch_transition_norm_uses_the_contrast_groups_of_the_batch(tiny_model, tokenizer, tmp_path):
    # The toy group (σ_tr = sqrt(1/7) on its own) plus an all-failed group (A^tr ≡ 0, left out of σ_tr).
    trainer = ProGPOTrainer(model=tiny_model, args=make_config(tmp_path, gamma=1.0, progpo_mode="mean_norm",
                            potential_depth=0, potential_smoothing=False, transition_norm="batch"),
                            train_dataset=[{"env": "test-keyword", "seed": 0}], processing_class=tokenizer)
    failed = group_of(*(episode(["s0", "s1"], ["a", "b"], False) for _ in range(3)))
    advantages = trainer.compute_advantages([toy_group(), failed])
    assert advantages[0][0] == pytest.approx([1.440959, 1.715250], abs=TOL)  # as test_toy_full_advantages
    assert advantages[1] == [[0.0, 0.0]] * 3
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    assert metrics["progpo/transition_std"][-1] == pytest.approx(math.sqrt(1 / 7))
    assert metrics["progpo/outcome_contrast"][-1] == 0.5


class PlainEnv(AgentEnv):
    """An env with no optional capability (no state_key): ProGPO falls back to observation texts."""

    name = "test-progpo-plain"
    instructions = "Say anything."
    task_keys = ("seed",)

    def reset(self, task):
        self.turn = 0
        return "start"

    def step(self, action_text):
        self.turn += 1
        return f"turn {self.turn}", float("a" in action_text), self.turn >= 2, {"valid": True}


def test_no_capability_is_required(tiny_model, tokenizer, tmp_path):
    register_env(PlainEnv)
    assert ProGPOTrainer.required_env_capabilities == ()
    assert "state_key" not in PlainEnv.capabilities()
    ProGPOTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=[{"env": PlainEnv.name, "seed": 0}],
                  processing_class=tokenizer)


@pytest.fixture
def registered():
    """The method as registered in `trainers.METHODS` (what `trl-agents train` looks up)."""
    assert METHODS["progpo"].trainer_class is ProGPOTrainer
    yield


@pytest.mark.parametrize("name", ["progpo_alfworld.yaml", "progpo_sokoban_tiny.yaml"])
def test_configs_parse(name, registered):
    from trl import ModelConfig, TrlParser

    from trl_agents.run import RunArguments

    path = os.path.join(CONFIGS_DIR, name)
    run, config, model = TrlParser((RunArguments, ProGPOConfig, ModelConfig)).parse_args_and_config(["--config", path])
    assert run.method == "progpo" and isinstance(config, ProGPOConfig)
    assert config.env_name and (run.tiny_model or model.model_name_or_path)


# ---------------------------------------------------------------- (c) end to end


@pytest.mark.slow
def test_two_training_iterations(tiny_model, tokenizer, tmp_path):
    tasks = Dataset.from_list([{"env": "test-keyword", "seed": s} for s in range(8)])
    trainer = ProGPOTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=tasks,
                            processing_class=tokenizer)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == 2
    for key in ("progpo/peer_fraction", "progpo/mean_prefix_group_size", "progpo/outcome_contrast",
                "progpo/mean_potential", "progpo/transition_std"):
        assert key in logs[0] and math.isfinite(logs[0][key]), key
    # test-keyword: the 4 episodes of a task share the first observation, so every row at t = 0 has peers.
    assert logs[0]["progpo/peer_fraction"] > 0


@pytest.mark.slow
def test_tiny_sokoban_config_runs(tmp_path, registered):
    from trl_agents.cli import main

    path = os.path.join(CONFIGS_DIR, "progpo_sokoban_tiny.yaml")
    main(["train", "--config", path, "--output_dir", str(tmp_path), "--max_steps", "1", "--warm_start_steps", "10",
          "--num_eval_tasks", "10", "--disable_tqdm", "true"])
    assert os.path.exists(tmp_path / "eval_results.json")
