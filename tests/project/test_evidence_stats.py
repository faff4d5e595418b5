"""benchmarks/evidence.py's statistics and decision rule, checked by hand (the benchmark itself is not run here)."""

import importlib.util
import itertools
import math
import statistics
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "evidence.py"
_spec = importlib.util.spec_from_file_location("evidence_benchmark", _PATH)
evidence = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(evidence)


def test_sign_flip_p_value_by_hand():
    # n = 3, d = [1, 2, 3], observed |mean| = 2. The 8 sign patterns give |sums| 6, 0, 2, 4, 4, 2, 0, 6: only the two
    # with all signs equal reach |sum| 6 (|mean| 2) -> p = 2/8 = 0.25.
    assert evidence.sign_flip_p_value([1.0, 2.0, 3.0]) == 0.25
    # n = 5 all positive: the smallest p possible with 5 seeds, 2/32
    assert evidence.sign_flip_p_value([0.1, 0.2, 0.3, 0.4, 0.5]) == 2 / 32
    # d = [1, -1]: patterns give |sum| 0, 2, 2, 0 and the observed |mean| is 0 -> every pattern is as extreme
    assert evidence.sign_flip_p_value([1.0, -1.0]) == 1.0
    assert evidence.sign_flip_p_value([]) == 1.0
    assert evidence.sign_flip_p_value([0.3]) == 1.0  # one seed: it and its flip are as extreme (scipy needs 2)


def test_scipy_statistics_on_five_paired_seeds_by_hand():
    # d = [.042, .018, .066, -.004, .03] (in thousandths 42, 18, 66, -4, 30; sum 152, mean .0304).
    d = [0.042, 0.018, 0.066, -0.004, 0.03]
    # Sign flips: |signed sum| = 160 - 2·(the flipped |d|) >= 152 only when nothing or only the 4 is flipped, and the
    # mirror images: 4 of the 32 patterns -> p = 4/32 = 0.125 (the old itertools enumeration gave the same).
    assert evidence.sign_flip_p_value(d) == 0.125
    # Bootstrap: the exact distribution of the resampled sum over the 5^5 = 3125 equally likely resamples.
    sums = sorted(sum(pick) for pick in itertools.product([42, 18, 66, -4, 30], repeat=5))
    assert (sum(s < 48 for s in sums), sum(s <= 48 for s in sums)) == (56, 86)  # 1.79 % < 2.5 % <= 2.75 %
    assert (sum(s < 258 for s in sums), sum(s <= 258 for s in sums)) == (3034, 3074)  # 97.09 % < 97.5 % <= 98.37 %
    # so the 2.5 % and 97.5 % quantiles of the mean are 48/5 and 258/5 thousandths: [0.0096, 0.0516] (e.g. the
    # resamples -4,-4,-4,30,30 and 66,66,42,42,42), which the 10 000 seeded resamples (and the old code) give
    assert evidence.bootstrap_interval(d) == pytest.approx((0.0096, 0.0516), abs=1e-12)


def test_sign_flip_beyond_the_exact_range_is_seeded():
    # 17 seeds, 2^17 = 131 072 patterns > the 100 000 resamples: random patterns, the same on every call; exactly
    # it would be 2/2^17
    d = [0.01 * (i + 1) for i in range(17)]
    p = evidence.sign_flip_p_value(d)
    assert p == evidence.sign_flip_p_value(d) and 0 < p < 1e-3
    assert evidence.sign_flip_p_value(d[:16]) == 2 / 2 ** 16  # 16 seeds: still exact


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible():
    values = [0.1, 0.3, 0.2, 0.5, 0.4]
    low, high = evidence.bootstrap_interval(values)
    assert low < statistics.fmean(values) < high
    assert 0.1 <= low and high <= 0.5  # a mean of resampled values never leaves their range
    assert (low, high) == evidence.bootstrap_interval(values)
    assert evidence.bootstrap_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2))
    nan_low, nan_high = evidence.bootstrap_interval([0.3])
    assert math.isnan(nan_low) and math.isnan(nan_high)  # one seed: no interval


@pytest.mark.parametrize(("mean", "low", "high", "kind", "expected"), [
    (0.05, 0.01, 0.09, ">", "held"),
    (-0.05, -0.09, -0.01, ">", "not held"),
    (0.02, -0.01, 0.05, ">", "inconclusive"),
    (-0.05, -0.09, -0.01, "<", "held"),
    (0.05, 0.01, 0.09, "<", "not held"),
    (0.01, -0.02, 0.04, ">=", "held"),          # above the -3-point margin and a mean >= 0
    (-0.01, -0.02, 0.01, ">=", "inconclusive"),  # within the margin but a negative mean
    (0.01, -0.05, 0.06, ">=", "inconclusive"),   # the interval reaches below the margin
    (-0.06, -0.09, -0.04, ">=", "not held"),
    (0.0, float("nan"), float("nan"), ">", "inconclusive"),
])
def test_the_preregistered_decision_rule(mean, low, high, kind, expected):
    assert evidence.verdict(mean, low, high, kind) == expected


def _row(method, seed, after, zero):
    return {"method": method, "seed": seed, "status": "ok", "before": 0.2, "after": after,
            "curve": [{"zero_std_groups": zero}, {"zero_std_groups": None}]}


def test_paired_differences_pair_by_seed_and_skip_unpaired_seeds():
    rows = [_row("grpo", 0, 0.30, 0.5), _row("grpo", 1, 0.40, 0.25), _row("gigpo", 0, 0.35, 0.25),
            _row("gigpo", 1, 0.38, 0.5), _row("gigpo", 2, 0.90, 0.0)]
    assert evidence.paired_differences(rows, "gigpo", "grpo", "success") == pytest.approx([0.05, -0.02])
    assert evidence.paired_differences(rows, "gigpo", "grpo", "zero_std") == pytest.approx([-0.25, 0.25])


def test_every_prediction_names_registered_runs():
    for _, a, b, statistic, kind in evidence.PREDICTIONS:
        assert a in evidence.RUNS and b in evidence.RUNS
        assert statistic in ("success", "zero_std") and kind in (">", "<", ">=")


def test_results_go_under_the_predictions_which_stay_byte_identical(tmp_path):
    predictions = "# Evidence\n\n## Predictions (pre-registered)\n\n| P1 | GiGPO > GRPO |\n"
    path = tmp_path / "evidence.md"
    path.write_text(predictions)
    evidence.append_results(path, "first results")
    assert path.read_text() == predictions + "\n## Results\n\nfirst results\n"
    evidence.append_results(path, "\nsecond results\n")  # a re-run replaces the results, never the predictions
    assert path.read_text() == predictions + "\n## Results\n\nsecond results\n"
    assert path.read_text().startswith(predictions)


def test_rewriting_the_results_page_keeps_the_sections_other_benchmarks_wrote():
    page = "# Results\n\nintro\n\n### Verdicts\n\nnew table\n\n## Curves\n\nimages\n"
    previous = ("# Results\n\nintro\n\n### Verdicts\n\nold table\n\n## One-step-off: learning parity\n\nparity rows\n\n"
                "## Another benchmark\n\nits rows\n\n## Curves\n\nimages\n")
    assert evidence.with_other_sections(page, previous) == (
        "# Results\n\nintro\n\n### Verdicts\n\nnew table\n\n## One-step-off: learning parity\n\nparity rows\n\n"
        "## Another benchmark\n\nits rows\n\n## Curves\n\nimages\n")
    assert evidence.with_other_sections(page, "") == page
    assert evidence.with_other_sections(previous, previous) == previous  # nothing kept twice
