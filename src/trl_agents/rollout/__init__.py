"""Rollouts: the turn loop, prompt rendering and generators."""

from .engine import ROW_FORMATS, RolloutEngine, TurnProgress
from .env_pool import EnvCallError, EnvPool, EnvTimeoutError
from .generators import GenerationOutput, Generator, SamplingParams, TransformersGenerator
from .progress import RolloutProgress
from .prompts import PromptRenderer, PromptTooLongError
from .vllm import VLLMGenerator

__all__ = [
    "ROW_FORMATS",
    "EnvCallError",
    "EnvPool",
    "EnvTimeoutError",
    "GenerationOutput",
    "Generator",
    "PromptRenderer",
    "PromptTooLongError",
    "RolloutEngine",
    "RolloutProgress",
    "SamplingParams",
    "TransformersGenerator",
    "TurnProgress",
    "VLLMGenerator",
]
