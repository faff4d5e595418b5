"""PCSD: persistent-consistency token weights for self-distillation, an auxiliary term of GRPO.

PCSD (Lv, …, Wu, …, Li 2026, arXiv 2608.01837; no released code, our sources are the abstract and secondary
summaries of the paper — docs/methods/pcsd.md tags each choice). SDAR (arXiv 2605.15155, `distill/sdar.py`) gates
every sampled token by its own teacher–student gap; PCSD weights a token by how *persistently* the privileged
teacher supports the tokens from it on, so that an isolated spike of support loses weight and a declining run of
support is attenuated. Per response token t of one turn (sg = stop-gradient):

    Δ_t      = sg(log π_T(y_t)) − sg(log π_θ(y_t))                   the teacher–student gap (as SDAR)
    W_N(t)   = {t, …, t+N−1} ∩ the turn                              look-ahead window (pcsd_window="lookahead")
    Δ̄^(N)_t  = Σ_{k∈W_N(t)} ρ^{|k−t|}·Δ_k / Σ_{k∈W_N(t)} ρ^{|k−t|}    decayed window mean, ρ = 0.7
    v_t      = population variance of {Δ_k : k ∈ W_{N_l}(t)}          local variance on the long window
    a_t      = v_t / (v_t + v₀)                                      v₀ = 0.1: low variance → short window
    δ_t      = (1 − a_t)·Δ̄^(N_s)_t + a_t·Δ̄^(N_l)_t                   N_s = 1, N_l = 8
    s_t      = OLS slope of Δ_k against k over W_{N_l}(t)             0 for a window of one token
    η_t      = 1 − γ_tr·min(1, ReLU(−s_t / scale))                   γ_tr = 0.5, scale = 1: damp declines only,
                                                                     by at most γ_tr (our guard, below)
    w_t      = σ(β·δ_t)·η_t                                          β = 5
    ℓ_t      = sg(w_t)·(log π_T(y_t) − log π_θ(y_t))                 ∂ℓ_t/∂log π_θ(y_t) = −w_t
    L        = L_GRPO + λ·token-mean(ℓ)                              λ = 0.01

A window never crosses a turn: the turns of a row are the maximal runs of its loss mask (a step row is one turn; a
conversation row's action spans are separated by environment tokens, which the mask excludes). With N_s = 1 the
short mean is Δ_t itself, so a constant gap gives SDAR's gate σ(β·Δ) exactly.

The saturation (our guard, `trend_saturate`): without it, η_t = clip(1 − γ_tr·ReLU(−s_t/scale), 0, 1) and the weight
FALLS as support grows — an isolated spike of Δ = h at the start of a 4-token look-ahead window has slope −0.3·h, so
w = 0.69 at h = 2 and w = 0 from h = 6.7 on, and a two-token turn Δ = [5, 0] gives its first token w = 0 where SDAR's
gate gives 1. With the saturation a decline takes away at most the share γ_tr of the weight (w ≥ 0.5·σ(β·δ) at
γ_tr = 0.5): the same spike keeps w = 0.50 at h = 6.7, and Δ = [5, 0] gives 0.50.

Non-finite inputs: a token whose teacher or student log-prob is not finite has no gap. It gets w = 0 and ℓ = 0 (no
gradient), and it is left out of every window it falls in (the other tokens keep their positions k, so the decay
and the slope use the true offsets). The paper's sources say nothing about this; SDAR's reference code has no guard.
"""

from __future__ import annotations

import math

import torch

from .opsd import finite_token_pairs

PCSD_WINDOWS = ("lookahead", "causal")
PCSD_MIXES = ("variance", "short", "long")


