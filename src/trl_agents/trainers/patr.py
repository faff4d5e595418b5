"""PATR: process-scorer guided adaptive tree rollout (Li, Li, Zhang, …, Shang 2026, arXiv 2607.15610;
docs/methods/patr.md).

The changes w.r.t. `AgentGRPOTrainer`: the `patr` topology — n₀ = `patr_roots` episodes per task, then after every
turn a process scorer scores every active partial trajectory; the best-scored ones (q ≥ `patr_expand_threshold`, at
most `patr_expand_top_k` per task and turn) are expanded into `patr_branch_factor` children forked from the
environment snapshot of their state, the middle ones go on with one child, and degenerate paths (q below
`patr_prune_threshold` for `patr_prune_patience` turns, repeated actions, rejected actions) are ended and kept as
failed leaves, until every task has exactly B = `patr_budget` (default `num_generations`) leaves — and
`compute_advantages`: GRPO over each task's B leaves on the task reward, a pruned leaf counting as a failure with
return `patr_pruned_return` (math in `trl_agents/credit/patr.py`; the expansion and pruning rules in
`trl_agents/rollout/topologies/patr.py`; the process scorers in `trl_agents/judges.py`).

Scorers (`patr_scorer`): `"solver"` (offline progress from the environment's exact cost-to-go, `solver_value`;
environments with a solver: frozenlake, sokoban, rushhour, minesweeper, alfworld), `"callable"` (a function passed as
`PATRTrainer(scorer=...)`), `"endpoint"` (an OpenAI-compatible judge server, `trl_agents.judges.EndpointJudge`),
`"local"` (a transformers chat model as the judge, `LocalJudge`) or `"reward_model"` (a transformers sequence
classifier as a process reward model).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.patr import PATRConfig, PATRTrainer

    tasks = Dataset.from_list(get_env_class("frozenlake").task_split("train", 256))
    config = PATRConfig(output_dir="frozenlake-patr", env_name="frozenlake", max_turns=10, num_generations=8)
    PATRTrainer(model="Qwen/Qwen3-4B-Instruct-2507", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..names import check_choice
from ..judges import (
    PROGRESS_MODES,
    CallableScorer,
    EndpointJudge,
    JudgeScorer,
    LocalJudge,
    RewardModelScorer,
    SolverProgressScorer,
)
from ..rollout.topologies import Topology
from ..rollout.topologies.patr import EXPAND_FROM
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo

SCORERS = ("solver", "callable", "endpoint", "local", "reward_model")
JUDGE_APIS = ("chat", "completions")


@dataclass
class PATRConfig(AgentGRPOConfig):
    r"""
    Configuration of [`PATRTrainer`]: every [`AgentGRPOConfig`] field plus PATR's. `num_generations` is B, the leaves
    per task, unless `patr_budget` sets it.

    Args:
        patr_budget (`int` or `None`, defaults to `None`): B, leaves per task (None: `num_generations`).
        patr_roots (`int`, defaults to `1`): n₀, episodes started from the initial state.
        patr_branch_factor (`int`, defaults to `2`): b, children of an expanded node.
        patr_expand_threshold (`float`, defaults to `0.6`): τ_exp.
        patr_expand_top_k (`int`, defaults to `1`): nodes expanded per task and turn at most.
        patr_prune_threshold (`float`, defaults to `0.2`): τ_prune.
        patr_prune_patience (`int`, defaults to `2`): m.
        patr_repeat_limit (`int`, defaults to `3`): repeated identical actions that prune a path (0: off).
        patr_expand_from (`str`, defaults to `"next_state"`): where the children of an expanded node start.
        patr_pruned_return (`float`, defaults to `0.0`): the return of a pruned leaf.
        patr_scorer (`str`, defaults to `"solver"`): the process scorer.
        patr_progress (`str`, defaults to `"slack"`): the solver scorer's formula.
        topology (`str`, defaults to `"patr"`).
    """

    patr_budget: int | None = field(
        default=None,
        metadata={"help": "B, leaves per task: every task's tree ends with exactly B trajectories (root-to-leaf "
        "paths, pruned ones included). None = num_generations, GRPO's group size at the same leaf budget."},
    )
    patr_roots: int = field(
        default=1, metadata={"help": "n₀, episodes started from the task's initial state (the roots of the tree). "
        "The paper's value is not known to us: 1 is our choice (docs/methods/patr.md)."},
    )
    patr_branch_factor: int = field(
        default=2, metadata={"help": "b, children of an expanded node, its own continuation included (>= 2); our "
        "choice where the paper is silent (2, docs/methods/patr.md)."},
    )
    patr_expand_threshold: float = field(
        default=0.6, metadata={"help": "τ_exp: a node is expanded only with a score q >= τ_exp (q in [0, 1]); our "
        "choice (0.6, docs/methods/patr.md)."},
    )
    patr_expand_top_k: int = field(
        default=1, metadata={"help": "Nodes expanded per task and turn at most (the best-scored ones, ties: the "
        "lower episode id); our choice (1: the budget is spread over turns, docs/methods/patr.md)."},
    )
    patr_prune_threshold: float = field(
        default=0.2, metadata={"help": "τ_prune: a path scored below it for patr_prune_patience consecutive turns is "
        "pruned (ended, kept as a failed leaf); our choice (0.2, docs/methods/patr.md)."},
    )
    patr_prune_patience: int = field(
        default=2, metadata={"help": "m, consecutive low scores (or rejected actions) that prune a path; our choice "
        "(2, docs/methods/patr.md)."},
    )
    patr_repeat_limit: int = field(
        default=3, metadata={"help": "A path whose last patr_repeat_limit actions repeat the same text in the same "
        "observation is pruned (0: off); our choice (3, docs/methods/patr.md)."},
    )
    patr_expand_from: str = field(
        default="next_state", metadata={"help": "Where an expanded node's children start: 'next_state' (the state "
        "the scored partial trajectory ended in; they fork after the path's next turn, sharing the whole scored "
        "prefix) or 'last_action' (they re-sample the node's last action at once). Our choice: 'next_state' "
        "(docs/methods/patr.md)."},
    )
    patr_pruned_return: float = field(
        default=0.0, metadata={"help": "Return of a pruned leaf in the GRPO over the leaves (PATR keeps pruned paths "
        "as failures with reward 0)."},
    )
    patr_scorer: str = field(
        default="solver", metadata={"help": "The process scorer: 'solver' (progress from the environment's exact "
        "cost-to-go, offline; our choice of default, docs/methods/patr.md), 'callable' (PATRTrainer(scorer=fn)), "
        "'endpoint' (an OpenAI-compatible judge at patr_scorer_url), 'local' (a transformers chat model at "
        "patr_scorer_model as the judge) or 'reward_model' (a transformers sequence classifier at patr_scorer_model, "
        "a process reward model)."},
    )
    patr_progress: str = field(
        default="slack", metadata={"help": "The solver scorer's formula: 'slack' (share of the initial spare turns "
        "T − N(s_0) still left; 0 once the task cannot be solved in the remaining turns) or 'distance' "
        "(1 − N(s_t)/N(s_0)). Our choice: 'slack' (docs/methods/patr.md)."},
    )
    patr_scorer_url: str | None = field(
        default=None, metadata={"help": "Base URL of the endpoint judge (patr_scorer='endpoint'), e.g. "
        "http://localhost:8001 (`vllm serve`); probed with GET /v1/models before training."},
    )
    patr_scorer_model: str | None = field(
        default=None, metadata={"help": "The scorer's model: the served name for 'endpoint' (None: the first one "
        "the server lists), a path or Hub id for 'local' and 'reward_model'."},
    )
    patr_scorer_api: str = field(
        default="chat", metadata={"help": "Route of the endpoint judge: 'chat' (/v1/chat/completions) or "
        "'completions' (/v1/completions)."},
    )
    patr_scorer_timeout: float = field(
        default=60.0, metadata={"help": "Seconds one endpoint judgement may take; past it the node has no score "
        "(it survives: neither expanded nor counted towards pruning). Our choice (60 s)."},
    )
    patr_scorer_max_tokens: int = field(
        default=16, metadata={"help": "Token budget of one judgement ('endpoint', 'local'); the score is its first "
        "number on 0-3. Our choice (16)."},
    )
    patr_scorer_workers: int = field(
        default=16, metadata={"help": "Endpoint judgements sent at once. Our choice (16)."}
    )
    topology: str = field(
        default="patr", metadata={"help": "PATR grows a process-scored tree of episodes: 'patr'."}
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("patr_scorer", self.patr_scorer, SCORERS)
        check_choice("patr_progress", self.patr_progress, PROGRESS_MODES)
        check_choice("patr_expand_from", self.patr_expand_from, EXPAND_FROM)
        check_choice("patr_scorer_api", self.patr_scorer_api, JUDGE_APIS)
        for name, low in (("patr_roots", 1), ("patr_branch_factor", 2), ("patr_expand_top_k", 1),
                          ("patr_prune_patience", 1), ("patr_repeat_limit", 0), ("patr_scorer_max_tokens", 1),
                          ("patr_scorer_workers", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {getattr(self, name)}")
        budget = self.num_generations if self.patr_budget is None else self.patr_budget
        if budget < self.patr_roots:
            raise ValueError(f"patr_budget (B={budget}) must be >= patr_roots={self.patr_roots}: raise patr_budget "
                             "or num_generations, or lower patr_roots")
        for name in ("patr_expand_threshold", "patr_prune_threshold"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be in [0, 1] (scores are in [0, 1]), got {value}")
        if self.patr_prune_threshold > self.patr_expand_threshold:
            raise ValueError(f"patr_prune_threshold ({self.patr_prune_threshold}) must not exceed "
                             f"patr_expand_threshold ({self.patr_expand_threshold})")
        if not math.isfinite(self.patr_pruned_return):
            raise ValueError(f"patr_pruned_return must be finite, got {self.patr_pruned_return}")
        if not (math.isfinite(self.patr_scorer_timeout) and self.patr_scorer_timeout > 0):
            raise ValueError(f"patr_scorer_timeout must be a number > 0, got {self.patr_scorer_timeout}")
        if self.patr_scorer == "endpoint" and not self.patr_scorer_url:
            raise ValueError("patr_scorer='endpoint' needs patr_scorer_url (e.g. http://localhost:8001, a `vllm serve` "
                             "server); or use patr_scorer='solver'")
        if self.patr_scorer in ("local", "reward_model") and not self.patr_scorer_model:
            raise ValueError(f"patr_scorer={self.patr_scorer!r} needs patr_scorer_model (a model path or Hub id)")
        if self.topology != "patr":
            raise ValueError(f"PATR runs on the 'patr' topology, got topology={self.topology!r}")


def build_scorer(args: PATRConfig, scorer=None):
    """The process scorer `args` name: the solver's progress, the user's `scorer` ('callable'), an endpoint judge
    (probed now: `JudgeUnavailable`, one line, when the server does not answer), a local chat model as the judge or a
    local reward model (loaded now, on the CPU)."""
    kind = args.patr_scorer
    if kind == "callable":
        if scorer is None:
            raise ValueError("patr_scorer='callable' needs PATRTrainer(scorer=fn), fn(trajectories) -> scores in "
                             "[0, 1]")
        return scorer if isinstance(scorer, CallableScorer) else CallableScorer(scorer)
    if scorer is not None:
        raise ValueError(f"PATRTrainer(scorer=...) is used with patr_scorer='callable', got "
                         f"patr_scorer={kind!r}")
    if kind == "solver":
        return SolverProgressScorer(horizon=args.max_turns, mode=args.patr_progress)
    if kind == "endpoint":
        judge = EndpointJudge(args.patr_scorer_url, args.patr_scorer_model, api=args.patr_scorer_api,
                              timeout=args.patr_scorer_timeout, max_tokens=args.patr_scorer_max_tokens,
                              workers=args.patr_scorer_workers)
        judge.probe(timeout=min(5.0, args.patr_scorer_timeout))
        return JudgeScorer(judge)
    if kind == "local":
        return JudgeScorer(LocalJudge(args.patr_scorer_model, max_tokens=args.patr_scorer_max_tokens))
    return RewardModelScorer(args.patr_scorer_model)


class PATRTrainer(AgentGRPOTrainer):
    """PATR on `AgentGRPOTrainer` (see the module docstring): the `patr` topology and `compute_advantages`.

    Args:
        scorer: With `patr_scorer="callable"`: `scorer(trajectories) -> scores`, one q in [0, 1] (or None) per
            active partial trajectory, called once per turn. Every other argument is `AgentGRPOTrainer`'s.

    Logs `patr/num_leaves`, `patr/pruned_fraction`, `patr/zero_signal` (tasks whose leaves all returned the same),
    `patr/num_forks`, `patr/mean_fork_step`, `patr/success_rate` (means over tasks), the topology's
    `topology/leaves_per_task`, `topology/expansions_per_task`, `topology/pruned_per_task`,
    `topology/filled_per_task`, `topology/scored_nodes_per_task`, `topology/mean_score`,
    `topology/unscored_fraction`, and `patr/generated_tokens_per_task`,
    `patr/env_steps_per_task`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "patr"]
    _name = "PATR"
    config_class = PATRConfig
    supports_trees = True  # GRPO over the leaves: each leaf's value on its whole path, shared steps summed by rows
    methods = (
        MethodInfo("patr", "arXiv 2607.15610", "trl_agents.credit.patr", max_staleness=1, title="PATR",
                   hook="topology (patr) + compute_advantages",
                   inputs=("episode returns", "tree links (parent, fork step)",
                           "process scores of partial trajectories (solver cost-to-go, judge or reward model)"),
                   tests=("tests/methods/patr/",)),
    )

    def __init__(self, model, args: PATRConfig | None = None, *rest, scorer=None, **keywords):
        if scorer is not None and not callable(scorer):
            raise TypeError(f"scorer must be callable (trajectories -> scores), got {type(scorer).__name__}")
        # The scorer is set up (probed, loaded) before the model: a bad URL or path stops the run right here; without
        # a config (the trainer makes its own), in `build_topology`. Either way it is built once.
        self._patr_user_scorer = scorer
        self._patr_scorer = build_scorer(args, scorer) if isinstance(args, PATRConfig) else None
        super().__init__(model, args, *rest, **keywords)
        holder = self._patr_scorer.judge if isinstance(self._patr_scorer, JudgeScorer) else self._patr_scorer
        if isinstance(holder, LocalJudge | RewardModelScorer):  # loaded on the CPU: score next to the policy
            holder.model = holder.model.to(self.accelerator.device)

    @classmethod
    def signal_names(cls, args: Any) -> tuple[str, ...]:
        return ("solver_value",) if args.patr_scorer == "solver" else ()

    @classmethod
    def topology_options(cls, args: Any) -> dict[str, Any]:
        """The `patr` topology's options from the config; its scorer is the trainer's (`build_topology`)."""
        return {"scorer": None, "budget": args.patr_budget, "roots": args.patr_roots,
                "branch_factor": args.patr_branch_factor, "tau_expand": args.patr_expand_threshold,
                "tau_prune": args.patr_prune_threshold, "prune_patience": args.patr_prune_patience,
                "expand_top_k": args.patr_expand_top_k, "repeat_limit": args.patr_repeat_limit,
                "expand_from": args.patr_expand_from}

    def build_topology(self) -> Topology:
        """The `patr` topology with the trainer's scorer (built here when the trainer made its own config), the one
        scorer the trainer builds."""
        if self._patr_scorer is None:
            self._patr_scorer = build_scorer(self.args, self._patr_user_scorer)
        topology = self.make_topology(self.args)
        topology.scorer = self._patr_scorer
        return topology

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        advantages = self.estimate("patr", groups)
        self.log_rollout_cost_per_task("patr", groups)
        return advantages
