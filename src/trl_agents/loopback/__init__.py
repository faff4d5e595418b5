"""Test-only servers: loopback stand-ins for external services, so tests run the real client code on CPU, offline.

* `LoopbackVLLMServer`: the HTTP routes of `vllm serve` that TRL's `VLLMClient` uses, backed by a transformers model.
* `loopback_trl_vllm()`: lets TRL's real vLLM code (client, `VLLMGeneration`, `GRPOTrainer(use_vllm=True)`) run
  against it without vllm or CUDA installed; only the NCCL weight transport is swapped for a file.
* `LoopbackHubServer`: the Hugging Face Hub HTTP API that huggingface_hub, datasets and transformers use to create
  repos, upload (regular and LFS), list and download files, kept in memory.

Not for production: the vLLM server generates one prompt at a time with plain transformers; the Hub server keeps
everything in memory and speaks only the routes those libraries call.
"""

from .hub_server import LoopbackHubServer
from .vllm_server import LOAD_WEIGHTS_ROUTE, LoopbackVLLMServer, loopback_trl_vllm

__all__ = ["LOAD_WEIGHTS_ROUTE", "LoopbackHubServer", "LoopbackVLLMServer", "loopback_trl_vllm"]
