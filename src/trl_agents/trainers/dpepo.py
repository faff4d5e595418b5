"""DPEPO: Diverse Parallel Exploration Policy Optimization (arXiv 2604.24320; docs/methods/dpepo.md).

The changes w.r.t. `AgentGRPOTrainer`: the episodes run in the `parallel` environment (`trl_agents.envs.parallel`:
K copies of an inner environment on the same task, one answer per turn acting in any subset of them, success as
soon as one copy succeeds), and `compute_advantages` multiplies GRPO's cross-step z-score of the episode return by
a step-level diversity weight W (repeated actions and transitions within a copy and across copies shrink W):
A = z·W for z ≥ 0, z·(2 − W) for z < 0 (math in `trl_agents.credit.dpepo`). The cold start for the parallel format
is a solver warm start on the wrapper (`ParallelEnv.optimal_plan` renders parallel demonstrations).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.dpepo import DPEPOConfig, DPEPOTrainer

    tasks = Dataset.from_list(get_env_class("parallel").task_split("train", 500, inner="alfworld"))
    config = DPEPOConfig(output_dir="alfworld-dpepo", env_name="parallel", max_turns=25, num_generations=8,
                         env_kwargs={"inner": "alfworld", "num_envs": 4, "list_admissible": False})
    DPEPOTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from ..names import check_choice
from ..credit.dpepo import FORMULAS
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class DPEPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`DPEPOTrainer`]: every [`AgentGRPOConfig`] field plus DPEPO's weight. `env_name` is
    `"parallel"` with the inner environment in `env_kwargs` (`{inner: alfworld, num_envs: 4}`).

    Args:
        dpepo_depth_alpha (`float`, *optional*, defaults to `0.8`): α, base of the repeated-action term.
        dpepo_depth_gamma (`float`, *optional*, defaults to `0.95`): γ, repeated transition within a copy.
        dpepo_width_beta (`float`, *optional*, defaults to `0.95`): β, repeated transition across copies.
        dpepo_width_omega (`float`, *optional*, defaults to `0.8`): ω, the same action in several copies.
        dpepo_invalid_psi (`float`, *optional*, defaults to `0.95`): ψ, rejected sub-actions (ScienceWorld).
        dpepo_no_action_weight (`float`, *optional*, defaults to `0.5`): W of a turn without a parsable action.
        dpepo_weight_formula (`str`, *optional*, defaults to `"alfworld"`): How W combines its terms.
        dpepo_diversity_weight (`bool`, *optional*, defaults to `True`): Multiply the advantage by W.
        history_length (`int`, *optional*, defaults to `0`): The wrapper shows each copy's history itself.
        invalid_action_penalty (`float`, *optional*, defaults to `0.0`).
    """

    dpepo_depth_alpha: float = field(
        default=0.8, metadata={"help": "α: a copy repeating an action it took C times before gets α^C (depth_alpha)."}
    )
    dpepo_depth_gamma: float = field(
        default=0.95,
        metadata={"help": "γ: a copy repeating a transition (previous action → action) it made M times gets γ^M "
        "(depth_t_gamma)."},
    )
    dpepo_width_beta: float = field(
        default=0.95,
        metadata={"help": "β: a transition the other acting copies made M times (their action of this turn "
        "included) gets β^M (width_t_beta)."},
    )
    dpepo_width_omega: float = field(
        default=0.8,
        metadata={"help": "ω: C copies doing the same action this turn ('look' excepted) give ω^C (width_omega: 0.95 "
        "in the released yaml, 0.80 in its launchers, which we follow)."},
    )
    dpepo_invalid_psi: float = field(
        default=0.95,
        metadata={"help": "ψ: n sub-actions the environment rejected give ψ^n; read by the ScienceWorld formulas "
        "only (invalid_penalty)."},
    )
    dpepo_no_action_weight: float = field(
        default=0.5,
        metadata={"help": "W of a turn without any parsable <env_i> action (no_action_penalty)."},
    )
    dpepo_weight_formula: str = field(
        default="alfworld",
        metadata={"help": "'alfworld': W = (ω^C_width + mean W_env)/2 (the ALFWorld loop); 'scienceworld': (ω^C_width "
        "+ mean W_env + ψ^n)/3; 'scienceworld_released': ψ^n alone, what the released ScienceWorld script trains "
        "with (a second loop overwrites W; docs/methods/dpepo.md)."},
    )
    dpepo_diversity_weight: bool = field(
        default=True,
        metadata={"help": "Multiply the advantage by W (parallel_reward); False trains the parallel paradigm with the "
        "plain cross-step GRPO z-score (the paper's 'w/o DAR and DTR' ablation)."},
    )
    history_length: int = field(
        default=0,
        metadata={"help": "Must be 0: the parallel environment shows every copy's earlier actions and observations "
        "itself (its `max_history` bounds them)."},
    )
    invalid_action_penalty: float = field(
        default=0.0,
        metadata={"help": "λ on a turn none of whose sub-actions the environment accepted. Our choice "
        "(docs/methods/dpepo.md): 0, the released parallel rollout records no action validity; W already "
        "discounts a turn without a parsable action."},
    )

    def __post_init__(self):
        super().__post_init__()
        for name in ("dpepo_depth_alpha", "dpepo_depth_gamma", "dpepo_width_beta", "dpepo_width_omega",
                     "dpepo_invalid_psi"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 < value <= 1.0):
                raise ValueError(f"{name} must be in (0, 1] (a base of the diversity weight), got {value}")
        if not 0.0 <= self.dpepo_no_action_weight <= 1.0:
            raise ValueError(f"dpepo_no_action_weight must be in [0, 1] (released: 0.5), got "
                             f"{self.dpepo_no_action_weight}")
        check_choice("dpepo_weight_formula", self.dpepo_weight_formula, FORMULAS)
        if not math.isfinite(self.invalid_action_penalty):
            raise ValueError(f"invalid_action_penalty must be finite, got {self.invalid_action_penalty}")
        if self.history_length != 0:
            raise ValueError(f"history_length must be 0 for DPEPO (the parallel environment shows each copy's history; "
                             f"bound it with env_kwargs max_history), got {self.history_length}")
        if self.env_name not in (None, "parallel"):
            raise ValueError(f"DPEPO acts in K parallel copies: set env_name='parallel' and env_kwargs={{'inner': "
                             f"{self.env_name!r}, 'num_envs': 4}}, got env_name={self.env_name!r}")
        if self.topology != "independent":
            raise ValueError(f"DPEPO runs G independent parallel episodes per task: topology must be 'independent', "
                             f"got {self.topology!r}")


class DPEPOTrainer(AgentGRPOTrainer):
    """DPEPO on `AgentGRPOTrainer` (see the module docstring): `compute_advantages` with the diversity weight.

    Logs `dpepo/mean_weight` (mean W over the batch's turns), `dpepo/no_action_fraction` (turns without a parsable
    action), `dpepo/mean_envs_per_step` (copies stepped per turn) and `dpepo/amplified_fraction` (turns whose
    negative advantage was scaled by 2 − W > 1).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "dpepo"]
    _name = "DPEPO"
    config_class = DPEPOConfig
    methods = (
        MethodInfo("dpepo", "arXiv 2604.24320", "trl_agents.credit.dpepo", max_staleness=1, title="DPEPO",
                   hook="compute_advantages (+ the parallel environment)",
                   inputs=("episode returns", "per-copy actions of every turn (parallel environment step info)"),
                   tests=("tests/methods/dpepo/",)),
    )

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("dpepo", groups)
