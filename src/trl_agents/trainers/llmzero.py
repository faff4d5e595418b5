"""LLMZero: a tree search over training strategies (Fang et al. 2026, arXiv 2606.18388; docs/methods/llmzero.md).

LLMZero is a controller around training, not a change to the loss: it trains in stages, diagnoses each stage's
metrics into named pathologies, proposes coordinated multi-parameter transitions (capacity parameters never
decrease along a path, regularisation parameters move either way), trains each child from its parent's checkpoint
and picks the next node by UCB or best-first under a budget of stages. The math (diagnosis, proposals, constraint,
tree, UCB) and its settings are in `trl_agents/strategy.py`, the outer loop in `trl_agents/search.py`.

`LLMZeroConfig` is an `AgentGRPOConfig` with the controller's fields (`SearchArguments`). With `method: llmzero`,
`trl-agents train` runs the search (the trainer names its outer loop, `outer_loop = "search"`, and the CLI resolves
the name: this file needs nothing from the loop), each stage trained by `LLMZeroTrainer`, which is
`AgentGRPOTrainer` unchanged (GRPO); `trl-agents search --config CONFIG` runs the same search around any other
method's config. An `LLMZeroTrainer` built by hand trains one stage (plain GRPO); the search is
`trl_agents.search.run_search`.

Example:
    ```python
    from trl import ModelConfig
    from trl_agents.run import RunArguments
    from trl_agents.search import run_search
    from trl_agents.trainers.llmzero import LLMZeroConfig

    config = LLMZeroConfig("outputs/llmzero", env_name="sokoban", stage_steps=50, children_per_node=3,
                           search_budget=10, per_device_train_batch_size=64, num_generations=8)
    run_search(RunArguments(method="llmzero"), config, ModelConfig(model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct"))
    ```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..strategy import SearchArguments
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class LLMZeroConfig(AgentGRPOConfig, SearchArguments):
    r"""
    Configuration of the LLMZero search: every [`AgentGRPOConfig`] field (the strategy of the root stage) plus the
    controller's (`trl_agents.strategy.SearchArguments`).

    Args:
        stage_steps (`int`, *optional*, defaults to `50`): S, RL steps per stage.
        children_per_node (`int`, *optional*, defaults to `3`): K, transitions proposed at a trained node.
        search_budget (`int`, *optional*, defaults to `10`): Stages trained in all, the root included.
        ucb_c (`float`, *optional*, defaults to `1.0`): c of UCB.
        search_selection (`str`, *optional*, defaults to `"ucb"`): "ucb" or "best_first".
        search_backup (`str`, *optional*, defaults to `"max"`): A node's value over its subtree: "max" or "mean".
        search_metric (`str`, *optional*, defaults to `"success_rate"`): Held-out metric of a stage.
        proposer (`str`, *optional*, defaults to `"rules"`): "rules" or "llm" (with `proposer_url`).
        capacity_params (`list[str]`): Searched parameters that never decrease along a path.
        regularisation_params (`list[str]`): Searched parameters that move either way.
        search_dir (`str`, *optional*): Where search_tree.json and the stages go (default: output_dir).
    """

    def __post_init__(self):
        super().__post_init__()
        self.check_search()


class LLMZeroTrainer(AgentGRPOTrainer):
    """One stage of the LLMZero search: `AgentGRPOTrainer` unchanged (GRPO). The search itself is the outer loop
    named by `outer_loop`, `trl_agents.search.run_search` (`trl-agents train --method llmzero`, `trl-agents search`).
    Its math is that of each stage, GRPO's (`credit/grpo.py`); the controller's is `trl_agents/strategy.py`."""

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "llmzero"]
    _name = "LLMZero"
    config_class = LLMZeroConfig
    methods = (
        MethodInfo("llmzero", "arXiv 2606.18388", "trl_agents.credit.grpo",
                   max_staleness=0,
                   staleness_reason=("its controller changes the sampling settings between stages, and a rollout "
                                     "prefetched across a stage boundary would use the old ones"),
                   title="LLMZero",
                   hook="controller (outer loop)",
                   inputs=("stage metrics (reward, entropy, KL, clip fraction, turn length, zero-std groups)",
                           "held-out score before and after each stage"),
                   tests=("tests/methods/llmzero/",)),
    )
    outer_loop: ClassVar[str] = "search"
    """What `trl-agents train` runs for this method, by name (`cli.OUTER_LOOPS`): the strategy search, each stage
    trained by this class."""
