"""PCSD's token weights and loss terms (trl_agents/distill/pcsd.py): the hand cases of docs/methods/pcsd.md, turn
boundaries, the options, gradients and the non-finite / degenerate inputs."""

from __future__ import annotations

import math

import pytest
import torch

from trl_agents.distill import masked_token_mean, pcsd_token_terms, pcsd_weights, sdar_gate
from trl_agents.distill.pcsd import turn_ids


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def weights(delta, mask=None, **options):
    delta = torch.tensor([delta], dtype=torch.float64)
    mask = torch.ones_like(delta) if mask is None else torch.tensor([mask])
    return pcsd_weights(delta, mask, **options)[0].tolist()


def test_constant_gap_is_sdars_gate():
    # v = 0 → a = 0 → δ = Δ = 0.5; slope 0 → η = 1; w = σ(5·0.5) = σ(2.5) = 0.924142
    assert weights([0.5] * 6) == pytest.approx([sig(2.5)] * 6, abs=1e-9)
    assert sig(2.5) == pytest.approx(0.9241, abs=5e-5)
    assert weights([0.5] * 6) == pytest.approx(sdar_gate(torch.full((6,), 0.5, dtype=torch.float64)).tolist())


def test_isolated_spike_by_hand():
    w = weights([0, 0, 0, 0, 2, 0, 0, 0])
    # t = 4: look-ahead window {4..7} (the turn ends at 7) = [2, 0, 0, 0]
    #   decayed mean, weights ρ^k = [1, .7, .49, .343] (sum 2.533): Δ̄⁽⁸⁾ = 2/2.533 = 0.789577
    #   v = population variance of [2, 0, 0, 0] = (1.5² + 3·0.5²)/4 = 0.75; a = 0.75/(0.75 + 0.1) = 0.882353
    #   δ = (1 − a)·Δ_4 + a·Δ̄⁽⁸⁾ = 0.117647·2 + 0.882353·0.789577 = 0.235294 + 0.696686 = 0.931980
    #   OLS slope of [2, 0, 0, 0] on k = 0..3: Σ(k−1.5)(y−0.5)/Σ(k−1.5)² = −3/5 = −0.6 → η = 1 − 0.5·0.6 = 0.7
    #   w = σ(5·0.931980)·0.7 = σ(4.659902)·0.7 = 0.990621·0.7 = 0.693435
    assert w[4] == pytest.approx(0.693435, abs=1e-6)
    assert w[4] < sig(10.0)  # SDAR's gate at the spike: σ(5·2) ≈ 1
    # t = 5..7: windows of zeros: δ = 0, slope 0, w = σ(0) = 0.5
    assert w[5:] == pytest.approx([0.5, 0.5, 0.5])
    # t = 0: window [0, 0, 0, 0, 2, 0, 0, 0], the spike lifts the tokens before it a little (look-ahead)
    assert 0.5 < w[0] < w[3] < 1.0


def test_monotone_decline_by_hand():
    w = weights([1.0, 0.8, 0.6, 0.4, 0.2, 0.0])
    # t = 0: window = the whole turn, [1, .8, .6, .4, .2, 0]
    #   v = 0.2²·(6² − 1)/12 = 0.116667; a = 0.116667/0.216667 = 0.538462
    #   Δ̄⁽⁸⁾ = (1 + .7·.8 + .49·.6 + .343·.4 + .2401·.2)/(1 + .7 + .49 + .343 + .2401 + .16807) = 2.03922/2.94117
    #        = 0.693343;  δ = 0.461538·1 + 0.538462·0.693343 = 0.834877
    #   slope −0.2 → η = 0.9;  w = σ(4.174387)·0.9 = 0.984848·0.9 = 0.886363
    # t = 3: window [.4, .2, 0]: v = 0.026667, a = 0.210526, Δ̄ = (.4 + .14)/2.19 = 0.246575,
    #   δ = 0.789474·0.4 + 0.210526·0.246575 = 0.367705; w = σ(1.838523)·0.9 = 0.862771·0.9 = 0.776494
    # t = 5: a one-token window: v = 0, slope 0, δ = 0, w = 0.5
    expected = [0.886363, 0.871267, 0.840249, 0.776494, 0.651272, 0.5]
    assert w == pytest.approx(expected, abs=1e-6)
    # our sources print [0.886, 0.871, 0.840, 0.777, 0.651, 0.5]: 0.776494 is 0.7765 to four places, 0.776 to
    # three (their 0.777 rounds twice); every other value agrees to the printed digits
    assert [round(v, 3) for v in w] == [0.886, 0.871, 0.84, 0.776, 0.651, 0.5]
    sdar = [sig(5 * d) for d in (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)]  # [0.993, 0.982, 0.953, 0.881, 0.731, 0.5]
    assert all(a < b for a, b in zip(w[:-1], sdar[:-1], strict=True)) and w[-1] == pytest.approx(sdar[-1])


