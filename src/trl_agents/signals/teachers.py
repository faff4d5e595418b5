"""Teachers: the model that scores recorded actions under a privileged view (self-distillation methods).

| kind        | the teacher is                              | full fine-tuning                   | LoRA / PEFT                           |
|-------------|---------------------------------------------|------------------------------------|---------------------------------------|
| `"current"` | the policy being trained, as it is now      | the policy                         | the policy                            |
| `"frozen"`  | the policy at step 0                        | TRL's reference model when there   | the base model: adapters disabled (no |
|             |                                             | is one (beta > 0), else a frozen   | second copy of the weights)           |
|             |                                             | copy made when the trainer starts  |                                       |
| `"ema"`     | θ_T ← d·θ_T + (1 − d)·θ after every step    | a copy, updated in place           | a second adapter (`teacher_ema`)      |

Every teacher forward runs under `torch.no_grad()` in eval mode (no dropout). The teachers that are the policy
("current", and the LoRA forms of "frozen" and "ema") run through the trainer's generation context, so DeepSpeed
ZeRO-3 gathers the parameters as it does for generation; a separate model ("frozen" with TRL's reference model, which
TRL prepares for DeepSpeed itself, or a copy; "ema" with full fine-tuning: a copy) is used as it is, so the copies
need an unsharded policy (one GPU, DDP) — use a LoRA run or `beta > 0` (TRL's reference model) under ZeRO-3. A copy
doubles the memory of the weights; the LoRA forms add nothing but the adapter. An EMA teacher is not saved with the
checkpoints: a resumed run starts it again from the weights the trainer was built with.

Example:
    >>> import torch
    >>> from trl_agents.signals.teachers import EMATeacher
    >>> policy = torch.nn.Linear(1, 1, bias=False)
    >>> _ = torch.nn.init.constant_(policy.weight, 1.0)
    >>> teacher = EMATeacher(policy, decay=0.5)
    >>> _ = torch.nn.init.constant_(policy.weight, 3.0)
    >>> teacher.update(policy)  # 0.5·1 + 0.5·3
    >>> teacher.model.weight.item()
    2.0
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

TEACHER_KINDS = ("current", "frozen", "ema")
EMA_ADAPTER = "teacher_ema"

ModelContext = Callable[[], contextlib.AbstractContextManager]


def is_peft_model(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class Teacher:
    """A teacher: `context()` yields the model to score with; `update(policy)` runs after every optimizer step."""

    kind = ""

    def context(self) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    def update(self, policy) -> None:
        """Called after every optimizer step with the (unwrapped) policy; only the EMA teacher changes."""


class CurrentTeacher(Teacher):
    """The policy itself, as it is now (the rollout's policy: these are the old log-probs under the view)."""

    kind = "current"

    def __init__(self, model_context: ModelContext):
        self.model_context = model_context

    def context(self):
        return self.model_context()


class FrozenAdapterTeacher(Teacher):
    """The step-0 policy of a LoRA/PEFT run: the policy with its adapters disabled (the base model)."""

    kind = "frozen"

    def __init__(self, model_context: ModelContext):
        self.model_context = model_context

    @contextlib.contextmanager
    def context(self):
        with self.model_context() as model, model.disable_adapter():
            yield model


class CopyTeacher(Teacher):
    """A separate model: a frozen copy (or TRL's reference model) — the step-0 policy of a full fine-tuning run."""

    kind = "frozen"

    def __init__(self, model):
        self.model = model

    @contextlib.contextmanager
    def context(self):
        yield self.model


class EMATeacher(Teacher):
    """An exponential moving average of the policy, θ_T ← d·θ_T + (1 − d)·θ after every optimizer step (full
    fine-tuning: a copy of the model, kept on the policy's device)."""

    kind = "ema"

    def __init__(self, policy, decay: float):
        check_decay(decay)
        self.decay = decay
        self.model = frozen_copy(policy)

    @contextlib.contextmanager
    def context(self):
        yield self.model

    @torch.no_grad()
    def update(self, policy) -> None:
        for teacher, student in zip(self.model.parameters(), policy.parameters(), strict=True):
            teacher.mul_(self.decay).add_(student.detach().to(teacher.dtype), alpha=1.0 - self.decay)


class EMAAdapterTeacher(Teacher):
    """An exponential moving average of a LoRA/PEFT policy's trainable adapter, held as a second adapter
    (`teacher_ema`) on the same base weights."""

    kind = "ema"

    def __init__(self, peft_model, model_context: ModelContext, decay: float):
        check_decay(decay)
        self.decay = decay
        self.model_context = model_context
        active = peft_model.active_adapter
        self.active = active if isinstance(active, str) else active[0]
        peft_model.add_adapter(EMA_ADAPTER, copy.deepcopy(peft_model.peft_config[self.active]))
        pairs = self._pairs(peft_model)
        with torch.no_grad():
            for teacher, student in pairs:
                teacher.copy_(student)
                teacher.requires_grad_(False)
        peft_model.set_adapter(self.active)  # adding an adapter may make it the active one

    def _pairs(self, peft_model) -> list[tuple[torch.Tensor, torch.Tensor]]:
        params = dict(peft_model.named_parameters())
        pairs = []
        for name, teacher in params.items():
            if f".{EMA_ADAPTER}." in name:
                student = params.get(name.replace(f".{EMA_ADAPTER}.", f".{self.active}."))
                if student is None:
                    raise ValueError(f"EMA teacher: no parameter of adapter {self.active!r} matches {name!r}")
                pairs.append((teacher, student))
        if not pairs:
            raise ValueError("EMA teacher: the PEFT model has no parameters of the added adapter")
        return pairs

    @contextlib.contextmanager
    def context(self):
        with self.model_context() as model:
            previous = model.active_adapter
            model.set_adapter(EMA_ADAPTER)
            try:
                yield model
            finally:
                model.set_adapter(previous)
                for name, param in model.named_parameters():  # set_adapter marks the active adapter trainable
                    if f".{EMA_ADAPTER}." in name:
                        param.requires_grad_(False)

    @torch.no_grad()
    def update(self, policy) -> None:
        for teacher, student in self._pairs(policy):
            teacher.mul_(self.decay).add_(student.detach().to(teacher.dtype), alpha=1.0 - self.decay)


def check_decay(decay: float) -> None:
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"teacher_ema_decay must be in [0, 1), got {decay!r} (OPSD's EMA teacher: e.g. 0.999)")


