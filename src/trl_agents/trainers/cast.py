"""CAST: Credit Assignment from Solver Teachers (arXiv 2607.25308).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: the GRPO outcome advantage of each episode plus
α times a shaped per-turn solver advantage `Ã = N(s_t) − N(s_{t+1})` (asinh, divided by its RMS over every turn of
the batch), `A_{i,t} = A_i + α·asinh(Ã_{i,t}) / RMS_B` (math in `trl_agents/credit/cast.py`; docs/methods/cast.md).
The trainer declares the `solver_value` signal, so the rollout records N(s_t), N(s_{t+1}) for every step where the
environment lives, and the method needs environments with an exact solver (`solver_value`: Sokoban, Rush Hour,
Minesweeper, FrozenLake, ...).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.cast import CASTConfig, CASTTrainer

    tasks = Dataset.from_list(get_env_class("sokoban").task_split("train", 256))
    config = CASTConfig(output_dir="sokoban-cast", env_name="sokoban", max_turns=30, row_format="conversation")
    CASTTrainer(model="Qwen/Qwen3-4B-Instruct-2507", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from ..names import check_choice
from ..credit.cast import NORMS, SOLVER_RULES, TRANSFORMS
from ..envs import get_env_class
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class CASTConfig(AgentGRPOConfig):
    r"""
    Configuration of [`CASTTrainer`]: every [`AgentGRPOConfig`] field plus CAST's.

    CAST's outcome term is fixed by the method (z-score over the G episode returns, Bessel std, groups with
    std < 1e-6 get 0), so `scale_rewards` and `credit_statistic` do not apply.

    Args:
        cast_alpha (`float`, *optional*, defaults to `0.1`): α, weight of the shaped solver term.
        cast_transform (`str`, *optional*, defaults to `"asinh"`): Compression g of the solver advantage.
        cast_norm (`str`, *optional*, defaults to `"rms"`): Divide g by its batch RMS, or not.
        cast_eps (`float`, *optional*, defaults to `1e-8`): ε of g / (RMS + ε).
        solver_rule (`str`, *optional*, defaults to `"auto"`): Boundary rules of the solver advantage.
        invalid_action_penalty (`float`, *optional*, defaults to `0.0`): CAST has none (an invalid action only
            gets Ã = 0).
    """

    cast_alpha: float = field(
        default=0.1,
        metadata={"help": "α in A = A_outcome + α·g(Ã)/RMS (CAST paper and EXPERIMENTS.md: 0.1; the code's default "
        "when unset is 0.3; the paper sweeps 0.01/0.1/0.3/0.5). docs/methods/cast.md, 'Defaults'."},
    )
    cast_transform: str = field(
        default="asinh",
        metadata={"help": "Compression g of the solver advantage: 'asinh' (CAST), or the ablations 'identity' and "
        "'signed_log' (sign(x)·log(1+|x|)) of the code's cast_ablate mode (docs/methods/cast.md#equations)."},
    )
    cast_norm: str = field(
        default="rms",
        metadata={"help": "'rms': divide g by its RMS over every turn of the batch, zeros included (CAST); 'none': "
        "no normalisation (cast_ablate CAST_NORM=none)."},
    )
    cast_eps: float = field(default=1e-8, metadata={"help": "ε in g / (RMS + ε) (CAST cast_eps, 1e-8)."})
    solver_rule: str = field(
        default="auto",
        metadata={"help": "Boundary rules of Ã = N(s_t) − N(s_t+1): 'shortest_path' (Sokoban, Rush Hour: dead "
        "state → 0, fatal move → −N(s_t)), 'minesweeper' (win/mine-hit/rescue rules), or 'auto' — our choice "
        "(docs/methods/cast.md, Our choices): the rules the environment declares (`AgentEnv.solver_semantics`: "
        "'minesweeper' for Minesweeper, 'shortest_path' for the others)."},
    )
    invalid_action_penalty: float = field(
        default=0.0,
        metadata={"help": "Penalty λ for steps whose action the environment rejected. CAST has none (rLLM applies "
        "no format penalty; an invalid action only gets Ã = 0), hence 0 here."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("cast_transform", self.cast_transform, TRANSFORMS)
        check_choice("cast_norm", self.cast_norm, NORMS)
        check_choice("solver_rule", self.solver_rule, ("auto", *SOLVER_RULES))
        if not (math.isfinite(self.cast_alpha) and self.cast_alpha >= 0):
            raise ValueError(f"cast_alpha must be a finite number >= 0 (paper: 0.1), got {self.cast_alpha}")
        if not self.cast_eps > 0:
            raise ValueError(f"cast_eps must be > 0 (CAST: 1e-8), got {self.cast_eps}")
        if not math.isfinite(self.invalid_action_penalty):
            raise ValueError(f"invalid_action_penalty must be finite, got {self.invalid_action_penalty}")


class CASTTrainer(AgentGRPOTrainer):
    """CAST on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring).

    Logged diagnostics: `cast/rms` (RMS_B), `cast/solver_advantage_mean`, `cast/nonzero_solver_fraction`,
    `cast/dead_step_fraction`, `cast/fatal_step_fraction`, `cast/zero_variance_group_fraction`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "cast"]
    _name = "CAST"
    config_class = CASTConfig
    methods = (
        MethodInfo("cast", "arXiv 2607.25308", "trl_agents.credit.cast", max_staleness=1, title="CAST",
                   inputs=("episode returns", "solver values N(s_t), N(s_t+1) of every step"),
                   tests=("tests/methods/cast/",)),
    )
    signals = ("solver_value",)

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("cast", groups, solver_rule=[self.solver_rule_of(group) for group in groups])

    def solver_rule_of(self, group: Group) -> str:
        """The boundary rules for a group: the configured `solver_rule`, or with "auto" the environment's own
        `solver_semantics` (the env contract: "minesweeper" for Minesweeper, "shortest_path" for the others)."""
        if self.args.solver_rule != "auto":
            return self.args.solver_rule
        env_name = group.task.get("env") or self.args.env_name
        return get_env_class(env_name).solver_semantics
