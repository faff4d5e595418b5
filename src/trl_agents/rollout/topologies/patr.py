"""`patr`: a process-scorer guided tree of exactly B leaves per task (PATR, arXiv 2607.15610; docs/methods/patr.md).

Each task starts with `roots` (n₀) episodes from its initial state. After every turn the topology scores every
active partial trajectory h with the process scorer (one batched call for the tasks being decided: all of them in
lockstep; `q(h) ∈ [0, 1]`, written to the last step as `step.signals["patr_score"]`) and, per task:

* **Pruning** (conservative): a degenerate path — q < `tau_prune` for `prune_patience` consecutive scored turns, its
  last `repeat_limit` actions the same text in the same observation, or its last `prune_patience` actions rejected
  by the environment — is ended (`Stop`) and stays in the group as a failed leaf (its last step carries
  `step.signals["patr_pruned"]` = the reason; the credit gives it the pruned return, 0).
* **Expansion**: the `expand_top_k` best-scored remaining nodes with q ≥ `tau_expand` (ties: the lower episode id)
  get `branch_factor − 1` new children, so b children with the path's own continuation: forks from the environment
  snapshot of the node's state, sharing its steps. With `expand_from="next_state"` (default) the node's state is
  s_{t+1}, the state the scored partial trajectory h = steps[:t+1] ended in; its snapshot is recorded when the path
  plays its next turn, so the children are forked right after that turn (fork step t+1: they share h exactly and
  sample their own action where the path sampled its next one). With `"last_action"` the children re-sample the
  node's last action from s_t at once (fork step t).
* **Survival**: every other active path goes on with one child (itself).

A task never gets more than B = `budget` (default: `num_generations`) trajectories: an expansion gets fewer children
when the budget is nearly spent. When every episode of a task has ended with fewer than B leaves, the rest are filled
in (`when_idle`): forks from the best-scored recorded nodes (one each, best first, round robin; nodes with q below
`tau_prune` are not used), or new roots when there is no such node. Infrastructure-failed episodes count towards B
(they cost compute) and are not trained on.

Its schedule is "task": expansion, pruning and the next-state forks are decided turn by turn over a task's active
paths, so a task needs a turn barrier of its own (`after_turn(view, i)` once all of task i's paths have played the
turn), but nothing is shared between tasks (pending forks, streaks, budgets and scorer calls are per task), so tasks
need not wait for each other.

The rules are pure functions of this module ([D] thresholds: `update_streak`, `degenerate_reason`,
`choose_expansions`, `spread`); the process scorers (solver progress, judge, reward model, a callable) are those of
`trl_agents/judges.py`; the credit, GRPO over the B leaves, is `trl_agents/credit/patr.py`.

Example:
    >>> from trl_agents.rollout.topologies import get_topology
    >>> topology = get_topology("patr", scorer=lambda trajectories: [0.5] * len(trajectories), branch_factor=2)
    >>> topology.begin([{"env": "frozenlake", "seed": 0}], num_generations=4)
    [Launch(task_index=0, count=1)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...judges import CallableScorer
from ...trajectory import Trajectory
from .base import Fork, Launch, Request, RolloutView, Stop, Topology

SCORE = "patr_score"  # step.signals[SCORE]: q of the partial trajectory that ends with this step
PRUNED = "patr_pruned"  # step.signals[PRUNED] on a pruned path's last step: why it was pruned (credit reads it)
PRUNE_REASONS = ("low_score", "repeated_action", "invalid_actions")
EXPAND_FROM = ("next_state", "last_action")
STAT_NAMES = ("leaves_per_task", "expansions_per_task", "pruned_per_task", "filled_per_task",
              "scored_nodes_per_task", "mean_score", "unscored_fraction")


# ---- expansion and pruning rules (pure) ------------------------------------------------------------------------------


def update_streak(streak: int, q: float | None, tau_prune: float) -> int:
    """Consecutive scored turns with q < τ_prune: +1 on a low score, 0 on any other score, unchanged on None.

    >>> [update_streak(1, q, 0.2) for q in (0.1, 0.2, None)]
    [2, 0, 1]
    """
    if q is None:
        return streak
    return streak + 1 if q < tau_prune else 0


def degenerate_reason(trajectory: Trajectory, low_streak: int, patience: int, repeat_limit: int) -> str | None:
    """Why a path is degenerate (pruned), or None: "low_score" (q < τ_prune for `patience` consecutive turns),
    "repeated_action" (its last `repeat_limit` actions the same text in the same observation; 0 turns the rule off)
    or "invalid_actions" (its last `patience` actions rejected by the environment).

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> loop = Trajectory(task={}, steps=[Step("o", "up")] * 3)
    >>> degenerate_reason(loop, 0, 2, 3), degenerate_reason(loop, 2, 2, 3), degenerate_reason(loop, 0, 2, 0)
    ('repeated_action', 'low_score', None)
    >>> degenerate_reason(Trajectory(task={}, steps=[Step("o", "x", valid=False), Step("p", "y", valid=False)]), 0, 2, 3)
    'invalid_actions'
    """
    if low_streak >= patience:
        return "low_score"
    steps = trajectory.steps
    if repeat_limit >= 2 and len(steps) >= repeat_limit:
        last = steps[-repeat_limit:]
        if all(" ".join(s.action_text.split()) == " ".join(last[0].action_text.split())
               and s.observation == last[0].observation for s in last):
            return "repeated_action"
    if len(steps) >= patience and all(not s.valid for s in steps[-patience:]):
        return "invalid_actions"
    return None


def choose_expansions(nodes: Sequence[tuple[float | None, int]], tau_expand: float, top_k: int) -> list[int]:
    """The nodes to expand: those with q ≥ τ_exp, best first (ties: the lower id), at most `top_k`.

    Args:
        nodes: (q, node id) of the candidates (q None: not scored, never expanded).

    >>> choose_expansions([(0.7, 0), (0.9, 1), (0.3, 2), (None, 3), (0.9, 4)], 0.6, 2)
    [1, 4]
    """
    ranked = sorted((-q, node) for q, node in nodes if q is not None and q >= tau_expand)
    return [node for _, node in ranked[:top_k]]


def spread(count: int, slots: int) -> list[int]:
    """`count` new leaves over `slots` nodes, round robin, best node first.

    >>> spread(5, 2), spread(1, 3), spread(0, 2)
    ([3, 2], [1, 0, 0], [0, 0])
    """
    return [count // slots + (i < count % slots) for i in range(slots)] if slots else []


# ---- the topology ----------------------------------------------------------------------------------------------------


class PATRTopology(Topology):
    """Process-scorer guided expansion, survival and conservative pruning, with exactly `budget` leaves per task.

    Args:
        scorer: `scorer(trajectories) -> scores`, one q ∈ [0, 1] (or None: no score) per partial trajectory; a
            process scorer of `trl_agents.judges` or any callable (wrapped in `CallableScorer`). None: set
            `topology.scorer` before the first rollout (the PATR trainer does).
        budget: B, leaves per task; None = `num_generations`.
        roots: n₀, episodes started from the task's initial state.
        branch_factor: b ≥ 2, children of an expanded node (its own continuation included).
        tau_expand: τ_exp, the lowest score a node is expanded at.
        tau_prune: τ_prune; a path is pruned after `prune_patience` consecutive scores below it.
        prune_patience: m ≥ 1.
        expand_top_k: Nodes expanded per task per turn at most (the best-scored ones).
        repeat_limit: A path whose last `repeat_limit` actions repeat the same text in the same observation is
            pruned; 0 turns the rule off.
        expand_from: "next_state" or "last_action" (module docstring).
    """

    name = "patr"
    schedule = "task"
    needs_snapshots = True
    required_capabilities = ("snapshot",)

    def __init__(
        self,
        scorer: Any = None,
        budget: int | None = None,
        roots: int = 1,
        branch_factor: int = 2,
        tau_expand: float = 0.6,
        tau_prune: float = 0.2,
        prune_patience: int = 2,
        expand_top_k: int = 1,
        repeat_limit: int = 3,
        expand_from: str = "next_state",
    ):
        for field, value, low in (("roots", roots, 1), ("branch_factor", branch_factor, 2),
                                  ("prune_patience", prune_patience, 1), ("expand_top_k", expand_top_k, 1),
                                  ("repeat_limit", repeat_limit, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{field} must be an integer >= {low}, got {value!r}")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < roots):
            raise ValueError(f"budget must be None (= num_generations) or an integer >= roots={roots}, got {budget!r}")
        for field, value in (("tau_expand", tau_expand), ("tau_prune", tau_prune)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{field} must be a number in [0, 1], got {value!r}")
        if tau_prune > tau_expand:
            raise ValueError(f"tau_prune ({tau_prune}) must not exceed tau_expand ({tau_expand})")
        if expand_from not in EXPAND_FROM:
            raise ValueError(f"expand_from must be one of {', '.join(map(repr, EXPAND_FROM))}, got {expand_from!r}")
        if scorer is not None and not callable(scorer):
            raise TypeError(f"scorer must be callable (trajectories -> scores), got {type(scorer).__name__}")
        self.scorer = scorer if scorer is None or hasattr(scorer, "kind") else CallableScorer(scorer)
        self.budget, self.roots, self.branch_factor = budget, roots, branch_factor
        self.tau_expand, self.tau_prune, self.prune_patience = float(tau_expand), float(tau_prune), prune_patience
        self.expand_top_k, self.repeat_limit, self.expand_from = expand_top_k, repeat_limit, expand_from
        self._reset(0, 0)

    def _reset(self, num_tasks: int, budget: int) -> None:
        self._budget = budget
        # Per task: (episode id, fork step, children) to fork once the parent has recorded that step's snapshot.
        self._pending: list[list[tuple[int, int, int]]] = [[] for _ in range(num_tasks)]
        self._streaks: dict[int, int] = {}  # id(trajectory) -> consecutive low scores
        self.expanded: list[list[tuple[int, int]]] = [[] for _ in range(num_tasks)]  # (episode id, fork step)
        self.pruned: list[list[tuple[int, str]]] = [[] for _ in range(num_tasks)]  # (episode id, reason)
        self.filled = [0] * num_tasks
        self.scored = [0] * num_tasks
        # Per task: the sum of its nodes' scores and its unscored nodes (stats are means over tasks, which the
        # trainer averages over processes: a mean over all nodes would weigh processes by their node counts).
        self._score_sums, self._unscored = [0.0] * num_tasks, [0] * num_tasks
        self.scorer_calls = 0

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        budget = self.budget if self.budget is not None else num_generations
        if budget < self.roots:
            raise ValueError(f"PATR's leaf budget B={budget} is below roots={self.roots}: raise the budget "
                             "(num_generations) or lower the roots")
        if self.scorer is None:
            raise ValueError("the patr topology has no scorer: pass scorer= (trajectories -> scores in [0, 1])")
        self._reset(len(tasks), budget)
        return [Launch(index, self.roots) for index in range(len(tasks))]

    # ---- after every turn: score, prune, expand ----------------------------------------------------------------------

    def after_turn(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """Score, prune and expand the active paths of the task(s) (all for None, in one scorer call, else
        `task_index` alone), after the pending next-state forks of those tasks."""
        indices = view.task_indices(task_index)
        requests: list[Request] = self._pending_forks(view, indices)
        nodes = [(index, t) for index in indices for t in view.active(index)
                 if len(t.steps) > t.fork_step and SCORE not in t.steps[-1].signals]
        if nodes:
            scores = list(self.scorer([t for _, t in nodes]))
            if len(scores) != len(nodes):
                raise ValueError(f"the PATR scorer returned {len(scores)} scores for {len(nodes)} trajectories")
            self.scorer_calls += 1
        else:
            scores = []
        candidates: dict[int, list[tuple[float | None, int]]] = {}
        for (index, trajectory), q in zip(nodes, scores, strict=True):
            trajectory.steps[-1].signals[SCORE] = q
            self.scored[index] += 1
            if q is None:
                self._unscored[index] += 1
            else:
                self._score_sums[index] += q
            streak = self._streaks[id(trajectory)] = update_streak(self._streaks.get(id(trajectory), 0), q,
                                                                   self.tau_prune)
            reason = degenerate_reason(trajectory, streak, self.prune_patience, self.repeat_limit)
            if reason is not None:
                trajectory.steps[-1].signals[PRUNED] = reason  # a failed leaf (credit.patr.leaf_return)
                self.pruned[index].append((trajectory.episode_id, reason))
                requests.append(Stop(index, trajectory.episode_id))
            else:
                candidates.setdefault(index, []).append((q, trajectory.episode_id))
        for index, nodes_of_task in sorted(candidates.items()):
            group = view.groups[index]
            for episode_id in choose_expansions(nodes_of_task, self.tau_expand, self.expand_top_k):
                children = min(self.branch_factor - 1, self._room(view, index, requests))
                if children <= 0:
                    break
                steps = len(group.trajectory(episode_id).steps)
                if self.expand_from == "last_action":
                    requests.append(Fork(index, episode_id, steps - 1, children))
                    self.expanded[index].append((episode_id, steps - 1))
                else:  # the node's state: snapshotted when the path plays its next turn
                    self._pending[index].append((episode_id, steps, children))
        return requests

    def _pending_forks(self, view: RolloutView, indices: Sequence[int]) -> list[Request]:
        """The expansions of the task(s)' previous turn whose node state is now recorded (the parent's step
        `fork step`)."""
        requests = []
        for index in indices:
            for episode_id, step, children in self._pending[index]:
                parent = view.groups[index].trajectory(episode_id)
                if not parent.failed and len(parent.steps) > step and parent.steps[step].snapshot is not None:
                    requests.append(Fork(index, episode_id, step, children))
                    self.expanded[index].append((episode_id, step))
            # The others (a parent that failed or ended without a step) give their budget back.
            self._pending[index] = []
        return requests

    def _room(self, view: RolloutView, index: int, requests: Sequence[Request]) -> int:
        """Leaves task `index` may still get: B − its trajectories − the children already promised to it (pending
        expansions and the `requests` about to be served)."""
        promised = sum(children for _, _, children in self._pending[index])
        asked = sum(r.count for r in requests if isinstance(r, Launch | Fork) and r.task_index == index)
        return self._budget - len(view.groups[index].trajectories) - promised - asked

    # ---- nothing active: fill up to B leaves -------------------------------------------------------------------------

    def when_idle(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """Once the task(s) (all for None, else `task_index`) have nothing active: their pending forks, then fill
        each up to B leaves."""
        indices = view.task_indices(task_index)
        requests: list[Request] = self._pending_forks(view, indices)
        for index in indices:
            group = view.groups[index]
            room = self._room(view, index, requests)
            if room <= 0:
                continue
            self.filled[index] += room
            nodes = self.fill_nodes(group.trajectories)
            if not nodes:
                requests.append(Launch(index, room))
                continue
            for (episode_id, step), count in zip(nodes, spread(room, min(room, len(nodes))), strict=False):
                requests.append(Fork(index, episode_id, step, count))
        return requests

    def fill_nodes(self, trajectories: Sequence[Trajectory]) -> list[tuple[int, int]]:
        """(episode id, fork step) of the recorded nodes to fork from, best score first (ties: the earlier step,
        then the lower id): a scored step with q ≥ τ_prune whose resulting state has a snapshot (the next step's,
        with "next_state"; with "last_action" the scored step's own)."""
        ranked = []
        for trajectory in trajectories:
            if trajectory.failed:
                continue
            for t in range(trajectory.fork_step, len(trajectory.steps)):
                q = trajectory.steps[t].signals.get(SCORE)
                if q is None or q < self.tau_prune:
                    continue
                fork = t if self.expand_from == "last_action" else t + 1
                if fork < len(trajectory.steps) and trajectory.steps[fork].snapshot is not None:
                    ranked.append((-q, t, trajectory.episode_id, fork))
        return [(episode_id, fork) for _, _, episode_id, fork in sorted(ranked)]

    def stats(self, view: RolloutView) -> dict[str, float]:
        tasks = max(len(view.groups), 1)
        scored = sum(self.scored)
        rated = [(total, count - unscored) for total, count, unscored in zip(self._score_sums, self.scored,
                                                                             self._unscored, strict=True)]
        return {
            "leaves_per_task": sum(len(g.trajectories) for g in view.groups) / tasks,
            "expansions_per_task": sum(len(e) for e in self.expanded) / tasks,
            "pruned_per_task": sum(len(p) for p in self.pruned) / tasks,
            "filled_per_task": sum(self.filled) / tasks,
            "scored_nodes_per_task": scored / tasks,
            # means over tasks of the task's mean score / unscored fraction (0 for a task with no scored node)
            "mean_score": sum(total / count for total, count in rated if count) / tasks,
            "unscored_fraction": sum(u / c for u, c in zip(self._unscored, self.scored, strict=True) if c) / tasks,
        }