def frozen_copy(model):
    """A no-grad, eval-mode deep copy of `model` (the step-0 weights of a teacher)."""
    clone = copy.deepcopy(model)
    clone.requires_grad_(False)
    clone.eval()
    return clone


def build_teacher(kind: str, policy, model_context: ModelContext, *, reference=None, ema_decay: float = 0.999):
    """The teacher of `kind` for `policy` (the unwrapped model being trained).

    Args:
        kind: One of `TEACHER_KINDS`.
        policy: The unwrapped policy (a transformers model or a PEFT model).
        model_context: Yields the policy for no-grad forwards (the trainer's generation context).
        reference: TRL's reference model, when the trainer has one (beta > 0 with full fine-tuning): the frozen
            teacher then reuses it instead of copying the weights again.
        ema_decay: d of the EMA teacher.
    """
    if kind not in TEACHER_KINDS:
        raise ValueError(f"teacher must be one of {', '.join(map(repr, TEACHER_KINDS))}, got {kind!r}")
    if kind == "current":
        return CurrentTeacher(model_context)
    peft = is_peft_model(policy)
    if kind == "frozen":
        if peft:
            return FrozenAdapterTeacher(model_context)
        return CopyTeacher(reference if reference is not None else frozen_copy(policy))
    if peft:
        return EMAAdapterTeacher(policy, model_context, ema_decay)
    return EMATeacher(policy, ema_decay)
