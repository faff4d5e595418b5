"""The Dark Room study (arXiv 2607.21273): the Proposition with our GRPO estimator, the shaping math, the `predict`
environment wrapper, the collapse monitor, and 2 training steps of every arm on the tiny model.

Hand cases from docs/methods/dark_room.md#hand-computed-case.
"""

from __future__ import annotations

import logging
import math

import pytest
from datasets import Dataset
from helpers import group_credit, train_and_check_moved

from trl_agents.callbacks import DarkRoomMonitor
from trl_agents.distill.dark_room import (
    collapse_diagnostics,
    dense_share,
    potentials,
    prediction_similarity,
    shaped_group,
    shaping_terms,
    within_variance,
)
from trl_agents.envs import AgentEnv, get_env_class, make_env, register_env
from trl_agents.envs.parsing import extract_answer
from trl_agents.envs.prediction import PredictionEnv, extract_prediction, strip_prediction
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.dark_room import DarkRoomConfig, DarkRoomTrainer
from trl_agents.trajectory import Group, RolloutBatch, Step, Trajectory


def group_of(returns, success=None, **step_fields):
    """One single-step episode per return."""
    return Group(task={}, trajectories=[
        Trajectory(task={}, steps=[Step("o", "a", reward=r, **step_fields)], success=bool(success and r > 0))
        for r in returns
    ])


# ---------------------------------------------------------------- the Proposition


def test_proposition_z_scored_advantages_do_not_depend_on_c():
    # All-fail group (R ≡ 0) with prediction scores p = [0.2, 0.4, 0.6]: R' = c·p.
    # mean c·0.4; Bessel std of c·p = c·sqrt(((−.2)² + 0 + .2²)/2) = c·0.2; TRL/our ε = 1e-4.
    p = [0.2, 0.4, 0.6]
    z1 = group_credit("grpo", group_of([1.0 * x for x in p]))  # c = 1:    ±0.2/(0.2 + 1e-4)   = ±0.99950
    z001 = group_credit("grpo", group_of([0.01 * x for x in p]))  # c = 0.01: ±0.002/(0.002 + 1e-4) = ±0.95238
    assert [a[0] for a in z1] == pytest.approx([-0.9995, 0.0, 0.9995], abs=1e-4)
    assert [a[0] for a in z001] == pytest.approx([-0.9524, 0.0, 0.9524], abs=1e-4)
    # They differ only through ε: with ε → 0 both are exactly (p − p̄)/σ_p = [−1, 0, 1]
    tiny = 1e-12
    for c in (1.0, 0.01):
        values = [a[0] for a in group_credit("grpo", group_of([c * x for x in p]), eps=tiny)]
        assert values == pytest.approx([-1.0, 0.0, 1.0], abs=1e-8)
    # Mean-only (scale_rewards="none"): A = c·(p − p̄) scales with c
    assert [a[0] for a in group_credit("grpo", group_of(p), scale_rewards="none")] == pytest.approx([-0.2, 0.0, 0.2])
    assert [a[0] for a in group_credit("grpo", group_of([0.01 * x for x in p]), scale_rewards="none")] == pytest.approx(
        [-0.002, 0.0, 0.002])


# ---------------------------------------------------------------- shaping math


def test_shaping_hand_case():
    # acc = [0.2, 0.4, 0.9]: Φ (running mean) = [0, 0.2, 0.3, 0.5]; γ = 1: F = [0.2, 0.1, 0.2], Σ F = 0.5 = mean acc
    assert potentials([0.2, 0.4, 0.9]) == pytest.approx([0.0, 0.2, 0.3, 0.5])
    assert shaping_terms([0.2, 0.4, 0.9]) == pytest.approx([0.2, 0.1, 0.2])
    # γ = 0.9: F_t = 0.9·Φ_{t+1} − Φ_t = [0.18, 0.27 − 0.2, 0.45 − 0.3] = [0.18, 0.07, 0.15]
    assert shaping_terms([0.2, 0.4, 0.9], gamma=0.9) == pytest.approx([0.18, 0.07, 0.15])
    # last_accuracy: Φ = [0, .2, .4, .9], γ = 1: F = [.2, .2, .5], Σ = acc of the last prediction
    assert shaping_terms([0.2, 0.4, 0.9], kind="last_accuracy") == pytest.approx([0.2, 0.2, 0.5])
    assert shaping_terms([]) == []
    with pytest.raises(ValueError, match="gamma must be in"):
        shaping_terms([0.5], gamma=1.5)


