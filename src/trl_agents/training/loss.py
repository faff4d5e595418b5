"""Stage 6, loss: the pieces of the training loss around TRL's own (docs/concepts/training_loop.md#loss).

* `loss_chunks` cuts a micro-batch over the token budget `max_tokens_per_forward` into row chunks with their weight
  in TRL's loss (`CHUNK_WEIGHTS`), and `backward_in_parts` back-propagates every part but the last at once, without
  gradient synchronisation, so that the gradients add up to those of the whole (also IB-RL's one loss per role);
* `batch_token_mean` aggregates an auxiliary loss as TRL's "dapo" loss does (over the whole generation batch);
* `importance_sampling_ratio` / `importance_sampling_metrics`: TRL's vLLM importance-sampling correction and its
  `sampling/` metrics, over the trained tokens only;
* `attribute_set`: a setting changed for one loss call (TRL reads `use_vllm`, `epsilon_low/high` per call).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from trl.trainer.utils import nanmax, nanmin

from .batch import loss_mask
from .forward import rows_per_forward

# How TRL normalises each loss type over a micro-batch, so that row chunks of it add up to its loss: "global" loss
# types divide by the generation batch's token count (additive as they are), "rows" ones average over the rows
# (a chunk weighs its share of the rows), "tokens" over the loss tokens (its share of the tokens).
CHUNK_WEIGHTS = {"dapo": "global", "cispo": "global", "vespo": "global", "grpo": "rows", "sapo": "rows",
                 "dr_grpo": "rows", "luspo": "rows", "bnpo": "tokens"}
# TRL's importance-sampling modes (GRPOConfig.vllm_importance_sampling_mode); also the behaviour weight's modes.
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def loss_chunks(
    inputs: dict[str, Any], max_tokens: int | None, loss_type: str, width: int | None = None
) -> list[tuple[dict[str, Any], float]]:
    """A micro-batch's row chunks of at most `max_tokens` padded tokens each (rows × `width`, by default the
    micro-batch's own), with the weight of each in TRL's loss (`CHUNK_WEIGHTS`); one chunk of weight 1 when it
    fits. Tensors whose first dimension is the row count are cut; the rest (e.g. `num_items_in_batch`) is shared.

    >>> import torch
    >>> batch = {"prompt_ids": torch.zeros(5, 3), "completion_ids": torch.zeros(5, 2),
    ...          "completion_mask": torch.tensor([[1, 1]] * 4 + [[1, 0]]), "num_items_in_batch": torch.tensor(9)}
    >>> [(len(c["prompt_ids"]), round(w, 3)) for c, w in loss_chunks(batch, 20, "grpo")]  # 4 rows of 5 tokens
    [(4, 0.8), (1, 0.2)]
    >>> [round(w, 3) for _, w in loss_chunks(batch, 20, "bnpo")], [w for _, w in loss_chunks(batch, 20, "dapo")]
    ([0.889, 0.111], [1.0, 1.0])
    """
    rows = inputs["prompt_ids"].size(0)
    width = width or inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
    step = rows_per_forward(rows, width, max_tokens)
    if step >= rows:
        return [(inputs, 1.0)]
    kind = CHUNK_WEIGHTS.get(loss_type)
    if kind is None:
        raise ValueError(f"max_tokens_per_forward cannot split the loss of loss_type={loss_type!r}: use one of "
                         f"{', '.join(CHUNK_WEIGHTS)}, or max_tokens_per_forward=None")
    mask = loss_mask(inputs).float()
    tokens = float(mask.sum())
    chunks = []
    for start in range(0, rows, step):
        end = min(start + step, rows)
        chunk = {key: value[start:end] if torch.is_tensor(value) and value.dim() > 0 and value.size(0) == rows
                 else value for key, value in inputs.items()}
        if kind == "global":
            weight = 1.0
        elif kind == "rows":
            weight = (end - start) / rows
        else:
            weight = float(mask[start:end].sum()) / tokens if tokens > 0 else (end - start) / rows
        chunks.append((chunk, weight))
    return chunks


def common_width(inputs: dict[str, Any], budget: int | None, accelerator) -> int | None:
    """The widest micro-batch of every process (prompt + completion columns), for `loss_chunks` to cut the same
    chunks on every process: TRL's loss gathers per-row statistics in every call, and the processes' micro-batches
    have as many rows but may be padded to different widths. None with one process or no budget."""
    if budget is None or accelerator.num_processes == 1:
        return None
    local = inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
    return int(accelerator.gather(torch.tensor([local], device=accelerator.device)).max())


def backward_in_parts(parts: Sequence[Any], loss_of: Callable[[int, Any], torch.Tensor], accelerator, model,
                      backward: bool, scale: float = 1.0) -> torch.Tensor:
    """The summed loss of `parts` (`loss_of(index, part)` each), for one backward: with `backward`, every part but
    the last is back-propagated here (its loss times `scale`, the factor the Trainer applies to the loss it gets),
    without gradient synchronisation, and the last part's loss is returned with the earlier values added as a
    constant, so that the Trainer's backward of it completes gradients equal to those of the whole."""
    done = torch.zeros((), device=accelerator.device)
    loss = done
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if backward and not last:
            with accelerator.no_sync(model):  # the last part's backward synchronises them all
                loss = loss_of(index, part)
                accelerator.backward(loss * scale if scale != 1.0 else loss)
            done = done + loss.detach()
        else:
            loss = loss_of(index, part)
            if not last:
                done = done + loss.detach()
    return loss + done


