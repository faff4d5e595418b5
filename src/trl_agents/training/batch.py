"""Stage 5, batch: training rows as TRL's padded tensors, and the micro-batches of a generation batch
(docs/concepts/training_loop.md#rows).

`pad_rows` pads the ragged rows (prompts left, completions right; per-token signals as `signal/<name>` with NaN
where a token has none, prompt-shaped ones as `prompt_signal/<name>/ids|mask`) and adds filler rows so that every
micro-batch is non-empty and every process holds as many rows; `split_rows` cuts the batch into micro-batches without
dropping a row (TRL's `split_tensor_dict` floors); `loss_mask` is the trained tokens of a micro-batch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from trl.trainer.utils import pad

from .rows import TrainingRows
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


def loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    """The trained tokens of a micro-batch: the completion mask without environment tokens (conversation rows)."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def pad_rows(rows: TrainingRows, *, num_chunks: int, pad_token_id: int | None, conversation: bool,
             accelerator) -> dict[str, Any]:
    """The padded batch of `rows` on `accelerator`'s device, with at least `num_chunks` rows and as many on every
    process (filler rows: copies of row 0 with a zero loss mask).

    Fillers make up for two things: a rollout with fewer rows than micro-batches (e.g. most episodes crashed), so that
    every micro-batch is non-empty; and processes whose rollouts gave different numbers of step rows, so that every
    process has as many rows in each micro-batch: TRL's loss gathers per-row statistics (clip ratios) across
    processes, which needs equal shapes. Fillers change neither the loss nor `num_items_in_batch`."""
    device = accelerator.device
    num_rows = max(len(rows), num_chunks)
    if accelerator.num_processes > 1:
        num_rows = int(accelerator.gather(torch.tensor([num_rows], device=device)).max())
    fillers = num_rows - len(rows)
    loss_mask_rows = [1] * len(rows) + [0] * fillers
    pad_id = pad_token_id
    rows = rows.with_fillers(fillers, pad_id if pad_id is not None else 0)

    def padded(values, value, side, dtype):
        return pad([torch.tensor(v, dtype=dtype) for v in values], padding_value=value, padding_side=side).to(
            device
        )

    prompt_ids = padded(rows.prompt_ids, pad_id, "left", torch.long)
    prompt_mask = padded([[1] * len(p) for p in rows.prompt_ids], 0, "left", torch.long)
    completion_ids = padded(rows.completion_ids, pad_id, "right", torch.long)
    completion_mask = padded([[m] * len(c) for c, m in zip(rows.completion_ids, loss_mask_rows)], 0, "right", torch.long)
    output = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": padded(rows.advantages, 0.0, "right", torch.float32),
        "sampling_per_token_logps": padded(rows.sampling_logprobs, 0.0, "right", torch.float32),
    }
    for name, values in rows.token_signals.items():  # NaN where a token has no value (env tokens, padding)
        output[token_signal_key(name)] = padded(values, math.nan, "right", torch.float32)
    for name, values in rows.prompt_signals.items():
        ids_key, mask_key = prompt_signal_keys(name)
        output[ids_key] = padded(values, pad_id, "left", torch.long)
        output[mask_key] = padded([[1] * len(v) for v in values], 0, "left", torch.long)
    if conversation:
        output["tool_mask"] = padded(rows.env_mask, 1, "right", torch.long)
    # Masked copies still count as context but never as loss tokens: make sure they carry no mask either way.
    output["num_items_in_batch"] = accelerator.gather(loss_mask(output).sum()).sum()
    return output


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
    # At least one column: a chunk of loss-masked filler rows (see `pad_rows`) keeps its shape.
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
