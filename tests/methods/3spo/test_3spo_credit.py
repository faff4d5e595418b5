"""3SPO (state-score-supervised step credit) against hand-computed numbers, its persistent table, and end to end.

The reference code gives no worked example, so the case below is constructed here (and written out in
docs/methods/3spo.md, "Hand-computed case"); the expected values are written out with their arithmetic in comments
(3SPO Eq. 1-2), not recomputed with the code under test.
"""

from __future__ import annotations

import doctest
import functools
import json
import os
import random

import helpers
import pytest
import torch
import yaml

from trl_agents.credit import base as credit_base
from trl_agents.credit import sspo as credit_sspo
from trl_agents.credit.sspo import (
    sspo_advantages,
    sspo_step_rewards,
)
from trl_agents.envs import AgentEnv, register_env
from trl_agents.rollout.topologies import state_score
from trl_agents.rollout.topologies.state_score import StateScoreTable
from trl_agents.signals import Transition
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS, get_method
from trl_agents.trainers import sspo as trainer_sspo
from trl_agents.trainers.sspo import STATE_SCORES_NAME, SSPOConfig, SSPOTrainer
from trl_agents.trajectory import Group, Step, Trajectory

TOL = 1e-6
assert_close = functools.partial(helpers.assert_close, tol=TOL)  # the hand-computed cases hold to 1e-6
all_finite, group_of = helpers.all_finite, helpers.group_of
CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs")
TASKS = [{"env": "test-keyword", "seed": s} for s in range(8)]


def step(state: str, reward: float = 0.0, valid: bool = True) -> Step:
    return Step(observation=state, action_text="act", reward=reward, valid=valid)


def episode(*steps: Step, success: bool = False) -> Trajectory:
    return Trajectory(task={"task_id": "t"}, steps=list(steps), success=success)


# ---------------------------------------------------------------- the hand-computed case
# Table (scope "task", task "t"), α = 1, ξ = 10, ζ = 0.1, ω_k = 0.1, t = 5 -> λ = log 5 = 1.6094379:
#   s0: N = 4,  N⁺ = 2 -> SR = 2 / 4.000001 = 0.4999999, N_fail 2 < ξ -> S = exp(-λ·SR) = 5^-0.5 = 0.4472137
#   s1: N = 2,  N⁺ = 2 -> SR = 0.9999995                            -> S = 0.2000002
#   s2: N = 12, N⁺ = 0 -> N_fail 12 >= ξ and SR 0 <= ζ                -> S = 0
#   s3: never visited                                                -> S = 1
#   ω = 0.5·exp(-0.1·N): s0 0.3351600, s1 0.4093654, s2 0.1505971, s3 0.5
# Group (λ_inv = 0.1):
#   A: s0 -> s1 -> success            B: s0 -> s2 -> fail (last step at s2)
#   C: s0 (invalid, stays at s0) -> s0 -> s3 -> fail (last step at s3)
# Step rewards R = ω·novel + (0.5 - ω)·(S(s_t) - S(s_t+1)) + 0.5·success (last step: novel = valid, ΔS = 0):
#   A0 = 0.3351600 + 0.1648400 x (0.4472137 - 0.2000002) = 0.3759107     A1 = 0.4093654 + 0.5 = 0.9093654
#   B0 = 0.3351600 + 0.1648400 x (0.4472137 - 0)         = 0.4088787     B1 = 0.1505971
#   C0 = 0 (not novel, ΔS 0), ρ = 0 - 0.1 = -0.1
#   C1 = 0.3351600 + 0.1648400 x (0.4472137 - 1)         = 0.2440387     C2 = 0.5
# Siblings: s0 = {A0, B0, C0, C1}, ρ = [0.3759107, 0.4088787, -0.1, 0.2440387], mean 0.9288281 / 4 = 0.2322070;
#   s1 = {A1}, s2 = {B1}, s3 = {C2} are singletons (A = 0).
#   mean_norm:  A0 0.1437037, B0 0.1766717, C0 -0.3322070, C1 0.0118317
#   mean_std_norm: Bessel std of s0 = 0.2326407 -> A0 0.6177037, B0 0.7594153, C0 -1.4279770, C1 0.0508580
def hand_table() -> StateScoreTable:
    table = StateScoreTable(alpha=1.0, t=5)
    for state, counts in {"s0": [4, 2], "s1": [2, 2], "s2": [12, 0]}.items():
        table.counts[table.key(state, "t")] = counts
    return table


