"""`adaptive`: grow each task's group in rounds, up to a cap, until a stopping rule holds (CANOPY's coverage-scaled
groups, arXiv 2609.01245; docs/methods/canopy.md).

Round 1 launches `num_generations` episodes of every task. Whenever every episode of the process has finished, each
task whose group does not satisfy the stopping rule yet, and is below `max_group_size` episodes, gets `round_size`
more (fewer when the cap is closer), all tasks' new episodes played together (one generation call per turn). The
default rule is "the group carries signal": at least two healthy episodes with different returns, so that a
group-relative advantage is not zero. Episodes that failed for infrastructure reasons count towards the cap (they
cost compute) but never towards the rule (they are not trained on).

Example:
    >>> from trl_agents.rollout.topologies import AdaptiveTopology
    >>> topology = AdaptiveTopology(max_group_size=8, round_size=2)
    >>> topology.begin([{"seed": 0}], num_generations=2)
    [Launch(task_index=0, count=2)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...credit.canopy import carries_signal, coverage_stats
from ...trajectory import Group
from .base import Launch, Request, RolloutView, Topology


class AdaptiveTopology(Topology):
    """Rounds of episodes per task until `stop_rule(group)` holds or the group has `max_group_size` episodes.

    Args:
        max_group_size: Cap on the episodes of one task in one rollout (failed ones included).
        round_size: Episodes added to an unfinished group per round (default: the first round's size, G).
        stop_rule: `stop_rule(healthy_group) -> bool`; default `credit.canopy.carries_signal` (two healthy episodes
            with different returns).
    """

    name = "adaptive"

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
        self.rounds = 0
        self._round_size = round_size or 1
        self._first_round = 1

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        if num_generations > self.max_group_size:
            raise ValueError(
                f"The first round has num_generations={num_generations} episodes per task, more than "
                f"max_group_size={self.max_group_size}: raise the cap or lower num_generations."
            )
        self.rounds = 1
        self._round_size = self.round_size or num_generations
        self._first_round = num_generations
        return [Launch(index, num_generations) for index in range(len(tasks))]

    def when_idle(self, view: RolloutView) -> list[Request]:
        requests = []
        for index, group in enumerate(view.groups):
            room = self.max_group_size - len(group.trajectories)
            if room > 0 and not self.stop_rule(group.healthy()):
                requests.append(Launch(index, min(self._round_size, room)))
        if requests:
            self.rounds += 1
        return requests

    def stats(self, view: RolloutView) -> dict[str, float]:
        """Coverage of the rollout's groups (`credit.canopy.coverage_stats`: groups carrying signal, episodes per
        task, capped groups, rounds) and the rounds played."""
        if not view.groups:
            return {}
        stats = coverage_stats(view.groups, max_group_size=self.max_group_size, round_size=self._round_size,
                               first_round_size=self._first_round)
        return {**{k: float(v) for k, v in stats.items() if k != "num_groups"}, "rounds": float(self.rounds)}
