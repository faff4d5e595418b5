"""The offline tiny model and tokenizer have a real chat model's token hygiene (docs/concepts/trl_internals.md)."""

from __future__ import annotations

from trl.chat_template_utils import qwen2_5_chat_template

from trl_agents.testing import build_tiny_model, build_tiny_tokenizer, save_tiny_model


def test_tokenizer_token_hygiene():
    tokenizer = build_tiny_tokenizer(["P F F H\nF H F G"], vocab_size=400)
    assert tokenizer.chat_template == qwen2_5_chat_template
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"
    ids = tokenizer.encode("<tool_call>x</tool_call>", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids[0]) == "<tool_call>"
    assert "<tool_call>" in tokenizer.decode(ids, skip_special_tokens=True)  # markup is not special
    assert len(tokenizer.encode(" F", add_special_tokens=False)) == 1  # corpus words become single tokens


def test_model_and_saved_directory(tmp_path):
    tokenizer = build_tiny_tokenizer(vocab_size=300)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    assert model.config.vocab_size == len(tokenizer) and model.generation_config.eos_token_id == [tokenizer.eos_token_id]
    assert sum(p.numel() for p in model.parameters()) < 100_000
    path = save_tiny_model(tmp_path / "m", vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoTokenizer.from_pretrained(path).chat_template == qwen2_5_chat_template
    assert AutoModelForCausalLM.from_pretrained(path).config.hidden_size == 32


def test_a_saved_tiny_model_reloads_with_the_tokenizer_it_was_trained_with(tmp_path):
    # transformers' AutoTokenizer rebuilds a Qwen2 checkpoint's pre-tokenizer from its registered class, which splits
    # "20" into "2", "0" where our BPE has one token: a warm-started model reloaded that way saw prompts it never saw
    # (found on the corridor test-bed). `load_tokenizer` and the run's model loading keep the saved tokenizer.json.
    from trl_agents import AgentGRPOConfig
    from trl_agents.loading import load_tokenizer
    from trl_agents.run import RunArguments, _load_model
    from trl_agents.testing import tiny_training_config

    text = "room 7 of 20\nsign: east\ndoors: a b c"
    tokenizer = build_tiny_tokenizer([text] * 20, vocab_size=400)
    tokenizer.save_pretrained(tmp_path)
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1).save_pretrained(tmp_path)
    expected = tokenizer(text)["input_ids"]
    reloaded = load_tokenizer(str(tmp_path), padding_side="left")
    assert reloaded(text)["input_ids"] == expected
    assert reloaded.chat_template == tokenizer.chat_template and reloaded.eos_token == tokenizer.eos_token

    from trl.trainer.model_config import ModelConfig

    config = tiny_training_config(AgentGRPOConfig, tmp_path / "run", env_name="corridor")
    _, loaded, _ = _load_model(RunArguments(method="grpo"), config, ModelConfig(model_name_or_path=str(tmp_path)))
    assert loaded(text)["input_ids"] == expected