def test_shaped_group_adds_c_times_f_to_the_step_rewards_and_keeps_the_original():
    group = Group(task={}, trajectories=[Trajectory(task={}, steps=[Step("o", "a", reward=0.0),
                                                                    Step("o", "b", reward=1.0)])])
    shaped = shaped_group(group, [[0.2, 0.3]], coef=0.5)
    assert [s.reward for s in shaped.trajectories[0].steps] == pytest.approx([0.1, 1.15])
    assert shaped.trajectories[0].episode_return == pytest.approx(1.25)  # R + c·ΣF = 1 + 0.5·0.5
    assert [s.reward for s in group.trajectories[0].steps] == [0.0, 1.0]  # the record is untouched
    with pytest.raises(ValueError, match="shaping terms for a trajectory"):
        shaped_group(group, [[0.2]], coef=1.0)


def test_similarity_cases():
    assert prediction_similarity("F P\nF G", "f p f g") == 1.0  # case and whitespace do not count
    assert prediction_similarity("abcd", "abce") == pytest.approx(0.75)  # 2·3/8
    assert prediction_similarity("a b", "a c", "token_f1") == pytest.approx(0.5)  # P = R = 1/2
    assert prediction_similarity("x", "x", "exact") == 1.0 and prediction_similarity("x", "y", "exact") == 0.0
    assert prediction_similarity(None, "x") == 0.0 and prediction_similarity("", "") == 1.0
    with pytest.raises(ValueError, match="similarity must be one of"):
        prediction_similarity("a", "a", "cosine")


