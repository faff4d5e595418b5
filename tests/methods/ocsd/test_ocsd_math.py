"""OCSD's math (trl_agents.distill.ocsd): step uncertainty and selection, the residual gate, the sign-preserving
advantage modulation, hand-computed cases and the guards (empty, singleton, all-equal, all-invalid, non-finite).

The replay views, the `ocsd_residual` signal and the trainer end to end are in tests/methods/ocsd/test_ocsd_trainer.py.
"""

from __future__ import annotations

import doctest
import math
import random

import pytest
import torch
from helpers import group_credit

from trl_agents.distill import ocsd
from trl_agents.distill.ocsd import (
    SIGNAL_NAME,
    check_beta,
    check_scaffold,
    OCSDParams,
    modulate_advantage,
    num_selected,
    ocsd_advantages,
    residual_gate,
    select_steps,
    step_uncertainty,
)
from trl_agents.trajectory import Group, Step, Trajectory


def ocsd_with_counts(groups, outcome_advantages, **params):
    """OCSD on `groups` modulating `outcome_advantages`, with `OCSDParams(**params)`: (advantages, the totals behind its
    stats: steps, selected, tokens, abs_q, residual, finite, abs_change)."""
    advantages, stats = ocsd_advantages(groups, OCSDParams(outcome_advantages=outcome_advantages, **params))
    (selected, steps), (abs_q, tokens), (residual, finite) = (
        stats["selected_fraction"], stats["mean_abs_q"], stats["mean_residual"])
    return advantages, {"steps": steps, "selected": selected, "tokens": tokens, "abs_q": abs_q, "residual": residual,
                        "finite": finite, "abs_change": stats["mean_abs_advantage_change"][0]}


def test_doctests():
    assert doctest.testmod(ocsd).failed == 0


# ---------------------------------------------------------------- hand-computed cases


def test_residual_gate_and_modulation_by_hand():
    e = torch.tensor([2.0, 0.0, -1.0])
    q = residual_gate(e)
    # q = tanh(e/2) = tanh([1, 0, −0.5]) = [0.7616, 0, −0.4621]
    assert q.tolist() == pytest.approx([0.761594, 0.0, -0.462117], abs=1e-6)
    assert q.tolist() == pytest.approx((2 * torch.sigmoid(e) - 1).tolist(), abs=1e-6)  # = 2σ(e) − 1
    # A = +1, β = 0.5: Â = 1 + 0.5·q = [1.3808, 1, 0.7689]
    assert modulate_advantage(1.0, q, 0.5).tolist() == pytest.approx([1.380797, 1.0, 0.768941], abs=1e-6)
    # A = −1: Â = −1·(1 + 0.5·(−1)·q) = −1 + 0.5·q = [−0.6192, −1, −1.2311]
    assert modulate_advantage(-1.0, q, 0.5).tolist() == pytest.approx([-0.619203, -1.0, -1.231059], abs=1e-6)
    # A = 2, β = 0.25: Â = 2 + 0.25·2·q = 2 + 0.5·q = [2.3808, 2, 1.7689]
    assert modulate_advantage(2.0, q, 0.25).tolist() == pytest.approx([2.380797, 2.0, 1.768941], abs=1e-6)
    # A = 0 → 0 whatever q; β = 0 → A (GRPO)
    assert modulate_advantage(0.0, q, 0.5).tolist() == [0.0, 0.0, 0.0]
    assert modulate_advantage(-0.7, q, 0.0).tolist() == pytest.approx([-0.7] * 3)


