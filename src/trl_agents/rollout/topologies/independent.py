"""`independent`: G independent episodes per task, all from the task's initial state (GRPO's group; the default).

Its schedule is "free": it asks for everything in `begin` and nothing afterwards, so no episode waits for another.

Example:
    >>> from trl_agents.rollout.topologies import IndependentTopology
    >>> IndependentTopology().begin([{"seed": 0}, {"seed": 1}], num_generations=4)
    [Launch(task_index=0, count=4), Launch(task_index=1, count=4)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Launch, Request, Topology


class IndependentTopology(Topology):
    """Launch `num_generations` episodes of every task at once and nothing else."""

    name = "independent"
    schedule = "free"

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        return [Launch(index, num_generations) for index in range(len(tasks))]
