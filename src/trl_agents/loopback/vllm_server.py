"""A loopback stand-in for `vllm serve`, backed by a transformers causal LM. For tests only.

It speaks the routes of vLLM `SUPPORTED_VLLM_VERSION` that TRL 1.16's `VLLMClient` calls, with vLLM's request and
response schema, on 127.0.0.1 and a free port:

* GET `/health` (200, empty body), `/version` (`{"version": "0.31.0"}`), `/v1/models`, `/get_world_size` (1) and
  `/server_info?config_format=json` (`{"vllm_config": {...}}`, with `model_config.logprobs_mode` =
  `"processed_logprobs"` and `weight_transfer_config` = `{"backend": "nccl"}`).
* POST `/v1/completions`: token-id (or text) prompts; `n` (choices are prompt-major), `temperature` (0 = greedy),
  `top_p`, `top_k`, `min_p`, `repetition_penalty`, `max_tokens`, `seed`, `stop_token_ids`, `ignore_eos`, `logprobs`,
  `prompt_logprobs`, `return_token_ids`, `return_tokens_as_token_ids`. Fields it does not implement are refused.
* POST `/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`, `/finish_weight_update`,
  `/reset_prefix_cache`: the weight-update handshake; `/update_weights` records the announced tensors.
* POST `/test/load_weights` `{"path": ...}`, **not vLLM**: loads a state dict (safetensors or `torch.save`) from a
  local file; inside an update it must hold exactly the tensors `/update_weights` announced.

Any other route answers 404. Log-probs are vLLM's processed log-probs (`--logprobs-mode processed_logprobs`, which TRL
requires): log_softmax of the logits after repetition penalty, temperature, min-p, top-k and top-p, in that order, as
vLLM's sampler does. With the defaults (no penalty, no filtering) that is log_softmax(logits / T), what TRL's training
forward computes; greedy (temperature 0) scores with T = 1. Log-probs are clamped at -9999, as vLLM clamps them.

`loopback_trl_vllm()` lets TRL's real vLLM code run against it on a machine without vllm or CUDA: it reports vllm as
available to TRL's client and backend, does the weight-transfer handshake over HTTP without opening NCCL, and sends the
streamed tensors as a file to `/test/load_weights`. Everything else (TRL's parameter walk, name fixing, PEFT merge,
request building, response parsing, the server-mode gather/broadcast) is TRL's own code.

Example:
    >>> from trl.generation.vllm_client import VLLMClient
    >>> from trl_agents.testing import build_tiny_tokenizer, build_tiny_model
    >>> tokenizer = build_tiny_tokenizer()
    >>> model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    >>> with LoopbackVLLMServer(model, tokenizer) as server, loopback_trl_vllm():
    ...     client = VLLMClient(base_url=server.base_url)
    ...     out = client.generate([[5, 6, 7]], n=2, max_tokens=3)
    ...     server.count("/v1/completions")
    1
    >>> len(out["completion_ids"]), len(out["logprobs"][0][0])  # 2 completions; logprobs=0: 1 value per token
    (2, 1)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from ..rollout.vllm import SUPPORTED_VLLM_VERSION
from .base import Answer, LoopbackHTTPServer, RequestError

LOAD_WEIGHTS_ROUTE = "/test/load_weights"
LOGPROB_FLOOR = -9999.0  # vLLM clamps reported log-probs here (JSON has no -inf)

# Request fields that change what vLLM would generate and that this server does not implement: refused, not ignored.
_UNSUPPORTED_FIELDS = (
    "stream",
    "echo",
    "use_beam_search",
    "structured_outputs",
    "response_format",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "prompt_embeds",
    "logprob_token_ids",
    "min_tokens",
    "stop",
    "presence_penalty",
    "frequency_penalty",
)


@dataclass
class _Sampling:
    n: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    max_tokens: int
    logprobs: int | None
    prompt_logprobs: int | None
    stop_token_ids: list[int]
    ignore_eos: bool
    seed: int | None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5  # vLLM's threshold


class LoopbackVLLMServer(LoopbackHTTPServer):
    """A vLLM-compatible HTTP server on 127.0.0.1 around a transformers causal LM (tests only).

    Args:
        model: A transformers causal LM (put in eval mode while the server runs). The server owns its weights: load
            new ones through `/test/load_weights` (TRL's `sync_weights` does, under `loopback_trl_vllm()`).
        tokenizer: Gives the EOS id (generation stops there, as vLLM stops at the model's EOS) and token texts.
        model_name: The served model id (`/v1/models`; requests naming another model get a 404, as in vLLM).
        seed: Seed of the sampler for requests without a `seed`.

    Use as a context manager (`with LoopbackVLLMServer(model, tokenizer) as server: server.base_url`). Every request
    is recorded: `count(route)` and `bodies(route)` tell what clients sent.
    """

    def __init__(self, model, tokenizer, model_name: str = "loopback-model", seed: int = 0):
        import torch

        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        extra_eos = [config_eos] if isinstance(config_eos, int) else list(config_eos or [])
        self.eos_token_id = tokenizer.eos_token_id
        # vLLM stops at the tokenizer's EOS, and treats the generation config's other EOS ids as stop tokens.
        self.extra_stop_ids = [int(t) for t in extra_eos if t != self.eos_token_id]
        self.weight_version = 0
        self.requests: list[tuple[str, str, dict[str, Any]]] = []  # (method, route, JSON body)
        self._rng = torch.Generator().manual_seed(seed)
        self._model_lock = threading.Lock()  # one generation or weight load at a time
        self._log_lock = threading.Lock()
        self._token_texts: list[str] | None = None
        self._transfer_engine_ready = False
        self._updating = False
        self._announced: dict[str, tuple[str, list[int]]] | None = None  # name -> (dtype, shape) of /update_weights
        self._was_training = False

    # ---- lifecycle -------------------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The server's URL (what `VLLMClient(base_url=...)` takes)."""
        return self.url

    def start(self) -> Self:
        self._was_training = self.model.training
        self.model.eval()
        return super().start()

    def stop(self) -> None:
        if self._http is not None:
            super().stop()
            self.model.train(self._was_training)

    # ---- what clients sent -----------------------------------------------------------------------------------------

    def count(self, route: str) -> int:
        """Number of requests received on `route` (e.g. "/v1/completions")."""
        return len(self.bodies(route))

    def bodies(self, route: str) -> list[dict[str, Any]]:
        """JSON bodies of the requests received on `route`, in order."""
        with self._log_lock:
            return [body for _, path, body in self.requests if path == route]

    # ---- dispatch --------------------------------------------------------------------------------------------------

    def handle(self, method: str, target: str, headers, body: bytes) -> Answer:
        """Answer one request: (HTTP status, no extra headers, JSON-able answer or None for an empty body)."""
        parts = urlsplit(target)
        try:
            body = json.loads(body) if body else {}
        except json.JSONDecodeError:
            return 400, {}, {"detail": "Invalid JSON format"}
        if not isinstance(body, dict):
            return 400, {}, {"detail": "The request body must be a JSON object"}
        with self._log_lock:
            self.requests.append((method, parts.path, body))
        routes = {
            ("GET", "/health"): lambda: None,
            ("GET", "/version"): lambda: {"version": SUPPORTED_VLLM_VERSION},
            ("GET", "/v1/models"): self._models,
            ("GET", "/server_info"): lambda: self._server_info(parse_qs(parts.query)),
            ("GET", "/get_world_size"): lambda: {"world_size": 1},
            ("POST", "/v1/completions"): lambda: self._completions(body),
            ("POST", "/init_weight_transfer_engine"): lambda: self._init_weight_transfer_engine(body),
            ("POST", "/start_weight_update"): self._start_weight_update,
            ("POST", "/update_weights"): lambda: self._update_weights(body),
            ("POST", "/finish_weight_update"): self._finish_weight_update,
            ("POST", "/reset_prefix_cache"): lambda: {"success": True},
            ("POST", LOAD_WEIGHTS_ROUTE): lambda: self._load_weights_file(body),
        }
        route = routes.get((method, parts.path))
        if route is None:
            if any(path == parts.path for _, path in routes):
                return 405, {}, {"detail": "Method Not Allowed"}
            return 404, {}, {"detail": "Not Found"}
        return 200, {}, route()

    def error_answer(self, error: RequestError) -> Answer:
        """vLLM's (OpenAI's) error body; `code` is the error type, `BadRequestError` by default."""
        details = {"message": error.message, "type": error.code or "BadRequestError", "param": None,
                   "code": error.status}
        return error.status, {}, {"error": details}

    # ---- info routes -----------------------------------------------------------------------------------------------

    def _models(self) -> dict[str, Any]:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [],
        }
        return {"object": "list", "data": [card]}

    def _server_info(self, query: dict[str, list[str]]) -> dict[str, Any]:
        config = {
            "model_config": {
                "model": self.model_name,
                "max_model_len": self.max_model_len,
                "logprobs_mode": "processed_logprobs",
                "max_logprobs": -1,
            },
            "parallel_config": {"tensor_parallel_size": 1, "data_parallel_size": 1, "world_size": 1},
            "weight_transfer_config": {"backend": "nccl"},
        }
        if query.get("config_format", ["text"])[0] == "json":
            return {"vllm_config": config}
        return {"vllm_config": json.dumps(config)}

    # ---- /v1/completions -------------------------------------------------------------------------------------------

    def _completions(self, body: dict[str, Any]) -> dict[str, Any]:
        refused = [name for name in _UNSUPPORTED_FIELDS if body.get(name)]
        if refused:
            raise RequestError(400, f"The loopback vLLM server does not implement {', '.join(refused)}")
        if body.get("model") not in (None, self.model_name):
            raise RequestError(404, f"The model `{body['model']}` does not exist.", "NotFoundError")
        prompts = self._prompt_ids(body.get("prompt"))
        sampling = _sampling_of(body)
        for prompt in prompts:
            if len(prompt) + sampling.max_tokens > self.max_model_len:
                raise RequestError(
                    400,
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{len(prompt) + sampling.max_tokens} tokens ({len(prompt)} in the messages, "
                    f"{sampling.max_tokens} in the completion).",
                )
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        with_ids = bool(body.get("return_token_ids"))
        choices, completion_tokens = [], 0
        with self._model_lock:
            rng = self._rng if sampling.seed is None else _seeded(sampling.seed)
            for prompt in prompts:
                samples, prompt_logprobs = self._sample(prompt, sampling, rng)
                for sample in samples:
                    completion_tokens += len(sample["token_ids"])
                    choice = self._choice(len(choices), prompt, sample, prompt_logprobs, sampling, as_ids, with_ids)
                    choices.append(choice)
        prompt_tokens = sum(len(p) for p in prompts)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
            },
            "kv_transfer_params": None,
        }

    def _prompt_ids(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise RequestError(400, "Either prompt or prompt_embeds must be provided and non-empty.")
        if all(isinstance(token, int) for token in prompt):
            prompt = [prompt]
        prompts = []
        vocab = self.model.config.vocab_size
        for entry in prompt:
            ids = self.tokenizer.encode(entry) if isinstance(entry, str) else entry
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                raise RequestError(400, f"Each prompt must be a non-empty list of ids in [0, {vocab}), got {entry!r}")
            prompts.append(ids)
        return prompts

    def _sample(self, prompt: list[int], sampling: _Sampling, rng) -> tuple[list[dict], list | None]:
        """`n` completions of one prompt, decoded together with a KV cache; and the prompt's log-probs if asked."""
        import torch

        n = sampling.n
        device = next(self.model.parameters()).device
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([prompt] * n, device=device), use_cache=True)
            prompt_logprobs = None
            if sampling.prompt_logprobs is not None:
                prompt_logprobs = self._prompt_logprobs(prompt, out.logits[0].float(), sampling)
            logits, past = out.logits[:, -1].float(), out.past_key_values
            seen = torch.zeros(n, logits.shape[-1], dtype=torch.bool, device=device)
            seen[:, prompt] = True
            stops = set(sampling.stop_token_ids) | set(self.extra_stop_ids)
            samples = [
                {"token_ids": [], "logprobs": [], "top": [], "finish_reason": "length", "stop_reason": None}
                for _ in range(n)
            ]
            active = list(range(n))
            for _ in range(sampling.max_tokens):
                processed = _processed_logits(logits, seen, sampling)
                logprobs = torch.log_softmax(processed, dim=-1)
                if sampling.greedy:
                    tokens = processed.argmax(dim=-1)
                else:
                    tokens = torch.multinomial(logprobs.exp().cpu(), 1, generator=rng).squeeze(-1).to(device)
                for row in active:
                    token = int(tokens[row])
                    sample = samples[row]
                    sample["token_ids"].append(token)
                    sample["logprobs"].append(float(logprobs[row, token]))
                    if sampling.logprobs:  # top-N besides the sampled token
                        k = logprobs.shape[-1] if sampling.logprobs < 0 else min(sampling.logprobs, logprobs.shape[-1])
                        values, ids = logprobs[row].topk(k)
                        sample["top"].append(list(zip(ids.tolist(), values.tolist(), strict=True)))
                    if token == self.eos_token_id and not sampling.ignore_eos:
                        sample["finish_reason"] = "stop"
                    elif token in stops:
                        sample["finish_reason"], sample["stop_reason"] = "stop", token
                active = [row for row in active if samples[row]["finish_reason"] == "length"]
                if not active:
                    break
                seen[torch.arange(n), tokens] = True
                out = self.model(input_ids=tokens[:, None], past_key_values=past, use_cache=True)
                logits, past = out.logits[:, -1].float(), out.past_key_values
        return samples, prompt_logprobs

    def _prompt_logprobs(self, prompt: list[int], logits, sampling: _Sampling) -> list[dict | None]:
        """vLLM's `prompt_logprobs`: None for the first token, then {token id: {logprob, rank, decoded_token}} for
        the actual token and the top-k (k = -1: the whole vocabulary)."""
        import torch

        temperature = 1.0 if sampling.greedy else sampling.temperature
        logprobs = torch.log_softmax(logits[:-1] / temperature, dim=-1)
        k = logprobs.shape[-1] if sampling.prompt_logprobs < 0 else sampling.prompt_logprobs
        result: list[dict | None] = [None]
        for position, token in enumerate(prompt[1:]):
            row = logprobs[position]
            values, ids = row.topk(k)
            entries = {token: float(row[token])} | dict(zip(ids.tolist(), values.tolist(), strict=True))
            result.append(
                {
                    str(token_id): {
                        "logprob": max(value, LOGPROB_FLOOR),
                        "rank": int((row > value).sum()) + 1,
                        "decoded_token": self._token_text(token_id),
                    }
                    for token_id, value in entries.items()
                }
            )
        return result

    def _choice(self, index, prompt, sample, prompt_logprobs, sampling: _Sampling, as_ids: bool, with_ids: bool):
        token_ids = sample["token_ids"]
        logprobs = None
        if sampling.logprobs is not None:
            names = [self._token_name(t, as_ids) for t in token_ids]
            offsets, offset = [], 0
            for token_id in token_ids:
                offsets.append(offset)
                offset += len(self._token_text(token_id))
            top_logprobs = []
            for position, (name, value) in enumerate(zip(names, sample["logprobs"], strict=True)):
                entries = {name: max(value, LOGPROB_FLOOR)}  # the sampled token first, then the top-N
                for token_id, top_value in sample["top"][position] if sample["top"] else []:
                    entries.setdefault(self._token_name(token_id, as_ids), max(top_value, LOGPROB_FLOOR))
                top_logprobs.append(entries)
            logprobs = {
                "text_offset": offsets,
                "token_logprobs": [max(value, LOGPROB_FLOOR) for value in sample["logprobs"]],
                "tokens": names,
                "top_logprobs": top_logprobs,
            }
        return {
            "index": index,
            "text": self.tokenizer.decode(token_ids, skip_special_tokens=True),
            "logprobs": logprobs,
            "finish_reason": sample["finish_reason"],
            "stop_reason": sample["stop_reason"],
            "token_ids": list(token_ids) if with_ids else None,
            "prompt_logprobs": prompt_logprobs,
            "prompt_token_ids": list(prompt) if with_ids else None,
        }

    def _token_text(self, token_id: int) -> str:
        if self._token_texts is None:
            vocab = self.model.config.vocab_size
            self._token_texts = self.tokenizer.batch_decode([[i] for i in range(vocab)])
        return self._token_texts[token_id]

    def _token_name(self, token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else self._token_text(token_id)

    # ---- weight routes ---------------------------------------------------------------------------------------------

    def _init_weight_transfer_engine(self, body: dict[str, Any]) -> dict[str, str]:
        if not isinstance(body.get("init_info"), dict):
            raise RequestError(422, "Missing 'init_info' in request body")
        self._transfer_engine_ready = True
        return {"message": "Weight transfer initialized"}

    def _start_weight_update(self) -> dict[str, str]:
        if not self._transfer_engine_ready:
            raise RequestError(400, "The weight transfer engine is not initialized: POST /init_weight_transfer_engine")
        self._updating = True
        return {"message": "Weight update started"}

    def _update_weights(self, body: dict[str, Any]) -> dict[str, str]:
        if not self._updating:
            raise RequestError(400, "No weight update in progress: POST /start_weight_update first")
        info = body.get("update_info")
        try:
            names, dtypes, shapes = info["names"], info["dtype_names"], info["shapes"]
            announced = {name: (dtype, list(shape)) for name, dtype, shape in zip(names, dtypes, shapes, strict=True)}
        except (TypeError, KeyError, ValueError) as err:
            raise RequestError(422, f"update_info needs equally long names, dtype_names and shapes ({err})") from err
        self._check_names_and_shapes({name: shape for name, (_, shape) in announced.items()})
        self._announced = announced
        return {"message": "Weights updated"}

    def _finish_weight_update(self) -> dict[str, str]:
        if not self._updating:
            raise RequestError(400, "No weight update in progress: POST /start_weight_update first")
        if self._announced is not None:
            raise RequestError(400, f"/update_weights announced {len(self._announced)} tensors that never arrived")
        self._updating = False
        return {"message": "Weight update finished"}

    def _load_weights_file(self, body: dict[str, Any]) -> dict[str, Any]:
        import torch

        path = body.get("path")
        if not isinstance(path, str) or not os.path.isfile(path):
            raise RequestError(400, f"{LOAD_WEIGHTS_ROUTE} needs {{'path': <a local state-dict file>}}, got {path!r}")
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            tensors = load_file(path)
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
        if self._announced is not None:
            received = {name: (str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in tensors.items()}
            if received != self._announced:
                missing = sorted(set(self._announced) - set(received))
                unexpected = sorted(set(received) - set(self._announced))
                shared = set(received) & set(self._announced)
                mismatched = sorted(name for name in shared if received[name] != self._announced[name])
                raise RequestError(
                    400,
                    "The weights file does not hold the tensors /update_weights announced: missing "
                    f"{missing[:5]}, unexpected {unexpected[:5]}, different dtype or shape {mismatched[:5]}",
                )
            self._announced = None
        self._check_names_and_shapes({name: list(t.shape) for name, t in tensors.items()})
        with self._model_lock, torch.no_grad():
            parameters = self.model.state_dict(keep_vars=True)
            for name, tensor in tensors.items():
                parameters[name].copy_(tensor)
            self.weight_version += 1
        return {"message": "Weights loaded", "weight_version": self.weight_version, "num_tensors": len(tensors)}

    def _check_names_and_shapes(self, shapes: dict[str, list[int]]) -> None:
        own = {name: list(value.shape) for name, value in self.model.state_dict().items()}
        unknown = sorted(set(shapes) - set(own))
        if unknown:
            raise RequestError(400, f"Unknown weight names (not in the served model): {unknown[:5]}")
        wrong = [f"{name} {shape} != {own[name]}" for name, shape in shapes.items() if list(shape) != own[name]]
        if wrong:
            raise RequestError(400, f"Weight shapes differ from the served model's: {wrong[:5]}")


def _sampling_of(body: dict[str, Any]) -> _Sampling:
    """The sampling settings of a completions request, with vLLM's defaults and range checks."""

    def number(name, default, low=None, high=None, kind=float):
        value = body.get(name)
        value = default if value is None else value
        wrong_type = not isinstance(value, int if kind is int else (int, float)) or isinstance(value, bool)
        if wrong_type:
            raise RequestError(400, f"`{name}` must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise RequestError(400, f"`{name}` must be in [{low}, {high}], got {value}")
        return kind(value)

    logprobs = body.get("logprobs")
    prompt_logprobs = body.get("prompt_logprobs")
    stop_token_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_token_ids, list) or not all(isinstance(t, int) for t in stop_token_ids):
        raise RequestError(400, f"`stop_token_ids` must be a list of token ids, got {stop_token_ids!r}")
    return _Sampling(
        n=number("n", 1, 1, kind=int),
        temperature=number("temperature", 1.0, 0.0),
        top_p=number("top_p", 1.0, 1e-9, 1.0),
        top_k=number("top_k", 0, -1, kind=int),
        min_p=number("min_p", 0.0, 0.0, 1.0),
        repetition_penalty=number("repetition_penalty", 1.0, 1e-9),
        max_tokens=number("max_tokens", 16, 1, kind=int),
        logprobs=None if logprobs is None else number("logprobs", 0, -1, kind=int),
        prompt_logprobs=None if prompt_logprobs is None else number("prompt_logprobs", 0, -1, kind=int),
        stop_token_ids=stop_token_ids,
        ignore_eos=bool(body.get("ignore_eos")),
        seed=None if body.get("seed") is None else number("seed", 0, kind=int),
    )


def _processed_logits(logits, seen, sampling: _Sampling):
    """The logits vLLM's sampler draws from (and reports processed log-probs of): repetition penalty, then (when
    sampling) temperature, min-p, top-k and top-p. Filtered tokens get -inf."""
    import torch

    if sampling.repetition_penalty != 1.0:
        penalized = torch.where(logits > 0, logits / sampling.repetition_penalty, logits * sampling.repetition_penalty)
        logits = torch.where(seen, penalized, logits)
    if sampling.greedy:
        return logits
    logits = logits / sampling.temperature
    if sampling.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < sampling.min_p * probs.max(dim=-1, keepdim=True).values, -math.inf)
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        mass_before = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1) - torch.softmax(sorted_logits, dim=-1)
        drop = (mass_before >= sampling.top_p).scatter(-1, order, mass_before >= sampling.top_p)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def _seeded(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


# ---- TRL's vLLM code against the loopback server --------------------------------------------------------------------


@contextlib.contextmanager
def loopback_trl_vllm() -> Iterator[None]:
    """Run TRL's real vLLM client code on CPU against a `LoopbackVLLMServer` (tests only).

    While active: TRL's client and backend see vllm as available; `VLLMClient.init_communicator` does the HTTP half of
    the handshake (server checks, `/init_weight_transfer_engine`) without opening an NCCL group, which needs CUDA; and
    `VLLMClient.update_named_params` announces the tensors on `/update_weights` as usual but delivers them as a file to
    `/test/load_weights` instead of an NCCL broadcast. So `VLLMGeneration.sync_weights()` and
    `GRPOTrainer(use_vllm=True, vllm_mode="server")` run unchanged apart from the transport. Server mode only:
    colocate mode needs vllm itself.
    """
    from unittest import mock

    from trl.generation import vllm_client, vllm_generation

    def available(*args, **kwargs) -> bool:
        return True

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(vllm_client, "is_vllm_available", available))
        stack.enter_context(mock.patch.object(vllm_generation, "is_vllm_available", available))
        client_class = vllm_client.VLLMClient
        stack.enter_context(mock.patch.object(client_class, "init_communicator", _init_communicator_over_http))
        stack.enter_context(mock.patch.object(client_class, "update_named_params", _update_named_params_via_file))
        yield