def hand_group() -> Group:
    return group_of(
        episode(step("s0"), step("s1", reward=1.0), success=True),
        episode(step("s0"), step("s2")),
        episode(step("s0", valid=False), step("s0"), step("s3")),
    )


def test_hand_computed_scores():
    table = hand_table()
    assert [table.score(s, "t") for s in ("s0", "s1", "s2", "s3")] == pytest.approx(
        [0.4472137, 0.2000002, 0.0, 1.0], abs=TOL
    )
    assert [table.omega(s, "t") for s in ("s0", "s1", "s2", "s3")] == pytest.approx(
        [0.3351600, 0.4093654, 0.1505971, 0.5], abs=TOL
    )
    # n(s) = ceil(8·S): s0 ceil(3.58) = 4, s1 ceil(1.6) = 2, s2 0 (truncate), s3 8
    assert [table.num_rollouts(s, "t") for s in ("s0", "s1", "s2", "s3")] == [4, 2, 0, 8]


def test_hand_computed_step_rewards():
    rewards, stats = sspo_step_rewards(hand_group(), hand_table())
    expected = [[0.3759107, 0.9093654], [0.4088787, 0.1505971], [0.0, 0.2440387, 0.5]]
    assert_close(rewards, expected)
    # S over the 7 steps: 4 x 0.4472137 + 0.2000002 + 0 + 1 = 2.9888549 -> /7 = 0.4269793; S < 0.01: B1 only;
    # novel: all but C0.
    assert stats["mean_state_score"] == pytest.approx(0.4269793, abs=TOL)
    assert stats["low_score_fraction"] == pytest.approx(1 / 7)
    assert stats["novel_fraction"] == pytest.approx(6 / 7)


def test_terminal_score_unseen():
    # S(s_t+1) := 1 after the last action: A1 = 0.9093654 + (0.5 - 0.4093654) x (0.2000002 - 1) = 0.8368577;
    # B1 = 0.1505971 + 0.3494029 x (0 - 1) = -0.1988058;  C2 unchanged (S(s3) = 1 already).
    rewards, _ = sspo_step_rewards(hand_group(), hand_table(), terminal_score="unseen")
    assert_close(rewards, [[0.3759107, 0.8368577], [0.4088787, -0.1988058], [0.0, 0.2440387, 0.5]])
    # Every last step of the hand case is a singleton, so the advantages do not change.
    assert_close(helpers.group_credit("3spo", hand_group(), state_scores=hand_table(), terminal_score="unseen"),
                 helpers.group_credit("3spo", hand_group(), state_scores=hand_table()))


def keyed(state: str, reached: str | None = None, reward: float = 0.0) -> Step:
    """A step acting from state key `state`; `reached`: the `state_key` signal's key after its action."""
    recorded = Step(observation=f"view of {state}", action_text="act", reward=reward, state_key=state)
    if reached is not None:
        recorded.signals["state_key"] = Transition(state, reached)
    return recorded


