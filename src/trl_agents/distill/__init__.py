"""Self-distillation: teacher signals under privileged views, and the distillation / auxiliary losses built on them.

A self-distillation method shows the policy's own tokens to a teacher (usually the same model, given text the
student does not see: skills, hints, the solution) and turns the teacher's scores into a training signal. The
trainer computes the signals (teacher log-probs or logits on the recorded tokens); this package holds the math:
pure functions of recorded tokens and signals, free of trainer plumbing, one file per method.

- `opsd`: OPSD (arXiv 2601.18734) — the per-token generalized JSD over the vocabulary, its sampled-token
  variant, and the masked token mean used to reduce both.
- `sdar`: SDAR (arXiv 2605.15155) — the sigmoid-gated sampled-token term added to GRPO.
- `ocsd`: OCSD (arXiv 2608.04788) — the observation residual of two replay views (the `ocsd_residual` signal) and
  the sign-preserving per-token modulation of GRPO's advantage on each trajectory's most uncertain steps.
- `adrs`: ADRS (arXiv 2608.03223) — the teacher's within-step standardised token scores, gated by the Teacher Value
  Advantage and added (scheduled, clipped) to GRPO's per-token advantage.
- `grsd`: GRSD (arXiv 2607.28076) — the turn-level modulation of GRPO's advantage by a guidance-conditioned
  self-teacher's gap (groups with a success and a failure), and the z-scored judge advantages and loss terms of the
  policy's reflections.
- `pcsd`: PCSD (arXiv 2608.01837) — SDAR's sampled-token term with persistent-consistency weights (decayed look-ahead
  windows of the teacher–student gap within the turn, damped where it declines).
- `envrl`: EnvRL (arXiv 2606.17680) — the state-prediction and inverse-dynamics SFT examples of each transition, their
  packing and token-mean NLL, and the cosine decay of their weights.
- `dark_room`: the Dark Room study (arXiv 2607.21273) — prediction accuracy, potential-based shaping of the reward
  with it, and the variance-profile diagnostics (dense share of the advantage, all-fail groups).

Example:
    >>> import torch
    >>> from trl_agents.distill import masked_token_mean, sdar_token_terms
    >>> terms = sdar_token_terms(torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]), beta=0.0)  # g ≡ 0.5: [0, 0.5]
    >>> masked_token_mean(terms, torch.tensor([[True, True]]))
    tensor(0.2500)
"""

from .adrs import ADRSParams, adrs_advantages, adrs_eta_schedule
from .dark_room import (
    collapse_diagnostics,
    dense_share,
    potentials,
    prediction_similarity,
    shaped_group,
    shaping_terms,
)
from .envrl import (
    Example,
    build_step_examples,
    example_nll,
    id_example,
    pack_examples,
    schedule_coefficient,
    shuffle_targets,
    sp_example,
    target_token_nll,
    token_mean,
)
from .grsd import (
    group_has_mix,
    modulated_advantages,
    reflection_advantages,
    reflection_token_terms,
    turn_logprob_gap,
    turn_modulation,
    warmdown_lambda,
)
from .ocsd import (
    OCSDParams,
    modulate_advantage,
    ocsd_advantages,
    replay_views,
    residual_gate,
    select_steps,
    step_uncertainty,
)
from .opsd import generalized_jsd, masked_token_mean, sampled_token_distillation
from .pcsd import pcsd_token_terms, pcsd_weights
from .sdar import sdar_gate, sdar_token_terms

__all__ = [
    "ADRSParams",
    "Example",
    "OCSDParams",
    "adrs_advantages",
    "adrs_eta_schedule",
    "build_step_examples",
    "collapse_diagnostics",
    "dense_share",
    "example_nll",
    "generalized_jsd",
    "group_has_mix",
    "id_example",
    "masked_token_mean",
    "modulate_advantage",
    "modulated_advantages",
    "ocsd_advantages",
    "pack_examples",
    "pcsd_token_terms",
    "pcsd_weights",
    "potentials",
    "prediction_similarity",
    "reflection_advantages",
    "reflection_token_terms",
    "replay_views",
    "residual_gate",
    "sampled_token_distillation",
    "schedule_coefficient",
    "sdar_gate",
    "sdar_token_terms",
    "select_steps",
    "shaped_group",
    "shaping_terms",
    "shuffle_targets",
    "sp_example",
    "step_uncertainty",
    "target_token_nll",
    "token_mean",
    "turn_logprob_gap",
    "turn_modulation",
    "warmdown_lambda",
]
