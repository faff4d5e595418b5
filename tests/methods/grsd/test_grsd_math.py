"""GRSD's math (trl_agents/distill/grsd.py): the turn-level modulation, the reflection advantages and their loss
terms, with hand-computed cases and the degenerate groups."""

from __future__ import annotations

import math

import pytest
import torch

from trl_agents.distill.grsd import (
    group_has_mix,
    modulated_advantages,
    reflection_advantages,
    reflection_token_terms,
    turn_logprob_gap,
    turn_modulation,
    warmdown_lambda,
)


def test_hand_case_of_the_turn_level_modulation():
    # A = [+1, −1], δ = [0.2, 0.1]
    # q = sign(A)·δ = [0.2, −0.1]
    # e = expm1(q) = [0.221403, −0.095163]; mean|e| = (0.221403 + 0.095163)/2 = 0.158283
    # ν = e/(0.158283 + 1e-6) = [1.39879, −0.60122]
    # ĝ = clip(ν, ±0.2) = [0.2, −0.2]; factors = max(1 + 0.5·ĝ, 0.1) = [1.1, 0.9]
    # Â = A·factors = [+1.1, −0.9]
    assert turn_modulation([1.0, -1.0], [0.2, 0.1]) == pytest.approx([1.1, 0.9])
    assert modulated_advantages([1.0, -1.0], [0.2, 0.1], mixed=True) == pytest.approx([1.1, -0.9])
    # the unclipped signal, with a wide clip: factors 1 + 0.5·ν = [1.69940, 0.69939]
    assert turn_modulation([1.0, -1.0], [0.2, 0.1], g_max=3.0) == pytest.approx([1.69940, 0.69939], abs=1e-4)


def test_gaps_at_noise_level_get_the_full_modulation_unless_a_floor_is_set():
    # The hazard inherited from the reference: A = [+1, −1], δ = [2e-6, 1e-6] (the rounding of a bf16 forward):
    # e ≈ δ·sign(A) = [2e-6, −1e-6], mean|e| = 1.5e-6, ν = e/(1.5e-6 + 1e-6) = [0.8, −0.4], ĝ = clip(ν, ±0.2) =
    # [0.2, −0.2]: factors [1.1, 0.9] — exactly the modulation of real gaps (the hand case above).
    assert turn_modulation([1.0, -1.0], [2e-6, 1e-6]) == pytest.approx([1.1, 0.9], abs=1e-6)
    # grsd_gap_floor = 0.01: ν = e/(0.01 + 1e-6) = [2.0e-4, −1.0e-4]: factors 1 ± 0.5·ν, i.e. [1.0001, 0.99995]
    noise = turn_modulation([1.0, -1.0], [2e-6, 1e-6], floor=0.01)
    assert noise == pytest.approx([1.0001, 0.99995], abs=1e-6)
    # ... while the real gaps of the hand case (mean|e| = 0.158 > 0.01) keep their modulation
    assert turn_modulation([1.0, -1.0], [0.2, 0.1], floor=0.01) == pytest.approx([1.1, 0.9])


def test_a_group_without_a_success_failure_mix_keeps_its_advantages():
    assert not group_has_mix([True, True, True]) and not group_has_mix([False, False])
    assert group_has_mix([False, True])
    assert modulated_advantages([0.5, -0.5, 0.0], [0.3, -2.0, 1.0], mixed=False) == [0.5, -0.5, 0.0]


def test_the_teacher_disagreeing_with_the_outcome_attenuates():
    # a success (A > 0) the teacher likes less (δ < 0): q < 0, e < 0 ⇒ factor < 1; same for a failure the teacher
    # likes more (A < 0, δ > 0). A = [1, −1], δ = [−0.3, 0.3]: q = [−0.3, −0.3], e = [−0.259182]·2, ν = [−1, −1]
    # (up to ε), ĝ = −0.2 ⇒ factors 0.9, Â = [0.9, −0.9]
    assert modulated_advantages([1.0, -1.0], [-0.3, 0.3], mixed=True) == pytest.approx([0.9, -0.9])


def test_dead_zone_floor_and_zero_advantage():
    # η = 1.5 cuts ν = [1.39879, −0.60122] to g = [0, 0]: no modulation
    assert turn_modulation([1.0, -1.0], [0.2, 0.1], eta=1.5) == [1.0, 1.0]
    # λ = 10, g_max = 3: 1 + 10·(−0.60122) = −5.01 ⇒ the floor 0.1: the failure's sign never flips
    factors = turn_modulation([1.0, -1.0], [0.2, 0.1], lam=10.0, g_max=3.0)
    assert factors[1] == pytest.approx(0.1)
    assert modulated_advantages([1.0, -1.0], [0.2, 0.1], True, lam=10.0, g_max=3.0)[1] == pytest.approx(-0.1)
    # A = 0: q = 0, e = 0, ν = 0 — no modulation and Â stays 0
    assert modulated_advantages([0.0, 1.0], [5.0, 0.1], mixed=True)[0] == 0.0


