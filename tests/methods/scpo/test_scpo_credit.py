"""SCPO (docs/methods/scpo.md): hand-computed shaping and credit, scorers, properties, trainer wiring, 2 iterations.

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
from helpers import all_finite, assert_close, group_credit, group_credit_and_stats, group_of

from trl_agents.credit import get_estimator
from trl_agents.credit import scpo as credit_scpo
from trl_agents.credit.scpo import (
    SCORERS,
    DifflibScorer,
    ExactScorer,
    LexicalScorer,
    choose_sibling,
    get_scorer,
    progress_increments,
    progress_rewards,
    register_scorer,
    scpo_advantages,
    shaped_group,
)
from trl_agents.envs import AgentEnv, register_env
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.scpo import SCPOConfig, SCPOTrainer
from trl_agents.trajectory import Step, Trajectory

TOL = 1e-4
CONFIGS_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs")


def episode(states, actions, won, final_reward=None, valid=None):
    """An episode through `states` taking `actions`; the last step's reward is `final_reward` (default 1 if won)."""
    final = float(won) if final_reward is None else final_reward
    valid = valid if valid is not None else [True] * len(states)
    steps = [
        Step(observation=o, action_text=a, reward=final if t == len(states) - 1 else 0.0, valid=v,
             done=t == len(states) - 1)
        for t, (o, a, v) in enumerate(zip(states, actions, valid, strict=True))
    ]
    return Trajectory(task={"task_id": "t"}, steps=steps, success=won)


def same_observation(step, sibling):
    """A test scorer: 1 for sibling steps with the same observation text, else 0."""
    return [1.0 if step.observation == other.observation else 0.0 for other in sibling.steps]


def spec_group(success_reward=1.0):
    # docs/methods/scpo.md: s* has 4 steps (s0..s3); the failed episode's observations match p = [0, 1, 1, −1, 2].
    sibling = episode(["s0", "s1", "s2", "s3"], ["go"] * 4, True, final_reward=success_reward)
    failed = episode(["s0", "s1", "s1", "x", "s2"], ["go"] * 5, False)
    return group_of(sibling, failed)


# ---------------------------------------------------------------- (a) hand-computed cases (docs/methods/scpo.md)


def test_progress_frontier_reference():
    # p = [0, 1, 1, −1, 2] -> frontier [0, 1, 1, 1, 2] (from P_{−1} = −1) -> new progress [1, 1, 0, 0, 1]
    assert progress_increments([0, 1, 1, -1, 2]) == [1, 1, 0, 0, 1]
    assert progress_increments([-1, -1]) == [0, 0]
    assert progress_increments([3, 0, 2, 4]) == [4, 0, 0, 1]  # jumping ahead credits every skipped sibling step


def test_shaping_reference():
    # r̃ = c·[1, 1, 0, 0, 1]/|s*| with |s*| = 4 and c = κ·R(s*) = 0.5·1 -> [0.125, 0.125, 0, 0, 0.125]
    shaping, stats = progress_rewards(spec_group(), same_observation)
    assert shaping == [[0.0] * 4, [0.125, 0.125, 0.0, 0.0, 0.125]]
    # final frontier 2 -> progress (2 + 1)/4 = 0.75; 4 of 5 failed steps matched; total shaping 0.375
    assert stats == {"shaped": 1.0, "failed_episodes": 1.0, "mean_progress": 0.75, "mean_shaping_return": 0.375,
                     "matched_step_fraction": 0.8}
    # A success reward of 10 (verl-agent ALFWorld): c = 5 -> 5/4 = 1.25 per new sibling step.
    assert progress_rewards(spec_group(10.0), same_observation)[0][1] == [1.25, 1.25, 0.0, 0.0, 1.25]
    # κ = 0.2, R = 10: c = 2 -> 0.5 per new step
    assert progress_rewards(spec_group(10.0), same_observation, progress_coef=0.2)[0][1] == [0.5, 0.5, 0.0, 0.0, 0.5]


def test_no_success_means_no_shaping_and_plain_gigpo():
    # A group with no success: r̃ ≡ 0 and SCPO = GiGPO exactly.
    group = group_of(episode(["s0", "s1"], ["a", "b"], False), episode(["s0", "s2"], ["a", "c"], False, 0.5))
    shaping, stats = progress_rewards(group, same_observation)
    assert shaping == [[0.0, 0.0], [0.0, 0.0]] and stats["shaped"] == 0.0
    assert group_credit("scpo", group, scpo_scorer=same_observation) == group_credit("gigpo", group)


