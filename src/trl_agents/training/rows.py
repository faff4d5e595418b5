"""Stage 4, rows: from recorded episodes to training rows (docs/concepts/training_loop.md#rows).

* Step rows (default): one row per turn; prompt = what the policy saw that turn, completion = the action tokens.
  The step's advantage is broadcast over its action tokens.
* Conversation rows: one row per episode; prompt = the first turn's prompt, completion = action 0, the environment's
  reply tokens, action 1, ... with `env_mask` 0 over the environment's tokens (TRL's `tool_mask`), so only the
  actions are trained on; each action's tokens carry their own step's advantage.

Trees (branching topologies): a forked trajectory shares its parent's first `fork_step` steps (the same `Step`
objects). Every step is trained once, in the row of the first trajectory that holds it (`first_occurrences`: its
owner, or a child when the owner failed; a forked episode's conversation row starts at its fork: prompt = the
conversation up to there), with the SUM of the advantages that the trajectories
containing it give it (`credit_phase.step_values`) — what training every root-to-leaf path as its own sequence gives at
importance ratio 1, without generating or forwarding the shared prefix more than once. (Our choice, documented in
docs/topologies.md: TRL's "dapo" normaliser then counts the shared tokens once, not once per path.)

Signals in the batch: `training_signals` names step signals to lay out next to the rows — per-token ones
(`step.signals[name]` a list with one value per action token, e.g. teacher log-probs) as one value per completion
token (NaN on environment tokens and where a step has none), prompt-shaped ones (token ids, e.g. a teacher prompt)
as one id list per row.

Example:
    >>> from trl_agents.trajectory import Step, Trajectory, Group
    >>> steps = [Step("o0", "a", prompt_ids=[1, 2], action_ids=[3], env_ids=[9, 9]),
    ...          Step("o1", "b", prompt_ids=[1, 2, 3, 9, 9], action_ids=[4, 5])]
    >>> group = Group(task={}, trajectories=[Trajectory(task={}, steps=steps)])
    >>> rows = build_rows([group], [[[0.5, -1.0]]], row_format="conversation")
    >>> rows.completion_ids, rows.env_mask, rows.advantages
    ([[3, 9, 9, 4, 5]], [[1, 0, 0, 1, 1]], [[0.5, 0.0, 0.0, -1.0, -1.0]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..trajectory import Group, first_occurrences
from .credit_phase import step_values, token_advantages


@dataclass
class TrainingRows:
    """Ragged training rows (lists, one entry per row), before padding."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    env_mask: list[list[int]] = field(default_factory=list)
    advantages: list[list[float]] = field(default_factory=list)
    sampling_logprobs: list[list[float]] = field(default_factory=list)
    token_signals: dict[str, list[list[float]]] = field(default_factory=dict)
    prompt_signals: dict[str, list[list[int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def with_fillers(self, count: int, pad_token_id: int = 0) -> TrainingRows:
        """These rows plus `count` copies of row 0 (the trainer masks them out of the loss); with no row at all, the
        copies are of a one-token placeholder row (a rollout that left nothing to train on)."""
        if count > 0 and not self.prompt_ids:
            blank = TrainingRows(
                [[pad_token_id]], [[pad_token_id]], [[0]], [[0.0]], [[0.0]],
                {name: [[math.nan]] for name in self.token_signals},
                {name: [[pad_token_id]] for name in self.prompt_signals},
            )
            return blank.with_fillers(count - 1)

        def extend(values):
            return values + [values[0]] * count

        return TrainingRows(
            prompt_ids=extend(self.prompt_ids),
            completion_ids=extend(self.completion_ids),
            env_mask=extend(self.env_mask),
            advantages=extend(self.advantages),
            sampling_logprobs=extend(self.sampling_logprobs),
            token_signals={name: extend(values) for name, values in self.token_signals.items()},
            prompt_signals={name: extend(values) for name, values in self.prompt_signals.items()},
        )


def build_rows(
    groups: Sequence[Group],
    advantages: Sequence[Sequence[Sequence]],
    row_format: str = "step",
    training_signals: dict[str, str] | None = None,
) -> TrainingRows:
    """Training rows of `groups` (healthy trajectories only) with their advantages.

    Args:
        groups: The groups whose trajectories are trained on.
        advantages: `advantages[g][i][t]`, the advantage of step t of trajectory i of group g (every step of its full
            path): a float (broadcast over the action tokens) or a list with one value per action token.
        row_format: `"step"` or `"conversation"`.
        training_signals: Step signals to lay out with the rows, name -> `"tokens"` or `"prompt"` (module docstring).
    """
    if row_format not in ("step", "conversation"):
        raise ValueError(f"row_format must be 'step' or 'conversation', got {row_format!r}")
    training_signals = dict(training_signals or {})
    token_names = [name for name, layout in training_signals.items() if layout == "tokens"]
    prompt_names = [name for name, layout in training_signals.items() if layout == "prompt"]
    values_of = step_values(groups, advantages)
    rows = TrainingRows(token_signals={n: [] for n in token_names}, prompt_signals={n: [] for n in prompt_names})
    for trajectory, indices in first_occurrences(groups):
        steps = [trajectory.steps[i] for i in indices if trajectory.steps[i].action_ids]
        if not steps:
            continue
        if row_format == "step":
            for step in steps:
                rows.prompt_ids.append(list(step.prompt_ids))
                rows.completion_ids.append(list(step.action_ids))
                rows.env_mask.append([1] * len(step.action_ids))
                rows.advantages.append(token_advantages(values_of[id(step)], len(step.action_ids)))
                rows.sampling_logprobs.append(list(step.action_logprobs))
                for name in token_names:
                    rows.token_signals[name].append(_token_signal(step, name))
                for name in prompt_names:
                    rows.prompt_signals[name].append(_prompt_signal(step, name))
            continue
        completion, mask, row_advantages, logprobs = [], [], [], []
        signals = {name: [] for name in token_names}
        for index, step in enumerate(steps):
            completion += step.action_ids
            mask += [1] * len(step.action_ids)
            row_advantages += token_advantages(values_of[id(step)], len(step.action_ids))
            logprobs += list(step.action_logprobs)
            for name in token_names:
                signals[name] += _token_signal(step, name)
            if index < len(steps) - 1:  # the environment's reply: context, not trained on
                completion += step.env_ids
                mask += [0] * len(step.env_ids)
                row_advantages += [0.0] * len(step.env_ids)
                logprobs += [0.0] * len(step.env_ids)
                for name in token_names:
                    signals[name] += [math.nan] * len(step.env_ids)
        rows.prompt_ids.append(list(steps[0].prompt_ids))
        rows.completion_ids.append(completion)
        rows.env_mask.append(mask)
        rows.advantages.append(row_advantages)
        rows.sampling_logprobs.append(logprobs)
        for name in token_names:
            rows.token_signals[name].append(signals[name])
        for name in prompt_names:
            rows.prompt_signals[name].append(_prompt_signal(steps[0], name))
    return rows


def _token_signal(step, name: str) -> list[float]:
    """A per-token signal of a step's action (NaN where the step has none)."""
    values = step.signals.get(name)
    if values is None:
        return [math.nan] * len(step.action_ids)
    if len(values) != len(step.action_ids):
        raise ValueError(f"signal {name!r} has {len(values)} values for an action of {len(step.action_ids)} tokens")
    return [float(v) for v in values]


def _prompt_signal(step, name: str) -> list[int]:
    ids = step.signals.get(name)
    if not ids:
        raise ValueError(f"signal {name!r} (token ids of a prompt) is missing on a trained step")
    return [int(t) for t in ids]
