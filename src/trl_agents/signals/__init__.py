"""Signals: what a method needs beyond rewards, computed in one phase between the rollout and credit.

A trainer declares the signals it needs by name (`AgentGRPOTrainer.signals`, e.g. `("solver_value",)` for CAST,
`("teacher_logprobs",)` for SDAR); the values land typed on every `Step`, in `step.signals[name]`, where credit
functions and losses read them, and the JSON-able ones are also written to the trajectory records (`signals`
column). Nothing method-specific lives in the rollout engine or in the trainer's generation step: a signal is
declared once here and computed by one of two generic mechanisms.

**Environment signals** (`EnvSignal`, `signals/env.py`) are functions of the environment, run where it lives — inline,
on the pool's threads (with their timeouts), in a worker process or a Ray actor — inside the same calls that reset
and step it, at one of three moments: `"transition"` (on the state after reset and after each step: the step gets
`Transition(before, after)`, e.g. solver values), `"before_step"` (e.g. privileged context, admissible actions) or
`"episode_end"` (e.g. verifier atoms, on the last step). A signal that raises fails its episode, exactly like a
failing step: the episode is kept in the records with its error and left out of training.

**Model signals** (`ModelSignal`, `signals/model.py`) are batched no-grad forward passes over the recorded tokens,
after the rollout and before credit: per-token log-probs of the sampled actions under a **privileged view** (the
same action ids, a different prompt: hints, skills, the gold answer, future observations; `signals/views.py`)
scored by a **teacher** (the current policy, the frozen step-0 policy — for a LoRA run the adapter-disabled base,
no second copy of the weights — or an EMA copy; `signals/teachers.py`); per-token entropies of the policy; hidden
states of the step prompts (which can also be captured from the rollout's own prefill, without an extra forward).
Forwards are chunked (rows and tokens per forward) so that memory stays bounded however long the episodes are.

| name                 | kind  | value per step                                                            |
|----------------------|-------|---------------------------------------------------------------------------|
| `solver_value`       | env   | `Transition(N(s_t), N(s_t+1))`                                            |
| `verifier_atoms`     | env   | `env.verify()` atoms (last step of the episode)                           |
| `privileged_context` | env   | `env.privileged_context()` before the action                              |
| `admissible_actions` | env   | `env.admissible_actions()` before the action                              |
| `state_key`          | env   | `Transition(key(s_t), key(s_t+1))` of `env.state_key()`                   |
| `teacher_logprobs`   | model | log π_T(a_t,k | privileged prompt, a_t,<k) per action token               |
| `entropy`            | model | entropy of π_θ(· | prompt, a_t,<k) per action token                       |
| `hidden_states`      | model | pooled hidden state of the step prompt at a chosen layer (a tensor)        |

Example:
    >>> from trl_agents.signals import resolve_signals
    >>> env_signals, model_signals = resolve_signals(["teacher_logprobs"], {"teacher_logprobs": {"source": "env"}})
    >>> [s.name for s in env_signals], [s.name for s in model_signals]
    (['privileged_context'], ['teacher_logprobs'])
"""

from .base import (
    SIGNALS,
    TIMINGS,
    EnvSignal,
    ModelSignal,
    Signal,
    SignalError,
    Transition,
    get_signal,
    register_signal,
    required_capabilities,
    resolve_signals,
)
from .env import ADMISSIBLE_ACTIONS, PRIVILEGED_CONTEXT, SOLVER_VALUE, STATE_KEY, VERIFIER_ATOMS
from .model import Entropy, HiddenStates, ModelSignalContext, TeacherLogprobs, TeacherPrompt
from .teachers import TEACHER_KINDS, Teacher, build_teacher
from .views import DEFAULT_TEMPLATE, PrivilegedView

__all__ = [
    "ADMISSIBLE_ACTIONS",
    "DEFAULT_TEMPLATE",
    "PRIVILEGED_CONTEXT",
    "SIGNALS",
    "SOLVER_VALUE",
    "STATE_KEY",
    "TEACHER_KINDS",
    "TIMINGS",
    "VERIFIER_ATOMS",
    "Entropy",
    "EnvSignal",
    "HiddenStates",
    "ModelSignal",
    "ModelSignalContext",
    "PrivilegedView",
    "Signal",
    "SignalError",
    "Teacher",
    "TeacherLogprobs",
    "TeacherPrompt",
    "Transition",
    "build_teacher",
    "get_signal",
    "register_signal",
    "required_capabilities",
    "resolve_signals",
]