def test_scpo_advantages_hand_computed():
    # A: s0 -up-> s1 -up-> won (R = 1);  B: s0 -up-> s1 -down-> lost. Exact scorer: B's step 0 matches A's step 0,
    # step 1 ("down" at s1) matches nothing -> r̃_B = [0.5·1/2, 0] = [0.25, 0].  GiGPO, γ = 1, mean_norm, step rows:
    # episode_and_step: returns A = 1, B = 0.25; step-row scores [1, 1, 0.25, 0.25], mean 0.625 -> A^E ±0.375.
    #   Step returns A [1, 1], B [0.25, 0]; anchors s0 {1, 0.25} -> ±0.375, s1 {1, 0} -> ±0.5.
    #   A = [0.75, 0.875], B = [−0.75, −0.875].
    # step: A^E from the raw returns [1, 1, 0, 0] -> ±0.5;  A^S as above -> A = [0.875, 1.0], B = [−0.875, −1.0].
    # GiGPO without shaping: A^E ±0.5, A^S s0 {1, 0} ±0.5, s1 ±0.5 -> A = [1, 1], B = [−1, −1].
    a = Trajectory(task={}, steps=[Step("s0", "up"), Step("s1", "up", reward=1.0)], success=True)
    b = Trajectory(task={}, steps=[Step("s0", "up"), Step("s1", "down")])
    group = group_of(a, b)
    options = {"scpo_scorer": "exact", "gamma": 1.0}
    assert_close(group_credit("scpo", group, **options), [[0.75, 0.875], [-0.75, -0.875]])
    assert_close(group_credit("scpo", group, shaping_level="step", **options), [[0.875, 1.0], [-0.875, -1.0]])
    assert_close(group_credit("scpo", group, progress_coef=0.0, **options), [[1.0, 1.0], [-1.0, -1.0]])
    assert_close(group_credit("gigpo", group, gamma=1.0), [[1.0, 1.0], [-1.0, -1.0]])
    # mean_std_norm, episode_and_step: A^E over [1, 1, 0.25, 0.25]: std sqrt(4·0.140625/3) = 0.4330 -> ±0.8660;
    # A^S: s0 {1, 0.25}: std 0.5303 -> ±0.7071; s1 {1, 0}: std 0.7071 -> ±0.7071 -> A = ±[1.5731, 1.5731]
    assert_close(group_credit("scpo", group, gigpo_mode="mean_std_norm", **options), [[1.5731, 1.5731], [-1.5731, -1.5731]])


# ---------------------------------------------------------------- scorers


def test_lexical_scorer_numbers():
    scorer = LexicalScorer()
    sibling = Trajectory(task={}, steps=[Step("You see a mug.", "take mug"), Step("You hold a mug.", "go to sink")])
    # step 0: identical observation (Dice 1) and canonical action "take mug" (1) -> 1.0
    # step 1: tokens {you, see, a, mug, .} vs {you, hold, a, mug, .}: 2·4/10 = 0.8; actions disjoint: 0
    #         -> 0.5·0.8 + 0.5·0 = 0.4
    assert scorer(Step("You see a mug.", "Take  MUG"), sibling) == pytest.approx([1.0, 0.4])
    # action weight 0.25: 0.75·0.8 + 0.25·0 = 0.6
    assert LexicalScorer(action_weight=0.25)(Step("You see a mug.", "take mug"), sibling)[1] == pytest.approx(0.6)
    assert scorer.similarity("", "") == 1.0 and scorer.similarity("a", "") == 0.0
    with pytest.raises(ValueError, match="action_weight"):
        LexicalScorer(action_weight=1.5)


def test_difflib_and_exact_scorers():
    # "abce" vs "abcd": 3 matching characters of 8 -> 2·3/8 = 0.75; actions equal -> 0.5·0.75 + 0.5 = 0.875
    assert DifflibScorer()(Step("abce", "up"), Trajectory(task={}, steps=[Step("abcd", "up")])) == [0.875]
    sibling = Trajectory(task={}, steps=[Step("a", "up", state_key=1), Step("b", "left", state_key=2)])
    assert ExactScorer()(Step("other text", "LEFT", state_key=2), sibling) == [0.0, 1.0]
    assert ExactScorer()(Step("other text", "up", state_key=2), sibling) == [0.0, 0.0]  # same state, other move
    # the parsed action counts, not the wording of the reply
    assert ExactScorer()(Step("x", "I will move left", state_key=2, info={"action": "left"}), sibling) == [0.0, 1.0]


