"""Fast rollout generation on a GPU without vLLM: a static KV cache whose decode step is a replayed CUDA graph.

Why this path. On an H200, `model.generate` on a 0.5B model spends ~75-80 ms per decode step whatever the batch
(64 or 256 sequences; benchmarks/gpu_rollout.py, and "Reference figures on one GPU" in benchmarks/README.md), while
the GPU work of one step (read ~1 GB of weights and the KV cache once) takes well under 1 ms at the chip's memory
bandwidth. The step is bound by Python and kernel launches: 24 layers of ~30 small kernels each, plus cache and mask
book-keeping, issued one after the other from Python. The lever is to stop paying that launch cost on every step:

* CUDA graphs (this module): record the kernels of one decode step once, replay them with a single call. A graph
  replays fixed shapes at fixed addresses, so the KV cache is a transformers `StaticCache` (preallocated, written in
  place), the step's inputs (next token, position, 2D attention mask) live in static buffers, and batches are padded
  to a power of two: one graph per padded batch size, captured in milliseconds the first time that size occurs (no
  compilation). The graph reads the parameters by address, so optimizer updates (in place) are seen without
  recapture; when parameter storage moves (DeepSpeed ZeRO-3 gathers, FSDP summons, another model object) every graph
  is dropped and recaptured.
* `torch.compile(mode="reduce-overhead")` (CUDA graphs plus kernel fusion) was not chosen: compiling a 24-layer model
  takes about a minute and recompiles for every new batch size and cache length, and agent rollouts change both
  every turn as episodes finish.
* transformers' continuous batching (`generate_batch`, what TRL's `use_transformers_continuous_batching` uses) is
  backend "paged" here, for TRL users, not the default: its fast decode path needs the flash-attn package (absent on
  our GPU machine); with SDPA it packs all requests into one sequence, attends over every request's keys with a
  block-diagonal mask (work grows with the square of the batch) and leaves CUDA graphs off because a mask is needed.

Two more things keep the replayed step near the bandwidth floor. Prefill computes logits for the last prompt
position only (`logits_to_keep=1`, as `generate` does). Decoding attends with grouped-query heads folded onto their
KV head (`_grouped_query_sdpa`): transformers' SDPA path copies K and V once per query head whenever a mask is
passed (7x the cache traffic for Qwen2.5-0.5B).

Sampling runs outside the graph and is `generate`'s own: the logits processors come from the same calls `generate`
makes, then softmax + multinomial (or argmax) on the same fp32 logits with one stop check per step, so the same seed
gives the tokens of `model.generate` up to float rounding (tests/rollout/test_fast_generation.py checks it on CPU, where the
same loop runs without graphs). Log-probs are `log_softmax(raw logits / T)` of the sampled token, as in
`TransformersGenerator`.

Per-request seeds (`SeededSampler`, used by both the "static" and the "generate" backend): with one seed per prompt,
sampling draws no random numbers from torch's generators. Each step takes the Gumbel-max rule,

    token = argmax_v (scores[v] + G[v]),    G[v] = -log(-log(1 - U[v])),    U[v] = (h(seed, step, v) + 1/2) / 2**31,

where `scores` are the processed scores `generate` samples from (repetition penalty, then temperature, top-k, top-p,
min-p: softmax(scores) is the sampling distribution, filtered tokens are -inf), G is standard Gumbel noise, so the
arg-max is an exact draw from softmax(scores), and h is a 31-bit integer hash of (the row's seed, the decode step,
the token id) computed elementwise on the device (`_mix31`). The token a row gets depends on its scores and its seed
only, not on the other rows, their order or earlier calls; the hash bits are the same on every device.

Example (on CPU the decode steps run eagerly):
    >>> from trl_agents.testing import build_tiny_tokenizer, build_tiny_model
    >>> from trl_agents.rollout.generators import SamplingParams, TransformersGenerator
    >>> tokenizer = build_tiny_tokenizer()
    >>> generator = TransformersGenerator(build_tiny_model(tokenizer), tokenizer, backend="static")
    >>> out = generator.generate([[1, 5, 6], [1, 7]], SamplingParams(max_new_tokens=4, greedy=True))
    >>> generator.active_backend, [len(ids) for ids in out.completion_ids]
    ('static', [4, 4])
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .decoding import cut_at_eos, shaping_options

DECODE_ATTENTION = "trl_agents_sdpa"
# How far a recorded step's logits may be from the eager step's, relative to the largest logit (2.5 bf16 rounding
# steps): the same kernels run, so they agree to rounding; a graph reading stale buffers is off by O(largest logit).
GRAPH_CHECK_TOLERANCE = 2e-2


def _grouped_query_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' SDPA attention, except one-token decoding with grouped-query attention: there the query heads
    that share a KV head are folded into that head's query rows, so SDPA reads K and V once instead of the per-head
    copies (`repeat_kv`) transformers makes whenever a mask is given."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1 or attention_mask is None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, head_dim = query.shape
    # Head h uses KV head h // groups (repeat_kv's order), so [B, heads, 1, d] -> [B, kv_heads, groups, d].
    folded = query.reshape(batch, key.shape[1], groups, head_dim)
    output = torch.nn.functional.scaled_dot_product_attention(
        folded, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
    )
    return output.reshape(batch, 1, heads, head_dim), None


def _register_decode_attention() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(DECODE_ATTENTION, _grouped_query_sdpa)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)  # the masks SDPA takes


@contextlib.contextmanager
def _decode_attention(model):
    """Run `model` with `_grouped_query_sdpa`, restoring its attention implementation afterwards."""
    _register_decode_attention()
    original = model.config._attn_implementation
    model.set_attn_implementation(DECODE_ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation(original)


class CudaGraphRecorder:
    """Records a decode step as a CUDA graph; graphs share one memory pool (they never run at the same time)."""

    def __init__(self):
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, step: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """Warm `step` up on a side stream (as PyTorch asks before a capture), record it, and return the replay
        function and the tensor each replay writes its output to."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (a trainer's pin-memory thread) do not break the capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            output = step()
        return graph.replay, output