def test_windows_stay_inside_their_turn():
    # two turns in one conversation row, separated by environment tokens (mask 0): [0.5, 0.5] | env | [2, 0, 0]
    mask = [1, 1, 0, 0, 1, 1, 1]
    w = weights([0.5, 0.5, 9.0, 9.0, 2.0, 0.0, 0.0], mask)
    assert w[:2] == pytest.approx([sig(2.5)] * 2)  # the first turn is constant: the later spike is not in its window
    assert w[2:4] == [0.0, 0.0]  # masked tokens
    assert w[4:] == pytest.approx(weights([2.0, 0.0, 0.0]))  # the second turn on its own
    assert turn_ids(torch.tensor([mask])).tolist() == [[1, 1, 0, 0, 2, 2, 2]]
    # rows are independent
    both = pcsd_weights(torch.tensor([[0.5, 0.5, 0.5], [2.0, 0.0, 0.0]]), torch.ones(2, 3))
    assert both[0].tolist() == pytest.approx([sig(2.5)] * 3) and both[1].tolist() == pytest.approx(weights([2, 0, 0]))


def test_options():
    spike = [0, 0, 0, 0, 2, 0, 0, 0]
    # causal windows = look-ahead windows of the reversed turn, slope negated: here the spike is the window's last point
    causal = weights(spike, window="causal")
    assert causal[4] > weights(spike)[4]  # a rising window is not damped
    # a = 0 ("short"): δ = Δ, and without the trend factor PCSD is SDAR exactly
    assert weights(spike, mix="short", trend_coef=0.0) == pytest.approx([sig(5 * d) for d in spike])
    # a = 1 ("long"): δ = the decayed long mean; ρ = 1: plain mean of [2, 0, 0, 0] = 0.5, w = σ(2.5)·0.7
    assert weights(spike, mix="long", decay=1.0)[4] == pytest.approx(sig(2.5) * 0.7)
    # saturation (our guard): a slope of −4 with γ_tr = 0.5 gives η = 1 − 0.5·min(1, 4) = 0.5; δ of [4, 0] at
    # token 0 is 4·(1 − a) + a·(4/1.7) with a = 4/4.1 = .97561: δ = 2.39139, σ(11.957) = .999994 -> w = .499997.
    # Unsaturated (trend_saturate=False), η = max(1 − 2, 0) = 0: the weight falls to 0 as the spike grows.
    assert weights([4.0, 0.0], trend_coef=0.5)[0] == pytest.approx(0.499997, abs=1e-6)
    assert weights([4.0, 0.0], trend_coef=0.5, trend_saturate=False)[0] == 0.0
    # β = 0: σ(0) = 0.5 times the trend factor
    assert weights([1.0, 0.8], beta=0.0)[0] == pytest.approx(0.5 * 0.9)


def test_a_strong_spike_keeps_half_its_weight():
    # The audit's hazard: a spike of Δ = h at token 4 of [0, 0, 0, 0, h, 0, 0, 0] has the 4-token look-ahead window
    # [h, 0, 0, 0], whose OLS slope is Σ(x − 1.5)(y − h/4) / Σ(x − 1.5)² = −1.5·h / 5 = −0.3·h, so the unsaturated
    # η = 1 − 0.5·0.3·h: w(2) = .6934, w(6.7) = 0; Δ = [5, 0] gives the first token 0 where SDAR's gate σ(25) gives 1.
    # Saturated: η ≥ 1 − γ_tr = 0.5, so w tends to 0.5 and never reaches 0.
    def at(h, **options):
        return weights([0, 0, 0, 0, h, 0, 0, 0], **options)[4]

    assert at(2.0) == pytest.approx(0.6934, abs=1e-4) == at(2.0, trend_saturate=False)  # 0.3·2 < 1: the same
    assert at(6.7, trend_saturate=False) == 0.0 and at(6.7) == pytest.approx(0.5, abs=1e-4)
    assert weights([5.0, 0.0], trend_saturate=False)[0] == 0.0
    assert weights([5.0, 0.0])[0] == pytest.approx(0.5, abs=1e-4)
    assert min(at(h) for h in (2.0, 4.0, 6.7, 10.0, 50.0)) > 0.49