def test_scorer_registry_and_custom_scorers():
    assert {"lexical", "difflib", "exact"} <= set(SCORERS)
    assert isinstance(get_scorer("difflib", action_weight=0.3), DifflibScorer)
    assert get_scorer(same_observation) is same_observation
    with pytest.raises(ValueError, match="Did you mean 'exact'"):
        get_scorer("exakt")

    @register_scorer("test-always")
    def always(action_weight=0.5):
        return lambda step, sibling: [1.0] * sibling.num_steps

    try:
        # Every failed step matches the last sibling step: all progress on step 0 -> c·4/4 = 0.5 there.
        assert progress_rewards(spec_group(), "test-always")[0][1] == [0.5, 0.0, 0.0, 0.0, 0.0]
        with pytest.raises(ValueError, match="already registered"):
            register_scorer("test-always")(lambda: None)
    finally:
        del SCORERS["test-always"]


def test_bad_scorer_output_is_rejected():
    for bad in ([1.0], [0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, float("nan")]):
        with pytest.raises(ValueError, match="one score in \\[0, 1\\] per step"):
            progress_rewards(spec_group(), lambda step, sibling, bad=bad: bad)


# ---------------------------------------------------------------- design rules


def test_sibling_choice_and_order_independence():
    long = episode(["s0", "s1", "s2"], ["a", "b", "c"], True, final_reward=2.0)
    short_low = episode(["s0", "t1"], ["x", "y"], True, final_reward=1.0)
    short_high = episode(["s0", "u1"], ["z", "w"], True, final_reward=1.5)
    failed = episode(["s0", "s1"], ["a", "q"], False)
    group = group_of(long, short_low, short_high, failed)
    assert choose_sibling(group, "shortest") is short_high  # fewest steps, then highest return
    assert choose_sibling(group, "highest_return") is long
    # Equal length and return: the content decides, not the order.
    twin_a = episode(["s0", "a1"], ["m", "n"], True)
    twin_b = episode(["s0", "b1"], ["m", "n"], True)
    assert choose_sibling(group_of(twin_a, twin_b, failed)) is twin_a
    assert choose_sibling(group_of(twin_b, failed, twin_a)) is twin_a
    assert choose_sibling(group_of(failed)) is None
    with pytest.raises(ValueError, match="sibling"):
        choose_sibling(group, "longest")


def test_invalid_steps_never_progress():
    sibling = episode(["s0", "s1"], ["a", "b"], True)
    failed = episode(["s0", "s1"], ["a", "b"], False, valid=[False, True])
    # step 0 matches sibling step 0 but is invalid -> −1; step 1 matches step 1 -> frontier −1 -> 1: 2 new steps
    shaping, _ = progress_rewards(group_of(sibling, failed), same_observation)
    assert shaping[1] == [0.0, 0.5]  # c·2/2 with c = 0.5


def test_nonpositive_sibling_return_gives_no_shaping():
    sibling = episode(["s0", "s1"], ["a", "b"], True, final_reward=-1.0)
    failed = episode(["s0", "s1"], ["a", "b"], False, final_reward=-2.0)
    assert progress_rewards(group_of(sibling, failed), same_observation)[0] == [[0.0, 0.0], [0.0, 0.0]]


def test_shaping_is_bounded_and_only_on_failed_episodes():
    rng = random.Random(3)
    for _ in range(20):
        trajectories = []
        for _ in range(6):
            length = rng.randint(1, 6)
            trajectories.append(episode([f"s{rng.randrange(4)}" for _ in range(length)],
                                        [rng.choice("ab") for _ in range(length)], rng.random() < 0.4,
                                        final_reward=rng.choice([1.0, 3.0])))
        group = group_of(*trajectories)

        def noisy(step, sibling):
            return [rng.random() for _ in sibling.steps]

        shaping, _ = progress_rewards(group, noisy, threshold=0.5)
        best = choose_sibling(group)
        for traj, row in zip(group.trajectories, shaping, strict=True):
            assert all(r >= 0 for r in row)
            if traj.success or best is None:
                assert not any(row)
            else:
                assert sum(row) <= 0.5 * best.episode_return + 1e-12  # total ≤ c
        rewards = [[s.reward for s in traj.steps] for traj in group.trajectories]
        shaped = shaped_group(group, shaping)
        for new, old, row in zip(shaped.trajectories, rewards, shaping, strict=True):
            assert [s.reward for s in new.steps] == pytest.approx([r + extra for r, extra in zip(old, row)])
        assert [[s.reward for s in traj.steps] for traj in group.trajectories] == rewards  # input untouched


