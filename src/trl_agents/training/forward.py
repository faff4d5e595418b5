"""Forwards over training rows: the one place that runs the policy on recorded tokens (docs/concepts/training_loop.md).

* `length_groups` / `row_forwards`: the rows of a batch cut into forwards of rows of similar length, each trimmed of
  the padding none of its rows needs (`length_grouped_forwards`), `rows_per_forward` rows at a time under the token
  budget `max_tokens_per_forward`; `grouped_forward` runs TRL's own per-token log-prob forward on those pieces and
  puts every row's values back in place (the trainer's `_get_per_token_logps_and_entropies`).
* `token_logps` (with `policy_logps` for a micro-batch and `sequence_logps` for token lists) / `completion_logits`:
  a completion's log-probs (or logits) after its prompt, with their graph, for losses whose policy loss is skipped
  and for extra sequences (GRSD's reflections).
* `forward_rows` / `reference_model`: the old and reference log-probs of a padded batch, as `GRPOTrainer` computes them.
* `no_gradient_checkpointing`: no-grad forwards (old/reference log-probs, model signals) without the recomputation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

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


def rows_per_forward(rows: int, width: int, max_tokens: int | None) -> int:
    """Rows of `width` padded tokens in one forward: at most `rows`, and at most `max_tokens` tokens (at least one
    row).

    >>> rows_per_forward(16, 100, None), rows_per_forward(16, 100, 450), rows_per_forward(16, 1000, 450)
    (16, 4, 1)
    """
    if max_tokens is None:
        return rows
    return max(1, min(rows, max_tokens // max(width, 1)))


def forward_rows(forward: Callable, output: dict[str, Any], rows: int, max_tokens: int | None, model) -> torch.Tensor:
    """Per-token log-probs (B, T) of the completions of a padded batch `output` under `model`, by `forward` (the
    trainer's `_get_per_token_logps_and_entropies`), `rows_per_forward(rows, width, max_tokens)` rows at a time."""
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    batch_size = rows_per_forward(rows, ids.size(1), max_tokens)
    return forward(model, ids, mask, output["completion_ids"].size(1), batch_size=batch_size)[0]


@contextlib.contextmanager
def reference_model(model, ref_model, accelerator):
    """The reference policy of TRL's KL term: `ref_model`, or with PEFT (no `ref_model`) the policy with its adapter
    disabled, or with the frozen "ref" adapter active when the model has one."""
    if ref_model is not None:
        yield ref_model
        return
    from trl.trainer.utils import use_adapter

    unwrapped = accelerator.unwrap_model(model)
    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
        yield model


def row_forwards(attention_mask: torch.Tensor, logits_to_keep: int, batch_size: int | None, accelerator):
    """The forwards of `grouped_forward`: (rows, first column, end column) each, at most `batch_size` rows; None
    when one forward over every column is what the grouping gives."""
    num_rows, width = attention_mask.shape
    if num_rows < 2:
        return None
    prompt_width = width - logits_to_keep
    columns = torch.arange(width, device=attention_mask.device)
    present = attention_mask.bool()
    first = torch.where(present, columns, width).min(dim=1).values.clamp(max=prompt_width - 1).tolist()
    last = torch.where(present, columns, -1).max(dim=1).values.clamp(min=prompt_width).tolist()
    groups = length_groups([end + 1 - start for start, end in zip(first, last, strict=True)])
    step = batch_size or num_rows
    pieces = [group[i : i + step] for group in groups for i in range(0, len(group), step)]
    if accelerator.num_processes > 1 and torch.is_grad_enabled():
        # DDP synchronises buffers in every forward that records gradients: every process runs as many. The
        # processes hold as many rows (`batch.pad_rows`), so halving the largest pieces always gets there.
        target = int(accelerator.gather(torch.tensor([len(pieces)], device=attention_mask.device)).max())
        while len(pieces) < target:
            largest = max(range(len(pieces)), key=lambda i: len(pieces[i]))
            if len(pieces[largest]) < 2:
                break
            rows = pieces.pop(largest)
            pieces[largest:largest] = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    elif len(pieces) == 1 and min(first) == 0 and max(last) == width - 1:
        return None
    return [(rows, max(min(first[r] for r in rows), 0), max(last[r] for r in rows) + 1) for rows in pieces]


def grouped_forward(forward: Callable, model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    logits_to_keep: int, pieces: Sequence[tuple[list[int], int, int]], compute_entropy: bool):
    """TRL's per-token log-probs (and entropies) of the last `logits_to_keep` tokens of each row, from `forward`
    (TRL's `_get_per_token_logps_and_entropies`) run once per piece of `row_forwards`: each piece is cut to the
    columns its rows use and every row's values are put back in place (0 on the trimmed completion columns, as TRL
    gives on padding). Returns (log-probs, entropies or None, None) as TRL does.

    Why the values are TRL's up to float noise: step rows of different turns differ in length and one forward pads
    them all to the longest; the rows are independent, and cutting the left padding of the prompts and the right
    padding of the completions only shifts their tokens (rotary positions are relative; TRL's own micro-batch
    trimming shifts them the same way). Under DDP the processes cut as many forwards while gradients are recorded
    (every forward synchronises buffers)."""
    logps, entropies = [], []
    for rows, start, end in pieces:
        index = torch.tensor(rows, device=input_ids.device)
        kept = end - (input_ids.size(1) - logits_to_keep)  # completion columns this forward keeps
        piece_logps, piece_entropies, _ = forward(
            model, input_ids[index, start:end], attention_mask[index, start:end], kept,
            compute_entropy=compute_entropy,
        )
        logps.append(torch.nn.functional.pad(piece_logps, (0, logits_to_keep - kept)))
        if compute_entropy:
            entropies.append(torch.nn.functional.pad(piece_entropies, (0, logits_to_keep - kept)))
    order = torch.tensor([row for rows, _, _ in pieces for row in rows], device=input_ids.device)
    back = torch.empty_like(order)
    back[order] = torch.arange(len(order), device=order.device)  # row r is at position back[r] of the pieces
    return torch.cat(logps)[back], torch.cat(entropies)[back] if compute_entropy else None, None


@contextlib.contextmanager
def no_gradient_checkpointing(model, gradient_checkpointing_kwargs: dict | None):
    """The model without gradient checkpointing for the block (no-grad forwards need no recomputation)."""
    from trl.models.utils import disable_gradient_checkpointing

    with disable_gradient_checkpointing(model, gradient_checkpointing_kwargs):
        yield


def completion_logits(model, prompt_ids, prompt_mask, inputs: dict[str, Any]) -> torch.Tensor:
    """(B, T, V) logits of `model` for the micro-batch's completion tokens after the given (left-padded) prompts."""
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_mask)], dim=1)
    width = completion_ids.size(1)
    return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1).logits[:, :-1]