def _init_communicator_over_http(self, device=0) -> None:
    """`VLLMClient.init_communicator` without the NCCL group: the same server checks and handshake route."""
    if self.get_server_info()["weight_transfer_config"] is None:
        raise RuntimeError(f"The vLLM server at {self.base_url} has no weight-transfer engine")
    init_info = {
        "master_address": "127.0.0.1",
        "master_port": self.group_port,
        "rank_offset": 1,
        "world_size": self.get_world_size() + 1,  # the trainer joins the server's workers as rank 0
    }
    self._post(f"{self.base_url}/init_weight_transfer_engine", json={"init_info": init_info})


def _update_named_params_via_file(self, metadata, named_params) -> None:
    """`VLLMClient.update_named_params` with the NCCL broadcast replaced by a safetensors file on local disk."""
    from safetensors.torch import save_file

    names, dtype_names, shapes = (list(column) for column in zip(*metadata, strict=True))
    opens_update = not self._updating_weights
    if opens_update:
        self._start_weight_update()
    # Copies, because the iterator may hand out merged-then-unmerged PEFT weights or gathered shards.
    tensors = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in named_params}
    with tempfile.TemporaryDirectory(prefix="loopback-weights-") as folder:
        path = os.path.join(folder, "weights.safetensors")
        save_file(tensors, path)
        update_info = {"names": names, "dtype_names": dtype_names, "shapes": shapes}
        self._post(f"{self.base_url}/update_weights", json={"update_info": update_info})
        self._post(f"{self.base_url}{LOAD_WEIGHTS_ROUTE}", json={"path": path})
    if opens_update:
        self._finish_weight_update()