# ---------------------------------------------------------------- (b) properties


@pytest.mark.parametrize("won", [False, True])
@pytest.mark.parametrize("options", [{}, {"gigpo_mode": "mean_std_norm"}, {"shaping_level": "step"},
                                     {"scpo_scorer": "exact"}])
def test_all_equal_rewards_give_zero(won, options):
    # All failed (no sibling: plain GiGPO) or all won (nothing to shape): equal returns give A ≡ 0.
    group = group_of(*(episode(["s0", f"t{i}"], ["a", f"b{i}"], won) for i in range(4)))
    assert group_credit("scpo", group, **options) == [[0.0, 0.0]] * 4


def test_permuting_trajectories_permutes_advantages():
    rng = random.Random(0)
    trajectories = []
    for _ in range(6):
        length = rng.randint(1, 5)
        trajectories.append(episode([f"s{rng.randrange(3)}" for _ in range(length)],
                                    [rng.choice("ab") for _ in range(length)], rng.random() < 0.4,
                                    valid=[rng.random() > 0.2 for _ in range(length)]))
    order = [3, 0, 5, 1, 4, 2]
    settings = ({}, {"scpo_scorer": "exact", "shaping_level": "step"},
                {"scpo_scorer": "difflib", "sibling": "highest_return"})
    for options in settings:
        advantages = group_credit("scpo", group_of(*trajectories), **options)
        permuted = group_credit("scpo", group_of(*(trajectories[i] for i in order)), **options)
        assert_close(permuted, [advantages[i] for i in order], tol=1e-12)


def test_edge_cases_are_finite():
    assert group_credit("scpo", group_of()) == []
    assert group_credit("scpo", group_of(Trajectory(task={}))) == [[]]
    mixed = group_credit("scpo", group_of(Trajectory(task={}), episode(["s0", "s1"], ["a", "b"], True),
                                     episode(["s0", "s1"], ["a", "c"], False)))
    assert [len(row) for row in mixed] == [0, 2, 2] and all_finite(mixed)
    assert group_credit("scpo", group_of(episode(["s0", "s1"], ["a", "b"], True))) == [[0.0, 0.0]]  # singleton
    one_step = group_credit("scpo", group_of(episode(["s0"], ["a"], True), episode(["s0"], ["a"], False)))
    assert all_finite(one_step)
    invalid = group_of(*(episode(["s0", "s0"], ["x", "y"], won, valid=[False, False]) for won in (True, False)))
    for options in ({}, {"gigpo_mode": "mean_std_norm"}, {"shaping_level": "step"}, {"episode_statistic": "trajectories"}):
        assert all_finite(group_credit("scpo", invalid, **options))


def test_bad_arguments_are_rejected():
    group = spec_group()
    for options, field in [({"progress_threshold": 0.0}, "threshold"), ({"progress_threshold": 1.5}, "threshold"),
                           ({"progress_coef": -1.0}, "progress_coef"), ({"sibling": "first"}, "sibling"),
                           ({"shaping_level": "episode"}, "shaping_level"), ({"gigpo_mode": "z"}, "mode"),
                           ({"scpo_scorer": "bm25"}, "Unknown SCPO scorer"),
                           ({"scorer_action_weight": 2.0}, "action_weight")]:
        with pytest.raises(ValueError, match=field):
            group_credit("scpo", group, **options)


def test_stats_and_registry_and_docstrings():
    _, stats = group_credit_and_stats("scpo", spec_group(), scpo_scorer=same_observation)
    assert stats["shaped_group_fraction"] == 1.0 and stats["mean_progress"] == 0.75 and "num_anchor_groups" in stats
    assert get_estimator("scpo").function is scpo_advantages
    assert doctest.testmod(credit_scpo).failed == 0


# ---------------------------------------------------------------- trainer wiring


def test_config_validation(tmp_path):
    base = {"output_dir": str(tmp_path), "report_to": "none", "num_generations": 2, "per_device_train_batch_size": 2}
    for field, value in [("scpo_scorer", "bm25"), ("progress_threshold", 0.0), ("progress_coef", -0.5),
                         ("sibling", "first"), ("shaping_level", "both"), ("scorer_action_weight", 1.5),
                         ("gigpo_mode", "z")]:
        with pytest.raises(ValueError, match=field):
            SCPOConfig(**base, **{field: value})
    config = SCPOConfig(**base)
    assert (config.scpo_scorer, config.progress_threshold, config.progress_coef) == ("lexical", 0.8, 0.5)