def test_the_state_after_the_last_action_is_looked_up_in_the_table():
    # The 3SPO code scores s_{t+1} from its table whatever it is (compute_3spo_step_reward: get_score(h(next obs))).
    # Hand table as above. A: s0 -> s1 -> (its last action reaches "goal", never seen: S = 1), success.
    # B: s0 -> s1 -> (reaches s2: N = 12, N⁺ = 0, S = 0), failure; no episode of the group acts from s2.
    #   A0 = B0 = 0.3351600 + 0.1648400 x (0.4472137 - 0.2000002) = 0.3759107   (siblings at s0: A = 0)
    #   A1 = ω(s1)·1 + (0.5 - ω(s1))·(S(s1) - S(goal)) + 0.5 = 0.4093654 + 0.0906346 x (0.2000002 - 1) + 0.5 = 0.8368577
    #   B1 = 0.4093654 + 0.0906346 x (0.2000002 - 0) = 0.4274923
    #   siblings at s1: mean 0.6321750 -> mean_norm A1 = +0.2046827, B1 = -0.2046827.
    # (Before: S(s_t+1) := S(s_t) for a state nobody of the group acted from: A1 = 0.9093654, B1 = 0.4093654, ±0.25.)
    group = group_of(episode(keyed("s0"), keyed("s1", reached="goal", reward=1.0), success=True),
                     episode(keyed("s0"), keyed("s1", reached="s2")))
    rewards, _ = sspo_step_rewards(group, hand_table())
    assert_close(rewards, [[0.3759107, 0.8368577], [0.3759107, 0.4274923]])
    assert_close(helpers.group_credit("3spo", group, state_scores=hand_table()), [[0.0, 0.2046827], [0.0, -0.2046827]])
    # terminal_score only applies where nothing is recorded: it changes nothing here.
    assert sspo_step_rewards(group, hand_table(), terminal_score="unseen")[0] == rewards
    # An action that leaves the state unchanged (s1 -> s1) is not novel: 0 + 0.0906346 x (S(s1) - S(s1)) = 0.
    stuck = group_of(episode(keyed("s0"), keyed("s1", reached="s1")))
    assert_close(sspo_step_rewards(stuck, hand_table())[0], [[0.3759107, 0.0]])
    # Without state keys, h(s) is the observation: the next observation is looked up (s2's S = 0 again).
    last = step("s1")
    last.next_observation = "s2"
    assert_close(sspo_step_rewards(group_of(episode(step("s0"), last)), hand_table())[0], [[0.3759107, 0.4274923]])


def test_hand_computed_advantages():
    advantages, stats = helpers.group_credit_and_stats("3spo", hand_group(), state_scores=hand_table())
    assert_close(advantages, [[0.1437037, 0.0], [0.1766717, 0.0], [-0.3322070, 0.0118317, 0.0]])
    # mean R (before the penalty) = (0.3759107 + 0.9093654 + 0.4088787 + 0.1505971 + 0 + 0.2440387 + 0.5) / 7
    assert stats["mean_step_reward"] == pytest.approx(0.3698272, abs=TOL)
    assert stats["singleton_fraction"] == pytest.approx(3 / 4)  # s1, s2, s3 of 4 sibling groups


def test_hand_computed_mean_std_norm():
    advantages = helpers.group_credit("3spo", hand_group(), state_scores=hand_table(), sspo_mode="mean_std_norm")
    assert_close(advantages, [[0.6177037, 0.0], [0.7594153, 0.0], [-1.4279770, 0.0508580, 0.0]])


def test_hand_computed_episode_term():
    # w_E = 1, mean_norm: returns [1, 0, 0], mean 1/3 -> A^E = [0.6666667, -0.3333333, -0.3333333] on every step.
    advantages = helpers.group_credit("3spo", hand_group(), state_scores=hand_table(), episode_advantage_w=1.0)
    expected = [[0.1437037 + 0.6666667, 0.6666667], [0.1766717 - 0.3333333, -0.3333333],
                [-0.3322070 - 0.3333333, 0.0118317 - 0.3333333, -0.3333333]]
    assert_close(advantages, expected)


def test_paper_alpha_makes_the_score_almost_binary():
    # α = 50, t = 1001 -> λ = 50·log 1001 = 345.39 (docs/methods/3spo.md: S ≈ 0 once a state ever led to success).
    table = StateScoreTable(scope="global", t=1001)
    table.counts = {repr("rare win"): [10, 1], repr("losing"): [9, 0], repr("lost"): [10, 0], repr("good"): [20, 3]}
    # rare win: SR = 1/10.000001, N_fail 9 < 10 -> exp(-34.539) = 9.95e-16
    assert table.score("rare win") == pytest.approx(9.95e-16, rel=1e-3)
    assert table.score("losing") == 1.0  # never succeeded, fewer than ξ = 10 failures
    assert table.score("lost") == 0.0  # 10 failures, SR 0 <= ζ: the indicator is 0
    assert table.score("good") < 1e-20  # SR 0.15 > ζ: exp(-345.39 x 0.15) = 3e-23
    assert table.score("unseen") == 1.0


# ---------------------------------------------------------------- the table: updates and persistence


