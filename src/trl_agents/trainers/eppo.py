"""EPPO: Entropy Pacing Policy Optimization (Hu et al. 2026, arXiv 2607.07178; docs/methods/eppo.md).

The change w.r.t. `AgentGRPOTrainer`: GRPO's fixed clipping range becomes a per-task bound. Every row of the
training batch carries its task type (the dataset column `eppo_task_type_field`, e.g. ALFWorld's `task_type`; the
`eppo_task_type` signal lays it into the batch, no forward); TRL's loss computes the policy's per-token entropies
anyway, and the trainer sums them per task type over each generation batch (`compute_auxiliary_loss`, which adds no
loss). At the next rollout these sums (over every process) update one EMA of the mean token entropy per task type;
each task's scale s_k = clip((H_k / mean H)^α, 1/c, c) multiplies ε_low and ε_high (or only ε_high:
`eppo_clip_sides="high"`) of its rows (`clip_bounds`). Math in `trl_agents/credit/eppo.py`. With equal entropies (or a
single task type) every s_k is 1 and the loss is GRPO's exactly. The first generation batch trains with GRPO's bounds
(no entropy measured yet).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.eppo import EPPOConfig, EPPOTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 3553))  # rows carry `task_type`
    config = EPPOConfig(output_dir="alfworld-eppo", max_turns=50, eppo_task_type_field="task_type")
    EPPOTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..names import check_choice
from ..credit.eppo import SIDES, EntropyPacer, task_bounds
from ..training.batch import token_signal_key
from ..signals.base import SIGNALS, ModelSignal, register_signal
from ..trajectory import Group, first_occurrences
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from ..training.batch import loss_mask
from .registry import MethodInfo

TASK_TYPE_SIGNAL = "eppo_task_type"
STATE_FILE = "eppo_state.json"


def task_type_of(task: dict[str, Any], field_name: str) -> str:
    """The task type of a task row: `str(task[field_name])` ("None" when the row lacks it)."""
    return str(task.get(field_name))


class TaskTypeSignal(ModelSignal):
    """The task type of every trained step, as a per-token index into `self.names` (no forward).

    Indices are this process's own (assigned in order of first appearance, stable for the whole run); the trainer
    turns them back into names before anything crosses processes."""

    name = TASK_TYPE_SIGNAL
    description = "task type of each step (index into the trainer's task-type names; no forward)"
    recorded = False  # per-process indices mean nothing in the records (the task row holds the type)
    layout = "tokens"

    def __init__(self, field: str = "task_type"):
        self.field = field
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def index(self, task_type: str) -> int:
        if task_type not in self._index:
            self._index[task_type] = len(self.names)
            self.names.append(task_type)
        return self._index[task_type]

    def compute(self, groups: Sequence[Group], context) -> None:
        for trajectory, indices in first_occurrences(groups):
            value = float(self.index(task_type_of(trajectory.task, self.field)))
            for i in indices:
                step = trajectory.steps[i]
                if step.action_ids:
                    step.signals[self.name] = [value] * len(step.action_ids)


if TASK_TYPE_SIGNAL not in SIGNALS:
    register_signal(TASK_TYPE_SIGNAL, TaskTypeSignal)


@dataclass
class EPPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`EPPOTrainer`]: every [`AgentGRPOConfig`] field plus EPPO's. `epsilon` / `epsilon_high` are
    the base bounds ε₀ that each task's scale multiplies.

    Args:
        eppo_task_type_field (`str`, *optional*, defaults to `"task_type"`): Dataset column with the task type.
        eppo_ema_decay (`float`, *optional*, defaults to `0.9`): d of the per-task entropy EMA.
        eppo_alpha (`float`, *optional*, defaults to `1.0`): α, exponent of the relative pace.
        eppo_max_scale (`float`, *optional*, defaults to `2.0`): c, the scale is clipped to [1/c, c].
        eppo_clip_sides (`str`, *optional*, defaults to `"both"`): `"both"` or `"high"` (clip-higher variant).
        eppo_freeze_steps (`int`, *optional*, defaults to `0`): W of the crossover freeze (0 = off).
    """

    eppo_task_type_field: str = field(
        default="task_type",
        metadata={"help": "Dataset column holding each task's type, the unit of entropy pacing (ALFWorld rows have "
        "`task_type`; `env` paces environments against each other). A row without it has the type 'None'."},
    )
    eppo_ema_decay: float = field(
        default=0.9,
        metadata={"help": "d of H_k ← d·H_k + (1 − d)·mean token entropy of task k, updated once per generation "
        "batch (our choice: the paper's rule is not public; docs/methods/eppo.md)."},
    )
    eppo_alpha: float = field(
        default=1.0,
        metadata={"help": "α of the scale s_k = clip((H_k / mean H)^α, 1/c, c); 0 turns pacing off (our choice)."},
    )
    eppo_max_scale: float = field(
        default=2.0,
        metadata={"help": "c: each task's scale of ε stays in [1/c, c] (our choice: 2, ε in [0.1, 0.4] for ε₀ = 0.2)."},
    )
    eppo_clip_sides: str = field(
        default="both",
        metadata={"help": "'both': the scale multiplies ε_low and ε_high; 'high': only ε_high (a clip-higher "
        "variant; our choice of default: the abstract speaks of one adaptive bound)."},
    )
    eppo_freeze_steps: int = field(
        default=0,
        metadata={"help": "W: when two tasks' entropy order flips (a crossover), hold the scales for W generation "
        "batches while the EMAs keep tracking; 0 = off (our choice, an option the abstract motivates)."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("eppo_clip_sides", self.eppo_clip_sides, SIDES)
        if not isinstance(self.eppo_task_type_field, str) or not self.eppo_task_type_field:
            raise ValueError(f"eppo_task_type_field must name a dataset column, got {self.eppo_task_type_field!r}")
        if not 0.0 <= self.eppo_ema_decay < 1.0:
            raise ValueError(f"eppo_ema_decay must be in [0, 1) (e.g. 0.9), got {self.eppo_ema_decay}")
        if not (math.isfinite(self.eppo_alpha) and self.eppo_alpha >= 0):
            raise ValueError(f"eppo_alpha must be a finite number >= 0 (1 = proportional pacing), got {self.eppo_alpha}")
        if not (math.isfinite(self.eppo_max_scale) and self.eppo_max_scale >= 1):
            raise ValueError(f"eppo_max_scale must be a finite number >= 1 (e.g. 2), got {self.eppo_max_scale}")
        if self.eppo_freeze_steps < 0:
            raise ValueError(f"eppo_freeze_steps must be >= 0 (0 = no crossover freeze), got {self.eppo_freeze_steps}")
        if self.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
            raise ValueError(f"EPPO scales the clipping range of a clipped loss: loss_type must be one of grpo, bnpo, "
                             f"dr_grpo, dapo, luspo, got {self.loss_type!r}")


class EPPOTrainer(AgentGRPOTrainer):
    """EPPO on `AgentGRPOTrainer` (see the module docstring): per-row clipping bounds from per-task entropy pace.

    Logs `eppo/entropy/<type>` (the EMA H_k), `eppo/scale/<type>` (s_k), `eppo/epsilon_high/<type>`,
    `eppo/task_types`, `eppo/crossovers` (pairs whose entropy order flipped at this update) and `eppo/frozen` (1 when
    the crossover freeze held the scales).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "eppo"]
    _name = "EPPO"
    config_class = EPPOConfig
    methods = (
        MethodInfo("eppo", "arXiv 2607.07178", "trl_agents.credit.eppo", max_staleness=1, title="EPPO",
                   hook="clip_bounds (per-task ε) + compute_auxiliary_loss (entropy sums, no loss)",
                   inputs=("episode returns", "task type per task (dataset column)", "per-token entropies of the loss"),
                   tests=("tests/methods/eppo/",)),
    )
    signals = (TASK_TYPE_SIGNAL,)
    training_signals = (TASK_TYPE_SIGNAL,)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.args
        self.pacer = EntropyPacer(decay=config.eppo_ema_decay, alpha=config.eppo_alpha,
                                  max_scale=config.eppo_max_scale, freeze_steps=config.eppo_freeze_steps)
        self._entropy_totals: dict[int, list[float]] = {}  # this process's task index -> [Σ entropy, tokens]
        columns = getattr(self.train_dataset, "column_names", None)
        if columns is not None and config.eppo_task_type_field not in columns:
            raise ValueError(
                f"eppo_task_type_field={config.eppo_task_type_field!r} is not a column of the training data (columns: "
                f"{', '.join(columns)}): set it to the column holding each task's type (e.g. 'task_type', or 'env')."
            )

    @classmethod
    def signal_options(cls, args: Any) -> dict[str, dict[str, Any]]:
        options = super().signal_options(args)
        options[TASK_TYPE_SIGNAL] = {"field": args.eppo_task_type_field}
        return options

    @property
    def task_type_signal(self) -> TaskTypeSignal:
        return self.model_signal(TASK_TYPE_SIGNAL)

    # ---- the controller: one EMA update per training rollout ---------------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        if self.model.training:
            self.update_pace()
        return super().compute_advantages(groups)

    def update_pace(self) -> dict[str, Any]:
        """Fold the entropy sums of the last generation batch (summed over processes) into the pacer; log it."""
        names = self.task_type_signal.names
        local: dict[str, list[float]] = {}
        for index, (total, count) in self._entropy_totals.items():
            pair = local.setdefault(names[index], [0.0, 0.0])
            pair[0] += total
            pair[1] += count
        self._entropy_totals = {}
        if self.accelerator.num_processes > 1:  # every process folds the same totals, so all hold the same state
            from accelerate.utils import gather_object

            merged: dict[str, list[float]] = {}
            for part in gather_object([local]):
                for name, (total, count) in part.items():
                    pair = merged.setdefault(name, [0.0, 0.0])
                    pair[0] += total
                    pair[1] += count
            local = merged
        info = self.pacer.observe({name: (total, count) for name, (total, count) in sorted(local.items())})
        epsilon_low, epsilon_high = self.epsilon_low, self.epsilon_high
        for name in sorted(self.pacer.ema):
            scale = self.pacer.scale(name)
            self.log_metric(f"eppo/entropy/{name}", self.pacer.ema[name])
            self.log_metric(f"eppo/scale/{name}", scale)
            self.log_metric(f"eppo/epsilon_high/{name}",
                            task_bounds(scale, epsilon_low, epsilon_high, self.args.eppo_clip_sides)[1])
        self.log_metric("eppo/task_types", float(len(self.pacer.ema)))
        self.log_metric("eppo/crossovers", float(info["crossovers"]))
        self.log_metric("eppo/frozen", info["frozen"])
        return info

    # ---- the loss: per-row bounds in, per-task entropy sums out ------------------------------------------------

    def row_task_indices(self, inputs: dict[str, Any]) -> torch.Tensor:
        """(B,) long: each row's task index (its first finite `eppo_task_type` value), −1 for rows without one."""
        values = inputs[token_signal_key(TASK_TYPE_SIGNAL)]
        finite = torch.isfinite(values)
        first = torch.where(finite, values, torch.full_like(values, -1.0)).amax(dim=1)  # one type per row
        return first.long()

    def clip_bounds(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
        key = token_signal_key(TASK_TYPE_SIGNAL)
        if key not in inputs:
            return None
        indices = self.row_task_indices(inputs).tolist()
        names = self.task_type_signal.names
        scales = [self.pacer.scale(names[i]) if 0 <= i < len(names) else 1.0 for i in indices]
        bounds = [task_bounds(s, self.epsilon_low, self.epsilon_high, self.args.eppo_clip_sides) for s in scales]
        device = inputs["completion_ids"].device
        low = torch.tensor([[b[0]] for b in bounds], dtype=torch.float32, device=device)
        high = torch.tensor([[b[1]] for b in bounds], dtype=torch.float32, device=device)
        return low, high

    def compute_auxiliary_loss(self, model, inputs: dict[str, Any], per_token_logps):
        entropies = self.loss_entropies
        key = token_signal_key(TASK_TYPE_SIGNAL)
        if entropies is None or not self.model.training or key not in inputs:
            return None  # noqa: RET501 (EPPO adds no loss: it only reads the entropies)
        mask = loss_mask(inputs).bool() & torch.isfinite(entropies)
        indices = self.row_task_indices(inputs)
        sums = torch.where(mask, entropies.float(), torch.zeros_like(entropies, dtype=torch.float32)).sum(dim=1)
        counts = mask.sum(dim=1)
        for index, total, count in zip(indices.tolist(), sums.tolist(), counts.tolist(), strict=True):
            if index >= 0 and count > 0:
                pair = self._entropy_totals.setdefault(index, [0.0, 0.0])
                pair[0] += total
                pair[1] += count
        return None  # noqa: RET501 (the hook's "no extra loss")

    # ---- resume ------------------------------------------------------------------------------------------------

    def save_extra_state(self, output_dir: str) -> None:
        with open(os.path.join(output_dir, STATE_FILE), "w") as handle:
            json.dump(self.pacer.state_dict(), handle, indent=2)

    def load_extra_state(self, checkpoint_dir: str) -> None:
        path = os.path.join(checkpoint_dir, STATE_FILE)
        if os.path.isfile(path):
            with open(path) as handle:
                self.pacer.load_state_dict(json.load(handle))
