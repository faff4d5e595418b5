"""ECPO: evidence-calibrated action advantages with a variance gate (Li et al. 2026, arXiv 2606.05885).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: at every anchor state, the mean step return of each
canonical action is shrunk toward the state's mean, and the resulting action advantage is added to the GRPO episode
advantage with a weight that grows with the between-action share of the return variance,
`Â = A^GRPO + ω·ρ_VG(s)·A_act(s, u)` (math in `trl_agents/credit/ecpo.py`; docs: docs/methods/ecpo.md). The episode
part is GRPO as `AgentGRPOConfig` sets it (`scale_rewards`, `credit_statistic`, `invalid_action_penalty`). Needs
environments with `state_key` (the anchors); canonical actions come from the env's `info["action"]` (ALFWorld:
`info["command"]`), else the normalised action text.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.ecpo import ECPOConfig, ECPOTrainer

    tasks = Dataset.from_list(get_env_class("sokoban").task_split("train", 256))
    config = ECPOConfig(output_dir="sokoban-ecpo", max_turns=15, max_completion_length=64)
    ECPOTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..names import check_choice
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class ECPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`ECPOTrainer`]: every [`AgentGRPOConfig`] field plus ECPO's (docs/methods/ecpo.md).

    The episode-level credit A^GRPO follows `scale_rewards`, `credit_statistic` and `invalid_action_penalty`.

    Args:
        gamma (`float`, *optional*, defaults to `0.95`): Discount of the step returns (as GiGPO).
        step_advantage_w (`float`, *optional*, defaults to `1.0`): ω, weight of the gated action advantage.
        shrinkage_kappa (`float`, *optional*, defaults to `2.0`): κ, pseudo-count of the shrinkage.
        variance_gate_tau (`float` or `None`, *optional*): τ of the gate's confidence tanh(n_s/τ); None = G.
        ecpo_mode (`str`, *optional*, defaults to `"mean_norm"`): `"mean_norm"` or `"mean_std_norm"` scale of A_act.
        anchor (`str`, *optional*, defaults to `"state_key"`): What identifies a state.
        similarity_threshold (`float` or `None`, *optional*): Cluster text anchors by similarity instead of equality.
        merge_invalid_actions (`bool`, *optional*, defaults to `True`): Count rejected actions as one action.
    """

    gamma: float = field(
        default=0.95,
        metadata={"help": "Discount γ in [0, 1] of the step returns R_t = Σ γ^(k−t) r_k (as GiGPO; verl-agent "
        "scripts: 0.95)."},
    )
    step_advantage_w: float = field(
        default=1.0,
        metadata={"help": "ω, weight of the gated action advantage in Â = A^GRPO + ω·ρ_VG·A_act. Our choice: 1.0 as "
        "GiGPO (docs/methods/ecpo.md, 'Our choices', step 5 [D])."},
    )
    shrinkage_kappa: float = field(
        default=2.0,
        metadata={"help": "κ >= 0, pseudo-count pulling an action's mean return toward its state's mean: "
        "(n·G + κ·μ)/(n + κ). 2.0 in the paper (docs/methods/ecpo.md step 2 [S]); 0 = no shrinkage."},
    )
    variance_gate_tau: float | None = field(
        default=None,
        metadata={"help": "τ > 0 of the gate's confidence tanh(n_s/τ), n_s = visits of the state. None = the group "
        "size G (our choice: τ was not recovered from the paper; docs/methods/ecpo.md, 'Our choices', step 4 [D])."},
    )
    ecpo_mode: str = field(
        default="mean_norm",
        metadata={"help": "Scale F of the action advantage (μ̃ − μ_s)/F: 'mean_norm' (F = 1) or 'mean_std_norm' "
        "(F = std of the state's step returns + 1e-6). Our choice: follow GiGPO's mode, default mean_norm "
        "(docs/methods/ecpo.md, 'Our choices', step 3 [D])."},
    )
    anchor: str = field(
        default="state_key",
        metadata={"help": "'state_key': the environment's canonical state (the observation text for a step without "
        "one); 'observation': the raw history-free observation text, as GiGPO's anchor_obs."},
    )
    similarity_threshold: float | None = field(
        default=None,
        metadata={"help": "If set (in (0, 1)), text anchors join the first cluster whose first member has difflib "
        "ratio >= threshold (as GiGPO's enable_similarity); None = exact anchors."},
    )
    merge_invalid_actions: bool = field(
        default=True,
        metadata={"help": "Count every rejected action as one canonical action '<invalid>' (they are all the same "
        "no-op); our choice, docs/methods/ecpo.md, 'Our choices', step 1 [D]. False tells them apart by their "
        "normalised text."},
    )

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not math.isfinite(self.step_advantage_w):
            raise ValueError(f"step_advantage_w must be finite, got {self.step_advantage_w}")
        if not (math.isfinite(self.shrinkage_kappa) and self.shrinkage_kappa >= 0):
            raise ValueError(f"shrinkage_kappa must be a number >= 0 (0 = no shrinkage), got {self.shrinkage_kappa}")
        if self.variance_gate_tau is not None and not (
            math.isfinite(self.variance_gate_tau) and self.variance_gate_tau > 0
        ):
            raise ValueError(
                f"variance_gate_tau must be > 0, or None for the group size; got {self.variance_gate_tau}"
            )
        check_choice("ecpo_mode", self.ecpo_mode, ("mean_norm", "mean_std_norm"))
        check_choice("anchor", self.anchor, ("state_key", "observation"))
        if self.similarity_threshold is not None and not 0.0 < self.similarity_threshold < 1.0:
            raise ValueError(
                f"similarity_threshold must be in (0, 1), or None for exact anchors; got {self.similarity_threshold}"
            )


class ECPOTrainer(AgentGRPOTrainer):
    """ECPO on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring)."""

    _tag_names = ["trl", "trl-agents", "ecpo"]
    _name = "ECPO"
    config_class = ECPOConfig
    methods = (
        MethodInfo("ecpo", "arXiv 2606.05885", "trl_agents.credit.ecpo", max_staleness=1, title="ECPO",
                   inputs=("episode returns", "step rewards", "state keys",
                           "canonical actions (info['action'] / info['command'], else normalised text)"),
                   tests=("tests/methods/ecpo/",)),
    )
    required_env_capabilities = ("state_key",)

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("ecpo", groups)