def test_update_counts_distinct_states_once_per_episode():
    table = StateScoreTable(alpha=1.0)
    won = episode(step("s0"), step("s1"), step("s0"), success=True)  # s0 twice: counted once
    lost = episode(step("s0"))
    assert table.update([group_of(won, lost, Trajectory(task={}))]) == 2  # the zero-step episode is not counted
    assert (table.visits("s0", "t"), table.successes("s0", "t")) == (2, 1)
    assert (table.visits("s1", "t"), table.successes("s1", "t")) == (1, 1)
    assert table.t == 3
    # Scope "task": the same state of another task is another entry.
    assert table.visits("s0", "other task") == 0
    global_table = StateScoreTable(scope="global")
    global_table.update([group_of(won), Group(task={"task_id": "u"}, trajectories=[lost])])
    assert global_table.visits("s0") == 2


def test_state_keys_are_preferred_to_observations():
    first, second = step("view 1"), step("view 2")
    first.state_key = second.state_key = (2, 3)
    table = StateScoreTable()
    table.update([group_of(episode(first), episode(second))])
    assert table.visits((2, 3), "t") == 2 and table.visits("view 1", "t") == 0


def test_table_save_load_round_trip(tmp_path):
    table = hand_table()
    table.update([hand_group()])
    path = str(tmp_path / STATE_SCORES_NAME)
    table.save(path)
    loaded = StateScoreTable(alpha=1.0)
    loaded.load_counts(path)
    assert loaded.counts == table.counts and loaded.t == table.t == 8
    assert loaded.score("s0", "t") == table.score("s0", "t")
    with open(path) as handle:
        data = json.load(handle)
    assert data["format"] == state_score.TABLE_FORMAT and data["hyperparameters"]["alpha"] == 1.0
    with pytest.raises(ValueError, match="scope='task'.*scope='global'"):
        StateScoreTable(scope="global").load_counts(path)
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match="not a 3SPO state-score table"):
        StateScoreTable().load_counts(str(other))


# ---------------------------------------------------------------- properties


def test_identical_episodes_give_zero():
    # Same states, same outcome, any table: every sibling group has equal rewards -> every advantage exactly 0.
    for success in (False, True):
        group = group_of(*(episode(step("s0"), step("s1"), step("s2"), success=success) for _ in range(4)))
        for table in (None, hand_table()):
            for mode in ("mean_norm", "mean_std_norm"):
                assert helpers.group_credit("3spo", group, state_scores=table, sspo_mode=mode) == [[0.0, 0.0, 0.0]] * 4


def test_all_equal_rewards_still_separate_novel_from_stuck_steps():
    # Documented behaviour: equal environment rewards do not zero 3SPO's credit, which rewards novelty and score
    # changes. Empty table (S = 1, ω = 0.5), both fail: a step that moves gets R = 0.5, one that stays (s0 -> s0)
    # gets 0: siblings at s0 [0.5 (A0), 0 (B0), 0.5 (B1)], mean 1/3 -> A0 1/6, B0 -1/3, B1 1/6.
    group = group_of(episode(step("s0"), step("s1")), episode(step("s0"), step("s0"), step("s2")))
    assert_close(helpers.group_credit("3spo", group, invalid_action_penalty=0.0), [[1 / 6, 0.0], [-1 / 3, 1 / 6, 0.0]])


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_permuting_trajectories_permutes_advantages(mode):
    rng = random.Random(0)
    trajectories = [
        episode(*(step(f"s{rng.randrange(4)}", valid=rng.random() > 0.2) for _ in range(rng.randint(1, 5))),
                success=rng.random() < 0.5)
        for _ in range(6)
    ]
    order = [3, 0, 5, 1, 4, 2]
    table = hand_table()
    base = helpers.group_credit("3spo", group_of(*trajectories), state_scores=table, sspo_mode=mode, episode_advantage_w=0.5)
    permuted = helpers.group_credit("3spo", group_of(*(trajectories[i] for i in order)), state_scores=table, sspo_mode=mode, episode_advantage_w=0.5)
    for row_p, row_b in zip(permuted, [base[i] for i in order], strict=True):
        assert row_p == pytest.approx(row_b, abs=1e-12)


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("episode_weight", [0.0, 1.0])
def test_edge_cases_give_finite_advantages(mode, episode_weight):
    options = {"sspo_mode": mode, "episode_advantage_w": episode_weight}
    assert helpers.group_credit("3spo", group_of(), **options) == []
    assert helpers.group_credit("3spo", group_of(Trajectory(task={})), **options) == [[]]
    # A group of one episode: every sibling group is a singleton (no repeated state) -> 0.
    assert helpers.group_credit("3spo", group_of(episode(step("s0"), step("s1"), success=True)), **options) == [[0.0, 0.0]]
    mixed = helpers.group_credit("3spo", group_of(Trajectory(task={}), episode(step("s0")), episode(step("s0"))), **options)
    assert [len(row) for row in mixed] == [0, 1, 1] and all_finite(mixed)
    invalid = group_of(episode(step("s0", valid=False)), episode(step("s0", valid=False), step("s0", valid=False)))
    advantages = helpers.group_credit("3spo", invalid, state_scores=hand_table(), **options)
    assert all_finite(advantages) and [len(row) for row in advantages] == [1, 2]


