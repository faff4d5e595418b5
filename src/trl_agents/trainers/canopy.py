"""CANOPY: Coverage-ANchored On-PolicY RL (Pu et al. 2026, arXiv 2609.01245; docs/methods/canopy.md).

CANOPY adds no loss: it is a recipe around GRPO, and the changes w.r.t. `AgentGRPOTrainer` are its settings —

* the `adaptive` topology: every task starts with `num_generations` episodes and gets `canopy_round_size` more,
  round after round, until its group carries signal (two healthy episodes with different returns) or it holds
  `canopy_max_group_size` episodes (or, given a pilot success rate p̂, the smallest n with
  P_sig(p̂, n) = 1 − p̂ⁿ − (1 − p̂)ⁿ ≥ `canopy_target_coverage`); episodes per task are logged (`topology/*`);
* strictly on-policy: one optimizer update per rollout batch (`num_iterations=1`, `steps_per_generation =
  gradient_accumulation_steps`), so the importance ratio is 1; a config that would reuse a batch is rejected;
* a KL anchor to the initial model (`beta=1e-4`, TRL's k3 estimator), token-mean loss (`loss_type="dapo"`), the loss
  on the agent's own action tokens only (environment tokens are masked in both row formats), no invalid-action
  penalty (sparse outcome reward);
* infrastructure-failed episodes removed from the group statistic and from training (not scored 0);

and `compute_advantages` is GRPO's z-score over each task's healthy episodes (`trl_agents/credit/canopy.py`). The
larger test-time turn budget (train at 50 turns, evaluate at 100) is `eval_max_turns` in its configs.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.canopy import CANOPYConfig, CANOPYTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 90))
    config = CANOPYConfig(output_dir="alfworld-canopy", max_turns=50, num_generations=8, canopy_max_group_size=32)
    CANOPYTrainer(model="Qwen/Qwen3-14B", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..rollout.topologies.adaptive import group_size_for_coverage
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class CANOPYConfig(AgentGRPOConfig):
    r"""
    Configuration of [`CANOPYTrainer`]: every [`AgentGRPOConfig`] field, CANOPY's defaults, and its group sizing.

    Args:
        canopy_round_size (`int` or `None`, *optional*): Episodes added per round to a group without signal
            (None = `num_generations`).
        canopy_max_group_size (`int`, *optional*, defaults to `32`): Cap on a task's episodes per rollout.
        canopy_pilot_success_rate (`float` or `None`, *optional*): p̂, a pilot estimate of the hardest tasks' success
            rate; when set, the cap is the smallest n with P_sig(p̂, n) ≥ `canopy_target_coverage`.
        canopy_target_coverage (`float`, *optional*, defaults to `0.8`): τ of that sizing rule.
        topology (`str`, *optional*, defaults to `"adaptive"`).
        beta (`float`, *optional*, defaults to `1e-4`): The KL anchor to the initial model.
        invalid_action_penalty (`float`, *optional*, defaults to `0.0`): CANOPY has none.
    """

    canopy_round_size: int | None = field(
        default=None,
        metadata={"help": "Episodes added per round to a task whose group carries no signal yet (None = "
        "num_generations). Our choice (docs/methods/canopy.md): the paper fixes n up front from a pilot estimate; "
        "growing in rounds spends the episodes only on the tasks that need them."},
    )
    canopy_max_group_size: int = field(
        default=32,
        metadata={"help": "Cap on a task's episodes in one rollout, failed ones included (AppWorld setting: "
        "rollout.n = 32). Ignored when canopy_pilot_success_rate is set."},
    )
    canopy_pilot_success_rate: float | None = field(
        default=None,
        metadata={"help": "p̂, a pilot estimate of the success rate on the hardest retained tasks (CANOPY sizes n "
        "from it); when set, the cap is the smallest n with 1 − p̂^n − (1 − p̂)^n ≥ canopy_target_coverage."},
    )
    canopy_target_coverage: float = field(
        default=0.8,
        metadata={"help": "τ, the target signal coverage of the sizing rule (0.8 in a recipe note on the paper; our "
        "choice, docs/methods/canopy.md)."},
    )
    topology: str = field(
        default="adaptive", metadata={"help": "CANOPY grows each task's group in rounds: the 'adaptive' topology."}
    )
    beta: float = field(
        default=1e-4,
        metadata={"help": "KL anchor to the fixed initial model (CANOPY: kl_loss_coef 1e-4, low_var_kl = TRL's k3)."},
    )
    invalid_action_penalty: float = field(
        default=0.0,
        metadata={"help": "CANOPY trains on the sparse outcome reward only: no invalid-action penalty."},
    )

    def __post_init__(self):
        super().__post_init__()
        if self.num_iterations != 1 or self.steps_per_generation != self.gradient_accumulation_steps:
            raise ValueError(
                "CANOPY trains strictly on-policy: one optimizer update per rollout batch. Set num_iterations=1 and "
                f"steps_per_generation = gradient_accumulation_steps (got num_iterations={self.num_iterations}, "
                f"steps_per_generation={self.steps_per_generation}, gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps}); the paper's ablation that reuses a batch loses 17.4 points."
            )
        if self.topology != "adaptive":
            raise ValueError(f"CANOPY grows each task's group in rounds: topology must be 'adaptive', got "
                             f"{self.topology!r}")
        if self.canopy_pilot_success_rate is None and self.canopy_max_group_size < self.num_generations:
            raise ValueError(
                f"canopy_max_group_size={self.canopy_max_group_size} is below num_generations={self.num_generations} "
                "(the first round): raise the cap."
            )
        if self.canopy_round_size is not None and self.canopy_round_size < 1:
            raise ValueError(f"canopy_round_size must be >= 1 or None (= num_generations), got {self.canopy_round_size}")
        if self.canopy_pilot_success_rate is not None:
            group_size_for_coverage(self.canopy_pilot_success_rate, self.canopy_target_coverage)  # checks both
        elif not 0.0 < self.canopy_target_coverage < 1.0:
            raise ValueError(f"canopy_target_coverage must be in (0, 1), got {self.canopy_target_coverage}")
        if not math.isfinite(self.invalid_action_penalty):
            raise ValueError(f"invalid_action_penalty must be finite, got {self.invalid_action_penalty}")
        if self.scale_rewards != "group":
            raise ValueError(
                f"CANOPY's credit is GRPO's z-score within each task's group (norm_adv_by_std_in_grpo): "
                f"scale_rewards must be 'group', got {self.scale_rewards!r}."
            )

    def _advantage_estimators(self) -> tuple[str, ...]:
        return ("grpo",)  # CANOPY's credit is GRPO's z-score


class CANOPYTrainer(AgentGRPOTrainer):
    """CANOPY on `AgentGRPOTrainer` (see the module docstring): the adaptive topology sized by coverage, GRPO credit
    over healthy episodes. Logs `topology/signal_fraction`, `topology/mean_episodes_per_task`,
    `topology/max_episodes_per_task`, `topology/capped_without_signal_fraction`, `topology/rounds` and the
    rollout's cost (`rollout/episodes`, `rollout/generated_tokens`, `rollout/env_steps`)."""

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "canopy"]
    _name = "CANOPY"
    config_class = CANOPYConfig
    methods = (
        MethodInfo("canopy", "arXiv 2609.01245", "trl_agents.credit.canopy",
                   max_staleness=0,
                   staleness_reason=("the paper keeps every update strictly on-policy (a reused batch costs 17.4 "
                                     "points in its ablation)"),
                   title="CANOPY",
                   hook="topology (adaptive groups) + compute_advantages",
                   inputs=("episode returns", "infrastructure failures (removed, not scored)"),
                   tests=("tests/methods/canopy/",)),
    )

    @classmethod
    def topology_options(cls, args: Any) -> dict[str, Any]:
        return {"max_group_size": group_cap(args), "round_size": args.canopy_round_size}

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("canopy", groups)


def group_cap(args: Any) -> int:
    """The most episodes a task gets: sized by coverage from a pilot success rate, else `canopy_max_group_size`."""
    if getattr(args, "canopy_pilot_success_rate", None) is not None:
        return max(group_size_for_coverage(args.canopy_pilot_success_rate, args.canopy_target_coverage),
                   args.num_generations)
    return args.canopy_max_group_size
