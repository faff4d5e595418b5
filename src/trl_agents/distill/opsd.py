"""OPSD losses: the student matches a privileged teacher (the same model, shown extra text) on its own tokens.

OPSD (Zhao et al. 2026, "Self-Distilled Reasoner: On-Policy Self-Distillation for Large Language Models",
arXiv 2601.18734; reference code `siyan-zhao/OPSD`, `opsd_trainer.py::generalized_jsd_loss` and the sampled-token
branch of `compute_loss`). The student samples y ~ π_θ(·|x); the teacher scores the same tokens under x ⊕ c
(c = the privileged text). Per response position t, with the logits of both divided by the temperature τ:

    p_S = softmax(z_S / τ),  p_T = softmax(z_T / τ)              over the vocabulary (or the teacher's top k)
    M   = (1 − β)·p_S + β·p_T                                    mixture
    L_t = β·KL(p_T ‖ M) + (1 − β)·KL(p_S ‖ M)                    generalized JSD (GKD, arXiv 2306.13649, Eq. 1)
    β = 0:  L_t = KL(p_T ‖ p_S)     forward KL   } the formula above is 0 at both ends; like the reference code
    β = 1:  L_t = KL(p_S ‖ p_T)     reverse KL   } we use the limits of L_t/β and L_t/(1 − β) there
    L   = mean over the response tokens of L_t                   (`masked_token_mean`)

The memory-light variant (the reference's `--use_tinker_loss`) keeps only the sampled token's log-probabilities:

    A_t = sg(log p_T(y_t) − log p_S(y_t))                        a per-token "advantage", no gradient
    ℓ_t = −A_t · log p_S(y_t)                                    ∂ℓ_t/∂log p_S(y_t) = −A_t

The teacher never receives a gradient (it is detached here). Rules for inputs that are not finite:

- `generalized_jsd`: a −inf logit is a token of probability 0 and contributes 0 (0·log 0 = 0). A position whose
  student or teacher logits contain NaN or +inf, or no finite value at all, has no distribution to match: its loss
  is 0 and it sends no gradient. Under β = 0 a token the teacher can emit but the student gives probability exactly
  0 makes KL(p_T ‖ p_S) infinite; it is reported as a huge finite number (~1e30; the largest finite value of the
  output dtype when that is smaller, 65504 for float16), not inf.
- `sampled_token_distillation`: a token whose teacher or student log-prob is not finite contributes 0.
"""

from __future__ import annotations

import math

import torch