def batch_token_mean(values: torch.Tensor, mask: torch.Tensor, num_items_in_batch: torch.Tensor, num_processes: int,
                     steps_per_generation: int | None) -> torch.Tensor:
    """An auxiliary loss aggregated as TRL's "dapo" loss: Σ values·mask over this micro-batch divided by the loss
    tokens of the whole generation batch on every process (`num_items_in_batch`, split over the `num_processes` and,
    in training, the `steps_per_generation` micro-batches), so that over the micro-batches and processes of a
    generation batch it adds up to the token mean over all of them. Masked positions may hold NaN (not read)."""
    total = torch.where(mask.bool(), values, torch.zeros_like(values)).sum()
    normalizer = num_items_in_batch.clamp(min=1.0) / num_processes
    if steps_per_generation is not None:
        normalizer = normalizer / steps_per_generation
    return total / normalizer


def add_importance_sampling_ratio(output: dict[str, Any], mode: str, clip_min: float | None, clip_max: float | None,
                                  gather: Callable[[torch.Tensor], torch.Tensor],
                                  changed_name: str | None = None) -> dict[str, float]:
    """TRL's vLLM importance-sampling correction (grpo_trainer.py in TRL 1.16) into `output`: the ratio between the
    trainer's and the engine's probability of the sampled tokens (`old_per_token_logps`, `sampling_per_token_logps`),
    per token or per row, truncated or masked, over the trained tokens only (environment tokens of conversation rows
    excluded), as `importance_sampling_ratio`; returns TRL's `sampling/` metrics, plus, as `changed_name`, the share
    of trained tokens whose weight the bounds changed (truncated or masked; `changed_fraction`)."""
    old, sampled = output["old_per_token_logps"], output["sampling_per_token_logps"]
    mask = loss_mask(output)
    ratio = importance_sampling_ratio(old, sampled, mask, mode, clip_min, clip_max)
    output["importance_sampling_ratio"] = ratio
    metrics = importance_sampling_metrics(old, sampled, ratio, mask, gather)
    if changed_name is not None:
        changed, total = changed_fraction(old, sampled, mask, mode, clip_min, clip_max)
        metrics[changed_name] = (gather(changed).sum() / gather(total).sum().clamp(min=1)).item()
    return metrics


