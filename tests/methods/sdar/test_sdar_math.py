"""SDAR gated distillation terms (`trl_agents.distill.sdar`) against hand-computed numbers.

The expected values are written out with their arithmetic in comments; they are not recomputed with the code under
test. σ(x) = 1/(1 + e^−x): σ(5) = 1/(1 + 0.0067379) = 0.993307, σ(−5) = 1 − σ(5) = 0.006693, σ(0) = 0.5,
σ(1) = 1/(1 + 0.367879) = 0.731059.
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_agents.distill import masked_token_mean, sdar_gate, sdar_token_terms

DELTA = [1.0, -1.0, 0.0, 0.2]
# g = σ(5·Δ) = [σ(5), σ(−5), σ(0), σ(1)]
GATE = [0.99331, 0.00669, 0.5, 0.73106]
# g·Δ = [0.99331·1, 0.00669·(−1), 0.5·0, 0.73106·0.2]
TERMS = [0.99331, -0.00669, 0.0, 0.14621]


def test_gate_by_hand():
    assert sdar_gate(torch.tensor(DELTA), beta=5.0).tolist() == pytest.approx(GATE, abs=1e-5)


def test_gate_is_detached():
    delta = torch.tensor(DELTA, requires_grad=True)
    assert not sdar_gate(delta).requires_grad


def test_terms_and_gradient_by_hand():
    # Student log-probs [−1, −1, −1, −1], teacher = student + Δ; ℓ_t = g_t·Δ_t, ∂ℓ_t/∂log π_θ(y_t) = −g_t.
    student = torch.full((1, 4), -1.0, requires_grad=True)
    teacher = (student + torch.tensor([DELTA])).detach()
    terms = sdar_token_terms(student, teacher, beta=5.0)
    assert terms.shape == (1, 4)
    assert terms[0].tolist() == pytest.approx(TERMS, abs=1e-5)
    (grad,) = torch.autograd.grad(terms.sum(), student)
    assert grad[0].tolist() == pytest.approx([-g for g in GATE], abs=1e-5)


def test_loss_is_the_masked_token_mean_of_the_terms():
    # Mask keeps tokens 0, 1, 3: (0.99331 − 0.00669 + 0.14621)/3 = 1.13283/3 = 0.37761; the gradient on each kept
    # token is −g_t/3: [−0.33110, −0.00223, 0, −0.24369].
    student = torch.zeros(1, 4, requires_grad=True)
    terms = sdar_token_terms(student, torch.tensor([DELTA]))
    loss = masked_token_mean(terms, torch.tensor([[1, 1, 0, 1]]))
    assert loss.item() == pytest.approx(0.37761, abs=1e-5)
    (grad,) = torch.autograd.grad(loss, student)
    assert grad[0].tolist() == pytest.approx([-0.33110, -0.00223, 0.0, -0.24369], abs=1e-5)


def test_beta_zero_is_the_ungated_grpo_opsd_ablation():
    # β = 0: g = σ(0) = 0.5 everywhere; ℓ = 0.5·Δ = [0.5, −0.5, 0, 0.1]; gradient −0.5 per token.
    assert sdar_gate(torch.tensor(DELTA), beta=0.0).tolist() == [0.5, 0.5, 0.5, 0.5]
    student = torch.zeros(1, 4, requires_grad=True)
    terms = sdar_token_terms(student, torch.tensor([DELTA]), beta=0.0)
    assert terms[0].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.1], abs=1e-6)
    (grad,) = torch.autograd.grad(terms.sum(), student)
    assert grad[0].tolist() == pytest.approx([-0.5] * 4, abs=1e-6)


def test_teacher_gets_no_gradient():
    student = torch.zeros(1, 2, requires_grad=True)
    teacher = torch.tensor([[0.5, -0.5]], requires_grad=True)
    sdar_token_terms(student, teacher).sum().backward()
    assert teacher.grad is None
    # The gate is not differentiated either: the gradient is exactly −g, not −g − g'·Δ.
    # Δ = [0.5, −0.5]: g = [σ(2.5), σ(−2.5)] = [0.924142, 0.075858].
    assert student.grad[0].tolist() == pytest.approx([-0.924142, -0.075858], abs=1e-6)


def test_non_finite_log_probs_contribute_zero_and_no_nan():
    # Token 0: teacher −inf (a token masked out of the teacher's view); token 1: teacher NaN; token 2: student −inf;
    # token 3: teacher +inf; token 4: a normal token with Δ = 1 ⇒ ℓ = σ(5)·1 = 0.99331, gradient −0.99331.
    student = torch.tensor([[-1.0, -1.0, -math.inf, -1.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-math.inf, math.nan, -1.0, math.inf, -1.0]])
    terms = sdar_token_terms(student, teacher)
    assert terms[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.99331], abs=1e-5)
    loss = masked_token_mean(terms, torch.ones(1, 5))
    assert torch.isfinite(loss)
    (grad,) = torch.autograd.grad(loss, student)
    assert torch.isfinite(grad).all()
    assert grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, -0.99331 / 5], abs=1e-5)


def test_gate_of_non_finite_gap_is_zero():
    # Even with β = 0 (where σ(0·inf) would be σ(NaN)), a non-finite Δ gates to 0.
    delta = torch.tensor([math.inf, -math.inf, math.nan, 0.0])
    assert sdar_gate(delta).tolist() == [0.0, 0.0, 0.0, 0.5]
    assert sdar_gate(delta, beta=0.0).tolist() == [0.0, 0.0, 0.0, 0.5]


def test_extreme_gaps_saturate_the_gate_without_overflow():
    # Δ = ±1e4: σ(5e4) = 1, σ(−5e4) = 0 (no overflow in the exponent); ℓ = [1e4, −0].
    student = torch.zeros(1, 2, requires_grad=True)
    terms = sdar_token_terms(student, torch.tensor([[1e4, -1e4]]))
    assert terms[0].tolist() == pytest.approx([1e4, 0.0], abs=1e-3)
    (grad,) = torch.autograd.grad(terms.sum(), student)
    assert grad[0].tolist() == pytest.approx([-1.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("beta", [-1.0, math.nan, math.inf])
def test_bad_beta_is_rejected(beta):
    with pytest.raises(ValueError, match="beta \\(the SDAR gate sharpness\\) must be a finite number >= 0"):
        sdar_gate(torch.zeros(2), beta=beta)
    with pytest.raises(ValueError, match="beta"):
        sdar_token_terms(torch.zeros(1, 2), torch.zeros(1, 2), beta=beta)


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="same shape"):
        sdar_token_terms(torch.zeros(1, 2), torch.zeros(1, 3))
