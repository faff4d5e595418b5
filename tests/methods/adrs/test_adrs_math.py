"""ADRS's advantage (trl_agents/distill/adrs.py): the hand case of docs/methods/adrs.md with every intermediate number,
the schedule, both variants, the rows (step / episode), the adaptive clip, and degenerate / non-finite inputs."""

from __future__ import annotations

import math

import pytest

from trl_agents.distill import adrs_advantages, adrs_eta_schedule
from trl_agents.distill.adrs import (
    ADRSParams,
    adaptive_clip,
    centred_step_scores,
    lower_median,
    population_std,
    sigmoid,
    tva_gate,
    within_group_standardize,
)
from trl_agents.trajectory import Group, Step, Trajectory


def adrs(groups, **params):
    """ADRS on a batch of groups with `ADRSParams(**params)`: (advantages, stats)."""
    return adrs_advantages(groups, ADRSParams(**params))


def step(logps, reward=0.0, valid=True):
    return Step("o", "a", action_ids=list(range(len(logps))), reward=reward, valid=valid,
                signals={"teacher_logprobs": list(logps)})


def group(*episodes):
    """episodes: lists of steps."""
    return Group(task={}, trajectories=[Trajectory(task={}, steps=list(steps)) for steps in episodes])


def hand_group():
    # two one-step episodes: A scores ℓ^T = [−1, −3] and returns 1, B scores [−0.5, −1.5] and returns 0
    return group([step([-1.0, -3.0], reward=1.0)], [step([-0.5, -1.5], reward=0.0)])


def flat(advantages):
    return [[a for s in traj for a in s] for traj in advantages]


def close(actual, expected, abs=1e-6):
    """Nested lists equal within `abs` (pytest.approx compares flat sequences only)."""
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(
            close(a, e, abs) for a, e in zip(actual, expected, strict=True))
    return actual == pytest.approx(expected, abs=abs)


# ---------------------------------------------------------------- the hand case, step by step


def test_hand_case_intermediates():
    # r̂: centred within the step, divided by the row's population std (+1e-8)
    #   A: mean −2, centred [1, −1], std 1 → r̂ = [1, −1];  B: mean −1, centred [0.5, −0.5], std 0.5 → r̂ = [1, −1]
    assert centred_step_scores([-1.0, -3.0]) == [1.0, -1.0] and centred_step_scores([-0.5, -1.5]) == [0.5, -0.5]
    assert population_std([1.0, -1.0]) == 1.0 and population_std([0.5, -0.5]) == 0.5
    # c = [−2, −1], mean_batch c = −1.5; α = σ((c + 1.5)/1) = [σ(−0.5), σ(0.5)] = [0.377541, 0.622459]
    # TVA = (0.377541·1 + 0.622459·0)/1 − (0.622459·1 + 0.377541·0)/1 = −0.244919 (the teacher-aligned row lost)
    # m = σ(2·−0.244919) = σ(−0.489837) = 0.379932
    tva, m, alpha = tva_gate([-2.0, -1.0], [1.0, 0.0], -1.5)
    assert alpha == pytest.approx([0.377541, 0.622459], abs=1e-6)
    assert tva == pytest.approx(-0.244919, abs=1e-6) and m == pytest.approx(0.379932, abs=1e-6)
    # z: scores [1, 0], μ = 0.5, Bessel σ = 0.707107 → z = ±0.5/(0.707107 + 1e-6) = ±0.707106
    # q = η·m·r̂ = 0.02·0.379932·[1, −1, 1, −1] = ±0.00759864
    # ẑ: mean 0, Bessel var = 4·0.00759864²/3 = 7.69858e-5, sqrt(var + 1e-8) = 0.00877466 → ẑ = ±0.865969
    q = [0.02 * m * r for r in (1, -1, 1, -1)]
    assert q[0] == pytest.approx(0.00759864, abs=1e-8)
    assert within_group_standardize(q) == pytest.approx([0.865969, -0.865969] * 2, abs=1e-6)
    # c_g = 0.2·min(1, 0.707107/(0.707107 + 1e-6)) = 0.199999717 (one group: it is its own median)
    assert adaptive_clip(math.sqrt(0.5), math.sqrt(0.5)) == pytest.approx(0.2 * (1 - 1e-6 / (math.sqrt(0.5) + 1e-6)))


