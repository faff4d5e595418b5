"""EnvRL end to end on the tiny model: 2 training steps on GRPO and on GiGPO, the examples of each micro-batch, and
the auxiliary loss adding up to the token mean over the generation batch under gradient accumulation.

The math (schedule, examples, masks, NLL) is in tests/methods/envrl/test_envrl_math.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from helpers import train_and_check_moved

from trl_agents.distill.envrl import example_nll, pack_examples, token_mean
from trl_agents.training.batch import split_rows, token_signal_key
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.envrl import EXAMPLES_SIGNAL, EnvRLConfig, EnvRLTrainer

TASKS = [{"env": "test-keyword", "seed": s} for s in range(4)]


def make_trainer(tiny_model, tokenizer, tmp_path, **overrides):
    config = tiny_training_config(EnvRLConfig, tmp_path / "out", max_turns=2, max_completion_length=4, **overrides)
    return EnvRLTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list(TASKS * 2),
                        processing_class=tokenizer)


@pytest.mark.slow
@pytest.mark.parametrize("estimator, row_format", [("grpo", "step"), ("gigpo", "step"), ("grpo", "conversation")])
def test_envrl_trains_two_steps(estimator, row_format, tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, envrl_rl_estimator=estimator, row_format=row_format)
    logs = train_and_check_moved(trainer)
    for h in logs:
        assert math.isfinite(h["envrl/sp_loss"]) and h["envrl/sp_loss"] > 0
        assert math.isfinite(h["envrl/id_loss"]) and h["envrl/id_loss"] > 0
    # cosine decay over max_steps = 2: λ(0) = 0.2, λ(1) = 0.2·½(1 + cos(π/2)) = 0.1
    assert [h["envrl/sp_coef"] for h in logs] == pytest.approx([0.2, 0.1])
    assert [h["envrl/id_coef"] for h in logs] == pytest.approx([0.2, 0.1])
    assert ("gigpo/mean_anchor_group_size" in logs[0]) == (estimator == "gigpo")
    # every step of the rollout (2 tasks x 4 episodes x 2 turns; one row per episode in conversation rows) has both
    assert logs[0]["envrl/sp_examples"] == 16 and logs[0]["envrl/id_examples"] == 16


def rollout_batch(trainer):
    rows = [task for task in TASKS for _ in range(trainer.num_generations)]
    trainer.model.train()
    return trainer._generate_and_score_completions(rows)


@pytest.mark.parametrize("chunks", [1, 3])
def test_micro_batches_add_up_to_the_token_mean_of_the_generation_batch(chunks, tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, envrl_id_coef=0.1, gradient_accumulation_steps=chunks,
                           per_device_train_batch_size=16 // chunks if chunks == 1 else 4,
                           steps_per_generation=chunks)
    batch = rollout_batch(trainer)
    table = trainer.example_signal.examples
    assert len(table) == 32 and all(sp is not None and id_ is not None for sp, id_ in table)
    # every trained row points at its own step's examples; a row's SP prompt starts with its own prompt
    values = batch[token_signal_key(EXAMPLES_SIGNAL)]
    assert sorted(int(v) for v in values[:, 0].tolist()) == list(range(32))
    for row in range(values.size(0)):
        prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
        assert table[int(values[row, 0])][0].prompt_ids[: len(prompt)] == prompt
    # Σ over micro-batches of aux / accumulation steps = λ_SP·mean_SP + λ_ID·mean_ID over the whole batch
    total = sum(float(trainer.compute_auxiliary_loss(trainer.model, chunk, None).detach()) / chunks
                for chunk in split_rows(batch, chunks))
    with torch.no_grad():
        expected = 0.0
        for kind, coef in ((0, 0.2), (1, 0.1)):
            packed = pack_examples([pair[kind] for pair in table], tokenizer.pad_token_id)
            expected += coef * float(token_mean(example_nll(trainer.model, packed), packed["target_mask"]))
    assert total == pytest.approx(expected, rel=1e-4)


def test_aux_loss_is_off_with_zero_coefficients(tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, envrl_sp_coef=0.0, envrl_id_coef=0.0)
    batch = rollout_batch(trainer)
    assert trainer.example_signal.examples == []  # nothing built
    assert (batch[token_signal_key(EXAMPLES_SIGNAL)][batch["completion_mask"].bool()] == -1).all()
    assert trainer.compute_auxiliary_loss(trainer.model, batch, None) is None


@pytest.mark.parametrize("field, value, match", [
    ("envrl_rl_estimator", "ppo", "envrl_rl_estimator must be one of"),
    ("envrl_sp_coef", -0.1, "envrl_sp_coef must be a finite number >= 0"),
    ("envrl_id_fraction", 1.5, "envrl_id_fraction must be a probability"),
    ("envrl_schedule", "step", "envrl_schedule must be one of"),
    ("envrl_max_observation_tokens", 0, "envrl_max_observation_tokens must be >= 1"),
])
def test_config_validation(field, value, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        tiny_training_config(EnvRLConfig, tmp_path, **{field: value})


def test_registry_entry():
    method = METHODS["envrl"]
    assert method.paper == "arXiv 2606.17680" and method.trainer_class is EnvRLTrainer
    assert method.signals == (EXAMPLES_SIGNAL,)
