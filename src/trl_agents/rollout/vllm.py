"""`VLLMGenerator`: the `Generator` contract on TRL's own vLLM backend (`trl.generation.VLLMGeneration`).

With `AgentGRPOConfig(use_vllm=True)` TRL builds `trainer.vllm_generation` (server mode: an HTTP client of a
`vllm serve` process; colocate mode: an in-process engine per GPU) and the trainer wraps it in a `VLLMGenerator`. Each
turn of the rollout is then one `VLLMGeneration.generate` call on token ids, with that turn's sampling settings: the
turn's token budget becomes vLLM's `max_tokens`, the EOS ids become `stop_token_ids`, greedy becomes temperature 0.
The sampled tokens' log-probs come back with the completions (`logprobs=0`, vLLM's processed log-probs, i.e. after
temperature), and feed TRL's importance-sampling correction.

Weights are pushed with TRL's `VLLMGeneration.sync_weights()` (NCCL in server mode, in-process in colocate mode).

Server mode under several processes is a collective: TRL gathers every process's prompts on the main process, which
sends one request, and broadcasts the answers; each process then takes its slice, `process_index * len(prompts)`
onwards. So every process must call `generate` the same number of times per turn with the same number of prompts:
processes whose episodes have finished (or that have fewer) pad with a dummy prompt, and the rollout engine keeps
calling while `any_active` says some process still plays.

Supported: vLLM `SUPPORTED_VLLM_VERSION` (the version TRL 1.16's client speaks; install with
`pip install "trl-agents[vllm]"`).

Example (the test-only loopback server stands in for `vllm serve` on CPU):
    >>> from accelerate import Accelerator
    >>> from trl.generation.vllm_generation import VLLMGeneration
    >>> from trl_agents.loopback import LoopbackVLLMServer, loopback_trl_vllm
    >>> from trl_agents.rollout import SamplingParams
    >>> from trl_agents.testing import build_tiny_tokenizer, build_tiny_model
    >>> tokenizer = build_tiny_tokenizer()
    >>> model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    >>> with LoopbackVLLMServer(model, tokenizer) as server, loopback_trl_vllm():
    ...     engine = VLLMGeneration(model, Accelerator(), tokenizer, mode="server", server_base_url=server.base_url)
    ...     generator = VLLMGenerator(engine, eos_token_ids=[tokenizer.eos_token_id])
    ...     out = generator.generate([[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=4))
    >>> [len(ids) <= 4 and len(ids) == len(lps) for ids, lps in zip(out.completion_ids, out.logprobs)]
    [True, True]
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

from .decoding import cut_at_eos
from .generators import GenerationOutput, SamplingParams

SUPPORTED_VLLM_VERSION = "0.31.0"

# The attributes of `VLLMGeneration` that `generate` reads for its sampling settings.
_SAMPLING_ATTRIBUTES = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_completion_length",
    "generation_kwargs",
)


class VLLMGenerator:
    """`Generator` on a TRL `VLLMGeneration` (server or colocate mode).

    Args:
        vllm_generation: TRL's vLLM backend, normally `trainer.vllm_generation` (anything with its `generate(prompts,
            images, num_generations)`, `sync_weights()`, `mode`, `accelerator` and sampling attributes).
        eos_token_ids: Ids that end a turn: sent as vLLM `stop_token_ids` and cut after (the id is kept, as
            `TransformersGenerator` keeps it).
        dummy_prompt: Token ids sent by a process that has fewer prompts than another one in a collective call
            (default: the first EOS id); its completions are thrown away.
    """

    samples_off_policy = True  # vLLM samples from its own copy of the weights: TRL's importance-sampling correction

    def __init__(self, vllm_generation: Any, eos_token_ids: Sequence[int], dummy_prompt: Sequence[int] | None = None):
        mode = getattr(vllm_generation, "mode", None)
        if mode not in ("server", "colocate"):
            raise ValueError(f"VLLMGenerator needs a VLLMGeneration in 'server' or 'colocate' mode, got mode={mode!r}")
        if not eos_token_ids:
            raise ValueError("VLLMGenerator needs at least one id in `eos_token_ids` (the tokenizer's EOS id)")
        self.vllm_generation = vllm_generation
        self.accelerator = vllm_generation.accelerator
        self.eos_token_ids = [int(token_id) for token_id in eos_token_ids]
        self.dummy_prompt = [int(t) for t in dummy_prompt] if dummy_prompt else self.eos_token_ids[:1]
        # Server mode gathers prompts on the main process; colocate mode with tensor parallelism gathers them within
        # each TP group. Both slice the answers by equal counts, so both need every process at every call.
        gathers = mode == "server" or getattr(vllm_generation, "tensor_parallel_size", 1) > 1
        self.collective = gathers and self.accelerator.num_processes > 1

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput:
        count = len(prompts)
        width = self._max_over_processes(count) if self.collective else count
        if width == 0:  # no process has a prompt: nothing to send (every process agrees, having seen the same max)
            return GenerationOutput([], [])
        padded = [list(p) for p in prompts] + [list(self.dummy_prompt)] * (width - count)
        with self._sampling_settings(sampling):
            _, completion_ids, logprobs, _ = self.vllm_generation.generate(padded, None, num_generations=1)
        if len(completion_ids) != width:
            raise RuntimeError(f"vLLM returned {len(completion_ids)} completions for {width} prompts")
        return turn_output(completion_ids[:count], logprobs[:count] if logprobs else None, self.eos_token_ids)

    def any_active(self, local: bool) -> bool:
        """Whether any process still has an active episode (an all-reduce; every process must call it)."""
        return self._max_over_processes(int(local)) > 0

    def sync_weights(self) -> None:
        """Push the training model's weights to vLLM (TRL's `VLLMGeneration.sync_weights`; collective)."""
        self.vllm_generation.sync_weights()

    def _max_over_processes(self, value: int) -> int:
        import torch

        local = torch.tensor([value], device=self.accelerator.device)
        return int(self.accelerator.gather(local).max().item())

    @contextlib.contextmanager
    def _sampling_settings(self, sampling: SamplingParams):
        """Set this turn's sampling on the VLLMGeneration for one call, then restore what TRL configured."""
        engine = self.vllm_generation
        saved = {name: getattr(engine, name) for name in _SAMPLING_ATTRIBUTES}
        settings = vllm_sampling(sampling)
        settings["max_completion_length"] = settings.pop("max_tokens")  # TRL's name for vLLM's max_tokens
        user_kwargs = dict(saved["generation_kwargs"] or {})
        stop_ids = list(dict.fromkeys([*(user_kwargs.get("stop_token_ids") or []), *self.eos_token_ids]))
        settings["generation_kwargs"] = {**user_kwargs, "stop_token_ids": stop_ids}
        for name, value in settings.items():
            setattr(engine, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(engine, name, value)


class VLLMClientGenerator:
    """`Generator` on a running vLLM server through TRL's `VLLMClient`, for evaluation: one process, no weight sync
    (the server serves the policy to evaluate). `trl-agents eval --vllm_server_url URL` uses it.

    Args:
        base_url: The server, e.g. "http://localhost:8000".
        eos_token_ids: Ids that end a turn (sent as `stop_token_ids`, kept at the end of the turn).
        connection_timeout: Seconds to wait for the server to come up.
    """

    def __init__(self, base_url: str, eos_token_ids: Sequence[int], connection_timeout: float = 0.0):
        from trl.generation.vllm_client import VLLMClient

        if not eos_token_ids:
            raise ValueError("VLLMClientGenerator needs at least one id in `eos_token_ids` (the tokenizer's EOS id)")
        self.client = VLLMClient(base_url=base_url, connection_timeout=connection_timeout)
        self.eos_token_ids = [int(token_id) for token_id in eos_token_ids]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput:
        if not prompts:
            return GenerationOutput([], [])
        out = self.client.generate(
            [list(p) for p in prompts],
            n=1,
            logprobs=0,
            generation_kwargs={"stop_token_ids": self.eos_token_ids},
            **vllm_sampling(sampling),
        )
        return turn_output(out["completion_ids"], out["logprobs"], self.eos_token_ids)


def vllm_sampling(sampling: SamplingParams) -> dict[str, Any]:
    """vLLM's sampling parameters for one turn (greedy is vLLM's temperature 0)."""
    greedy = sampling.greedy
    return {
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_p": 1.0 if greedy else sampling.top_p,
        "top_k": 0 if greedy else sampling.top_k,
        "min_p": 0.0 if greedy or sampling.min_p is None else sampling.min_p,
        "repetition_penalty": sampling.repetition_penalty,
        "max_tokens": sampling.max_new_tokens,  # the turn's token budget
    }


def turn_output(completion_ids: Sequence[Sequence[int]], logprobs: Sequence | None, eos_token_ids: Sequence[int]):
    """vLLM's answer (token ids; `logprobs=0` log-probs, one `[value]` per token) as one turn per prompt: cut after
    the first EOS id (kept), with NaN where vLLM gave no log-prob (TRL's correction then leaves the token alone)."""
    values = [
        [math.nan if entry is None or entry[0] is None else float(entry[0]) for entry in logprobs[row]]
        if logprobs is not None
        else [math.nan] * len(ids)
        for row, ids in enumerate(completion_ids)
    ]
    return GenerationOutput(*cut_at_eos([list(ids) for ids in completion_ids], values, eos_token_ids))
