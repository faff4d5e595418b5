"""GRSD: turn-level advantage modulation from a guidance-conditioned self-teacher, plus a reflection GRPO term.

GRSD (Group-Reflective Self-Distillation, arXiv 2607.28076; docs/methods/grsd.md). After a GRPO rollout the policy
writes a short reflection on each episode; a judge scores it 0–3. For a group (the G episodes of one task) with both
a success and a failure (m_x = 1) the policy summarises the reflections into guidance z_x, and the policy itself,
shown z_x before the step prompt, scores every recorded turn (the teacher). The GRPO advantage of each turn is then
rescaled by how much the teacher agrees with the outcome; the objective stays GRPO. Per step row r of a mixed group:

    ℓ_tea, ℓ_stu = mean over the turn's tokens of log π(y_k | prompt ⊕ z_x), log π(y_k | prompt)
    δ_r      = ℓ_tea − ℓ_stu                                   turn-level teacher–student gap
    q_r      = sign(A_r)·δ_r                                   > 0: the teacher agrees with the outcome
    e_r      = expm1(clip(q_r, −20, 20))                       0 at no signal; clip keeps it finite
    ν_r      = e_r / (max(mean_{valid rows s of the group} |e_s|, floor) + 1e-6)     floor = 0 (reference)
    g_r      = ν_r if |ν_r| > η else 0                         dead zone η (0)
    ĝ_r      = clip(g_r, −g_max, g_max)                        g_max = 0.2
    Â_r      = A_r · max(1 + λ·ĝ_r, 0.1)                       λ = 0.5; the floor keeps the sign of A
    groups without a success/failure mix (or without guidance): Â_r = A_r

The reflections get a GRPO update of their own (Stage A): with s_i the judge score of episode i's reflection,

    A^refl_i = (s_i − mean_j s_j) / (std_j s_j + 1e-6)        over the group's valid scores, population std;
                                                               0 when fewer than 2 are valid, and 0 if s_i is
                                                               invalid (the reflection stays in the token mean)
    L_refl   = −α · token-mean_{reflection tokens}(A^refl_i · log π_θ(token))     α = 0.01

(the on-policy surrogate: one update on freshly sampled reflections, where the importance ratio is 1).

Numerical guards (ours): a row whose teacher or student log-probs are empty or not finite has no gap (δ = None);
it keeps Â = A and is left out of the group's mean |e|. A group whose rows all lack a gap keeps Â = A. q is clipped
to ±20 before expm1, as in the reference code.

Hazard (inherited from the reference): ν rescales a group's gaps to unit mean |ν|, whatever their size, so gaps at
noise level (|δ| ≈ 1e-6, e.g. the rounding of a bf16 forward) reach the same ±λ·g_max = ±10 % as real ones. The
`floor` (`grsd_gap_floor`, 0 = the reference) is the smallest mean |e| a group is scaled by: with a floor of 0.01
a group whose gaps average 1e-6 gets |ν| ≈ 1e-4, so it is left almost unmodulated, while gaps of a nat or so are
unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

EXP_INPUT_CLIP = 20.0  # |q| ≤ 20 before expm1 (the reference code's clip)
MODULATION_FLOOR = 0.1  # max(1 + λ·ĝ, 0.1): the advantage never changes sign


def group_has_mix(successes: Sequence[bool]) -> bool:
    """m_x: whether a group holds at least one success and at least one failure.

    >>> group_has_mix([True, False, False]), group_has_mix([True, True]), group_has_mix([])
    (True, False, False)
    """
    values = [bool(s) for s in successes]
    return any(values) and not all(values)


def turn_logprob_gap(teacher_logps: Sequence[float] | None, student_logps: Sequence[float] | None) -> float | None:
    """δ = mean(teacher log-probs) − mean(student log-probs) of one turn, or None when it has no usable gap (no
    tokens, lengths that differ, or a value that is not finite).

    >>> round(turn_logprob_gap([-1.0, -0.6], [-1.2, -0.8]), 6)  # −0.8 − (−1.0)
    0.2
    >>> turn_logprob_gap([], []) is None, turn_logprob_gap([float("-inf")], [-1.0]) is None
    (True, True)
    """
    if not teacher_logps or not student_logps or len(teacher_logps) != len(student_logps):
        return None
    values = [float(v) for v in teacher_logps] + [float(v) for v in student_logps]
    if not all(math.isfinite(v) for v in values):
        return None
    n = len(teacher_logps)
    return sum(values[:n]) / n - sum(values[n:]) / n  # ℓ_tea − ℓ_stu


def turn_modulation(
    advantages: Sequence[float],
    deltas: Sequence[float | None],
    *,
    lam: float = 0.5,
    eta: float = 0.0,
    g_max: float = 0.2,
    eps: float = 1e-6,
    floor: float = 0.0,
) -> list[float]:
    """The factors max(1 + λ·ĝ_r, 0.1) of the step rows of ONE mixed group (module docstring); 1 for rows without a
    gap (δ = None).

    Args:
        advantages: A_r, the GRPO advantage of each step row of the group.
        deltas: δ_r = ℓ_tea − ℓ_stu of each row (`turn_logprob_gap`), None where there is none.
        lam: λ ≥ 0, the modulation strength (0.5).
        eta: η ≥ 0, the dead zone on |ν| (0).
        g_max: the clip of g (the launcher's 0.2; the reference function's default is 3.0).
        eps: added to the group's mean |e| (1e-6).
        floor: the smallest mean |e| the group is scaled by (0 = the reference; see the module docstring).

    Example (the hand case of docs/methods/grsd.md): A = [+1, −1], δ = [0.2, 0.1] ⇒ q = [0.2, −0.1],
    e = [0.2214, −0.0952], mean|e| = 0.1583, ν = [1.3988, −0.6012], ĝ = [0.2, −0.2] ⇒ [1.1, 0.9]:
        >>> [round(m, 4) for m in turn_modulation([1.0, -1.0], [0.2, 0.1])]
        [1.1, 0.9]
    """
    _check_options(lam, eta, g_max)
    if len(advantages) != len(deltas):
        raise ValueError(f"advantages and deltas need one value per step row, got {len(advantages)} and {len(deltas)}")
    signals: list[float | None] = []
    for a, delta in zip(advantages, deltas, strict=True):
        if delta is None or not math.isfinite(delta) or not math.isfinite(a):
            signals.append(None)
            continue
        q = _sign(a) * delta  # q = sign(A)·δ
        signals.append(math.expm1(min(max(q, -EXP_INPUT_CLIP), EXP_INPUT_CLIP)))  # e = expm1(clip(q, ±20))
    valid = [abs(e) for e in signals if e is not None]
    if not valid:
        return [1.0] * len(advantages)
    scale = max(sum(valid) / len(valid), floor) + eps  # mean over the group's valid rows of |e| (≥ floor), + 1e-6
    factors = []
    for e in signals:
        if e is None:
            factors.append(1.0)
            continue
        nu = e / scale  # ν = e / (mean|e| + ε)
        g = nu if abs(nu) > eta else 0.0  # dead zone
        g_hat = min(max(g, -g_max), g_max)  # ĝ = clip(g, ±g_max)
        factors.append(max(1.0 + lam * g_hat, MODULATION_FLOOR))  # max(1 + λ·ĝ, 0.1)
    return factors


def modulated_advantages(
    advantages: Sequence[float],
    deltas: Sequence[float | None],
    mixed: bool,
    *,
    lam: float = 0.5,
    eta: float = 0.0,
    g_max: float = 0.2,
    eps: float = 1e-6,
    floor: float = 0.0,
) -> list[float]:
    """Â_r = A_r·max(1 + λ·ĝ_r, 0.1) for the step rows of one group when it is mixed (m_x = 1), else A unchanged.

    >>> modulated_advantages([1.0, -1.0], [0.2, 0.1], mixed=True)
    [1.1, -0.9]
    >>> modulated_advantages([1.0, -1.0], [0.2, 0.1], mixed=False)
    [1.0, -1.0]
    """
    if not mixed:
        _check_options(lam, eta, g_max)
        return [float(a) for a in advantages]
    factors = turn_modulation(advantages, deltas, lam=lam, eta=eta, g_max=g_max, eps=eps, floor=floor)
    return [float(a) * m for a, m in zip(advantages, factors, strict=True)]


def warmdown_lambda(lam: float, step: int, warmdown_steps: int) -> float:
    """λ after a linear warm-down to 0 over `warmdown_steps` optimizer steps (0 = off: λ throughout).

    >>> warmdown_lambda(0.5, 0, 100), warmdown_lambda(0.5, 50, 100), warmdown_lambda(0.5, 150, 100)
    (0.5, 0.25, 0.0)
    >>> warmdown_lambda(0.5, 10_000, 0)
    0.5
    """
    if warmdown_steps <= 0:
        return lam
    return lam * max(0.0, 1.0 - step / warmdown_steps)


def reflection_advantages(
    scores: Sequence[float | None], *, min_valid: int = 2, eps: float = 1e-6
) -> list[float]:
    """GRPO advantages of one group's reflections from their judge scores: the z-score over the valid scores
    (population std, + 1e-6); 0 for every one when fewer than `min_valid` are valid; 0 for an invalid score (None
    or not finite), whose reflection stays in the loss's token mean, as in the reference
    (`compute_group_normalized_advantage`: invalid rows get 0 and stay in the batch).

    >>> [round(a, 4) for a in reflection_advantages([3, 1, None, 2])]  # mean 2, std 0.8165
    [1.2247, -1.2247, 0.0, 0.0]
    >>> reflection_advantages([2, None]), reflection_advantages([1, 1])
    ([0.0, 0.0], [0.0, 0.0])
    """
    usable = [s is not None and math.isfinite(float(s)) for s in scores]
    valid = [float(s) for s, ok in zip(scores, usable, strict=True) if ok]
    if len(valid) < min_valid:
        return [0.0] * len(scores)
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((s - mean) ** 2 for s in valid) / len(valid))  # population std (numpy's default)
    return [(float(s) - mean) / (std + eps) if ok else 0.0 for s, ok in zip(scores, usable, strict=True)]


def reflection_token_terms(logps: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Per-token terms −A_i·log π_θ(token) of the reflection GRPO surrogate; their gradient on each log-prob is −A_i.

    Args:
        logps: (B, T) log π_θ of the reflection tokens (with gradient).
        advantages: (B,) A^refl of each reflection (`reflection_advantages`).

    Returns:
        (B, T) terms; the loss is α·(their token mean over the reflections of the generation batch).

    >>> logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    >>> terms = reflection_token_terms(logps, torch.tensor([1.0, -2.0]))
    >>> terms.detach().tolist()
    [[1.0, 2.0], [-1.0, -1.0]]
    >>> terms.sum().backward(); logps.grad.tolist()
    [[-1.0, -1.0], [2.0, 2.0]]
    """
    if logps.dim() != 2 or advantages.shape != logps.shape[:1]:
        raise ValueError(
            f"logps must be (B, T) and advantages (B,), got {tuple(logps.shape)} and {tuple(advantages.shape)}"
        )
    return -advantages.detach().to(logps.dtype).unsqueeze(-1) * logps  # −A·log π


def _sign(value: float) -> float:
    return 1.0 if value > 0 else -1.0 if value < 0 else 0.0


def _check_options(lam: float, eta: float, g_max: float) -> None:
    for name, value, lowest in (("lam", lam, 0.0), ("eta", eta, 0.0)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= lowest):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not (isinstance(g_max, int | float) and math.isfinite(g_max) and g_max > 0):
        raise ValueError(f"g_max must be a finite number > 0 (GRSD's launcher: 0.2), got {g_max!r}")
