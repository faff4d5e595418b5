"""Loading a checkpoint's tokenizer as it was saved.

`AutoTokenizer` picks the tokenizer class from the model type for some architectures (Qwen2 among them, whose Hub
repos once named a wrong class) and then rebuilds that class's own normaliser and pre-tokenizer instead of the ones
in `tokenizer.json`. For a real Qwen2 checkpoint the two agree; for one whose tokenizer was trained locally (the tiny
models of `trl_agents.testing`, saved by a warm start or a run) they do not: the rebuilt pre-tokenizer splits digits
and words differently from the BPE the model was trained with, so the reloaded model sees prompts it never saw.

`load_tokenizer` loads such a checkpoint — one whose `tokenizer_config.json` names the generic tokenizers backend —
with that backend, exactly as saved, and defers to `AutoTokenizer` for everything else (Hub models by name included).

Example:
    >>> import tempfile
    >>> from trl_agents.testing import build_tiny_model, build_tiny_tokenizer
    >>> tokenizer = build_tiny_tokenizer(["room 7 of 20"])
    >>> folder = tempfile.mkdtemp()
    >>> build_tiny_model(tokenizer, hidden_size=32, num_layers=1).save_pretrained(folder)
    >>> tokenizer.save_pretrained(folder) and None
    >>> load_tokenizer(folder)("room 7 of 20")["input_ids"] == tokenizer("room 7 of 20")["input_ids"]
    True
"""

from __future__ import annotations

import json
import os
from typing import Any

# The class names transformers writes for a tokenizer built from a `tokenizers.Tokenizer` object (v5, and v4's alias).
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(name_or_path: str, **kwargs: Any):
    """The tokenizer of a local checkpoint or Hub id: `PreTrainedTokenizerFast.from_pretrained` (the saved
    `tokenizer.json`, unchanged) when a local folder's `tokenizer_config.json` names a generic backend class,
    `AutoTokenizer.from_pretrained` otherwise. `kwargs` go to either (e.g. `padding_side`, `revision`)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config_path = os.path.join(name_or_path, "tokenizer_config.json")
    if os.path.isfile(config_path) and os.path.isfile(os.path.join(name_or_path, "tokenizer.json")):
        with open(config_path) as handle:
            if json.load(handle).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
                return PreTrainedTokenizerFast.from_pretrained(name_or_path, **kwargs)
    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)
