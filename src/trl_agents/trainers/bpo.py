"""BPO: Branching Policy Optimization (He et al. 2026, arXiv 2607.14171; docs/methods/bpo.md).

The changes w.r.t. `AgentGRPOTrainer`: the `branching` topology — `num_generations` backbone episodes per task,
then, at each backbone's `bpo_branch_points` highest-entropy decisions, `bpo_branch_factor − 1` siblings forked from
the environment snapshot taken before that step (each samples its own action there and plays to the end; the shared
prefix is generated and recorded once) — and `compute_advantages`: the sibling leave-one-out advantage
A_i = R_i − mean_{j≠i} R_j on the branch action and everything after it, plus a leave-one-out term among the
backbones (math in `trl_agents/credit/bpo.py`). The paper's prefix propagation (λ^d·A_i on the shared prefix) is
not a field: Σ_i A_i = 0 over a sibling set, so a prefix trained once receives λ^d·Σ_i A_i = 0 from it whatever λ
(docs/methods/bpo.md). Compute is accounted as total generated tokens and env steps
(`rollout/generated_tokens`, `rollout/env_steps`, and per task `bpo/generated_tokens_per_task`).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.bpo import BPOConfig, BPOTrainer

    tasks = Dataset.from_list(get_env_class("webshop-lite").task_split("train", 256))
    config = BPOConfig(output_dir="webshop-bpo", max_turns=15, num_generations=2, bpo_branch_factor=4)
    BPOTrainer(model="Qwen/Qwen2.5-7B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..names import check_choice
from ..rollout.topologies import BRANCH_SCORES
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class BPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`BPOTrainer`]: every [`AgentGRPOConfig`] field plus BPO's. `num_generations` is the number of
    backbone episodes per task.

    Args:
        bpo_branch_points (`int`, *optional*, defaults to `1`): Branch points per backbone.
        bpo_branch_factor (`int`, *optional*, defaults to `4`): K, siblings per branch point (backbone included).
        bpo_branch_score (`str`, *optional*, defaults to `"entropy_mean"`): How decision points are ranked.
        bpo_backbone_weight (`float`, *optional*, defaults to `1.0`): Weight of the leave-one-out term among backbones.
        topology (`str`, *optional*, defaults to `"branching"`).
    """

    bpo_branch_points: int = field(
        default=1,
        metadata={"help": "Branch points per backbone episode: its steps with the highest branching score (ties: the "
        "earliest). 1 in the frozen implementation of BPO (top-1 boundary per backbone); docs/methods/bpo.md."},
    )
    bpo_branch_factor: int = field(
        default=4,
        metadata={"help": "K, siblings per branch point: the backbone's own continuation plus K − 1 forks from the "
        "snapshot before that step (4 in the frozen implementation)."},
    )
    bpo_branch_score: str = field(
        default="entropy_mean",
        metadata={"help": "How decision points are ranked: 'entropy_mean' (mean per-token entropy of the policy over "
        "the step's action; our choice, docs/methods/bpo.md: the paper says 'high-entropy decision points', the "
        "frozen implementation scores the first non-protocol token), 'entropy_first' (the action's first token), "
        "or 'random' (a control)."},
    )
    bpo_backbone_weight: float = field(
        default=1.0,
        metadata={"help": "Weight of a leave-one-out advantage among the task's backbones on their whole path (0 "
        "with one backbone). Our choice (docs/methods/bpo.md): the paper keeps a trajectory-level term when a task "
        "has several backbones."},
    )
    topology: str = field(
        default="branching", metadata={"help": "BPO forks siblings from environment snapshots: 'branching'."}
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("bpo_branch_score", self.bpo_branch_score, BRANCH_SCORES)
        if self.bpo_branch_points < 1:
            raise ValueError(f"bpo_branch_points must be >= 1, got {self.bpo_branch_points}")
        if self.bpo_branch_factor < 2:
            raise ValueError(f"bpo_branch_factor must be >= 2 (K siblings incl. the backbone), got "
                             f"{self.bpo_branch_factor}")
        if not (math.isfinite(self.bpo_backbone_weight) and self.bpo_backbone_weight >= 0):
            raise ValueError(f"bpo_backbone_weight must be a finite number >= 0, got {self.bpo_backbone_weight}")
        if self.topology != "branching":
            raise ValueError(f"BPO runs on the 'branching' topology, got topology={self.topology!r}")


class BPOTrainer(AgentGRPOTrainer):
    """BPO on `AgentGRPOTrainer` (see the module docstring): the branching topology and `compute_advantages`.

    Logs `bpo/num_sibling_sets`, `bpo/mean_siblings`, `bpo/zero_advantage_set_fraction` (sets whose siblings all
    returned the same), `bpo/mean_fork_step`, `bpo/generated_tokens_per_task` and `bpo/env_steps_per_task`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "bpo"]
    _name = "BPO"
    config_class = BPOConfig
    supports_trees = True  # credit/bpo.py charges a shared step once, to the path that owns it
    methods = (
        MethodInfo("bpo", "arXiv 2607.14171", "trl_agents.credit.bpo",
                   max_staleness=0,
                   staleness_reason=("its branch points rank the current policy's entropies mid-rollout, which a "
                                     "one-step-off rollout cannot compute on the weights being trained"),
                   title="BPO",
                   hook="topology (branching) + compute_advantages",
                   inputs=("episode returns", "tree links (parent, fork step)", "per-token entropies (branch points)"),
                   tests=("tests/methods/bpo/", "tests/methods/canopy/")),
    )

    @classmethod
    def topology_options(cls, args: Any) -> dict[str, Any]:
        return {"branch_points": args.bpo_branch_points, "branch_factor": args.bpo_branch_factor,
                "score": args.bpo_branch_score, "seed": args.seed}

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        advantages = self.estimate("bpo", groups)
        self.log_rollout_cost_per_task("bpo", groups)
        return advantages
