"""SDAR: OPSD as a gated auxiliary term of GRPO, on the sampled tokens only.

SDAR (Lu et al. 2026, "Self-Distilled Agentic Reinforcement Learning", arXiv 2605.15155; reference code
`ZJU-REAL/SDAR`, `verl/trainer/ppo/sdar_utils.py::compute_sdar_loss` and its call in the actor's update). The
teacher is the policy itself with skills text prepended to the step prompt; it scores the student's own tokens.
Per response token t (sg = stop-gradient):

    Δ_t = sg(log π_T(y_t | s_t⁺)) − sg(log π_θ(y_t | s_t))      teacher–student gap of the sampled token
    g_t = sg(σ(β·Δ_t))                                          gate, β = 5: trust the teacher where it is surer
    ℓ_t = g_t · (log π_T(y_t) − log π_θ(y_t))                   only log π_θ is differentiable
        ⇒ ∂ℓ_t/∂log π_θ(y_t) = −g_t
    L   = L_GRPO + λ · token-mean(ℓ)                            λ = 0.01

β = 0 gives g ≡ 0.5, the reference's "GRPO+OPSD" ablation (an ungated sampled-token distillation term). ℓ_t's
value is g_t·Δ_t, which is negative where the teacher likes the token less than the student: it is a surrogate
whose gradient matters, not a divergence.

Non-finite inputs: a token whose teacher or student log-prob is not finite (−inf for a token the teacher's view
cannot produce, NaN from a bad forward) has no usable gap; its gate is 0, its term ℓ_t is 0 and it sends no
gradient. The reference code has no such guard (its σ(−inf)·(−inf − x) is NaN).
"""

from __future__ import annotations

import math

import torch

from .opsd import finite_token_pairs


def sdar_gate(delta: torch.Tensor, beta: float = 5.0) -> torch.Tensor:
    """The detached SDAR gate g = σ(β·Δ), elementwise; 0 where Δ is not finite.

    Args:
        delta: Δ_t = log π_T(y_t) − log π_θ(y_t), any shape.
        beta: β ≥ 0, the gate's sharpness (SDAR `gate_beta`, 5.0); 0 gives g ≡ 0.5.

    >>> import torch
    >>> [round(g, 5) for g in sdar_gate(torch.tensor([1.0, -1.0, 0.0, 0.2])).tolist()]
    [0.99331, 0.00669, 0.5, 0.73106]
    >>> sdar_gate(torch.tensor([3.0, -3.0]), beta=0.0)
    tensor([0.5000, 0.5000])
    """
    _check_beta(beta)
    delta = delta.detach()
    finite = torch.isfinite(delta)
    safe = torch.where(finite, delta, torch.zeros_like(delta))
    return torch.where(finite, torch.sigmoid(beta * safe), torch.zeros_like(safe))  # g = σ(β·Δ)


def sdar_token_terms(student_logps: torch.Tensor, teacher_logps: torch.Tensor, beta: float = 5.0) -> torch.Tensor:
    """Per-token SDAR terms ℓ_t = g_t·(log π_T(y_t) − log π_θ(y_t)), gradient −g_t on each log π_θ(y_t).

    Args:
        student_logps: (B, T) log π_θ(y_t) of the sampled tokens under the plain prompt (with gradient).
        teacher_logps: (B, T) log π_T(y_t) of the same tokens under the privileged prompt (detached here).
        beta: β ≥ 0 of the gate (5.0; 0 = the GRPO+OPSD ablation, g ≡ 0.5).

    Returns:
        (B, T) terms; the loss is λ·`masked_token_mean(terms, completion_mask)` added to the policy loss. Tokens
        with a non-finite log-prob give 0 (module docstring).

    Example (Δ = [1, −1, 0, 0.2]: g = σ(5Δ) = [0.99331, 0.00669, 0.5, 0.73106]):
        >>> import torch
        >>> student = torch.zeros(1, 4, requires_grad=True)
        >>> terms = sdar_token_terms(student, torch.tensor([[1.0, -1.0, 0.0, 0.2]]))
        >>> [round(v, 5) for v in terms[0].tolist()]  # g·Δ
        [0.99331, -0.00669, 0.0, 0.14621]
        >>> terms.sum().backward()
        >>> [round(v, 5) for v in student.grad[0].tolist()]  # −g
        [-0.99331, -0.00669, -0.5, -0.73106]
    """
    _check_beta(beta)
    student, teacher, finite = finite_token_pairs(student_logps, teacher_logps)  # non-finite tokens zeroed
    delta = teacher - student.detach()  # Δ_t = sg(log π_T) − sg(log π_θ)
    gate = torch.where(finite, sdar_gate(delta, beta), torch.zeros_like(delta))  # g_t = sg(σ(β·Δ_t))
    return gate * (teacher - student)  # ℓ_t = g_t·(log π_T − log π_θ)


def _check_beta(beta: float) -> None:
    if isinstance(beta, bool) or not (isinstance(beta, int | float) and math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta (the SDAR gate sharpness) must be a finite number >= 0, e.g. 5.0, got {beta!r}")
