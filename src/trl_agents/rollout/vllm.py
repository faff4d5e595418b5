"""`VLLMGenerator`: the `Generator` contract on TRL's own vLLM backend (`trl.generation.VLLMGeneration`).

With `AgentGRPOConfig(use_vllm=True)` TRL builds `trainer.vllm_generation` (server mode: an HTTP client of a
`vllm serve` process; colocate mode: an in-process engine per GPU) and the trainer wraps it in a `VLLMGenerator`. Each
turn of the rollout is then one `VLLMGeneration.generate` call on token ids, with that turn's sampling settings: the
turn's token budget becomes vLLM's `max_tokens`, the EOS ids become `stop_token_ids`, greedy becomes temperature 0.
The sampled tokens' log-probs come back with the completions (`logprobs=0`, vLLM's processed log-probs, i.e. after
temperature), and feed TRL's importance-sampling correction.

Weights are pushed with TRL's `VLLMGeneration.sync_weights()` (NCCL in server mode, in-process in colocate mode).

Server mode has two paths to the server:

* The collective batch path (lockstep rollouts): `generate(prompts, sampling)` goes through TRL's
  `VLLMGeneration.generate`. Under several processes that is a collective: TRL gathers every process's prompts on the
  main process, which sends one request, and broadcasts the answers; each process then takes its slice,
  `process_index * len(prompts)` onwards. So every process must call `generate` the same number of times per turn
  with the same number of prompts: processes whose episodes have finished (or that have fewer) pad with a dummy
  prompt, and the rollout engine keeps calling while `any_active` says some process still plays.
* The per-request path (per-episode scheduling): `submit(prompt_ids, sampling, seed)` sends one `/v1/completions`
  request (one prompt, `n=1`) from this process straight to the server, from a thread pool the generator owns, and
  returns a `concurrent.futures.Future`; `generate(prompts, sampling, seeds=[...])` does the same for a batch and
  waits. No collective: every process talks to the server on its own (`request_level = True`), and the server's
  continuous batching batches the requests of all processes. Each request carries its `seed`, so a turn's sample
  depends only on (weights, prompt, seed), not on which other requests it was batched with or in what order they
  arrived (up to the float rounding of batched kernels on a real GPU). The body is what TRL's client sends
  (`return_token_ids`, `return_tokens_as_token_ids`, `logprobs=0`, the turn's sampling, the stop ids), for one
  prompt, with the user's TRL `generation_kwargs` except their `seed`. The server URL is derived on every process
  from the `VLLMGeneration`'s `server_base_url` (or `server_host`/`server_port`), as TRL derives it on the main
  process. A request that fails (an HTTP error, a refused connection, no answer within `request_timeout` seconds)
  raises a one-line `RuntimeError` naming the server URL, without retries (TRL's client retries 5xx answers with
  back-off). Colocate mode has no server: `per_request_seeds` and `request_level` are False there, and seeds or
  `submit` are refused.

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

The per-request path, with seeds (the same seed gives the same turn, alone or among others):
    >>> with LoopbackVLLMServer(model, tokenizer) as server, loopback_trl_vllm():
    ...     engine = VLLMGeneration(model, Accelerator(), tokenizer, mode="server", server_base_url=server.base_url)
    ...     generator = VLLMGenerator(engine, eos_token_ids=[tokenizer.eos_token_id])
    ...     future = generator.submit([5, 6, 7], SamplingParams(max_new_tokens=4), seed=11)
    ...     batch = generator.generate([[8, 9], [5, 6, 7]], SamplingParams(max_new_tokens=4), seeds=[3, 11])
    ...     generator.close()
    >>> generator.request_level, future.result().completion_ids == batch.completion_ids[1:]
    (True, True)
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlsplit

from .decoding import cut_at_eos
from .generators import GenerationOutput, SamplingParams

SUPPORTED_VLLM_VERSION = "0.31.0"
DEFAULT_MAX_CONCURRENT_REQUESTS = 64  # threads of a generator's request pool: most requests in flight per process
DEFAULT_REQUEST_TIMEOUT = 600.0  # seconds a per-request call waits for the connection, then for the answer

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

# Fields of a per-request body that the generator sets itself; the user's TRL `generation_kwargs` cannot override
# them (a user `seed` would give every request the same seed).
_OWN_REQUEST_FIELDS = ("model", "prompt", "n", "logprobs", "seed", "stop_token_ids", "return_token_ids",
                       "return_tokens_as_token_ids")


class _PerRequestPath:
    """The per-request path both generators share: `submit`, `generate(..., seeds=...)` and `close`. A subclass sets
    `per_request_seeds`, `eos_token_ids` and `_client`/`_client_lock`, and implements `_new_client` and
    `_request_extras`."""

    per_request_seeds = True
    request_level = True  # send requests one by one; the server batches them
    eos_token_ids: list[int]

    def submit(self, prompt_ids: Sequence[int], sampling: SamplingParams, seed: int | None = None) -> Future:
        """Send one turn (one prompt, `n=1`) to the server from this process, without any collective; the future
        resolves to a one-row `GenerationOutput`, or raises a `RuntimeError` naming the server URL."""
        self._check_per_request("submit needs")
        extra, stop_token_ids = self._request_extras()
        body = completion_request(prompt_ids, sampling, stop_token_ids, seed=seed, extra=extra)
        return self._request_client().submit(body, self.eos_token_ids)

    def close(self) -> None:
        """Shut the request pool down (queued requests are cancelled, those in flight finished) and close its HTTP
        connections. A later `submit` opens a new pool."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _generate_per_request(self, prompts, sampling: SamplingParams, seeds) -> GenerationOutput:
        self._check_per_request("per-request seeds need")
        if len(seeds) != len(prompts):
            raise ValueError(f"generate got {len(seeds)} seeds for {len(prompts)} prompts (one seed per prompt)")
        futures = [self.submit(prompt, sampling, seed) for prompt, seed in zip(prompts, seeds, strict=True)]
        return _rows_in_order(futures)

    def _check_per_request(self, what: str) -> None:
        if not self.per_request_seeds:
            raise ValueError(f"{what} vLLM server mode: this {type(self).__name__} is in colocate mode")

    def _request_client(self) -> CompletionsClient:
        with self._client_lock:
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _new_client(self) -> CompletionsClient:
        raise NotImplementedError

    def _request_extras(self) -> tuple[dict[str, Any], list[int]]:
        """(extra body fields, stop token ids) of a per-request body."""
        raise NotImplementedError