def turn_ids(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) id of the turn each token belongs to: the maximal runs of `mask` in each row, numbered from 1 in order
    (unique within a row); 0 where the mask is 0.

    >>> import torch
    >>> turn_ids(torch.tensor([[1, 1, 0, 1, 0, 0, 1]])).tolist()
    [[1, 1, 0, 2, 0, 0, 3]]
    """
    keep = mask.bool()
    previous = torch.zeros_like(keep)
    previous[:, 1:] = keep[:, :-1]
    starts = keep & ~previous
    return torch.where(keep, torch.cumsum(starts.long(), dim=1), torch.zeros_like(starts, dtype=torch.long))


def _windows(values: torch.Tensor, usable: torch.Tensor, turns: torch.Tensor, size: int, direction: str):
    """(values, offsets, valid) of the window of every token: (B, T, size) gathers of `values` at positions t + k,
    k = 0…size−1 (look-ahead) or −(size−1)…0 (causal), valid where that position exists, is usable and is in t's
    turn."""
    length = values.shape[1]
    steps = torch.arange(size, device=values.device)
    offsets = steps if direction == "lookahead" else steps - (size - 1)
    positions = torch.arange(length, device=values.device)[:, None] + offsets[None, :]  # (T, size)
    inside = (positions >= 0) & (positions < length)
    index = positions.clamp(0, max(length - 1, 0)).expand(values.shape[0], -1, -1)  # (B, T, size)

    def gather(x: torch.Tensor) -> torch.Tensor:  # x[b, t + k] for every (b, t, k); expand makes no copy
        return torch.gather(x[:, None, :].expand(-1, length, -1), 2, index)

    valid = inside[None] & gather(usable) & (gather(turns) == turns[:, :, None]) & (turns[:, :, None] > 0)
    return torch.where(valid, gather(values), torch.zeros_like(index, dtype=values.dtype)), offsets, valid


def _decayed_mean(window: torch.Tensor, offsets: torch.Tensor, valid: torch.Tensor, decay: float) -> torch.Tensor:
    """Σ ρ^{|k|}·Δ_{t+k} / Σ ρ^{|k|} over the valid entries of each window (0 for an empty window)."""
    weights = torch.where(valid, decay ** offsets.abs().to(window.dtype), torch.zeros_like(window))
    return (weights * window).sum(-1) / weights.sum(-1).clamp(min=1e-30)


def pcsd_weights(
    delta: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 5.0,
    short_window: int = 1,
    long_window: int = 8,
    decay: float = 0.7,
    var_offset: float = 0.1,
    trend_coef: float = 0.5,
    trend_scale: float = 1.0,
    window: str = "lookahead",
    mix: str = "variance",
    trend_saturate: bool = True,
) -> torch.Tensor:
    """The detached PCSD weights w_t = σ(β·δ_t)·η_t of every token (module docstring); 0 off the mask and where Δ is
    not finite.

    Args:
        delta: (B, T) Δ_t = log π_T(y_t) − log π_θ(y_t) (detached here).
        mask: (B, T) loss mask; its runs are the turns, which windows never cross.
        beta: β ≥ 0 of the sigmoid (5.0, SDAR's).
        short_window, long_window: N_s ≤ N_l, window lengths in tokens (1 and 8).
        decay: ρ ∈ (0, 1], the per-token decay of the window means (0.7; 1 = plain means).
        var_offset: v₀ > 0 of a_t = v_t/(v_t + v₀) (0.1).
        trend_coef: γ_tr ≥ 0 of the trend factor (0.5; 0 switches it off).
        trend_scale: the slope scale > 0 (1.0).
        window: "lookahead" (t…t+N−1, the default) or "causal" (t−N+1…t).
        mix: "variance" (a_t = v_t/(v_t+v₀)), "short" (a = 0: the short window only) or "long" (a = 1).
        trend_saturate: η = 1 − γ_tr·min(1, ReLU(−s/scale)) (True: a decline takes away at most γ_tr of the weight)
            or clip(1 − γ_tr·ReLU(−s/scale), 0, 1) (False: a steep decline, or a strong isolated spike, gives 0).

    Examples (β = 5 and the defaults; one turn each):
        >>> import torch
        >>> ones = lambda n: torch.ones(1, n)
        >>> [round(w, 4) for w in pcsd_weights(torch.full((1, 4), 0.5), ones(4))[0].tolist()]  # σ(2.5)
        [0.9241, 0.9241, 0.9241, 0.9241]
        >>> spike = torch.tensor([[0.0, 0, 0, 0, 2, 0, 0, 0]])
        >>> round(pcsd_weights(spike, ones(8))[0, 4].item(), 4)  # SDAR would give σ(10) = 1.0
        0.6934
        >>> big = torch.tensor([[5.0, 0.0]])  # slope −5: unsaturated η = clip(1 − 2.5, 0, 1) = 0
        >>> [round(w, 4) for w in pcsd_weights(big, ones(2))[0].tolist()]  # saturated: η = 1 − 0.5·min(1, 5)
        [0.5, 0.5]
        >>> pcsd_weights(big, ones(2), trend_saturate=False)[0, 0].item()
        0.0
        >>> decline = torch.tensor([[1.0, 0.8, 0.6, 0.4, 0.2, 0.0]])
        >>> [round(w, 4) for w in pcsd_weights(decline, ones(6))[0].tolist()]  # SDAR: [0.9933, …, 0.7311, 0.5]
        [0.8864, 0.8713, 0.8402, 0.7765, 0.6513, 0.5]
    """
    check_weight_options(beta=beta, short_window=short_window, long_window=long_window, decay=decay,
                         var_offset=var_offset, trend_coef=trend_coef, trend_scale=trend_scale, window=window, mix=mix,
                         trend_saturate=trend_saturate)
    if delta.shape != mask.shape or delta.dim() != 2:
        raise ValueError(f"delta and mask must both be (B, T), got {tuple(delta.shape)} and {tuple(mask.shape)}")
    work = torch.promote_types(delta.dtype, torch.float32)
    delta = delta.detach().to(work)
    usable = mask.bool() & torch.isfinite(delta)
    delta = torch.where(usable, delta, torch.zeros_like(delta))
    turns = turn_ids(mask)

    short, short_offsets, short_valid = _windows(delta, usable, turns, short_window, window)
    long, offsets, valid = _windows(delta, usable, turns, long_window, window)
    mean_short = _decayed_mean(short, short_offsets, short_valid, decay)  # Δ̄^(N_s)_t
    mean_long = _decayed_mean(long, offsets, valid, decay)  # Δ̄^(N_l)_t

    count = valid.sum(-1).to(work)
    plain_mean = long.sum(-1) / count.clamp(min=1.0)
    centred = torch.where(valid, long - plain_mean[..., None], torch.zeros_like(long))
    variance = (centred**2).sum(-1) / count.clamp(min=1.0)  # v_t, population variance on the long window
    if mix == "variance":
        a = variance / (variance + var_offset)  # a_t = v_t/(v_t + v₀)
    else:
        a = torch.full_like(variance, 0.0 if mix == "short" else 1.0)
    smoothed = (1.0 - a) * mean_short + a * mean_long  # δ_t

    x = offsets.to(work).expand_as(long)
    x_mean = torch.where(valid, x, torch.zeros_like(x)).sum(-1) / count.clamp(min=1.0)
    x_centred = torch.where(valid, x - x_mean[..., None], torch.zeros_like(x))
    spread = (x_centred**2).sum(-1)
    slope = torch.where(spread > 0, (x_centred * centred).sum(-1) / spread.clamp(min=1e-30), torch.zeros_like(spread))
    decline = torch.relu(-slope / trend_scale)
    if trend_saturate:  # our guard: a decline takes away at most the share γ_tr of the weight
        decline = decline.clamp(max=1.0)
    trend = (1.0 - trend_coef * decline).clamp(0.0, 1.0)  # η_t

    weights = torch.sigmoid(beta * smoothed) * trend  # w_t = σ(β·δ_t)·η_t
    return torch.where(usable, weights, torch.zeros_like(weights))


def pcsd_token_terms(
    student_logps: torch.Tensor, teacher_logps: torch.Tensor, mask: torch.Tensor, **weight_options
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PCSD terms ℓ_t = sg(w_t)·(log π_T(y_t) − log π_θ(y_t)) and the weights w_t.

    Args:
        student_logps: (B, T) log π_θ(y_t) of the sampled tokens (with gradient).
        teacher_logps: (B, T) log π_T(y_t) under the privileged view (detached here).
        mask: (B, T) loss mask (its runs are the turns).
        **weight_options: the options of `pcsd_weights` (β, windows, ρ, v₀, γ_tr, scale, window, mix).

    Returns:
        (terms, weights), both (B, T); the loss is λ·`masked_token_mean(terms, mask)` added to the policy loss.
        Tokens with a non-finite log-prob give term 0, weight 0 and no gradient.

    Example (a constant gap Δ = 0.5: w = σ(2.5) = 0.92414 everywhere, ℓ = w·Δ, gradient −w):
        >>> import torch
        >>> student = torch.zeros(1, 3, requires_grad=True)
        >>> terms, weights = pcsd_token_terms(student, torch.full((1, 3), 0.5), torch.ones(1, 3))
        >>> [round(v, 5) for v in terms[0].tolist()]
        [0.46207, 0.46207, 0.46207]
        >>> terms.sum().backward()
        >>> [round(v, 5) for v in student.grad[0].tolist()]
        [-0.92414, -0.92414, -0.92414]
    """
    student, teacher, finite = finite_token_pairs(student_logps, teacher_logps)  # non-finite tokens zeroed
    delta = torch.where(finite, teacher - student.detach(), torch.full_like(teacher, math.nan))
    weights = pcsd_weights(delta, mask, **weight_options).to(student.dtype)
    return weights * (teacher - student), weights  # ℓ_t = sg(w_t)·(log π_T − log π_θ)


def check_weight_options(
    *, beta, short_window, long_window, decay, var_offset, trend_coef, trend_scale, window, mix, trend_saturate=True
) -> None:
    """A one-line ValueError naming the first option of `pcsd_weights` out of its range (the trainer's config
    prefixes it with `pcsd_`)."""
    def number(value):
        return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)

    if not (number(beta) and beta >= 0):
        raise ValueError(f"beta (the PCSD sigmoid sharpness) must be a finite number >= 0, e.g. 5.0, got {beta!r}")
    for name, value in (("short_window", short_window), ("long_window", long_window)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1 (PCSD: N_s = 1, N_l = 8), got {value!r}")
    if short_window > long_window:
        raise ValueError(f"short_window ({short_window}) must be <= long_window ({long_window})")
    if not (number(decay) and 0 < decay <= 1):
        raise ValueError(f"decay (ρ) must be in (0, 1], e.g. 0.7, got {decay!r}")
    if not (number(var_offset) and var_offset > 0):
        raise ValueError(f"var_offset (v0) must be a finite number > 0, e.g. 0.1, got {var_offset!r}")
    if not (number(trend_coef) and trend_coef >= 0):
        raise ValueError(f"trend_coef (γ_tr) must be a finite number >= 0, e.g. 0.5, got {trend_coef!r}")
    if not (number(trend_scale) and trend_scale > 0):
        raise ValueError(f"trend_scale must be a finite number > 0, e.g. 1.0, got {trend_scale!r}")
    if window not in PCSD_WINDOWS:
        raise ValueError(f"window must be one of {', '.join(PCSD_WINDOWS)}, got {window!r}")
    if mix not in PCSD_MIXES:
        raise ValueError(f"mix must be one of {', '.join(PCSD_MIXES)}, got {mix!r}")
    if not isinstance(trend_saturate, bool):
        raise ValueError(f"trend_saturate must be True or False, got {trend_saturate!r}")
