"""trl-agents: train LLM agents on multi-turn environments with RL, on TRL's GRPOTrainer.

Example:
    ```python
    from trl_agents import GiGPOConfig, GiGPOTrainer
    from trl_agents.envs import get_env_class

    tasks = get_env_class("sokoban").task_split("train", 256)
    trainer = GiGPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=GiGPOConfig("out"), train_dataset=tasks)
    trainer.train()
    ```
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0.dev0"

# Trainers import TRL (seconds); environments and the data model do not. Import lazily so that
# `trl_agents.envs` and `trl-agents envs` stay fast. Every registered method's Config and Trainer classes (e.g.
# `GiGPOConfig`, `BPOTrainer`) resolve from the method registry, so a new method needs no edit here.
_LAZY = {
    "METHODS": "trainers",
    "get_method": "trainers",
    "Step": "trajectory",
    "Trajectory": "trajectory",
    "Group": "trajectory",
    "RolloutBatch": "trajectory",
}

__all__ = ["METHODS", "Group", "RolloutBatch", "Step", "Trajectory", "get_method"]


def _method_classes() -> dict[str, type]:
    return importlib.import_module(".trainers", __name__).method_classes()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name.endswith(("Config", "Trainer")):
        classes = _method_classes()
        if name in classes:
            return classes[name]
    raise AttributeError(f"module 'trl_agents' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_method_classes()))
