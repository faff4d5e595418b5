"""The one data model of trl-agents: `Step`, `Trajectory`, `Group`, `RolloutBatch`.

A rollout produces a `RolloutBatch`: one `Group` per task, each holding the G `Trajectory`s that started from the
same initial state, each a list of `Step`s (one per turn). Credit functions read Groups; the trainer turns Steps into
training rows; `RolloutBatch.to_rows()` / `from_rows()` convert to and from flat `datasets` rows (one row per step).

Example:
    >>> from trl_agents.trajectory import Step, Trajectory, Group, RolloutBatch
    >>> step = Step(observation="S . G", action_text="right", prompt_ids=[1, 2], action_ids=[3, 4], reward=1.0, done=True)
    >>> traj = Trajectory(task={"env": "frozenlake", "seed": 7}, steps=[step], success=True)
    >>> batch = RolloutBatch([Group(task=traj.task, trajectories=[traj])])
    >>> rows = batch.to_rows()
    >>> rows[0]["action_text"], rows[0]["episode_return"]
    ('right', 1.0)
    >>> RolloutBatch.from_rows(rows).groups[0].trajectories[0].steps[0].action_ids
    [3, 4]
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Step:
    """One turn of one episode: what the policy saw, what it generated, and what the environment answered.

    Args:
        observation: The environment observation shown right before this action, without any history. It is the
            text GiGPO-style methods compare across episodes (the "anchor observation").
        action_text: The decoded model output of this turn.
        prompt_ids: The tokens the policy was conditioned on. In step format: the rendered prompt of this turn
            (task + history window + observation). In conversation format: the whole conversation so far.
        action_ids: The generated tokens of this turn; the only loss-bearing tokens.
        action_logprobs: Sampling log-probabilities of `action_ids` (same length), as the generator computed them.
        reward: Environment reward r_t of this step (before any invalid-action penalty).
        done: Whether the environment ended the episode after this step.
        valid: Whether the environment accepted the action (False for unparsable or illegal actions).
        state_key: Canonical environment state before the action (hashable), when the env declares `state_key`.
        info: Free-form per-step information from the environment (kept JSON-serialisable).
        env_ids: Conversation format only: the tokens appended after the action (end of turn, the next observation,
            the next generation prompt). They are context, never trained on.
        snapshot: Environment snapshot taken before the action, for branching topologies (never serialised).
        signals: Values of the signals the trainer asked for (`trl_agents.signals`), by signal name: environment
            signals (e.g. `"solver_value"`, `"verifier_atoms"`) recorded where the environment lives, and model
            signals (e.g. `"teacher_logprobs"`, `"entropy"`) computed after the rollout. JSON-able values are also
            written to the trajectory records (`signals` column).
        prompt_parts: What the step prompt was rendered from (system, task, history window, observation), so that
            a privileged view can render the same prompt with extra text for a teacher (never serialised).
        next_observation: The observation the environment returned after this action, o_{t+1}: the next step's
            `observation` when the episode goes on, the terminal observation after the last step. None when the step
            failed (or for records written before this column existed). Methods that learn from transitions
            (s_t, a_t, o_{t+1}) read it.
    """

    observation: str
    action_text: str
    prompt_ids: list[int] = field(default_factory=list)
    action_ids: list[int] = field(default_factory=list)
    action_logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    valid: bool = True
    state_key: Hashable | None = None
    info: dict[str, Any] = field(default_factory=dict)
    env_ids: list[int] = field(default_factory=list)
    snapshot: Any = None
    signals: dict[str, Any] = field(default_factory=dict)
    prompt_parts: PromptParts | None = None
    next_observation: str | None = None


@dataclass(frozen=True)
class PromptParts:
    """The inputs a step prompt was rendered from (`PromptRenderer.step_messages` / `conversation_prompt_ids`).

    Args:
        system: The system message (the environment's instructions, or the configured system prompt).
        task: The task text repeated in every prompt (`env.task_description()`, often empty).
        history: The (observation, action) pairs shown, oldest first (step format; empty in conversation format).
        observation: The observation of this turn (conversation format: the first observation of the episode).
        tools: The JSON schemas of the tools the environment offers (`AgentEnv.tools`), each as JSON text, passed to
            the chat template as `tools=`; empty for environments without tools.
    """

    system: str
    task: str
    history: tuple[tuple[str, str], ...]
    observation: str
    tools: tuple[str, ...] = ()


@dataclass
class Trajectory:
    """One episode: the task it ran, its steps, and how it ended.

    Args:
        task: The dataset row that defined the task (e.g. `{"env": "sokoban", "seed": 3}`).
        steps: The recorded turns, in order.
        success: Whether the environment reported the task as solved.
        error: Set when the episode failed for infrastructure reasons (the env crashed or hung). Such episodes are
            kept in the records but excluded from group statistics and from training.
        episode_id: Index of this episode within its group (0..G-1).
        task_text: The goal as the environment states it in every prompt (`env.task_description()`; often empty
            when the first observation says it all). Kept for display (completions tables), not serialised.
        parent_id: Tree topologies: the `episode_id` of the trajectory this one forked from (None for a root, and
            for every episode of the independent topology).
        fork_step: Tree topologies: `steps[:fork_step]` are the parent's steps, the very same `Step` objects (the
            shared prefix, generated and recorded once); the steps from `fork_step` on are this trajectory's own.
            0 for roots.
    """

    task: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    success: bool = False
    error: str | None = None
    episode_id: int = 0
    task_text: str = ""
    parent_id: int | None = None
    fork_step: int = 0

    @property
    def owned_steps(self) -> list[Step]:
        """The steps this trajectory generated itself (all of them, unless it forked from a parent)."""
        return self.steps[self.fork_step :]

    @property
    def episode_return(self) -> float:
        """Undiscounted sum of the environment rewards R(τ) = Σ_t r_t."""
        return float(sum(step.reward for step in self.steps))

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def failed(self) -> bool:
        """True for an infrastructure failure (not for an unsuccessful episode)."""
        return self.error is not None


@dataclass
class Group:
    """The G episodes of one task, all started from the same initial state (the unit of group-relative credit)."""

    task: dict[str, Any]
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return task_id(self.task)

    def healthy(self) -> Group:
        """This group without infrastructure-failed episodes (what credit functions and training see)."""
        return Group(task=self.task, trajectories=[t for t in self.trajectories if not t.failed])

    @property
    def is_tree(self) -> bool:
        """Whether some trajectory forked from another (a branching topology): the group is a tree of episodes."""
        return any(t.parent_id is not None for t in self.trajectories)

    def check_finite_rewards(self) -> None:
        """Raise a ValueError naming the first trajectory whose return is NaN or inf (a non-finite step reward makes
        it so), the input that would make advantages or group statistics NaN."""
        for index, trajectory in enumerate(self.trajectories):
            if not math.isfinite(trajectory.episode_return):
                rewards = [step.reward for step in trajectory.steps]
                raise ValueError(f"trajectory {index} of the group has a non-finite reward: {rewards}")

    def trajectory(self, episode_id: int) -> Trajectory:
        """The trajectory with this `episode_id`."""
        for trajectory in self.trajectories:
            if trajectory.episode_id == episode_id:
                return trajectory
        raise KeyError(f"no trajectory with episode_id {episode_id} in the group of task {self.task_id}")

    def __len__(self) -> int:
        return len(self.trajectories)


def first_occurrences(groups: Iterable[Group]) -> list[tuple[Trajectory, list[int]]]:
    """For every trajectory of `groups`, in order, the indices of the steps no earlier trajectory holds (the same
    `Step` object): each step of a tree exactly once, with the first path that contains it. Without trees (or when
    every parent is present) these are the trajectory's own steps (`owned_steps`); when a parent was left out (an
    infrastructure failure), its child takes over the shared steps it still needs.

    >>> shared, a, b = Step("o", "x"), Step("o1", "y"), Step("o1", "z")
    >>> root = Trajectory(task={}, steps=[shared, a], episode_id=0)
    >>> fork = Trajectory(task={}, steps=[shared, b], episode_id=1, parent_id=0, fork_step=1)
    >>> [indices for _, indices in first_occurrences([Group(task={}, trajectories=[root, fork])])]
    [[0, 1], [1]]
    >>> [indices for _, indices in first_occurrences([Group(task={}, trajectories=[fork])])]  # root left out
    [[0, 1]]
    """
    seen: set[int] = set()
    out = []
    for group in groups:
        for trajectory in group.trajectories:
            indices = [i for i, step in enumerate(trajectory.steps) if id(step) not in seen]
            seen.update(id(trajectory.steps[i]) for i in indices)
            out.append((trajectory, indices))
    return out


def task_id(task: dict[str, Any]) -> str:
    """A stable id for a task row: its `task_id` field if present, else a canonical JSON of the row."""
    if "task_id" in task:
        return str(task["task_id"])
    return json.dumps(task, sort_keys=True, default=str)


# Columns of the flat row format, one row per step. Lists stay lists; `state_key`, `info` and `signals` are stored as
# strings (repr / JSON) so that any environment's keys survive a parquet round trip. A forked trajectory (tree
# topologies) has rows for its own steps only (`step` counts from the root, so its first row's `step` is its
# `fork_step`); `branch_id` is its episode id and `parent_id` its parent's, both null outside trees.
ROW_COLUMNS = (
    "task",
    "task_id",
    "group_index",
    "episode_id",
    "step",
    "observation",
    "next_observation",
    "action_text",
    "prompt_ids",
    "action_ids",
    "action_logprobs",
    "env_ids",
    "reward",
    "done",
    "valid",
    "state_key",
    "info",
    "episode_return",
    "success",
    "error",
    "branch_id",
    "parent_id",
    "fork_step",
    "signals",
)


@dataclass
class RolloutBatch:
    """All groups of one rollout (one generation batch), with conversion to and from flat step rows.

    `stats` holds the rollout's accounting (not serialised): `generated_tokens`, `env_steps`, `generation_calls`,
    `episodes`, and the topology's own numbers under `topology/...` (e.g. episodes per task of an adaptive group).
    """

    groups: list[Group] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [traj for group in self.groups for traj in group.trajectories]

    def to_rows(
        self, extra: dict[str, Iterable[Any]] | None = None, skip_signals: Iterable[str] = ()
    ) -> list[dict[str, Any]]:
        """Flatten to one dict per step (episodes without steps of their own, e.g. a failed reset, get one row with
        step=-1). A forked trajectory contributes its own steps only: the shared prefix is its parent's rows.

        `extra` maps a column name to one value per row (in row order), e.g. the advantages used in training;
        `skip_signals` names signals left out of the `signals` column.
        """
        skip = set(skip_signals)
        rows = []
        for group_index, group in enumerate(self.groups):
            tree = group.is_tree
            for traj in group.trajectories:
                common = {
                    "task": json.dumps(traj.task, sort_keys=True, default=str),
                    "task_id": task_id(traj.task),
                    "group_index": group_index,
                    "episode_id": traj.episode_id,
                    "episode_return": traj.episode_return,
                    "success": traj.success,
                    "error": traj.error,
                    "branch_id": str(traj.episode_id) if tree else None,
                    "parent_id": None if traj.parent_id is None else str(traj.parent_id),
                    "fork_step": traj.fork_step,
                }
                steps = traj.owned_steps or [None]
                for index, step in enumerate(steps, start=traj.fork_step):
                    if step is None:
                        rows.append({**common, **_empty_step_columns()})
                        continue
                    rows.append(
                        {
                            **common,
                            "step": index,
                            "observation": step.observation,
                            "next_observation": step.next_observation,
                            "action_text": step.action_text,
                            "prompt_ids": list(step.prompt_ids),
                            "action_ids": list(step.action_ids),
                            "action_logprobs": [float(x) for x in step.action_logprobs],
                            "env_ids": list(step.env_ids),
                            "reward": float(step.reward),
                            "done": bool(step.done),
                            "valid": bool(step.valid),
                            "state_key": None if step.state_key is None else repr(step.state_key),
                            "info": json.dumps(step.info, sort_keys=True, default=str),
                            "signals": signals_json({k: v for k, v in step.signals.items() if k not in skip}),
                        }
                    )
        if extra:
            for name, values in extra.items():
                values = list(values)
                if len(values) != len(rows):
                    raise ValueError(f"extra column {name!r} has {len(values)} values for {len(rows)} rows")
                for row, value in zip(rows, values, strict=True):
                    row[name] = value
        return rows

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]]) -> RolloutBatch:
        """Rebuild groups and trajectories from `to_rows()` output (or a `datasets.Dataset` of it).

        `state_key` comes back as its string form; equal keys stay equal, which is all grouping needs. `signals`
        come back as their JSON values. A forked trajectory gets its parent's first `fork_step` steps back (the same
        `Step` objects), as the rollout built it.
        """
        groups: dict[int, Group] = {}
        trajectories: dict[tuple[int, int], Trajectory] = {}
        for row in rows:
            task = json.loads(row["task"])
            group = groups.setdefault(row["group_index"], Group(task=task))
            key = (row["group_index"], row["episode_id"])
            if key not in trajectories:
                parent = row.get("parent_id")
                trajectories[key] = Trajectory(
                    task=task, success=bool(row["success"]), error=row["error"], episode_id=row["episode_id"],
                    parent_id=None if parent is None else int(parent), fork_step=int(row.get("fork_step") or 0),
                )
                group.trajectories.append(trajectories[key])
            if row["step"] < 0:
                continue
            trajectories[key].steps.append(
                Step(
                    observation=row["observation"],
                    next_observation=row.get("next_observation"),
                    action_text=row["action_text"],
                    prompt_ids=list(row["prompt_ids"]),
                    action_ids=list(row["action_ids"]),
                    action_logprobs=list(row["action_logprobs"]),
                    env_ids=list(row["env_ids"]),
                    reward=row["reward"],
                    done=row["done"],
                    valid=row["valid"],
                    state_key=row["state_key"],
                    info=json.loads(row["info"]),
                    signals=json.loads(row.get("signals") or "{}"),
                )
            )
        for (group_index, _), trajectory in sorted(trajectories.items()):  # parents have the lower episode ids
            if trajectory.parent_id is not None:
                parent = trajectories[(group_index, trajectory.parent_id)]
                trajectory.steps[:0] = parent.steps[: trajectory.fork_step]
        return cls(groups=[groups[k] for k in sorted(groups)])

    def to_dataset(self, extra: dict[str, Iterable[Any]] | None = None):
        """The rows as a `datasets.Dataset` (e.g. to save as parquet or push to the Hub)."""
        from datasets import Dataset

        return Dataset.from_list(self.to_rows(extra))

    @classmethod
    def from_dataset(cls, dataset) -> RolloutBatch:
        return cls.from_rows(dataset)


def signals_json(signals: dict[str, Any]) -> str:
    """The JSON-able signals of a step, as one JSON object string (tensors and other values JSON cannot hold, e.g.
    hidden states, are left out: they live on the `Step` only)."""
    kept = {}
    for name, value in signals.items():
        try:
            json.dumps(value, default=_python_scalar)
        except (TypeError, ValueError):
            continue
        kept[name] = value
    return json.dumps(kept, sort_keys=True, default=_python_scalar)


def _python_scalar(value: Any) -> Any:
    """numpy / torch scalars as Python numbers (JSON cannot hold them); anything else is refused."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-able")


def _empty_step_columns() -> dict[str, Any]:
    return {
        "step": -1,
        "observation": "",
        "next_observation": None,
        "action_text": "",
        "prompt_ids": [],
        "action_ids": [],
        "action_logprobs": [],
        "env_ids": [],
        "reward": 0.0,
        "done": True,
        "valid": False,
        "state_key": None,
        "info": "{}",
        "signals": "{}",
    }
