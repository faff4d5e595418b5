"""EnvRL math (trl_agents.distill.envrl): the cosine schedule, the SP/ID examples and their label masks, the NLL.

Hand cases from docs/methods/envrl.md#hand-computed-case; the trainer end to end is in tests/methods/envrl/test_envrl_trainer.py.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from trl_agents.distill.envrl import (
    ID_INSTRUCTION,
    SP_INSTRUCTION,
    Example,
    build_step_examples,
    example_nll,
    id_example,
    next_observation,
    pack_examples,
    schedule_coefficient,
    shuffle_targets,
    sp_example,
    target_token_nll,
    token_mean,
)
from trl_agents.rollout.prompts import PromptRenderer
from trl_agents.trajectory import PromptParts, Step, Trajectory

# ---------------------------------------------------------------- the schedule


def test_cosine_schedule_hand_case():
    # λ(t) = λ₀·½(1 + cos(π t/T)), λ₀ = 0.2, T = 150 (EnvRL's 150 steps):
    # t = 0: 0.2·½·(1 + 1) = 0.2;  t = 75: 0.2·½·(1 + 0) = 0.1;  t = 150: 0.2·½·(1 − 1) = 0.0
    values = [schedule_coefficient(t, 150, 0.2) for t in (0, 75, 150)]
    assert values == pytest.approx([0.2, 0.1, 0.0], abs=1e-12)
    # t = T/4: 0.1·(1 + cos(π/4)) = 0.1·1.7071068 = 0.17071068
    assert schedule_coefficient(37.5, 150, 0.2) == pytest.approx(0.17071068, abs=1e-8)
    # λ₀ = 0.1 (7B): half everywhere
    assert schedule_coefficient(75, 150, 0.1) == pytest.approx(0.05)


def test_schedule_guards():
    assert schedule_coefficient(300, 150, 0.2) == pytest.approx(0.0)  # t clamped to T
    assert schedule_coefficient(-5, 150, 0.2) == pytest.approx(0.2)  # t clamped to 0
    assert schedule_coefficient(10, 0, 0.2) == 0.2  # T unknown: constant λ₀
    assert schedule_coefficient(75, 150, 0.2, "linear") == pytest.approx(0.1)
    assert schedule_coefficient(150, 150, 0.2, "constant") == 0.2
    with pytest.raises(ValueError, match="schedule must be one of"):
        schedule_coefficient(0, 10, 0.2, "step")
    with pytest.raises(ValueError, match="finite"):
        schedule_coefficient(0, 10, math.nan)


# ---------------------------------------------------------------- examples and masks


def test_label_mask_covers_only_target_tokens_written_out():
    # Two examples: prompt [11, 12, 13] target [21, 22]; prompt [14] target [23]. Prompts left-padded to 3, targets
    # right-padded to 2 (pad 0):
    #   input  [11 12 13 | 21 22]    labels mask [0 0 0 | 1 1]
    #   input  [ 0  0 14 | 23  0]    labels mask [0 0 0 | 1 0]
    packed = pack_examples([Example([11, 12, 13], [21, 22], "sp"), Example([14], [23], "id")], pad_token_id=0)
    assert packed["input_ids"].tolist() == [[11, 12, 13, 21, 22], [0, 0, 14, 23, 0]]
    assert packed["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 0]]
    assert packed["labels_mask"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 0]]
    assert packed["target_mask"].tolist() == [[1, 1], [1, 0]]
    with pytest.raises(ValueError, match="at least one"):
        pack_examples([], 0)


def _step(tokenizer, renderer):
    parts = PromptParts("Reach G.", "", (("S F\nF G", "right"),), "F P\nF G")
    prompt = renderer.step_prompt_ids(parts.system, parts.task, parts.history, parts.observation)
    action = tokenizer.encode("down", add_special_tokens=False) + [tokenizer.eos_token_id]
    step = Step("F P\nF G", "down", prompt_ids=prompt, action_ids=action, prompt_parts=parts)
    step.next_observation = "F F\nF P"  # o_{t+1} (set explicitly whatever the Step version)
    return step


def test_sp_example_is_prompt_action_instruction_then_the_next_observation(tokenizer):
    renderer = PromptRenderer(tokenizer, history_length=1)
    step = _step(tokenizer, renderer)
    example = sp_example(step, "F F\nF P", renderer)
    # prompt = s_t ids + a_t ids (already closed with EOS) + the user turn holding the instruction
    assert example.prompt_ids[: len(step.prompt_ids)] == step.prompt_ids
    tail = example.prompt_ids[len(step.prompt_ids):]
    assert tail[: len(step.action_ids)] == step.action_ids
    assert SP_INSTRUCTION in tokenizer.decode(tail[len(step.action_ids):])
    # target = o_{t+1} tokens + EOS
    assert example.target_ids == tokenizer.encode("F F\nF P", add_special_tokens=False) + [tokenizer.eos_token_id]
    # truncation of the observation: the first 2 tokens, then EOS
    short = sp_example(step, "F F\nF P", renderer, max_observation_tokens=2)
    assert short.target_ids == example.target_ids[:2] + [tokenizer.eos_token_id]


def test_id_example_shows_both_observations_and_asks_for_the_action(tokenizer):
    renderer = PromptRenderer(tokenizer, history_length=1)
    step = _step(tokenizer, renderer)
    example = id_example(step, "F F\nF P", renderer)
    text = tokenizer.decode(example.prompt_ids)
    assert "F P\nF G" in text and "F F\nF P" in text and ID_INSTRUCTION in text and "Reach G." in text
    assert example.target_ids == step.action_ids  # the very ids the policy sampled


def test_build_step_examples_sampling_and_missing_next_observation(tokenizer):
    renderer = PromptRenderer(tokenizer, history_length=1)
    step = _step(tokenizer, renderer)
    trajectory = Trajectory(task={}, steps=[step])
    sp, id_ = build_step_examples(trajectory, 0, renderer, rng=random.Random(0))
    assert sp.kind == "sp" and id_.kind == "id"
    assert build_step_examples(trajectory, 0, renderer, rng=random.Random(0), sp_fraction=0.0)[0] is None
    kept = [build_step_examples(trajectory, 0, renderer, rng=random.Random(s), sp_fraction=0.5, id_fraction=0.0)[0]
            is not None for s in range(200)]
    assert 60 < sum(kept) < 140  # about half
    step.next_observation = None  # a failed step: no transition, no example
    assert build_step_examples(trajectory, 0, renderer, rng=random.Random(0)) == (None, None)


def test_next_observation_reads_the_step_field():
    steps = [Step("o0", "a"), Step("o1", "b")]
    for step, after in zip(steps, ("o1", "o-end"), strict=True):
        step.next_observation = after
    trajectory = Trajectory(task={}, steps=steps)
    assert [next_observation(trajectory, i) for i in range(2)] == ["o1", "o-end"]


def test_shuffled_targets_are_a_permutation():
    examples = [Example([i], [100 + i], "sp") for i in range(6)]
    shuffled = shuffle_targets(examples, random.Random(1))
    assert sorted(e.target_ids[0] for e in shuffled) == [100 + i for i in range(6)]
    assert [e.prompt_ids for e in shuffled] == [e.prompt_ids for e in examples]
    assert any(e.target_ids != s.target_ids for e, s in zip(examples, shuffled, strict=True))
    assert shuffle_targets([], random.Random(0)) == []


# ---------------------------------------------------------------- the loss


class CopyModel(torch.nn.Module):
    """Puts all its mass on the token that follows in the given input: a model that copies o_{t+1} exactly."""

    def __init__(self, vocab: int = 32):
        super().__init__()
        self.vocab = vocab
        self.scale = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0):
        nxt = torch.roll(input_ids, shifts=-1, dims=1)  # the token at j + 1: what position j must predict
        logits = torch.full((*input_ids.shape, self.vocab), -1e4) * self.scale
        logits.scatter_(-1, nxt.unsqueeze(-1), 0.0)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return type("Out", (), {"logits": logits})()


def test_sp_loss_is_zero_for_a_model_that_copies_the_next_observation():
    packed = pack_examples([Example([3, 4, 5], [6, 7, 8], "sp"), Example([3], [9], "sp")], pad_token_id=0)
    nll = example_nll(CopyModel(), packed)
    assert nll.shape == (2, 3)
    assert token_mean(nll, packed["target_mask"]).item() == pytest.approx(0.0, abs=1e-6)


def test_nll_hand_case_uniform_logits():
    # uniform over 4 tokens: −log(1/4) = log 4 = 1.386294 per target token; padding gives 0
    nll = target_token_nll(torch.zeros(1, 3, 4), torch.tensor([[1, 2, 0]]), torch.tensor([[1, 1, 0]]))
    assert nll.tolist()[0] == pytest.approx([math.log(4), math.log(4), 0.0])
    assert token_mean(nll, torch.tensor([[1, 1, 0]])).item() == pytest.approx(math.log(4))


@pytest.mark.parametrize("mask", [torch.zeros(2, 3), torch.ones(2, 3)])
def test_nll_has_no_nan_on_empty_or_extreme_inputs(mask):
    logits = torch.tensor([[[-1e30, 0.0, 1e4]] * 3] * 2)  # extreme but finite logits
    nll = target_token_nll(logits, torch.zeros(2, 3, dtype=torch.long), mask)
    assert torch.isfinite(nll).all() and torch.isfinite(token_mean(nll, mask))
