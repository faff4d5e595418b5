"""`max_tokens_per_forward` bounds every forward over training rows — the loss, the old and reference log-probs, the
model signals — without changing the update: the loss of a micro-batch over the budget runs in row chunks whose
gradients accumulate inside the micro-step (tests/methods/opsd/test_opsd_sdar_trainers.py checks the model signals' part)."""

from __future__ import annotations

import pytest
import torch

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
from trl_agents.testing import tiny_training_config
from trl_agents.training.loss import loss_chunks

TASKS = [{"env": "test-keyword", "seed": s, "length": 3} for s in range(3)]


def trainer_for(tiny_model, tokenizer, tmp_path, **overrides):
    settings = {"env_name": "test-keyword", "max_turns": 3, "num_generations": 4, "per_device_train_batch_size": 12,
                "max_completion_length": 6, **overrides}
    config = tiny_training_config(AgentGRPOConfig, tmp_path / "out", **settings)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def gradients(trainer, inputs, budget):
    trainer.args.max_tokens_per_forward = budget
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    trainer.accelerator.backward(loss)
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
                                  if p.grad is not None}


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_the_loss_split_by_the_budget_gives_the_same_gradients(tiny_model, tokenizer, tmp_path, loss_type):
    trainer = trainer_for(tiny_model, tokenizer, tmp_path, loss_type=loss_type, beta=0.04)
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions([task for task in TASKS for _ in range(4)])
    rows, width = inputs["prompt_ids"].size(0), inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
    assert rows == 3 * 4 * 3  # 3 tasks × 4 episodes × 3 turns: step rows
    budget = 5 * width  # 5 rows per forward: 8 chunks, the last of 1 row
    assert len(loss_chunks(inputs, budget, loss_type)) == 8
    whole_loss, whole = gradients(trainer, inputs, None)
    split_loss, split = gradients(trainer, inputs, budget)
    assert split_loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-7)
    assert whole.keys() == split.keys() and max(g.abs().max() for g in whole.values()) > 0
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-6, msg=name)
    assert trainer.loss_chunk == (0, 1)


def test_old_and_reference_log_probs_are_computed_within_the_budget(tiny_model, tokenizer, tmp_path):
    calls = []
    trainer = trainer_for(tiny_model, tokenizer, tmp_path, beta=0.04, gradient_accumulation_steps=2,
                          steps_per_generation=4, per_device_train_batch_size=6)  # misaligned: old log-probs too
    original = trainer._get_per_token_logps_and_entropies

    def spy(model, input_ids, *args, batch_size=None, **kwargs):
        calls.append((input_ids.size(1), batch_size))
        return original(model, input_ids, *args, batch_size=batch_size, **kwargs)

    trainer._get_per_token_logps_and_entropies = spy
    torch.manual_seed(0)
    batch = [task for task in TASKS for _ in range(4)] * 2
    whole = trainer._generate_and_score_completions(batch)
    width = whole["prompt_ids"].size(1) + whole["completion_ids"].size(1)
    assert [size for _, size in calls] == [6, 6]  # rows only: per_device_train_batch_size
    calls.clear()
    trainer.args.max_tokens_per_forward = 2 * width + 1
    torch.manual_seed(0)
    bounded = trainer._generate_and_score_completions(batch)
    assert [size for _, size in calls] == [2, 2] and all(w * s <= 2 * width + 1 for w, s in calls)
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        torch.testing.assert_close(bounded[key], whole[key], rtol=1e-5, atol=1e-6)


def test_a_loss_type_that_cannot_be_split_is_named(tiny_model, tokenizer, tmp_path):
    inputs = {"prompt_ids": torch.zeros(4, 3), "completion_ids": torch.zeros(4, 2),
              "completion_mask": torch.ones(4, 2)}
    with pytest.raises(ValueError, match="cannot split the loss of loss_type='mystery'"):
        loss_chunks(inputs, 5, "mystery")
    assert loss_chunks(inputs, 100, "mystery") == [(inputs, 1.0)]  # it fits: nothing to split
