"""Offline tiny models for tests and the quickstart: a Qwen2-style model and a locally trained tokenizer.

Nothing here touches the Hub. The tokenizer is a byte-level BPE trained in a second on a small corpus (pass the
prompts your environment renders, so that grid cells and action words become single tokens), with the special
tokens of Qwen2.5 and TRL's own Qwen2.5 chat template, so it behaves like a real chat model's tokenizer:
`<|im_end|>` ends a turn (EOS), `<|endoftext|>` pads.

Example:
    >>> from trl_agents.testing import build_tiny_tokenizer, build_tiny_model
    >>> tokenizer = build_tiny_tokenizer(["up down left right"])
    >>> model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    >>> text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    >>> text.endswith("<|im_start|>assistant\\n")
    True
"""

from __future__ import annotations

import os
from collections.abc import Iterable

PAD_TOKEN = "<|endoftext|>"
BOS_TURN_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
# Qwen adds these as non-special tokens, so decoding keeps them (docs/concepts/trl_internals.md, "token hygiene").
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

_BASE_CORPUS = (
    "system user assistant You are a helpful assistant.",
    "up down left right Up Down Left Right",
    "<action>up</action> <action>down</action> <action>left</action> <action>right</action>",
    "The quick brown fox jumps over the lazy dog. Answer with exactly one word.",
    "Observation Action Current observation Recent history Invalid action Reply with one of",
    "0 1 2 3 4 5 6 7 8 9 10 # _ O X * P S F H G .",
)


def chat_template() -> str:
    """TRL's Qwen2.5 chat template, byte for byte (TRL recognises it and can parse tool calls with it)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def build_tiny_tokenizer(corpus: Iterable[str] = (), vocab_size: int = 1024):
    """Train a byte-level BPE tokenizer on `corpus` (plus a small built-in corpus) and wrap it for transformers.

    Args:
        corpus: Texts the model will see (rendered prompts and actions). Frequent words become single tokens.
        vocab_size: Target vocabulary size, special tokens included. Byte-level BPE always covers any text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, BOS_TURN_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([*_BASE_CORPUS, *corpus], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        padding_side="left",
        truncation_side="left",
    )
    tokenizer.add_tokens(list(MARKUP_TOKENS))
    tokenizer.chat_template = chat_template()
    return tokenizer


def build_tiny_model(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    seed: int = 0,
):
    """A randomly initialised Qwen2ForCausalLM sized for CPU tests (about 100k parameters by default)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
    )
    return model


def save_tiny_model(
    path: str | os.PathLike,
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    **model_kwargs,
) -> str:
    """Build a tiny model + tokenizer and save both to `path`, which then loads like any Hub model id.

    A saved directory is what `AgentGRPOTrainer(model=path)` needs when `beta > 0` (TRL re-creates the
    reference model from the model's name or path).
    """
    tokenizer = build_tiny_tokenizer(corpus, vocab_size=vocab_size)
    model = build_tiny_model(tokenizer, **model_kwargs)
    path = os.fspath(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def env_corpus(env_name: str, num_tasks: int = 64, max_turns: int = 8, seed: int = 0, **env_kwargs) -> list[str]:
    """Texts an environment shows: instructions and observations of random-action episodes (a tokenizer corpus)."""
    import random

    from .envs import get_env_class, make_env

    rng = random.Random(seed)
    env = make_env(env_name, **env_kwargs)
    texts = [env.instructions]
    tasks = get_env_class(env_name).task_split("train", num_tasks, **env_kwargs)
    for task in tasks:
        texts.append(env.reset(task))
        for _ in range(max_turns):
            observation, _, done, _ = env.step(rng.choice(["up", "down", "left", "right", "wait"]))
            texts.append(observation)
            if done:
                break
    return texts


# A CPU-sized training run: a few steps, a high learning rate (so that a tiny model visibly changes), nothing saved or
# reported. Tests and notebooks override what they exercise.
TINY_TRAINING_SETTINGS = {
    "max_steps": 2,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 4,
    "max_completion_length": 4,
    "max_turns": 3,
    "learning_rate": 1e-2,
    "logging_steps": 1,
    "report_to": "none",
    "save_strategy": "no",
    "gradient_checkpointing": False,
    "disable_tqdm": True,
    "seed": 0,
}


def tiny_training_config(config_class, output_dir, **overrides):
    """`config_class` (AgentGRPOConfig or a method's config) with `TINY_TRAINING_SETTINGS` and `overrides`.

    Example:
        >>> from trl_agents import AgentGRPOConfig
        >>> config = tiny_training_config(AgentGRPOConfig, "/tmp/tiny-run", max_turns=2)
        >>> config.max_steps, config.max_turns, config.num_generations
        (2, 2, 4)
    """
    return config_class(output_dir=str(output_dir), **{**TINY_TRAINING_SETTINGS, **overrides})
