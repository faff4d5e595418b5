"""`length_grouped_forwards`: the forwards over training rows (loss, old and reference log-probs) run over groups of
rows of similar length, each trimmed of the padding its rows do not need, and give the log-probs, losses and
gradients of TRL's one forward per micro-batch up to float noise, over fewer padded tokens."""

from __future__ import annotations

import pytest
import torch
from trl import GRPOTrainer

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
from trl_agents.training import forward as rows_module
from trl_agents.training.forward import length_groups
from trl_agents.testing import tiny_training_config

TASKS = [{"env": "test-keyword", "seed": s, "length": 3} for s in range(3)]


def test_length_groups_cut_the_sorted_rows_where_padding_costs_more_than_a_forward():
    lengths = [10, 200, 12, 198, 11]
    # One forward: 5 rows × 200 = 1000 padded tokens + 50; two: 2 × 200 + 3 × 12 = 436 + 2 × 50 = 536; three
    # ({200}, {198}, {12, 11, 10}): 200 + 198 + 36 + 150 = 584.
    assert length_groups(lengths, forward_cost=50) == [[1, 3], [2, 4, 0]]
    assert length_groups(lengths, forward_cost=1000) == [[1, 3, 2, 4, 0]]  # 1000 + 1000 < 436 + 2000
    assert length_groups(lengths, forward_cost=0) == [[1], [3], [2], [4], [0]]  # no padding at all
    assert length_groups([5, 5, 5], forward_cost=0) == [[0, 1, 2]]  # equal lengths: one forward, in row order
    many = [(i * 37) % 101 + 1 for i in range(300)]
    groups = length_groups(many)
    assert sorted(i for group in groups for i in group) == list(range(300))  # every row once
    flat = [many[i] for group in groups for i in group]
    assert flat == sorted(many, reverse=True)  # longest first


def trainer_for(tiny_model, tokenizer, tmp_path, **overrides):
    settings = {"env_name": "test-keyword", "max_turns": 3, "num_generations": 4, "per_device_train_batch_size": 12,
                "max_completion_length": 6, **overrides}
    config = tiny_training_config(AgentGRPOConfig, tmp_path / "out", **settings)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def forwards_of(trainer, monkeypatch) -> list[tuple[int, int]]:
    """(rows, width) of every forward TRL's method runs from now on."""
    calls = []
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def spy(self, model, input_ids, *args, **kwargs):
        calls.append(tuple(input_ids.shape))
        return original(self, model, input_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", spy)
    return calls


def gradients(trainer, inputs, grouped: bool, budget: int | None = None):
    trainer.args.length_grouped_forwards = grouped
    trainer.args.max_tokens_per_forward = budget
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    trainer.accelerator.backward(loss)
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
                                  if p.grad is not None}


def assert_same(first, second):
    (first_loss, first_grads), (second_loss, second_grads) = first, second
    assert second_loss == pytest.approx(first_loss, rel=1e-5, abs=1e-7)
    assert first_grads.keys() == second_grads.keys() and max(g.abs().max() for g in first_grads.values()) > 0
    for name in first_grads:
        torch.testing.assert_close(second_grads[name], first_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_grouped_forwards_give_the_gradients_of_one_forward_over_fewer_padded_tokens(
    tiny_model, tokenizer, tmp_path, monkeypatch, loss_type
):
    trainer = trainer_for(tiny_model, tokenizer, tmp_path, loss_type=loss_type, beta=0.04)
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions([task for task in TASKS for _ in range(4)])
    rows, width = inputs["prompt_ids"].size(0), inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
    assert rows == 3 * 4 * 3  # 3 tasks × 4 episodes × 3 turns: step rows, the later turns' prompts longer
    calls = forwards_of(trainer, monkeypatch)
    whole = gradients(trainer, inputs, grouped=False)
    assert calls == [(rows, width)]  # TRL's one forward
    calls.clear()
    grouped = gradients(trainer, inputs, grouped=True)
    assert len(calls) > 1 and sum(r for r, _ in calls) == rows
    assert sum(r * w for r, w in calls) < rows * width  # fewer padded tokens
    assert_same(whole, grouped)
    calls.clear()
    budget = 5 * width  # with the token budget: row chunks, each forwarded in groups
    assert_same(whole, gradients(trainer, inputs, grouped=True, budget=budget))
    assert all(r * w <= budget for r, w in calls)


def test_conversation_rows_lose_their_completion_padding_too(tiny_model, tokenizer, tmp_path, monkeypatch):
    trainer = trainer_for(tiny_model, tokenizer, tmp_path, row_format="conversation")
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions([task for task in TASKS for _ in range(4)])
    lengths = inputs["completion_mask"].sum(dim=1)
    assert lengths.min() < lengths.max()  # episodes of different lengths (the keyword is found at different turns)
    monkeypatch.setattr(rows_module, "FORWARD_COST_TOKENS", 0)  # a dozen rows: cut wherever padding goes
    calls = forwards_of(trainer, monkeypatch)
    whole = gradients(trainer, inputs, grouped=False)
    calls.clear()
    assert_same(whole, gradients(trainer, inputs, grouped=True))
    assert sum(r * w for r, w in calls) < inputs["prompt_ids"].size(0) * (
        inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1))


def test_old_and_reference_log_probs_are_the_same_grouped(tiny_model, tokenizer, tmp_path):
    trainer = trainer_for(tiny_model, tokenizer, tmp_path, beta=0.04, gradient_accumulation_steps=2,
                          steps_per_generation=4, per_device_train_batch_size=6)  # misaligned: old log-probs too
    batch = [task for task in TASKS for _ in range(4)] * 2
    outputs = {}
    for grouped in (False, True):
        trainer.args.length_grouped_forwards = grouped
        torch.manual_seed(0)
        outputs[grouped] = trainer._generate_and_score_completions(batch)
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        assert outputs[False][key].abs().sum() > 0
        torch.testing.assert_close(outputs[True][key], outputs[False][key], rtol=1e-5, atol=1e-6)
