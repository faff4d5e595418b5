"""EnvRL: next-observation prediction (SP) and inverse dynamics (ID) as auxiliary SFT losses on the RL loss.

EnvRL (Wang et al. 2026, arXiv 2606.17680; docs/methods/envrl.md) reuses every rollout transition (s_t, a_t,
o_{t+1}) as two supervised examples for the policy itself, trained next to GRPO or GiGPO:

    SP (forward model):    input  = s_t (the step's prompt) + a_t (its action ids) + "predict the next observation"
                           target = o_{t+1} (the observation the environment returned)
                           L_SP   = −(1/|o|) Σ_k log π_θ(o_{t+1,k} | s_t, a_t, o_{t+1,<k})
    ID (inverse dynamics): input  = s_t + o_{t+1} + "which action caused this transition?"
                           target = a_t (the very action ids the policy sampled)
                           L_ID   = −(1/|a|) Σ_k log π_θ(a_{t,k} | s_t, o_{t+1}, a_{t,<k})
    L = L_RL + λ_SP(t)·L_SP + λ_ID(t)·L_ID,   λ(t) = λ₀·½(1 + cos(π·t/T_max))   (cosine decay, λ₀ = 0.2 for 1.5B)

The means are token means over every target token of a generation batch (TRL's "dapo" aggregation; the trainer
spreads them over the micro-batches). An example is a (prompt ids, target ids) pair laid out as TRL lays out a
prompt and its completion: the prompt left-padded, the target right-padded after it, and the label mask covering the
target tokens only (`pack_examples`).

Our choices (the paper's text was not available; docs/methods/envrl.md "Our choices"): the instruction wording;
the SP target is o_{t+1}'s tokens truncated to `max_observation_tokens` and closed with the end-of-turn token; the
ID input is the step's user message followed by the (truncated) next observation and the question, rendered as a
fresh chat; at most one SP and one ID example per step, each kept with its own probability; NLL at temperature 1.

Numerical guards: an empty set of examples gives a zero loss (never 0/0); the cosine schedule clamps t to
[0, T_max] and T_max ≤ 0 means a constant λ₀; log-softmax is taken in float32.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..trajectory import Step, Trajectory

SP_INSTRUCTION = "Predict the next observation: reply with the observation the environment shows after your action."
ID_INSTRUCTION = "Which action caused this transition? Reply with that action only."
ID_TEMPLATE = "{prompt}\n\nNext observation:\n{next_observation}\n\n{instruction}"
"""Our wording. `{prompt}` is the user message of s_t, `{next_observation}` the (truncated) o_{t+1}."""
SCHEDULES = ("cosine", "linear", "constant")


def schedule_coefficient(step: float, total_steps: float, initial: float, schedule: str = "cosine") -> float:
    """λ(t): the weight of an auxiliary loss at optimizer step t of T_max.

    cosine (EnvRL): λ₀·½(1 + cos(π·t/T_max)); linear: λ₀·(1 − t/T_max); constant: λ₀. t is clamped to [0, T_max];
    T_max ≤ 0 (unknown) gives λ₀.

    >>> [round(schedule_coefficient(t, 100, 0.2), 6) for t in (0, 50, 100)]  # λ₀ = 0.2 at t = 0, T/2, T
    [0.2, 0.1, 0.0]
    >>> round(schedule_coefficient(25, 100, 0.2), 6)  # 0.1·(1 + cos(π/4)) = 0.1·1.707107
    0.170711
    >>> schedule_coefficient(50, 100, 0.2, "linear"), schedule_coefficient(50, 100, 0.2, "constant")
    (0.1, 0.2)
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {schedule!r}")
    if not math.isfinite(initial):
        raise ValueError(f"the initial coefficient λ₀ must be finite, got {initial}")
    if schedule == "constant" or not total_steps or total_steps <= 0:
        return float(initial)
    progress = min(max(float(step) / float(total_steps), 0.0), 1.0)  # t/T_max in [0, 1]
    if schedule == "linear":
        return float(initial) * (1.0 - progress)
    return float(initial) * 0.5 * (1.0 + math.cos(math.pi * progress))  # λ₀·½(1 + cos(π t/T_max))


@dataclass
class Example:
    """One auxiliary SFT example: `prompt_ids` (context, never trained on) then `target_ids` (the labels).

    `kind` is `"sp"` (state prediction) or `"id"` (inverse dynamics)."""

    prompt_ids: list[int]
    target_ids: list[int]
    kind: str