def test_hand_case_released_advantage():
    advantages, stats = adrs([hand_group()], adrs_eta=0.02, eta_eff=0.02)
    # A = z + clip(η_eff·ẑ, ±c_g) = ±0.707106 + clip(0.02·±0.865969 = ±0.0173194, ±0.2)
    #   A: [0.707106 + 0.017319, 0.707106 − 0.017319] = [0.724426, 0.689787];  B: [−0.689787, −0.724426]
    assert close(flat(advantages[0]), [[0.724426, 0.689787], [-0.689787, -0.724426]], abs=1e-6)
    assert stats["tva"] == pytest.approx((-0.244919, 1.0), abs=1e-6)
    assert stats["gate"] == pytest.approx((0.379932, 1.0), abs=1e-6)
    assert stats["eta_eff"] == (0.02, 1.0) and stats["teacher_groups"] == (1.0, 1.0)
    assert stats["teacher_term_abs_mean"][0] / stats["teacher_term_abs_mean"][1] == pytest.approx(0.0173194, abs=1e-6)
    assert stats["clip_fraction"] == (0.0, 4.0)


def test_hand_case_clip_binds():
    # η_eff = 1: η_eff·ẑ = ±0.865969 → clipped to ±c_g = ±0.199999717
    advantages, stats = adrs([hand_group()], adrs_eta=0.02, eta_eff=1.0)
    c = 0.2 * (1 - 1e-6 / (math.sqrt(0.5) + 1e-6))
    z = 0.5 / (math.sqrt(0.5) + 1e-6)  # 0.707106
    assert close(flat(advantages[0]), [[z + c, z - c], [-z + c, -z - c]], abs=1e-9)
    assert stats["clip_fraction"] == (4.0, 4.0)
    # without clipping (adrs_clip = 0) the raw term passes
    advantages, _ = adrs([hand_group()], adrs_eta=0.02, eta_eff=1.0, adrs_clip=0.0)
    assert flat(advantages[0])[0] == pytest.approx([z + 0.865969, z - 0.865969], abs=1e-6)


def test_hand_case_paper_variant():
    # A = z + η_eff·m·r̂ = ±0.707106 + 0.02·0.379932·[1, −1] = [0.714705, 0.699508] for A, [−0.699508, −0.714705] for B
    advantages, _ = adrs([hand_group()], adrs_eta=0.02, eta_eff=0.02, adrs_variant="paper")
    assert close(flat(advantages[0]), [[0.714705, 0.699508], [-0.699508, -0.714705]], abs=1e-6)


def test_eta_schedule_window():
    eta = 0.02
    assert [adrs_eta_schedule(s, eta) for s in (20, 21, 70, 71)] == [0.0, eta, eta, 0.0]
    assert adrs_eta_schedule(1000, eta, active_steps=None) == eta and adrs_eta_schedule(1, eta, warmup_steps=0) == eta
    assert adrs_eta_schedule(5, eta, warmup_steps=0, active_steps=0) == 0.0
    # η_eff = 0 (the warm-up): pure GRPO z-scores, whatever the teacher says, in both variants
    for variant in ("released", "paper"):
        advantages, stats = adrs([hand_group()], adrs_eta=eta, eta_eff=0.0, adrs_variant=variant)
        z = 0.5 / (math.sqrt(0.5) + 1e-6)
        assert close(flat(advantages[0]), [[z, z], [-z, -z]])
        assert stats["teacher_term_abs_mean"][0] == 0.0


# ---------------------------------------------------------------- gate, rows, modes


def test_gate_opens_when_the_aligned_rows_win():
    # now the teacher-aligned row (higher mean ℓ^T) returns 1: TVA = +0.244919, m = σ(0.489837) = 0.620068
    g = group([step([-1.0, -3.0], reward=0.0)], [step([-0.5, -1.5], reward=1.0)])
    _, stats = adrs([g])
    assert stats["gate"][0] == pytest.approx(1 - 0.379932, abs=1e-6) and stats["tva"][0] == pytest.approx(0.244919, abs=1e-6)


def test_a_tiny_return_spread_is_inflated_by_the_reference_epsilon():
    # The hazard inherited from verl's z-score: returns 1 and 1 + 1e-5 (two one-step rows, ℓ^T as in the hand case).
    # μ = 1 + 5e-6, Bessel σ = 7.0711e-6: z = ±5e-6/(7.0711e-6 + 1e-6) = ±0.61981, and σ ≥ 1e-6 switches the teacher
    # term on. With TRL's ε = 1e-4 (`adrs_std_eps`): z = ±5e-6/(7.0711e-6 + 1e-4) = ±0.04670 and the term stays off
    # (σ < 1e-4): the advantages are z alone.
    tiny = group([step([-1.0, -3.0], reward=1.0 + 1e-5)], [step([-0.5, -1.5], reward=1.0)])
    advantages, stats = adrs([tiny])
    assert stats["teacher_groups"] == (1.0, 1.0)
    assert all(abs(abs(a) - 0.61981) < 0.02 for a in flat(advantages[0])[0])  # ±0.62 plus the teacher term (≤ 0.02)
    advantages, stats = adrs([tiny], adrs_std_eps=1e-4)
    assert stats["teacher_groups"] == (0.0, 1.0)
    assert close(flat(advantages[0]), [[0.04670, 0.04670], [-0.04670, -0.04670]], abs=1e-5)


