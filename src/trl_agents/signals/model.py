"""Built-in model signals: batched no-grad forward passes over a rollout's recorded tokens.

| name               | value on each step (its own steps: a shared tree prefix is scored once, by its owner)           |
|--------------------|--------------------------------------------------------------------------------------------------|
| `teacher_logprobs` | log π_T(a_k | privileged prompt, a_<k) for every action token, at the training temperature     |
| `teacher_prompt`   | the token ids of that privileged prompt (for losses that run the teacher themselves, OPSD's JSD)  |
| `entropy`          | H(π_θ(· | prompt, a_<k)) for every action token, at the training temperature                      |
| `hidden_states`    | the pooled output of one decoder layer over the step prompt (a float32 tensor; not recorded)      |

Scoring units follow the row format. Step rows: one unit per step, (its prompt or teacher prompt, its action ids).
Conversation rows: one unit per episode, (its first prompt or teacher prompt, every action and environment reply
after it), so an episode costs one forward however many turns it has; the action tokens' values are cut out of it.
Units are sorted by length and forwarded in chunks of at most `max_rows_per_forward` rows and
`max_tokens_per_forward` padded tokens, so memory stays bounded whatever the horizon; only the continuation's logits
are kept (`logits_to_keep`), and log-probs are `log_softmax(logits / T)`, what TRL computes for the loss.

Example:
    >>> from trl_agents.signals import get_signal
    >>> get_signal("teacher_logprobs", source="task:answer").requires()
    ()
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..trajectory import Group, Step, Trajectory, first_occurrences
from .base import ModelSignal, register_signal
from .teachers import Teacher
from .views import DEFAULT_TEMPLATE, PrivilegedSource, PrivilegedView

HIDDEN_STATE_SOURCES = ("rollout", "forward")
POOLINGS = ("last_token", "mean")


@dataclass
class ModelSignalContext:
    """What model signals need from the trainer.

    Args:
        model_context: Yields the policy (unwrapped) for no-grad forwards: the trainer's generation context.
        renderer: The rollout's `PromptRenderer` (privileged views render with it).
        row_format: `"step"` or `"conversation"`.
        pad_token_id: Padding id of the tokenizer.
        temperature: Log-probs and entropies are those of `softmax(logits / temperature)` (the training temperature).
        max_rows_per_forward: Rows per forward at most.
        max_tokens_per_forward: Padded tokens (rows × width) per forward at most; None = no token limit. A unit longer
            than the budget is forwarded alone.
        teacher: The teacher of `teacher_logprobs` (`signals.teachers`).
    """

    model_context: Callable[[], contextlib.AbstractContextManager]
    renderer: Any
    row_format: str = "step"
    pad_token_id: int = 0
    temperature: float = 1.0
    max_rows_per_forward: int = 8
    max_tokens_per_forward: int | None = None
    teacher: Teacher | None = None


# ---- scoring units and the batched forward ----------------------------------------------------------------------


@dataclass
class ScoringUnit:
    """One forward row: `prefix` (a prompt), then `continuation`, whose tokens are scored; `spans[i] = (start, end,
    step)` says which continuation tokens are the action of `step`."""

    prefix: list[int]
    continuation: list[int]
    spans: list[tuple[int, int, Step]]


def scoring_units(
    groups: Sequence[Group],
    row_format: str,
    prefix_fn: Callable[[Trajectory, int], list[int]] | None = None,
) -> list[ScoringUnit]:
    """The units of the steps the training rows hold (each step of a tree once, with the first path that holds it:
    `trajectory.first_occurrences`), in row order.

    `prefix_fn(trajectory, step_index)` replaces the recorded prompt (a privileged view); step rows call it for every
    step, conversation rows for the first step of each episode's row."""
    units = []
    for trajectory, indices in first_occurrences(groups):
        steps = [(index, trajectory.steps[index]) for index in indices if trajectory.steps[index].action_ids]
        if not steps:
            continue
        if row_format == "step":
            for index, step in steps:
                prefix = prefix_fn(trajectory, index) if prefix_fn else list(step.prompt_ids)
                units.append(ScoringUnit(prefix, list(step.action_ids), [(0, len(step.action_ids), step)]))
            continue
        index0, step0 = steps[0]
        prefix = prefix_fn(trajectory, index0) if prefix_fn else list(step0.prompt_ids)
        continuation, spans = [], []
        for position, (_, step) in enumerate(steps):
            spans.append((len(continuation), len(continuation) + len(step.action_ids), step))
            continuation += step.action_ids
            if position < len(steps) - 1:
                continuation += step.env_ids
        units.append(ScoringUnit(prefix, continuation, spans))
    return units