@pytest.mark.parametrize("returns", [[], [0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
def test_diagnostics_and_advantages_are_finite_on_degenerate_groups(returns):
    # empty, singleton, all-equal (all-success), all-fail groups; and all-invalid steps
    group = group_of(returns, success=True, valid=False)
    for trajectory in group.trajectories:
        trajectory.steps[0].signals = {"prediction_accuracy": 0.5, "prediction_shaping": 0.5}
    stats = collapse_diagnostics([group], horizon=3)
    for value in stats.values():
        assert value is None or math.isfinite(value)
    for values in group_credit("grpo", shaped_group(group, [[0.5]] * len(returns), 1.0)):
        assert all(math.isfinite(v) for v in values)
    shares = dense_share(returns, [0.5] * len(returns))
    assert shares["share"] == 0.0 and shares["dense_variance"] == 0.0
    assert within_variance(returns) == 0.0


def test_dense_share_hand_case():
    # outcomes [0, 1, 0, 1]: Var = 0.25; dense [.1, .1, .1, .3]: mean .15, Var = (3·.0025 + .0225)/4 = 0.0075
    d = dense_share([0, 1, 0, 1], [0.1, 0.1, 0.1, 0.3])
    assert d["dense_variance"] == pytest.approx(0.0075) and d["outcome_variance"] == pytest.approx(0.25)
    assert d["share"] == pytest.approx(0.0075 / 0.2575) and d["ratio"] == pytest.approx(0.03)
    assert dense_share([0, 0, 0], [0.2, 0.4, 0.6])["share"] == 1.0  # all-fail: all of it
    assert dense_share([0, 0, 0], [0.2, 0.4, 0.6])["ratio"] is None


# ---------------------------------------------------------------- the environment wrapper


@register_env
class Recorder(AgentEnv):
    """Records what it is given."""

    name = "test-recorder"
    instructions = "Say anything."

    def reset(self, task):
        self.seen = []
        return "start"

    def step(self, action_text):
        self.seen.append(action_text)
        return "same", 0.0, False, {"valid": True}

    def state_key(self):
        return len(self.seen)


def test_the_inner_environment_receives_only_the_action():
    env = PredictionEnv(inner="test-recorder")
    assert env.reset({}) == "start" and "<predict>" in env.instructions and "Say anything." in env.instructions
    _, _, _, info = env.step("<action>go</action>\n<predict>same</predict>")
    assert env.inner.seen == ["<action>go</action>"] and info["prediction"] == "same"
    assert env.step("go")[3]["prediction"] is None and env.inner.seen[-1] == "go"
    assert env.supports("state_key") and not env.supports("verify") and env.state_key() == 2
    assert extract_prediction("<predict>a</predict> x <PREDICT> b </PREDICT>") == "b"  # the last block
    assert strip_prediction("<predict>a</predict>go<predict>b") == "go"  # an unclosed block runs to the end
    rows = get_env_class("predict").task_split("train", 2, inner="frozenlake")
    assert [r["env"] for r in rows] == ["predict", "predict"] and rows[0]["seed"] == 0
    assert make_env("predict", inner="frozenlake").reset(rows[0]) == make_env("frozenlake").reset(rows[0])
    with pytest.raises(ValueError, match="cannot wrap itself"):
        PredictionEnv(inner="predict")


def test_the_wrapped_solver_plan_carries_exact_predictions_for_warm_starts():
    from trl_agents.warmstart import solver_demonstrations

    task = get_env_class("predict").task_split("train", 1, inner="frozenlake")[0]
    env = make_env("predict", inner="frozenlake")
    env.reset(task)
    plan = env.optimal_plan()
    key = env.state_key()
    assert plan and env.state_key() == key  # planning did not move the environment
    for answer in plan:  # each prediction is exactly the observation the move leads to
        observation, _, done, _ = env.step(answer)
        assert extract_prediction(answer) == observation
    assert done
    rows = solver_demonstrations("predict", [task], env_kwargs={"inner": "frozenlake"}, history_length=0)
    assert [r["completion"][0]["content"] for r in rows] == plan
    assert "<predict>" in rows[0]["prompt"][0]["content"]  # the system message asks for the format


# ---------------------------------------------------------------- the monitor


def rollout_of(groups):
    return RolloutBatch(groups)


def test_monitor_warns_once_per_condition(caplog):
    # All-fail groups whose episodes run to the horizon (3 steps) with accurate predictions: both conditions hold.
    def episode(acc, shaping):
        steps = [Step("o", "a", signals={"prediction_accuracy": acc, "prediction_shaping": shaping})
                 for _ in range(3)]
        return Trajectory(task={}, steps=steps)

    groups = [Group(task={}, trajectories=[episode(0.95, 0.1), episode(0.99, 0.2)]) for _ in range(2)]
    monitor = DarkRoomMonitor(horizon=3)
    with caplog.at_level(logging.WARNING, logger="trl_agents.callbacks.dark_room"):
        first = monitor.observe(rollout_of(groups), step=1)
        monitor.observe(rollout_of(groups), step=2)
    assert first["all_fail_fraction"] == 1.0 and first["dense_share"] == 1.0 and first["length_ratio"] == 1.0
    assert first["prediction_accuracy"] == pytest.approx(0.97) and first["success_rate"] == 0.0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("while success" in m for m in messages) == 1  # collapse, once
    assert sum("within-group variance" in m for m in messages) == 1  # dense share, once
    assert monitor.warned == {"collapse", "dense_share"} and len(monitor.history) == 2


def test_monitor_is_quiet_on_a_healthy_run_and_logs_through_on_log(caplog):
    steps = [Step("o", "a", reward=1.0, signals={"prediction_accuracy": 0.3})]
    group = Group(task={}, trajectories=[Trajectory(task={}, steps=steps, success=True),
                                         Trajectory(task={}, steps=[Step("o", "b")])])

    class Bare:  # a trainer without log_metric
        last_rollout = rollout_of([group])
        args = type("A", (), {"max_turns": 4})()

    monitor = DarkRoomMonitor(Bare())
    with caplog.at_level(logging.WARNING, logger="trl_agents.callbacks.dark_room"):
        monitor.on_step_end(None, type("S", (), {"global_step": 1})(), None)
        monitor.on_step_end(None, type("S", (), {"global_step": 2})(), None)  # same rollout: not counted twice
    assert not caplog.records and len(monitor.history) == 1
    logs = {}
    monitor.on_log(None, None, None, logs=logs)
    assert logs["dark_room/success_rate"] == 0.5 and logs["dark_room/length_ratio"] == 0.25
    assert logs["dark_room/all_fail_fraction"] == 0.0 and logs["dark_room/dense_share"] == 0.0


# ---------------------------------------------------------------- the trainer


@register_env
class AnswerKeyword(get_env_class("test-keyword")):
    """conftest's toy env, rewarding an answer (the <action> block) that contains the letter a."""

    name = "test-answer-keyword"

    def step(self, action_text):
        return super().step(extract_answer(action_text))


TASKS = [{"env": "predict", "seed": s} for s in range(4)]
ENV_KWARGS = {"inner": "test-answer-keyword"}


def make_trainer(tiny_model, tokenizer, tmp_path, generator=None, **overrides):
    config = tiny_training_config(DarkRoomConfig, tmp_path / "out", max_turns=2, max_completion_length=24,
                                  env_name="predict", env_kwargs=ENV_KWARGS, **overrides)
    return DarkRoomTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list(TASKS * 2),
                           processing_class=tokenizer, generator=generator)


def hand_groups(predictions, observation="Round 1 of task 0."):
    """One all-fail group: episode i predicts `predictions[i]` before the observation that follows."""
    trajectories = []
    for prediction in predictions:
        step = Step("Round 0 of task 0.", f"<action>x</action><predict>{prediction}</predict>", reward=0.0)
        step.next_observation = observation
        trajectories.append(Trajectory(task={}, steps=[step]))
    return [Group(task={}, trajectories=trajectories)]


@pytest.mark.parametrize("scale", ["group", "none"])
def test_reward_arm_advantages_through_the_trainer(scale, tiny_model, tokenizer, tmp_path):
    # predictions with exact-match accuracies [0, 1, 1] → R' = c·acc; z-scored: c-free, mean-only: ∝ c
    results = {}
    for c in (1.0, 0.01):
        trainer = make_trainer(tiny_model, tokenizer, tmp_path, prediction_coef=c, scale_rewards=scale,
                               prediction_similarity="exact", dark_room_monitor=False)
        groups = hand_groups(["nope", "Round 1 of task 0.", "round 1  of task 0."])
        results[c] = [a[0] for a in trainer.compute_advantages(groups)[0]]
        assert [s.signals["prediction_accuracy"] for t in groups[0].trajectories for s in t.steps] == [0.0, 1.0, 1.0]
        assert groups[0].trajectories[1].steps[0].reward == 0.0  # recorded rewards unchanged
    # acc [0, 1, 1]: mean 2/3, Bessel std 0.57735: z = [−1.1547, 0.5774, 0.5774] (ε shifts c = 0.01 slightly)
    if scale == "group":
        assert results[1.0] == pytest.approx([-1.1545, 0.5772, 0.5772], abs=1e-3)
        assert results[0.01] == pytest.approx([-1.1345, 0.5672, 0.5672], abs=1e-3)  # 0.57735c/(0.57735c + 1e-4)
    else:
        assert results[1.0] == pytest.approx([-2 / 3, 1 / 3, 1 / 3])
        assert results[0.01] == pytest.approx([-2 / 300, 1 / 300, 1 / 300])


def test_baseline_arm_scores_but_does_not_shape(tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, dark_room_arm="baseline", prediction_similarity="exact")
    groups = hand_groups(["nope", "Round 1 of task 0.", "x"])
    assert [a[0] for a in trainer.compute_advantages(groups)[0]] == [0.0, 0.0, 0.0]  # R ≡ 0: nothing to learn
    assert groups[0].trajectories[1].steps[0].signals["prediction_accuracy"] == 1.0
    assert "prediction_shaping" not in groups[0].trajectories[1].steps[0].signals


def scripted_predictions(tokenizer):
    """Answers with an action and a prediction; some predictions are right ("Round 1 of task S."), some not."""
    from conftest import ScriptedGenerator

    def policy(prompt, call, row, size):
        text = tokenizer.decode(prompt)
        seed = text.rsplit("of task ", 1)[-1].split(".")[0] if "of task " in text else "0"
        guess = f"Round {call + 1} of task {seed}." if row % 2 == 0 else "Round 9 of task 9."
        return f"<action>{'a' if row % 3 else 'b'}</action><predict>{guess}</predict>"

    return ScriptedGenerator(tokenizer, policy)


@pytest.mark.slow
@pytest.mark.parametrize("arm, scale", [("reward", "group"), ("reward", "none"), ("aux", "group"),
                                        ("placebo", "group"), ("baseline", "group")])
def test_every_arm_trains_two_steps(arm, scale, tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, generator=scripted_predictions(tokenizer),
                           dark_room_arm=arm, scale_rewards=scale)
    assert any(isinstance(c, DarkRoomMonitor) for c in trainer.callback_handler.callbacks)
    logs = train_and_check_moved(trainer)
    for h in logs:
        assert h["dark_room/prediction_rate"] == 1.0  # every answer carried a prediction
        assert 0.0 < h["dark_room/step_accuracy"] < 1.0
        assert 0.0 <= h["dark_room/dense_share"] <= 1.0 and 0.0 <= h["dark_room/all_fail_fraction"] <= 1.0
        assert ("envrl/sp_loss" in h) == (arm in ("aux", "placebo"))
        assert ("dark_room/shaping_return" in h) == (arm == "reward")
        assert all(math.isfinite(v) for v in h.values() if isinstance(v, float))
    if arm == "reward":
        assert logs[0]["dark_room/shaping_return"] > 0
    if arm != "reward":
        assert logs[0]["dark_room/dense_share"] == 0.0


def test_placebo_permutes_the_sp_targets(tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, generator=scripted_predictions(tokenizer),
                           dark_room_arm="placebo")
    rows = [task for task in TASKS for _ in range(trainer.num_generations)]
    trainer.model.train()
    trainer._generate_and_score_completions(rows)
    examples = [sp for sp, _ in trainer.example_signal.examples]
    gold = {}
    for trajectory in trainer.last_rollout.trajectories:
        for step in trajectory.steps:
            gold[tuple(step.prompt_ids)] = step.next_observation
    mismatched = sum(tokenizer.decode(e.target_ids, skip_special_tokens=True).strip() !=
                     next(v for k, v in gold.items() if list(k) == e.prompt_ids[: len(k)]) for e in examples)
    assert len(examples) == 32 and mismatched > 0
    assert all(e is None for _, e in trainer.example_signal.examples)  # SP alone: λ_ID = 0 by default


@pytest.mark.parametrize("field, value, match", [
    ("dark_room_arm", "both", "dark_room_arm must be one of"),
    ("prediction_potential", "sum", "prediction_potential must be one of"),
    ("prediction_similarity", "cosine", "prediction_similarity must be one of"),
    ("prediction_gamma", 1.5, "prediction_gamma must be in"),
    ("prediction_coef", math.inf, "prediction_coef must be a finite number"),
])
def test_config_validation(field, value, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        tiny_training_config(DarkRoomConfig, tmp_path, **{field: value})
    with pytest.raises(ValueError, match="envrl_sp_coef > 0"):
        tiny_training_config(DarkRoomConfig, tmp_path, dark_room_arm="aux", envrl_sp_coef=0.0)


def test_registry_entry():
    method = METHODS["dark_room"]
    assert method.paper == "arXiv 2607.21273" and method.trainer_class is DarkRoomTrainer
