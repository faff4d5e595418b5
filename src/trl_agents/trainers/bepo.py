"""Gated-BEPO: confidence-gated Bellman credit from empirical rollout graphs (Yan et al. 2026, arXiv 2608.06861).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: per group, the mean-backup Bellman fixed point of
the group's empirical state graph is solved exactly, its TD residuals are accumulated with GAE, and that credit is
added to the GRPO episode advantage at the states where the observed successors disagree,
`A = A^GRPO + g(s)·w(s)·Â^B` (math in `trl_agents/credit/bepo.py`; docs: docs/methods/bepo.md). The episode part
is GRPO as `AgentGRPOConfig` sets it (`scale_rewards`, `credit_statistic`, `invalid_action_penalty`). Needs
environments with `state_key` (the graph's nodes).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.bepo import BEPOConfig, BEPOTrainer

    tasks = Dataset.from_list(get_env_class("sokoban").task_split("train", 256))
    config = BEPOConfig(output_dir="sokoban-bepo", max_turns=15, max_completion_length=64)
    BEPOTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..names import check_choice
from ..credit.bepo import BELLMAN_NORMS, GATES, MIXINGS
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class BEPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`BEPOTrainer`]: every [`AgentGRPOConfig`] field plus Gated-BEPO's (docs/methods/bepo.md).

    The episode-level credit A^GRPO follows `scale_rewards`, `credit_statistic` and `invalid_action_penalty`.

    Args:
        gamma (`float`, *optional*, defaults to `0.95`): β, discount of the Bellman backup, TD residuals and GAE.
        gae_lambda (`float`, *optional*, defaults to `0.95`): λ of the GAE over the TD residuals.
        bepo_gate (`str`, *optional*, defaults to `"successors"`): Confidence gate: `"successors"`, `"actions"`,
            `"none"`.
        bepo_mixing (`str`, *optional*, defaults to `"visits"`): Weight of the gated Bellman credit: `"visits"`
            (min(1, N(s)/n0)) or `"fixed"` (1).
        mixing_n0 (`float`, *optional*, defaults to `4.0`): n0 of the visit-based mixing weight.
        bellman_norm (`str`, *optional*, defaults to `"batch_std"`): Scale of the Bellman credit: `"batch_std"`,
            `"std"` (per group) or `"none"`.
        bellman_std_floor (`float`, *optional*, defaults to `1.0`): The least std the Bellman credit is divided by.
        anchor (`str`, *optional*, defaults to `"state_key"`): What identifies a graph node.
        similarity_threshold (`float` or `None`, *optional*): Cluster text anchors by similarity instead of equality.
        merge_invalid_actions (`bool`, *optional*, defaults to `True`): Count rejected actions as one action.
    """

    gamma: float = field(
        default=0.95,
        metadata={"help": "β in (0, 1], discount of the mean-backup Bellman fixed point, the TD residuals and the GAE. "
        "Our choice: 0.95, verl-agent's γ (CRBC used 0.98); docs/methods/bepo.md, 'Our choices'."},
    )
    gae_lambda: float = field(
        default=0.95,
        metadata={"help": "λ in [0, 1] of the GAE over the TD residuals, A^B_t = Σ (βλ)^l δ_{t+l}. Our choice: 0.95 "
        "(docs/methods/bepo.md, 'Our choices', step 5 [D]); 0 = CRBC's one-step Q − V, 1 = discounted return − "
        "V(s_t)."},
    )
    bepo_gate: str = field(
        default="successors",
        metadata={"help": "Confidence gate of a state: 'successors' (>= 2 distinct observed successor states, the "
        "success/failure exits included; our choice, docs/methods/bepo.md step 6 [D]), 'actions' (>= 2 distinct "
        "canonical actions, CRBC Eq. 13) or 'none' (always open: the '+fixed-point credit' ablation)."},
    )
    bepo_mixing: str = field(
        default="visits",
        metadata={"help": "Weight w of the gated Bellman credit: 'visits' = min(1, N(s)/mixing_n0) (our choice for the "
        "paper's 'adaptive mixing', docs/methods/bepo.md step 7 [D]) or 'fixed' = 1."},
    )
    mixing_n0: float = field(
        default=4.0,
        metadata={"help": "n0 > 0: visits of a state at which its Bellman credit gets full weight with "
        "bepo_mixing='visits'. Our choice: 4 (docs/methods/bepo.md step 7 [D])."},
    )
    bellman_norm: str = field(
        default="batch_std",
        metadata={"help": "'batch_std': divide the Bellman credit by (max(σ_B, bellman_std_floor) + 1e-6), σ_B the "
        "Bessel std of A^B over the gated rows of the whole generation batch (every process; the paper's text says a "
        "batch std); 'std': σ_B over the gated rows of each group; 'none'. Our choice, docs/methods/bepo.md step 7 "
        "[D] and 'Our choices'."},
    )
    bellman_std_floor: float = field(
        default=1.0,
        metadata={"help": "σ_min >= 0, the least σ_B the Bellman credit is divided by. Our choice: 1.0, so the "
        "normalisation only shrinks the credit, never amplifies it (over two nearly equal gated rows the bare std "
        "turns a credit of -0.38 into an advantage of -35); 0 = the bare std. docs/methods/bepo.md, 'Our choices'."},
    )
    anchor: str = field(
        default="state_key",
        metadata={"help": "Graph nodes: 'state_key' (the environment's canonical state; the observation text for a "
        "step without one) or 'observation' (the raw history-free observation text, as GiGPO's anchor_obs)."},
    )
    similarity_threshold: float | None = field(
        default=None,
        metadata={"help": "If set (in (0, 1)), text anchors join the first cluster whose first member has difflib "
        "ratio >= threshold (as GiGPO's enable_similarity); None = exact anchors."},
    )
    merge_invalid_actions: bool = field(
        default=True,
        metadata={"help": "Count every rejected action as one canonical action (our choice, docs/methods/bepo.md "
        "step 1 [D]); only bepo_gate='actions' reads actions."},
    )

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1] (the discount β of the Bellman backup), got {self.gamma}")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        check_choice("bepo_gate", self.bepo_gate, GATES)
        check_choice("bepo_mixing", self.bepo_mixing, MIXINGS)
        if not (math.isfinite(self.mixing_n0) and self.mixing_n0 > 0):
            raise ValueError(f"mixing_n0 must be a number > 0 (visits for full weight), got {self.mixing_n0}")
        check_choice("bellman_norm", self.bellman_norm, BELLMAN_NORMS)
        if not (math.isfinite(self.bellman_std_floor) and self.bellman_std_floor >= 0):
            raise ValueError(f"bellman_std_floor must be a finite number >= 0 (1.0 never amplifies the Bellman credit), "
                             f"got {self.bellman_std_floor}")
        check_choice("anchor", self.anchor, ("state_key", "observation"))
        if self.similarity_threshold is not None and not 0.0 < self.similarity_threshold < 1.0:
            raise ValueError(
                f"similarity_threshold must be in (0, 1), or None for exact anchors; got {self.similarity_threshold}"
            )


class BEPOTrainer(AgentGRPOTrainer):
    """Gated-BEPO on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring)."""

    _tag_names = ["trl", "trl-agents", "bepo"]
    _name = "BEPO"
    config_class = BEPOConfig
    methods = (
        MethodInfo("bepo", "arXiv 2608.06861", "trl_agents.credit.bepo", max_staleness=1, title="Gated-BEPO",
                   inputs=("episode returns", "step rewards", "state keys (graph nodes)",
                           "canonical actions (bepo_gate='actions' only)"),
                   tests=("tests/methods/bepo/",)),
    )
    required_env_capabilities = ("state_key",)

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("bepo", groups)  # σ_B over the whole batch: every process credits on the same step
