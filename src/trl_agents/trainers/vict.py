"""VICT: verifier-instrumented credit tracing (Li et al. 2026, arXiv 2608.28128; docs/methods/vict.md).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: the GRPO advantage A_i of every episode is moved
onto the steps that witnessed the atoms of its verifier core, along dependency-valid edges, and kept broadcast when
the evidence is incomplete or ambiguous (math in `trl_agents/credit/vict.py`; docs/methods/vict.md). The trainer
declares the `verifier_atoms` signal, so the rollout records `env.verify()` at the end of every episode where the
environment lives, and environments without an instrumented verifier are refused at start-up (the signal needs the
`verify` capability: alfworld, webshop-lite, searchqa).

Logged per rollout: `vict/abstention_rate` (fraction of episodes that kept broadcast credit),
`vict/mean_credited_steps` (|E_i|, steps carrying the credit of a traced episode), `vict/credited_step_fraction`
(|E_i| / T_i over the traced episodes) and `vict/abstain/<reason>` (fraction of episodes abstaining for that reason).

Example:
    ```python
    from datasets import Dataset
    from trl_agents import VICTConfig, VICTTrainer
    from trl_agents.envs import get_env_class

    tasks = Dataset.from_list(get_env_class("webshop-lite").task_split("train", 256))
    config = VICTConfig(output_dir="webshop-vict", max_turns=15, max_completion_length=512)
    VICTTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from ..names import check_choice
from ..credit.vict import FAILURE_CORES
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class VICTConfig(AgentGRPOConfig):
    r"""
    Configuration of [`VICTTrainer`]: every [`AgentGRPOConfig`] field plus VICT's.

    The advantage that VICT redistributes is GRPO's: `scale_rewards` chooses the z-score (`"group"`) or the centred
    return (`"none"`), over the episode returns of the group (`credit_statistic` must stay `"trajectories"`), and
    `invalid_action_penalty` stays on the invalid step.

    Args:
        edge_share (`float`, *optional*, defaults to `1.0`): ρ, the share of an episode's advantage moved onto its
            proof-edge steps; 1 − ρ stays on every step.
        failure_core (`str`, *optional*, defaults to `"greedy"`): Which atoms a failed episode's negative credit
            goes to: `"greedy"`, `"all_unsat"` or `"none"` (failures keep broadcast credit).
    """

    edge_share: float = field(
        default=1.0,
        metadata={"help": "ρ in [0, 1]: share of the episode's GRPO advantage moved onto the witness steps of its "
        "proof edges, A_t = A·[(1−ρ) + ρ·T·1[t∈E]/|E|]; 1−ρ stays broadcast. Our choice (docs/methods/vict.md "
        "step 5, [D]: mass-preserving redistribution with an optional floor, ρ = 1 by default)."},
    )
    failure_core: str = field(
        default="greedy",
        metadata={"help": "Core of a failed episode, whose unsat atoms take its (usually negative) credit: 'greedy' "
        "(the first non-sat atom in dependency order, ties in the verifier's order; abstain if it is unknown), "
        "'all_unsat' (every unsat atom; abstain on any unknown atom) or 'none' (failures keep broadcast credit). "
        "Our choice (docs/methods/vict.md step 2: [S] greedy core search, [D] the concrete rule)."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("failure_core", self.failure_core, FAILURE_CORES)
        if not (math.isfinite(self.edge_share) and 0.0 <= self.edge_share <= 1.0):
            raise ValueError(
                f"edge_share must be in [0, 1] (ρ: 1 moves all the credit onto the proof edges, 0 is GRPO), "
                f"got {self.edge_share}"
            )
        if self.credit_statistic != "trajectories":
            raise ValueError(
                f"credit_statistic={self.credit_statistic!r} is not supported by VICT: it redistributes one "
                "advantage per episode, taken over the group's episode returns. Set credit_statistic='trajectories'."
            )

    def _advantage_estimators(self) -> tuple[str, ...]:
        return ("grpo",)  # VICT redistributes GRPO's episode advantage (docs/methods/vict.md step 5)


class VICTTrainer(AgentGRPOTrainer):
    """VICT on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring)."""

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "vict"]
    _name = "VICT"
    config_class = VICTConfig
    methods = (
        MethodInfo("vict", "arXiv 2608.28128", "trl_agents.credit.vict", max_staleness=1, title="VICT",
                   inputs=("episode returns", "verifier atoms (env.verify(): status, witness step, dependencies)"),
                   tests=("tests/methods/vict/",)),
    )
    signals = ("verifier_atoms",)

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("vict", groups)