# log-probabilities are floored here so that a probability-0 entry (log p = −inf) enters 0·(finite) = 0 instead of
# 0·(−inf) = NaN; exp(_LOG_FLOOR) is exactly 0 in float32, and no real log-probability comes near it.
_LOG_FLOOR = -1e30


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> torch.Tensor:
    """Per-token generalized Jensen–Shannon divergence between the student's and the teacher's next-token
    distributions (see the module docstring for the formula and the non-finite rules).

    Args:
        student_logits: (B, T, V) student logits at the response positions; the gradient flows into these.
        teacher_logits: (B, T, V) teacher logits at the same positions (detached here).
        beta: β ∈ [0, 1], the teacher's weight in the mixture M; 0 = forward KL(p_T‖p_S), 1 = reverse KL(p_S‖p_T).
        temperature: τ > 0; both logits are divided by τ before the softmax (OPSD uses its sampling temperature).
        top_k: None (full vocabulary) or k ≥ 1: keep, at each position, the k tokens with the largest teacher
            logits (`torch.topk`, ties broken by torch), gather the student's logits at the same token ids and
            renormalise both over these k tokens before the divergence — the reference's `top_k_loss` rule. The
            selection uses the temperature-scaled logits, which rank tokens the same way. k ≥ V is the full
            vocabulary.

    Returns:
        (B, T) divergence per position, ≥ 0 (up to rounding). Computed in log space (log-softmax, logsumexp), in
        float32 at least (bfloat16/float16 inputs are upcast), then cast back to the student's dtype.

    Example (a 2-token vocabulary; p_S = [0.5, 0.5], p_T = [0.75, 0.25]):
        >>> import math, torch
        >>> student = torch.zeros(1, 1, 2)
        >>> teacher = torch.tensor([[[math.log(3.0), 0.0]]])
        >>> [round(generalized_jsd(student, teacher, beta=b).item(), 4) for b in (0.0, 0.5, 1.0)]
        [0.1308, 0.0338, 0.1438]
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student_logits and teacher_logits must have the same shape (B, T, V), got "
            f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )
    if student_logits.dim() < 1 or student_logits.shape[-1] < 1:
        raise ValueError(f"logits need a vocabulary dimension last, got shape {tuple(student_logits.shape)}")
    if not (isinstance(beta, int | float) and 0.0 <= beta <= 1.0):
        raise ValueError(f"beta must be a number in [0, 1] (0 = forward KL, 1 = reverse KL), got {beta!r}")
    if not (isinstance(temperature, int | float) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None (full vocabulary) or an int >= 1, got {top_k!r}")

    out_dtype = student_logits.dtype
    work = torch.promote_types(out_dtype, torch.float32)
    student = student_logits.to(work)
    teacher = teacher_logits.detach().to(work)

    # Positions without a usable distribution (NaN / +inf anywhere, or no finite logit) get loss 0; their logits are
    # replaced by zeros first so that nothing non-finite enters the arithmetic (or its backward). All-finite logits
    # (the usual case) skip these vocabulary-sized copies.
    all_finite = bool(torch.isfinite(student).all() and torch.isfinite(teacher).all())
    valid = None
    if not all_finite:
        valid = _has_distribution(student) & _has_distribution(teacher)
        student = torch.where(valid.unsqueeze(-1), student, torch.zeros_like(student))
        teacher = torch.where(valid.unsqueeze(-1), teacher, torch.zeros_like(teacher))

    # z / τ  (both sides, before any top-k selection, as in the reference)
    if temperature != 1:
        student = student / temperature
        teacher = teacher / temperature

    # top-k: the teacher's k most likely token ids per position; both distributions renormalised over them.
    if top_k is not None and top_k < teacher.shape[-1]:
        index = torch.topk(teacher, k=top_k, dim=-1).indices
        student = torch.gather(student, -1, index)
        teacher = torch.gather(teacher, -1, index)

    log_p_s = torch.log_softmax(student, dim=-1)  # log p_S
    log_p_t = torch.log_softmax(teacher, dim=-1)  # log p_T
    if not all_finite:  # −inf logits give log p = −inf: floor them (finite logits never reach the floor)
        log_p_s = log_p_s.clamp(min=_LOG_FLOOR)
        log_p_t = log_p_t.clamp(min=_LOG_FLOOR)

    if beta == 0:
        divergence = _kl(log_p_t, log_p_s)  # KL(p_T ‖ p_S), forward
    elif beta == 1:
        divergence = _kl(log_p_s, log_p_t)  # KL(p_S ‖ p_T), reverse
    else:
        # log M = log((1 − β)·p_S + β·p_T) = logsumexp(log(1 − β) + log p_S, log β + log p_T)
        log_m = torch.logaddexp(log_p_s + math.log1p(-beta), log_p_t + math.log(beta))
        # L_t = β·KL(p_T ‖ M) + (1 − β)·KL(p_S ‖ M)
        divergence = beta * _kl(log_p_t, log_m) + (1.0 - beta) * _kl(log_p_s, log_m)

    if valid is not None:
        divergence = torch.where(valid, divergence, torch.zeros_like(divergence))
    if out_dtype.is_floating_point and torch.finfo(out_dtype).max < torch.finfo(work).max:
        # A value beyond the output dtype's range (the ~1e30 of a probability-0 student token under β = 0 is inf in
        # float16, whose largest value is 65504) is reported as that largest finite value; the gradient is the
        # unclamped one (straight through), so it stays what float32 computed.
        largest = torch.finfo(out_dtype).max
        divergence = divergence.clamp(max=largest).detach() + (divergence - divergence.detach())
    return divergence.to(out_dtype)


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean Σ_t m_t·v_t / max(Σ_t m_t, 1) over every position of the batch (TRL's and verl's "token-mean").

    Positions with m_t = 0 are skipped, whatever they hold (NaN or inf at padding cannot leak in, nor into the
    gradient); an empty mask gives 0.

    Args:
        values: (B, T) per-token losses.
        mask: (B, T) loss mask, bool or 0/1 (TRL's `completion_mask`).

    >>> import torch
    >>> masked_token_mean(torch.tensor([[1.0, 3.0, float("nan")]]), torch.tensor([[1, 1, 0]]))
    tensor(2.)
    >>> masked_token_mean(torch.tensor([[1.0]]), torch.tensor([[0]]))
    tensor(0.)
    """
    if values.shape != mask.shape:
        raise ValueError(
            f"values and mask must have the same shape, got {tuple(values.shape)} and {tuple(mask.shape)}; pass the "
            "(B, T) per-token values and their (B, T) loss mask"
        )
    weight = mask.to(values.dtype)
    kept = torch.where(mask != 0, values * weight, torch.zeros_like(values))
    return kept.sum() / weight.sum().clamp(min=1.0)


