"""Stage 3, credit: which groups are credited and trained, and the value each recorded step is trained with
(docs/concepts/training_loop.md#credit).

The trainer's `compute_advantages(groups)` hook gives one value per step (or per action token) of every trajectory,
`advantages[g][i][t]`. Around it: `trainable_groups` keeps each group's healthy episodes (none when too few are left),
`filter_groups` empties the groups a training filter rejects, `step_values` folds the values of a tree's paths into
the one value each shared `Step` is trained with, and `episode_step_values` is that value per episode and owned step,
for the logs and the trajectory records. `EmptyRollouts` stops a run whose rollouts keep leaving nothing to train on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..trajectory import Group, RolloutBatch

logger = logging.getLogger(__name__)

def trainable_groups(groups: Sequence[Group], min_healthy_episodes: int) -> tuple[list[Group], int]:
    """(each group's healthy episodes, or no episode when fewer than `min_healthy_episodes` are healthy; how many
    groups were emptied that way). Positions are kept: `result[g]` is `groups[g]`'s, as credit and records expect.

    >>> from trl_agents.trajectory import Group, Trajectory
    >>> group = Group({}, [Trajectory({}), Trajectory({}, error="step failed: timed out")])
    >>> kept, dropped = trainable_groups([group], 2)
    >>> len(kept[0].trajectories), dropped
    (0, 1)
    """
    kept, dropped = [], 0
    for group in groups:
        healthy = group.healthy()
        if 0 < len(healthy.trajectories) < min_healthy_episodes:
            healthy = Group(task=group.task, trajectories=[])
            dropped += 1
        kept.append(healthy)
    return kept, dropped


def filter_groups(groups: list[Group], advantages: list, filters: Sequence[Callable]) -> tuple[list[Group], list]:
    """(groups, advantages) with the groups some filter rejects emptied (no episode, no advantage), positions kept.

    >>> from trl_agents.trajectory import Group, Trajectory
    >>> kept, values = filter_groups([Group({}, [Trajectory({})]), Group({}, [Trajectory({})])], [[[1.0]], [[2.0]]],
    ...                              [lambda groups: [True, False]])
    >>> [len(g.trajectories) for g in kept], values
    ([1, 0], [[[1.0]], []])
    """
    for keep in filters:
        decisions = list(keep(groups))
        if len(decisions) != len(groups):
            raise ValueError(f"a group filter returned {len(decisions)} decisions for {len(groups)} groups")
        groups = [g if ok else Group(task=g.task, trajectories=[]) for g, ok in zip(groups, decisions, strict=True)]
        advantages = [a if ok else [] for a, ok in zip(advantages, decisions, strict=True)]
    return groups, advantages


def token_advantages(value: float | Sequence[float], num_tokens: int) -> list[float]:
    """A step's advantage for each of its action tokens: a scalar is broadcast, a per-token list is checked."""
    if isinstance(value, (int, float)):
        return [float(value)] * num_tokens
    values = [float(v) for v in value]
    if len(values) != num_tokens:
        raise ValueError(f"per-token advantages have {len(values)} values for an action of {num_tokens} tokens")
    return values


