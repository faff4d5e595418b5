"""CANOPY (signal coverage and group sizing; GRPO credit over healthy episodes) against hand-computed numbers.

The expected values are written out with their arithmetic in comments, not recomputed with the code under test.
"""

from __future__ import annotations

import doctest
import math

import pytest
from helpers import assert_close, group_credit, group_credit_and_stats, group_of

from trl_agents.credit import canopy as credit_canopy
from trl_agents.credit import get_estimator
from trl_agents.credit.canopy import canopy_advantages
from trl_agents.rollout.topologies.adaptive import (
    carries_signal,
    coverage_stats,
    first_order_group_size,
    group_size_for_coverage,
    needs_more_episodes,
    signal_probability,
)
from trl_agents.trajectory import Step, Trajectory


def episode(reward: float, *, error: str | None = None, success: bool = False, steps: int = 1) -> Trajectory:
    """An episode whose last of `steps` steps carries `reward`; `error` marks an infrastructure failure."""
    made = [Step(observation=f"s{t}", action_text="act") for t in range(steps)]
    made[-1].reward = float(reward)
    return Trajectory(task={"task_id": "t"}, steps=made, error=error, success=success)


# ---------------------------------------------------------------- P_sig(p, n) = 1 − p^n − (1 − p)^n


def test_signal_probability_spec_numbers():
    # p = 0.05, n = 8:  0.05^8 = 3.90625e-11,  0.95^8 = 0.6634204313  -> 1 − 3.9e-11 − 0.6634204313 = 0.3365795687
    assert signal_probability(0.05, 8) == pytest.approx(0.3365795687, abs=1e-10)
    # p = 0.05, n = 32: 0.05^32 = 2.3e-42,     0.95^32 = 0.1937114845 -> 0.8062885155
    assert signal_probability(0.05, 32) == pytest.approx(0.8062885155, abs=1e-10)
    # p = 0.5, n = 2: 1 − 0.25 − 0.25 = 0.5;  n = 4: 1 − 2 x 0.0625 = 0.875
    assert signal_probability(0.5, 2) == 0.5
    assert signal_probability(0.5, 4) == 0.875


def test_signal_probability_edges():
    # One episode never mixes outcomes; neither does a task that is always or never solved.
    assert signal_probability(0.3, 1) == 0.0
    assert signal_probability(0.0, 32) == 0.0
    assert signal_probability(1.0, 32) == 0.0
    # Symmetric in p <-> 1 − p: 0.95 behaves as 0.05.
    assert signal_probability(0.95, 8) == pytest.approx(0.3365795687, abs=1e-10)
    # Tiny p keeps its digits: 1 − (1 − 1e-12)^10 − 1e-120 = 1e-11 − 45e-24 (binomial), not a cancellation residue.
    assert signal_probability(1e-12, 10) == pytest.approx(1e-11 - 45e-24, rel=1e-9)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="n must be an int >= 1"):
            signal_probability(0.5, bad)
    for bad in (-0.1, 1.1, float("nan")):
        with pytest.raises(ValueError, match=r"p must be a probability in \[0, 1\]"):
            signal_probability(bad, 8)


# ---------------------------------------------------------------- group size for a target coverage τ


def test_group_size_for_coverage_spec_case():
    # p = 0.05, τ = 0.8: P_sig(31) = 1 − 0.95^31 − 0.05^31 = 1 − 0.2039068 = 0.7960932 < 0.8 <= P_sig(32) = 0.8062885
    assert group_size_for_coverage(0.05, 0.8) == 32
    # First-order rule: log(1 − 0.8)/log(0.95) = −1.6094379 / −0.0512933 = 31.377 -> 32 (agrees for a hard task).
    assert first_order_group_size(0.05, 0.8) == 32
    # τ = 0.3365 <= P_sig(8) = 0.3365796 < ... and P_sig(7) = 1 − 0.95^7 = 0.3016627 < 0.3365 -> 8
    assert group_size_for_coverage(0.05, 0.3365) == 8


def test_exact_size_versus_first_order_rule():
    # p = 0.5, τ = 0.8: P_sig(3) = 1 − 2 x 0.125 = 0.75 < 0.8, P_sig(4) = 0.875 -> exact 4;
    # first order: log(0.2)/log(0.5) = 2.32 -> 3 (it forgets the all-success term 0.5^n).
    assert group_size_for_coverage(0.5, 0.8) == 4
    assert first_order_group_size(0.5, 0.8) == 3
    # p = 0.2, τ = 0.9: P_sig(10) = 1 − 0.8^10 − 0.2^10 = 1 − 0.1073742 − 1.0e-7 = 0.8926257 < 0.9,
    #                   P_sig(11) = 1 − 0.0858993 − 2.0e-8 = 0.9141007 -> 11
    # first order: log(0.1)/log(0.8) = 10.32 -> 11
    assert group_size_for_coverage(0.2, 0.9) == 11
    assert first_order_group_size(0.2, 0.9) == 11
    # An easy task, p = 0.95: exact is symmetric (32, as p = 0.05); first order log(0.2)/log(0.05) = 0.54 -> 1.
    assert group_size_for_coverage(0.95, 0.8) == 32
    assert first_order_group_size(0.95, 0.8) == 1