def sampled_token_distillation(student_logps: torch.Tensor, teacher_logps: torch.Tensor) -> torch.Tensor:
    """OPSD's memory-light loss: ℓ_t = −sg(log p_T(y_t) − log p_S(y_t)) · log p_S(y_t), per sampled token.

    Only the log-probabilities of the sampled tokens are needed (no vocabulary-sized tensors). The gradient flows
    only through `student_logps`: ∂ℓ_t/∂log p_S(y_t) = −(log p_T(y_t) − log p_S(y_t)), so tokens the teacher likes
    more than the student are pushed up. A token whose teacher or student log-prob is not finite contributes 0.

    Args:
        student_logps: (B, T) log p_S(y_t) of the sampled tokens (with gradient), at the loss temperature.
        teacher_logps: (B, T) log p_T(y_t) of the same tokens under the privileged prompt (detached here).

    Returns:
        (B, T) per-token losses; reduce them with `masked_token_mean`.

    >>> import torch
    >>> student = torch.tensor([[-2.0, -1.0]], requires_grad=True)
    >>> loss = sampled_token_distillation(student, torch.tensor([[-1.0, -1.0]]))
    >>> loss.detach()  # A = [1, 0]: −1·(−2) = 2 and −0·(−1) = 0
    tensor([[2., 0.]])
    >>> loss.sum().backward(); student.grad
    tensor([[-1., -0.]])
    """
    student, teacher, finite = finite_token_pairs(student_logps, teacher_logps)
    advantage = (teacher - student.detach()).detach()  # A_t = sg(log p_T − log p_S)
    return torch.where(finite, -advantage * student, torch.zeros_like(student))  # ℓ_t = −A_t·log p_S


def finite_token_pairs(
    student_logps: torch.Tensor, teacher_logps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(student, detached teacher, finite mask) of two (B, T) sampled-token log-prob tensors, with every token
    where either is not finite zeroed on both sides before any arithmetic, so that neither the value nor the
    backward of a loss built from them sees inf/NaN (such tokens then contribute 0)."""
    if student_logps.shape != teacher_logps.shape:
        raise ValueError(
            f"student_logps and teacher_logps must have the same shape (B, T), got {tuple(student_logps.shape)} and "
            f"{tuple(teacher_logps.shape)}"
        )
    teacher = teacher_logps.detach()
    finite = torch.isfinite(teacher) & torch.isfinite(student_logps.detach())
    student = torch.where(finite, student_logps, torch.zeros_like(student_logps))
    teacher = torch.where(finite, teacher, torch.zeros_like(teacher))
    return student, teacher, finite


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) = Σ_v p_v·(log p_v − log q_v) over the last dimension, from floored log-probabilities."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def _has_distribution(logits: torch.Tensor) -> torch.Tensor:
    """(…) True where the logits over the last dimension define a distribution: no NaN, no +inf, one finite value."""
    bad = torch.isnan(logits) | torch.isposinf(logits)
    return ~bad.any(dim=-1) & torch.isfinite(logits).any(dim=-1)
