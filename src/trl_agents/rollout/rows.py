"""From recorded episodes to training rows (DESIGN §3.5), and from rows to TRL's padded tensors.

* Step rows (default): one row per turn; prompt = what the policy saw that turn, completion = the action tokens.
  The step's advantage is broadcast over its action tokens.
* Conversation rows: one row per episode; prompt = the first turn's prompt, completion = action 0, the environment's
  reply tokens, action 1, ... with `env_mask` 0 over the environment's tokens (TRL's `tool_mask`), so only the
  actions are trained on; each action's tokens carry their own step's advantage.

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

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..trajectory import Group


@dataclass
class TrainingRows:
    """Ragged training rows (lists, one entry per row), before padding."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    env_mask: list[list[int]] = field(default_factory=list)
    advantages: list[list[float]] = field(default_factory=list)
    sampling_logprobs: list[list[float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompt_ids)


def _token_advantages(value: float | Sequence[float], num_tokens: int) -> list[float]:
    """A step's advantage for each of its action tokens: a scalar is broadcast, a per-token list is checked."""
    if isinstance(value, (int, float)):
        return [float(value)] * num_tokens
    values = [float(v) for v in value]
    if len(values) != num_tokens:
        raise ValueError(f"per-token advantages have {len(values)} values for an action of {num_tokens} tokens")
    return values


def build_rows(
    groups: Sequence[Group], advantages: Sequence[Sequence[Sequence]], row_format: str = "step"
) -> TrainingRows:
    """Training rows of `groups` (healthy trajectories only) with their advantages.

    Args:
        groups: The groups whose trajectories are trained on.
        advantages: `advantages[g][i][t]`, the advantage of step t of trajectory i of group g: a float (broadcast over
            the action tokens) or a list with one value per action token.
        row_format: `"step"` or `"conversation"`.
    """
    rows = TrainingRows()
    for group, group_advantages in zip(groups, advantages, strict=True):
        for trajectory, step_advantages in zip(group.trajectories, group_advantages, strict=True):
            steps = [s for s in trajectory.steps if s.action_ids]
            values = [a for s, a in zip(trajectory.steps, step_advantages, strict=True) if s.action_ids]
            if not steps:
                continue
            if row_format == "step":
                for step, value in zip(steps, values, strict=True):
                    rows.prompt_ids.append(list(step.prompt_ids))
                    rows.completion_ids.append(list(step.action_ids))
                    rows.env_mask.append([1] * len(step.action_ids))
                    rows.advantages.append(_token_advantages(value, len(step.action_ids)))
                    rows.sampling_logprobs.append(list(step.action_logprobs))
            elif row_format == "conversation":
                completion, mask, token_advantages, logprobs = [], [], [], []
                for index, (step, value) in enumerate(zip(steps, values, strict=True)):
                    completion += step.action_ids
                    mask += [1] * len(step.action_ids)
                    token_advantages += _token_advantages(value, len(step.action_ids))
                    logprobs += list(step.action_logprobs)
                    if index < len(steps) - 1:  # the environment's reply: context, not trained on
                        completion += step.env_ids
                        mask += [0] * len(step.env_ids)
                        token_advantages += [0.0] * len(step.env_ids)
                        logprobs += [0.0] * len(step.env_ids)
                rows.prompt_ids.append(list(steps[0].prompt_ids))
                rows.completion_ids.append(completion)
                rows.env_mask.append(mask)
                rows.advantages.append(token_advantages)
                rows.sampling_logprobs.append(logprobs)
            else:
                raise ValueError(f"row_format must be 'step' or 'conversation', got {row_format!r}")
    return rows


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
    for key in COMPLETION_KEYS:  # completions are right-padded
        value = chunk.get(key)
        if value is not None and getattr(value, "ndim", 0) == 2 and value.shape[1] > 1:
            chunk[key] = value[:, :completion_width]
    return chunk
