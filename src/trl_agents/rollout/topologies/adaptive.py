"""`adaptive`: grow each task's group in rounds, up to a cap, until a stopping rule holds (CANOPY's coverage-scaled
groups, arXiv 2609.01245; docs/methods/canopy.md).

Round 1 launches `num_generations` episodes of every task. Whenever a task's episodes have all finished, the task,
if its group does not satisfy the stopping rule yet and is below `max_group_size` episodes, gets `round_size` more
(fewer when the cap is closer). Its schedule is "free": the rule reads only the task's own group, so every task grows
on its own as soon as its round is done; in lockstep, every task is decided once every episode of the process has
finished, and all tasks' new episodes play together (one generation call per turn). The default rule is "the group
carries signal": at least two healthy episodes with different returns, so that a group-relative advantage is not
zero. Episodes that failed for infrastructure reasons count towards the cap (they
cost compute) but never towards the rule (they are not trained on).

How large a group must be (the arithmetic of coverage, here with the rule and the coverage diagnostics it logs;
CANOPY's credit, GRPO over the healthy episodes, is `trl_agents.credit.canopy`). With a binary outcome reward and
success probability p on a task, a group of n episodes has a non-zero group-relative advantage only if it holds both
a success and a failure (the paper's equation numbers are not known to us):

    P_sig(p, n) = 1 − p^n − (1 − p)^n                       signal probability ("signal coverage")
    n*(p, τ)    = min{n : P_sig(p, n) ≥ τ}                  exact group size for coverage τ
    n ≥ log(1 − τ)/log(1 − p)                               first-order rule (drops the p^n term: hard tasks)

    p = 0.05:  P_sig(0.05, 8)  = 1 − 0.05^8  − 0.95^8  = 1 − 3.9e-11 − 0.6634204 = 0.3365796
               P_sig(0.05, 32) = 1 − 0.05^32 − 0.95^32 = 1 − 2.3e-42 − 0.1937115 = 0.8062885
               τ = 0.8: first order log(0.2)/log(0.95) = 31.38 → 32;  exact P_sig(0.05, 31) = 0.7960932 < 0.8 → 32

Example:
    >>> from trl_agents.rollout.topologies import AdaptiveTopology
    >>> topology = AdaptiveTopology(max_group_size=8, round_size=2)
    >>> topology.begin([{"seed": 0}], num_generations=2)
    [Launch(task_index=0, count=2)]
    >>> round(signal_probability(0.05, 8), 4), round(signal_probability(0.05, 32), 4)
    (0.3366, 0.8063)
    >>> group_size_for_coverage(0.05, 0.8), first_order_group_size(0.05, 0.8)
    (32, 32)
    >>> group_size_for_coverage(0.5, 0.8), first_order_group_size(0.5, 0.8)  # P_sig(0.5, 3) = 0.75 < 0.8
    (4, 3)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ...trajectory import Group
from .base import Launch, Request, RolloutView, Topology


# ---- signal coverage (CANOPY) ----------------------------------------------------------------------------------------


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
    healthy.check_finite_rewards()
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


# ---- the topology ----------------------------------------------------------------------------------------------------


class AdaptiveTopology(Topology):
    """Rounds of episodes per task until `stop_rule(group)` holds or the group has `max_group_size` episodes.

    Args:
        max_group_size: Cap on the episodes of one task in one rollout (failed ones included).
        round_size: Episodes added to an unfinished group per round (default: the first round's size, G).
        stop_rule: `stop_rule(healthy_group) -> bool`; default `carries_signal` (two healthy episodes with different
            returns).
    """

    name = "adaptive"
    schedule = "free"

    def __init__(
        self,
        max_group_size: int,
        round_size: int | None = None,
        stop_rule: Callable[[Group], bool] | None = None,
    ):
        if isinstance(max_group_size, bool) or not isinstance(max_group_size, int) or max_group_size < 1:
            raise ValueError(f"max_group_size must be an integer >= 1, got {max_group_size!r}")
        if round_size is not None and (isinstance(round_size, bool) or not isinstance(round_size, int)
                                       or round_size < 1):
            raise ValueError(f"round_size must be an integer >= 1 or None (= num_generations), got {round_size!r}")
        self.max_group_size = max_group_size
        self.round_size = round_size
        self.stop_rule = stop_rule or carries_signal
        self._rounds: list[int] = []  # per task: 1 for the first round, +1 for every round it was given more
        self._round_size = round_size or 1
        self._first_round = 1

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        if num_generations > self.max_group_size:
            raise ValueError(
                f"The first round has num_generations={num_generations} episodes per task, more than "
                f"max_group_size={self.max_group_size}: raise the cap or lower num_generations."
            )
        self._rounds = [1] * len(tasks)
        self._round_size = self.round_size or num_generations
        self._first_round = num_generations
        return [Launch(index, num_generations) for index in range(len(tasks))]

    @property
    def rounds(self) -> int:
        """Rounds played: the most of any task. In lockstep it is the number of idle moments that asked for more,
        + 1 (a task that stops growing never grows again, so the tasks of the last round have played every round)."""
        return max(self._rounds, default=0)

    def when_idle(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """One more round for each of the task(s) (all for None, else `task_index`) whose group is below the cap and
        does not satisfy the stopping rule; each decision reads the task's own group only."""
        requests = []
        for index in view.task_indices(task_index):
            group = view.groups[index]
            room = self.max_group_size - len(group.trajectories)
            if room > 0 and not self.stop_rule(group.healthy()):
                requests.append(Launch(index, min(self._round_size, room)))
                self._rounds[index] += 1
        return requests

    def stats(self, view: RolloutView) -> dict[str, float]:
        """Coverage of the rollout's groups (`coverage_stats`: groups carrying signal, episodes per task, capped
        groups, rounds) and the rounds played."""
        if not view.groups:
            return {}
        stats = coverage_stats(view.groups, max_group_size=self.max_group_size, round_size=self._round_size,
                               first_round_size=self._first_round)
        return {**{k: float(v) for k, v in stats.items() if k != "num_groups"}, "rounds": float(self.rounds)}
