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
# `trl_agents.envs` and `trl-agents envs` stay fast.
_LAZY = {
    "AgentGRPOConfig": "trainers",
    "AgentGRPOTrainer": "trainers",
    "GiGPOConfig": "trainers",
    "GiGPOTrainer": "trainers",
    "VICTConfig": "trainers",
    "VICTTrainer": "trainers",
    "BEPOConfig": "trainers",
    "BEPOTrainer": "trainers",
    "ECPOConfig": "trainers",
    "ECPOTrainer": "trainers",
    "CASTConfig": "trainers",
    "CASTTrainer": "trainers",
    "SSPOConfig": "trainers",
    "SSPOTrainer": "trainers",
    "ProGPOConfig": "trainers",
    "ProGPOTrainer": "trainers",
    "SCPOConfig": "trainers",
    "SCPOTrainer": "trainers",
    "BiPACEConfig": "trainers",
    "BiPACETrainer": "trainers",
    "METHODS": "trainers",
    "get_method": "trainers",
    "Step": "trajectory",
    "Trajectory": "trajectory",
    "Group": "trajectory",
    "RolloutBatch": "trajectory",
}

__all__ = [
    "METHODS",
    "BiPACETrainer",
    "BiPACEConfig",
    "SCPOTrainer",
    "SCPOConfig",
    "ProGPOTrainer",
    "ProGPOConfig",
    "SSPOTrainer",
    "SSPOConfig",
    "CASTTrainer",
    "CASTConfig",
    "ECPOTrainer",
    "ECPOConfig",
    "BEPOTrainer",
    "BEPOConfig",
    "AgentGRPOConfig",
    "AgentGRPOTrainer",
    "GiGPOConfig",
    "GiGPOTrainer",
    "VICTConfig",
    "VICTTrainer",
    "Group",
    "RolloutBatch",
    "Step",
    "Trajectory",
    "get_method",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'trl_agents' has no attribute {name!r}")
