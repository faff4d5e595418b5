"""EPPO: the per-task entropy pacing math (hand cases), the per-row clipping bounds in TRL's loss (the spec's
ρ = 1.25 case, exact reduction to GRPO with equal entropies), the entropy sums, and 2 steps of training end to end."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
from trl_agents.credit.eppo import (
    EntropyPacer,
    clipped_objective,
    crossovers,
    pace_scale,
    pace_scales,
    relative_pace,
    task_bounds,
    update_entropy_ema,
)
from trl_agents.training.batch import token_signal_key
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.eppo import TASK_TYPE_SIGNAL, EPPOConfig, EPPOTrainer

KEY = token_signal_key(TASK_TYPE_SIGNAL)
TASKS = [{"env": "test-keyword", "seed": 0, "task_type": "easy"}, {"env": "test-keyword", "seed": 1, "task_type": "hard"}]


# ---------------------------------------------------------------- the math, by hand


def test_the_spec_case_two_tasks_give_epsilon_01_and_03():
    # H = [0.4, 1.2]: mean 0.8, r = [0.5, 1.5], s = clip(r, 1/2, 2) = r, ε = 0.2·s = [0.1, 0.3].
    scales = pace_scales({"t1": 0.4, "t2": 1.2}, alpha=1.0, max_scale=2.0)
    bounds = {k: task_bounds(s, 0.2, 0.2) for k, s in scales.items()}
    assert bounds["t1"] == pytest.approx((0.1, 0.1)) and bounds["t2"] == pytest.approx((0.3, 0.3))
    # ρ = 1.25, A = 1: task 1 clips to 1 + 0.1 = 1.1, task 2 keeps 1.25 (< 1.3).
    assert clipped_objective(1.25, 1.0, *bounds["t1"]) == pytest.approx(1.1)
    assert clipped_objective(1.25, 1.0, *bounds["t2"]) == pytest.approx(1.25)
    # Equal entropies: s = 1, ε = 0.2 for both (GRPO).
    assert pace_scales({"t1": 0.7, "t2": 0.7}) == {"t1": 1.0, "t2": 1.0}


def test_clip_higher_scales_only_the_upper_bound():
    # s = 0.5 with ε_low = 0.2, ε_high = 0.28: "both" -> (0.1, 0.14), "high" -> (0.2, 0.14).
    assert task_bounds(0.5, 0.2, 0.28, "both") == pytest.approx((0.1, 0.14))
    assert task_bounds(0.5, 0.2, 0.28, "high") == pytest.approx((0.2, 0.14))
    with pytest.raises(ValueError, match="sides"):
        task_bounds(1.0, 0.2, 0.2, "low")


def test_ema_pace_and_scale_by_hand_with_their_guards():
    ema = update_entropy_ema({}, {"a": (3.0, 6), "b": (2.4, 2)})  # first values: 3/6 = 0.5, 2.4/2 = 1.2
    assert ema == pytest.approx({"a": 0.5, "b": 1.2})
    ema = update_entropy_ema(ema, {"a": (1.0, 1), "b": (0.0, 0), "c": (math.nan, 3)})  # 0.9·0.5 + 0.1·1 = 0.55
    assert ema == pytest.approx({"a": 0.55, "b": 1.2})  # b: no token, c: non-finite -> ignored
    # r = H / mean: mean(0.55, 1.2) = 0.875 -> r = [0.628571, 1.371429]
    assert relative_pace(ema) == pytest.approx({"a": 0.55 / 0.875, "b": 1.2 / 0.875})
    assert relative_pace({}) == {} and relative_pace({"a": 0.0, "b": 0.0}) == {"a": 1.0, "b": 1.0}
    # clip(r^α, 1/c, c): r = 4 with c = 2 -> 2; r = 0 -> 1/2; α = 2: 0.8² = 0.64; α = 0 -> 1
    assert pace_scale(4.0) == 2.0 and pace_scale(0.0) == 0.5 and pace_scale(0.8, alpha=2.0) == pytest.approx(0.64)
    assert pace_scale(0.1, alpha=0.0) == 1.0 and pace_scale(10.0, max_scale=1.0) == 1.0
    for value in pace_scales({"a": 0.0, "b": 1e-12, "c": 3.0}).values():
        assert math.isfinite(value) and 0.5 <= value <= 2.0


def test_crossover_freeze_holds_the_scales_for_w_updates():
    assert crossovers({"a": 1.0, "b": 2.0}, {"a": 2.5, "b": 2.0}) == [("a", "b")]
    assert crossovers({"a": 1.0}, {"a": 2.0, "b": 0.0}) == []  # b is new: no order to flip
    pacer = EntropyPacer(decay=0.0, freeze_steps=2)  # decay 0: each update replaces the EMA
    pacer.observe({"a": (0.4, 1), "b": (1.2, 1)})
    assert pacer.scale("a") == pytest.approx(0.5)
    held = [pacer.observe({"a": (1.2, 1), "b": (0.4, 1)})["frozen"] for _ in range(3)]
    assert held == [1.0, 1.0, 0.0]  # the flip, one more held update, then the new scales
    assert pacer.scale("a") == pytest.approx(1.5) and pacer.scale("unseen") == 1.0
    # Without freeze the scales follow at once.
    free = EntropyPacer(decay=0.0)
    free.observe({"a": (0.4, 1), "b": (1.2, 1)})
    assert free.observe({"a": (1.2, 1), "b": (0.4, 1)}) == {"crossovers": 1, "frozen": 0.0}
    assert free.scale("a") == pytest.approx(1.5)
    restored = EntropyPacer()
    restored.load_state_dict(json.loads(json.dumps(free.state_dict())))
    assert restored.scales == free.scales and restored.ema == free.ema


# ---------------------------------------------------------------- the bounds in TRL's loss


def make_trainer(cls, config_cls, model, tokenizer, tmp_path, **overrides):
    config = config_cls(output_dir=str(tmp_path), env_name="test-keyword", report_to="none", num_generations=2,
                        per_device_train_batch_size=2, loss_type="dapo", **overrides)
    trainer = cls(model=model, args=config, train_dataset=TASKS, processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def batch(trainer, ratio=1.25):
    """Two rows (task 0 = "easy", task 1 = "hard") whose old log-probs make every token's ratio `ratio`."""
    inputs = {
        "prompt_ids": torch.tensor([[5, 6, 7], [0, 8, 9]]),
        "prompt_mask": torch.tensor([[1, 1, 1], [0, 1, 1]]),
        "completion_ids": torch.tensor([[10, 11], [12, 0]]),
        "completion_mask": torch.tensor([[1, 1], [1, 0]]),
        "advantages": torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        "num_items_in_batch": torch.tensor(3.0),
        KEY: torch.tensor([[0.0, 0.0], [1.0, math.nan]]),
    }
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 2)
    inputs["old_per_token_logps"] = logps - math.log(ratio)
    return inputs


