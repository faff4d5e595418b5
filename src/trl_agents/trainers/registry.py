"""The method registry, read from the trainer classes themselves.

A trainer class declares the methods it trains in a `methods` class attribute (a tuple of `MethodInfo`: name,
paper, the module holding its math, the hook it changes, what its credit or loss reads, the config values that
define it, its test files). Everything else a method needs is read from the class: its config class
(`config_class`), the signals it declares (`signals`), the environment capabilities it needs (its own, its signals'
and its topology's), its topology (the config's `topology` default). `discover_methods()` (in `trainers/__init__.py`)
imports every module of `trl_agents.trainers` and collects the declarations, so a new method is its math file (credit/ or distill/), its
trainer file, its config(s), its test file and its docs page (`docs/methods/<name>.md`) — nothing else to edit;
`tests/project/test_method_registry.py` checks that every registered method has all five.

Example:
    >>> from trl_agents.trainers import METHODS
    >>> METHODS["gigpo"].trainer_class.__name__, METHODS["gigpo"].paper
    ('GiGPOTrainer', 'arXiv 2505.10978')
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from ..names import did_you_mean
from ..training.signal_phase import declared_signals, required_capabilities
from .agent_grpo_config import AgentGRPOConfig


@dataclass(frozen=True)
class MethodInfo:
    """What a trainer class declares about a method it trains.

    Args:
        name: Registry name (`method:` in a config YAML, `trl-agents methods`).
        paper: Where the method comes from (an arXiv id).
        math: The module holding the method's math (`trl_agents.credit.<m>` or `trl_agents.distill.<m>`).
        title: Display name (e.g. "Gated-BEPO"); defaults to the name.
        hook: What the trainer changes: `compute_advantages`, `compute_auxiliary_loss`, `topology`, or several
            joined by " + ".
        inputs: What its credit or loss reads beyond rewards (e.g. "state keys", "teacher log-probs").
        defaults: Config values that define the method on top of its config class (e.g. Dr. GRPO's loss type).
        tests: Test files of the method, relative to the repository root.
        max_staleness: The most weight updates a trained rollout may lag (`AgentGRPOConfig.max_staleness`): 1 once
            the method is known to train on one-step-off rollouts (docs/async.md#one-step-off), 0 when it needs
            on-policy data. Every method declares it (None is an undeclared method, refused).
        staleness_reason: Why a method with `max_staleness=0` needs on-policy data (the one-line refusal).
    """

    name: str
    paper: str
    math: str
    title: str = ""
    hook: str = "compute_advantages"
    inputs: tuple[str, ...] = ("episode returns",)
    defaults: dict[str, Any] = field(default_factory=dict)
    tests: tuple[str, ...] = ()
    max_staleness: int | None = None
    staleness_reason: str = ""


@dataclass(frozen=True)
class Method:
    """A registered method: its declaration (`info`) and the trainer class that declared it."""

    info: MethodInfo
    trainer_class: type

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def title(self) -> str:
        return self.info.title or self.info.name

    @property
    def paper(self) -> str:
        return self.info.paper

    @property
    def hook(self) -> str:
        return self.info.hook

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.info.inputs

    @property
    def defaults(self) -> dict[str, Any]:
        return dict(self.info.defaults)

    @property
    def config_class(self) -> type:
        return self.trainer_class.config_class

    @property
    def signals(self) -> tuple[str, ...]:
        """The signals the trainer declares (with the environment signals they need)."""
        return declared_signals(self.trainer_class, self.config_defaults())

    @property
    def topology(self) -> str:
        return str(self.config_defaults().get("topology", "independent"))

    @property
    def env_capabilities(self) -> tuple[str, ...]:
        """Environment capabilities checked at start-up: the trainer's own, its signals' and its topology's."""
        return required_capabilities(self.trainer_class, self.config_defaults())

    @property
    def docs(self) -> str:
        return f"docs/methods/{self.name}.md"

    def card_info(self) -> dict[str, Any]:
        """What a model card shows about the method, as plain JSON (a run records it in `run_info.json` as
        `method_card`, so rendering a card needs no trainer): title, paper, the trainer's tags, TRL's citation of the
        paper where the trainer class carries one (`_paper`), and the method's own config fields (those the common
        `AgentGRPOConfig` does not have)."""
        common = {f.name for f in fields(AgentGRPOConfig)}
        metadata = self.trainer_class.card_metadata()
        paper = metadata["paper"]
        return {
            "title": self.title,
            "paper": self.paper,
            "tags": metadata["tags"],
            "citation": {"id": paper.get("id"), "citation": paper.get("citation")} if paper.get("citation") else None,
            "settings": [f.name for f in fields(self.config_class) if f.name not in common],
        }

    def config_defaults(self) -> dict[str, Any]:
        """The config class's field defaults with the method's own `defaults` on top."""
        values = {f.name: f.default for f in fields(self.config_class) if f.default is not MISSING}
        values.update(self.info.defaults)
        return values


def declared_method(trainer) -> Method | None:
    """The registered method `trainer` runs: among those its own class declares (not a parent's: a user subclass
    runs no registered method), the one whose `defaults` the config matches, the most specific (so Dr. GRPO wins
    over GRPO); None when there is none."""
    info = matching_info(type(trainer), trainer.args)
    return None if info is None else Method(info, type(trainer))


def matching_info(cls: type, args: Any, inherited: bool = False) -> MethodInfo | None:
    """The `MethodInfo` of `cls` whose `defaults` `args` matches, the most specific; with `inherited`, the nearest
    class in the MRO that declares methods answers (a user subclass of a method's trainer is that method)."""
    owners = [klass for klass in cls.__mro__ if "methods" in vars(klass)] if inherited else [cls]
    for owner in owners:
        matching = [info for info in vars(owner).get("methods", ())
                    if all(getattr(args, name, None) == value for name, value in info.defaults.items())]
        if matching:
            return max(matching, key=lambda info: len(info.defaults))
    return None


def lookup(methods: dict[str, Method], name: str) -> Method:
    """The method registered as `name`, or a ValueError listing the known methods."""
    try:
        return methods[name]
    except (KeyError, TypeError):
        hint = did_you_mean(name, list(methods))
        raise ValueError(f"Unknown method {name!r}.{hint} Known methods: {', '.join(sorted(methods))}.") from None
