"""benchmarks/topology_compare.py's paired t-interval, checked by hand (the benchmark itself is not run here)."""

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "topology_compare.py"
_spec = importlib.util.spec_from_file_location("topology_compare_benchmark", _PATH)
topology_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(topology_compare)


def test_the_t_interval_uses_students_quantile_beyond_ten_degrees_of_freedom():
    # 12 seeds (df = 11): six +1 and six −1, mean 0, std = √(12/11), std/√12 = √(1/11) = 0.301511.
    # t(0.975, 11) = 2.200985 -> half-width 0.663622 (the normal 1.96 gave 0.590962, 11 % too narrow).
    low, high = topology_compare.interval([1.0, -1.0] * 6)
    assert (low, high) == pytest.approx((-2.200985 * math.sqrt(1 / 11), 2.200985 * math.sqrt(1 / 11)), abs=1e-6)
    assert high == pytest.approx(0.663622, abs=1e-6)
    # 3 seeds (df = 2): [1, 2, 3], mean 2, std 1, t(0.975, 2) = 4.302653 -> 2 ± 4.302653/√3 = 2 ± 2.484138
    assert topology_compare.interval([1.0, 2.0, 3.0]) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    # 31 seeds (df = 30): t = 2.042272; values 0..30, std = √(31·32/12) = √82.667, std/√31 = 1.632993
    assert topology_compare.interval([float(i) for i in range(31)]) == pytest.approx(
        (15 - 2.042272 * 1.632993, 15 + 2.042272 * 1.632993), abs=1e-5)


def test_the_t_interval_of_equal_differences_and_of_one_seed():
    assert topology_compare.interval([0.0, 0.0, 0.0]) == (0.0, 0.0)  # no spread: the mean itself, not NaN
    assert topology_compare.interval([2.5]) is None
    assert topology_compare.interval([]) is None
