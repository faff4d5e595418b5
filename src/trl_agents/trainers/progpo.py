"""ProGPO: exact-prefix peer comparison plus potential-based transition credit (Fan & Liu 2026, arXiv 2607.04242).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: A = A^E + w_p·A^peer + w_tr·A^tr/σ_tr, where
A^peer compares the returns of episodes that acted after the exact same history, and A^tr = γΦ(s') − Φ(s) is the
difference of rollout-estimated success potentials, fused across history depths by inverse variance (math in
`trl_agents/credit/progpo.py`; docs: docs/methods/progpo.md, mostly our design [D] because only the abstract is
available). σ_tr is the std of the transition credits over the whole generation batch (all processes).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.progpo import ProGPOConfig, ProGPOTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 256))
    config = ProGPOConfig(output_dir="alfworld-progpo", max_turns=50, max_completion_length=512)
    ProGPOTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..names import check_choice
from ..credit.progpo import ANCHORS, MODES, PREFIXES, TRANSITION_NORMS
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class ProGPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`ProGPOTrainer`]: every [`AgentGRPOConfig`] field plus ProGPO's (docs/methods/progpo.md).

    Args:
        gamma (`float`, *optional*, defaults to `0.95`): Discount of the step returns and of the potential
            difference γΦ(s') − Φ(s).
        peer_weight (`float`, *optional*, defaults to `1.0`): w_p, weight of the exact-prefix peer advantage.
        transition_weight (`float`, *optional*, defaults to `1.0`): w_tr, weight of the transition credit.
        transition_norm (`str`, *optional*, defaults to `"batch"`): σ_tr: std over the batch, the group, or none.
        progpo_mode (`str`, *optional*, defaults to `"mean_std_norm"`): z-score or centre A^E and A^peer.
        episode_statistic (`str`, *optional*, defaults to `"trajectories"`): Population of the A^E statistic.
        prefix (`str`, *optional*, defaults to `"interaction"`): What two histories must share to be peers.
        anchor (`str`, *optional*, defaults to `"state_key"`): State identity of the potentials.
        potential_depth (`int`, *optional*, defaults to `2`): K, deepest history context fused into Φ.
        potential_smoothing (`bool`, *optional*, defaults to `True`): Beta(1, 1) prior on the success rates.
        potential_variance_floor (`float`, *optional*, defaults to `1e-4`): ε₀ added to each variance.
    """

    gamma: float = field(
        default=0.95,
        metadata={"help": "Discount γ of the step returns R_t and of the transition credit γΦ(s_{t+1}) − Φ(s_t) "
        "(verl-agent ALFWorld/WebShop scripts: 0.95; docs/concepts/verl_agent_conventions.md)."},
    )
    peer_weight: float = field(
        default=1.0,
        metadata={"help": "w_p, weight of the exact-prefix peer advantage A^peer (our choice: 1, as GiGPO's ω; "
        "docs/methods/progpo.md, 'Our choices', step 5 [D])."},
    )
    transition_weight: float = field(
        default=1.0,
        metadata={"help": "w_tr, weight of the normalised transition credit A^tr/σ_tr (our choice: 1; "
        "docs/methods/progpo.md, 'Our choices', step 5 [D])."},
    )
    transition_norm: str = field(
        default="batch",
        metadata={"help": "σ_tr dividing the transition credit: 'batch' (std over the step rows of the generation "
        "batch, all processes, of the groups with both successes and failures, the only ones with transition "
        "credit; docs/methods/progpo.md step 5 [D]), 'group' (std within the task's group) or 'none' (σ_tr = 1). "
        "A std of 0 counts as 1. Our choice."},
    )
    progpo_mode: str = field(
        default="mean_std_norm",
        metadata={"help": "Normalisation of A^E and A^peer: 'mean_std_norm' (z-score, F = std + 1e-6; our choice "
        "following HGPO, whose groups are z-scored; docs/methods/progpo.md) or 'mean_norm' (F = 1)."},
    )
    episode_statistic: str = field(
        default="trajectories",
        metadata={"help": "Population of the episode-level mean/std of A^E: 'trajectories' (GRPO's A^E_i; "
        "our choice) or 'step_rows' (verl-agent: longer episodes weigh more)."},
    )
    prefix: str = field(
        default="interaction",
        metadata={"help": "Exact-prefix peers (docs/methods/progpo.md step 1): 'interaction' = same observations and "
        "canonical actions before the step and same current observation (the paper's exact interaction "
        "prefix); 'actions' = same canonical actions only (equal in deterministic environments). Canonical "
        "action (our choice): step.info['action'] (ALFWorld: 'command') when the env reports one, else the reply "
        "lower-cased with whitespace collapsed."},
    )
    anchor: str = field(
        default="state_key",
        metadata={"help": "State identity s of the potentials Φ(C_k(s)): 'state_key' (the env's canonical state, "
        "the observation text when a step has none; our choice) or 'observation' (raw observation text)."},
    )
    potential_depth: int = field(
        default=2,
        metadata={"help": "K: potentials are estimated on the history contexts C_k(s_t) = (s_{t−k}, …, s_t) for "
        "k = 0..K and fused by inverse variance (our choice: 2, HGPO's memory window 2 or 4; docs/methods/progpo.md "
        "step 2 [D])."},
    )
    potential_smoothing: bool = field(
        default=True,
        metadata={"help": "Beta(1, 1) prior on each context's success rate, Φ̂ = (successes + 1)/(visits + 2) "
        "(our choice, docs/methods/progpo.md step 2 [D]); False: successes/visits."},
    )
    potential_variance_floor: float = field(
        default=1e-4,
        metadata={"help": "ε₀ in Var_k = Φ̂_k(1 − Φ̂_k)/n_k + ε₀, so that no context gets infinite weight "
        "(our choice, docs/methods/progpo.md step 2 [D])."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("transition_norm", self.transition_norm, TRANSITION_NORMS)
        check_choice("progpo_mode", self.progpo_mode, MODES)
        check_choice("episode_statistic", self.episode_statistic, ("trajectories", "step_rows"))
        check_choice("prefix", self.prefix, PREFIXES)
        check_choice("anchor", self.anchor, ANCHORS)
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        for name in ("peer_weight", "transition_weight"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
        if self.potential_depth < 0:
            raise ValueError(f"potential_depth must be >= 0 (0 = the current state only), got {self.potential_depth}")
        if not (math.isfinite(self.potential_variance_floor) and self.potential_variance_floor > 0):
            raise ValueError(f"potential_variance_floor must be > 0 (e.g. 1e-4), got {self.potential_variance_floor}")


class ProGPOTrainer(AgentGRPOTrainer):
    """ProGPO on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring)."""

    _tag_names = ["trl", "trl-agents", "progpo"]
    _name = "ProGPO"
    config_class = ProGPOConfig
    methods = (
        MethodInfo("progpo", "arXiv 2607.04242", "trl_agents.credit.progpo", max_staleness=1, title="ProGPO",
                   inputs=("episode returns", "success labels", "step rewards",
                           "canonical actions (info['action'] or the reply)",
                           "state keys (observation text when the env has none)"),
                   tests=("tests/methods/progpo/",)),
    )

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("progpo", groups)