@dataclass
class _Slot:
    """The static state of one padded batch size: KV cache, step inputs and (with graphs) the recorded step."""

    cache: Any
    length: int  # cache positions: prompt width + new tokens, rounded up
    input_ids: torch.Tensor  # [batch, 1] the token each row feeds next
    positions: torch.Tensor  # [batch, 1] its position id
    mask: torch.Tensor  # [batch, length] 2D attention mask: prompt padding, then ones (causality hides the future)
    replay: Callable[[], None] | None = None
    logits: torch.Tensor | None = None  # [batch, vocab] written by `replay`

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]


class StaticCacheDecoder:
    """Generates a batch of prompts with a static KV cache; with a graph recorder, every decode step is a replay.

    Keeps one `_Slot` per padded batch size (powers of two) and reuses it across calls, so memory is at most about
    twice the KV cache of the largest batch seen; `release()` frees it.

    Args:
        pad_token_id: Id fed for left padding and after a row has finished.
        eos_token_ids: Ids that end a row.
        graph_recorder: Turns a decode step into (replay function, output tensor); None = CUDA graphs on a CUDA
            device and eager steps elsewhere. Tests pass an eager stand-in to run the graph protocol on CPU.
        length_multiple: Cache lengths are rounded up to a multiple of this, so prompt widths that vary a little
            reuse one slot (our choice: 256; attention reads the whole cache length, masked or not).
    """

    def __init__(
        self,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        graph_recorder: Callable | None = None,
        length_multiple: int = 256,
    ):
        if length_multiple < 1:
            raise ValueError(f"length_multiple must be >= 1, got {length_multiple}")
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.graph_recorder = graph_recorder
        self.length_multiple = length_multiple
        self._slots: dict[int, _Slot] = {}
        self._weights_key: tuple | None = None

    def release(self) -> None:
        """Free every KV cache and graph (the next call allocates and records again)."""
        self._slots.clear()
        self._weights_key = None

    @torch.no_grad()
    def generate(
        self, model, prompts: Sequence[Sequence[int]], generation_config, seeds: Sequence[int] | None = None
    ) -> tuple[list, list]:
        """Completion ids (cut after the first EOS) and their log-probs for every prompt.

        `generation_config` is the one `TransformersGenerator` passes to `model.generate`; it must ask for sampling
        or greedy search (no beams, stop strings or time limits). `seeds` (one int per prompt) make sampling draw
        each row's tokens from its own seed (`SeededSampler`) instead of torch's global generator; greedy search
        ignores them.
        """
        device = next(model.parameters()).device
        if torch.is_autocast_enabled(device.type):
            raise NotImplementedError("the static backend does not run under autocast (graphs would capture casts)")
        config, processors = self._sampling_setup(model, generation_config, max(len(p) for p in prompts), device)
        temperature = config.temperature if config.do_sample and config.temperature else 1.0
        sampler = None
        if seeds is not None and config.do_sample:
            sampler = SeededSampler(seeds, config.max_new_tokens, device)
        with _decode_attention(model):
            tokens, logprobs, steps = self._decode(model, prompts, config, processors, temperature, device, sampler)
        return cut_at_eos(tokens[:, -steps:].tolist(), logprobs[:, :steps].tolist(), self.eos_token_ids)

    # ---- sampling: the same set-up `generate` makes -----------------------------------------------------------------

    def _sampling_setup(self, model, generation_config, prompt_width: int, device):
        from transformers.generation import GenerationMode

        config, processors = sampling_processors(model, generation_config, prompt_width, device)
        mode = config.get_generation_mode()
        if mode not in (GenerationMode.SAMPLE, GenerationMode.GREEDY_SEARCH):
            raise NotImplementedError(f"the static backend samples or decodes greedily, not {mode.value}")
        if config.stop_strings or config.max_time:
            raise NotImplementedError("the static backend stops on EOS ids and max_new_tokens only")
        return config, processors

    # ---- the decode loop ------------------------------------------------------------------------------------------

    def _decode(self, model, prompts, config, processors, temperature, device, sampler=None):
        rows, width, max_new = len(prompts), max(len(p) for p in prompts), config.max_new_tokens
        slot = self._slot(model, rows, width + max_new, device)
        # `tokens` is what `generate` calls input_ids: the left-padded prompts, then one column per step.
        tokens = torch.full((rows, width + max_new), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros((slot.batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            tokens[row, width - len(prompt) : width] = torch.tensor(list(prompt), dtype=torch.long)
            prompt_mask[row, width - len(prompt) :] = 1
        prompt_mask[rows:, -1] = 1  # padding rows: one token each, so no attention row is empty
        tokens, prompt_mask = tokens.to(device), prompt_mask.to(device)
        prompt_ids = torch.full((slot.batch, width), self.pad_token_id, dtype=torch.long, device=device)
        prompt_ids[:rows] = tokens[:, :width]

        slot.mask.fill_(1)
        slot.mask[:, :width] = prompt_mask
        positions = (prompt_mask.cumsum(-1) - 1).masked_fill(prompt_mask == 0, 0)
        slot.cache.reset()
        logits = self._forward(model, slot, prompt_ids, positions)
        slot.input_ids.fill_(self.pad_token_id)
        slot.positions.copy_(positions[:, -1:] + 1)

        eos = torch.tensor(self.eos_token_ids, device=device)
        unfinished = torch.ones(rows, dtype=torch.bool, device=device)
        logprobs = torch.zeros((rows, max_new), dtype=torch.float32, device=device)
        for step in range(max_new):
            raw = logits[:rows].to(dtype=torch.float32, copy=True)
            scores = processors(tokens[:, : width + step], raw)
            if sampler is not None:
                next_tokens = sampler.sample(scores, step)
            elif config.do_sample:
                next_tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            else:
                next_tokens = torch.argmax(scores, dim=-1)
            next_tokens = torch.where(unfinished, next_tokens, self.pad_token_id)
            tokens[:, width + step] = next_tokens
            logprobs[:, step] = torch.log_softmax(raw / temperature, -1).gather(-1, next_tokens[:, None]).squeeze(-1)
            unfinished &= ~torch.isin(next_tokens, eos)
            if step + 1 == max_new or not bool(unfinished.any()):
                break
            slot.input_ids[:rows, 0] = next_tokens
            logits = self._decode_step(model, slot)
            slot.positions += 1
        steps = step + 1
        return tokens[:, : width + steps], logprobs, steps

    def _forward(self, model, slot: _Slot, input_ids, positions) -> torch.Tensor:
        output = model(
            input_ids=input_ids,
            attention_mask=slot.mask,
            position_ids=positions,
            past_key_values=slot.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1]

    def _decode_step(self, model, slot: _Slot) -> torch.Tensor:
        if slot.replay is None:
            return self._forward(model, slot, slot.input_ids, slot.positions)
        slot.replay()
        return slot.logits

    # ---- slots: caches and graphs ---------------------------------------------------------------------------------

    def _slot(self, model, rows: int, needed_length: int, device) -> _Slot:
        key = self._weights_identity(model)
        if key != self._weights_key:  # other weights storage: recorded graphs would read stale memory
            self.release()
            self._weights_key = key
        batch = 1 << (rows - 1).bit_length()
        slot = self._slots.get(batch)
        if slot is None or slot.length < needed_length:
            self._slots.pop(batch, None)  # free the smaller cache before allocating the new one
            length = -(-needed_length // self.length_multiple) * self.length_multiple
            slot = self._new_slot(model, batch, length, device)
            self._slots[batch] = slot
        return slot

    @staticmethod
    def _weights_identity(model) -> tuple:
        tensors = itertools.chain(model.parameters(), model.buffers())
        return (id(model), *(t.data_ptr() for t in tensors))

    def _new_slot(self, model, batch: int, length: int, device) -> _Slot:
        from transformers import StaticCache

        config = model.config.get_text_config(decoder=True)
        if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"]):
            raise NotImplementedError("the static backend supports full-attention decoder layers only")
        slot = _Slot(
            cache=StaticCache(config=config, max_cache_len=length),
            length=length,
            input_ids=torch.full((batch, 1), self.pad_token_id, dtype=torch.long, device=device),
            positions=torch.zeros((batch, 1), dtype=torch.long, device=device),
            mask=torch.ones((batch, length), dtype=torch.long, device=device),
        )
        recorder = self.graph_recorder
        if recorder is None and device.type == "cuda":
            recorder = self.graph_recorder = CudaGraphRecorder()
        if recorder is not None:
            self._record(model, slot, recorder)
        return slot

    def _record(self, model, slot: _Slot, recorder: Callable) -> None:
        """Record the slot's decode step and check it: the replayed step must give the eager step's logits from the
        same state (a 2-token dummy prompt), so a graph that misreads its buffers fails here, at set-up. Runs inside
        `_decode_attention`, so the graph records the attention the decode loop uses."""

        def step():
            return self._forward(model, slot, slot.input_ids, slot.positions)

        self._dummy_prefill(model, slot)
        expected = step().float()
        replay, logits = recorder(step)
        self._dummy_prefill(model, slot)
        replay()
        error = (logits.float() - expected).abs().max().item()
        scale = expected.abs().max().item()
        if not error <= GRAPH_CHECK_TOLERANCE * scale:
            raise RuntimeError(
                f"the recorded decode step differs from the eager one (max |logit error| {error:.3g}, logits up to "
                f"{scale:.3g}); not using graphs for this model"
            )
        slot.replay, slot.logits = replay, logits

    def _dummy_prefill(self, model, slot: _Slot) -> None:
        """A 2-token prompt that differs per row (ids 1-61, not pad: its embedding may be zero and give zero logits),
        leaving the next decode step at position 2."""
        rows = torch.arange(slot.batch, device=slot.mask.device)[:, None]
        positions = torch.arange(2, device=slot.mask.device).expand(slot.batch, 2)
        slot.cache.reset()
        slot.mask.fill_(1)
        self._forward(model, slot, 1 + (3 * rows + positions) % 61, positions)
        slot.input_ids.copy_(1 + rows % 61)
        slot.positions.fill_(2)


def sampling_processors(model, generation_config, prompt_width: int, device):
    """The generation config and logits processors `model.generate` makes from `generation_config` before its
    decoding loop (the same calls), so processors and defaults match it exactly."""
    config, _ = model._prepare_generation_config(generation_config)
    model._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=device)
    return config, model._get_logits_processor(config, input_ids_seq_length=prompt_width, device=device)


# ---- per-request seeds: a row's tokens depend on its scores and its seed only ---------------------------------------

_MASK31 = (1 << 31) - 1
_MASK64 = (1 << 64) - 1
# Odd multipliers below 2**31: a 31-bit value times one stays below 2**62, so int64 products are exact on any device.
_MIX_MULTIPLIERS = (0x7FEB352D, 0x5BD1E995)


def _mix31(x: torch.Tensor) -> torch.Tensor:
    """Hash an int64 tensor of 31-bit values, in place: xor-shift / multiply rounds (murmur3's finaliser shape) on 31
    bits, a bijection of [0, 2**31) whose output bits each flip with probability ~1/2 when any input bit flips."""
    for multiplier, shift in zip(_MIX_MULTIPLIERS, (16, 15), strict=True):
        x.bitwise_xor_(x >> shift).mul_(multiplier).bitwise_and_(_MASK31)
    return x.bitwise_xor_(x >> 16)


def _splitmix64(value: int) -> int:
    """SplitMix64's output function: a well-mixed 64-bit integer from any integer (taken modulo 2**64)."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class SeededSampler:
    """Samples each row from its own seed by the Gumbel-max rule (module docstring): at decode step s, row r takes
    argmax_v(scores[r, v] + G[r, s, v]), with standard Gumbel noise G that is a function of (seeds[r], s, v) alone.

    The key of (seed, step) is `_mix31(_mix31(low ^ step) ^ high)` where (low, high) are two 31-bit parts of
    SplitMix64(seed); the noise bits of token v are `_mix31(_mix31(v) ^ key)`.

    Args:
        seeds: One int per row (any size; taken modulo 2**64).
        steps: Decode steps to make keys for (max_new_tokens).
        device: Where the scores are.

    Example:
        >>> scores = torch.tensor([[0.0, 1.0, -float("inf")], [2.0, 0.0, 0.0]])
        >>> a = SeededSampler([7, 8], steps=4, device="cpu").sample(scores, step=2)
        >>> b = SeededSampler([8, 7], steps=4, device="cpu").sample(scores.flip(0), step=2)
        >>> bool((a == b.flip(0)).all()), 2 in a.tolist()
        (True, False)
    """

    def __init__(self, seeds: Sequence[int], steps: int, device):
        mixed = [_splitmix64(operator.index(seed)) for seed in seeds]
        low = torch.tensor([z & _MASK31 for z in mixed], dtype=torch.long, device=device)
        high = torch.tensor([z >> 33 for z in mixed], dtype=torch.long, device=device)
        step_ids = torch.arange(max(steps, 1), dtype=torch.long, device=device)
        self.keys = _mix31(_mix31(low[:, None] ^ step_ids) ^ high[:, None])  # [rows, steps]
        self._token_bits = torch.empty(0, dtype=torch.long, device=device)  # _mix31(token ids), per vocabulary size

    def noise(self, step: int, vocab_size: int) -> torch.Tensor:
        """[rows, vocab_size] float32 standard Gumbel noise of decode step `step`."""
        if self._token_bits.numel() != vocab_size:
            self._token_bits = _mix31(torch.arange(vocab_size, dtype=torch.long, device=self.keys.device))
        bits = _mix31(self._token_bits ^ self.keys[:, step : step + 1])
        # U in (0, 1) at 2**-31 resolution near 0, where the large noise values (the likely arg-max) come from; E =
        # -log(1 - U) is Exp(1), -log(E) Gumbel(0, 1). The clamp keeps float32 rounding off U = 1 (E = inf).
        uniform = bits.to(torch.float32).mul_(2.0**-31).add_(2.0**-32).clamp_(max=1.0 - 2.0**-24)
        return uniform.neg_().log1p_().neg_().log_().neg_()

    def sample(self, scores: torch.Tensor, step: int) -> torch.Tensor:
        """The token of every row at decode step `step`: an exact draw from softmax(scores) per row."""
        return torch.argmax(scores + self.noise(step, scores.shape[-1]), dim=-1)


class SeededSamplingProcessor:
    """A logits processor that turns `model.generate` with `do_sample=False` into seeded sampling: it applies the
    sampling warpers `generate` would apply with `do_sample=True` (temperature, top-k, top-p, min-p, ...; the other
    processors, e.g. the repetition penalty, `generate` applies before it in both modes), then adds the rows' Gumbel
    noise, so generate's arg-max is `SeededSampler.sample`. The logits `generate` returns (`output_logits`) are the
    raw ones, taken before any processor."""

    def __init__(self, warpers: Callable, sampler: SeededSampler, prompt_width: int):
        self.warpers = warpers
        self.sampler = sampler
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = self.warpers(input_ids, scores)
        return scores + self.sampler.noise(input_ids.shape[1] - self.prompt_width, scores.shape[-1])


def seeded_sampling_processor(
    model, generation_config, prompt_width: int, device, seeds: Sequence[int]
) -> SeededSamplingProcessor:
    """The `SeededSamplingProcessor` for sampling with `generation_config` (do_sample=True) from left-padded prompts
    `prompt_width` wide; pass it to `model.generate` with the same config but `do_sample=False`."""
    from transformers.generation import (
        EpsilonLogitsWarper,
        EtaLogitsWarper,
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopHLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
        TypicalLogitsWarper,
    )

    config, processors = sampling_processors(model, generation_config, prompt_width, device)
    if config.watermarking_config is not None:
        raise NotImplementedError("per-request seeds do not support watermarking (it follows the warpers)")
    # The processors `_get_logits_processor` adds only when do_sample=True, in its order.
    warper_types = (
        TemperatureLogitsWarper, TopHLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper,
        TypicalLogitsWarper, EpsilonLogitsWarper, EtaLogitsWarper,
    )
    warpers = LogitsProcessorList(p for p in processors if isinstance(p, warper_types))
    return SeededSamplingProcessor(warpers, SeededSampler(seeds, config.max_new_tokens, device), prompt_width)


def paged_generate(
    model, prompts: Sequence[Sequence[int]], generation_config, continuous_batching_config: dict[str, Any] | None = None
) -> tuple[list[list[int]], list[list[float]]]:
    """Generate with transformers' continuous batching (`model.generate_batch`), as TRL's
    `use_transformers_continuous_batching` does; returns completion ids and their log-probs (not yet cut at EOS).

    transformers returns the log-prob of the processed distribution, which is ours (`log_softmax(logits / T)`) only
    when nothing but temperature shapes it, so top-k, top-p, min-p and repetition penalties are refused here.

    Args:
        continuous_batching_config: Keyword arguments of `transformers.ContinuousBatchingConfig`; `max_memory_percent`
            defaults to 0.5 as in TRL (the KV cache must leave room for training), and `seed`, when not given, is
            drawn from torch's global generator so `torch.manual_seed` makes runs repeatable.
    """
    from transformers import ContinuousBatchingConfig

    config = generation_config
    shaping = shaping_options(config.top_p, config.top_k, config.min_p, config.repetition_penalty)
    if shaping:
        raise ValueError(
            f"generation backend 'paged' returns log-probs of the processed distribution, which differ from the "
            f"sampling log-probs the trainer records when {', '.join(shaping)} is set. Use backend 'static' or "
            "'generate', or sample with temperature only."
        )
    options = {"max_memory_percent": 0.5, **(continuous_batching_config or {}), "return_logprobs": True}
    options.setdefault("seed", int(torch.randint(2**31 - 1, ()).item()))
    outputs = model.generate_batch(
        [list(p) for p in prompts],
        generation_config=generation_config,
        continuous_batching_config=ContinuousBatchingConfig(**options),
        progress_bar=False,
    )
    results = list(outputs.values())
    failed = [r.error for r in results if r.error is not None]
    if len(results) != len(prompts) or failed:
        raise RuntimeError(
            f"continuous batching returned {len(results)} of {len(prompts)} completions; errors: {failed[:3]}"
        )
    return [list(r.generated_tokens) for r in results], [list(r.logprobs) for r in results]
