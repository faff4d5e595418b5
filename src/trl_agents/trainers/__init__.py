"""Trainers: `AgentGRPOTrainer` and one thin variant per method, with a registry by method name (read from the
trainer classes: see `trainers/registry.py`)."""

from __future__ import annotations

import importlib
import pkgutil

from . import agent_grpo
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .bepo import BEPOConfig, BEPOTrainer
from .bipace import BiPACEConfig, BiPACETrainer
from .cast import CASTConfig, CASTTrainer
from .ecpo import ECPOConfig, ECPOTrainer
from .gigpo import GiGPOConfig, GiGPOTrainer
from .progpo import ProGPOConfig, ProGPOTrainer
from .registry import Method, MethodInfo, lookup
from .scpo import SCPOConfig, SCPOTrainer
from .sspo import SSPOConfig, SSPOTrainer
from .vict import VICTConfig, VICTTrainer


def discover_methods() -> dict[str, Method]:
    """Import every module of `trl_agents.trainers` and collect the `methods` each trainer class declares, in a
    stable order (AgentGRPOTrainer's first, then by module name)."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")
    classes, pending = [], [agent_grpo.AgentGRPOTrainer]
    while pending:
        cls = pending.pop(0)
        if cls not in classes:
            classes.append(cls)
            pending.extend(cls.__subclasses__())
    ours = [c for c in classes if c.__module__.startswith(f"{__name__}.") and "methods" in vars(c)]
    ours.sort(key=lambda c: (c is not agent_grpo.AgentGRPOTrainer, c.__module__, c.__name__))
    methods: dict[str, Method] = {}
    for cls in ours:
        for info in vars(cls)["methods"]:
            if info.name in methods:
                raise ValueError(
                    f"method {info.name!r} is declared by both {methods[info.name].trainer_class.__name__} and "
                    f"{cls.__name__}"
                )
            methods[info.name] = Method(info, cls)
    return methods


METHODS: dict[str, Method] = discover_methods()
"""Every registered method by name, read from the trainer classes' `methods` declarations (`trainers/registry.py`)."""


def get_method(name: str) -> Method:
    """The method registered as `name`, or a ValueError listing the known methods."""
    return lookup(METHODS, name)


def method_classes() -> dict[str, type]:
    """Every registered method's Config and Trainer class by name (e.g. `"BPOTrainer"`)."""
    return {cls.__name__: cls for method in METHODS.values() for cls in (method.trainer_class, method.config_class)}


def __getattr__(name: str):
    """A registered method's Config or Trainer class by name, imported above or not: a new method needs no edit
    here (nor in `trl_agents`, which resolves the same names)."""
    classes = method_classes()
    if name in classes:
        return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "MethodInfo",
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