def changed_fraction(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                     clip_min: float | None, clip_max: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(trained tokens whose importance weight lies outside [clip_min, clip_max], so truncation or masking changed
    it; trained tokens), as 0-d tensors. In `sequence_*` modes a row's tokens count together.

    Example: weights e^0.2 = 1.22 and e^1 = 2.72 against C = 2 (and a NaN, uncorrected, token):
        >>> old, sampled = torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[-1.2, -2.0, float("nan")]])
        >>> changed_fraction(old, sampled, torch.ones(1, 3), "token_truncate", None, 2.0)
        (tensor(1.), tensor(3.))
    """
    mask = mask.float()
    outside = _out_of_bounds(_unbounded_ratio(old_logps, sampling_logps, mask, mode), clip_min, clip_max)
    return (outside.expand_as(mask).float() * mask).sum(), mask.sum()


def importance_sampling_metrics(old: torch.Tensor, sampled: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor,
                                gather: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """TRL's `sampling/` metrics of the vLLM correction over the trained tokens (`mask`), from every process
    (`gather`: one value per process)."""
    mask = mask.bool()
    delta = torch.abs(old - sampled)
    delta = delta[mask & ~torch.isnan(delta)]  # tokens vLLM could not score are left out, not counted as 0
    ratios = ratio.flatten() if ratio.shape[1] == 1 else ratio[mask]

    def gathered(values: torch.Tensor, statistic) -> torch.Tensor:  # one value per process
        return gather(statistic(values) if values.numel() else torch.zeros((), device=old.device))

    return {
        "sampling/sampling_logp_difference/mean": gathered(delta, torch.mean).mean().item(),
        "sampling/sampling_logp_difference/max": gathered(delta, torch.max).max().item(),
        "sampling/importance_sampling_ratio/min": nanmin(gathered(ratios, torch.min)).item(),
        "sampling/importance_sampling_ratio/mean": gathered(ratios, torch.mean).nanmean().item(),
        "sampling/importance_sampling_ratio/max": nanmax(gathered(ratios, torch.max)).item(),
    }


def importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL 1.16's vLLM importance-sampling ratio exp(old - sampling) over the `mask`ed tokens.

    `token_*` modes give one ratio per token, (B, T); `sequence_*` modes one per row from the summed log-ratio, (B, 1).
    `*_truncate` clamps to [clip_min, clip_max]; `*_mask` zeroes ratios outside it (None = unbounded). A NaN sampling
    log-prob (the engine could not score the token) contributes a zero log-ratio, i.e. no correction.

    Example:
        >>> old, sampled = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, float("nan")]])
        >>> importance_sampling_ratio(old, sampled, torch.ones(1, 2), "token_truncate", None, 3.0)
        tensor([[1.6487, 1.0000]])
        >>> importance_sampling_ratio(old, sampled, torch.ones(1, 2), "sequence_mask", None, 1.5)
        tensor([[0.]])
    """
    ratio = _unbounded_ratio(old_logps, sampling_logps, mask, mode)
    if mode in ("token_truncate", "sequence_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode in ("token_mask", "sequence_mask"):
        return ratio.masked_fill(_out_of_bounds(ratio, clip_min, clip_max), 0.0)
    modes = ", ".join(map(repr, IMPORTANCE_SAMPLING_MODES))
    raise ValueError(f"vllm_importance_sampling_mode must be one of {modes}, got {mode!r}")


def _unbounded_ratio(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                     mode: str) -> torch.Tensor:
    """exp(old - sampling) over the masked tokens, before any bound: (B, T) per token, (B, 1) per row in `sequence_*`
    modes; a NaN sampling log-prob contributes a zero log-ratio."""
    log_ratio = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence_"):
        log_ratio = log_ratio.sum(dim=-1, keepdim=True)
    return torch.exp(log_ratio)


def _out_of_bounds(ratio: torch.Tensor, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """Where `ratio` lies outside [clip_min, clip_max] (None = unbounded): what truncation or masking changes."""
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return (ratio < low) | (ratio > high)


@contextlib.contextmanager
def attribute_set(obj: Any, name: str, value: Any):
    """Set `obj.name = value` for the duration of the block."""
    previous = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, previous)
