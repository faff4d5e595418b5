"""EchoTrapMonitor (trl_agents.callbacks.collapse): the rollout diagnostics by hand, the warning rules, the monitor
firing on a scripted collapse (entropy -> 0, identical episodes) and staying quiet on a healthy run, and RAGEN's
reward-variance filter acting on the trainer's groups."""

from __future__ import annotations

import logging
import random

import pytest

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
from trl_agents.callbacks import EchoTrapMonitor, RewardVarianceFilter
from trl_agents.callbacks.collapse import distinct_fraction, group_reward_std, rollout_totals, variance_keep
from trl_agents.rollout.generators import GenerationOutput
from trl_agents.testing import tiny_training_config
from trl_agents.trajectory import Group, Step, Trajectory


def episode(actions, rewards, logprob=-1.0, valid=True):
    steps = [Step("o", a, action_ids=[1, 2], action_logprobs=[logprob, logprob], reward=r, valid=valid)
             for a, r in zip(actions, rewards, strict=True)]
    return Trajectory(task={}, steps=steps)


# ---------------------------------------------------------------- by hand


def test_rollout_diagnostics_by_hand():
    mixed = Group({}, [episode(["a"], [1.0]), episode(["b"], [0.0])])  # std of [1, 0] = 0.7071; 2 distinct
    echo = Group({}, [episode(["b"], [0.0], logprob=0.0, valid=False), episode(["b"], [0.0], logprob=0.0)])
    assert group_reward_std(mixed) == pytest.approx(0.70711, abs=1e-5) and group_reward_std(echo) == 0.0
    assert distinct_fraction(mixed) == 1.0 and distinct_fraction(echo) == 0.0
    assert distinct_fraction(Group({}, [episode(["a"], [1.0])])) is None
    totals = rollout_totals([mixed, echo, Group({}, [])])  # the empty group counts nowhere
    assert totals["reward_std"] == pytest.approx((0.70711, 2), abs=1e-5)
    assert totals["zero_std_fraction"] == (1, 2)
    assert totals["rollout_entropy"] == (4.0, 8)  # −Σ logp = 4 × 1.0 over 8 tokens: 0.5 nats per token
    assert totals["distinct_trajectories"] == (1.0, 2) and totals["valid_action_rate"] == (3, 4)


def test_variance_filter_rules():
    stds = [0.0, 0.5, 0.2, 0.4, None]
    assert variance_keep(stds, min_std=0.3) == [False, True, False, True, False]
    assert variance_keep(stds, top_fraction=0.25) == [False, True, False, False, False]  # ceil(0.25 × 4) = 1
    assert variance_keep(stds, min_std=0.3, top_fraction=0.75) == [False, True, False, True, False]
    assert variance_keep([0.0, 0.0], min_std=0.1) == [True, True]  # bypass: never an empty batch
    assert variance_keep([0.0, 0.0], min_std=0.1, bypass=False) == [False, False]
    groups = [Group({}, [episode(["a"], [1.0]), episode(["b"], [0.0])]), Group({}, [episode(["b"], [0.0])] * 2)]
    keep = RewardVarianceFilter(min_std=1e-6)
    assert keep(groups) == [True, False] and keep.last == {"filtered_group_fraction": 0.5, "filter_bypassed": 0.0}
    assert RewardVarianceFilter(min_std=1.0)(groups) == [True, True]
    with pytest.raises(ValueError, match="filter_top_fraction"):
        RewardVarianceFilter(top_fraction=0.0)


def test_warning_rules_baseline_patience_and_spikes(caplog):
    monitor = EchoTrapMonitor(baseline_logs=2, patience=2)
    healthy = {"reward_std": 0.5, "rollout_entropy": 1.0, "entropy": 2.0, "distinct_trajectories": 1.0,
               "valid_action_rate": 0.9, "zero_std_fraction": 0.2, "grad_norm": 1.0}
    for step in range(5):
        assert monitor.check(dict(healthy), step) == []
    collapsed = dict(healthy, rollout_entropy=0.1, reward_std=0.05)  # 0.1 <= 0.2 × 1.0 and 0.05 <= 0.2 × 0.5
    with caplog.at_level(logging.WARNING, logger="trl_agents.callbacks.collapse"):
        assert monitor.check(dict(collapsed), 5) == []  # patience 2: not yet
        assert monitor.check(dict(collapsed), 6) == ["reward_std", "rollout_entropy"]
        assert monitor.check(dict(collapsed), 7) == ["reward_std", "rollout_entropy"]
    assert sum("echo trap" in r.message for r in caplog.records) == 2  # once per condition
    assert monitor.check(dict(healthy), 8) == []  # recovered: the streaks reset
    spike = EchoTrapMonitor(baseline_logs=3, patience=1)
    for value in (1.0, 1.2, 0.8):
        assert spike.check({"grad_norm": value}) == []
    assert spike.check({"grad_norm": 12.5}) == ["grad_spike"]  # > 10 × median(1.0, 1.2, 0.8) = 10
    valid = EchoTrapMonitor(baseline_logs=1, patience=1)
    valid.check({"valid_action_rate": 1.0, "zero_std_fraction": 0.95})
    assert valid.check({"valid_action_rate": 0.6, "zero_std_fraction": 0.95}) == ["valid_action_rate",
                                                                                  "zero_std_fraction"]
    with pytest.raises(ValueError, match="unknown conditions"):
        EchoTrapMonitor(stop_on=("boredom",))