def chunks(lengths: Sequence[tuple[int, int]], max_rows: int, max_tokens: int | None) -> list[list[int]]:
    """Unit indices grouped into forwards: sorted by length, at most `max_rows` rows and `max_tokens` padded tokens
    (rows × (widest prefix + widest continuation)) each; a unit over the token budget goes alone.

    >>> chunks([(3, 1), (10, 2), (4, 1)], max_rows=8, max_tokens=15)
    [[0, 2], [1]]
    """
    order = sorted(range(len(lengths)), key=lambda i: sum(lengths[i]))
    out, current, width_p, width_c = [], [], 0, 0
    for index in order:
        prefix, continuation = lengths[index]
        new_p, new_c = max(width_p, prefix), max(width_c, continuation)
        over = max_tokens is not None and (len(current) + 1) * (new_p + new_c) > max_tokens
        if current and (len(current) >= max_rows or over):
            out.append(current)
            current, new_p, new_c = [], prefix, continuation
        current.append(index)
        width_p, width_c = new_p, new_c
    if current:
        out.append(current)
    return out


@torch.no_grad()
def score_units(
    model,
    units: Sequence[ScoringUnit],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    entropy: bool = False,
    max_rows: int = 8,
    max_tokens: int | None = None,
) -> list[tuple[list[float], list[float] | None]]:
    """Per unit: the log-probs of its continuation tokens (and their entropies when `entropy`) under `model`.

    Prefixes are left-padded and continuations right-padded, as TRL lays out prompt + completion; the model is put
    in eval mode for the forward (no dropout) and restored.
    """
    results: list[tuple[list[float], list[float] | None]] = [([], None)] * len(units)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for chunk in chunks([(len(u.prefix), len(u.continuation)) for u in units], max_rows, max_tokens):
            width_p = max(len(units[i].prefix) for i in chunk)
            width_c = max(len(units[i].continuation) for i in chunk)
            input_ids = torch.full((len(chunk), width_p + width_c), pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for row, index in enumerate(chunk):
                unit = units[index]
                start = width_p - len(unit.prefix)
                input_ids[row, start : width_p + len(unit.continuation)] = torch.tensor(
                    unit.prefix + unit.continuation, dtype=torch.long
                )
                mask[row, start : width_p + len(unit.continuation)] = 1
            out = model(input_ids=input_ids.to(device), attention_mask=mask.to(device), logits_to_keep=width_c + 1)
            logits = out.logits[:, :-1].float() / temperature  # position p predicts token p + 1
            logps = torch.log_softmax(logits, dim=-1)
            targets = input_ids[:, width_p:].to(device)
            token_logps = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            # H = −Σ p·log p, with 0·log 0 = 0 (a −inf logit, e.g. a masked vocabulary entry, is a zero-probability token)
            token_entropy = torch.special.entr(logps.exp()).sum(-1) if entropy else None
            for row, index in enumerate(chunk):
                n = len(units[index].continuation)
                results[index] = (
                    token_logps[row, :n].tolist(),
                    token_entropy[row, :n].tolist() if token_entropy is not None else None,
                )
    finally:
        model.train(was_training)
    return results


def assign(units: Sequence[ScoringUnit], values: Sequence[Sequence[float]], name: str) -> None:
    """Put each unit's per-token `values` on its steps: `step.signals[name]` = the values of its action tokens."""
    for unit, unit_values in zip(units, values, strict=True):
        for start, end, step in unit.spans:
            step.signals[name] = [float(v) for v in unit_values[start:end]]


# ---- teacher log-probs under a privileged view -------------------------------------------------------------------


class TeacherPrompt(ModelSignal):
    """The privileged view's prompt ids of each step (conversation rows: of each episode's first own step)."""

    name = "teacher_prompt"
    description = "token ids of the privileged view's prompt (no forward)"
    recorded = False  # prompts are long and derivable: kept off the trajectory records
    layout = "prompt"

    def __init__(self, source: PrivilegedSource = "env", template: str = DEFAULT_TEMPLATE):
        self.source, self.template = source, template

    def view(self, context: ModelSignalContext, groups: Sequence[Group] = ()) -> PrivilegedView:
        if context.row_format == "conversation" and any(t.fork_step for g in groups for t in g.trajectories):
            raise ValueError(
                "A privileged view of conversation rows rewrites an episode's first prompt, but a forked episode's row "
                "starts at its fork (the parent's conversation so far): use row_format='step' with tree topologies."
            )
        return PrivilegedView(context.renderer, self.source, self.template, context.row_format)

    def requires(self) -> tuple[str, ...]:
        return ("privileged_context",) if self.source == "env" else ()

    def compute(self, groups: Sequence[Group], context: ModelSignalContext) -> None:
        view = self.view(context, groups)
        for trajectory, indices in first_occurrences(groups):  # the steps whose rows carry a prompt
            indices = [i for i in indices if trajectory.steps[i].action_ids]
            if context.row_format == "conversation":
                indices = indices[:1]  # the row's first step: its prompt starts the conversation row
            for index in indices:
                trajectory.steps[index].signals[self.name] = view.prompt_ids(trajectory, index)


class TeacherLogprobs(TeacherPrompt):
    """log π_T of every action token under the privileged view, scored by the context's teacher."""

    name = "teacher_logprobs"
    description = "teacher log-probs of the sampled action tokens under a privileged view"
    recorded = True
    layout = "tokens"

    def compute(self, groups: Sequence[Group], context: ModelSignalContext) -> None:
        if context.teacher is None:
            raise ValueError("teacher_logprobs needs a teacher (ModelSignalContext.teacher)")
        view = self.view(context, groups)
        units = scoring_units(groups, context.row_format, view.prompt_ids)
        with context.teacher.context() as model:
            scored = score_units(model, units, pad_token_id=context.pad_token_id, temperature=context.temperature,
                                 max_rows=context.max_rows_per_forward, max_tokens=context.max_tokens_per_forward)
        assign(units, [logps for logps, _ in scored], self.name)


class Entropy(ModelSignal):
    """Per-token entropy of the current policy over each recorded action, at the training temperature."""

    name = "entropy"
    description = "per-token entropy of the policy over the recorded actions"

    def compute(self, groups: Sequence[Group], context: ModelSignalContext) -> None:
        units = scoring_units(groups, context.row_format)
        with context.model_context() as model:
            scored = score_units(model, units, pad_token_id=context.pad_token_id, temperature=context.temperature,
                                 entropy=True, max_rows=context.max_rows_per_forward,
                                 max_tokens=context.max_tokens_per_forward)
        assign(units, [entropies for _, entropies in scored], self.name)


# ---- hidden states of the step prompts ---------------------------------------------------------------------------


class _StopForward(Exception):
    """Raised by the layer hook of the extra forward: nothing above the chosen layer is needed."""


def decoder_layers(model) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """(backbone, its decoder layers) of a causal LM, a PEFT-wrapped one included."""
    if hasattr(model, "get_base_model"):  # PEFT
        model = model.get_base_model()
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for name in ("layers", "h", "blocks"):
        layers = getattr(backbone, name, None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers):
            return backbone, layers
    raise ValueError(
        f"Could not find the decoder layers of {type(model).__name__} (looked for .layers, .h, .blocks on "
        f"{type(backbone).__name__}); hidden states need a decoder-only transformers model."
    )


def pool_hidden(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, S, H) layer output + (B, S) attention mask -> (B, H) float32 state vectors (on the layer's device).

    "last_token": the last position the mask keeps (left or right padding); "mean": the mean over kept positions.

    >>> hidden, mask = torch.arange(12.0).reshape(1, 3, 4), torch.tensor([[0, 1, 1]])  # one left-padded prompt
    >>> pool_hidden(hidden, mask, "last_token").tolist(), pool_hidden(hidden, mask, "mean").tolist()
    ([[8.0, 9.0, 10.0, 11.0]], [[6.0, 7.0, 8.0, 9.0]])
    """
    mask = mask.to(hidden.device)
    if pooling == "last_token":
        positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
        last = torch.where(mask.bool(), positions, torch.zeros_like(positions)).amax(dim=1)
        vectors = hidden[torch.arange(hidden.size(0), device=hidden.device), last].float()
    else:  # a masked sum as one (B, 1, S) x (B, S, H) product (accumulated in float32 on GPUs), then the mean
        weights = mask.to(hidden.dtype).unsqueeze(1)
        vectors = (weights @ hidden).squeeze(1).float() / mask.sum(dim=1, keepdim=True).clamp(min=1).float()
    return vectors.detach()


class PrefillRecorder:
    """Forward hooks that keep, for every prompt of a generation prefill, the pooled output of one decoder layer.

    A backbone call counts as a prefill when it sees whole sequences: 2-D `input_ids` and `attention_mask` of the
    same shape (or no mask and more than one token: unpadded prompts) and an empty KV cache (the decode steps that
    follow see one new token). Vectors are keyed by the
    prompt's token ids (the unmasked ones), which are exactly the `Step.prompt_ids` the rollout records.
    """

    def __init__(self, layer_index: int, pooling: str):
        self.layer_index = layer_index
        self.pooling = pooling
        self.vectors: dict[tuple[int, ...], torch.Tensor] = {}
        self._inputs: tuple[torch.Tensor, torch.Tensor] | None = None

    @contextlib.contextmanager
    def recording(self, model):
        backbone, layers = decoder_layers(model)
        handles = [
            backbone.register_forward_pre_hook(self._see_inputs, with_kwargs=True),
            layers[self.layer_index].register_forward_hook(self._keep_output),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._inputs = None

    def _see_inputs(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        cache = kwargs.get("past_key_values")
        if torch.is_tensor(input_ids) and torch.is_tensor(mask) and mask.dim() == 2 == input_ids.dim():
            # A static-cache prefill (generation_backend="static") passes the mask of the whole cache; the prompt's
            # columns come first.
            mask = mask[:, : input_ids.shape[1]]
        elif torch.is_tensor(input_ids) and input_ids.dim() == 2 and mask is None and input_ids.shape[1] > 1:
            # Prompts of one length have no padding, and `generate` (transformers >= 5.18) then passes no mask; a
            # decode step is one token wide.
            mask = torch.ones_like(input_ids)
        whole = (
            torch.is_tensor(input_ids)
            and torch.is_tensor(mask)
            and input_ids.dim() == 2
            and mask.shape == input_ids.shape
            and (cache is None or not hasattr(cache, "get_seq_length") or cache.get_seq_length() == 0)
        )
        self._inputs = (input_ids, mask) if whole else None

    def _keep_output(self, module, args, output):
        if self._inputs is None:
            return
        input_ids, mask = self._inputs
        self._inputs = None
        hidden = output[0] if isinstance(output, tuple) else output
        vectors = pool_hidden(hidden, mask, self.pooling)
        for ids, keep, vector in zip(input_ids.tolist(), mask.bool().tolist(), vectors, strict=True):
            self.vectors.setdefault(tuple(t for t, k in zip(ids, keep, strict=True) if k), vector)

    def take(self) -> dict[tuple[int, ...], torch.Tensor]:
        vectors, self.vectors = self.vectors, {}
        return vectors


class HiddenStates(ModelSignal):
    """The pooled output of decoder layer `layer` over each step prompt (prompts only, not the actions).

    `source="rollout"` keeps the vectors of the prefill that the trainer's own generator runs on every step prompt
    (no extra forward; prompts it did not see — an external generator such as a vLLM server — take the extra
    forward); `source="forward"` always runs one extra no-grad forward over the prompts, cut right after the layer.
    `stats` holds the last compute's `rollout_fraction` (distinct prompts served by the rollout) and `seconds`.
    """

    name = "hidden_states"
    description = "pooled hidden state of each step prompt at one decoder layer"
    recorded = False  # tensors

    def __init__(self, layer: int = -1, pooling: str = "last_token", source: str = "rollout"):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if source not in HIDDEN_STATE_SOURCES:
            raise ValueError(f"hidden_state_source must be one of {HIDDEN_STATE_SOURCES}, got {source!r}")
        self.layer, self.pooling, self.source = layer, pooling, source
        self.recorder = PrefillRecorder(layer, pooling)
        self.stats: dict[str, float] = {}

    def reset(self) -> None:
        self.recorder.take()

    def capture(self, model):
        return self.recorder.recording(model) if self.source == "rollout" else None

    def compute(self, groups: Sequence[Group], context: ModelSignalContext) -> None:
        start = time.perf_counter()
        recorded = self.recorder.take()
        steps = [t.steps[i] for t, indices in first_occurrences(groups) for i in indices]
        keys = []
        for step in steps:
            if not step.prompt_ids:
                raise ValueError("hidden_states needs every step's prompt_ids")
            keys.append(tuple(step.prompt_ids))
        distinct = list(dict.fromkeys(keys))
        missing = [key for key in distinct if key not in recorded]
        vectors = {key: recorded[key] for key in distinct if key in recorded}
        if missing:
            vectors.update(zip(missing, self.forward(missing, context), strict=True))
        for step, key in zip(steps, keys, strict=True):
            step.signals[self.name] = vectors[key]
        self.stats = {
            "rollout_fraction": (1.0 - len(missing) / len(distinct)) if distinct else 1.0,
            "seconds": time.perf_counter() - start,
        }

    def forward(self, prompts: list[tuple[int, ...]], context: ModelSignalContext) -> list[torch.Tensor]:
        """The extra no-grad forward: pooled outputs of `prompts` at the layer, cut right after it."""
        units = [ScoringUnit(list(prompt), [], []) for prompt in prompts]
        results: list[torch.Tensor | None] = [None] * len(prompts)
        captured: list[torch.Tensor] = []

        def keep_and_stop(module, args, output):
            captured.append(output[0] if isinstance(output, tuple) else output)
            raise _StopForward

        with torch.no_grad(), context.model_context() as model:
            backbone, layers = decoder_layers(model)
            device = next(model.parameters()).device
            handle = layers[self.layer].register_forward_hook(keep_and_stop)
            was_training = model.training
            model.eval()  # as during generation: no dropout
            try:
                lengths = [(len(u.prefix), 0) for u in units]
                for chunk in chunks(lengths, context.max_rows_per_forward, context.max_tokens_per_forward):
                    width = max(len(prompts[i]) for i in chunk)
                    input_ids = torch.full((len(chunk), width), context.pad_token_id, dtype=torch.long)
                    mask = torch.zeros((len(chunk), width), dtype=torch.long)
                    for row, index in enumerate(chunk):  # left padding, as the generator pads
                        input_ids[row, width - len(prompts[index]) :] = torch.tensor(prompts[index])
                        mask[row, width - len(prompts[index]) :] = 1
                    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as `generate` computes them
                    captured.clear()
                    with contextlib.suppress(_StopForward):
                        backbone(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                 position_ids=positions.to(device), use_cache=False)
                    for index, vector in zip(chunk, pool_hidden(captured[0], mask, self.pooling), strict=True):
                        results[index] = vector
            finally:
                handle.remove()
                model.train(was_training)
        return results


register_signal("teacher_logprobs", TeacherLogprobs)
register_signal("teacher_prompt", TeacherPrompt)
register_signal("entropy", Entropy)
register_signal("hidden_states", HiddenStates)