def paced(trainer, ema):
    trainer.task_type_signal.index("easy"), trainer.task_type_signal.index("hard")
    trainer.pacer.ema = dict(ema)
    trainer.pacer.scales = pace_scales(ema, trainer.args.eppo_alpha, trainer.args.eppo_max_scale)


def test_rho_125_is_clipped_for_the_low_entropy_task_only(tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(EPPOTrainer, EPPOConfig, tiny_model, tokenizer, tmp_path)
    paced(trainer, {"easy": 0.4, "hard": 1.2})
    inputs = batch(trainer)
    low, high = trainer.clip_bounds(inputs)
    assert low.flatten().tolist() == pytest.approx([0.1, 0.3]) and high.flatten().tolist() == pytest.approx([0.1, 0.3])
    loss = trainer._compute_loss(trainer.model, dict(inputs))
    # dapo: −(1.1 + 1.1 + 1.25) / 3 tokens: the easy row's 2 tokens clipped at 1.1, the hard row's 1.25 kept.
    assert loss.item() == pytest.approx(-(1.1 + 1.1 + 1.25) / 3, abs=1e-5)
    assert trainer._metrics["train"]["clip_ratio/high_mean"][-1] == pytest.approx(2 / 3)
    assert trainer.epsilon_low == 0.2 and trainer.epsilon_high == 0.2  # restored after the call
    # Gradient: none through the clipped (easy) row, some through the hard one.
    def grad_norm(row):
        trainer.model.zero_grad()
        one = {k: (v[row : row + 1] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in inputs.items()}
        trainer._compute_loss(trainer.model, one).backward()
        return sum(float(p.grad.abs().sum()) for p in trainer.model.parameters() if p.grad is not None)

    assert grad_norm(0) == 0.0 and grad_norm(1) > 0.0
    # With GRPO's ε = 0.2 the hard row would have been clipped too (1.25 > 1.2).
    assert clipped_objective(1.25, 1.0, 0.2, 0.2) == pytest.approx(1.2)


def test_equal_entropies_give_grpo_loss_and_gradient_exactly(tiny_model_dir, tokenizer, tmp_path):
    models = [AutoModelForCausalLM.from_pretrained(tiny_model_dir) for _ in range(2)]
    eppo = make_trainer(EPPOTrainer, EPPOConfig, models[0], tokenizer, tmp_path / "eppo")
    grpo = make_trainer(AgentGRPOTrainer, AgentGRPOConfig, models[1], tokenizer, tmp_path / "grpo")
    paced(eppo, {"easy": 0.7, "hard": 0.7})
    inputs = batch(eppo)
    assert eppo.clip_bounds(inputs)[1].flatten().tolist() == pytest.approx([0.2, 0.2])  # tensors, not None
    grpo_inputs = {k: v for k, v in inputs.items() if k != KEY}
    losses, grads = [], []
    for trainer, data in ((eppo, inputs), (grpo, grpo_inputs)):
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, dict(data))
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
    assert losses[0] == losses[1]  # −(1.2 + 1.2 + 1.2) / 3: ρ = 1.25 clipped at 1.2 for both rows
    assert losses[0] == pytest.approx(-1.2, abs=1e-5)
    assert torch.equal(grads[0], grads[1])
    # Before any entropy is measured (a task never seen) the bounds are GRPO's too.
    fresh = make_trainer(EPPOTrainer, EPPOConfig, models[0], tokenizer, tmp_path / "fresh")
    assert fresh.clip_bounds(dict(inputs, **{KEY: torch.full((2, 2), math.nan)}))[0].flatten().tolist() == [
        pytest.approx(0.2), pytest.approx(0.2)]


def test_the_loss_entropies_are_summed_per_task_and_folded_into_the_ema(tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(EPPOTrainer, EPPOConfig, tiny_model, tokenizer, tmp_path)
    paced(trainer, {})
    inputs = batch(trainer, ratio=1.0)
    trainer._compute_loss(trainer.model, dict(inputs))
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        _, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 2, compute_entropy=True)
    easy, hard = trainer._entropy_totals[0], trainer._entropy_totals[1]
    assert easy == pytest.approx([float(entropies[0].sum()), 2.0], rel=1e-5)  # both tokens of row 0
    assert hard == pytest.approx([float(entropies[1, 0]), 1.0], rel=1e-5)  # row 1's one loss token
    assert trainer.loss_entropies is None  # only set while compute_auxiliary_loss runs
    trainer.update_pace()
    assert trainer.pacer.ema == pytest.approx({"easy": easy[0] / 2, "hard": hard[0]})
    assert trainer._entropy_totals == {}
    trainer.save_extra_state(str(tmp_path))
    other = make_trainer(EPPOTrainer, EPPOConfig, tiny_model, tokenizer, tmp_path / "other")
    other.load_extra_state(str(tmp_path))
    assert other.pacer.ema == trainer.pacer.ema


def test_config_and_dataset_checks(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="eppo_clip_sides"):
        EPPOConfig(output_dir=str(tmp_path), eppo_clip_sides="low")
    with pytest.raises(ValueError, match="eppo_max_scale"):
        EPPOConfig(output_dir=str(tmp_path), eppo_max_scale=0.5)
    with pytest.raises(ValueError, match="loss_type"):
        EPPOConfig(output_dir=str(tmp_path), loss_type="sapo")
    config = EPPOConfig(output_dir=str(tmp_path), env_name="test-keyword", report_to="none", num_generations=2,
                        per_device_train_batch_size=2, eppo_task_type_field="kind")
    with pytest.raises(ValueError, match="eppo_task_type_field='kind' is not a column"):
        EPPOTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)