def test_bad_inputs_are_rejected():
    group = hand_group()
    with pytest.raises(ValueError, match="mode"):
        helpers.group_credit("3spo", group, sspo_mode="std")
    with pytest.raises(ValueError, match="terminal_score"):
        helpers.group_credit("3spo", group, terminal_score="final")
    with pytest.raises(ValueError, match="episode_weight"):
        helpers.group_credit("3spo", group, episode_advantage_w=float("inf"))
    with pytest.raises(ValueError, match="non-finite"):
        helpers.group_credit("3spo", group_of(episode(step("s0", reward=float("nan")))))
    with pytest.raises(ValueError, match="scope"):
        StateScoreTable(scope="world")
    for name in ("alpha", "xi", "zeta", "omega_k"):
        with pytest.raises(ValueError, match=name):
            StateScoreTable(**{name: -1.0})
    with pytest.raises(ValueError, match="task_id"):
        StateScoreTable().score("s0")


def test_config_validation(tmp_path):
    def config(**overrides):
        return SSPOConfig(output_dir=str(tmp_path), report_to="none", **overrides)

    assert config().invalid_action_penalty == 0.1
    for field, value in [("state_scope", "world"), ("sspo_mode", "std"), ("score_alpha", -1.0), ("score_xi", -1.0),
                         ("score_zeta", float("nan")), ("omega_k", -0.1), ("score_eps", 0.0),
                         ("episode_advantage_w", float("inf"))]:
        with pytest.raises(ValueError, match=field):
            config(**{field: value})


def test_registered_as_3spo():
    assert credit_base.get_estimator("3spo").function is sspo_advantages


def test_docstring_examples():
    for module in (credit_sspo, trainer_sspo):
        assert doctest.testmod(module).failed == 0


# ---------------------------------------------------------------- the "3spo" method name and the configs


@pytest.fixture
def registered(monkeypatch):
    return METHODS["3spo"]  # registered by SSPOTrainer's own declaration


def test_method_name(registered):
    method = get_method("3spo")
    assert method.trainer_class is SSPOTrainer and method.env_capabilities == ("state_key",)


@pytest.mark.parametrize("name", ["3spo_alfworld", "3spo_webshop", "3spo_sokoban_tiny"])
def test_configs_parse(name, registered):
    from trl import ModelConfig, TrlParser

    from trl_agents.run import RunArguments

    path = os.path.join(CONFIGS, f"{name}.yaml")
    with open(path) as handle:
        assert yaml.safe_load(handle)["method"] == "3spo"  # a string, not a number, for YAML
    run, config, model = TrlParser((RunArguments, SSPOConfig, ModelConfig)).parse_args_and_config(["--config", path])
    assert isinstance(config, SSPOConfig) and config.env_name and (run.tiny_model or model.model_name_or_path)
    if not run.tiny_model:  # the paper setting
        assert (config.score_alpha, config.score_xi, config.score_zeta, config.omega_k) == (50.0, 10.0, 0.1, 0.1)
        assert config.generation_batch_size == 128 and config.num_generations == 8 and config.beta == 0.01


