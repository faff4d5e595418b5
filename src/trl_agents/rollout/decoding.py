"""Token-level helpers every generator backend shares: cutting sampled rows at EOS, and naming the sampling options
that shape the distribution beyond temperature. They sit below `generators.py` and `fast_generation.py` so that
neither imports the other at module level.

Example:
    >>> from trl_agents.rollout.decoding import cut_at_eos
    >>> cut_at_eos([[5, 2, 7]], [[-0.1, -0.2, -0.3]], eos_token_ids=[2])
    ([[5, 2]], [[-0.1, -0.2]])
"""

from __future__ import annotations

from collections.abc import Sequence


def cut_at_eos(
    tokens: list[list[int]], logprobs: list[list[float]], eos_token_ids: Sequence[int]
) -> tuple[list[list[int]], list[list[float]]]:
    """Cut every row after its first EOS (kept: the policy learns to end its turn)."""
    eos = set(eos_token_ids)
    cut_ids, cut_logprobs = [], []
    for row, row_logprobs in zip(tokens, logprobs, strict=True):
        end = next((position + 1 for position, token in enumerate(row) if token in eos), len(row))
        cut_ids.append(row[:end])
        cut_logprobs.append(row_logprobs[:end])
    return cut_ids, cut_logprobs


def shaping_options(top_p=None, top_k=None, min_p=None, repetition_penalty=None) -> list[str]:
    """Names of the given options that shape the sampling distribution beyond temperature (backend "paged" cannot
    record our log-probs under those)."""
    shaping = {
        "top_p": top_p not in (None, 1.0),
        "top_k": top_k not in (None, 0),
        "min_p": min_p is not None,
        "repetition_penalty": repetition_penalty not in (None, 1.0),
    }
    return [name for name, used in shaping.items() if used]
