"""IGRPO math: information gain of tree nodes, budgeted selection, suppression, and teacher-weighted leaf advantages.

IGRPO (Zhang, Xu, Ding, ..., Fu, Wang 2026, "information-gain-based adaptive tree rollout", arXiv 2607.06223; only
the abstract was available to us, docs/methods/igrpo.md). The abstract says: a rollout tree per question under a
fixed rollout budget, more informative branches expanded more, unpromising ones progressively suppressed, and a
policy target given by the teacher distribution the allocation induces. The information gain is borrowed from IGPO
(arXiv 2510.14967): the change in the policy's likelihood of the gold answer a* after a tool observation.
Everything below the abstract is our design [D].

A *node* is a state reached right after a tool observation (on Search-QA: after a `search[...]` step). It is
recorded as step j of a trajectory whose step j − 1 was a valid action the episode went on after (`is_node_step`);
the node's history h_j is step j's prompt. The root (step 0's prompt: the question, nothing retrieved) is the
reference state. With a* the gold answer (as the action `answer[a*]`, K tokens):

    p(h)      = exp( 1/K · Σ_k log π_θ(a*_k | h, a*_<k) )                  gold-answer likelihood (IGPO)
    I(n)      = p(h_n) − p(h_parent(n))                                    information gain of node n
                parent(n): the previous node on the path, the root for the first one
    P(pick n) = softmax_n( I(n) / T_I )  over the frontier (T_I = 0.1)     budgeted expansion
    strikes   = consecutive expansion rounds at which n was a candidate with I(n) ≤ 0; 2 strikes: suppressed
    S_ℓ       = Σ_{n ∈ path(ℓ)} I(n)   (= p(last node of ℓ) − p(root): the sum telescopes)
    q(ℓ)      ∝ π_old(ℓ)·exp(S_ℓ / T_I)                                    induced teacher distribution over leaves
    w_ℓ       = (q(ℓ)/π_old(ℓ)) / Σ_ℓ' (q(ℓ')/π_old(ℓ')) = softmax_ℓ(S_ℓ / T_I)   self-normalised, Σ w = 1
    μ_w       = Σ_ℓ w_ℓ R_ℓ,   σ_w² = Σ_ℓ w_ℓ (R_ℓ − μ_w)² / (1 − Σ_ℓ w_ℓ²)    weighted mean and (reliability-
                weights, Bessel-corrected) variance
    A_ℓ       = L·w_ℓ·(R_ℓ − μ_w) / (σ_w + ε)   (scale="group";  L·w_ℓ·(R_ℓ − μ_w) with scale="none")

The spec's target is A_ℓ = w_ℓ·(R_ℓ − Σ w R). We multiply by L (the number of leaves) so that the weights average
1 — uniform weights then give exactly GRPO's advantage on the same leaves, with the same `scale`: "group" is
GRPO's z-score with TRL's Bessel std and ε = 1e-4 (`credit.grpo`, the library's and TRL's default), "none" is the
centred return (Dr. GRPO). Equal gains give w = 1/L and are computed by GRPO's own code path (bit-for-bit). The
invalid-action penalty λ is subtracted after normalisation (GRPO's "trajectories" statistic), charged by the
trajectory that owns the step (t ≥ fork_step), so that a shared invalid step is penalised once.

Tree rows. Every trajectory is one root-to-leaf path and gets A_ℓ on every step of its path; the row builder trains a
shared step once with the SUM over the leaves through it. A step shared by a set D of leaves therefore gets
L/(σ_w + ε) · W_D · (μ_D − μ_w), W_D = Σ_{ℓ∈D} w_ℓ, μ_D the weighted mean return of D: its subtree's weight mass
times how much better the subtree does than the tree. A step shared by every leaf gets exactly 0 (Σ w (R − μ_w) = 0).

Numerical guards: softmaxes subtract the maximum (no overflow for any finite gain or temperature); a single leaf, or
weights concentrated on one leaf (1 − Σ w² ≈ 0), get σ_w = 0 and an advantage of 0 for the dominant leaf; equal
returns give exactly 0 deviations; empty groups give []; non-finite likelihoods or rewards raise a ValueError.

Example (the acceptance case: a frontier with gains [0.3, 0.0, −0.1] at T_I = 0.1):
    >>> [round(p, 4) for p in selection_probabilities([0.3, 0.0, -0.1], temperature=0.1)]
    [0.9362, 0.0466, 0.0171]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise

from ..trajectory import Group, Step, Trajectory
from .base import StepAdvantages, check_choice, check_group, mean_std, normalize, register_estimator

GOLD_LIKELIHOOD = "gold_likelihood"
"""The model signal holding p(a* | step prompt) on the node steps (`trainers/igrpo.py` registers it)."""

SCALES = ("group", "none")
STAT_NAMES = ("num_leaves", "num_nodes", "mean_info_gain", "positive_gain_fraction", "mean_path_gain",
              "max_weight", "effective_leaf_fraction", "zero_advantage_group")


# ---- nodes and their information gain ----------------------------------------------------------------------------


def gold_likelihood(logps: Sequence[float]) -> float:
    """p = exp(mean_k log π(a*_k | h, a*_<k)), the geometric-mean token probability of the gold answer (IGPO).
    0.0 for no tokens (no evidence for the answer).

    >>> round(gold_likelihood([math.log(0.5), math.log(0.125)]), 4)  # exp((ln 0.5 + ln 0.125)/2) = sqrt(1/16)
    0.25
    """
    if not len(logps):
        return 0.0
    return math.exp(sum(float(v) for v in logps) / len(logps))


def is_node_step(step: Step) -> bool:
    """Whether the state after `step` is a node: the action was valid and the episode went on (a tool call whose
    observation follows; on Search-QA every such step is a `search[...]`; `answer[...]` ends the episode)."""
    return bool(step.valid) and not step.done


def node_indices(trajectory: Trajectory, is_node: Callable[[Step], bool] = is_node_step) -> list[int]:
    """The steps j of `trajectory` whose prompt is a node's history: 0 (the root) and every j ≥ 1 whose step j − 1
    is a node step. The state after the last step has no recorded prompt, so it is not a node.

    >>> steps = [Step("o0", "search[a]"), Step("o1", "jump", valid=False), Step("o2", "search[b]"),
    ...          Step("o3", "answer[x]", done=True)]
    >>> node_indices(Trajectory(task={}, steps=steps))  # after the two searches: steps 1 and 3
    [0, 1, 3]
    """
    if not trajectory.steps:
        return []
    return [0] + [j for j in range(1, len(trajectory.steps)) if is_node(trajectory.steps[j - 1])]


def node_likelihood(step: Step, signal: str = GOLD_LIKELIHOOD) -> float:
    """The gold-answer likelihood recorded on a node step (`step.signals[signal]`), checked finite."""
    if signal not in step.signals:
        raise ValueError(
            f"IGRPO needs step.signals[{signal!r}] on every node step (the gold-answer likelihood after a tool "
            "observation): run the 'info_gain' topology, which computes it mid-rollout."
        )
    value = float(step.signals[signal])
    if not math.isfinite(value):
        raise ValueError(f"step.signals[{signal!r}] must be a finite likelihood, got {value}")
    return value


def path_information(
    trajectory: Trajectory, signal: str = GOLD_LIKELIHOOD, is_node: Callable[[Step], bool] = is_node_step
) -> list[tuple[int, float]]:
    """(j, I) for every non-root node of the path: I = p(h_j) − p(previous node on the path, or the root).

    >>> steps = [Step("o0", "search[a]", signals={"gold_likelihood": 0.1}),
    ...          Step("o1", "search[b]", signals={"gold_likelihood": 0.4}),
    ...          Step("o2", "answer[x]", done=True, signals={"gold_likelihood": 0.3})]
    >>> [(j, round(i, 4)) for j, i in path_information(Trajectory(task={}, steps=steps))]  # 0.4 − 0.1, 0.3 − 0.4
    [(1, 0.3), (2, -0.1)]
    """
    nodes = node_indices(trajectory, is_node)
    steps = trajectory.steps
    return [(j, node_likelihood(steps[j], signal) - node_likelihood(steps[previous], signal))
            for previous, j in pairwise(nodes)]


# ---- budgeted expansion ------------------------------------------------------------------------------------------


def softmax(values: Sequence[float], temperature: float) -> list[float]:
    """softmax(v / T) with the maximum subtracted (no overflow); [] for no values.

    >>> softmax([1000.0, 1000.0], temperature=0.1)
    [0.5, 0.5]
    """
    check_temperature(temperature)
    if not len(values):
        return []
    scaled = [float(v) / temperature for v in values]
    if not all(math.isfinite(v) for v in scaled):
        raise ValueError(f"softmax needs finite values, got {list(values)} at temperature {temperature}")
    top = max(scaled)
    exps = [math.exp(v - top) for v in scaled]  # the largest term is exp(0) = 1: the sum is in [1, n]
    total = sum(exps)
    return [e / total for e in exps]


def selection_probabilities(gains: Sequence[float], temperature: float = 0.1) -> list[float]:
    """P(pick n) = softmax(I(n)/T_I) over the frontier's gains.

    >>> [round(p, 4) for p in selection_probabilities([0.3, 0.0, -0.1])]  # e^3, e^0, e^-1 over 21.4534
    [0.9362, 0.0466, 0.0171]
    """
    return softmax(gains, temperature)


def sample_index(probabilities: Sequence[float], u: float) -> int:
    """The index whose cumulative-probability interval holds u ∈ [0, 1) (inverse CDF; the last index absorbs
    rounding).

    >>> sample_index([0.9362, 0.0466, 0.0171], 0.95), sample_index([0.9362, 0.0466, 0.0171], 0.1)
    (1, 0)
    """
    if not len(probabilities):
        raise ValueError("sample_index needs at least one probability")
    running = 0.0
    for index, p in enumerate(probabilities):
        running += p
        if u < running:
            return index
    return len(probabilities) - 1


def update_strikes(strikes: int, gain: float, suppress_after: int = 2) -> tuple[int, bool]:
    """One expansion round for a frontier candidate: (new strike count, suppressed). A round with I ≤ 0 adds a
    strike, a round with I > 0 clears them; `suppress_after` consecutive strikes suppress the node for good.

    >>> update_strikes(0, 0.0), update_strikes(1, -0.2), update_strikes(1, 0.05)
    ((1, False), (2, True), (0, False))
    """
    if suppress_after < 1:
        raise ValueError(f"suppress_after must be >= 1, got {suppress_after}")
    strikes = strikes + 1 if gain <= 0.0 else 0
    return strikes, strikes >= suppress_after


# ---- leaf weights and the weighted advantage ---------------------------------------------------------------------


def leaf_weights(path_gains: Sequence[float], temperature: float = 0.1) -> list[float]:
    """w_ℓ = q(ℓ)/π_old(ℓ) self-normalised = softmax(S_ℓ / T_I): they sum to 1; equal gains give 1/L.

    >>> [round(w, 4) for w in leaf_weights([0.2, 0.1, 0.1, 0.0])]  # e^2, e^1, e^1, e^0 over 13.8256
    [0.5344, 0.1966, 0.1966, 0.0723]
    """
    if len(path_gains) and all(g == path_gains[0] for g in path_gains):
        return [1.0 / len(path_gains)] * len(path_gains)
    return softmax(path_gains, temperature)


def weighted_mean_std(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float]:
    """μ_w = Σ w v and σ_w = sqrt(Σ w (v − μ_w)² / (1 − Σ w²)) for weights summing to 1 (reliability weights: with
    w = 1/n this is the Bessel std). σ_w = 0 when 1 − Σ w² ≤ 1e-12 (a single leaf, or all weight on one leaf).

    >>> weighted_mean_std([1.0, 0.0, 0.0, 1.0], [0.25] * 4)  # = mean_std: (0.5, 0.5774)
    (0.5, 0.5773502691896257)
    """
    if not len(values):
        return 0.0, 0.0
    shift = values[0]  # deviations from the first value: equal values give exactly 0
    mean = shift + sum(w * (v - shift) for v, w in zip(values, weights, strict=True))
    spread = 1.0 - sum(w * w for w in weights)
    if spread <= 1e-12:
        return mean, 0.0
    variance = sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True)) / spread
    return mean, math.sqrt(max(variance, 0.0))


def weighted_advantages(
    returns: Sequence[float], weights: Sequence[float], scale: str = "group", eps: float = 1e-4
) -> list[float]:
    """A_ℓ = L·w_ℓ·(R_ℓ − μ_w)/(σ_w + ε) ("group") or L·w_ℓ·(R_ℓ − μ_w) ("none").

    >>> [round(a, 4) for a in weighted_advantages([1.0, 0.0], [0.75, 0.25], scale="none")]  # μ_w = 0.75
    [0.375, -0.375]
    """
    check_choice("scale", scale, SCALES)
    if len(returns) != len(weights):
        raise ValueError(f"{len(returns)} returns but {len(weights)} weights")
    n = len(returns)
    mean, std = weighted_mean_std(returns, weights)
    shift = returns[0] if n else 0.0
    centred = [(r - shift) - (mean - shift) for r in returns]  # equal returns: exactly 0
    values = [n * w * c for w, c in zip(weights, centred, strict=True)]
    if scale == "group":
        values = [v / (std + eps) for v in values]
    return values


@register_estimator("igrpo")
def igrpo_advantages(
    group: Group,
    *,
    temperature: float = 0.1,
    scale: str = "group",
    invalid_penalty: float = 0.1,
    eps: float = 1e-4,
    signal: str = GOLD_LIKELIHOOD,
) -> StepAdvantages:
    """IGRPO advantages for every step of every path of `group`; see `igrpo_advantages_with_stats`."""
    advantages, _ = igrpo_advantages_with_stats(group, temperature=temperature, scale=scale,
                                                invalid_penalty=invalid_penalty, eps=eps, signal=signal)
    return advantages


def igrpo_advantages_with_stats(
    group: Group,
    *,
    temperature: float = 0.1,
    scale: str = "group",
    invalid_penalty: float = 0.1,
    eps: float = 1e-4,
    signal: str = GOLD_LIKELIHOOD,
    is_node: Callable[[Step], bool] = is_node_step,
) -> tuple[StepAdvantages, dict[str, float]]:
    """Teacher-weighted leaf advantages plus diagnostics.

    Args:
        group: The healthy trajectories of one task (a tree from the `info_gain` topology, or independent episodes),
            with the gold-answer likelihood on every node step (`step.signals[signal]`).
        temperature: T_I of the weights (0.1).
        scale: "group" (z-score with the weighted std, GRPO's default) or "none" (centred only, Dr. GRPO).
        invalid_penalty: λ, subtracted on invalid steps by the trajectory that owns them (t ≥ fork_step).
        eps: ε added to σ_w (TRL: 1e-4).
        signal: Name of the likelihood signal.
        is_node: Which steps lead to a node (`is_node_step`).

    Returns:
        (advantages, stats): one value per step of each trajectory's full path; stats {"num_leaves", "num_nodes"
        (non-root nodes, each once), "mean_info_gain" (mean I over those nodes), "positive_gain_fraction",
        "mean_path_gain" (mean S_ℓ), "max_weight", "effective_leaf_fraction" ((1/Σw²)/L: 1 for uniform weights),
        "zero_advantage_group" (1 when every leaf returned the same)}; zeros for an empty group.
    """
    check_group(group, invalid_penalty)
    check_choice("scale", scale, SCALES)
    check_temperature(temperature)
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0, got {eps}")
    trajectories = group.trajectories
    if not trajectories:
        return [], dict.fromkeys(STAT_NAMES, 0.0)
    node_gains: dict[int, float] = {}  # id(step j) of a node's first occurrence -> I; shared nodes counted once
    path_gains = []
    for trajectory in trajectories:
        gains = path_information(trajectory, signal, is_node)
        for j, gain in gains:
            node_gains.setdefault(id(trajectory.steps[j - 1]), gain)  # the node is the state after step j − 1
        path_gains.append(sum(gain for _, gain in gains))  # S_ℓ = Σ_{n ∈ path} I(n)
    returns = [t.episode_return for t in trajectories]
    weights = leaf_weights(path_gains, temperature)
    if all(g == path_gains[0] for g in path_gains):
        # Uniform weights (w = 1/L): exactly GRPO's computation on the leaves (credit.base.mean_std / normalize).
        mean, std = mean_std(returns)
        episode_values = normalize(returns, mean, std, scale=scale == "group", eps=eps)
    else:
        episode_values = weighted_advantages(returns, weights, scale=scale, eps=eps)
    values = []
    for trajectory, a in zip(trajectories, episode_values, strict=True):
        path = [a] * len(trajectory.steps)
        for t in range(trajectory.fork_step, len(path)):  # the penalty, charged once: by the owner of the step
            if not trajectory.steps[t].valid:
                path[t] -= invalid_penalty
        values.append(path)
    gains = list(node_gains.values())
    stats = {
        "num_leaves": float(len(trajectories)),
        "num_nodes": float(len(gains)),
        "mean_info_gain": sum(gains) / len(gains) if gains else 0.0,
        "positive_gain_fraction": sum(g > 0 for g in gains) / len(gains) if gains else 0.0,
        "mean_path_gain": sum(path_gains) / len(path_gains),
        "max_weight": max(weights),
        "effective_leaf_fraction": 1.0 / sum(w * w for w in weights) / len(weights),
        "zero_advantage_group": float(all(r == returns[0] for r in returns)),
    }
    return values, stats


def check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
                                             and temperature > 0):
        raise ValueError(f"the information-gain temperature T_I must be a finite number > 0, got {temperature!r}")