# ---------------------------------------------------------------- trainer


def make_config(tmp_path, **overrides):
    return tiny_training_config(SSPOConfig, tmp_path / "out", **overrides)


METRICS = ["3spo/mean_step_reward", "3spo/mean_state_score", "3spo/low_score_fraction", "3spo/novel_fraction",
           "3spo/singleton_fraction", "3spo/table_size", "3spo/episodes_counted"]


@pytest.mark.slow
def test_two_training_steps(tiny_model, tokenizer, tmp_path):
    trainer = SSPOTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=TASKS, processing_class=tokenizer)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter moved: advantages were all zero or the loss was disconnected"
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == 2
    for key in METRICS:
        assert key in logs[0], key
    # 2 rollouts x 2 tasks x 4 episodes counted; every task visits its states (seed, turn 0) and (seed, turn 1).
    assert trainer.state_scores.t == 17
    assert logs[0]["3spo/episodes_counted"] == 8 and logs[1]["3spo/episodes_counted"] == 16
    assert logs[0]["3spo/mean_state_score"] == 1.0  # the first rollout reads an empty table
    # Every episode acts from (seed, 0) and (seed, 1): 2 entries per task drawn, 4 or 8 visits each, 16 x 2 in all.
    counts = trainer.state_scores.counts
    assert len(counts) == logs[1]["3spo/table_size"] and len(counts) in (4, 6, 8)
    assert all(visits in (4, 8) for visits, _ in counts.values()) and sum(v for v, _ in counts.values()) == 32
    group = trainer.last_rollout.groups[0]
    assert trainer.state_scores.visits((group.task["seed"], 0), group.task_id) in (4, 8)
    # The rollout records the state each action reached (the `state_key` signal): the last step of an episode too.
    for trajectory in group.trajectories:
        last = trajectory.steps[-1]
        assert last.signals["state_key"].before == last.state_key
        assert last.signals["state_key"].after == (group.task["seed"], len(trajectory.steps))


@pytest.mark.slow
def test_checkpoints_carry_the_table_and_resuming_restores_it(tiny_model, tokenizer, tmp_path):
    config = make_config(tmp_path, save_strategy="steps", save_steps=1)
    trainer = SSPOTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
    trainer.train()
    out = config.output_dir
    for step_index, t in [(1, 9), (2, 17)]:
        saved = StateScoreTable(scope=config.state_scope)
        saved.load_counts(os.path.join(out, f"checkpoint-{step_index}", STATE_SCORES_NAME))
        assert saved.t == t
    assert saved.counts == trainer.state_scores.counts  # checkpoint-2 holds the final table
    # A fresh trainer starts empty; resuming from the last checkpoint restores the table, then adds one rollout.
    resumed = SSPOTrainer(model=tiny_model, args=make_config(tmp_path, save_strategy="steps", save_steps=1,
                                                             max_steps=3),
                          train_dataset=TASKS, processing_class=tokenizer)
    assert resumed.state_scores.t == 1
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3 and resumed.state_scores.t == 17 + 8
    for key, (visits, wins) in saved.counts.items():
        assert resumed.state_scores.counts[key][0] >= visits and resumed.state_scores.counts[key][1] >= wins
    # load_state_scores reads any checkpoint; a directory without a table leaves the table and says so.
    assert resumed.load_state_scores(os.path.join(out, "checkpoint-1")) and resumed.state_scores.t == 9
    assert not resumed.load_state_scores(str(tmp_path))


@register_env
class StatelessEnv(AgentEnv):
    """A toy env without state keys."""

    name = "test-3spo-stateless"
    instructions = "Say anything."
    task_keys = ("seed",)

    def reset(self, task):
        return "Go."

    def step(self, action_text):
        return "Done.", 0.0, True, {"valid": True, "success": False}


def test_env_without_state_keys_is_rejected_at_start_up(tiny_model, tokenizer, tmp_path):
    tasks = [{"env": "test-3spo-stateless", "seed": s} for s in range(8)]
    with pytest.raises(ValueError, match="SSPOTrainer needs environments with state_key.*'test-3spo-stateless'.*lacks"):
        SSPOTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=tasks, processing_class=tokenizer)
