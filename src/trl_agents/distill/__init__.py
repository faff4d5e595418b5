"""Self-distillation: teacher signals under privileged views, and the distillation / auxiliary losses built on them.

A self-distillation method shows the policy's own tokens to a teacher (usually the same model, given text the
student does not see: skills, hints, the solution) and turns the teacher's scores into a training signal. The
trainer computes the signals (teacher log-probs or logits on the recorded tokens); this package holds the math:
pure functions of recorded tokens and signals, free of trainer plumbing, one file per method.

- `opsd`: OPSD (arXiv 2601.18734) — the per-token generalized JSD over the vocabulary, its sampled-token
  variant, and the masked token mean used to reduce both.
- `sdar`: SDAR (arXiv 2605.15155) — the sigmoid-gated sampled-token term added to GRPO.

Example:
    >>> import torch
    >>> from trl_agents.distill import masked_token_mean, sdar_token_terms
    >>> terms = sdar_token_terms(torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]), beta=0.0)  # g ≡ 0.5: [0, 0.5]
    >>> masked_token_mean(terms, torch.tensor([[True, True]]))
    tensor(0.2500)
"""

from .opsd import generalized_jsd, masked_token_mean, sampled_token_distillation
from .sdar import sdar_gate, sdar_token_terms

__all__ = [
    "generalized_jsd",
    "masked_token_mean",
    "sampled_token_distillation",
    "sdar_gate",
    "sdar_token_terms",
]