def test_the_released_gate_changes_the_advantages_by_less_than_a_millionth():
    # The released variant re-standardises the teacher term inside each group, so the gate m (a positive constant
    # per group) cancels up to the +1e-8 of the standardisation: τ = 2 (gate .379932 on the hand case) and
    # τ = 1e-6 (gate ≈ .5) give the same advantages to 1e-6; the paper variant keeps m (it moves them by ~1e-3).
    def run(tau, variant):
        return [a for traj in flat(adrs([hand_group()], adrs_tva_tau=tau, adrs_variant=variant)[0][0]) for a in traj]

    released = max(abs(a - b) for a, b in zip(run(2.0, "released"), run(1e-6, "released"), strict=True))
    paper = max(abs(a - b) for a, b in zip(run(2.0, "paper"), run(1e-6, "paper"), strict=True))
    assert released < 1e-6 and paper > 1e-4


def test_global_normalize_mode():
    # centred scores of the batch [1, −1, 0.5, −0.5]: Bessel std sqrt(2.5/3) = 0.912871 → r̂_A = ±1.095445, r̂_B = ±0.547723
    advantages, _ = adrs([hand_group()], adrs_eta=0.02, adrs_variant="paper", adrs_normalize_mode="global")
    z, m, s = 0.5 / (math.sqrt(0.5) + 1e-6), 0.3799319, math.sqrt(2.5 / 3) + 1e-8
    assert close(flat(advantages[0]),
        [[z + 0.02 * m / s, z - 0.02 * m / s], [-z + 0.01 * m / s, -z - 0.01 * m / s]], abs=1e-6)


def test_step_rows_use_cross_step_statistics_and_the_invalid_penalty():
    # episode 1: two steps (second invalid), return 1; episode 2: one step, return 0
    # step-row scores: [1, 1 − 0.1, 0] → μ = 0.633333, Bessel σ = 0.550757; z = (s − μ)/(σ + 1e-6)
    g = group([step([-1.0, -2.0], reward=0.0), step([-1.0, -1.0], reward=1.0, valid=False)], [step([-2.0, -2.0])])
    advantages, _ = adrs([g], eta_eff=0.0)
    scores = [1.0, 0.9, 0.0]
    mu = sum(scores) / 3
    sigma = math.sqrt(sum((x - mu) ** 2 for x in scores) / 2)
    z = [(x - mu) / (sigma + 1e-6) for x in scores]
    assert close(advantages[0][0], [[z[0]] * 2, [z[1]] * 2]) and close(advantages[0][1], [[z[2]] * 2])


def test_episode_rows():
    # conversation rows: one row per episode. z over the episode returns [1, 0] (±0.707106), the penalty after it;
    # r̂ centred per step, scaled by the row's std; c_i over the row's tokens
    g = group([step([-1.0, -3.0]), step([-2.0, -2.0], reward=1.0, valid=False)], [step([-0.5, -1.5])])
    advantages, stats = adrs([g], eta_eff=0.0, adrs_unit="episode")
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert close(advantages[0][0], [[z, z], [z - 0.1, z - 0.1]]) and close(advantages[0][1], [[-z, -z]])
    # alignment: row 1 c = mean(−1, −3, −2, −2) = −2, row 2 c = −1 → TVA as the hand case (R = [1, 0])
    assert stats["tva"][0] == pytest.approx(-0.244919, abs=1e-6)
    # paper variant: row 1 centred tokens [1, −1, 0, 0], population std sqrt(0.5) → r̂ = [1.414214, −1.414214, 0, 0]
    advantages, _ = adrs([g], adrs_eta=0.02, adrs_variant="paper", adrs_unit="episode")
    m = stats["gate"][0]
    r = 1 / (math.sqrt(0.5) + 1e-8)
    assert close(advantages[0][0], [[z + 0.02 * m * r, z - 0.02 * m * r], [z - 0.1, z - 0.1]], abs=1e-9)


def test_adaptive_clip_uses_the_lower_median_of_the_batch():
    assert lower_median([0.5, 0.70710678, 0.4]) == 0.5 and lower_median([0.4, 0.7]) == 0.4
    assert adaptive_clip(0.4, 0.5) == pytest.approx(0.2 * 0.4 / (0.5 + 1e-6)) and adaptive_clip(0.9, 0.5) == 0.2
    # two groups: σ = 0.707107 (returns [1, 0]) and 1.414214 (returns [2, 0]); lower median 0.707107 →
    # the first group's bound is 0.2·(1 − tiny), the second's min(1, 2)·0.2 = 0.2
    g2 = group([step([-1.0, -3.0], reward=2.0)], [step([-0.5, -1.5], reward=0.0)])
    advantages, _ = adrs([hand_group(), g2], eta_eff=1.0)
    z1, z2 = 0.5 / (math.sqrt(0.5) + 1e-6), 1.0 / (math.sqrt(2.0) + 1e-6)
    c1 = 0.2 * math.sqrt(0.5) / (math.sqrt(0.5) + 1e-6)
    assert flat(advantages[0])[0] == pytest.approx([z1 + c1, z1 - c1])
    assert flat(advantages[1])[0] == pytest.approx([z2 + 0.2, z2 - 0.2])
    # adaptive off: c = 0.2 for both
    advantages, _ = adrs([hand_group(), g2], eta_eff=1.0, adrs_adaptive_clip=False)
    assert flat(advantages[0])[0] == pytest.approx([z1 + 0.2, z1 - 0.2])