@pytest.mark.parametrize("p", [0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.99])
@pytest.mark.parametrize("target", [0.1, 0.5, 0.8, 0.9, 0.99])
def test_group_size_is_the_smallest_sufficient_n(p, target):
    n = group_size_for_coverage(p, target)
    assert signal_probability(p, n) >= target
    assert n == 2 or signal_probability(p, n - 1) < target
    # The first-order rule never asks for more than the exact size (it drops a term of P_sig's complement).
    assert first_order_group_size(p, target) <= n


def test_group_size_guards():
    for p in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"p must be in \(0, 1\)"):
            group_size_for_coverage(p, 0.8)
        with pytest.raises(ValueError, match=r"p must be in \(0, 1\)"):
            first_order_group_size(p, 0.8)
    for target in (0.0, 1.0, 1.5, -0.2, float("nan")):
        with pytest.raises(ValueError, match=r"target must be in \(0, 1\)"):
            group_size_for_coverage(0.05, target)
        with pytest.raises(ValueError, match=r"target must be in \(0, 1\)"):
            first_order_group_size(0.05, target)


# ---------------------------------------------------------------- carries_signal, the growth rule, coverage stats


def test_carries_signal():
    assert carries_signal(group_of(episode(1), episode(0)))
    assert not carries_signal(group_of(episode(0), episode(0), episode(0)))
    assert not carries_signal(group_of(episode(1)))  # fewer than two episodes
    assert not carries_signal(group_of())
    # Failed episodes do not count: [1, failed 0] is one healthy episode; [0, 0, failed 1] is all 0.
    assert not carries_signal(group_of(episode(1), episode(0, error="env crashed")))
    assert not carries_signal(group_of(episode(0), episode(0), episode(1, error="timeout")))
    # A failed episode with a NaN reward is ignored, not an error.
    assert carries_signal(group_of(episode(1), episode(0), episode(float("nan"), error="env crashed")))
    # Invalid actions change no return: still no signal.
    invalid = episode(0)
    invalid.steps[0].valid = False
    assert not carries_signal(group_of(invalid, episode(0)))


def test_needs_more_episodes():
    no_signal = group_of(*(episode(0) for _ in range(8)))
    assert needs_more_episodes(no_signal, max_group_size=32)
    assert not needs_more_episodes(no_signal, max_group_size=8)  # at the cap
    assert not needs_more_episodes(group_of(episode(1), episode(0)), max_group_size=32)  # signal: stop
    # A failed episode counts toward the cap: 7 healthy + 1 failed = 8 episodes.
    capped = group_of(*(episode(0) for _ in range(7)), episode(0, error="oom"))
    assert not needs_more_episodes(capped, max_group_size=8)
    with pytest.raises(ValueError, match="max_group_size must be an int >= 1"):
        needs_more_episodes(no_signal, max_group_size=0)


def test_coverage_stats_hand_case():
    # A: [1 (success), 0]        2 episodes, signal
    # B: eight 0                 8 episodes, at the cap 8, no signal
    # C: [0, 0, 0, failed]       4 episodes (3 healthy), no signal
    groups = [
        group_of(episode(1, success=True), episode(0)),
        group_of(*(episode(0) for _ in range(8))),
        group_of(episode(0), episode(0), episode(0), episode(0, error="env crashed")),
    ]
    stats = coverage_stats(groups, max_group_size=8, round_size=2)
    assert stats == {
        "num_groups": 3,
        "signal_fraction": pytest.approx(1 / 3),  # A only
        "mean_episodes_per_task": pytest.approx(14 / 3),  # (2 + 8 + 4) / 3 = 4.6667
        "max_episodes_per_task": 8,
        "mean_healthy_episodes_per_task": pytest.approx(13 / 3),  # (2 + 8 + 3) / 3 = 4.3333
        "failed_episode_fraction": pytest.approx(1 / 14),  # 0.0714
        "success_rate": pytest.approx(1 / 13),  # 1 success in 13 healthy episodes = 0.0769
        "capped_fraction": pytest.approx(1 / 3),  # B
        "capped_without_signal_fraction": pytest.approx(1 / 3),  # B
        "mean_rounds": pytest.approx(7 / 3),  # 1 + ceil((size − 2)/2): 1 + 4 + 2 = 7 rounds
    }