def test_rows_without_a_gap_keep_their_advantage_and_leave_the_mean_alone():
    # the third row has no gap: the first two are exactly the hand case
    assert modulated_advantages([1.0, -1.0, 0.7], [0.2, 0.1, None], mixed=True) == pytest.approx([1.1, -0.9, 0.7])


@pytest.mark.parametrize("advantages, deltas", [
    ([], []),                                   # empty group
    ([1.0], [0.4]),                             # singleton: ν = e/|e| = 1 ⇒ ĝ = 0.2
    ([0.5, 0.5, 0.5], [0.1, 0.1, 0.1]),         # all equal
    ([1.0, -1.0], [None, None]),                # all invalid
    ([1.0, -1.0], [0.0, 0.0]),                  # no gap at all: mean|e| = 0, ε keeps it finite
    ([1.0, -1.0], [1e6, -1e6]),                 # huge gaps: q clipped to ±20 before expm1
    ([1.0, -1.0], [float("nan"), float("inf")]),  # non-finite gaps count as none
])
def test_degenerate_groups_give_finite_advantages(advantages, deltas):
    out = modulated_advantages(advantages, deltas, mixed=True)
    assert len(out) == len(advantages) and all(math.isfinite(v) for v in out)
    for a, b in zip(advantages, out, strict=True):
        assert b == 0.0 or math.copysign(1, a) == math.copysign(1, b)  # the sign of A never flips
        assert abs(b) <= abs(a) * 1.1 + 1e-12  # |ĝ| ≤ 0.2, λ = 0.5


def test_singleton_and_all_equal_groups():
    assert modulated_advantages([1.0], [0.4], mixed=True) == pytest.approx([1.1])  # ν = 1 ⇒ ĝ = 0.2
    assert modulated_advantages([0.5] * 3, [0.1] * 3, mixed=True) == pytest.approx([0.55] * 3)
    assert modulated_advantages([1.0, -1.0], [None, None], mixed=True) == [1.0, -1.0]


def test_turn_gap():
    # teacher mean (−0.5 − 1.5)/2 = −1.0, student mean (−1.0 − 1.4)/2 = −1.2 ⇒ δ = 0.2
    assert turn_logprob_gap([-0.5, -1.5], [-1.0, -1.4]) == pytest.approx(0.2)
    for teacher, student in [([], []), (None, [-1.0]), ([-1.0], [-1.0, -2.0]), ([float("nan")], [-1.0])]:
        assert turn_logprob_gap(teacher, student) is None


def test_reflection_advantages_hand_case():
    # valid scores [3, 1, 2]: mean 2, population std sqrt((1 + 1 + 0)/3) = 0.816497
    # ⇒ A = [1/(0.816497 + 1e-6), −1/(0.816497 + 1e-6), 0, 0] = [1.224743, −1.224743, 0, 0]; the invalid score gets 0
    # and its reflection stays in the token mean, as the reference's compute_group_normalized_advantage does
    out = reflection_advantages([3, 1, None, 2])
    assert out[2] == 0.0
    assert [out[0], out[1], out[3]] == pytest.approx([1.224743, -1.224743, 0.0], abs=1e-6)
    # fewer than 2 valid: 0 for every one; all invalid: 0; all equal: 0
    assert reflection_advantages([2.0, None, None]) == [0.0, 0.0, 0.0]
    assert reflection_advantages([None, None]) == [0.0, 0.0]
    assert reflection_advantages([1, 1, 1]) == [0.0, 0.0, 0.0]
    assert reflection_advantages([]) == []


def test_reflection_terms_and_their_gradient():
    logps = torch.tensor([[-1.0, -3.0], [-2.0, -0.5]], requires_grad=True)
    terms = reflection_token_terms(logps, torch.tensor([0.5, -1.0]))
    # −A·log π: [[0.5, 1.5], [−2.0, −0.5]]
    assert terms.detach().tolist() == [[0.5, 1.5], [-2.0, -0.5]]
    terms.sum().backward()
    assert logps.grad.tolist() == [[-0.5, -0.5], [1.0, 1.0]]  # −A on each token
    with pytest.raises(ValueError, match="logps must be"):
        reflection_token_terms(torch.zeros(2, 3), torch.zeros(3))


def test_lambda_warmdown_and_option_errors():
    assert warmdown_lambda(0.5, 25, 100) == pytest.approx(0.375)  # 0.5·(1 − 25/100)
    assert warmdown_lambda(0.5, 10, 0) == 0.5
    for kwargs, message in [({"lam": -1.0}, "lam must be"), ({"eta": float("nan")}, "eta must be"),
                            ({"g_max": 0.0}, "g_max must be")]:
        with pytest.raises(ValueError, match=message):
            turn_modulation([1.0], [0.1], **kwargs)
    with pytest.raises(ValueError, match="one value per step row"):
        turn_modulation([1.0, 2.0], [0.1])
