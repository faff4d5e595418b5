"""GiGPO: Group-in-Group Policy Optimization (Feng et al. 2025, arXiv 2505.10978).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: an episode-level group advantage plus a
step-level advantage among the steps that acted from the same (anchor) state, `A = A^E + ω·A^S`
(math in `trl_agents/credit/gigpo.py`; docs: docs/methods/gigpo.md). Defaults follow the reference code (verl-agent):
γ = 0.95, ω = 1, `mean_norm`, statistics over step rows, invalid-action penalty 0.1.

Example:
    ```python
    from datasets import Dataset
    from trl_agents import GiGPOConfig, GiGPOTrainer
    from trl_agents.envs import get_env_class

    tasks = Dataset.from_list(get_env_class("sokoban").task_split("train", 256))
    config = GiGPOConfig(output_dir="sokoban-gigpo", max_turns=15, max_completion_length=64)
    GiGPOTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..names import check_choice
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class GiGPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`GiGPOTrainer`]: every [`AgentGRPOConfig`] field plus GiGPO's.

    Args:
        gamma (`float`, *optional*, defaults to `0.95`): Discount of the step returns (Eq. 5). verl-agent's config
            default is 1.0 but every GiGPO script sets 0.95.
        step_advantage_w (`float`, *optional*, defaults to `1.0`): ω, weight of the step-level advantage (Eq. 8).
        gigpo_mode (`str`, *optional*, defaults to `"mean_norm"`): `"mean_norm"` (GiGPO w/o std) or
            `"mean_std_norm"` (w/ std), at both levels.
        episode_statistic (`str`, *optional*, defaults to `"step_rows"`): Population of the episode-level mean/std.
        anchor (`str`, *optional*, defaults to `"state_key"`): What identifies a state.
        similarity_threshold (`float` or `None`, *optional*): Cluster text anchors by similarity instead of equality.
    """

    gamma: float = field(
        default=0.95,
        metadata={"help": "Discount γ of the step returns R_t = Σ γ^(k−t) r_k (GiGPO Eq. 5; verl-agent scripts: 0.95)."},
    )
    step_advantage_w: float = field(
        default=1.0, metadata={"help": "ω, weight of the step-level (anchor-state) advantage in A = A^E + ω·A^S."}
    )
    gigpo_mode: str = field(
        default="mean_norm",
        metadata={"help": "'mean_norm' (F=1, GiGPO w/o std; verl-agent config default) or 'mean_std_norm' "
        "(F = std + 1e-6), applied at both levels."},
    )
    episode_statistic: str = field(
        default="step_rows",
        metadata={"help": "Population of the episode-level mean/std: 'step_rows' (verl-agent, "
        "compute_mean_std_cross_steps=True: longer episodes weigh more) or 'trajectories' (paper Eq. 3)."},
    )
    anchor: str = field(
        default="state_key",
        metadata={"help": "'state_key': the environment's canonical state (falls back to the observation text when "
        "the env has none) — our choice, robust to feedback lines in observations; 'observation': the raw "
        "history-free observation text, as verl-agent's anchor_obs."},
    )
    similarity_threshold: float | None = field(
        default=None,
        metadata={"help": "If set (in (0, 1)), text anchors join the first cluster whose first member has "
        "difflib ratio >= threshold (verl-agent enable_similarity; 0.95 default there, 0.9 for search)."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("gigpo_mode", self.gigpo_mode, ("mean_norm", "mean_std_norm"))
        check_choice("episode_statistic", self.episode_statistic, ("step_rows", "trajectories"))
        check_choice("anchor", self.anchor, ("state_key", "observation"))
        if self.similarity_threshold is not None and not 0.0 < self.similarity_threshold < 1.0:
            raise ValueError(f"similarity_threshold must be in (0, 1), got {self.similarity_threshold}")


class GiGPOTrainer(AgentGRPOTrainer):
    """GiGPO on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring)."""

    _tag_names = ["trl", "trl-agents", "gigpo"]
    _name = "GiGPO"
    config_class = GiGPOConfig
    methods = (
        MethodInfo("gigpo", "arXiv 2505.10978", "trl_agents.credit.gigpo", max_staleness=1, title="GiGPO",
                   inputs=("episode returns", "step rewards", "state keys (observation text when the env has none)"),
                   tests=("tests/credit/test_credit.py", "tests/training/test_trainer.py")),
    )

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("gigpo", groups)