def token_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int,
                temperature: float) -> torch.Tensor:
    """(B, width) log-probs, with their graph, of the last `width` tokens of each row of `input_ids` under `model`,
    at `temperature`: the one forward that the losses needing the policy's log-probs outside TRL's loss share."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1).logits
    logps = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return logps.gather(-1, input_ids[:, input_ids.size(1) - width :].unsqueeze(-1)).squeeze(-1)


def policy_logps(model, inputs: dict[str, Any], temperature: float) -> torch.Tensor:
    """The policy's log-probs of a micro-batch's completion tokens (with their graph), at `temperature`: for a loss
    whose policy loss is skipped, so that TRL's loss did not compute them."""
    completion_ids = inputs["completion_ids"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], torch.ones_like(inputs["completion_mask"])], dim=1)
    return token_logps(model, input_ids, attention_mask, completion_ids.size(1), temperature)


def sequence_logps(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int, temperature: float):
    """(B, T) log-probs of each completion after its prompt (with gradient; prompts left-padded, completions
    right-padded, as TRL lays out rows) and the (B, T) mask of the real completion tokens: token lists that are not
    rows of the batch (GRSD's reflections)."""
    device = next(model.parameters()).device
    width_p, width_c = max(len(p) for p in prompts), max(len(c) for c in completions)
    ids = torch.full((len(prompts), width_p + width_c), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(prompts), width_c), dtype=torch.long)
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        start = width_p - len(prompt)
        ids[row, start : width_p + len(completion)] = torch.tensor(prompt + completion)
        attention[row, start : width_p + len(completion)] = 1
        mask[row, : len(completion)] = 1
    return token_logps(model, ids.to(device), attention.to(device), width_c, temperature), mask.to(device)