def next_observation(trajectory: Trajectory, index: int) -> str | None:
    """o_{t+1} of step `index`: `Step.next_observation`, the observation the environment returned after the action
    (for the last step, the terminal observation). None when the step has none (a failed step, a step rebuilt from
    records that predate the field): such a step gets no example."""
    value = trajectory.steps[index].next_observation
    return None if value is None else str(value)


def truncated_ids(tokenizer: Any, text: str, max_tokens: int | None) -> list[int]:
    """`text`'s token ids (no special tokens), the first `max_tokens` of them when a limit is given."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return ids if max_tokens is None else ids[:max_tokens]


def _with_eos(ids: Sequence[int], eos_token_id: int | None) -> list[int]:
    ids = list(ids)
    if eos_token_id is not None and (not ids or ids[-1] != eos_token_id):
        ids.append(eos_token_id)
    return ids


def sp_example(step: Step, observation: str, renderer: Any, *, instruction: str = SP_INSTRUCTION,
               max_observation_tokens: int | None = 1024) -> Example:
    """The SP example of a step: prompt = s_t + a_t + the instruction as the next user turn; target = o_{t+1}.

    The prompt is built from the recorded ids, never re-tokenised: the step's prompt, its action (closed with EOS if
    generation stopped early), and the tokens the chat template puts after an assistant turn for a user message
    holding `instruction` (`PromptRenderer.env_turn_ids`), so it works for step and conversation rows alike. The
    target is o_{t+1}'s first `max_observation_tokens` tokens plus the end-of-turn token.
    """
    tokenizer = renderer.tokenizer
    eos = tokenizer.eos_token_id
    prompt = list(step.prompt_ids) + _with_eos(step.action_ids, eos) + renderer.env_turn_ids(instruction)
    target = _with_eos(truncated_ids(tokenizer, observation, max_observation_tokens), eos)
    return Example(prompt, target, "sp")


def id_example(step: Step, observation: str, renderer: Any, *, row_format: str = "step",
               instruction: str = ID_INSTRUCTION, max_observation_tokens: int | None = 1024) -> Example:
    """The ID example of a step: prompt = s_t's user message + o_{t+1} + the question, as a fresh chat (the step's
    system message first); target = a_t's recorded ids.

    In step format s_t's user message is the one the policy saw (task, history window, observation); in
    conversation format it is the task and the current observation (a conversation's history is not re-rendered).
    """
    tokenizer = renderer.tokenizer
    parts = step.prompt_parts
    system, task, history = (parts.system, parts.task, parts.history) if parts is not None else ("", "", ())
    if row_format != "step":
        history = ()
    user = renderer.step_user_message(task, history, step.observation)
    shown = tokenizer.decode(truncated_ids(tokenizer, observation, max_observation_tokens))
    content = ID_TEMPLATE.format(prompt=user, next_observation=shown, instruction=instruction)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return Example(renderer.messages_ids(messages), list(step.action_ids), "id")


def build_step_examples(
    trajectory: Trajectory,
    index: int,
    renderer: Any,
    *,
    rng: random.Random,
    sp_fraction: float = 1.0,
    id_fraction: float = 1.0,
    row_format: str = "step",
    max_observation_tokens: int | None = 1024,
    sp_instruction: str = SP_INSTRUCTION,
    id_instruction: str = ID_INSTRUCTION,
) -> tuple[Example | None, Example | None]:
    """(SP example or None, ID example or None) of step `index`: at most one of each, each kept with probability
    `sp_fraction` / `id_fraction` (0 turns it off). None for both when the step has no o_{t+1} or no action."""
    step = trajectory.steps[index]
    observation = next_observation(trajectory, index)
    if observation is None or not step.action_ids:
        return None, None
    sp = id_ = None
    if sp_fraction > 0 and (sp_fraction >= 1 or rng.random() < sp_fraction):
        sp = sp_example(step, observation, renderer, instruction=sp_instruction,
                        max_observation_tokens=max_observation_tokens)
    if id_fraction > 0 and (id_fraction >= 1 or rng.random() < id_fraction):
        id_ = id_example(step, observation, renderer, row_format=row_format, instruction=id_instruction,
                         max_observation_tokens=max_observation_tokens)
    return sp, id_


def shuffle_targets(examples: Sequence[Example], rng: random.Random) -> list[Example]:
    """The placebo of the Dark Room study: the same examples with their targets permuted across them (each prompt
    gets another example's target; a random permutation, so a target may stay in place by chance).

    >>> examples = [Example([1], [10], "sp"), Example([2], [20], "sp"), Example([3], [30], "sp")]
    >>> shuffled = shuffle_targets(examples, random.Random(0))
    >>> sorted(e.target_ids[0] for e in shuffled), [e.prompt_ids[0] for e in shuffled]
    ([10, 20, 30], [1, 2, 3])
    """
    targets = [list(e.target_ids) for e in examples]
    rng.shuffle(targets)
    return [Example(list(e.prompt_ids), t, e.kind) for e, t in zip(examples, targets, strict=True)]


def pack_examples(examples: Sequence[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Pad examples as TRL pads prompts and completions: prompts left-padded, targets right-padded.

    Returns `prompt_ids`, `prompt_mask` (E, P) and `target_ids`, `target_mask` (E, T); `input_ids` /
    `attention_mask` (E, P + T) are their concatenation and `labels_mask` (E, P + T) is 1 on target tokens only.

    >>> packed = pack_examples([Example([5, 6, 7], [8], "sp"), Example([5], [9, 9], "id")], pad_token_id=0)
    >>> packed["input_ids"].tolist()
    [[5, 6, 7, 8, 0], [0, 0, 5, 9, 9]]
    >>> packed["labels_mask"].tolist()
    [[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    """
    if not examples:
        raise ValueError("pack_examples needs at least one example")
    prompt_width = max(len(e.prompt_ids) for e in examples)
    target_width = max(max(len(e.target_ids) for e in examples), 1)
    size = len(examples)
    prompt_ids = torch.full((size, prompt_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((size, prompt_width), dtype=torch.long)
    target_ids = torch.full((size, target_width), pad_token_id, dtype=torch.long)
    target_mask = torch.zeros((size, target_width), dtype=torch.long)
    for row, example in enumerate(examples):
        p, t = len(example.prompt_ids), len(example.target_ids)
        if p:
            prompt_ids[row, prompt_width - p :] = torch.tensor(example.prompt_ids, dtype=torch.long)
            prompt_mask[row, prompt_width - p :] = 1
        if t:
            target_ids[row, :t] = torch.tensor(example.target_ids, dtype=torch.long)
            target_mask[row, :t] = 1
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "target_ids": target_ids,
        "target_mask": target_mask,
        "input_ids": torch.cat([prompt_ids, target_ids], dim=1),
        "attention_mask": torch.cat([prompt_mask, target_mask], dim=1),
        "labels_mask": torch.cat([torch.zeros_like(prompt_mask), target_mask], dim=1),
    }


def target_token_nll(logits: torch.Tensor, target_ids: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Per-token NLL −log softmax(logits)[target] (E, T), 0 on masked positions.

    `logits[:, k]` must be the prediction of `target_ids[:, k]` (the logits at the position before it). A position
    whose log-prob is not finite on a masked slot is zeroed, not propagated.

    >>> logits = torch.full((1, 2, 4), -1e4); logits[0, 0, 2] = 0.0; logits[0, 1, 3] = 0.0   # all mass on 2, 3
    >>> target_token_nll(logits, torch.tensor([[2, 3]]), torch.tensor([[1, 1]])).tolist()
    [[0.0, 0.0]]
    """
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    keep = target_mask.bool()
    return torch.where(keep, torch.zeros_like(logps) - logps, torch.zeros_like(logps))  # −log π(target)


def example_nll(model, packed: dict[str, torch.Tensor]) -> torch.Tensor:
    """(E, T) per-target-token NLL of `model` on packed examples (one forward, with gradient; only the targets'
    logits are kept)."""
    width = packed["target_ids"].size(1)
    output = model(input_ids=packed["input_ids"], attention_mask=packed["attention_mask"], logits_to_keep=width + 1)
    logits = output.logits[:, :-1]  # the logit at position j predicts token j + 1: the targets' predictions
    return target_token_nll(logits, packed["target_ids"], packed["target_mask"])


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ values·mask / Σ mask; 0 (not NaN) when the mask is empty.

    >>> token_mean(torch.tensor([[1.0, 3.0]]), torch.tensor([[1, 0]])), token_mean(torch.ones(1, 2), torch.zeros(1, 2))
    (tensor(1.), tensor(0.))
    """
    keep = mask.bool()
    total = torch.where(keep, values, torch.zeros_like(values)).sum()
    return total / keep.sum().clamp(min=1)