def test_coverage_stats_first_round_of_another_size():
    # First round 4 episodes, then rounds of 2: sizes 2 -> 1 round (cut short: fewer episodes than the first round),
    # 8 -> 1 + ceil((8 − 4)/2) = 3, 4 -> 1 + 0 = 1;  mean (1 + 3 + 1)/3 = 1.6667
    groups = [group_of(episode(1), episode(0)), group_of(*(episode(0) for _ in range(8))), group_of(*[episode(0)] * 4)]
    stats = coverage_stats(groups, max_group_size=8, round_size=2, first_round_size=4)
    assert stats["mean_rounds"] == pytest.approx(5 / 3)
    with pytest.raises(ValueError, match="first_round_size must be an int >= 1"):
        coverage_stats([], round_size=2, first_round_size=0)


def test_coverage_stats_without_cap_and_empty():
    stats = coverage_stats([group_of(episode(0), episode(0))])
    assert "mean_rounds" not in stats  # only with a round size
    assert stats["capped_fraction"] == 0.0 and stats["signal_fraction"] == 0.0
    empty = coverage_stats([], max_group_size=32, round_size=4)
    assert all(value == 0 for value in empty.values()) and "mean_rounds" in empty
    with pytest.raises(ValueError, match="round_size must be an int >= 1"):
        coverage_stats([], round_size=0)


# ---------------------------------------------------------------- credit: GRPO over healthy episodes


def test_failed_episode_is_removed_not_scored_zero():
    group = group_of(episode(1), episode(0), episode(0, error="env step timed out"))
    # Ours, removed: z-scores over [1, 0]: mean 0.5, Bessel std sqrt((0.25 + 0.25)/1) = 0.7071068;
    #   ±0.5 / (0.7071068 + 1e-4) = ±0.7070068.  The failed episode gets 0 (not trained).
    assert_close(group_credit("canopy", group), [[0.7070068], [-0.7070068], [0.0]], tol=1e-7)
    # Reference code, a reward-0 placeholder: over [1, 0, 0]: mean 1/3, deviations 2/3, −1/3, −1/3,
    #   std sqrt((4/9 + 1/9 + 1/9)/2) = sqrt(1/3) = 0.5773503;
    #   2/3 / (0.5773503 + 1e-4) = 1.1545006,  −1/3 / 0.5774503 = −0.5772503  (placeholder: no loss tokens -> 0).
    assert_close(group_credit("canopy", group, failed_episodes="zero"), [[1.1545006], [-0.5772503], [0.0]], tol=1e-7)
    # The placeholder pulls the baseline down: the success gets 1.1545 instead of 0.7070, the failure −0.5773
    # instead of −0.7070. "drop" equals GRPO on the healthy episodes exactly.
    assert group_credit("canopy", group)[:2] == group_credit("grpo", group.healthy(), invalid_action_penalty=0.0)


def test_canopy_is_grpo_on_healthy_groups():
    group = group_of(episode(1, steps=2), episode(0, steps=3), episode(0), episode(1))
    # R = [1, 0, 0, 1]: mean 0.5, std sqrt(4 x 0.25 / 3) = 0.5773503 -> ±0.5 / 0.5774503 = ±0.8658754 on every step
    expected = [[0.8658754] * 2, [-0.8658754] * 3, [-0.8658754], [0.8658754]]
    assert_close(group_credit("canopy", group), expected, tol=1e-7)
    assert group_credit("canopy", group) == group_credit("grpo", group, invalid_action_penalty=0.0)
    assert group_credit("canopy", group, failed_episodes="zero") == group_credit("canopy", group)  # nothing failed


def test_failed_rows_keep_their_length_and_stats():
    group = group_of(episode(1), episode(0), episode(float("nan"), error="env crashed", steps=3))
    advantages, stats = group_credit_and_stats("canopy", group)
    assert [len(row) for row in advantages] == [1, 1, 3]
    assert advantages[2] == [0.0, 0.0, 0.0]
    assert stats == {"carries_signal": 1.0, "healthy_episodes": 2, "failed_episodes": 1}
    _, stats = group_credit_and_stats("canopy", group_of(episode(0), episode(0)))
    assert stats["carries_signal"] == 0.0
    assert group_credit("canopy", group_of()) == []
    assert group_credit("canopy", group_of(episode(0, error="reset failed"))) == [[0.0]]


def test_canopy_penalty_and_bad_arguments():
    invalid = episode(0)
    invalid.steps[0].valid = False
    # R = [1, 0] -> ±0.7070068, then −0.1 on the invalid step (after normalisation, as GRPO).
    assert_close(group_credit("canopy", group_of(episode(1), invalid), invalid_action_penalty=0.1), [[0.7070068], [-0.8070068]])
    with pytest.raises(ValueError, match="failed_episodes must be one of 'drop', 'zero'"):
        group_credit("canopy", group_of(episode(1)), failed_episodes="skip")
    with pytest.raises(ValueError, match="eps"):
        group_credit("canopy", group_of(episode(1)), eps=0.0)
    assert math.isfinite(group_credit("canopy", group_of(episode(3)))[0][0])


def test_registered_as_canopy():
    assert get_estimator("canopy").function is canopy_advantages


def test_docstring_examples():
    assert doctest.testmod(credit_canopy).failed == 0
