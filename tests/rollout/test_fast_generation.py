"""Fast generation backends of TransformersGenerator: "static" (static KV cache, CUDA graphs on GPUs) and "paged"
(transformers continuous batching) give what plain `model.generate` gives.

On CPU the static backend runs its decode loop eagerly; the CUDA-graph protocol (record once per padded batch size,
check the recorded step against the eager one, replay) runs here with an eager stand-in for the graph recorder.
"""

from __future__ import annotations

import logging

import pytest
import torch

from trl_agents.rollout import fast_generation, generators
from trl_agents.rollout.fast_generation import StaticCacheDecoder
from trl_agents.rollout.generators import SamplingParams, TransformersGenerator

PROMPT_TEXTS = ["P F F H", "up", "F H G left right down", "S", "down down", "G H", "right"]
PAGED_TEST_SIZES = {"num_blocks": 16, "max_batch_tokens": 128, "block_size": 32}  # small: CPU sizing is slow


def prompts(tokenizer, count):
    return [tokenizer.encode(text, add_special_tokens=False) for text in PROMPT_TEXTS[:count]]


class EagerRecorder:
    """Stands in for CudaGraphRecorder on CPU: a "replay" re-runs the recorded step into the same output tensor,
    which is what a CUDA graph does with its static buffers. `corrupt=True` records a step that ignores its
    inputs (as a graph reading stale buffers would)."""

    def __init__(self, corrupt: bool = False):
        self.corrupt = corrupt
        self.recorded = 0

    def __call__(self, step):
        self.recorded += 1
        output = step().clone()

        def replay():
            output.copy_(torch.zeros_like(output) if self.corrupt else step())

        return replay, output


def generate(model, tokenizer, texts, sampling, backend, seed=0, **kwargs):
    generator = TransformersGenerator(model, tokenizer, backend=backend, **kwargs)
    torch.manual_seed(seed)
    return generator, generator.generate(texts, sampling)


def assert_same(expected, actual, atol=1e-4):
    assert actual.completion_ids == expected.completion_ids
    for want, got in zip(expected.logprobs, actual.logprobs, strict=True):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=atol)


@pytest.mark.parametrize("count", [1, 3, 5, 7])
def test_static_greedy_matches_generate(tiny_model, tokenizer, count):
    texts = prompts(tokenizer, count)  # different lengths, and 3, 5, 7 rows pad the batch to 4, 8, 8
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    _, expected = generate(tiny_model, tokenizer, texts, greedy, "generate")
    generator, actual = generate(tiny_model, tokenizer, texts, greedy, "static")
    assert generator.active_backend == "static"
    assert_same(expected, actual)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=7, temperature=0.7),
        SamplingParams(max_new_tokens=5, temperature=1.3, top_p=0.9, top_k=40, min_p=0.01, repetition_penalty=1.2),
    ],
    ids=["temperature", "all-processors"],
)
def test_static_sampling_gives_generates_tokens_for_a_seed(tiny_model, tokenizer, sampling):
    texts = prompts(tokenizer, 5)
    for seed in (0, 1):
        _, expected = generate(tiny_model, tokenizer, texts, sampling, "generate", seed=seed)
        _, actual = generate(tiny_model, tokenizer, texts, sampling, "static", seed=seed)
        assert_same(expected, actual)


def test_static_cuts_at_eos_and_follows_per_turn_budgets_across_calls(tiny_model, tokenizer):
    # A third of the vocabulary ends a turn, so rows finish at different steps and some calls end early.
    eos = list(range(0, len(tokenizer), 3))
    plain = TransformersGenerator(tiny_model, tokenizer, eos_token_ids=eos, backend="generate")
    fast = TransformersGenerator(tiny_model, tokenizer, eos_token_ids=eos, backend="static")
    fast.static_decoder = StaticCacheDecoder(fast.pad_token_id, eos, graph_recorder=EagerRecorder(), length_multiple=8)
    lengths = set()
    for call, budget in enumerate([3, 9, 2, 12, 5]):  # budgets grow past the cache length: the slot is rebuilt
        texts = prompts(tokenizer, 2 + call)
        sampling = SamplingParams(max_new_tokens=budget, temperature=1.0)
        torch.manual_seed(call)
        expected, next_draw = plain.generate(texts, sampling), torch.rand(())
        torch.manual_seed(call)
        actual = fast.generate(texts, sampling)
        assert_same(expected, actual)
        assert torch.rand(()) == next_draw  # the same random draws as generate, so later turns sample alike too
        for ids in actual.completion_ids:
            assert len(ids) <= budget and not any(t in eos for t in ids[:-1])
            lengths.add(len(ids))
    assert len(lengths) > 2  # rows really ended at different steps


