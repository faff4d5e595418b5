"""Rollouts: the turn loop, prompt rendering and generators."""

from .engine import ROW_FORMATS, EnvPool, RolloutEngine
from .generators import GenerationOutput, Generator, SamplingParams, TransformersGenerator
from .prompts import PromptRenderer, PromptTooLongError
from .vllm import VLLMGenerator

__all__ = [
    "ROW_FORMATS",
    "EnvPool",
    "GenerationOutput",
    "Generator",
    "PromptRenderer",
    "PromptTooLongError",
    "RolloutEngine",
    "SamplingParams",
    "TransformersGenerator",
    "VLLMGenerator",
]
