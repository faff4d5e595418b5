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
