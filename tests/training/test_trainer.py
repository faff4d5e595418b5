"""AgentGRPOTrainer / GiGPOTrainer end to end on the tiny model: both row formats, LoRA, batching, outputs."""

from __future__ import annotations

import glob
import os

import pytest
import torch
from datasets import Dataset

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer, GiGPOConfig, GiGPOTrainer
from trl_agents.envs import get_env_class, register_env
from trl_agents.signals import ModelSignal, register_signal
from trl_agents.testing import tiny_training_config

pytestmark = pytest.mark.slow

TASKS = [{"env": "test-keyword", "seed": s} for s in range(8)]


def make_config(config_class, tmp_path, **overrides):
    return tiny_training_config(config_class, tmp_path / "out", **overrides)


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("row_format", ["step", "conversation"])
@pytest.mark.parametrize("method", ["grpo", "gigpo"])
def test_two_training_steps(method, row_format, tiny_model, tokenizer, tmp_path):
    config_class, trainer_class = {"grpo": (AgentGRPOConfig, AgentGRPOTrainer), "gigpo": (GiGPOConfig, GiGPOTrainer)}[
        method
    ]
    config = make_config(config_class, tmp_path, row_format=row_format)
    trainer = trainer_class(model=tiny_model, args=config, train_dataset=Dataset.from_list(TASKS), processing_class=tokenizer)
    before = snapshot(trainer.model)
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter moved: advantages were all zero or the loss was disconnected"
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == 2
    for key in ["env/success_rate", "env/episode_length", "env/valid_action_rate",
                "credit/zero_advantage_group_fraction", "credit/advantage_by_turn/0", "loss"]:
        assert key in logs[0], key
    assert logs[0]["env/episode_length"] == 2.0
    expected_rows = 8 * 2 if row_format == "step" else 8
    assert logs[0]["train_rows"] == expected_rows
    if method == "gigpo":
        assert logs[0]["gigpo/mean_anchor_group_size"] == 4.0  # (seed, turn) states shared by the 4 episodes
    files = sorted(glob.glob(os.path.join(config.output_dir, "trajectories", "*.parquet")))
    assert len(files) == 2
    rows = Dataset.from_parquet(files[0])
    assert len(rows) == 16 and set(rows["task_id"]) and None not in rows["advantage"]


class CountingTrainer(AgentGRPOTrainer):
    """Records what every micro-batch trains on."""

    seen_rows: list[int] = []
    advantage_shapes: list[tuple] = []

    def _compute_loss(self, model, inputs):
        self.seen_rows.append(int((inputs["completion_mask"].sum(1) > 0).sum()))
        self.advantage_shapes.append((tuple(inputs["advantages"].shape), tuple(inputs["completion_ids"].shape)))
        return super()._compute_loss(model, inputs)


def test_every_step_row_is_trained_on_whatever_their_number(tiny_model, tokenizer, tmp_path):
    # Episode lengths 1, 2, 2 -> 4 x 5 = 20 step rows, split over 3 micro-batches (7, 7, 6): none dropped.
    tasks = [{"env": "test-keyword", "seed": s, "length": length} for s, length in enumerate([1, 2, 2])]
    config = make_config(
        AgentGRPOConfig, tmp_path, max_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=3,
        num_generations=4,
    )
    trainer = CountingTrainer(model=tiny_model, args=config, train_dataset=tasks, processing_class=tokenizer)
    trainer.train()
    assert trainer.seen_rows == [7, 7, 6]
    assert all(adv == ids for adv, ids in trainer.advantage_shapes)  # (B, T) advantages, one per completion token


def test_lora_trains_an_adapter(tiny_model_dir, tokenizer, tmp_path):
    from peft import LoraConfig

    config = make_config(GiGPOConfig, tmp_path)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = GiGPOTrainer(model=tiny_model_dir, args=config, train_dataset=TASKS, processing_class=tokenizer,
                           peft_config=peft_config)
    before = snapshot(trainer.model)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    lora_changed = [n for n in before if "lora_" in n and not torch.equal(after[n].detach(), before[n])]
    base_changed = [n for n in before if "lora_" not in n and not torch.equal(after[n].detach(), before[n])]
    assert lora_changed and not base_changed
    trainer.save_model(config.output_dir)
    assert os.path.exists(os.path.join(config.output_dir, "adapter_config.json"))


def test_model_by_path_with_a_reference_model(tiny_model_dir, tokenizer, tmp_path):
    config = make_config(AgentGRPOConfig, tmp_path, beta=0.04, max_steps=1)
    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=config, train_dataset=TASKS)
    trainer.train()
    assert any("kl" in h for h in trainer.state.log_history)


class ConstantSignal(ModelSignal):
    """A model signal of 2.0 on every action token (a stand-in for teacher log-probs)."""

    name = "test-constant"

    def compute(self, groups, context):
        for group in groups:
            for trajectory in group.trajectories:
                for step in trajectory.owned_steps:
                    step.signals[self.name] = [2.0] * len(step.action_ids)


register_signal("test-constant", ConstantSignal)


class SignalTrainer(AgentGRPOTrainer):
    """A method-variant sketch: a declared per-token signal, laid into the batch, used by an auxiliary loss."""

    signals = ("test-constant",)
    training_signals = ("test-constant",)
    seen: list[tuple[int, int, bool]] = []

    def compute_auxiliary_loss(self, model, inputs, per_token_logps):
        values = inputs["signal/test-constant"]
        mask = inputs["completion_mask"].bool()
        self.seen.append((values.shape[0], inputs["prompt_ids"].shape[0], per_token_logps.requires_grad))
        assert values.shape == per_token_logps.shape and torch.all(values[mask] == 2.0)
        return values[mask].mean() * 3.0  # 6 per micro-batch, before the accumulation scaling


