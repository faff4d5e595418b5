"""Episode metrics: the unbiased pass@k estimator, and `evaluate` modules that ship with the package.

`pass_at_k` and `pass_at_k_values` are what `trl_agents.evaluation.summarize` reports. The same numbers are
available as an `evaluate` metric, `agent_success`, for code that already computes its metrics with `evaluate`
(`evaluate.combine`, evaluation suites). It loads offline from the installed package: `evaluate.load` accepts a
local folder holding the module's script, so nothing is downloaded. `evaluate` comes with the `metrics` extra
(`pip install "trl-agents[metrics]"`); pass@k does not need it.

Example:
    >>> from trl_agents.metrics import load_metric
    >>> metric = load_metric("agent_success")
    >>> scores = metric.compute(successes=[[True, False, False, False], [False, False, False, False]])
    >>> scores["success_rate"], scores["pass_at_2"], scores["pass_at_4"]
    (0.125, 0.25, 0.5)
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

METRICS = ("agent_success",)


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased estimate of pass@k, the probability that at least one of k episodes solves the task, from
    `num_correct` successes among `num_samples` episodes: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1).

    Example:
        >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 1, 4), pass_at_k(4, 0, 4)
        (0.25, 0.5, 1.0, 0.0)
    """
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@k needs 1 <= k <= num_samples, got k={k} with num_samples={num_samples}")
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"num_correct must be between 0 and num_samples={num_samples}, got {num_correct}")
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def pass_at_k_values(num_samples: int) -> list[int]:
    """The k reported for `num_samples` episodes per task (none for a single episode). Our choice: the powers of
    two below n, and n: pass@1 is the expected single-episode success, pass@n "solved at least once", and the
    powers of two trace the curve between them on the log scale papers plot it on.

    Example:
        >>> pass_at_k_values(1), pass_at_k_values(4), pass_at_k_values(10)
        ([], [1, 2, 4], [1, 2, 4, 8, 10])
    """
    if num_samples <= 1:
        return []
    return sorted({2**i for i in range(num_samples.bit_length()) if 2**i <= num_samples} | {num_samples})


def mean_pass_at_k(successes: Sequence[Sequence[bool]], ks: Sequence[int] | None = None) -> dict[str, float]:
    """`{"pass_at_k": mean over tasks}` for every k of `ks` (default: `pass_at_k_values` of the fewest episodes any
    task has); `successes` holds one list of episode outcomes per task.

    Example:
        >>> mean_pass_at_k([[True, False, False, False], [False, False, False, False]])
        {'pass_at_1': 0.125, 'pass_at_2': 0.25, 'pass_at_4': 0.5}
    """
    if not successes:
        return {}
    if ks is None:
        ks = pass_at_k_values(min(len(task) for task in successes))
    return {
        f"pass_at_{k}": sum(pass_at_k(len(task), sum(task), k) for task in successes) / len(successes) for k in ks
    }


def metric_path(name: str) -> str:
    """Folder of a packaged `evaluate` module, for `evaluate.load(metric_path(name))`."""
    if name not in METRICS:
        raise ValueError(f"Unknown trl-agents metric {name!r}; available: {', '.join(METRICS)}")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def load_metric(name: str, **kwargs: Any):
    """`evaluate.load` of a packaged metric (offline: from the installed package). `kwargs` go to `evaluate.load`."""
    path = metric_path(name)
    try:
        import evaluate
    except ImportError:
        raise ImportError(f'The {name!r} metric needs `evaluate`: pip install "trl-agents[metrics]"') from None
    return evaluate.load(path, **kwargs)