def test_static_with_a_lora_adapter_matches_generate(tiny_model, tokenizer):
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)  # non-zero adapter
    model = peft.get_peft_model(tiny_model, lora)
    texts = prompts(tokenizer, 3)
    sampling = SamplingParams(max_new_tokens=5, temperature=0.9)
    _, expected = generate(model, tokenizer, texts, sampling, "generate")
    assert_same(expected, generate(model, tokenizer, texts, sampling, "static")[1])


def test_recorded_steps_replay_like_eager_ones_and_are_reused(tiny_model, tokenizer):
    texts = prompts(tokenizer, 3)
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    _, expected = generate(tiny_model, tokenizer, texts, greedy, "generate")
    recorder = EagerRecorder()
    generator = TransformersGenerator(tiny_model, tokenizer, backend="static")
    generator.static_decoder = StaticCacheDecoder(generator.pad_token_id, generator.eos_token_ids, recorder)
    for _ in range(3):
        assert_same(expected, generator.generate(texts, greedy))
    assert recorder.recorded == 1  # one padded batch size, one recording, replayed by every call
    generator.generate(prompts(tokenizer, 7), greedy)
    assert recorder.recorded == 2


def test_weight_updates_are_seen_and_moved_weights_are_recorded_again(tiny_model, tokenizer):
    texts = prompts(tokenizer, 4)
    greedy = SamplingParams(max_new_tokens=5, greedy=True)
    recorder = EagerRecorder()
    generator = TransformersGenerator(tiny_model, tokenizer, backend="static")
    generator.static_decoder = StaticCacheDecoder(generator.pad_token_id, generator.eos_token_ids, recorder)
    before = generator.generate(texts, greedy)
    with torch.no_grad():  # an optimizer step: in place, same storage
        for parameter in tiny_model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    after = generator.generate(texts, greedy)
    assert recorder.recorded == 1 and after.completion_ids != before.completion_ids
    assert_same(generate(tiny_model, tokenizer, texts, greedy, "generate")[1], after)
    tiny_model.lm_head.weight.data = tiny_model.lm_head.weight.data.clone()  # new storage (e.g. a ZeRO-3 gather)
    assert_same(after, generator.generate(texts, greedy))
    assert recorder.recorded == 2


def test_a_recorded_step_that_disagrees_fails_at_set_up(tiny_model, tokenizer):
    generator = TransformersGenerator(tiny_model, tokenizer, backend="static")
    generator.static_decoder = StaticCacheDecoder(generator.pad_token_id, generator.eos_token_ids, EagerRecorder(True))
    with pytest.raises(RuntimeError, match="recorded decode step differs"):
        generator.generate(prompts(tokenizer, 2), SamplingParams(max_new_tokens=3, greedy=True))


def test_auto_uses_generate_on_cpu(tiny_model, tokenizer):
    generator, _ = generate(tiny_model, tokenizer, prompts(tokenizer, 2), SamplingParams(max_new_tokens=3), "auto")
    assert generator.active_backend == "generate" and generator.static_decoder is None


def test_auto_falls_back_to_generate_with_a_warning(tiny_model, tokenizer, monkeypatch, caplog):
    monkeypatch.setattr(generators, "auto_backend", lambda device: "static")  # as on a CUDA device
    texts = prompts(tokenizer, 3)
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    generator = TransformersGenerator(tiny_model, tokenizer)
    generator.static_decoder = StaticCacheDecoder(generator.pad_token_id, generator.eos_token_ids, EagerRecorder(True))
    with caplog.at_level(logging.WARNING, logger="trl_agents.rollout.generators"):
        out = generator.generate(texts, greedy)
    assert "using model.generate from now on" in caplog.text
    assert_same(generate(tiny_model, tokenizer, texts, greedy, "generate")[1], out)
    assert generator.active_backend == "generate" and generator.static_decoder is None
    generator.generate(texts, greedy)
    assert generator.active_backend == "generate"  # for good


def test_auto_falls_back_for_a_model_the_static_path_does_not_support(tokenizer, monkeypatch, caplog):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    monkeypatch.setattr(generators, "auto_backend", lambda device: "static")
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, use_sliding_window=True, sliding_window=4,
        layer_types=["full_attention", "sliding_attention"],
    )
    model = Qwen2ForCausalLM(config)
    with pytest.raises(NotImplementedError, match="full-attention"):
        generate(model, tokenizer, prompts(tokenizer, 2), SamplingParams(max_new_tokens=3), "static")
    with caplog.at_level(logging.WARNING):
        generator, _ = generate(model, tokenizer, prompts(tokenizer, 2), SamplingParams(max_new_tokens=3), "auto")
    assert generator.active_backend == "generate" and "static (CUDA graph)" in caplog.text


def test_static_restores_the_models_mode_and_attention(tiny_model, tokenizer):
    tiny_model.train()
    attention = tiny_model.config._attn_implementation
    generate(tiny_model, tokenizer, prompts(tokenizer, 2), SamplingParams(max_new_tokens=3), "static")
    assert tiny_model.training and tiny_model.config._attn_implementation == attention