class VLLMGenerator(_PerRequestPath):
    """`Generator` on a TRL `VLLMGeneration` (server or colocate mode).

    Args:
        vllm_generation: TRL's vLLM backend, normally `trainer.vllm_generation` (anything with its `generate(prompts,
            images, num_generations)`, `sync_weights()`, `mode`, `accelerator` and sampling attributes; the
            per-request path also reads `server_base_url` or `server_host`/`server_port`).
        eos_token_ids: Ids that end a turn: sent as vLLM `stop_token_ids` and cut after (the id is kept, as
            `TransformersGenerator` keeps it).
        dummy_prompt: Token ids sent by a process that has fewer prompts than another one in a collective call
            (default: the first EOS id); its completions are thrown away.
        max_concurrent_requests: Threads of the per-request pool (server mode), i.e. the most requests this process
            has in flight at once; further `submit`s wait in the pool's queue. Default 64.
        request_timeout: Seconds a per-request call waits for the connection, then for the answer (vLLM answers a
            non-streamed request in one piece when it is done, so this bounds queueing plus generation). Default 600.

    In server mode `request_level` and `per_request_seeds` are True: `submit` and `generate(..., seeds=...)` send
    requests from this process straight to the server (the module docstring explains both paths). Call `close()`
    when done with them.
    """

    samples_off_policy = True  # vLLM samples from its own copy of the weights: TRL's importance-sampling correction

    def __init__(
        self,
        vllm_generation: Any,
        eos_token_ids: Sequence[int],
        dummy_prompt: Sequence[int] | None = None,
        max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ):
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
        # Server mode can also send per-episode requests itself, on every process, without TRL's collective.
        self.request_level = self.per_request_seeds = mode == "server"
        self.max_concurrent_requests = int(max_concurrent_requests)
        self.request_timeout = float(request_timeout)
        self._client: CompletionsClient | None = None  # made on the first per-request call
        self._client_lock = threading.Lock()

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seeds: Sequence[int | None] | None = None
    ) -> GenerationOutput:
        """One turn per prompt. With `seeds` (server mode only), one request per prompt with its seed, sent from
        this process without TRL's collective; without, TRL's `VLLMGeneration.generate` (a collective under several
        processes in server mode)."""
        if seeds is not None:
            return self._generate_per_request(prompts, sampling, seeds)
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
        settings["generation_kwargs"] = {**user_kwargs, "stop_token_ids": _stop_ids(user_kwargs, self.eos_token_ids)}
        for name, value in settings.items():
            setattr(engine, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(engine, name, value)

    def _new_client(self) -> CompletionsClient:
        engine = self.vllm_generation
        # The main process has TRL's client and so the served model's id; other processes ask /v1/models once.
        model = getattr(getattr(engine, "vllm_client", None), "model", None)
        return CompletionsClient(server_url(engine), model=model, max_concurrent_requests=self.max_concurrent_requests,
                                 request_timeout=self.request_timeout)

    def _request_extras(self) -> tuple[dict[str, Any], list[int]]:
        """What TRL's collective request would carry besides the turn's sampling: the user's `generation_kwargs`
        (stop ids merged with the EOS ids) and the structured-outputs regex."""
        engine = self.vllm_generation
        extra = dict(getattr(engine, "generation_kwargs", None) or {})
        stop_token_ids = _stop_ids(extra, self.eos_token_ids)
        regex = getattr(engine, "structured_outputs_regex", None)
        if regex is not None:
            extra["structured_outputs"] = {"regex": regex}
        return extra, stop_token_ids


class VLLMClientGenerator(_PerRequestPath):
    """`Generator` on a running vLLM server through TRL's `VLLMClient`, for evaluation: one process, no weight sync
    (the server serves the policy to evaluate). `trl-agents eval --vllm_server_url URL` uses it.

    Args:
        base_url: The server, e.g. "http://localhost:8000".
        eos_token_ids: Ids that end a turn (sent as `stop_token_ids`, kept at the end of the turn).
        connection_timeout: Seconds to wait for the server to come up.
        max_concurrent_requests: Threads of the per-request pool (`submit`, `generate(..., seeds=...)`). Default 64.
        request_timeout: Seconds a per-request call waits for the connection, then for the answer. Default 600.
    """

    def __init__(
        self,
        base_url: str,
        eos_token_ids: Sequence[int],
        connection_timeout: float = 0.0,
        max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ):
        from trl.generation.vllm_client import VLLMClient

        if not eos_token_ids:
            raise ValueError("VLLMClientGenerator needs at least one id in `eos_token_ids` (the tokenizer's EOS id)")
        self.client = VLLMClient(base_url=base_url, connection_timeout=connection_timeout)
        self.base_url = self.client.base_url
        self.eos_token_ids = [int(token_id) for token_id in eos_token_ids]
        self.max_concurrent_requests = int(max_concurrent_requests)
        self.request_timeout = float(request_timeout)
        self._client: CompletionsClient | None = None
        self._client_lock = threading.Lock()

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seeds: Sequence[int | None] | None = None
    ) -> GenerationOutput:
        """One turn per prompt: one batched request through TRL's client, or with `seeds` one request per prompt
        with its seed."""
        if seeds is not None:
            return self._generate_per_request(prompts, sampling, seeds)
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

    def _new_client(self) -> CompletionsClient:
        return CompletionsClient(self.base_url, model=self.client.model,
                                 max_concurrent_requests=self.max_concurrent_requests,
                                 request_timeout=self.request_timeout)

    def _request_extras(self) -> tuple[dict[str, Any], list[int]]:
        return {}, list(self.eos_token_ids)


