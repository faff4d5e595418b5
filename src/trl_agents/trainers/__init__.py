"""Trainers: `AgentGRPOTrainer` and one thin variant per method, with a registry by method name."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .gigpo import GiGPOConfig, GiGPOTrainer


@dataclass(frozen=True)
class Method:
    """A trainable method: its config and trainer classes, and config values that define it."""

    name: str
    config_class: type
    trainer_class: type
    defaults: dict[str, Any] = field(default_factory=dict)
    paper: str = ""


METHODS: dict[str, Method] = {
    "grpo": Method("grpo", AgentGRPOConfig, AgentGRPOTrainer, {"advantage_estimator": "grpo"}, "arXiv 2402.03300"),
    "dr_grpo": Method(
        "dr_grpo",
        AgentGRPOConfig,
        AgentGRPOTrainer,
        {"advantage_estimator": "grpo", "scale_rewards": "none", "loss_type": "dr_grpo"},
        "arXiv 2503.20783",
    ),
    "rloo": Method("rloo", AgentGRPOConfig, AgentGRPOTrainer, {"advantage_estimator": "rloo"}, "arXiv 2402.14740"),
    "gigpo": Method("gigpo", GiGPOConfig, GiGPOTrainer, {}, "arXiv 2505.10978"),
}


def get_method(name: str) -> Method:
    """The method registered as `name`, or a ValueError listing the known methods."""
    try:
        return METHODS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(METHODS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown method {name!r}.{hint} Known methods: {', '.join(sorted(METHODS))}.") from None


__all__ = ["METHODS", "AgentGRPOConfig", "AgentGRPOTrainer", "GiGPOConfig", "GiGPOTrainer", "Method", "get_method"]