def make_config(tmp_path, **overrides):
    return tiny_training_config(SCPOConfig, tmp_path / "out", **overrides)


class PlainEnv(AgentEnv):
    """An env with no optional capability (no state_key): the text scorers and GiGPO's anchors use observations."""

    name = "test-scpo-plain"
    instructions = "Say anything."
    task_keys = ("seed",)

    def reset(self, task):
        self.turn = 0
        return "start"

    def step(self, action_text):
        self.turn += 1
        return f"turn {self.turn}", float("a" in action_text), self.turn >= 2, {"valid": True}


def test_no_capability_is_required_and_scorer_choice(tiny_model, tokenizer, tmp_path):
    register_env(PlainEnv)
    assert SCPOTrainer.required_env_capabilities == ()
    tasks = [{"env": PlainEnv.name, "seed": 0}]
    trainer = SCPOTrainer(model=tiny_model, args=make_config(tmp_path, scpo_scorer="difflib"), train_dataset=tasks,
                          processing_class=tokenizer)
    assert isinstance(trainer.scorer, DifflibScorer)
    trainer = SCPOTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=tasks,
                          processing_class=tokenizer, scorer=same_observation)
    assert trainer.scorer is same_observation
    # compute_advantages = the estimator, and its diagnostics (before another config resets accelerate's state)
    advantages = trainer.compute_advantages([spec_group(), group_of(episode(["s0"], ["a"], False))])
    assert advantages[1] == [[0.0]]
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    assert metrics["scpo/shaped_group_fraction"][-1] == 0.5 and metrics["scpo/mean_progress"][-1] == 0.75
    with pytest.raises(TypeError, match="scorer must be callable"):
        SCPOTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=tasks, processing_class=tokenizer,
                    scorer="lexical")


@pytest.fixture
def registered():
    """The method as registered in `trainers.METHODS` (what `trl-agents train` looks up)."""
    assert METHODS["scpo"].trainer_class is SCPOTrainer
    yield


@pytest.mark.parametrize("name", ["scpo_alfworld.yaml", "scpo_sokoban_tiny.yaml"])
def test_configs_parse(name, registered):
    from trl import ModelConfig, TrlParser

    from trl_agents.run import RunArguments

    path = os.path.join(CONFIGS_DIR, name)
    run, config, model = TrlParser((RunArguments, SCPOConfig, ModelConfig)).parse_args_and_config(["--config", path])
    assert run.method == "scpo" and isinstance(config, SCPOConfig)
    assert config.env_name and (run.tiny_model or model.model_name_or_path)


# ---------------------------------------------------------------- (c) end to end


class CountingScorer(LexicalScorer):
    calls = 0

    def __call__(self, step, sibling):
        CountingScorer.calls += 1
        return super().__call__(step, sibling)


@pytest.mark.slow
def test_two_training_iterations(tiny_model, tokenizer, tmp_path):
    tasks = Dataset.from_list([{"env": "test-keyword", "seed": s} for s in range(8)])
    trainer = SCPOTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=tasks,
                          processing_class=tokenizer, scorer=CountingScorer(action_weight=0.0))
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == 2
    for key in ("scpo/shaped_group_fraction", "scpo/mean_progress", "scpo/mean_shaping_return",
                "scpo/matched_step_fraction", "scpo/mean_anchor_group_size"):
        assert key in logs[0] and math.isfinite(logs[0][key]), key
    # test-keyword: about half of the episodes succeed, so some groups have a sibling and a failure to score; its
    # observations ("Round t of task s.") are the same at the same turn, so an observation-only scorer matches
    # failed steps to the sibling's and the failed episodes earn shaping rewards.
    assert max(h["scpo/shaped_group_fraction"] for h in logs) > 0 and CountingScorer.calls > 0
    assert max(h["scpo/mean_shaping_return"] for h in logs) > 0


@pytest.mark.slow
def test_tiny_sokoban_config_runs(tmp_path, registered):
    from trl_agents.cli import main

    path = os.path.join(CONFIGS_DIR, "scpo_sokoban_tiny.yaml")
    main(["train", "--config", path, "--output_dir", str(tmp_path), "--max_steps", "1", "--warm_start_steps", "10",
          "--num_eval_tasks", "10", "--disable_tqdm", "true"])
    assert os.path.exists(tmp_path / "eval_results.json")
