"""From recorded episodes to training rows (docs/concepts/training_loop.md#rows), and from rows to TRL's tensors.

* Step rows (default): one row per turn; prompt = what the policy saw that turn, completion = the action tokens.
  The step's advantage is broadcast over its action tokens.
* Conversation rows: one row per episode; prompt = the first turn's prompt, completion = action 0, the environment's
  reply tokens, action 1, ... with `env_mask` 0 over the environment's tokens (TRL's `tool_mask`), so only the
  actions are trained on; each action's tokens carry their own step's advantage.

Trees (branching topologies): a forked trajectory shares its parent's first `fork_step` steps (the same `Step`
objects). Every step is trained once, in the row of the first trajectory that holds it (`first_occurrences`: its
owner, or a child when the owner failed; a forked episode's conversation row starts at its fork: prompt = the
conversation up to there), with the SUM of the advantages that the trajectories
containing it give it (`step_values`) — what training every root-to-leaf path as its own sequence gives at
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


def _token_advantages(value: float | Sequence[float], num_tokens: int) -> list[float]:
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
                    left = _token_advantages(previous, n)
                    right = _token_advantages(value, n)
                    totals[key] = [x + y for x, y in zip(left, right, strict=True)]
    return totals


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
                rows.advantages.append(_token_advantages(values_of[id(step)], len(step.action_ids)))
                rows.sampling_logprobs.append(list(step.action_logprobs))
                for name in token_names:
                    rows.token_signals[name].append(_token_signal(step, name))
                for name in prompt_names:
                    rows.prompt_signals[name].append(_prompt_signal(step, name))
            continue
        completion, mask, token_advantages, logprobs = [], [], [], []
        signals = {name: [] for name in token_names}
        for index, step in enumerate(steps):
            completion += step.action_ids
            mask += [1] * len(step.action_ids)
            token_advantages += _token_advantages(values_of[id(step)], len(step.action_ids))
            logprobs += list(step.action_logprobs)
            for name in token_names:
                signals[name] += _token_signal(step, name)
            if index < len(steps) - 1:  # the environment's reply: context, not trained on
                completion += step.env_ids
                mask += [0] * len(step.env_ids)
                token_advantages += [0.0] * len(step.env_ids)
                logprobs += [0.0] * len(step.env_ids)
                for name in token_names:
                    signals[name] += [math.nan] * len(step.env_ids)
        rows.prompt_ids.append(list(steps[0].prompt_ids))
        rows.completion_ids.append(completion)
        rows.env_mask.append(mask)
        rows.advantages.append(token_advantages)
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


# What one forward costs beyond its tokens, in padded tokens: the weight `length_groups` gives to cutting one more
# forward. Our estimate (CPU and GPU alike): a forward's fixed cost (kernel launches, Python) is worth a few hundred
# tokens of a small model; a larger model only makes tokens dearer, so padding dearer.
FORWARD_COST_TOKENS = 256


def length_groups(lengths: Sequence[int], forward_cost: int | None = None) -> list[list[int]]:
    """Row indices cut into forwards of rows of similar length: the rows sorted by length, longest first (ties in
    row order), cut where the padded tokens (each forward: its rows × its longest row) plus `forward_cost` per
    forward (None: `FORWARD_COST_TOKENS`) are fewest — exactly, by dynamic programming over the distinct lengths (ascending `v`, with `n` rows up
    to each): best[j] = min over i < j of best[i] + (n[j] − n[i]) · v[j] + forward_cost.

    >>> length_groups([10, 200, 12, 198, 11], forward_cost=50)  # 2 × 200 + 3 × 12 + 2 × 50 = 536 < 1000 + 50
    [[1, 3], [2, 4, 0]]
    >>> length_groups([10, 200, 12, 198, 11], forward_cost=1000)  # a forward is dearer than the padding it saves
    [[1, 3, 2, 4, 0]]
    >>> length_groups([]), length_groups([7])
    ([], [[0]])
    """
    if not lengths:
        return []
    import numpy as np

    forward_cost = FORWARD_COST_TOKENS if forward_cost is None else forward_cost

    values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    rows_up_to = np.concatenate([[0], np.cumsum(counts)])  # n[0] = 0, n[j] = rows of the j shortest lengths
    best = np.zeros(len(values) + 1)
    cut = np.zeros(len(values) + 1, dtype=np.int64)
    for j in range(1, len(values) + 1):  # the last forward holds the lengths values[i:j], padded to values[j - 1]
        costs = best[:j] + (rows_up_to[j] - rows_up_to[:j]) * float(values[j - 1]) + forward_cost
        cut[j] = int(np.argmin(costs))
        best[j] = costs[cut[j]]
    bounds, j = [], len(values)
    while j > 0:  # the longest lengths first
        bounds.append(int(values[cut[j]]))  # the shortest length of that forward
        j = int(cut[j])
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep their row order
    groups, start = [], 0
    for low in bounds:
        end = start
        while end < len(order) and lengths[order[end]] >= low:
            end += 1
        groups.append(order[start:end])
        start = end
    return groups


# Keys of the padded batch that are (rows, completion tokens) or (rows, prompt tokens) shaped.
COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "advantages",
    "tool_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
# Signals in the padded batch: a per-token signal NAME is `signal/NAME` (rows, completion tokens); a prompt-shaped one
# is `prompt_signal/NAME/ids` and `prompt_signal/NAME/mask` (rows, its own prompt width, left-padded).
TOKEN_SIGNAL_PREFIX = "signal/"
PROMPT_SIGNAL_PREFIX = "prompt_signal/"


def token_signal_key(name: str) -> str:
    return f"{TOKEN_SIGNAL_PREFIX}{name}"


def prompt_signal_keys(name: str) -> tuple[str, str]:
    return f"{PROMPT_SIGNAL_PREFIX}{name}/ids", f"{PROMPT_SIGNAL_PREFIX}{name}/mask"


def split_rows(batch: dict, num_chunks: int) -> list[dict]:
    """Split a padded batch into `num_chunks` micro-batches whose sizes differ by at most one row.

    Unlike TRL's `split_tensor_dict`, which floors the chunk size and silently drops the remainder, every row lands
    in exactly one chunk (step rows vary in number from one rollout to the next). Each chunk is trimmed to its own
    longest prompt and completion, so short rows do not pay for the longest row of the whole batch.
    """
    num_rows = batch["prompt_ids"].shape[0]
    if num_rows < num_chunks:
        raise ValueError(f"cannot split {num_rows} rows into {num_chunks} non-empty micro-batches")
    base, extra = divmod(num_rows, num_chunks)
    chunks, start = [], 0
    for index in range(num_chunks):
        stop = start + base + (1 if index < extra else 0)
        chunk = {}
        for key, value in batch.items():
            is_rows = value is not None and (isinstance(value, list) or getattr(value, "ndim", 0) > 0)
            chunk[key] = value[start:stop] if is_rows else value
        chunks.append(_trim_padding(chunk))
        start = stop
    return chunks


def _trim_padding(chunk: dict) -> dict:
    # At least one column: a chunk of loss-masked filler rows (see AgentGRPOTrainer._pad_rows) keeps its shape.
    prompt_width = max(int(chunk["prompt_mask"].sum(dim=1).max()), 1)
    completion_width = max(int(chunk["completion_mask"].sum(dim=1).max()), 1)
    for key in PROMPT_KEYS:  # prompts are left-padded
        chunk[key] = chunk[key][:, chunk[key].shape[1] - prompt_width :]
    completion_keys = [*COMPLETION_KEYS, *(k for k in chunk if k.startswith(TOKEN_SIGNAL_PREFIX))]
    for key in completion_keys:  # completions are right-padded
        value = chunk.get(key)
        if value is not None and getattr(value, "ndim", 0) == 2 and value.shape[1] > 1:
            chunk[key] = value[:, :completion_width]
    for key in [k for k in chunk if k.startswith(PROMPT_SIGNAL_PREFIX) and k.endswith("/mask")]:
        ids_key = key[: -len("/mask")] + "/ids"
        width = max(int(chunk[key].sum(dim=1).max()), 1)
        for name in (ids_key, key):  # left-padded like prompts
            chunk[name] = chunk[name][:, chunk[name].shape[1] - width :]
    return chunk
