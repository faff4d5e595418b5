"""Generators: token ids in, token ids + sampling log-probs out.

The rollout engine talks to a model only through the `Generator` protocol, one call per turn for all active
episodes. `TransformersGenerator` runs a transformers model: `model.generate`, or on a GPU a static KV cache decoded
with CUDA graphs (`fast_generation.py`); `VLLMGenerator` (`rollout/vllm.py`) runs TRL's vLLM backend, server or
colocate mode.

Log-probs are those of the sampled tokens under the temperature-scaled logits, `log_softmax(logits / T)`, which is
what TRL's `_get_per_token_logps_and_entropies` computes at training time, so the two are directly comparable.

Example:
    >>> from trl_agents.testing import build_tiny_tokenizer, build_tiny_model
    >>> from trl_agents.rollout.generators import SamplingParams, TransformersGenerator
    >>> tokenizer = build_tiny_tokenizer()
    >>> generator = TransformersGenerator(build_tiny_model(tokenizer), tokenizer)
    >>> out = generator.generate([[1, 5, 6], [1, 7]], SamplingParams(max_new_tokens=4))
    >>> len(out.completion_ids), len(out.completion_ids[0]) == len(out.logprobs[0])
    (2, True)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from ..names import check_choice
from .decoding import cut_at_eos

logger = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    """How to sample one turn.

    Args:
        max_new_tokens: Token budget of one turn (TRL's `max_completion_length`).
        temperature: Softmax temperature (ignored when `greedy`).
        top_p: Nucleus sampling mass (1.0 = off).
        top_k: Keep the k most likely tokens (0 = off).
        min_p: Drop tokens less likely than min_p times the most likely one (None = off).
        repetition_penalty: Penalise tokens already in the context (1.0 = off).
        greedy: Take the arg-max token (evaluation).
    """

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    greedy: bool = False


@dataclass
class GenerationOutput:
    """One completion per prompt: its token ids (ending with an EOS id unless the budget ran out) and their
    sampling log-probs (same lengths)."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]]


@runtime_checkable
class Generator(Protocol):
    """Anything that turns a batch of prompts (token ids) into one sampled completion per prompt.

    Optional members, looked up with `getattr`:

    * `collective` (bool) and `any_active(local: bool) -> bool`: a collective generator (vLLM server mode under
      several processes) must be called by every process the same number of times per turn; the engine then keeps
      calling it, with an empty prompt list where a process has no active episode, while `any_active` (an
      all-reduce of "this process still has an active episode") says so.
    * `sync_weights()`: push the training weights to the inference engine; the trainer calls it once per optimizer
      step, before the first rollout that follows the step.
    * `samples_off_policy` (bool): the generator samples from a copy of the weights (an inference engine), so the
      trainer applies TRL's importance-sampling correction (`vllm_importance_sampling_correction`).
    * `per_request_seeds` (bool): `generate(prompts, sampling, seeds=None)` takes the keyword `seeds`, one int per
      prompt (None: sample as without it). With seeds, the tokens sampled for a prompt depend only on its logits and
      its seed, not on which other prompts are in the call, their order or earlier calls; so where the logits do not
      depend on the batch (e.g. `batch_size=1`), a prompt's completion is the same bit for bit in any batch. Greedy
      decoding ignores seeds.
    * `request_level` (bool) and `submit(prompt_ids, sampling, seed=None) -> concurrent.futures.Future` (resolving
      to a one-row `GenerationOutput`): the generator serves one request at a time and batches them itself (vLLM in
      server mode: continuous batching). Per-episode scheduling (`rollout/scheduler.py`) then sends each episode's
      turn as its own request instead of micro-batching `generate` calls; `close()` releases its threads.
    """

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput: ...


GENERATION_BACKENDS = ("auto", "generate", "static", "paged")


def auto_backend(device) -> str:
    """The backend "auto" picks on `device`: the CUDA-graph fast path on CUDA, plain `model.generate` elsewhere."""
    return "static" if device.type == "cuda" else "generate"


class TransformersGenerator:
    """`Generator` on a transformers causal LM, left-padding prompts into sub-batches.

    Backends (`fast_generation.py` explains the fast ones and why "static" is the default on GPUs):

    * `"generate"`: `model.generate`.
    * `"static"`: a static KV cache whose decode steps replay CUDA graphs on a GPU (eager on CPU); same tokens as
      `"generate"` for the same seed, up to float rounding.
    * `"paged"`: transformers' continuous batching (`model.generate_batch`), TRL's
      `use_transformers_continuous_batching`; temperature-only sampling (see `paged_generate`).
    * `"auto"`: `"static"` on CUDA, `"generate"` elsewhere. If the static path fails (set-up or a call), it logs a
      warning and uses `"generate"` from then on; an explicitly chosen backend raises instead.

    Per-request seeds (`per_request_seeds = True`): `generate(prompts, sampling, seeds=[...])` samples every prompt
    from its own seed by the Gumbel-max rule of `fast_generation.SeededSampler`, on backends "generate" (greedy
    `model.generate` plus a logits processor that applies the sampling warpers, then the seeded noise) and "static"
    (the same rule in its decode loop), so the two give the same tokens for a seed up to float rounding; "paged"
    refuses seeds. Without seeds, sampling draws from torch's global generator as `model.generate` does.

    Args:
        model: The causal LM, or None when `model_context` provides it.
        tokenizer: Gives the pad token id and the EOS id.
        eos_token_ids: Ids that end a turn; defaults to the tokenizer's EOS plus the model's generation-config EOS ids.
        batch_size: Most prompts per generation call (None = all at once).
        model_context: A callable returning a context manager that yields the model to generate with; the trainer
            passes TRL's `unwrap_model_for_generation` here so DeepSpeed/FSDP/PEFT models generate correctly.
        backend: One of `GENERATION_BACKENDS`.
        continuous_batching_config: Keyword arguments of `transformers.ContinuousBatchingConfig` (backend "paged").
    """

    per_request_seeds = True

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] | None = None,
        batch_size: int | None = None,
        model_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        backend: str = "auto",
        continuous_batching_config: dict[str, Any] | None = None,
    ):
        if model is None and model_context is None:
            raise ValueError("TransformersGenerator needs a `model` or a `model_context`")
        if tokenizer is None:
            raise ValueError("TransformersGenerator needs the `tokenizer` (for the pad and EOS token ids)")
        check_choice("backend", backend, GENERATION_BACKENDS)
        self.model = model
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if eos_token_ids is None:
            eos_token_ids = [tokenizer.eos_token_id]
            config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            for token_id in [config_eos] if isinstance(config_eos, int) else config_eos or []:
                if token_id not in eos_token_ids:
                    eos_token_ids.append(token_id)
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.batch_size = batch_size
        self.model_context = model_context or (lambda: contextlib.nullcontext(self.model))
        self.backend = backend
        self.continuous_batching_config = dict(continuous_batching_config or {})
        self.static_decoder = None  # a fast_generation.StaticCacheDecoder, made on first use (it imports torch)
        self.active_backend: str | None = None  # the backend of the last call
        self._static_failed = False

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seeds: Sequence[int] | None = None
    ) -> GenerationOutput:
        import torch

        if seeds is not None:
            if len(seeds) != len(prompts):
                raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
            if self.backend == "paged":
                raise ValueError(
                    "generation backend 'paged' cannot sample with per-request seeds (continuous batching draws from "
                    "one random stream); use backend 'generate' or 'static', or turn off deterministic sampling."
                )
        if not prompts:
            return GenerationOutput([], [])
        step = self.batch_size or len(prompts)
        completion_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        with self.model_context() as model, torch.no_grad():
            was_training = model.training
            model.eval()  # no dropout while sampling
            try:
                for start in range(0, len(prompts), step):
                    batch_seeds = None if seeds is None else seeds[start : start + step]
                    ids, lps = self._generate_batch(model, prompts[start : start + step], sampling, batch_seeds)
                    completion_ids.extend(ids)
                    logprobs.extend(lps)
            finally:
                model.train(was_training)
        return GenerationOutput(completion_ids, logprobs)

    def _resolve_backend(self, model) -> str:
        if self.backend != "auto":
            return self.backend
        if self._static_failed:
            return "generate"
        return auto_backend(next(model.parameters()).device)

    def _generate_batch(self, model, prompts, sampling: SamplingParams, seeds=None):
        from .fast_generation import StaticCacheDecoder, paged_generate

        config = self._generation_config(sampling)
        self.active_backend = backend = self._resolve_backend(model)
        if backend == "paged":
            ids, lps = paged_generate(model, prompts, config, self.continuous_batching_config)
            return cut_at_eos(ids, lps, self.eos_token_ids)
        if backend == "static":
            try:
                if self.static_decoder is None:
                    self.static_decoder = StaticCacheDecoder(self.pad_token_id, self.eos_token_ids)
                return self.static_decoder.generate(model, prompts, config, seeds)
            except Exception:
                if self.backend != "auto":
                    raise
                logger.warning(
                    "The static (CUDA graph) generation backend failed; using model.generate from now on.",
                    exc_info=True,
                )
                self._static_failed = True
                self.static_decoder = None  # frees its caches and graphs
                self.active_backend = "generate"
        return self._plain_generate(model, prompts, config, sampling, seeds)

    def _generation_config(self, sampling: SamplingParams):
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            temperature=None if sampling.greedy else sampling.temperature,
            top_p=None if sampling.greedy else sampling.top_p,
            top_k=None if sampling.greedy else sampling.top_k,
            min_p=None if sampling.greedy else sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )

    def _plain_generate(self, model, prompts, config, sampling: SamplingParams, seeds=None):
        import torch

        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        extra = {}
        if seeds is not None and not sampling.greedy:
            from transformers.generation import LogitsProcessorList

            from .fast_generation import seeded_sampling_processor

            # Greedy search over the warped scores plus each row's Gumbel noise: a seeded sample (see the processor).
            processor = seeded_sampling_processor(model, config, width, device, seeds)
            extra["logits_processor"] = LogitsProcessorList([processor])
            config = self._generation_config(replace(sampling, greedy=True))
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config, **extra
        )
        new_tokens = out.sequences[:, width:]
        # Raw logits, so the log-probs are log_softmax(logits / T) whatever top-k/top-p filtering did (as in TRL).
        logits = torch.stack(out.logits, dim=1).float()
        if not sampling.greedy and sampling.temperature != 1.0:
            logits = logits / sampling.temperature
        token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        return cut_at_eos(new_tokens.tolist(), token_logprobs.tolist(), self.eos_token_ids)
