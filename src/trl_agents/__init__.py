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

__version__ = "0.1.0.dev0"

from .trainers import METHODS, AgentGRPOConfig, AgentGRPOTrainer, GiGPOConfig, GiGPOTrainer, get_method  # noqa: E402
from .trajectory import Group, RolloutBatch, Step, Trajectory  # noqa: E402

__all__ = [
    "METHODS",
    "AgentGRPOConfig",
    "AgentGRPOTrainer",
    "GiGPOConfig",
    "GiGPOTrainer",
    "Group",
    "RolloutBatch",
    "Step",
    "Trajectory",
    "get_method",
]
