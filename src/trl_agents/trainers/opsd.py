"""OPSD: On-Policy Self-Distillation (Zhao et al. 2026, arXiv 2601.18734; docs/methods/opsd.md).

The changes w.r.t. `AgentGRPOTrainer`: `compute_auxiliary_loss` adds `opsd_coef` × the distillation loss of the
student (the policy on its own prompt) towards a teacher (the same model under a privileged view of the step: its
prompt plus `env.privileged_context()` or another `privileged_source`, scored on the student's own action ids); and
`policy_loss_weight` is `policy_loss_coef` — 0 by default, so that distillation is the whole objective as in the
paper, and TRL's policy loss (and its forward) is skipped. The teacher is the frozen step-0 policy by default
(`teacher="frozen"`: for a LoRA run the adapter-disabled base model, no second copy of the weights). Math in
`trl_agents/distill/opsd.py`.

Two losses (`opsd_loss`):

* `"jsd"`: the generalized Jensen–Shannon divergence over the vocabulary (β = `opsd_beta`, logits at
  `opsd_temperature`, optionally the teacher's `opsd_top_k` tokens). The teacher's logits are computed in the loss
  step (a no-grad forward over the privileged prompts, the `teacher_prompt` signal) and the student's with its
  own forward, since TRL's loss never materialises logits.
* `"sampled_token"`: the memory-light variant on the sampled tokens only, −sg(log π_T − log π_θ)·log π_θ, with the
  teacher's log-probs computed once after the rollout (the `teacher_logprobs` signal) and the student's reused
  from TRL's loss when it runs (else one forward), both at the training temperature.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.opsd import OPSDConfig, OPSDTrainer

    tasks = Dataset.from_list(get_env_class("searchqa").task_split("train", 256))
    config = OPSDConfig(output_dir="searchqa-opsd", max_turns=4, teacher="frozen", opsd_beta=0.5)
    OPSDTrainer(model="Qwen/Qwen3-1.7B", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..names import check_choice
from ..distill.opsd import generalized_jsd, sampled_token_distillation
from ..training.batch import prompt_signal_keys, token_signal_key
from ..training.forward import completion_logits, policy_logps
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from ..training.batch import loss_mask
from .registry import MethodInfo

OPSD_LOSSES = ("jsd", "sampled_token")


@dataclass
class OPSDConfig(AgentGRPOConfig):
    r"""
    Configuration of [`OPSDTrainer`]: every [`AgentGRPOConfig`] field plus OPSD's (docs/methods/opsd.md).

    Args:
        opsd_loss (`str`, *optional*, defaults to `"jsd"`): `"jsd"` (vocabulary JSD) or `"sampled_token"`.
        opsd_beta (`float`, *optional*, defaults to `0.5`): β of the generalized JSD.
        opsd_temperature (`float`, *optional*, defaults to `1.1`): τ of the JSD's softmaxes.
        opsd_top_k (`int` or `None`, *optional*): Restrict the JSD to the teacher's top-k tokens.
        opsd_coef (`float`, *optional*, defaults to `1.0`): Weight of the distillation loss.
        policy_loss_coef (`float`, *optional*, defaults to `0.0`): Weight of TRL's GRPO policy loss.
        teacher (`str`, *optional*, defaults to `"frozen"`): OPSD's recommended teacher, the step-0 policy.
    """

    opsd_loss: str = field(
        default="jsd",
        metadata={"help": "'jsd': the generalized Jensen-Shannon divergence over the vocabulary (OPSD's loss; a "
        "teacher forward at loss time); 'sampled_token': the memory-light variant on the sampled tokens only "
        "(OPSD's --use_tinker_loss). docs/methods/opsd.md."},
    )
    opsd_beta: float = field(
        default=0.5,
        metadata={"help": "β of the generalized JSD, in [0, 1]: 0 = forward KL(p_T||p_S), 1 = reverse KL(p_S||p_T) "
        "(OPSD scripts: 0.5)."},
    )
    opsd_temperature: float = field(
        default=1.1,
        metadata={"help": "τ: both logits are divided by it before the JSD's softmaxes (OPSD's run_opsd.sh: 1.1, its "
        "sampling temperature too; set `temperature` to match)."},
    )
    opsd_top_k: int | None = field(
        default=None,
        metadata={"help": "Restrict the JSD, at each position, to the teacher's k most likely tokens (both "
        "renormalised there; OPSD's top_k_loss, 0 = off in its scripts). None = the whole vocabulary."},
    )
    opsd_coef: float = field(
        default=1.0, metadata={"help": "Weight of the distillation loss (OPSD: 1, the whole objective)."}
    )
    policy_loss_coef: float = field(
        default=0.0,
        metadata={"help": "Weight of TRL's GRPO policy loss next to the distillation loss. OPSD: 0 (no RL loss; TRL's "
        "loss and its forward are skipped); > 0 makes OPSD an auxiliary loss on GRPO (our option)."},
    )
    teacher: str = field(
        default="frozen",
        metadata={"help": "The teacher: OPSD recommends the frozen step-0 policy (--fixed_teacher in every script; a "
        "LoRA run's base model with the adapter disabled); 'current' and 'ema' are the alternatives it discusses."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("opsd_loss", self.opsd_loss, OPSD_LOSSES)
        if not 0.0 <= self.opsd_beta <= 1.0:
            raise ValueError(f"opsd_beta must be in [0, 1] (OPSD: 0.5), got {self.opsd_beta}")
        if not (math.isfinite(self.opsd_temperature) and self.opsd_temperature > 0):
            raise ValueError(f"opsd_temperature must be > 0 (OPSD: 1.1), got {self.opsd_temperature}")
        if self.opsd_top_k is not None and self.opsd_top_k < 1:
            raise ValueError(f"opsd_top_k must be >= 1 or None (the whole vocabulary), got {self.opsd_top_k}")
        for name in ("opsd_coef", "policy_loss_coef"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.opsd_coef == 0 and self.policy_loss_coef == 0:
            raise ValueError("opsd_coef and policy_loss_coef are both 0: nothing would be trained; set one > 0.")
        if self.beta != 0 and self.policy_loss_coef == 0:
            raise ValueError(
                f"beta={self.beta} is the KL term of TRL's policy loss, which policy_loss_coef=0 skips: set beta=0 "
                "(OPSD's setting) or policy_loss_coef > 0."
            )


class OPSDTrainer(AgentGRPOTrainer):
    """OPSD on `AgentGRPOTrainer` (see the module docstring): `compute_auxiliary_loss` and `policy_loss_weight`.

    Logs `opsd/loss` (the token mean of the distillation loss over each micro-batch of every process, before
    `opsd_coef`). The loss
    is the token mean over the whole generation batch (`batch_token_mean`: TRL's "dapo" normalisation, the same with
    one process or several).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "opsd"]
    _name = "OPSD"
    config_class = OPSDConfig
    methods = (
        MethodInfo("opsd", "arXiv 2601.18734", "trl_agents.distill.opsd",
                   max_staleness=0,
                   staleness_reason=("the sampled-token self-distillation estimator assumes the tokens were sampled "
                                     "by the policy it trains, and an auxiliary loss gets no importance correction"),
                   title="OPSD",
                   hook="compute_auxiliary_loss + policy_loss_weight",
                   inputs=("student log-probs / logits of the sampled actions",
                           "teacher under a privileged view (teacher prompt, or its log-probs)"),
                   tests=("tests/methods/opsd/",)),
    )

    @classmethod
    def signal_names(cls, args: Any) -> tuple[str, ...]:
        return ("teacher_prompt",) if args.opsd_loss == "jsd" else ("teacher_logprobs",)

    @classmethod
    def training_signal_names(cls, args: Any) -> tuple[str, ...]:
        return cls.signal_names(args)

    @property
    def policy_loss_weight(self) -> float:
        return self.args.policy_loss_coef

    def compute_auxiliary_loss(self, model, inputs: dict[str, Any], per_token_logps):
        args = self.args
        mask = loss_mask(inputs)
        if args.opsd_loss == "sampled_token":
            student = per_token_logps if per_token_logps is not None else policy_logps(model, inputs, self.temperature)
            teacher = inputs[token_signal_key("teacher_logprobs")]
            per_token = sampled_token_distillation(student, teacher)
        else:
            teacher_logits = self.teacher_logits(inputs)
            student_logits = completion_logits(model, inputs["prompt_ids"], inputs["prompt_mask"], inputs)
            per_token = generalized_jsd(student_logits, teacher_logits, beta=args.opsd_beta,
                                        temperature=args.opsd_temperature, top_k=args.opsd_top_k)
        self.log_token_means({"opsd/loss": per_token}, mask)
        # L = token mean over the generation batch (OPSD's token mean; TRL's "dapo" normalisation across processes)
        return args.opsd_coef * self.batch_token_mean(per_token, mask, inputs)

    @torch.no_grad()
    def teacher_logits(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The teacher's logits at the completion positions: a no-grad forward over the privileged prompts (the
        `teacher_prompt` signal) followed by the same completion ids."""
        ids_key, mask_key = prompt_signal_keys("teacher_prompt")
        with self.teacher.context() as teacher:
            was_training = teacher.training
            teacher.eval()
            try:
                return completion_logits(teacher, inputs[ids_key], inputs[mask_key], inputs)
            finally:
                teacher.train(was_training)
