"""Stage 2, signals: what a method needs beyond rewards, computed between the rollout and credit
(docs/signals.md; docs/concepts/training_loop.md#signals).

`SignalPhase` holds a trainer's declared signals, resolved once: the environment signals the rollout engine records
where the environments live, and the model signals this phase computes on the healthy episodes of a rollout
(`compute`), or mid-rollout when a topology asks for one (`for_topology`, e.g. entropies to rank branch points). It
also lays out which signals go into the training batch (`training_layouts`) and lets model signals observe the
rollout's own forwards while it generates (`captures`, e.g. hidden states from the prefill). `declared_signals` and
`required_capabilities` say what a trainer class computes and needs with a config (the registry reads them).
`build_teacher` builds the teacher of teacher signals; `TeacherUpdate` moves an EMA teacher after every optimizer
step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from ..signals import ModelSignal, get_signal, resolve_signals
from ..signals import required_capabilities as signal_capabilities
from ..trajectory import Group, Trajectory
from .tasks import as_namespace


class SignalPhase:
    """A trainer's signals (`names`, with their `options`), resolved once.

    Args:
        names: The declared signal names (`AgentGRPOTrainer.signal_names(args)`).
        options: Options per signal name (`signal_options(args)`).
        training_names: The model signals laid into the training batch (`training_signal_names(args)`).
        owner: The trainer's class name, for errors.
    """

    def __init__(self, names: Sequence[str], options: dict[str, dict[str, Any]], training_names: Sequence[str],
                 owner: str):
        self.options = options
        self.env_signals, self.model_signals = resolve_signals(names, options)
        self._signals = {s.name: s for s in self.model_signals}  # topologies' mid-rollout signals join them
        layouts = {s.name: s.layout for s in self.model_signals}
        unknown = [name for name in training_names if name not in layouts]
        if unknown:
            raise ValueError(f"{owner}.training_signals names undeclared model signals: {unknown}")
        self.training_layouts = {name: layouts[name] for name in training_names}
        self.capturing = False  # on only while a rollout generates: model signals may observe its forwards
        self.context = None  # the ModelSignalContext, set by the trainer once its model is ready
        self._topology_seconds: dict[str, float] = {}

    def signal(self, name: str) -> ModelSignal:
        """The model signal `name` this phase computes (a declared one, or one a topology asked for)."""
        if name not in self._signals:
            self._signals[name] = get_signal(name, **self.options.get(name, {}))
        return self._signals[name]

    @property
    def unrecorded(self) -> list[str]:
        """Names of the signals whose values are not written to the trajectory records."""
        return [s.name for s in self._signals.values() if not s.recorded]

    def reset(self) -> None:
        """Before a rollout: every declared model signal forgets what it captured."""
        for signal in self.model_signals:
            signal.reset()

    @contextlib.contextmanager
    def captures(self, model):
        """While a rollout generates (`capturing`), the declared model signals observe `model`'s forwards."""
        with contextlib.ExitStack() as stack:
            if self.capturing:
                for signal in self.model_signals:
                    capture = signal.capture(model)
                    if capture is not None:
                        stack.enter_context(capture)
            yield model

    def compute(self, groups: list[Group], no_grad_forwards: Callable) -> dict[str, tuple[float, int]]:
        """The declared model signals on the healthy episodes of a rollout (`no_grad_forwards()`: the context of
        no-grad forwards); returns each signal's seconds, those the topology computed during the rollout included,
        as `signals/<name>_seconds` -> (seconds, 1) (for `log_global_means`)."""
        timings = {f"signals/{name}_seconds": (seconds, 1) for name, seconds in self._topology_seconds.items()}
        self._topology_seconds = {}  # (those the topology computed during this rollout)
        for signal in self.model_signals:
            start = time.perf_counter()
            with torch.no_grad(), no_grad_forwards():
                signal.compute(groups, self.context)
            name = f"signals/{signal.name}_seconds"
            timings[name] = (timings.get(name, (0.0, 1))[0] + time.perf_counter() - start, 1)
        return timings

    def for_topology(self, name: str, trajectories: list[Trajectory], no_grad_forwards: Callable) -> None:
        """A model signal a topology needs mid-rollout (e.g. entropies to rank branch points), on `trajectories`."""
        signal = self.signal(name)
        capturing, self.capturing = self.capturing, False
        start = time.perf_counter()
        try:
            with torch.no_grad(), no_grad_forwards():
                signal.compute([Group(task={}, trajectories=list(trajectories))], self.context)
        finally:
            self.capturing = capturing
            self._topology_seconds[name] = self._topology_seconds.get(name, 0.0) + (time.perf_counter() - start)


def trainer_signals(trainer_class, args: Any) -> tuple[list, list, Any]:
    """(environment signals, model signals, topology) of a trainer class with `args` (a config or any object with
    its fields): the declared signals, the environment signals they need, and the model signals its topology computes
    mid-rollout."""
    args = as_namespace(args)
    topology = trainer_class.make_topology(args)
    env_signals, model_signals = resolve_signals(
        [*trainer_class.signal_names(args), *topology.model_signals], trainer_class.signal_options(args)
    )
    return env_signals, model_signals, topology


def declared_signals(trainer_class, args: Any) -> tuple[str, ...]:
    """Every signal a trainer class computes with `args`: the declared ones, the environment signals they need, and
    the model signals of its topology (what the registry and `trl-agents methods` show)."""
    env_signals, model_signals, _ = trainer_signals(trainer_class, args)
    return tuple(s.name for s in [*model_signals, *env_signals])


def required_capabilities(trainer_class, args: Any) -> tuple[str, ...]:
    """Environment capabilities a trainer class checks at start-up with `args`: its own
    (`required_env_capabilities`), its signals' and its topology's."""
    env_signals, model_signals, topology = trainer_signals(trainer_class, args)
    return tuple(dict.fromkeys([
        *trainer_class.required_env_capabilities,
        *signal_capabilities([*env_signals, *model_signals]),
        *topology.required_capabilities,
    ]))


def build_teacher(args: Any, policy, model_context: Callable, reference):
    """The teacher of teacher signals (`args.teacher`: the current policy, the frozen step-0 one, or an EMA copy)."""
    from ..signals.teachers import build_teacher as build

    if args.teacher == "frozen" and args.sync_ref_model:
        raise ValueError(
            "teacher='frozen' scores with the step-0 policy, but sync_ref_model=True moves TRL's reference "
            "model (which the frozen teacher reuses) towards the policy: set sync_ref_model=False, or "
            "teacher='ema' for a teacher that follows the policy."
        )
    return build(args.teacher, policy, model_context, reference=reference, ema_decay=args.teacher_ema_decay)


class TeacherUpdate(TrainerCallback):
    """Moves an EMA teacher towards the policy after every optimizer step."""

    def __init__(self, trainer, teacher):
        self.trainer, self.teacher = trainer, teacher

    def on_step_end(self, args, state, control, **kwargs):
        self.teacher.update(self.trainer.accelerator.unwrap_model(self.trainer.model))
