"""TransformersGenerator: EOS handling and log-probs that match the training-time computation."""

from __future__ import annotations

import torch

from trl_agents.rollout.generators import Generator, SamplingParams, TransformersGenerator


def test_protocol_and_shapes(tiny_model, tokenizer):
    generator = TransformersGenerator(tiny_model, tokenizer)
    assert isinstance(generator, Generator)
    prompts = [tokenizer.encode("P F F H", add_special_tokens=False), tokenizer.encode("up", add_special_tokens=False)]
    out = generator.generate(prompts, SamplingParams(max_new_tokens=5))
    assert len(out.completion_ids) == 2
    for ids, logprobs in zip(out.completion_ids, out.logprobs, strict=True):
        assert 1 <= len(ids) <= 5 and len(ids) == len(logprobs)
        assert tokenizer.eos_token_id not in ids[:-1]  # nothing is kept after the end of the turn
        assert all(lp <= 0 for lp in logprobs)


def test_logprobs_match_a_teacher_forced_forward(tiny_model, tokenizer):
    torch.manual_seed(0)
    temperature = 0.7
    generator = TransformersGenerator(tiny_model, tokenizer)
    prompts = [tokenizer.encode("H F G", add_special_tokens=False), tokenizer.encode("left right", add_special_tokens=False)]
    out = generator.generate(prompts, SamplingParams(max_new_tokens=6, temperature=temperature))
    for prompt, ids, logprobs in zip(prompts, out.completion_ids, out.logprobs, strict=True):
        sequence = torch.tensor([prompt + ids])
        with torch.no_grad():
            logits = tiny_model(sequence).logits[0, len(prompt) - 1 : -1] / temperature
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)


def test_greedy_is_deterministic_and_sub_batching_is_equivalent(tiny_model, tokenizer):
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ["P F", "F H G", "up down", "S"]]
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    whole = TransformersGenerator(tiny_model, tokenizer).generate(prompts, greedy)
    again = TransformersGenerator(tiny_model, tokenizer, batch_size=3).generate(prompts, greedy)
    assert whole.completion_ids == again.completion_ids
    assert TransformersGenerator(tiny_model, tokenizer).generate([], greedy).completion_ids == []


def test_model_training_mode_is_restored(tiny_model, tokenizer):
    tiny_model.train()
    TransformersGenerator(tiny_model, tokenizer).generate([[5, 6]], SamplingParams(max_new_tokens=2))
    assert tiny_model.training
