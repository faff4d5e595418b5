"""OPSD losses (`trl_agents.distill.opsd`) against hand-computed numbers.

The expected values are written out with their arithmetic in comments; they are not recomputed with the code under
test. ln 1.2 = 0.182322, ln(2/3) = −0.405465, ln 0.8 = −0.223144, ln(4/3) = 0.287682, ln 1.5 = 0.405465,
ln 0.5 = −0.693147.
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_agents.distill import generalized_jsd, masked_token_mean, sampled_token_distillation

LN3 = math.log(3.0)

# The 2-token case used throughout: student logits [0, 0] → p_S = [0.5, 0.5];
# teacher logits [ln 3, 0] → p_T = [3/4, 1/4].
STUDENT = [0.0, 0.0]
TEACHER = [LN3, 0.0]

# β = 0.5: M = 0.5·p_S + 0.5·p_T = [0.625, 0.375]
#   KL(p_T‖M) = 0.75·ln(0.75/0.625) + 0.25·ln(0.25/0.375) = 0.75·0.182322 − 0.25·0.405465 = 0.035375
#   KL(p_S‖M) = 0.5·ln(0.5/0.625) + 0.5·ln(0.5/0.375)    = −0.5·0.223144 + 0.5·0.287682  = 0.032269
#   L = 0.5·0.035375 + 0.5·0.032269 = 0.033822
JSD_HALF = 0.033822
# β = 0: KL(p_T‖p_S) = 0.75·ln(0.75/0.5) + 0.25·ln(0.25/0.5) = 0.75·0.405465 − 0.25·0.693147 = 0.130812
FORWARD_KL = 0.130812
# β = 1: KL(p_S‖p_T) = 0.5·ln(0.5/0.75) + 0.5·ln(0.5/0.25) = −0.5·0.405465 + 0.5·0.693147 = 0.143841
REVERSE_KL = 0.143841


def logits(*rows: list[float], requires_grad: bool = False) -> torch.Tensor:
    """(1, T, V) logits, one row per position."""
    return torch.tensor([list(rows)], dtype=torch.float32, requires_grad=requires_grad)


def test_identical_logits_give_zero_loss_and_zero_gradient():
    torch.manual_seed(0)
    base = torch.randn(2, 3, 5) * 3
    for beta in (0.0, 0.5, 1.0):
        student = base.clone().requires_grad_(True)
        loss = generalized_jsd(student, base.clone(), beta=beta, temperature=1.1)
        assert loss.shape == (2, 3)
        assert loss.abs().max().item() < 1e-6
        (grad,) = torch.autograd.grad(loss.sum(), student)
        assert grad.abs().max().item() < 1e-6


def test_two_token_jsd_beta_half_by_hand():
    loss = generalized_jsd(logits(STUDENT), logits(TEACHER), beta=0.5)
    assert loss.shape == (1, 1)
    assert loss.item() == pytest.approx(JSD_HALF, abs=1e-6)


def test_two_token_jsd_asymmetric_beta_weights_the_teacher_in_the_mixture():
    # β = 0.25: M = 0.75·p_S + 0.25·p_T = [0.5625, 0.4375]
    #   KL(p_T‖M) = 0.75·ln(0.75/0.5625) + 0.25·ln(0.25/0.4375) = 0.75·0.287682 − 0.25·0.559616 = 0.075858
    #   KL(p_S‖M) = 0.5·ln(0.5/0.5625) + 0.5·ln(0.5/0.4375)    = −0.5·0.117783 + 0.5·0.133531 = 0.007874
    #   L = 0.25·0.075858 + 0.75·0.007874 = 0.018964 + 0.005906 = 0.024870
    loss = generalized_jsd(logits(STUDENT), logits(TEACHER), beta=0.25)
    assert loss.item() == pytest.approx(0.024870, abs=1e-6)


def test_beta_zero_is_forward_kl_and_beta_one_is_reverse_kl():
    assert generalized_jsd(logits(STUDENT), logits(TEACHER), beta=0.0).item() == pytest.approx(FORWARD_KL, abs=1e-6)
    assert generalized_jsd(logits(STUDENT), logits(TEACHER), beta=1.0).item() == pytest.approx(REVERSE_KL, abs=1e-6)


def test_kl_ends_gradients_by_hand():
    # Forward KL(p_T‖p_S) w.r.t. the student logits: p_S − p_T = [0.5 − 0.75, 0.5 − 0.25] = [−0.25, 0.25].
    student = logits(STUDENT, requires_grad=True)
    (grad,) = torch.autograd.grad(generalized_jsd(student, logits(TEACHER), beta=0.0).sum(), student)
    assert grad[0, 0].tolist() == pytest.approx([-0.25, 0.25], abs=1e-6)
    # Reverse KL(p_S‖p_T): p_S·(ln p_S/p_T − KL) = 0.5·(−0.405465 − 0.143841), 0.5·(0.693147 − 0.143841)
    #                                             = [−0.274653, 0.274653]
    student = logits(STUDENT, requires_grad=True)
    (grad,) = torch.autograd.grad(generalized_jsd(student, logits(TEACHER), beta=1.0).sum(), student)
    assert grad[0, 0].tolist() == pytest.approx([-0.274653, 0.274653], abs=1e-6)


def test_temperature_divides_both_logits():
    # τ = 2 on teacher logits [2·ln 3, 0] gives [ln 3, 0] again (student [0, 0] stays [0, 0]): the β = 0.5 case.
    scaled = generalized_jsd(logits(STUDENT), logits([2 * LN3, 0.0]), beta=0.5, temperature=2.0)
    assert scaled.item() == pytest.approx(JSD_HALF, abs=1e-6)
    # τ = 1 on the same logits: p_T = [9/10, 1/10], M = [0.7, 0.3]
    #   KL(p_T‖M) = 0.9·ln(9/7) + 0.1·ln(1/3) = 0.9·0.251314 − 0.1·1.098612 = 0.116322
    #   KL(p_S‖M) = 0.5·ln(5/7) + 0.5·ln(5/3) = −0.5·0.336472 + 0.5·0.510826 = 0.087177
    #   L = 0.5·(0.116322 + 0.087177) = 0.101750
    unscaled = generalized_jsd(logits(STUDENT), logits([2 * LN3, 0.0]), beta=0.5)
    assert unscaled.item() == pytest.approx(0.101750, abs=1e-5)
    # The gradient w.r.t. the raw logits carries the 1/τ of z/τ: forward KL at τ = 2 is (p_S − p_T)/2.
    student = logits(STUDENT, requires_grad=True)
    loss = generalized_jsd(student, logits([2 * LN3, 0.0]), beta=0.0, temperature=2.0)
    (grad,) = torch.autograd.grad(loss.sum(), student)
    assert grad[0, 0].tolist() == pytest.approx([-0.125, 0.125], abs=1e-6)


def test_top_k_keeps_the_teachers_top_tokens_and_renormalises_both():
    # V = 3. Teacher [ln 3, 0, −5]: its top 2 are tokens 0 and 1. Student [0, 0, 7] puts most mass on token 2, which
    # top_k = 2 drops: renormalised over {0, 1}, p_S = [0.5, 0.5] and p_T = [0.75, 0.25] — the β = 0.5 case.
    student, teacher = logits([0.0, 0.0, 7.0]), logits([LN3, 0.0, -5.0])
    assert generalized_jsd(student, teacher, top_k=2).item() == pytest.approx(JSD_HALF, abs=1e-6)
    # Over the full vocabulary the student's mass on token 2 counts, and the divergence is far larger.
    assert generalized_jsd(student, teacher).item() > 0.3
    # k >= V is the full vocabulary.
    full = generalized_jsd(student, teacher).item()
    assert generalized_jsd(student, teacher, top_k=3).item() == pytest.approx(full, abs=1e-6)
    assert generalized_jsd(student, teacher, top_k=50).item() == pytest.approx(full, abs=1e-6)
    # k = 1: both renormalise to a single token with probability 1: no divergence.
    assert generalized_jsd(student, teacher, top_k=1).item() == pytest.approx(0.0, abs=1e-7)


def test_top_k_follows_the_teacher_at_each_position():
    # Position 0: teacher prefers tokens {0, 1}; position 1: tokens {2, 1} (order within the k does not matter).
    student = logits([0.0, 0.0, 9.0], [9.0, 0.0, 0.0])
    teacher = logits([LN3, 0.0, -5.0], [-5.0, 0.0, LN3])
    # Position 0 keeps student [0, 0] vs teacher [ln 3, 0]; position 1 keeps student [0, 0] vs teacher [0, ln 3]:
    # the same pair of distributions up to order, so both are the β = 0.5 value.
    loss = generalized_jsd(student, teacher, top_k=2)
    assert loss[0].tolist() == pytest.approx([JSD_HALF, JSD_HALF], abs=1e-6)


def test_teacher_gets_no_gradient():
    student = logits(STUDENT, requires_grad=True)
    teacher = logits(TEACHER, requires_grad=True)
    generalized_jsd(student, teacher).sum().backward()
    assert teacher.grad is None
    assert student.grad is not None and torch.isfinite(student.grad).all()


def test_extreme_logits_stay_finite():
    # Student [1e4, −1e4] → p_S = [1, 0] (log p_S = [0, −2e4]); teacher [−1e4, 1e4] → p_T = [0, 1].
    # β = 0.5: M = [0.5, 0.5], KL(p_T‖M) = ln 2 and KL(p_S‖M) = ln 2, so L = ln 2 = 0.693147.
    # β = 0: KL(p_T‖p_S) = 1·(0 − (−2e4)) = 2e4; β = 1 the same by symmetry.
    expected = {0.0: 2e4, 0.5: math.log(2.0), 1.0: 2e4}
    for beta, value in expected.items():
        student = logits([1e4, -1e4], requires_grad=True)
        loss = generalized_jsd(student, logits([-1e4, 1e4]), beta=beta)
        assert loss.item() == pytest.approx(value, rel=1e-5)
        (grad,) = torch.autograd.grad(loss.sum(), student)
        assert torch.isfinite(grad).all()


def test_half_precision_logits_are_computed_in_float32():
    loss = generalized_jsd(logits(STUDENT).bfloat16(), logits(TEACHER).bfloat16())
    assert loss.dtype == torch.bfloat16
    # bf16 stores ln 3 as 1.0986328: p_T = 0.749994…, so the value moves by ~1e-5 only (bf16 output rounding ±1e-4).
    assert loss.float().item() == pytest.approx(JSD_HALF, abs=2e-4)


def test_minus_inf_teacher_entries_are_probability_zero_tokens():
    # V = 3, teacher [ln 3, 0, −inf] → p_T = [0.75, 0.25, 0]; student [0, 0, −5].
    # β = 0: KL(p_T‖p_S) skips token 2 (0·log 0 = 0). p_S = [1, 1, e^−5]/(2 + e^−5) = [0.498321, 0.498321, 0.003358]
    #   KL = 0.75·ln(0.75/0.498321) + 0.25·ln(0.25/0.498321) = 0.75·0.408829 − 0.25·0.689783 = 0.134176
    student = logits([0.0, 0.0, -5.0], requires_grad=True)
    teacher = logits([LN3, 0.0, -math.inf])
    forward = generalized_jsd(student, teacher, beta=0.0)
    assert forward.item() == pytest.approx(0.134176, abs=1e-5)
    (grad,) = torch.autograd.grad(forward.sum(), student)
    assert torch.isfinite(grad).all()
    # The same teacher with top_k = 2 drops token 2: exactly the 2-token forward KL.
    assert generalized_jsd(student, teacher, beta=0.0, top_k=2).item() == pytest.approx(FORWARD_KL, abs=1e-6)
    # Every β gives a finite value and a finite gradient (the reverse KL is large: the student has mass on a token
    # the teacher cannot emit, so the true value is infinite; it is reported as a huge finite number).
    for beta in (0.5, 1.0):
        student = logits([0.0, 0.0, -5.0], requires_grad=True)
        loss = generalized_jsd(student, teacher, beta=beta)
        assert torch.isfinite(loss).all()
        (grad,) = torch.autograd.grad(loss.sum(), student)
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_forward_kl_onto_a_probability_zero_student_token_stays_finite_in_every_dtype(dtype):
    # β = 0, teacher [0, 0] (p_T = [.5, .5]), student [0, −inf] (p_S(token 1) = 0): KL(p_T‖p_S) is infinite. The
    # log floor −1e30 makes it 0.5·(ln .5 + 1e30) ≈ 5e29 in float32, which float16 cannot hold (largest 65504): it
    # is reported as 65504 there, and as ≈ 5e29 in bfloat16 and float32. Position 1 (teacher [.2, .3], student
    # [1, .5]) is an ordinary pair and keeps its value and gradient.
    student = torch.tensor([[[0.0, -math.inf], [1.0, 0.5]]], dtype=dtype, requires_grad=True)
    teacher = torch.tensor([[[0.0, 0.0], [0.2, 0.3]]], dtype=dtype)
    loss = generalized_jsd(student, teacher, beta=0.0)
    assert loss.dtype == dtype and torch.isfinite(loss).all()
    expected = 65504.0 if dtype == torch.float16 else 5.0e29
    assert loss[0, 0].float().item() == pytest.approx(expected, rel=1e-2)
    (grad,) = torch.autograd.grad(loss.sum(), student)
    assert torch.isfinite(grad).all()


def test_positions_without_a_distribution_give_zero_and_no_gradient():
    # Position 0: a normal pair (β = 0.5 value). Position 1: NaN in the teacher. Position 2: all −inf teacher.
    # Position 3: +inf in the student.
    student = logits(STUDENT, STUDENT, STUDENT, [math.inf, 0.0], requires_grad=True)
    teacher = logits(TEACHER, [math.nan, 0.0], [-math.inf, -math.inf], TEACHER)
    loss = generalized_jsd(student, teacher)
    assert loss[0].tolist() == pytest.approx([JSD_HALF, 0.0, 0.0, 0.0], abs=1e-6)
    (grad,) = torch.autograd.grad(loss.sum(), student)
    assert torch.isfinite(grad).all()
    assert grad[0, 1:].abs().max().item() == 0.0


def test_sampled_token_gradient_is_minus_the_gap():
    # log p_T − log p_S = +1 at every token ⇒ A_t = 1, ℓ_t = −1·log p_S(y_t) = [2, 0.5, 3],
    # ∂ℓ_t/∂log p_S(y_t) = −A_t = −1 per token.
    student = torch.tensor([[-2.0, -0.5, -3.0]], requires_grad=True)
    teacher = (student + 1.0).detach().requires_grad_(True)
    loss = sampled_token_distillation(student, teacher)
    assert loss[0].tolist() == pytest.approx([2.0, 0.5, 3.0], abs=1e-6)
    loss.sum().backward()
    assert student.grad[0].tolist() == pytest.approx([-1.0, -1.0, -1.0], abs=1e-6)
    assert teacher.grad is None


def test_sampled_token_non_finite_tokens_contribute_zero():
    # Token 0: teacher −inf (masked token); token 1: NaN teacher; token 2: student −inf; token 3: A = −0.5 ⇒
    # ℓ = 0.5·(−1) = −0.5, gradient +0.5.
    student = torch.tensor([[-1.0, -1.0, -math.inf, -1.0]], requires_grad=True)
    teacher = torch.tensor([[-math.inf, math.nan, -1.0, -1.5]])
    loss = sampled_token_distillation(student, teacher)
    assert loss[0].tolist() == pytest.approx([0.0, 0.0, 0.0, -0.5], abs=1e-6)
    loss.sum().backward()
    assert student.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5], abs=1e-6)


def test_masked_token_mean_ignores_padding():
    # Kept tokens 1, 2 (row 0) and 3 (row 1): (1 + 2 + 3)/3 = 2; the padding (99, NaN) never enters.
    values = torch.tensor([[1.0, 2.0, 99.0], [3.0, math.nan, math.nan]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    mean = masked_token_mean(values, mask)
    assert mean.item() == pytest.approx(2.0)
    mean.backward()
    # ∂mean/∂v = 1/3 at kept tokens, 0 at padding (and not NaN).
    assert values.grad.flatten().tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3, 0.0, 0.0])
    assert masked_token_mean(values, mask.bool()).item() == pytest.approx(2.0)


def test_empty_mask_gives_zero_not_nan():
    values = torch.tensor([[math.nan, 1.0]], requires_grad=True)
    mean = masked_token_mean(values, torch.zeros(1, 2))
    assert mean.item() == 0.0
    mean.backward()
    assert values.grad.tolist() == [[0.0, 0.0]]
    # End to end: a JSD over a fully masked batch.
    student = logits(STUDENT, requires_grad=True)
    loss = masked_token_mean(generalized_jsd(student, logits(TEACHER)), torch.zeros(1, 1, dtype=torch.bool))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(student.grad).all() and student.grad.abs().max().item() == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": 1.5}, "beta must be a number in \\[0, 1\\]"),
        ({"beta": -0.1}, "beta must be a number in \\[0, 1\\]"),
        ({"temperature": 0.0}, "temperature must be a finite number > 0"),
        ({"temperature": math.inf}, "temperature must be a finite number > 0"),
        ({"top_k": 0}, "top_k must be None"),
        ({"top_k": 2.5}, "top_k must be None"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generalized_jsd(logits(STUDENT), logits(TEACHER), **kwargs)


def test_shape_mismatches_are_rejected():
    with pytest.raises(ValueError, match="same shape"):
        generalized_jsd(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="same shape"):
        sampled_token_distillation(torch.zeros(1, 2), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="same shape"):
        masked_token_mean(torch.zeros(1, 2), torch.zeros(2, 1))
