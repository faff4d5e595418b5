"""CANOPY: size each task's group until it carries signal; credit is GRPO's z-score over the healthy episodes.

CANOPY (Coverage-ANchored On-PolicY RL; Pu, Li, Liu, Cao, Yang 2026, "Explore More, Drift Less: Outcome-Only
Reinforcement Learning Can Suffice for Long-Horizon Interactive Agents", arXiv 2609.01245; reference code
github.com/AlibabaResearch/CANOPY-RL) adds no loss term. It is a recipe: sample enough episodes per task that the
group mixes outcomes, train strictly on-policy (one update per rollout batch) with a small KL anchor to the initial
model and the loss on the agent's own action tokens only, and remove infrastructure-failed episodes. The trainer
holds the on-policy / KL / masking part; this file holds the arithmetic of coverage and the credit.

With a binary outcome reward and success probability p on a task, a group of n episodes has a non-zero
group-relative advantage only if it holds both a success and a failure (the paper's equation numbers are not
known to us):

    P_sig(p, n) = 1 − p^n − (1 − p)^n                       signal probability ("signal coverage")
    n*(p, τ)    = min{n : P_sig(p, n) ≥ τ}                  exact group size for coverage τ
    n ≥ log(1 − τ)/log(1 − p)                               first-order rule (drops the p^n term: hard tasks)

    p = 0.05:  P_sig(0.05, 8)  = 1 − 0.05^8  − 0.95^8  = 1 − 3.9e-11 − 0.6634204 = 0.3365796
               P_sig(0.05, 32) = 1 − 0.05^32 − 0.95^32 = 1 − 2.3e-42 − 0.1937115 = 0.8062885
               τ = 0.8: first order log(0.2)/log(0.95) = 31.38 → 32;  exact P_sig(0.05, 31) = 0.7960932 < 0.8 → 32

The advantage is GRPO's (`trl_agents.credit.grpo`, `scale="group"`): A_i = (R_i − μ)/(σ + ε) over the group's
healthy episodes. Infrastructure-failed episodes (`Trajectory.error` set: the env crashed, hung or timed out) are
REMOVED from the statistic and from training (`failed_episodes="drop"`, the paper's wording). The reference code
instead keeps a placeholder sample with reward 0 and no loss tokens (`failed_episodes="zero"`): it trains nothing,
but its 0 enters μ and σ and pulls the baseline of a group with successes down. Agent-caused ends (turn or context
limit) are not failures: they keep their reward 0 and are scored.

Example:
    >>> round(signal_probability(0.05, 8), 4), round(signal_probability(0.05, 32), 4)
    (0.3366, 0.8063)
    >>> group_size_for_coverage(0.05, 0.8), first_order_group_size(0.05, 0.8)
    (32, 32)
    >>> group_size_for_coverage(0.5, 0.8), first_order_group_size(0.5, 0.8)  # P_sig(0.5, 3) = 0.75 < 0.8
    (4, 3)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..trajectory import Group, Trajectory
from .base import StepAdvantages, check_choice, check_group, register_estimator
from .grpo import grpo_advantages

FAILED_EPISODES = ("drop", "zero")


# ---- signal coverage -----------------------------------------------------------------------------------------------


def _check_probability(p: float, *, open_interval: bool) -> None:
    if open_interval and not (math.isfinite(p) and 0.0 < p < 1.0):
        raise ValueError(
            f"p must be in (0, 1), got {p}: a task that is always (p = 1) or never (p = 0) solved gives equal "
            "rewards in every group, so no group size gives it signal"
        )
    if not (math.isfinite(p) and 0.0 <= p <= 1.0):
        raise ValueError(f"p must be a probability in [0, 1], got {p}")


def _check_target(target: float) -> None:
    if not (math.isfinite(target) and 0.0 < target < 1.0):
        raise ValueError(f"target must be in (0, 1) (the wanted signal probability, e.g. 0.8), got {target}")


def signal_probability(p: float, n: int) -> float:
    """P_sig(p, n) = 1 − p^n − (1 − p)^n: the chance that n episodes with success probability p mix outcomes.

    Computed as −expm1(n·log1p(−m)) − m^n with m = min(p, 1 − p) (the formula is symmetric in p ↔ 1 − p), which
    keeps digits when m is small. 0 for n = 1 and for p ∈ {0, 1}.

    >>> signal_probability(0.5, 2), signal_probability(0.05, 1), signal_probability(1.0, 8)  # 1 − 0.25 − 0.25
    (0.5, 0.0, 0.0)
    """
    _check_probability(p, open_interval=False)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (episodes in the group), got {n!r}")
    m = min(p, 1.0 - p)
    if m == 0.0:
        return 0.0
    return max(0.0, -math.expm1(n * math.log1p(-m)) - m**n)


def group_size_for_coverage(p: float, target: float) -> int:
    """n*(p, τ): the smallest group size n with P_sig(p, n) ≥ τ (exact, by bisection; P_sig grows with n).

    P_sig(p, n + 1) − P_sig(p, n) = m·(1 − m)^n + (1 − m)·m^n > 0 (m = min(p, 1 − p)), and
    1 − 2·(1 − m)^n ≤ P_sig ≤ 1 − (1 − m)^n bound the search. Use the pass rate of the hardest tasks you keep
    (e.g. a base-policy pilot estimate) for p. Compare `first_order_group_size`.

    Raises:
        ValueError: p ∉ (0, 1) (no group size gives such a task signal) or target ∉ (0, 1).

    >>> group_size_for_coverage(0.05, 0.3365), group_size_for_coverage(0.95, 0.8)  # P_sig(0.05, 8) = 0.33658; p ↔ 1 − p
    (8, 32)
    """
    _check_probability(p, open_interval=True)
    _check_target(target)
    m = min(p, 1.0 - p)
    log_q = math.log1p(-m)  # log(1 − m) < 0
    low = max(1, math.floor(math.log(1.0 - target) / log_q) - 1)  # below the first-order size: P_sig < τ
    high = max(low + 1, math.ceil(math.log((1.0 - target) / 2.0) / log_q) + 1)  # 1 − 2(1 − m)^n ≥ τ from here on
    while low > 1 and signal_probability(p, low) >= target:  # guards against rounding at the bounds
        low -= 1
    while signal_probability(p, high) < target:
        high *= 2
    while high - low > 1:  # invariant: P_sig(low) < τ ≤ P_sig(high), or low = 1 (P_sig(1) = 0)
        middle = (low + high) // 2
        if signal_probability(p, middle) >= target:
            high = middle
        else:
            low = middle
    return high


def first_order_group_size(p: float, target: float) -> int:
    """The first-order rule n = ceil(log(1 − τ)/log(1 − p)), for comparison with `group_size_for_coverage`.

    It keeps only the all-failures term (1 − p)^n of P_sig, which is right for hard tasks (small p: p^n is
    negligible) and too small elsewhere: p = 0.5, τ = 0.8 gives 3 (P_sig = 0.75) where 4 is needed, and for easy
    tasks (p → 1) it tends to 1, a group that never carries signal.

    >>> first_order_group_size(0.05, 0.8), first_order_group_size(0.95, 0.8)  # 31.38 -> 32;  0.54 -> 1
    (32, 1)
    """
    _check_probability(p, open_interval=True)
    _check_target(target)
    return max(1, math.ceil(math.log(1.0 - target) / math.log1p(-p)))


# ---- whether a group carries signal, and coverage diagnostics ------------------------------------------------------


def carries_signal(group: Group) -> bool:
    """Whether the healthy episodes' returns are not all equal (GRPO then gives some episode a non-zero advantage).

    A group with fewer than two healthy episodes does not carry signal. Returns are compared exactly; the
    invalid-action penalty is not a return and does not count as signal here.

    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> def episode(r, error=None):
    ...     return Trajectory(task={}, steps=[Step("s", "a", reward=r)], error=error)
    >>> carries_signal(Group(task={}, trajectories=[episode(0.0), episode(0.0), episode(1.0, error="env crashed")]))
    False
    >>> carries_signal(Group(task={}, trajectories=[episode(0.0), episode(1.0)]))
    True
    """
    healthy = group.healthy()
    if len(healthy) < 2:
        return False
    check_group(healthy, 0.0)
    returns = [traj.episode_return for traj in healthy.trajectories]
    return any(r != returns[0] for r in returns[1:])


def needs_more_episodes(group: Group, *, max_group_size: int) -> bool:
    """The adaptive-group rule: grow a task's group while it carries no signal and is below the cap.

    Every episode counts toward the cap, infrastructure-failed ones included (they cost compute) — our choice.

    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> group = Group(task={}, trajectories=[Trajectory(task={}, steps=[Step("s", "a")]) for _ in range(8)])
    >>> needs_more_episodes(group, max_group_size=32), needs_more_episodes(group, max_group_size=8)
    (True, False)
    """
    _check_positive_int("max_group_size", max_group_size)
    return len(group) < max_group_size and not carries_signal(group)


def coverage_stats(
    groups: Iterable[Group],
    *,
    max_group_size: int | None = None,
    round_size: int | None = None,
    first_round_size: int | None = None,
) -> dict[str, float]:
    """Diagnostics of signal coverage over the groups of one rollout batch, for logging.

    Args:
        groups: One group per task, failed episodes included (they are counted, not scored).
        max_group_size: The cap of an adaptive topology (`canopy_max_group_size`); None for fixed groups.
        round_size: Episodes added per round by an adaptive topology (`canopy_round_size`); None for fixed groups.
        first_round_size: Episodes of the first round (the adaptive topology's `num_generations`); default
            `round_size`.

    Returns:
        {"num_groups", "signal_fraction" (groups carrying signal), "mean_episodes_per_task" and
        "max_episodes_per_task" (failed included), "mean_healthy_episodes_per_task", "failed_episode_fraction"
        (of all episodes), "success_rate" (of healthy episodes, `Trajectory.success`), "capped_fraction" (groups
        at or above the cap; 0 without a cap), "capped_without_signal_fraction" (groups that reached the cap and
        still carry no signal: the starvation the cap leaves)}, plus "mean_rounds" when `round_size` is given: rounds
        per group, 1 + ceil((episodes − first_round_size) / round_size) (the last round may be cut by the cap). All
        0 for no groups.

    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> def group(*returns):
    ...     return Group(task={}, trajectories=[Trajectory(task={}, steps=[Step("s", "a", reward=r)]) for r in returns])
    >>> stats = coverage_stats([group(0, 1), group(*[0] * 8)], max_group_size=8, round_size=2)
    >>> stats["signal_fraction"], stats["mean_episodes_per_task"], stats["capped_without_signal_fraction"]
    (0.5, 5.0, 0.5)
    >>> stats["mean_rounds"]  # rounds of 2 episodes: (1 + 4) / 2
    2.5
    """
    if max_group_size is not None:
        _check_positive_int("max_group_size", max_group_size)
    if round_size is not None:
        _check_positive_int("round_size", round_size)
    if first_round_size is not None:
        _check_positive_int("first_round_size", first_round_size)
    first = first_round_size or round_size
    groups = list(groups)
    num_groups = len(groups)
    stats: dict[str, float] = {
        "num_groups": num_groups,
        "signal_fraction": 0.0,
        "mean_episodes_per_task": 0.0,
        "max_episodes_per_task": 0,
        "mean_healthy_episodes_per_task": 0.0,
        "failed_episode_fraction": 0.0,
        "success_rate": 0.0,
        "capped_fraction": 0.0,
        "capped_without_signal_fraction": 0.0,
    }
    if round_size is not None:
        stats["mean_rounds"] = 0.0
    if not num_groups:
        return stats
    sizes = [len(group) for group in groups]
    healthy = [group.healthy().trajectories for group in groups]
    signal = [carries_signal(group) for group in groups]
    capped = [max_group_size is not None and size >= max_group_size for size in sizes]
    episodes, healthy_episodes = sum(sizes), sum(len(h) for h in healthy)
    stats["signal_fraction"] = sum(signal) / num_groups
    stats["mean_episodes_per_task"] = episodes / num_groups
    stats["max_episodes_per_task"] = max(sizes)
    stats["mean_healthy_episodes_per_task"] = healthy_episodes / num_groups
    stats["failed_episode_fraction"] = (episodes - healthy_episodes) / episodes if episodes else 0.0
    successes = sum(traj.success for h in healthy for traj in h)
    stats["success_rate"] = successes / healthy_episodes if healthy_episodes else 0.0
    stats["capped_fraction"] = sum(capped) / num_groups
    stats["capped_without_signal_fraction"] = sum(c and not s for c, s in zip(capped, signal, strict=True)) / num_groups
    if round_size is not None:
        rounds = [1 + math.ceil(max(0, size - first) / round_size) if size else 0 for size in sizes]
        stats["mean_rounds"] = sum(rounds) / num_groups
    return stats


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


# ---- credit --------------------------------------------------------------------------------------------------------


@register_estimator("canopy")
def canopy_advantages(
    group: Group, *, failed_episodes: str = "drop", invalid_penalty: float = 0.0, eps: float = 1e-4
) -> StepAdvantages:
    """GRPO z-score advantages over the healthy episodes; see `canopy_advantages_with_stats` for the arguments.

    Example (returns [1, 0] and one infrastructure failure):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(r, error=None):
        ...     return Trajectory(task={}, steps=[Step("s", "a", reward=r)], error=error)
        >>> group = Group(task={}, trajectories=[episode(1.0), episode(0.0), episode(0.0, error="env timeout")])
        >>> [[round(a, 4) for a in row] for row in canopy_advantages(group)]  # over [1, 0]: ±0.5 / (0.7071 + 1e-4)
        [[0.707], [-0.707], [0.0]]
        >>> [[round(a, 4) for a in row] for row in canopy_advantages(group, failed_episodes="zero")]  # over [1, 0, 0]
        [[1.1545], [-0.5773], [0.0]]
    """
    advantages, _ = canopy_advantages_with_stats(
        group, failed_episodes=failed_episodes, invalid_penalty=invalid_penalty, eps=eps
    )
    return advantages


def canopy_advantages_with_stats(
    group: Group, *, failed_episodes: str = "drop", invalid_penalty: float = 0.0, eps: float = 1e-4
) -> tuple[StepAdvantages, dict[str, float]]:
    """GRPO z-score advantages over the healthy episodes of `group`, plus whether the group carried signal.

    Args:
        group: The episodes of one task. The trainer passes healthy episodes only; failed ones passed here get 0 on
            every step (they are not trained).
        failed_episodes: "drop" (default, the paper's wording): failed episodes are left out of μ and σ. "zero":
            as the reference code, each failed episode counts as a return of 0 in μ and σ (its placeholder sample
            has no loss tokens); it needs the group with its failed episodes.
        invalid_penalty: λ, subtracted after normalisation on steps with `valid=False` (CANOPY uses none: 0).
        eps: ε added to the Bessel std (TRL: 1e-4).

    Returns:
        (advantages, stats): one list per trajectory (same order), one value per step; and {"carries_signal" (1.0 or
        0.0), "healthy_episodes", "failed_episodes"}.
    """
    check_choice("failed_episodes", failed_episodes, FAILED_EPISODES)
    if failed_episodes == "drop":
        scored = [traj for traj in group.trajectories if not traj.failed]
    else:  # a stand-in without steps: return 0 in the statistic, nothing to train
        scored = [Trajectory(task=traj.task) if traj.failed else traj for traj in group.trajectories]
    population = Group(task=group.task, trajectories=scored)
    rows = iter(
        grpo_advantages(population, scale="group", statistic="trajectories", invalid_penalty=invalid_penalty, eps=eps)
    )
    advantages: StepAdvantages = []
    for traj in group.trajectories:
        if traj.failed:
            if failed_episodes == "zero":
                next(rows)
            advantages.append([0.0] * len(traj.steps))
        else:
            advantages.append(next(rows))
    failed = sum(traj.failed for traj in group.trajectories)
    stats = {
        "carries_signal": float(carries_signal(group)),
        "healthy_episodes": len(group) - failed,
        "failed_episodes": failed,
    }
    return advantages, stats
