"""Rollout topologies: which episodes a rollout runs, when to fork from a snapshot, how trajectories relate.

The engine (`rollout/engine.py`) drives a `Topology`: it asks for the first episodes, asks again after turns and
whenever nothing is left to play (of every task at once, or task by task as the topology's `schedule` allows:
`"free"`, `"task"` or `"global"`, `base.py`), and carries out the requests (`Launch`: new episodes from a task's initial
state; `Fork`: new episodes from the state before a recorded step, sharing that step's prefix; `Stop`: end an
active episode now; `Hold`: pause or resume one). Generation stays one call per turn across every active episode of
every task and branch; environments stay in the `EnvPool`.

| name          | what it runs                                                            | used by |
|---------------|-------------------------------------------------------------------------|---------|
| `independent` | G episodes per task from its initial state (the default)                | GRPO, every credit method |
| `adaptive`    | rounds of episodes per task until the group carries signal, up to a cap | CANOPY |
| `branching`   | G backbones, then K−1 forks at each backbone's highest-entropy steps    | BPO |
| `patr`        | a tree grown by a process scorer: expand the best, prune the degenerate, B leaves | PATR |
| `info_gain`   | a budgeted tree: nodes drawn by softmax of their gold-answer information gain | IGRPO |
| `token_branching` | n_init rollouts, then continuations from token prefixes at high z(H)·z(Ω) | APPO |
| `state_score` | per-state rollout counts ⌈G_max·S(s)⌉ with ranked depth-first backtracking | 3SPO (allocation) |

Trees: a forked trajectory records `parent_id` (the episode it forked from) and `fork_step` (its first own step);
its `steps[:fork_step]` are the parent's `Step` objects. Training rows train every step once (in the row of the
trajectory that owns it) with the sum of the advantages its trajectories give it, which is what training each
root-to-leaf path as its own sequence gives at importance ratio 1 (`training/rows.py`). Records store each step once,
with `branch_id` / `parent_id` links (`trl_agents.records`).

Every module of this package that defines a `Topology` subclass with a `name` is registered in `TOPOLOGIES`
(`get_topology(name)`): a new topology is one file here, nothing else to edit.

How the other shapes plug in, without changing the engine:

* **Token-level branching** (APPO): a topology returns `Fork(..., action_prefix=ids)`; the engine appends the prefix
  to the forked episode's prompt for that one turn and records prefix + continuation as its action (the prefix's
  sampling log-probs copied from the parent), through any generator, the vLLM client included.
* **K parallel environments per step** (DPEPO): one policy turn acting in K environments is an environment of its
  own — the `parallel` wrapper (`envs/parallel.py`) holds the K copies and parses the parallel output format — launched
  like any other; the topology only decides how many such episodes a task gets.
* **Two alternating policies** (IB-RL): the engine passes every prompt's acting role (`env.current_role()`) to a
  generator that declares `routes_by_role = True` (`generate(prompts, sampling, roles=...)`), which sends each
  role's prompts to its own adapter or model within the turn's one call; the topology launches the joint episodes.

Example:
    >>> from trl_agents.rollout.topologies import get_topology
    >>> get_topology("branching", branch_factor=3, score="random").branch_factor
    3
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ...names import did_you_mean
from .adaptive import AdaptiveTopology
from .base import SCHEDULES, Fork, Hold, Launch, Request, RolloutView, Stop, Topology
from .branching import BRANCH_SCORES, BranchingTopology, step_score
from .independent import IndependentTopology


def _discover() -> dict[str, type[Topology]]:
    """Every `Topology` subclass with a `name` defined in a module of this package (a new topology is one file)."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")
    found: dict[str, type[Topology]] = {}
    pending = list(Topology.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if cls.name and cls.__module__.startswith(f"{__name__}."):
            if cls.name in found and found[cls.name] is not cls:
                raise ValueError(f"topology {cls.name!r} is defined by {found[cls.name].__name__} and {cls.__name__}")
            found[cls.name] = cls
    order = ("independent", "adaptive", "branching")
    return dict(sorted(found.items(), key=lambda item: (item[0] not in order, order.index(item[0])
                                                        if item[0] in order else 0, item[0])))


TOPOLOGIES: dict[str, type[Topology]] = _discover()


def get_topology(name: str, **options: Any) -> Topology:
    """A new topology registered as `name`, built with `options`; a ValueError naming the known ones otherwise."""
    try:
        cls = TOPOLOGIES[name]
    except (KeyError, TypeError):
        hint = did_you_mean(name, list(TOPOLOGIES))
        raise ValueError(f"Unknown topology {name!r}.{hint} Known: {', '.join(sorted(TOPOLOGIES))}.") from None
    return cls(**options)


__all__ = [
    "BRANCH_SCORES",
    "SCHEDULES",
    "TOPOLOGIES",
    "AdaptiveTopology",
    "BranchingTopology",
    "Fork",
    "Hold",
    "IndependentTopology",
    "Launch",
    "Request",
    "RolloutView",
    "Stop",
    "Topology",
    "get_topology",
    "step_score",
]
