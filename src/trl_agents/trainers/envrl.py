"""EnvRL: state prediction + inverse dynamics auxiliary losses on GRPO or GiGPO (arXiv 2606.17680; docs/methods/envrl.md).

Two changes w.r.t. the RL trainer it runs on (`envrl_rl_estimator`: the configured GRPO/RLOO estimator, or GiGPO):

* After each rollout, the `envrl_examples` signal turns every trained step (s_t, a_t, o_{t+1}) into at most one SP
  example (prompt s_t + a_t + "predict the next observation", target o_{t+1}) and at most one ID example (prompt
  s_t + o_{t+1} + "which action caused this transition?", target a_t), math in `trl_agents/distill/envrl.py`. The
  examples stay on the signal object; each training row carries, on its action tokens, the index of its step's
  examples (a per-token signal), so that every micro-batch trains exactly the examples of its own rows, whatever
  the shuffling, the gradient accumulation and the number of processes.
* `compute_auxiliary_loss` runs one extra forward of the policy over the micro-batch's examples and adds
  λ_SP(t)·L_SP + λ_ID(t)·L_ID, each a token mean over all target tokens of the generation batch (every process),
  with the cosine decay λ(t) = λ₀·½(1 + cos(π t/T_max)), T_max = `max_steps`.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.envrl import EnvRLConfig, EnvRLTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 512))
    config = EnvRLConfig(output_dir="alfworld-envrl", max_turns=50, envrl_rl_estimator="gigpo", max_steps=150,
                         envrl_sp_coef=0.2, envrl_id_coef=0.2)
    EnvRLTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..names import check_choice
from ..distill.envrl import (
    ID_INSTRUCTION,
    SCHEDULES,
    SP_INSTRUCTION,
    Example,
    build_step_examples,
    example_nll,
    pack_examples,
    schedule_coefficient,
    shuffle_targets,
)
from ..training.batch import token_signal_key
from ..signals.base import ModelSignal, register_signal
from ..trajectory import Group, first_occurrences
from .agent_grpo import AgentGRPOTrainer
from ..training.batch import loss_mask
from .gigpo import GiGPOConfig, GiGPOTrainer
from .registry import MethodInfo

RL_ESTIMATORS = ("grpo", "gigpo")
EXAMPLES_SIGNAL = "envrl_examples"
NO_EXAMPLE = -1.0  # the value of a step's action tokens when it has neither an SP nor an ID example


class EnvRLExamples(ModelSignal):
    """The SP/ID examples of a rollout's trained steps (no forward; `trl_agents.distill.envrl`).

    `compute` keeps the examples in `self.examples` (index -> (SP example or None, ID example or None)) and gives
    every trained step the per-token value `[index] * len(action_ids)` (`NO_EXAMPLE` when it has none), which the
    trainer lays into the batch as `signal/envrl_examples`. `targets="shuffled"` permutes the SP targets across the
    rollout's steps (the Dark Room study's placebo)."""

    name = EXAMPLES_SIGNAL
    description = "SP/ID auxiliary examples of each step (index into the trainer's example table; no forward)"
    recorded = False  # indices into this rollout's table mean nothing in the records
    layout = "tokens"

    def __init__(self, sp_fraction: float = 1.0, id_fraction: float = 1.0, max_observation_tokens: int | None = 1024,
                 sp_instruction: str = SP_INSTRUCTION, id_instruction: str = ID_INSTRUCTION, targets: str = "gold",
                 seed: int = 0):
        check_choice("targets", targets, ("gold", "shuffled"))
        self.sp_fraction, self.id_fraction = sp_fraction, id_fraction
        self.max_observation_tokens = max_observation_tokens
        self.sp_instruction, self.id_instruction = sp_instruction, id_instruction
        self.targets = targets
        self.rng = random.Random(seed)
        self.examples: list[tuple[Example | None, Example | None]] = []

    def reset(self) -> None:
        self.examples = []

    def compute(self, groups: Sequence[Group], context) -> None:
        table: list[tuple[Example | None, Example | None]] = []
        owners = []
        for trajectory, indices in first_occurrences(groups):  # the steps that are trained, each once
            for index in indices:
                step = trajectory.steps[index]
                if not step.action_ids:
                    continue
                pair = build_step_examples(
                    trajectory, index, context.renderer, rng=self.rng, sp_fraction=self.sp_fraction,
                    id_fraction=self.id_fraction, row_format=context.row_format,
                    max_observation_tokens=self.max_observation_tokens, sp_instruction=self.sp_instruction,
                    id_instruction=self.id_instruction,
                )
                value = NO_EXAMPLE
                if pair != (None, None):
                    value = float(len(table))
                    table.append(pair)
                owners.append(step)
                step.signals[self.name] = [value] * len(step.action_ids)
        if self.targets == "shuffled":
            sp = [(i, pair[0]) for i, pair in enumerate(table) if pair[0] is not None]
            shuffled = shuffle_targets([e for _, e in sp], self.rng)
            for (i, _), example in zip(sp, shuffled, strict=True):
                table[i] = (example, table[i][1])
        self.examples = table

    def totals(self) -> tuple[int, int]:
        """(SP target tokens, ID target tokens) of this process's examples."""
        sp = sum(len(p[0].target_ids) for p in self.examples if p[0] is not None)
        id_ = sum(len(p[1].target_ids) for p in self.examples if p[1] is not None)
        return sp, id_