def step_values(groups: Sequence[Group], advantages: Sequence[Sequence[Sequence]]) -> dict[int, float | list[float]]:
    """`id(step)` -> the advantage a step is trained with: its trajectory's value, or for a step shared by several
    trajectories of a tree (the same `Step` object), the sum of their values (per token when they are lists).

    >>> from trl_agents.trajectory import Step, Trajectory, Group
    >>> shared, a, b = Step("o", "x"), Step("o1", "y"), Step("o1", "z")
    >>> root = Trajectory(task={}, steps=[shared, a], episode_id=0)
    >>> fork = Trajectory(task={}, steps=[shared, b], episode_id=1, parent_id=0, fork_step=1)
    >>> values = step_values([Group(task={}, trajectories=[root, fork])], [[[0.5, 1.0], [-0.25, -1.0]]])
    >>> values[id(shared)], values[id(a)], values[id(b)]
    (0.25, 1.0, -1.0)
    """
    totals: dict[int, float | list[float]] = {}
    for group, group_advantages in zip(groups, advantages, strict=True):
        for trajectory, step_advantages in zip(group.trajectories, group_advantages, strict=True):
            if len(step_advantages) != len(trajectory.steps):
                raise ValueError(
                    f"compute_advantages gave {len(step_advantages)} values for a trajectory of "
                    f"{len(trajectory.steps)} steps (one per step of its full path, shared prefix included)"
                )
            for step, value in zip(trajectory.steps, step_advantages, strict=True):
                key = id(step)
                if key not in totals:
                    totals[key] = value if isinstance(value, (int, float)) else [float(v) for v in value]
                elif isinstance(value, (int, float)) and isinstance(totals[key], (int, float)):
                    totals[key] = totals[key] + value
                else:  # per-token values: add token by token (a scalar broadcasts)
                    previous = totals[key]
                    n = len(step.action_ids)
                    left = token_advantages(previous, n)
                    right = token_advantages(value, n)
                    totals[key] = [x + y for x, y in zip(left, right, strict=True)]
    return totals


def episode_step_values(batch: RolloutBatch, healthy: list[Group], advantages) -> dict[tuple[int, int], list]:
    """(group index, episode id) -> one scalar per step the episode owns (`owned_steps`): the advantage the step was
    trained with (the mean over tokens for per-token credit; for a step a tree shares, the sum its paths give it), or
    None for a step nobody trained (an infrastructure-failed episode's; a failed parent's shared steps still carry
    the value its healthy children trained them with). `healthy[g]` is `batch.groups[g].healthy()`."""
    trained = step_values(healthy, advantages)

    def scalar(value):
        if value is None:
            return None
        return float(value) if isinstance(value, (int, float)) else float(sum(value) / max(len(value), 1))

    return {
        (group_index, trajectory.episode_id): [scalar(trained.get(id(step))) for step in trajectory.owned_steps]
        for group_index, group in enumerate(batch.groups)
        for trajectory in group.trajectories
    }


class NothingToTrainError(RuntimeError, ValueError):
    """`EmptyRollouts.limit` rollouts in a row left nothing to train on. A RuntimeError, and a ValueError too, so
    that the command line reports it in one line (its message names the episodes' errors and their fix, e.g. a
    `max_prompt_length` the environment's observations do not fit in) instead of a traceback."""


class EmptyRollouts:
    """A training rollout that leaves nothing to train on (every episode failed, or its group was left with too few
    healthy ones) makes a step that updates nothing, with a warning, so that one bad rollout never stops training;
    `limit` such rollouts in a row mean the environment itself is broken: a `NothingToTrainError` names its
    errors."""

    limit = 3

    def __init__(self):
        self.in_a_row = 0

    def check(self, batch: RolloutBatch, num_rows: int, dropped: int, min_healthy_episodes: int, step: int, *,
              training: bool) -> None:
        """Count a rollout that gave `num_rows` rows (`dropped` groups below `min_healthy_episodes`); an evaluation
        rollout, or one with rows, ends the streak."""
        if num_rows > 0 or not training:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        errors = sorted({t.error for t in batch.trajectories if t.error})
        reason = (
            "every episode of this rollout failed"
            + (f" or was left alone in its group ({dropped} groups below min_healthy_episodes="
               f"{min_healthy_episodes})" if dropped else "")
            + ". First errors: " + ("; ".join(errors[:3]) or "none")
        )
        if self.in_a_row >= self.limit:
            raise NothingToTrainError(f"{self.in_a_row} rollouts in a row left nothing to train on: {reason}")
        logger.warning("Nothing to train on at step %d (this step updates nothing): %s", step + 1, reason)
