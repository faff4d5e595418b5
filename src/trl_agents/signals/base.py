"""The two kinds of signals, their registry, and how a trainer's declared names become signal objects.

See the package docstring (`trl_agents.signals`) for the design. This module holds the types:

* `EnvSignal`: a function of an environment, run where the environment lives, at one of three moments (`TIMINGS`).
* `ModelSignal`: a batched, no-grad computation over the recorded tokens of a rollout (subclasses in `model.py`).
* `register_signal` / `get_signal` / `SIGNALS`: the registry by name; `resolve_signals` turns the names a trainer
  declares (plus their options) into the environment signals the engine records and the model signals the trainer
  computes, dependencies included.

Example:
    >>> from trl_agents.signals import get_signal, resolve_signals
    >>> get_signal("solver_value").timing
    'transition'
    >>> env_signals, model_signals = resolve_signals(["solver_value"])
    >>> [s.name for s in env_signals], model_signals
    (['solver_value'], [])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..names import did_you_mean

# When an environment signal is evaluated, where the environment lives (`EnvPool`: inline, thread, worker process,
# Ray actor), and what a step receives:
#   "transition":   on the state after `reset` and after every step; step t gets Transition(before=v(s_t),
#                   after=v(s_{t+1})) — one call per step (the "after" of step t is the "before" of step t+1).
#   "before_step":  on the state right before each action; step t gets v(s_t).
#   "episode_end":  once, after the episode's last step (done, out of turns, or a conversation that outgrew its
#                   context); the last step gets the value.
TIMINGS = ("transition", "before_step", "episode_end")


class Transition(NamedTuple):
    """A state signal on both sides of one action: `before` = v(s_t), `after` = v(s_{t+1}). Stored as a
    two-element list in the trajectory records (`before, after = step.signals[name]` works for both)."""

    before: Any
    after: Any


class SignalError(RuntimeError):
    """A signal could not be computed for an episode; the episode fails with this message (like a failing step)."""


@dataclass(frozen=True)
class EnvSignal:
    """A signal computed from the environment, where it lives.

    Args:
        name: Registry name; the value lands in `step.signals[name]`.
        fn: `fn(env) -> value` (JSON-able, so that it travels back from a worker process and into the records). A
            module-level function, so that it pickles for the process and Ray backends.
        timing: One of `TIMINGS`.
        capability: The `AgentEnv` capability the function needs (`env.capabilities()`), checked at start-up; None
            when every environment has it.
        description: One line for `trl-agents methods`.
    """

    name: str
    fn: Callable[[Any], Any]
    timing: str
    capability: str | None = None
    description: str = ""

    def __post_init__(self):
        if self.timing not in TIMINGS:
            raise ValueError(f"EnvSignal {self.name!r}: timing must be one of {TIMINGS}, got {self.timing!r}")

    kind = "env"
    recorded = True

    def requires(self) -> tuple[str, ...]:
        return ()


class ModelSignal:
    """A signal computed by the model after the rollout: batched no-grad forward passes over the recorded tokens.

    Subclasses set `name` and `description` and implement `compute(groups, context)`, which stores one value per
    step in `step.signals[self.name]` for every step of the given (healthy) groups. `requires()` names the
    environment signals it reads (e.g. a privileged view fed by `env.privileged_context()`), which are then
    recorded during the rollout. `capture(model)` may return a context manager that observes the generator's own
    forward passes during the rollout (the trainer enters it around every generation call of a rollout); the
    default observes nothing.
    """

    name: str = ""
    description: str = ""
    kind = "model"
    capability: str | None = None
    recorded: bool = True  # JSON-able values also go to the trajectory records
    layout: str = "tokens"  # in the training batch: "tokens" (one value per action token) or "prompt" (token ids)

    def requires(self) -> tuple[str, ...]:
        return ()

    def capture(self, model):
        return None

    def reset(self) -> None:
        """Forget what `capture` kept (called before every rollout)."""

    def compute(self, groups, context) -> None:
        raise NotImplementedError


Signal = EnvSignal | ModelSignal
SignalFactory = Callable[..., Signal]

SIGNALS: dict[str, SignalFactory] = {}
"""Signal factories by name: `SIGNALS[name](**options)` builds the signal (environment signals take no options)."""


def register_signal(name: str, factory: SignalFactory | EnvSignal) -> None:
    """Register a signal under `name`: an `EnvSignal`, or a callable building a `ModelSignal` from keyword options
    (e.g. the class itself)."""
    if isinstance(factory, EnvSignal):
        signal = factory

        def factory(**options):
            if options:
                raise ValueError(f"environment signal {name!r} takes no options, got {sorted(options)}")
            return signal

    if name in SIGNALS:
        raise ValueError(f"a signal named {name!r} is already registered")
    SIGNALS[name] = factory


def get_signal(name: str, **options: Any) -> Signal:
    """The signal registered as `name`, built with `options`; a ValueError naming the known signals otherwise.

    >>> get_signal("solver_valu")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Unknown signal 'solver_valu'. Did you mean 'solver_value'? Known signals: ...
    """
    try:
        factory = SIGNALS[name]
    except (KeyError, TypeError):
        hint = did_you_mean(name, list(SIGNALS))
        raise ValueError(f"Unknown signal {name!r}.{hint} Known signals: {', '.join(sorted(SIGNALS))}.") from None
    return factory(**options)


def resolve_signals(
    names: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[list[EnvSignal], list[ModelSignal]]:
    """The environment and model signals for the declared `names` (each built with `options[name]`), plus the
    environment signals the model signals require, each once, in declaration order."""
    options = options or {}
    env_signals: dict[str, EnvSignal] = {}
    model_signals: dict[str, ModelSignal] = {}
    pending = list(names)
    while pending:
        name = pending.pop(0)
        if name in env_signals or name in model_signals:
            continue
        signal = get_signal(name, **dict(options.get(name, {})))
        if isinstance(signal, EnvSignal):
            env_signals[name] = signal
        else:
            model_signals[name] = signal
            pending.extend(signal.requires())
    return list(env_signals.values()), list(model_signals.values())


def required_capabilities(signals: Sequence[Signal]) -> tuple[str, ...]:
    """The environment capabilities the given signals need, each once."""
    return tuple(dict.fromkeys(s.capability for s in signals if s.capability))
