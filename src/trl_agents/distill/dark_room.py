"""The Dark Room study: next-observation prediction in the reward channel vs. as an auxiliary loss.

"The Dark Room in the Reward Channel" (Yu Wang 2026, arXiv 2607.21273; docs/methods/dark_room.md) is an analysis:
an agent that predicts its next observation, rewarded for accurate predictions, learns to stay where the next
observation is trivially predictable (a "dark room": bumping into a wall repeats the observation) — success → 0,
episodes pinned at the horizon. This module holds the math of its arms:

(a) Reward channel. acc_t = sim(pred_t, o_{t+1}) ∈ [0, 1]; potential-based shaping on Φ = prediction accuracy:

        Φ_0 = 0,  Φ_{t+1} = mean(acc_0 … acc_t)     (potential="mean_accuracy", our choice)
                  Φ_{t+1} = acc_t                   (potential="last_accuracy")
        F_t  = γ·Φ_{t+1} − Φ_t                      (γ = 1: Σ_t F_t = Φ_T − Φ_0 = the episode's mean accuracy)
        R'_i = R_i + c·Σ_t F_t                      (c = the shaping coefficient; F_t is added to step t's reward)

(b) The normalisation switch: GRPO's z-score (`scale_rewards="group"`) or mean-only (`"none"`). The Proposition: in
    an all-fail group (R_i ≡ 0), z-scored advantages (cP_i − c·P̄)/(c·σ_P) = (P_i − P̄)/σ_P do not depend on c, so
    annealing c cannot help; mean-only advantages scale with c.
(c) Auxiliary channel: the same signal as EnvRL's SP loss (CE on the gold o_{t+1}; `trl_agents.distill.envrl`).
(d) Placebo: the SP targets permuted across steps (`trl_agents.distill.envrl.shuffle_targets`).

Diagnostics (the variance-profile criterion): per group, the within-group variances of the dense term c·Σ_t F_t and
of the outcome R; the dense share Var(dense)/(Var(dense) + Var(outcome)) of the advantage (1 in an all-fail group
whose dense term varies: the z-score then turns it into the whole advantage); the fraction of all-fail groups.

Numerical guards: a missing prediction scores 0; similarity is clamped to [0, 1]; empty, singleton and all-equal
groups have zero variances and share 0 (0/0 := 0); non-finite rewards are rejected by the estimators downstream.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..envs.prediction import PREDICTION_TAG, extract_prediction, strip_prediction
from ..trajectory import Group, Trajectory

SIMILARITIES = ("ratio", "token_f1", "exact")
POTENTIALS = ("mean_accuracy", "last_accuracy")
ACCURACY_SIGNAL = "prediction_accuracy"  # step.signals key: acc_t (None when the step made no prediction)
SHAPING_SIGNAL = "prediction_shaping"  # step.signals key: c·F_t, the dense term added to the step's reward

__all__ = [
    "ACCURACY_SIGNAL", "POTENTIALS", "SHAPING_SIGNAL", "SIMILARITIES", "collapse_diagnostics", "dense_share",
    "extract_prediction", "potentials", "prediction_similarity", "shaped_group", "shaping_terms", "strip_prediction",
    "within_variance",
]


def _normalise(text: str) -> str:
    return " ".join(str(text).lower().split())


def prediction_similarity(prediction: str | None, observation: str, kind: str = "ratio") -> float:
    """sim(pred, o) ∈ [0, 1] on lower-cased, whitespace-collapsed text (our choice of similarities):

    * `"ratio"`: difflib's `SequenceMatcher.ratio()` over characters, 2·matches/(|pred| + |o|);
    * `"token_f1"`: F1 of the whitespace tokens (multiset overlap);
    * `"exact"`: 1 when equal, else 0.

    A missing prediction (None) scores 0; two empty texts score 1.

    >>> prediction_similarity("P F\\nF G", "p f  f g"), prediction_similarity(None, "P F")
    (1.0, 0.0)
    >>> prediction_similarity("P F F G", "F P F G", "token_f1")  # same multiset of tokens
    1.0
    >>> round(prediction_similarity("abcd", "abce"), 4)  # 2·3/(4 + 4)
    0.75
    """
    if kind not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {', '.join(map(repr, SIMILARITIES))}, got {kind!r}")
    if prediction is None:
        return 0.0
    a, b = _normalise(prediction), _normalise(observation)
    if kind == "exact":
        return float(a == b)
    if kind == "ratio":
        if not a and not b:
            return 1.0
        return min(max(difflib.SequenceMatcher(None, a, b, autojunk=False).ratio(), 0.0), 1.0)
    ta, tb = a.split(), b.split()
    if not ta and not tb:
        return 1.0
    remaining: dict[str, int] = {}
    for token in tb:
        remaining[token] = remaining.get(token, 0) + 1
    common = 0
    for token in ta:
        if remaining.get(token, 0) > 0:
            remaining[token] -= 1
            common += 1
    if common == 0:
        return 0.0
    precision, recall = common / len(ta), common / len(tb)
    return 2 * precision * recall / (precision + recall)


def potentials(accuracies: Sequence[float], kind: str = "mean_accuracy") -> list[float]:
    """Φ_0 … Φ_T of an episode of T steps: Φ_0 = 0 (nothing predicted yet), then Φ_{t+1} from acc_0 … acc_t.

    >>> potentials([0.2, 0.4, 0.9])            # running means
    [0.0, 0.2, 0.30000000000000004, 0.5]
    >>> potentials([0.2, 0.4, 0.9], "last_accuracy")
    [0.0, 0.2, 0.4, 0.9]
    >>> potentials([])
    [0.0]
    """
    if kind not in POTENTIALS:
        raise ValueError(f"potential must be one of {', '.join(map(repr, POTENTIALS))}, got {kind!r}")
    values, total = [0.0], 0.0
    for t, acc in enumerate(accuracies):
        if kind == "last_accuracy":
            values.append(float(acc))
        else:
            total += float(acc)
            values.append(total / (t + 1))
    return values


def shaping_terms(accuracies: Sequence[float], gamma: float = 1.0, kind: str = "mean_accuracy") -> list[float]:
    """F_t = γ·Φ_{t+1} − Φ_t for every step (potential-based shaping; with γ = 1 they sum to Φ_T).

    >>> [round(f, 6) for f in shaping_terms([0.2, 0.4, 0.9])]   # Φ = [0, .2, .3, .5]: sum 0.5 = mean accuracy
    [0.2, 0.1, 0.2]
    >>> [round(f, 6) for f in shaping_terms([1.0, 1.0], gamma=0.5, kind="last_accuracy")]  # 0.5·1 − 0, 0.5·1 − 1
    [0.5, -0.5]
    """
    if not (math.isfinite(gamma) and 0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    phi = potentials(accuracies, kind)
    return [gamma * phi[t + 1] - phi[t] for t in range(len(accuracies))]


def shaped_group(group: Group, terms: Sequence[Sequence[float]], coef: float) -> Group:
    """A copy of `group` whose step rewards carry c·F_t: r'_t = r_t + c·F_t, so R'_i = R_i + c·Σ_t F_t. The steps
    are copies (the recorded episodes keep the environment's rewards)."""
    if not math.isfinite(coef):
        raise ValueError(f"the shaping coefficient must be finite, got {coef}")
    trajectories = []
    for trajectory, row in zip(group.trajectories, terms, strict=True):
        if len(row) != len(trajectory.steps):
            raise ValueError(f"{len(row)} shaping terms for a trajectory of {len(trajectory.steps)} steps")
        steps = [replace(step, reward=step.reward + coef * f) for step, f in zip(trajectory.steps, row, strict=True)]
        trajectories.append(replace(trajectory, steps=steps))
    return replace(group, trajectories=trajectories)


def within_variance(values: Sequence[float]) -> float:
    """Population variance of a group's values (0 for fewer than two values).

    >>> round(within_variance([0.2, 0.4, 0.6]), 6), within_variance([1.0]), within_variance([])  # (.04+0+.04)/3
    (0.026667, 0.0, 0.0)
    """
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return sum((v - mean) ** 2 for v in values) / n


def dense_share(outcomes: Sequence[float], dense: Sequence[float]) -> dict[str, float | None]:
    """How much of a group's (z-scored) advantage comes from the dense term.

    Returns `dense_variance` Var(dense), `outcome_variance` Var(R), `share` = Var(dense)/(Var(dense) + Var(R)) ∈
    [0, 1] (0 when both are 0), and `ratio` = Var(dense)/Var(R) (None when Var(R) = 0: an all-fail or all-success
    group, where the share says it instead).

    >>> dense_share([0, 0, 0], [0.2, 0.4, 0.6])["share"]      # all-fail: the dense term is the whole advantage
    1.0
    >>> d = dense_share([0, 1, 0, 1], [0.1, 0.1, 0.1, 0.3]); round(d["share"], 4), round(d["ratio"], 4)  # .0075/.25
    (0.0291, 0.03)
    """
    var_d, var_o = within_variance(dense), within_variance(outcomes)
    total = var_d + var_o
    return {
        "dense_variance": var_d,
        "outcome_variance": var_o,
        "share": var_d / total if total > 0 else 0.0,
        "ratio": var_d / var_o if var_o > 0 else None,
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def trajectory_dense(trajectory: Trajectory) -> float:
    """The dense term of an episode: Σ_t step.signals["prediction_shaping"] (c·F_t), 0 where none was recorded."""
    return float(sum(step.signals.get(SHAPING_SIGNAL) or 0.0 for step in trajectory.steps))


def collapse_diagnostics(
    groups: Sequence[Group],
    *,
    horizon: int | None = None,
    dense: Callable[[Trajectory], float] = trajectory_dense,
    accuracy_key: str = ACCURACY_SIGNAL,
) -> dict[str, Any]:
    """Rollout-level diagnostics of the dark-room collapse (None where there is nothing to average).

    * `success_rate`, `episode_length` (mean steps), `length_ratio` (episode length / `horizon`);
    * `prediction_accuracy`: mean acc_t over the steps that recorded one (`step.signals[accuracy_key]`);
    * `all_fail_fraction`: groups (of at least two episodes) where no episode succeeded and every return is ≤ 0;
    * `dense_share`: mean over groups of Var(dense)/(Var(dense) + Var(outcome)); `dense_share_all_fail`: the same
      over all-fail groups; `dense_to_outcome_variance`: mean Var(dense)/Var(outcome) over groups with Var(R) > 0.

    >>> from trl_agents.trajectory import Step
    >>> def episode(r, acc, shaping):
    ...     return Trajectory(task={}, steps=[Step("o", "a", reward=r, signals={"prediction_accuracy": acc,
    ...                                                                          "prediction_shaping": shaping})],
    ...                       success=r > 0)
    >>> fail = Group(task={}, trajectories=[episode(0, 0.2, 0.2), episode(0, 0.4, 0.4), episode(0, 0.6, 0.6)])
    >>> d = collapse_diagnostics([fail], horizon=1)
    >>> d["all_fail_fraction"], d["dense_share"], round(d["prediction_accuracy"], 6), d["length_ratio"]
    (1.0, 1.0, 0.4, 1.0)
    """
    return diagnostics_from_totals(
        collapse_totals(groups, dense=dense, accuracy_key=accuracy_key), horizon=horizon
    )


def collapse_totals(
    groups: Sequence[Group],
    *,
    dense: Callable[[Trajectory], float] = trajectory_dense,
    accuracy_key: str = ACCURACY_SIGNAL,
) -> dict[str, tuple[float, float]]:
    """The (total, count) pairs behind `collapse_diagnostics` (all but `length_ratio`), so that the diagnostics of a
    batch split over processes are the sums of each process's pairs divided (`diagnostics_from_totals`)."""
    episodes = [t for g in groups for t in g.trajectories]
    accuracies = [float(s.signals[accuracy_key]) for t in episodes for s in t.steps
                  if s.signals.get(accuracy_key) is not None]
    shares, shares_fail, ratios, all_fail, counted = [], [], [], 0, 0
    for group in groups:
        if len(group.trajectories) < 2:
            continue
        counted += 1
        outcomes = [t.episode_return for t in group.trajectories]
        stats = dense_share(outcomes, [dense(t) for t in group.trajectories])
        failed = not any(t.success for t in group.trajectories) and all(r <= 0 for r in outcomes)
        all_fail += failed
        shares.append(stats["share"])
        if failed:
            shares_fail.append(stats["share"])
        if stats["ratio"] is not None:
            ratios.append(stats["ratio"])
    return {
        "success_rate": (float(sum(t.success for t in episodes)), float(len(episodes))),
        "episode_length": (float(sum(t.num_steps for t in episodes)), float(len(episodes))),
        "prediction_accuracy": (float(sum(accuracies)), float(len(accuracies))),
        "all_fail_fraction": (float(all_fail), float(counted)),
        "dense_share": (float(sum(shares)), float(len(shares))),
        "dense_share_all_fail": (float(sum(shares_fail)), float(len(shares_fail))),
        "dense_to_outcome_variance": (float(sum(ratios)), float(len(ratios))),
    }


def diagnostics_from_totals(totals: dict[str, tuple[float, float]], *, horizon: int | None = None) -> dict[str, Any]:
    """`collapse_diagnostics` from (total, count) pairs: each total over its count (None where the count is 0), and
    `length_ratio` = episode length / `horizon`."""
    stats: dict[str, Any] = {name: (total / count if count else None) for name, (total, count) in totals.items()}
    length = stats.get("episode_length")
    stats["length_ratio"] = length / horizon if (length is not None and horizon) else None
    return stats


def step_accuracies(trajectory: Trajectory, *, similarity: str = "ratio", tag: str = PREDICTION_TAG,
                    next_observation: Callable[[Trajectory, int], str | None]) -> list[float | None]:
    """acc_t of every step: sim(the step's `<tag>` prediction, o_{t+1}); None where the step has no o_{t+1}; 0
    where it made no prediction."""
    values: list[float | None] = []
    for index, step in enumerate(trajectory.steps):
        observation = next_observation(trajectory, index)
        if observation is None:
            values.append(None)
            continue
        values.append(prediction_similarity(extract_prediction(step.action_text, tag), observation, similarity))
    return values