def test_decode_attention_folds_grouped_query_heads_exactly():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Attention(torch.nn.Module):
        num_key_value_groups = 3
        is_causal = True

    torch.manual_seed(0)
    query, key, value = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    mask = torch.rand(2, 1, 1, 10) > 0.3
    mask[..., 0] = True
    folded, _ = fast_generation._grouped_query_sdpa(Attention(), query, key, value, mask, scaling=0.3)
    copied, _ = sdpa_attention_forward(Attention(), query, key, value, mask, scaling=0.3)
    assert folded.shape == copied.shape == (2, 1, 6, 8)
    assert torch.allclose(folded, copied, atol=1e-6)


def test_unknown_backend_is_a_clear_error(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'generate', 'static', 'paged', got 'vllm'"):
        TransformersGenerator(tiny_model, tokenizer, backend="vllm")


# ---- paged: transformers continuous batching ----------------------------------------------------------------------


def test_paged_greedy_matches_generate(tiny_model, tokenizer):
    texts = prompts(tokenizer, 5)
    greedy = SamplingParams(max_new_tokens=5, greedy=True)
    _, expected = generate(tiny_model, tokenizer, texts, greedy, "generate")
    _, actual = generate(
        tiny_model, tokenizer, texts, greedy, "paged", continuous_batching_config=PAGED_TEST_SIZES
    )
    assert_same(expected, actual)


def test_paged_sampling_records_our_logprobs_and_repeats_for_a_seed(tiny_model, tokenizer):
    # Continuous batching draws its own random numbers, so its samples are not generate's; they are repeatable
    # under torch.manual_seed and their log-probs are log_softmax(logits / T) of a teacher-forced forward.
    texts = prompts(tokenizer, 4)
    sampling = SamplingParams(max_new_tokens=5, temperature=0.7)
    options = {"continuous_batching_config": PAGED_TEST_SIZES}
    _, first = generate(tiny_model, tokenizer, texts, sampling, "paged", seed=3, **options)
    _, again = generate(tiny_model, tokenizer, texts, sampling, "paged", seed=3, **options)
    assert again.completion_ids == first.completion_ids
    for prompt, ids, logprobs in zip(texts, first.completion_ids, first.logprobs, strict=True):
        with torch.no_grad():
            logits = tiny_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)


def test_paged_refuses_shaped_sampling(tiny_model, tokenizer):
    generator = TransformersGenerator(tiny_model, tokenizer, backend="paged")
    with pytest.raises(ValueError, match="when top_p, repetition_penalty is set"):
        generator.generate(prompts(tokenizer, 2), SamplingParams(max_new_tokens=3, top_p=0.9, repetition_penalty=1.1))


# ---- the trainer's config field -----------------------------------------------------------------------------------


def agent_config(tmp_path, **fields):
    from trl_agents import AgentGRPOConfig

    return AgentGRPOConfig(
        str(tmp_path), per_device_train_batch_size=2, num_generations=2, report_to="none", **fields
    )


def test_config_generation_backend(tmp_path):
    assert agent_config(tmp_path).generation_backend == "auto"
    assert agent_config(tmp_path, use_transformers_continuous_batching=True).generation_backend == "paged"
    with pytest.raises(ValueError, match="generation_backend must be one of"):
        agent_config(tmp_path, generation_backend="fast")
    with pytest.raises(ValueError, match="selects generation_backend='paged', but generation_backend='static'"):
        agent_config(tmp_path, use_transformers_continuous_batching=True, generation_backend="static")
    with pytest.raises(ValueError, match="temperature only, but top_k is set"):
        agent_config(tmp_path, generation_backend="paged", top_k=20)


@pytest.mark.slow
def test_one_training_iteration_with_the_static_backend(train_one_iteration):
    trainer = train_one_iteration("test-keyword", [{"seed": 0}, {"seed": 1}], generation_backend="static")
    assert trainer.generator.active_backend == "static"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_give_generates_tokens(tokenizer):
    from trl_agents.testing import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2).cuda()
    texts = prompts(tokenizer, 5)
    greedy = SamplingParams(max_new_tokens=8, greedy=True)
    _, expected = generate(model, tokenizer, texts, greedy, "generate")
    generator, actual = generate(model, tokenizer, texts, greedy, "auto")
    assert generator.active_backend == "static"
    assert all(slot.replay is not None for slot in generator.static_decoder._slots.values())
    assert_same(expected, actual, atol=1e-3)
    sampling = SamplingParams(max_new_tokens=8, temperature=0.8)
    _, expected = generate(model, tokenizer, texts, sampling, "generate", seed=1)
    torch.manual_seed(1)
    assert generator.generate(texts, sampling).completion_ids == expected.completion_ids