def test_selection_of_a_six_step_trajectory_by_hand():
    logprobs = [
        [-0.25, -0.25],  # u0 = 0.25
        [-1.0, -2.0],    # u1 = 1.5   ← the most uncertain
        [-0.125],        # u2 = 0.125
        [-1.0, -1.5],    # u3 = 1.25  ← tied with step 4: the earlier step wins
        [-0.5, -2.0],    # u4 = 1.25
        [-0.75],         # u5 = 0.75
    ]
    u = [step_uncertainty(lp) for lp in logprobs]
    assert u == [0.25, 1.5, 0.125, 1.25, 1.25, 0.75]
    assert num_selected(6, 0.2) == 2  # ⌈0.2·6⌉ = ⌈1.2⌉ = 2
    assert select_steps(u, 0.2) == [1, 3]
    assert select_steps(u, 0.5) == [1, 3, 4]  # ⌈3⌉ = 3
    assert select_steps(u, 0.1) == [1]  # ⌈0.6⌉ = 1
    assert select_steps(u, 1.0) == [0, 1, 2, 3, 4, 5]
    # a step without action tokens (u = None) or without a finite log-prob is not eligible:
    # u = [0.25, 1.5, −, 1.25, 1.25, −], K = 4 → ⌈0.2·4⌉ = ⌈0.8⌉ = 1 step; ρ = 0.5 → ⌈2⌉ = 2 steps
    u_with_gaps = [*u[:2], None, *u[3:5], step_uncertainty([float("-inf"), float("nan")])]
    assert u_with_gaps[-1] is None
    assert select_steps(u_with_gaps, 0.2) == [1]
    assert select_steps(u_with_gaps, 0.5) == [1, 3]


def test_selection_counts():
    # ⌈ρ·K⌉, at least one, with a slack for 0.2·15 = 3.0000000000000004 (→ 3, not 4)
    assert [num_selected(k, 0.2) for k in (0, 1, 4, 5, 6, 10, 11, 15, 50)] == [0, 1, 1, 1, 2, 2, 3, 3, 10]
    assert num_selected(3, 1.0) == 3 and num_selected(3, 0.01) == 1


def test_advantages_with_stats_by_hand():
    # Group of two episodes (returns 1 and 0): GRPO A = ±0.7071 (Bessel std 0.7071, ε = 1e-4 → ±0.70706).
    # Episode 0: step 0 selected with e = [2, −1]; episode 1: step 1 selected with e = [0, nan].
    e0, e1 = [2.0, -1.0], [0.0, float("nan")]
    t0 = Trajectory({}, [Step("o", "x", action_ids=[1, 2], reward=0.0, signals={SIGNAL_NAME: e0}),
                         Step("o", "y", action_ids=[3], reward=1.0, signals={SIGNAL_NAME: None})])
    t1 = Trajectory({}, [Step("o", "x", action_ids=[1], reward=0.0, signals={SIGNAL_NAME: None}),
                         Step("o", "z", action_ids=[4, 5], reward=0.0, signals={SIGNAL_NAME: e1})])
    group = Group({}, [t0, t1])
    base = [group_credit("grpo", group, invalid_action_penalty=0.0)]
    a = 1 / (math.sqrt(0.5) + 1e-4) * 0.5  # (R − μ)/(σ + ε) = 0.5 / 0.70721 = 0.70700
    assert base[0][0] == pytest.approx([a, a]) and base[0][1] == pytest.approx([-a, -a])
    advantages, stats = ocsd_with_counts([group], base, ocsd_beta=0.5)
    # Â = A + 0.5·|A|·q: episode 0, q = [0.7616, −0.4621] → a·[1.3808, 0.7689]; episode 1, q = [0, 0] → −a
    assert advantages[0][0][0] == pytest.approx([a * 1.380797, a * 0.768941], abs=1e-6)
    assert advantages[0][0][1] == pytest.approx(a)
    assert advantages[0][1][0] == pytest.approx(-a)
    assert advantages[0][1][1] == pytest.approx([-a, -a], abs=1e-6)
    assert stats["steps"] == 4 and stats["selected"] == 2 and stats["tokens"] == 4
    assert stats["finite"] == 3 and stats["residual"] == pytest.approx(1.0)  # 2 − 1 + 0
    assert stats["abs_q"] == pytest.approx(0.761594 + 0.462117, abs=1e-5)
    assert stats["abs_change"] == pytest.approx(0.5 * a * (0.761594 + 0.462117), abs=1e-5)


# ---------------------------------------------------------------- properties and guards


def _group(returns, residual=(1.0,), valid=True, n_steps=2):
    trajectories = []
    for r in returns:
        steps = [Step("o", "a", action_ids=[1] * len(residual), action_logprobs=[-1.0] * len(residual),
                      reward=r if k == n_steps - 1 else 0.0, valid=valid,
                      signals={SIGNAL_NAME: list(residual) if k == 0 else None}) for k in range(n_steps)]
        trajectories.append(Trajectory({}, steps))
    return Group({}, trajectories)


def _run(groups, penalty=0.1, beta=0.5):
    base = [group_credit("grpo", g, invalid_action_penalty=penalty) for g in groups]
    return ocsd_with_counts(groups, base, ocsd_beta=beta)