class CompletionsClient:
    """One process's HTTP client of a vLLM server's `/v1/completions` on token ids, for the per-request path: one
    prompt per request (`n=1`), sent from a thread pool (`submit`) or from the calling thread (`complete`). No
    retries: a failed request raises a one-line `RuntimeError` naming the URL and the HTTP status or the error.

    Args:
        base_url: The server, e.g. "http://localhost:8000".
        model: The served model id, sent as `model` (None: asked from `/v1/models` on the first request).
        max_concurrent_requests: Threads of the pool and size of the HTTP connection pool.
        request_timeout: Seconds to wait for the connection, then for the answer.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ):
        import requests
        from requests.adapters import HTTPAdapter

        if max_concurrent_requests < 1:
            raise ValueError(f"max_concurrent_requests must be at least 1, got {max_concurrent_requests}")
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be a positive number of seconds, got {request_timeout}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/v1/completions"
        self.model = model
        self.request_timeout = float(request_timeout)
        self._session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max_concurrent_requests, max_retries=0)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent_requests, thread_name_prefix="vllm-request")
        self._model_lock = threading.Lock()

    def submit(self, body: dict[str, Any], eos_token_ids: Sequence[int]) -> Future:
        """Send `body` from the pool; the future resolves to a one-row `GenerationOutput` (cut after an EOS id)."""
        return self._pool.submit(self._turn, body, list(eos_token_ids))

    def complete(self, body: dict[str, Any]) -> tuple[list[int], list[float | None]]:
        """Send `body` (a one-prompt request without `model`) and wait: the completion's token ids and the sampled
        tokens' log-probs (None where the server gave none)."""
        answer = self._request("POST", self.url, {"model": self._model_id(), **body})
        try:
            choice = answer["choices"][0]
            token_ids = [int(token) for token in choice["token_ids"]]
            logprobs = choice.get("logprobs")
            values = list(logprobs["token_logprobs"]) if logprobs is not None else [None] * len(token_ids)
            if len(values) != len(token_ids):
                raise ValueError(f"{len(values)} log-probs for {len(token_ids)} tokens")
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise RuntimeError(_one_line(
                f"vLLM request to {self.url} failed: the answer has no completion token ids and log-probs "
                f"({type(err).__name__}: {err})")) from err
        return token_ids, values

    def close(self) -> None:
        """Cancel queued requests, wait for those in flight, close the connections."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._session.close()

    def _turn(self, body: dict[str, Any], eos_token_ids: list[int]) -> GenerationOutput:
        token_ids, values = self.complete(body)
        return turn_output([token_ids], [[[value] for value in values]], eos_token_ids)

    def _model_id(self) -> str:
        with self._model_lock:
            if self.model is None:
                url = f"{self.base_url}/v1/models"
                try:
                    self.model = self._request("GET", url, None)["data"][0]["id"]
                except (KeyError, IndexError, TypeError) as err:
                    raise RuntimeError(f"vLLM request to {url} failed: no served model in the answer") from err
            return self.model

    def _request(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        import requests

        try:
            response = self._session.request(method, url, json=body, timeout=self.request_timeout)
        except requests.Timeout as err:
            raise RuntimeError(
                f"vLLM request to {url} failed: no answer within request_timeout={self.request_timeout:g} s") from err
        except requests.RequestException as err:
            raise RuntimeError(_one_line(f"vLLM request to {url} failed: {type(err).__name__}: {err}")) from err
        if response.status_code != 200:
            status = f"HTTP {response.status_code} {response.reason}"
            raise RuntimeError(_one_line(f"vLLM request to {url} failed: {status}: {_error_text(response)}"))
        try:
            return response.json()
        except ValueError as err:
            raise RuntimeError(f"vLLM request to {url} failed: the answer is not JSON") from err


def completion_request(
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    stop_token_ids: Sequence[int],
    seed: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `/v1/completions` body of one per-request turn, without `model`: one token-id prompt, `n=1`, the turn's
    vLLM sampling (`vllm_sampling`), the stop ids, the sampled tokens' log-probs (`logprobs=0`), token ids back (as
    TRL's client asks for them) and the seed if given. `extra` (the user's TRL `generation_kwargs`) may override the
    sampling, as in TRL's client, but not the fields the request needs (`_OWN_REQUEST_FIELDS`)."""
    body: dict[str, Any] = {
        "prompt": [int(token) for token in prompt_ids],
        "n": 1,
        **vllm_sampling(sampling),
        **{key: value for key, value in (extra or {}).items() if key not in _OWN_REQUEST_FIELDS},
        "stop_token_ids": [int(token) for token in stop_token_ids],
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    if seed is not None:
        body["seed"] = int(seed)
    return body


def server_url(vllm_generation: Any) -> str:
    """The vLLM server's base URL of a server-mode `VLLMGeneration`, derived from its settings as TRL derives it on
    the main process (`server_base_url`, else `http://{server_host}:{server_port}`), so any process can compute it."""
    url = getattr(vllm_generation, "server_base_url", None)
    if url is None:
        host, port = getattr(vllm_generation, "server_host", None), getattr(vllm_generation, "server_port", None)
        if host is None or port is None:
            raise ValueError("the VLLMGeneration has neither `server_base_url` nor `server_host`/`server_port`")
        url = f"http://{host}:{port}"
    parts = urlsplit(url)
    return f"{parts.scheme or 'http'}://{parts.netloc}{parts.path}".rstrip("/")


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


def _stop_ids(user_kwargs: dict[str, Any], eos_token_ids: Sequence[int]) -> list[int]:
    """The user's `stop_token_ids` (TRL `generation_kwargs`) followed by the EOS ids, without repeats."""
    return list(dict.fromkeys([*(user_kwargs.get("stop_token_ids") or []), *eos_token_ids]))


def _rows_in_order(futures: list[Future]) -> GenerationOutput:
    """The one-row outputs of `futures` as one output, in their order; the first failure cancels the rest and is
    raised."""
    wait(futures, return_when=FIRST_EXCEPTION)
    for future in futures:
        if future.done() and not future.cancelled() and future.exception() is not None:
            for other in futures:
                other.cancel()
            raise future.exception()
    outputs = [future.result() for future in futures]
    return GenerationOutput([o.completion_ids[0] for o in outputs], [o.logprobs[0] for o in outputs])


def _error_text(response) -> str:
    """vLLM's error message (`{"error": {"message": ...}}`), else the body's start."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else response.text[:200]


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
