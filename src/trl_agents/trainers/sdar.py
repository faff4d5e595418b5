"""SDAR: gated self-distillation as an auxiliary loss on GRPO (arXiv 2605.15155; docs/methods/sdar.md).

The only change w.r.t. `AgentGRPOTrainer` is `compute_auxiliary_loss`: λ = `sdar_coef` times the token mean of
g_t·(log π_T(y_t) − log π_θ(y_t)), with the gate g_t = σ(β·Δ_t) of the teacher–student gap Δ_t (both stopped), so
that each sampled token is pulled towards the teacher by a weight that grows with how much more the teacher likes
it (math in `trl_agents/distill/sdar.py`). The teacher is the current policy under a privileged view of the step
(`teacher="current"`, its prompt plus `env.privileged_context()` — SDAR's skills text), scored once after the
rollout (the `teacher_logprobs` signal); the student's log-probs are the ones TRL's loss computed (no second
forward). `sdar_gate_beta=0` (g ≡ 0.5) is the `grpo_opsd` ablation the paper compares against.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.sdar import SDARConfig, SDARTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 512))
    config = SDARConfig(output_dir="alfworld-sdar", max_turns=50, sdar_gate_beta=5.0, sdar_coef=0.01)
    SDARTrainer(model="Qwen/Qwen2.5-3B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..distill.sdar import sdar_gate, sdar_token_terms
from ..training.batch import token_signal_key
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from ..training.batch import loss_mask
from ..training.forward import policy_logps
from .registry import MethodInfo


@dataclass
class SDARConfig(AgentGRPOConfig):
    r"""
    Configuration of [`SDARTrainer`]: every [`AgentGRPOConfig`] field plus SDAR's (docs/methods/sdar.md).

    Args:
        sdar_gate_beta (`float`, *optional*, defaults to `5.0`): β of the gate σ(β·Δ); 0 = the GRPO+OPSD ablation.
        sdar_coef (`float`, *optional*, defaults to `0.01`): λ, weight of the gated distillation term.
    """

    sdar_gate_beta: float = field(
        default=5.0,
        metadata={"help": "β of the gate g = σ(β·Δ), Δ = log π_T − log π_θ of the sampled token (SDAR gate_beta: "
        "5.0); 0 gives g = 0.5 everywhere: the GRPO+OPSD baseline."},
    )
    sdar_coef: float = field(
        default=0.01, metadata={"help": "λ, weight of the gated distillation term on GRPO's loss (SDAR sdar_coef: 0.01)."}
    )

    def __post_init__(self):
        super().__post_init__()
        if not (math.isfinite(self.sdar_gate_beta) and self.sdar_gate_beta >= 0):
            raise ValueError(f"sdar_gate_beta must be a finite number >= 0 (SDAR: 5.0), got {self.sdar_gate_beta}")
        if not (math.isfinite(self.sdar_coef) and self.sdar_coef >= 0):
            raise ValueError(f"sdar_coef must be a finite number >= 0 (SDAR: 0.01), got {self.sdar_coef}")


class SDARTrainer(AgentGRPOTrainer):
    """SDAR on `AgentGRPOTrainer`: the only change is `compute_auxiliary_loss` (see the module docstring).

    Logs `sdar/loss` (the token mean of the gated terms over each micro-batch of every process, before λ) and
    `sdar/mean_gate` (the mean g over the same tokens). The loss is the token mean over the whole generation batch (`batch_token_mean`).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "sdar"]
    _name = "SDAR"
    config_class = SDARConfig
    methods = (
        MethodInfo("sdar", "arXiv 2605.15155", "trl_agents.distill.sdar",
                   max_staleness=0,
                   staleness_reason=("the sampled-token self-distillation loss assumes the tokens were sampled by the "
                                     "policy it trains, and an auxiliary loss gets no importance correction"),
                   title="SDAR",
                   hook="compute_auxiliary_loss",
                   inputs=("episode returns", "teacher log-probs of the sampled actions under a privileged view"),
                   tests=("tests/methods/opsd/", "tests/methods/sdar/")),
        MethodInfo("grpo_opsd", "arXiv 2605.15155", "trl_agents.distill.sdar",
                   max_staleness=0,
                   staleness_reason=("the sampled-token self-distillation loss assumes the tokens were sampled by the "
                                     "policy it trains, and an auxiliary loss gets no importance correction"),
                   title="GRPO+OPSD",
                   hook="compute_auxiliary_loss", defaults={"sdar_gate_beta": 0.0},
                   inputs=("episode returns", "teacher log-probs of the sampled actions under a privileged view"),
                   tests=("tests/methods/opsd/", "tests/methods/sdar/")),
    )
    signals = ("teacher_logprobs",)
    training_signals = ("teacher_logprobs",)

    def compute_auxiliary_loss(self, model, inputs: dict[str, Any], per_token_logps):
        student = per_token_logps if per_token_logps is not None else policy_logps(model, inputs, self.temperature)
        teacher = inputs[token_signal_key("teacher_logprobs")]
        mask = loss_mask(inputs)
        beta = self.args.sdar_gate_beta
        terms = sdar_token_terms(student, teacher, beta=beta)
        self.log_token_means({"sdar/loss": terms, "sdar/mean_gate": sdar_gate(teacher - student.detach(), beta)}, mask)
        # λ·agg(ℓ), agg = the token mean over the generation batch (SDAR: the actor's token-mean loss_agg_mode)
        return self.args.sdar_coef * self.batch_token_mean(terms, mask, inputs)