def test_terms_gradient_and_loss():
    student = torch.zeros(1, 3, requires_grad=True)
    teacher = torch.tensor([[0.5, 0.5, 0.5]], requires_grad=True)
    terms, w = pcsd_token_terms(student, teacher, torch.ones(1, 3))
    assert w.tolist()[0] == pytest.approx([sig(2.5)] * 3, abs=1e-6)
    assert terms.tolist()[0] == pytest.approx([0.5 * sig(2.5)] * 3, abs=1e-6)  # ℓ = w·Δ
    (grad,) = torch.autograd.grad(masked_token_mean(terms, torch.ones(1, 3)), student)
    assert grad.tolist()[0] == pytest.approx([-sig(2.5) / 3] * 3, abs=1e-6)  # −w/3 per token
    assert not w.requires_grad and teacher.grad is None


def test_non_finite_tokens_get_zero_and_leave_the_windows():
    nan, inf = math.nan, math.inf
    student = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    teacher = torch.tensor([[0.5, nan, 0.5, -inf, inf]])
    terms, w = pcsd_token_terms(student, teacher, torch.ones(1, 5))
    # token 0's window is {0, 2} (token 1 left out, offsets kept), token 2's is {2}: both constant 0.5
    assert w[0].tolist() == pytest.approx([sig(2.5), 0.0, sig(2.5), 0.0, 0.0])
    assert torch.isfinite(terms).all() and terms[0, [1, 3, 4]].tolist() == [0.0, 0.0, 0.0]
    masked_token_mean(terms, torch.ones(1, 5)).backward()
    assert torch.isfinite(student.grad).all() and student.grad[0, [1, 3, 4]].tolist() == [0.0, 0.0, 0.0]
    # a non-finite student log-prob too
    _, w = pcsd_token_terms(torch.tensor([[-inf, 0.0]]), torch.tensor([[0.0, 0.5]]), torch.ones(1, 2))
    assert w.tolist()[0] == pytest.approx([0.0, sig(2.5)])


@pytest.mark.parametrize("delta, mask", [
    ([[]], [[]]),  # empty
    ([[0.3]], [[1]]),  # one token
    ([[0.2, 0.2, 0.2]], [[1, 1, 1]]),  # all equal
    ([[1.0, -1.0]], [[0, 0]]),  # nothing trained
    ([[math.nan, math.inf]], [[1, 1]]),  # nothing finite
    ([[1e6, -1e6, 1e6]], [[1, 1, 1]]),  # extreme gaps
])
def test_degenerate_inputs_stay_finite(delta, mask):
    delta, mask = torch.tensor(delta, dtype=torch.float32).reshape(len(delta), -1), torch.tensor(mask).reshape(1, -1)
    w = pcsd_weights(delta, mask)
    assert w.shape == delta.shape and torch.isfinite(w).all() and ((w >= 0) & (w <= 1)).all()
    assert (w[mask == 0] == 0).all()
    if delta.numel() == 1:
        assert w.item() == pytest.approx(sig(5 * 0.3))  # one token: δ = Δ, no trend
    student = torch.zeros_like(delta, requires_grad=True)
    terms, _ = pcsd_token_terms(student, delta, mask)
    loss = masked_token_mean(terms, mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(student.grad).all()


def test_bfloat16_inputs_work():
    w = pcsd_weights(torch.full((1, 3), 0.5, dtype=torch.bfloat16), torch.ones(1, 3))
    assert w.dtype == torch.float32 and w[0].tolist() == pytest.approx([sig(2.5)] * 3, abs=1e-3)


@pytest.mark.parametrize("option, value, message", [
    ("beta", -1.0, "beta"), ("short_window", 0, "short_window"), ("long_window", 2.5, "long_window"),
    ("decay", 0.0, "decay"), ("var_offset", 0.0, "var_offset"), ("trend_coef", -0.1, "trend_coef"),
    ("trend_scale", 0.0, "trend_scale"), ("window", "centred", "window must be one of"),
    ("mix", "max", "mix must be one of"),
])
def test_argument_checks(option, value, message):
    with pytest.raises(ValueError, match=message):
        pcsd_weights(torch.zeros(1, 2), torch.ones(1, 2), **{option: value})
    with pytest.raises(ValueError, match="short_window"):
        pcsd_weights(torch.zeros(1, 2), torch.ones(1, 2), short_window=9, long_window=8)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        pcsd_weights(torch.zeros(2), torch.ones(2))