# ---------------------------------------------------------------- on training runs


class PhasedGenerator:
    """Varied answers (reward variance, sampled log-prob −1.2 per token) for `varied_calls` generation calls, then
    the same answer "b" (reward 0) with log-prob 0: a policy whose entropy has dropped to 0."""

    def __init__(self, tokenizer, varied_calls: int):
        self.tokenizer, self.varied_calls = tokenizer, varied_calls
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.calls = 0

    def generate(self, prompts, sampling):
        rng = random.Random(self.calls)
        collapsed = self.calls >= self.varied_calls
        self.calls += 1
        ids, logprobs = [], []
        for _ in prompts:
            text = "b" if collapsed else rng.choice(["a", "b", "ab", "bb"])
            row = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            ids.append(row)
            logprobs.append([0.0 if collapsed else -1.2] * len(row))
        return GenerationOutput(ids, logprobs)


def run(tiny_model, tokenizer, tmp_path, varied_calls, steps=6, **monitor_options):
    config = tiny_training_config(AgentGRPOConfig, tmp_path, env_name="test-keyword", max_steps=steps, max_turns=2,
                                  num_generations=2, per_device_train_batch_size=8, learning_rate=1e-5)
    tasks = [{"env": "test-keyword", "seed": s} for s in range(8)]
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=tasks, processing_class=tokenizer,
                               generator=PhasedGenerator(tokenizer, varied_calls))
    monitor = EchoTrapMonitor(trainer, baseline_logs=2, patience=2, **monitor_options)
    trainer.add_callback(monitor)
    trainer.train()
    return trainer, monitor


def test_the_monitor_fires_on_a_scripted_collapse(tiny_model, tokenizer, tmp_path, caplog):
    # Steps 1-3 varied (2 generation calls per 2-turn rollout), steps 4-6 collapsed: reported from step 5 on.
    with caplog.at_level(logging.WARNING, logger="trl_agents.callbacks.collapse"):
        trainer, monitor = run(tiny_model, tokenizer, tmp_path, varied_calls=6, stop_on=("rollout_entropy",))
    fired = {alert["condition"] for alert in monitor.alerts}
    assert {"rollout_entropy", "distinct_trajectories", "reward_std", "zero_std_fraction"} <= fired
    assert min(alert["step"] for alert in monitor.alerts) == 5
    assert trainer.state.global_step == 5  # stop_on: training stopped at the first report
    assert any("echo trap" in r.message and "rollout_entropy" in r.message for r in caplog.records)
    logged = [h for h in trainer.state.log_history if "collapse/rollout_entropy" in h]
    assert logged[0]["collapse/rollout_entropy"] == pytest.approx(1.2)  # −logp per token, varied phase
    assert logged[-1]["collapse/rollout_entropy"] == 0.0 and logged[-1]["collapse/distinct_trajectories"] == 0.0


def test_the_monitor_stays_quiet_on_a_healthy_run(tiny_model, tokenizer, tmp_path):
    trainer, monitor = run(tiny_model, tokenizer, tmp_path, varied_calls=10**6)
    assert trainer.state.global_step == 6
    assert monitor.alerts == [] and monitor.warned == set()
    assert len([h for h in monitor.history if "reward_std" in h]) == 6


class TwoTasks:
    """Task 0: its episodes answer "a", "b", "a", ... (returns differ); task 1: always "b" (no variance)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.count = 0

    def generate(self, prompts, sampling):
        ids, logprobs = [], []
        for prompt in prompts:
            task = self.tokenizer.decode(prompt).rsplit("task ", 1)[1].split(".")[0]
            self.count += 1
            text = ("a" if self.count % 2 else "b") if task == "0" else "b"
            row = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            ids.append(row)
            logprobs.append([-0.5] * len(row))
        return GenerationOutput(ids, logprobs)


@pytest.mark.parametrize("options", [{"filter_top_fraction": 0.5}, {"filter_min_std": 1e-6}])
def test_the_variance_filter_leaves_the_flat_group_out_of_training(tiny_model, tokenizer, tmp_path, options):
    config = tiny_training_config(AgentGRPOConfig, tmp_path, env_name="test-keyword", max_steps=1, max_turns=2,
                                  num_generations=2, per_device_train_batch_size=4)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, processing_class=tokenizer, generator=TwoTasks(tokenizer),
                               train_dataset=[{"env": "test-keyword", "seed": s} for s in (0, 1)])
    monitor = EchoTrapMonitor(trainer, **options)
    assert trainer.group_filters == [monitor.filter]
    trainer.add_callback(monitor)
    trainer.train()
    log = next(h for h in trainer.state.log_history if "train_rows" in h)
    assert log["train_rows"] == 4  # task 0's 2 episodes × 2 turns; task 1's 4 rows left out (8 without the filter)
    assert log["collapse/filtered_group_fraction"] == 0.5 and log["collapse/filter_bypassed"] == 0.0
    assert log["rollout/episodes"] == 4 and log["frac_reward_zero_std"] == 0.5  # metrics still see both groups
