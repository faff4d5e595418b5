"""Trainers: `AgentGRPOTrainer` and one thin variant per method, with a registry by method name."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .bepo import BEPOConfig, BEPOTrainer
from .bipace import BiPACEConfig, BiPACETrainer
from .cast import CASTConfig, CASTTrainer
from .ecpo import ECPOConfig, ECPOTrainer
from .gigpo import GiGPOConfig, GiGPOTrainer
from .progpo import ProGPOConfig, ProGPOTrainer
from .scpo import SCPOConfig, SCPOTrainer
from .sspo import SSPOConfig, SSPOTrainer
from .vict import VICTConfig, VICTTrainer


@dataclass(frozen=True)
class Method:
    """A trainable method: its config and trainer classes, config values that define it, and what it needs.

    Args:
        name: Registry name (`method:` in a config YAML, `trl-agents methods`).
        config_class, trainer_class: The Config/Trainer pair.
        defaults: Config values that define the method on top of its config class (e.g. Dr. GRPO's loss type).
        paper: Where the method comes from.
        hook: The AgentGRPOTrainer hook the method overrides.
        inputs: What its credit needs beyond rewards (e.g. "state keys", "solver values", "hidden states").
    """

    name: str
    config_class: type
    trainer_class: type
    defaults: dict[str, Any] = field(default_factory=dict)
    paper: str = ""
    hook: str = "compute_advantages"
    inputs: tuple[str, ...] = ("episode returns",)

    @property
    def env_capabilities(self) -> tuple[str, ...]:
        """Environment capabilities the trainer checks at start-up."""
        return tuple(self.trainer_class.required_env_capabilities)


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
    "gigpo": Method(
        "gigpo", GiGPOConfig, GiGPOTrainer, {}, "arXiv 2505.10978",
        inputs=("episode returns", "step rewards", "state keys (observation text when the env has none)"),
    ),
    "vict": Method(
        "vict", VICTConfig, VICTTrainer, {}, "arXiv 2608.28128",
        inputs=("episode returns", "verifier atoms (env.verify(): status, witness step, dependencies)"),
    ),
    "bepo": Method(
        "bepo", BEPOConfig, BEPOTrainer, {}, "arXiv 2608.06861",
        inputs=("episode returns", "step rewards", "state keys (graph nodes)",
                "canonical actions (bepo_gate='actions' only)"),
    ),
    "ecpo": Method(
        "ecpo", ECPOConfig, ECPOTrainer, {}, "arXiv 2606.05885",
        inputs=("episode returns", "step rewards", "state keys",
                "canonical actions (info['action'] / info['command'], else normalised text)"),
    ),
    "cast": Method(
        "cast", CASTConfig, CASTTrainer, {}, "arXiv 2607.25308",
        inputs=("episode returns", "solver values N(s_t), N(s_t+1) of every step"),
    ),
    "3spo": Method(
        "3spo", SSPOConfig, SSPOTrainer, {}, "arXiv 2606.09961",
        inputs=("success flags", "state keys (observation text when the env has none)", "persistent state-visit table"),
    ),
    "progpo": Method(
        "progpo", ProGPOConfig, ProGPOTrainer, {}, "arXiv 2607.04242",
        inputs=("episode returns", "success labels", "step rewards", "canonical actions (info['action'] or the reply)",
                "state keys (observation text when the env has none)"),
    ),
    "scpo": Method(
        "scpo", SCPOConfig, SCPOTrainer, {}, "arXiv 2606.25852",
        inputs=("episode returns", "success labels", "step rewards", "step observations + canonical actions (scorer)",
                "state keys (observation text when the env has none)"),
    ),
    "bipace": Method(
        "bipace", BiPACEConfig, BiPACETrainer, {}, "arXiv 2606.25556",
        inputs=("episode returns", "step rewards", "policy hidden states of the step prompts (layer hidden_layer)",
                "action keys (info['action'] or the <action> text)"),
    ),
}


def get_method(name: str) -> Method:
    """The method registered as `name`, or a ValueError listing the known methods."""
    try:
        return METHODS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(METHODS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown method {name!r}.{hint} Known methods: {', '.join(sorted(METHODS))}.") from None


__all__ = [
    "METHODS",
    "AgentGRPOConfig",
    "AgentGRPOTrainer",
    "BEPOConfig",
    "BEPOTrainer",
    "BiPACEConfig",
    "BiPACETrainer",
    "CASTConfig",
    "CASTTrainer",
    "ECPOConfig",
    "ECPOTrainer",
    "GiGPOConfig",
    "GiGPOTrainer",
    "Method",
    "ProGPOConfig",
    "ProGPOTrainer",
    "SCPOConfig",
    "SCPOTrainer",
    "SSPOConfig",
    "SSPOTrainer",
    "VICTConfig",
    "VICTTrainer",
    "get_method",
]