# ---------------------------------------------------------------- degenerate and non-finite inputs


def all_finite(advantages):
    return all(math.isfinite(a) for g in advantages for traj in g for s in traj for a in s)


@pytest.mark.parametrize("variant", ["released", "paper"])
def test_empty_singleton_all_equal_and_all_invalid_groups(variant):
    kw = {"eta_eff": 1.0, "adrs_variant": variant}
    assert adrs([], **kw)[0] == []
    assert adrs([Group(task={})], **kw)[0] == [[]]
    assert adrs([group([])], **kw)[0] == [[[]]]
    # singleton: verl's one-row group statistics μ = 0, σ = 1 → z = R/(1 + 1e-6); TVA = 0, gate 0.5
    advantages, stats = adrs([group([step([-1.0, -3.0], reward=1.0)])], **kw)
    teacher = 0.0 if variant == "released" else 1.0 * 0.5  # paper: η_eff·m·r̂ with r̂ = ±1
    assert close(flat(advantages[0]), [[1 / (1 + 1e-6) + teacher, 1 / (1 + 1e-6) - teacher]])
    assert stats["tva"] == (0.0, 1.0) and stats["gate"] == (0.5, 1.0)
    # all returns equal: z = 0; the released variant adds no teacher term (σ_g < 1e-6), the paper's does
    equal = group([step([-1.0, -3.0], reward=1.0)], [step([-0.5, -1.5], reward=1.0)])
    advantages, stats = adrs([equal], **kw)
    if variant == "released":
        assert flat(advantages[0]) == [[0.0, 0.0], [0.0, 0.0]] and stats["teacher_groups"] == (0.0, 1.0)
    else:
        assert close(flat(advantages[0]), [[0.5, -0.5], [0.5, -0.5]])  # m = σ(0) = 0.5
    # all steps invalid: every score is R − 0.1, finite
    invalid = group([step([-1.0, -2.0], reward=1.0, valid=False)], [step([-1.0, -1.5], valid=False)])
    assert all_finite(adrs([invalid], **kw)[0])
    # one-token steps and equal scores: r̂ = 0 exactly
    flat_scores = group([step([-1.0], reward=1.0)], [step([-2.0, -2.0])])
    advantages, _ = adrs([flat_scores], **kw)
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert close(flat(advantages[0]), [[z], [-z, -z]])


@pytest.mark.parametrize("variant", ["released", "paper"])
def test_non_finite_teacher_log_probs(variant):
    nan, inf = math.nan, math.inf
    g = group([step([-1.0, nan, -3.0], reward=1.0)], [step([-0.5, -inf, -1.5])], [step([nan, inf], reward=1.0)])
    advantages, stats = adrs([g], eta_eff=1.0, adrs_variant=variant)
    assert all_finite(advantages) and all(math.isfinite(v) for v, _ in stats.values())
    # non-finite tokens keep z; the row without a finite score has no alignment but still its z
    z = flat(adrs([g], eta_eff=0.0)[0][0])
    a = flat(advantages[0])
    assert a[0][1] == z[0][1] and a[1][1] == z[1][1] and a[2] == z[2]
    assert a[0][0] != z[0][0]  # the finite tokens do get a teacher term


def test_input_errors():
    with pytest.raises(ValueError, match="teacher_logprobs"):
        adrs([group([Step("o", "a", action_ids=[1])])])
    with pytest.raises(ValueError, match="2 values for an action of 3 tokens"):
        bad = Step("o", "a", action_ids=[1, 2, 3], signals={"teacher_logprobs": [0.0, 0.0]})
        adrs([group([bad])])
    with pytest.raises(ValueError, match="variant must be one of"):
        adrs([], adrs_variant="fix4")
    with pytest.raises(ValueError, match="unit must be one of"):
        adrs([], adrs_unit="token")
    # a step without action tokens needs no signal and gets an empty list
    assert adrs([group([Step("o", "a")], [step([-1.0])])])[0][0][0] == [[]]


def test_sigmoid_is_stable():
    assert sigmoid(1000.0) == 1.0 and sigmoid(-1000.0) == 0.0 and sigmoid(0.0) == 0.5