# ---------------------------------------------------------------- end to end


def test_eppo_trains_two_steps_and_paces_the_two_task_types(tiny_model, tokenizer, tmp_path):
    config = tiny_training_config(EPPOConfig, tmp_path / "run", env_name="test-keyword", max_turns=2,
                                  num_generations=2, per_device_train_batch_size=8, max_completion_length=6)
    tasks = [{"env": "test-keyword", "seed": s, "task_type": "easy" if s % 2 else "hard"} for s in range(8)]
    trainer = EPPOTrainer(model=tiny_model, args=config, train_dataset=tasks, processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert set(trainer.pacer.ema) == {"easy", "hard"}  # measured in step 1's loss, folded at step 2's rollout
    assert all(0.5 <= trainer.pacer.scale(k) <= 2.0 for k in ("easy", "hard"))
    logs = [h for h in trainer.state.log_history if "eppo/task_types" in h]
    assert [h["eppo/task_types"] for h in logs] == [0.0, 2.0]
    assert "eppo/epsilon_high/easy" in logs[1] and math.isfinite(logs[1]["loss"])


def test_the_registry_and_the_cli_list_eppo():
    method = METHODS["eppo"]
    assert method.trainer_class is EPPOTrainer and method.paper == "arXiv 2607.07178"
    out = subprocess.run([sys.executable, "-m", "trl_agents.cli", "methods"], capture_output=True, text=True,
                         check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout
    blocks = {block.split()[0]: block for block in re.split(r"\n(?=\S)", out.strip())}
    assert "signals: eppo_task_type" in blocks["eppo"] and "docs/methods/eppo.md" in blocks["eppo"], blocks["eppo"]