register_signal(EXAMPLES_SIGNAL, EnvRLExamples)


@dataclass
class EnvRLConfig(GiGPOConfig):
    r"""
    Configuration of [`EnvRLTrainer`]: every [`GiGPOConfig`] field (used when `envrl_rl_estimator="gigpo"`) plus
    EnvRL's (docs/methods/envrl.md).

    Args:
        envrl_rl_estimator (`str`, *optional*, defaults to `"grpo"`): L_RL: `"grpo"` or `"gigpo"`.
        envrl_sp_coef (`float`, *optional*, defaults to `0.2`): λ₀ of the state-prediction loss.
        envrl_id_coef (`float`, *optional*, defaults to `0.2`): λ₀ of the inverse-dynamics loss.
        envrl_schedule (`str`, *optional*, defaults to `"cosine"`): `"cosine"`, `"linear"` or `"constant"`.
        envrl_schedule_steps (`int` or `None`, *optional*): T_max; None = the run's `max_steps`.
        envrl_max_observation_tokens (`int` or `None`, *optional*, defaults to `1024`): Truncation of o_{t+1}.
        envrl_sp_fraction (`float`, *optional*, defaults to `1.0`): Probability that a step gets its SP example.
        envrl_id_fraction (`float`, *optional*, defaults to `1.0`): Probability that a step gets its ID example.
        envrl_sp_instruction, envrl_id_instruction (`str`, *optional*): The instructions of the two examples.
    """

    envrl_rl_estimator: str = field(
        default="grpo",
        metadata={"help": "L_RL: 'grpo' (the configured advantage_estimator / scale_rewards: GRPO, Dr. GRPO or "
        "RLOO) or 'gigpo' (GiGPO's fields below apply). EnvRL reports both."},
    )
    envrl_sp_coef: float = field(
        default=0.2,
        metadata={"help": "λ₀_SP, initial weight of the state-prediction (next observation) loss (EnvRL: 0.2 for "
        "1.5B models, 0.1 for 7B). 0 turns SP off."},
    )
    envrl_id_coef: float = field(
        default=0.2,
        metadata={"help": "λ₀_ID, initial weight of the inverse-dynamics (which action) loss (EnvRL: 0.2 for 1.5B, "
        "0.1 for 7B). 0 turns ID off."},
    )
    envrl_schedule: str = field(
        default="cosine",
        metadata={"help": "Decay of both weights: 'cosine' λ₀·½(1+cos(π t/T_max)) (EnvRL; it beats the others), "
        "'linear' or 'constant' (its ablations)."},
    )
    envrl_schedule_steps: int | None = field(
        default=None,
        metadata={"help": "T_max of the schedule; None = the run's max_steps (EnvRL's T_max)."},
    )
    envrl_max_observation_tokens: int | None = field(
        default=1024,
        metadata={"help": "o_{t+1} is cut to its first N tokens, as SP target and in the ID prompt (our choice, "
        "1024 as suggested for long observations); None = no limit."},
    )
    envrl_sp_fraction: float = field(
        default=1.0,
        metadata={"help": "Probability that a trained step gets its SP example (at most one per step; our choice: "
        "1 = every step)."},
    )
    envrl_id_fraction: float = field(
        default=1.0,
        metadata={"help": "Probability that a trained step gets its ID example (at most one per step; our choice: "
        "1 = every step)."},
    )
    envrl_sp_instruction: str = field(
        default=SP_INSTRUCTION,
        metadata={"help": "The user turn after s_t + a_t that asks for the next observation (our wording)."},
    )
    envrl_id_instruction: str = field(
        default=ID_INSTRUCTION,
        metadata={"help": "The question after s_t + o_{t+1} that asks for the action (our wording)."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("envrl_rl_estimator", self.envrl_rl_estimator, RL_ESTIMATORS)
        check_choice("envrl_schedule", self.envrl_schedule, SCHEDULES)
        for name in ("envrl_sp_coef", "envrl_id_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (EnvRL: 0.2 for 1.5B, 0.1 for 7B), got {value!r}")
        for name in ("envrl_sp_fraction", "envrl_id_fraction"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be a probability in [0, 1] (1 = every step), got {value!r}")
        if self.envrl_schedule_steps is not None and self.envrl_schedule_steps < 1:
            raise ValueError(f"envrl_schedule_steps must be >= 1 or None (= max_steps), got {self.envrl_schedule_steps}")
        if self.envrl_max_observation_tokens is not None and self.envrl_max_observation_tokens < 1:
            raise ValueError("envrl_max_observation_tokens must be >= 1 or None (no limit), got "
                             f"{self.envrl_max_observation_tokens}")


class EnvRLTrainer(GiGPOTrainer):
    """EnvRL on `AgentGRPOTrainer` (see the module docstring): `compute_advantages` dispatches to the chosen RL
    estimator, `compute_auxiliary_loss` adds the SP and ID losses.

    Logs `envrl/sp_loss`, `envrl/id_loss` (token means of the NLL over each micro-batch's targets, before λ),
    `envrl/sp_coef`, `envrl/id_coef` (λ(t)) and `envrl/sp_examples`, `envrl/id_examples` (examples per rollout).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "envrl"]
    _name = "EnvRL"
    config_class = EnvRLConfig
    methods = (
        MethodInfo("envrl", "arXiv 2606.17680", "trl_agents.distill.envrl", max_staleness=1, title="EnvRL",
                   hook="compute_advantages + compute_auxiliary_loss",
                   inputs=("episode returns", "(s_t, a_t, o_{t+1}) transitions: step prompts, actions, next observations"),
                   tests=("tests/methods/envrl/",)),
    )
    signals = (EXAMPLES_SIGNAL,)
    training_signals = (EXAMPLES_SIGNAL,)
    _envrl_target_tokens: tuple[float, float] = (0.0, 0.0)  # (SP, ID) target tokens of the generation batch

    @classmethod
    def signal_options(cls, args: Any) -> dict[str, dict[str, Any]]:
        options = super().signal_options(args)
        options[EXAMPLES_SIGNAL] = {
            "sp_fraction": args.envrl_sp_fraction if cls.sp_enabled(args) else 0.0,
            "id_fraction": args.envrl_id_fraction if args.envrl_id_coef > 0 else 0.0,
            "max_observation_tokens": args.envrl_max_observation_tokens,
            "sp_instruction": args.envrl_sp_instruction,
            "id_instruction": args.envrl_id_instruction,
            "targets": cls.sp_targets(args),
            "seed": getattr(args, "seed", 0),
        }
        return options

    @classmethod
    def sp_enabled(cls, args: Any) -> bool:
        """Whether SP examples are built (λ₀_SP > 0)."""
        return args.envrl_sp_coef > 0

    @classmethod
    def sp_targets(cls, args: Any) -> str:
        """"gold" (o_{t+1}) or "shuffled" (the Dark Room placebo)."""
        return "gold"

    # ---- credit --------------------------------------------------------------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        if self.args.envrl_rl_estimator == "gigpo":
            return super().compute_advantages(groups)
        return AgentGRPOTrainer.compute_advantages(self, groups)

    # ---- the auxiliary losses ------------------------------------------------------------------------------------

    @property
    def example_signal(self) -> EnvRLExamples:
        return self.model_signal(EXAMPLES_SIGNAL)

    def compute_signals(self, groups: list[Group]) -> None:
        super().compute_signals(groups)
        # Every process computes its signals once per rollout, so the collectives line up.
        sp, id_ = self.sum_over_processes(self.example_signal.totals())
        self._envrl_target_tokens = (sp, id_)  # over every process of this generation batch
        examples = self.example_signal.examples
        self.log_global_totals({
            "envrl/sp_examples": sum(p[0] is not None for p in examples),
            "envrl/id_examples": sum(p[1] is not None for p in examples),
        })

    def coefficients(self) -> tuple[float, float]:
        """(λ_SP(t), λ_ID(t)) at the current optimizer step."""
        args = self.args
        total = args.envrl_schedule_steps or self.state.max_steps or args.max_steps
        step = self.state.global_step
        return (schedule_coefficient(step, total, args.envrl_sp_coef, args.envrl_schedule),
                schedule_coefficient(step, total, args.envrl_id_coef, args.envrl_schedule))

    def micro_batch_examples(self, inputs: dict[str, Any]) -> tuple[list[Example], list[Example]]:
        """The SP and ID examples of this micro-batch's rows (filler rows, whose loss mask is 0, have none)."""
        values = inputs[token_signal_key(EXAMPLES_SIGNAL)]
        mask = loss_mask(inputs).bool()
        indices: list[int] = []
        for row in range(values.size(0)):
            row_values = values[row][mask[row] & torch.isfinite(values[row])]
            for value in torch.unique(row_values).tolist():  # conversation rows: one value per step of the episode
                if value >= 0:
                    indices.append(int(value))
        table = self.example_signal.examples
        sp = [table[i][0] for i in indices if table[i][0] is not None]
        id_ = [table[i][1] for i in indices if table[i][1] is not None]
        return sp, id_

    def compute_auxiliary_loss(self, model, inputs: dict[str, Any], per_token_logps):
        sp_coef, id_coef = self.coefficients()
        sp, id_ = self.micro_batch_examples(inputs)
        sp = sp if sp_coef > 0 else []
        id_ = id_ if id_coef > 0 else []
        sums = {"sp": 0.0, "id": 0.0}
        counts = {"sp": 0.0, "id": 0.0}
        loss = None
        # With several processes every one runs the extra forward in every micro-batch (sharded models such as
        # DeepSpeed ZeRO-3 need the same calls on every rank): one without examples forwards a 1-token stand-in ×0.
        stand_in = not (sp or id_) and (sp_coef > 0 or id_coef > 0) and self.accelerator.num_processes > 1
        if sp or id_ or stand_in:
            pad = self.text_tokenizer.pad_token_id or 0
            examples = [*sp, *id_] or [Example([pad], [pad], "none")]
            packed = {k: v.to(self.accelerator.device) for k, v in pack_examples(examples, pad).items()}
            nll = example_nll(model, packed)  # (E, T), 0 on padding
            loss = 0.0 * nll.sum()  # the stand-in's value; real examples add their terms below
            kinds = torch.tensor([e.kind == "sp" for e in examples], device=nll.device)
            mask = packed["target_mask"].bool()
            total_sp, total_id = self._envrl_target_tokens
            normalizer = 1.0 / self.accelerator.num_processes
            if self.model.training:
                normalizer /= self.args.steps_per_generation
            ids = torch.tensor([e.kind == "id" for e in examples], device=nll.device)
            for kind, coef, total, selected in (("sp", sp_coef, total_sp, kinds), ("id", id_coef, total_id, ids)):
                keep = mask & selected[:, None]
                if not keep.any():
                    continue
                summed = torch.where(keep, nll, torch.zeros_like(nll)).sum()
                sums[kind], counts[kind] = float(summed.detach()), float(keep.sum())
                # λ(t)·Σ nll / (target tokens of the generation batch on every process): the token mean over them
                loss = loss + coef * summed / (max(total, 1.0) * normalizer)
        self.log_global_means({
            "envrl/sp_loss": (sums["sp"], counts["sp"]),
            "envrl/id_loss": (sums["id"], counts["id"]),
            "envrl/sp_coef": (sp_coef, 1),
            "envrl/id_coef": (id_coef, 1),
        })
        return loss