def _flat(advantages):
    out = []
    for group in advantages:
        for row in group:
            for value in row:
                out.extend(value if isinstance(value, list) else [value])
    return out


def test_empty_groups_and_empty_trajectories():
    assert _run([]) == ([], dict.fromkeys(("steps", "selected", "tokens", "abs_q", "residual", "finite",
                                           "abs_change"), 0.0))
    advantages, stats = _run([Group({}, [])])
    assert advantages == [[]] and stats["steps"] == 0
    advantages, _ = _run([Group({}, [Trajectory({}, [])])])
    assert advantages == [[[]]]


def test_singleton_and_all_equal_groups_give_zero():
    for returns in ([1.0], [0.0, 0.0, 0.0], [1.0, 1.0]):
        advantages, stats = _run([_group(returns, residual=(5.0, -3.0))], penalty=0.0)
        values = _flat(advantages)
        assert all(math.isfinite(v) and v == 0.0 for v in values), values  # A = 0 → Â = 0
        assert stats["selected"] == len(returns)


def test_all_invalid_steps_keep_the_sign_of_the_penalty():
    # every step rejected, equal returns: A = 0 − λ = −0.1 on every step; selected steps: −0.1·(1 − 0.5·q)
    advantages, _ = _run([_group([0.0, 0.0], residual=(2.0, -1.0), valid=False)], penalty=0.1)
    first = advantages[0][0][0]
    assert first == pytest.approx([-0.1 * (1 - 0.5 * 0.761594), -0.1 * (1 + 0.5 * 0.462117)], abs=1e-6)
    assert all(v < 0 and math.isfinite(v) for v in _flat(advantages))


def test_non_finite_residuals_keep_the_advantage():
    residual = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30)
    advantages, stats = _run([_group([1.0, 0.0], residual=residual)], penalty=0.0)
    values = _flat(advantages)
    assert all(math.isfinite(v) for v in values)
    a = advantages[0][0][1]  # the unselected step: the plain GRPO advantage
    # q = [0, 0, 0, 1, −1]: non-finite residuals keep A; huge finite ones saturate at A·(1 ± β)
    assert advantages[0][0][0] == pytest.approx([a, a, a, 1.5 * a, 0.5 * a], rel=1e-6)
    assert stats["finite"] == 4 and stats["tokens"] == 10  # two episodes, 2 finite of 5 tokens each


def test_the_sign_never_flips():
    rng = random.Random(0)
    for _ in range(200):
        a = rng.choice([-1, 1]) * rng.uniform(1e-6, 10)
        beta = rng.choice([0.0, 0.5, 0.99, 0.999999])
        e = torch.tensor([rng.uniform(-50, 50) for _ in range(5)])
        modulated = modulate_advantage(a, residual_gate(e), beta)
        assert torch.all(torch.sign(modulated) == math.copysign(1, a))
        assert torch.all(modulated.abs() <= (1 + beta) * abs(a) + 1e-6)
        assert torch.all(modulated.abs() >= (1 - beta) * abs(a) - 1e-6)


def test_residual_length_must_match_the_action():
    group = _group([1.0, 0.0], residual=(1.0, 2.0))
    group.trajectories[0].steps[0].signals[SIGNAL_NAME] = [1.0]
    with pytest.raises(ValueError, match="1 values for 2 action tokens"):
        _run([group])


def test_uncertainty_guards():
    assert step_uncertainty([-1.0, float("nan"), -3.0]) == 2.0
    assert step_uncertainty([float("-inf")]) is None and step_uncertainty([]) is None
    assert select_steps([float("nan"), float("inf"), 0.5], 0.2) == [2]  # non-finite u is not eligible


def test_validation_messages_are_one_line():
    for beta in (1.0, -0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"ocsd_beta must be in \[0, 1\)"):
            check_beta(beta)
    for fraction in (0.0, -0.2, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"ocsd_select_fraction must be in \(0, 1\]"):
            num_selected(3, fraction)
    for scaffold in ("no slot", "{obs}", "{observation} {observation}", "{observation} {", "{observation} {x}"):
        with pytest.raises(ValueError, match="ocsd_scaffold must"):
            check_scaffold(scaffold)
    check_scaffold("Literal {{braces}} and {observation}")