def test_signals_reach_the_auxiliary_loss_scaled_for_accumulation(tiny_model_dir, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    losses = {}
    for trainer_class in (AgentGRPOTrainer, SignalTrainer):
        config = make_config(AgentGRPOConfig, tmp_path / trainer_class.__name__, max_steps=1,
                             per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        trainer = trainer_class(model=model, args=config, train_dataset=TASKS, processing_class=tokenizer)
        trainer.train()
        losses[trainer_class] = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    assert SignalTrainer.seen and all(signal == rows and grad for signal, rows, grad in SignalTrainer.seen)
    # Two micro-batches each add 6 / 2 (accumulation steps): the logged step loss grows by exactly 6.
    assert losses[SignalTrainer] - losses[AgentGRPOTrainer] == pytest.approx(6.0, abs=1e-3)


def test_trl_evaluation_loop_runs_episodes(tiny_model, tokenizer, tmp_path):
    config = make_config(AgentGRPOConfig, tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=TASKS, eval_dataset=TASKS[:4],
                               processing_class=tokenizer)
    trainer.train()
    evaluations = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(evaluations) == 2 and all(h["eval_env/episode_length"] == 2.0 for h in evaluations)
    assert len(glob.glob(os.path.join(config.output_dir, "trajectories", "*.parquet"))) == 2  # train rollouts only


@register_env
class CrashOnOddSeeds(get_env_class("test-keyword")):  # the toy env of conftest.py
    name = "test-crash-odd"

    def reset(self, task):
        if task["seed"] % 2:
            raise ConnectionError("simulator unreachable")
        return super().reset(task)


def test_a_rollout_with_fewer_rows_than_micro_batches_still_trains(tiny_model, tokenizer, tmp_path):
    # 8 episodes, the 4 of seed 1 fail at reset: 4 one-step rows for 8 micro-batches. Filler rows with an empty loss
    # mask keep every micro-batch (and every process) busy without changing the loss; failures are logged.
    tasks = [{"env": "test-crash-odd", "seed": s, "length": 1} for s in (0, 1)]
    config = make_config(AgentGRPOConfig, tmp_path, max_steps=1, per_device_train_batch_size=1,
                         gradient_accumulation_steps=8, num_generations=4, max_turns=1)
    trainer = CountingTrainer(model=tiny_model, args=config, train_dataset=tasks, processing_class=tokenizer)
    CountingTrainer.seen_rows = []
    trainer.train()
    assert sorted(trainer.seen_rows) == [0, 0, 0, 0, 1, 1, 1, 1]
    logs = next(h for h in trainer.state.log_history if "env/failed_episode_rate" in h)
    assert logs["env/failed_episode_rate"] == 0.5 and logs["train_rows"] == 4


def test_hooks_of_earlier_versions_fail_when_the_class_is_defined():
    with pytest.raises(TypeError, match=r"compute_auxiliary_loss must take \(self, model, inputs, per_token_logps\)"):
        type("Old", (AgentGRPOTrainer,), {"compute_auxiliary_loss": lambda self, model, inputs: None})


def test_max_generated_tokens_stops_training_and_the_total_survives_a_resume(tiny_model, tokenizer, tmp_path):
    # Each rollout: 8 episodes x 2 turns x at most max_completion_length tokens. A budget of 1 token is crossed by
    # the first rollout, so training stops after step 1 of max_steps=4; the total is what the rollout generated.
    dataset = Dataset.from_list(TASKS)
    config = make_config(AgentGRPOConfig, tmp_path, max_steps=4, max_generated_tokens=1, save_strategy="steps",
                         save_steps=1)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 1
    first = dict(trainer.rollout_totals)
    logged = [h["rollout/generated_tokens"] for h in trainer.state.log_history if "rollout/generated_tokens" in h]
    assert first["generated_tokens"] == sum(logged) > 0 and first["episodes"] == 8.0 and first["env_steps"] == 16.0
    # A resumed trainer starts from the checkpoint's totals and stops after its next step (already over budget).
    again = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=dataset, processing_class=tokenizer)
    again.train(resume_from_checkpoint=os.path.join(config.output_dir, "checkpoint-1"))
    assert again.state.global_step == 2
    assert again.rollout_totals["episodes"] == 16.0 and again.rollout_totals["generated_tokens"] > first["generated_tokens"]
    with pytest.raises(ValueError, match="max_generated_tokens must be >= 1"):
        make_config(AgentGRPOConfig, tmp_path, max_generated_tokens=0)


def test_the_token_budget_stop_keeps_the_optimizer_step_under_gradient_accumulation(tiny_model, tokenizer, tmp_path):
    # Gradient accumulation 2: the rollout is scored (and the budget of 1 token crossed) in the first micro-batch of
    # step 1. The stop comes at the step's end: the second micro-batch and the optimizer step still run (raising the
    # Trainer's stop flag at once would leave its loop after the first micro-batch, with no update at all).
    config = make_config(AgentGRPOConfig, tmp_path, max_steps=4, max_generated_tokens=1, per_device_train_batch_size=4,
                         gradient_accumulation_steps=2)
    before = snapshot(tiny_model)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list(TASKS),
                               processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 1
    assert len([log for log in trainer.state.log_history if "loss" in log]) == 1
    assert any(not torch.equal(before[name], p) for name, p in tiny_model.named_parameters())
