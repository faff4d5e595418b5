"""LLMZero's strategy controller (Fang et al. 2026, arXiv 2606.18388; docs/methods/llmzero.md): its settings and its
pure logic.

LLMZero searches over *training strategies*: a tree whose nodes are training stages (a checkpoint, the config it was
trained with, its metrics and its held-out score). At a checkpoint it diagnoses the stage's metrics into named
pathologies, proposes K coordinated multi-parameter transitions, trains each child for S steps from the parent's
checkpoint and picks where to go next by UCB or best-first under a budget of stages. The paper's finding, built in
here as a constraint: *capacity* parameters (max_completion_length, num_generations, learning_rate) never decrease
along a path, *regularisation* parameters (beta, epsilon, epsilon_high, temperature, entropy_coef) move either way.

This module holds the controller's settings (`SearchArguments`) and what can be computed without a model (the outer
loop that trains and evaluates is `trl_agents/search.py`; the `llmzero` trainer, `trainers/llmzero.py`, trains one
stage and needs nothing from that loop):

1. `summarise(history)`: a stage's `trainer.state.log_history` reduced to a few numbers (reward trend, entropy and its
   drop, KL, clip fraction, truncation / length at the token cap, fraction of zero-std groups);
2. `diagnose(summary, ...)`: those numbers (and the held-out score before and after the stage) as named pathologies,
   each with its evidence (`PATHOLOGIES`, thresholds in `THRESHOLDS`);
3. `RuleProposer`: the default proposer, one coordinated transition per pathology (`FIXES`), then neutral moves;
4. `constrain(parent, changes, ...)`: any proposer's answer made legal: only searched parameters, numbers within
   `BOUNDS`, integers where the config wants them, and capacity parameters never below the parent's value;
5. `ucb` and `SearchTree.select`: UCB1 over the tree, score + c·sqrt(ln N_parent / N_child), an unvisited child
   first (its bonus is infinite), or best-first (the best trained node that can still grow).

Numerical guards: an empty or metric-less history summarises to Nones and diagnoses to no pathology; slopes of
fewer than two points are 0; a ratio with a zero or missing denominator is None; `ucb` of an unvisited child is
+inf and ln N_parent is taken of max(N_parent, 1); scores that are NaN or missing count as -inf in selection; a
proposer's non-numeric or non-finite value is dropped (with a note), never trained.

Example (UCB picks the unvisited child first, then the best bound; c = 1, parent visited 3 times):
    >>> round(ucb(0.5, parent_visits=3, visits=1, c=1.0), 4)  # 0.5 + sqrt(ln 3 / 1) = 0.5 + 1.0481
    1.5481
    >>> ucb(0.0, parent_visits=3, visits=0, c=1.0)
    inf
    >>> constrain({"num_generations": 8, "beta": 0.04}, {"num_generations": 4, "beta": 0.02, "seed": 1},
    ...           capacity=("num_generations",), regularisation=("beta",))[0]
    {'num_generations': 8, 'beta': 0.02}
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .names import check_choice

CAPACITY_PARAMS = ("max_completion_length", "num_generations", "learning_rate")
"""Capacity parameters: never decrease along a path of the search tree (the paper's finding, enforced)."""
REGULARISATION_PARAMS = ("beta", "epsilon", "epsilon_high", "temperature", "entropy_coef")
"""Regularisation parameters: move either way (the paper finds they oscillate with the training dynamics)."""
INTEGER_PARAMS = frozenset({"max_completion_length", "num_generations", "max_turns", "per_device_train_batch_size",
                            "gradient_accumulation_steps", "max_prompt_length"})
BOUNDS: dict[str, tuple[float, float]] = {
    "beta": (0.0, 1.0),
    "epsilon": (0.01, 0.9),
    "epsilon_high": (0.01, 0.9),
    "temperature": (0.1, 2.0),
    "entropy_coef": (0.0, 0.1),
    "learning_rate": (0.0, 1.0),
    "num_generations": (2, 1024),
    "max_completion_length": (1, 1 << 20),
}
"""Where a proposed value is clipped to (our choice: ranges in which GRPO stays well defined)."""

PATHOLOGIES = ("entropy_collapse", "truncation", "instability", "over_regularisation", "zero_advantage", "stagnation")
"""The named pathologies, in the order the rule proposer treats them (most urgent first)."""

THRESHOLDS: dict[str, float] = {
    "entropy_drop": 0.5,       # entropy_collapse: last entropy < 0.5 × first entropy of the stage ...
    "entropy_floor": 0.05,     # ... or below 0.05 nats per token
    "truncation": 0.2,         # truncation: > 20 % of turns cut at the token cap ...
    "length_at_cap": 0.95,     # ... or the mean turn length ≥ 95 % of max_completion_length
    "kl_high": 0.5,            # instability: mean KL to the reference > 0.5 ...
    "score_drop": 0.05,        # ... or the held-out score fell by more than 0.05 over the stage
    "clip_high": 0.2,          # over_regularisation: > 20 % of tokens clipped (the trust region binds) ...
    "kl_low": 1e-3,            # ... or beta > 0 and KL < 1e-3 while the stage stagnates
    "zero_std": 0.5,           # zero_advantage: > 50 % of groups with equal rewards (no gradient)
    "stagnation": 0.01,        # stagnation: held-out gain ≤ 0.01 and training-reward slope ≤ 0.01 per step
}
"""Diagnosis thresholds (our choice: the paper's diagnosis is done by an LLM reading the same metrics)."""

FIXES: dict[str, dict[str, tuple]] = {
    "entropy_collapse": {"temperature": ("mul", 1.2), "epsilon_high": ("mul", 1.25), "entropy_coef": ("add", 1e-3)},
    "truncation": {"max_completion_length": ("mul", 2)},
    "instability": {"beta": ("raise", 2.0, 0.01), "epsilon": ("mul", 0.8), "epsilon_high": ("mul", 0.8),
                    "temperature": ("mul", 0.9)},
    "over_regularisation": {"beta": ("mul", 0.5), "epsilon": ("mul", 1.25), "epsilon_high": ("mul", 1.25)},
    "zero_advantage": {"num_generations": ("mul", 2), "temperature": ("mul", 1.1)},
    "stagnation": {"learning_rate": ("mul", 2), "num_generations": ("mul", 2)},
}
"""The rule proposer's coordinated transition per pathology: parameter -> ("mul", f) | ("add", d) |
("raise", f, floor) (= max(value·f, floor), e.g. switching a zero KL penalty on)."""

NEUTRAL_MOVES: tuple[tuple[str, dict[str, tuple]], ...] = (
    ("continue: the same strategy for one more stage", {}),
    ("explore: more capacity, hotter sampling", {"learning_rate": ("mul", 1.5), "temperature": ("mul", 1.1)}),
    ("exploit: tighter trust region, cooler sampling", {"epsilon": ("mul", 0.8), "epsilon_high": ("mul", 0.8),
                                                        "temperature": ("mul", 0.9)}),
)
"""What the rule proposer adds after the pathology fixes, to fill K children."""

# Where `summarise` finds each quantity in a log entry (TRL's names and trl-agents' own).
_KEYS = {
    "reward": ("reward",),
    "success": ("env/success_rate",),
    "entropy": ("entropy",),
    "kl": ("kl",),
    "clip_ratio": ("clip_ratio/region_mean", "clip_ratio"),
    "truncation": ("completions/clipped_ratio",),
    "zero_std": ("frac_reward_zero_std", "credit/zero_advantage_group_fraction"),
}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _series(history: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[float]:
    values = []
    for entry in history:
        for key in keys:
            value = _finite(entry.get(key))
            if value is not None:
                values.append(value)
                break
    return values


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of `values` against 0, 1, 2, ... (0 for fewer than two points).

    >>> slope([0.0, 0.1, 0.2]), slope([1.0]), slope([])
    (0.1, 0.0, 0.0)
    """
    n = len(values)
    if n < 2:
        return 0.0
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    cov = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(values))  # Σ (x − x̄)(y − ȳ)
    var = sum((i - x_mean) ** 2 for i in range(n))  # Σ (x − x̄)², > 0 for n ≥ 2
    return round(cov / var, 12)


def summarise(history: Sequence[Mapping[str, Any]], max_completion_length: int | None = None) -> dict[str, Any]:
    """A stage's training log (`trainer.state.log_history`) reduced to the numbers `diagnose` reads.

    Entries without training metrics (the final `train_runtime` one) are skipped; a quantity no entry has is None.
    `length_ratio` is the mean turn length (generated tokens / env steps) over `max_completion_length`.

    >>> log = [{"reward": 0.0, "entropy": 2.0, "rollout/generated_tokens": 30, "rollout/env_steps": 10},
    ...        {"reward": 0.5, "entropy": 0.8, "rollout/generated_tokens": 40, "rollout/env_steps": 10},
    ...        {"train_runtime": 3.0}]
    >>> s = summarise(log, max_completion_length=4)
    >>> s["reward_slope"], s["entropy_first"], s["entropy_last"], s["length_ratio"], s["kl"]
    (0.5, 2.0, 0.8, 0.875, None)
    """
    rewards = _series(history, _KEYS["reward"])
    entropy = _series(history, _KEYS["entropy"])
    tokens = sum(_finite(e.get("rollout/generated_tokens")) or 0.0 for e in history)
    turns = sum(_finite(e.get("rollout/env_steps")) or 0.0 for e in history)
    turn_length = tokens / turns if turns > 0 else None
    success = _series(history, _KEYS["success"])
    return {
        "steps": len(rewards),
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "reward_slope": slope(rewards),
        "success_last": success[-1] if success else None,
        "entropy_first": entropy[0] if entropy else None,
        "entropy_last": entropy[-1] if entropy else None,
        "kl": _mean(_series(history, _KEYS["kl"])),
        "clip_ratio": _mean(_series(history, _KEYS["clip_ratio"])),
        "truncation": _mean(_series(history, _KEYS["truncation"])),
        "turn_length": turn_length,
        "length_ratio": (turn_length / max_completion_length
                         if turn_length is not None and max_completion_length else None),
        "zero_std": _mean(_series(history, _KEYS["zero_std"])),
    }


def diagnose(
    summary: Mapping[str, Any],
    *,
    score: float | None = None,
    score_before: float | None = None,
    params: Mapping[str, Any] | None = None,
    thresholds: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """The pathologies of a stage, most urgent first (`PATHOLOGIES` order), each `{"name", "evidence"}`.

    `score` / `score_before`: the held-out score after / before the stage; `params`: the stage's parameter values
    (`beta` decides whether a tiny KL means over-regularisation).

    >>> summary = {"entropy_first": 2.0, "entropy_last": 0.8, "zero_std": 0.75, "reward_slope": 0.0}
    >>> [p["name"] for p in diagnose(summary, score=0.2, score_before=0.2)]
    ['entropy_collapse', 'zero_advantage', 'stagnation']
    >>> diagnose({}, score=None)  # nothing measured: nothing diagnosed
    []
    """
    t = {**THRESHOLDS, **(thresholds or {})}
    params = params or {}
    found: dict[str, str] = {}
    gain = score - score_before if score is not None and score_before is not None else None

    first, last = summary.get("entropy_first"), summary.get("entropy_last")
    if last is not None and last < t["entropy_floor"]:
        found["entropy_collapse"] = f"entropy {last:.3g} < {t['entropy_floor']:g}"
    elif last is not None and first and first > 0 and last / first < t["entropy_drop"]:
        found["entropy_collapse"] = f"entropy fell {first:.3g} -> {last:.3g} (ratio {last / first:.2f} < " \
                                    f"{t['entropy_drop']:g})"

    truncation, ratio = summary.get("truncation"), summary.get("length_ratio")
    if truncation is not None and truncation > t["truncation"]:
        found["truncation"] = f"{truncation:.0%} of turns truncated (> {t['truncation']:.0%})"
    elif ratio is not None and ratio >= t["length_at_cap"]:
        found["truncation"] = f"mean turn length at {ratio:.0%} of max_completion_length"

    kl = summary.get("kl")
    if kl is not None and kl > t["kl_high"]:
        found["instability"] = f"KL {kl:.3g} > {t['kl_high']:g}"
    elif gain is not None and gain < -t["score_drop"]:
        found["instability"] = f"held-out score fell {score_before:.3g} -> {score:.3g}"

    stagnant = (gain is None or gain <= t["stagnation"]) and (summary.get("reward_slope") or 0.0) <= t["stagnation"]
    clip = summary.get("clip_ratio")
    beta = _finite(params.get("beta")) or 0.0
    if clip is not None and clip > t["clip_high"]:
        found["over_regularisation"] = f"{clip:.0%} of tokens clipped (> {t['clip_high']:.0%})"
    elif beta > 0 and kl is not None and kl < t["kl_low"] and stagnant and gain is not None:
        found["over_regularisation"] = f"KL {kl:.2g} < {t['kl_low']:g} with beta {beta:g} and no progress"

    zero = summary.get("zero_std")
    if zero is not None and zero > t["zero_std"]:
        found["zero_advantage"] = f"{zero:.0%} of groups have equal rewards (> {t['zero_std']:.0%})"

    if gain is not None and stagnant:
        found["stagnation"] = f"held-out gain {gain:+.3g} and reward slope {summary.get('reward_slope') or 0.0:+.3g}"
    return [{"name": name, "evidence": found[name]} for name in PATHOLOGIES if name in found]


def apply_moves(params: Mapping[str, Any], moves: Mapping[str, tuple]) -> dict[str, float]:
    """The new values of the parameters `moves` names that `params` holds (a move on a missing one is skipped).

    >>> apply_moves({"beta": 0.0, "temperature": 1.0}, {"beta": ("raise", 2.0, 0.01), "temperature": ("mul", 1.2),
    ...                                                 "entropy_coef": ("add", 1e-3)})
    {'beta': 0.01, 'temperature': 1.2}
    """
    out = {}
    for name, move in moves.items():
        value = _finite(params.get(name))
        if value is None:
            continue
        kind = move[0]
        if kind == "mul":
            out[name] = value * move[1]
        elif kind == "add":
            out[name] = value + move[1]
        elif kind == "raise":
            out[name] = max(value * move[1], move[2])
        else:
            raise ValueError(f"unknown move {kind!r} for {name} (use 'mul', 'add' or 'raise')")
    return out


def constrain(
    parent: Mapping[str, Any],
    changes: Mapping[str, Any],
    *,
    capacity: Sequence[str] = CAPACITY_PARAMS,
    regularisation: Sequence[str] = REGULARISATION_PARAMS,
) -> tuple[dict[str, Any], list[str]]:
    """The child's parameters: `parent` with the legal part of `changes`, and notes on what was dropped or moved.

    Legal: a searched parameter (in `capacity` or `regularisation`; anything else is ignored), a finite number,
    clipped to `BOUNDS`, rounded for `INTEGER_PARAMS`, and for a capacity parameter never below the parent's value
    (the monotone-capacity constraint).

    >>> params, notes = constrain({"learning_rate": 1e-4, "temperature": 1.0},
    ...                           {"learning_rate": 5e-5, "temperature": 9.0, "output_dir": "/x"},
    ...                           capacity=("learning_rate",), regularisation=("temperature",))
    >>> params
    {'learning_rate': 0.0001, 'temperature': 2.0}
    >>> for note in notes:
    ...     print(note)
    kept learning_rate at 0.0001: capacity never decreases
    temperature 9 clipped to 2
    ignored output_dir: not a searched parameter
    """
    searched = set(capacity) | set(regularisation)
    params = dict(parent)
    notes = []
    for name, value in changes.items():
        if name not in searched:
            notes.append(f"ignored {name}: not a searched parameter")
            continue
        number = _finite(value)
        if number is None:
            notes.append(f"ignored {name}={value!r}: not a finite number")
            continue
        low, high = BOUNDS.get(name, (-math.inf, math.inf))
        clipped = min(max(number, low), high)
        value = round(clipped) if name in INTEGER_PARAMS else clipped
        old = _finite(parent.get(name))
        if name in capacity and old is not None and value < old:  # (also when the bounds would lower it)
            notes.append(f"kept {name} at {parent[name]:g}: capacity never decreases")
            continue
        if clipped != number:
            notes.append(f"{name} {number:g} clipped to {clipped:g}")
        params[name] = value
    return params, notes


def capacity_is_monotone(path: Sequence[Mapping[str, Any]], capacity: Sequence[str] = CAPACITY_PARAMS) -> bool:
    """Whether no capacity parameter decreases along `path` (the parameters of each stage, root first).

    >>> capacity_is_monotone([{"num_generations": 4}, {"num_generations": 8}, {"num_generations": 8}])
    True
    >>> capacity_is_monotone([{"num_generations": 8}, {"num_generations": 4}])
    False
    """
    for before, after in itertools.pairwise(path):
        for name in capacity:
            if name in before and name in after and after[name] < before[name]:
                return False
    return True


class RuleProposer:
    """The default proposer: for a diagnosed node, one coordinated transition per pathology (`FIXES`, most urgent
    first; the first two merged into one more when there are two or more), then `NEUTRAL_MOVES`; moves on
    parameters that are not searched are left out (a fix with none left is skipped); duplicates (same resulting
    changes) are dropped.

    A proposer is any callable `proposer(context) -> [{"changes": {param: value}, "rationale": str}, ...]`;
    `context` holds `params`, `pathologies`, `k`, `capacity`, `regularisation` (and more for an LLM: the summary, the
    scores, the path from the root). Its answer goes through `constrain` before anything is trained.

    >>> context = {"params": {"num_generations": 4, "temperature": 1.0, "learning_rate": 1e-4, "beta": 0.0,
    ...                       "epsilon": 0.2}, "pathologies": [{"name": "zero_advantage", "evidence": "..."}], "k": 2,
    ...            "capacity": CAPACITY_PARAMS, "regularisation": REGULARISATION_PARAMS}
    >>> [p["changes"] for p in RuleProposer()(context)]
    [{'num_generations': 8.0, 'temperature': 1.1}, {}]
    """

    def __call__(self, context: Mapping[str, Any]) -> list[dict[str, Any]]:
        params = context["params"]
        searched = set(context.get("capacity", CAPACITY_PARAMS)) | set(context.get("regularisation",
                                                                                   REGULARISATION_PARAMS))
        names = [p["name"] for p in context.get("pathologies", []) if p["name"] in FIXES
                 and apply_moves(params, {k: v for k, v in FIXES[p["name"]].items() if k in searched})]
        candidates: list[tuple[str, dict[str, tuple]]] = [(f"fix {name}", FIXES[name]) for name in names]
        if len(names) >= 2:  # a coordinated transition treating the two most urgent at once
            candidates.insert(1, (f"fix {names[0]} + {names[1]}", {**FIXES[names[1]], **FIXES[names[0]]}))
        candidates += list(NEUTRAL_MOVES)
        proposals, seen = [], set()
        for rationale, moves in candidates:
            changes = apply_moves(params, {k: v for k, v in moves.items() if k in searched})
            if moves and not changes:
                continue  # none of its parameters is searched
            key = json.dumps(changes, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            proposals.append({"changes": changes, "rationale": rationale})
            if len(proposals) == context.get("k", 3):
                break
        return proposals


def ucb(value: float | None, parent_visits: int, visits: int, c: float) -> float:
    """UCB1: value + c·sqrt(ln N_parent / N_child); +inf for an unvisited child, -inf for a missing value.

    >>> round(ucb(0.4, 3, 1, 1.0), 4), round(ucb(0.5, 4, 1, 0.0), 4)  # 0.4 + sqrt(ln 3) ; c = 0: the value
    (1.4481, 0.5)
    """
    if visits <= 0:
        return math.inf
    value = _finite(value)
    if value is None:
        return -math.inf
    return value + c * math.sqrt(math.log(max(parent_visits, 1)) / visits)


class SearchTree:
    """The search tree: nodes are dicts (JSON as they are) with `id`, `parent`, `depth`, `status` ("proposed",
    "running", "done", "failed"), `params` (the searched parameters' values), `transition` (what the proposer said),
    `checkpoint`, `score` (held-out), `score_before`, `summary`, `pathologies` and `expanded` (children proposed).

    Visits N(node) = trained ("done") nodes in its subtree; its value is the max (or mean, `backup`) of their
    scores. `select` says what to do next: ("train", id) a proposed node, ("expand", id) propose children of a
    trained one, or None (nothing left).
    """

    STATUSES = ("proposed", "running", "done", "failed")

    def __init__(self, nodes: list[dict[str, Any]] | None = None, backup: str = "max"):
        if backup not in ("max", "mean"):
            raise ValueError(f"backup must be 'max' or 'mean', got {backup!r}")
        self.nodes: list[dict[str, Any]] = list(nodes or [])
        self.backup = backup

    # ---- building
    def add(self, params: Mapping[str, Any], parent: int | None = None, transition: Mapping[str, Any] | None = None,
            **extra: Any) -> dict[str, Any]:
        if parent is None and self.nodes:
            raise ValueError("the tree has a root already: give the parent of the new node")
        node = {"id": len(self.nodes), "parent": parent, "depth": 0 if parent is None else self.nodes[parent]["depth"]
                + 1, "status": "proposed", "params": dict(params), "transition": dict(transition or {}),
                "expanded": False, "score": None, "score_before": None, "summary": {}, "pathologies": [], **extra}
        self.nodes.append(node)
        return node

    def children(self, node_id: int) -> list[dict[str, Any]]:
        return [n for n in self.nodes if n["parent"] == node_id]

    def subtree(self, node_id: int) -> list[dict[str, Any]]:
        out, pending = [], [node_id]
        while pending:
            current = pending.pop()
            out.append(self.nodes[current])
            pending.extend(n["id"] for n in self.children(current))
        return out

    def path(self, node_id: int) -> list[dict[str, Any]]:
        """The nodes from the root to `node_id`."""
        out = []
        current: int | None = node_id
        while current is not None:
            out.append(self.nodes[current])
            current = self.nodes[current]["parent"]
        return out[::-1]

    # ---- statistics
    def visits(self, node_id: int) -> int:
        return sum(n["status"] == "done" for n in self.subtree(node_id))

    def value(self, node_id: int) -> float | None:
        scores = [n["score"] for n in self.subtree(node_id)
                  if n["status"] == "done" and _finite(n["score"]) is not None]
        if not scores:
            return None
        return max(scores) if self.backup == "max" else sum(scores) / len(scores)

    def trained(self) -> int:
        """Stages spent: nodes trained, whether they finished ("done") or failed."""
        return sum(n["status"] in ("done", "failed") for n in self.nodes)

    def best(self) -> dict[str, Any] | None:
        """The trained node with the highest score (ties: the earliest)."""
        done = [n for n in self.nodes if n["status"] == "done" and _finite(n["score"]) is not None]
        return max(done, key=lambda n: (n["score"], -n["id"])) if done else None

    # ---- selection
    def select(self, c: float = 1.0, selection: str = "ucb") -> tuple[str, int] | None:
        """What to do next: UCB descent from the root (an unvisited child first, else the child of the highest
        UCB, ties to the earliest), or best-first (the highest-scored trained node that can still grow)."""
        if not self.nodes:
            return None
        root = self.nodes[0]
        if root["status"] in ("proposed", "running"):
            return ("train", 0)
        if selection == "best_first":
            return self._best_first()
        if selection != "ucb":
            raise ValueError(f"selection must be 'ucb' or 'best_first', got {selection!r}")
        return self._descend(0, c)

    def _descend(self, node_id: int, c: float) -> tuple[str, int] | None:
        node = self.nodes[node_id]
        if node["status"] != "done":
            return None
        if not node["expanded"]:
            return ("expand", node_id)
        kids = self.children(node_id)
        unvisited = [k for k in kids if k["status"] in ("proposed", "running")]
        if unvisited:
            return ("train", unvisited[0]["id"])  # UCB = +inf
        done = [k for k in kids if k["status"] == "done"]
        parent_visits = self.visits(node_id)
        ranked = sorted(done, key=lambda k: (-ucb(self.value(k["id"]), parent_visits, self.visits(k["id"]), c),
                                             k["id"]))
        for kid in ranked:  # the best child whose subtree still has something to do
            action = self._descend(kid["id"], c)
            if action is not None:
                return action
        return None

    def _best_first(self) -> tuple[str, int] | None:
        growable = []
        for n in self.nodes:
            if n["status"] != "done":
                continue
            pending = [k for k in self.children(n["id"]) if k["status"] in ("proposed", "running")]
            if not n["expanded"] or pending:
                growable.append((n, pending))
        if not growable:
            return None
        node, pending = max(growable, key=lambda item: (_finite(item[0]["score"]) or -math.inf, -item[0]["id"]))
        return ("train", pending[0]["id"]) if pending else ("expand", node["id"])

    # ---- files
    def to_dict(self) -> dict[str, Any]:
        return {"backup": self.backup, "nodes": self.nodes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchTree:
        return cls([dict(n) for n in data.get("nodes", [])], backup=data.get("backup", "max"))


def proposals_from_text(text: str | None) -> list[dict[str, Any]]:
    """The proposals in an LLM's answer: the first JSON list in it (objects with `changes` and `rationale`, or bare
    `{param: value}` mappings); [] when there is none.

    >>> proposals_from_text('Sure: [{"changes": {"beta": 0.02}, "rationale": "KL too low"}, {"temperature": 0.9}]')
    [{'changes': {'beta': 0.02}, 'rationale': 'KL too low'}, {'changes': {'temperature': 0.9}, 'rationale': ''}]
    >>> proposals_from_text("no idea"), proposals_from_text(None)
    ([], [])
    """
    if not isinstance(text, str):
        return []
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "["):
        try:
            value, _ = decoder.raw_decode(text[start:])
        except ValueError:
            continue
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            out = []
            for item in value:
                if isinstance(item.get("changes"), dict):
                    out.append({"changes": dict(item["changes"]), "rationale": str(item.get("rationale", ""))})
                else:
                    out.append({"changes": dict(item), "rationale": ""})
            return out
    return []


Proposer = Callable[[Mapping[str, Any]], Sequence[Mapping[str, Any]]]


# ---- the controller's settings ---------------------------------------------------------------------------------------

SCORE_METRICS = ("success_rate", "episode_return", "valid_action_rate")
"""Held-out metrics a search may maximise (the evaluator's metrics where higher is better)."""
PROPOSERS = ("rules", "llm")


@dataclass
class SearchArguments:
    """The controller's settings (LLMZero): how long a stage is, how wide and how far the tree grows, how it picks,
    and who proposes. `LLMZeroConfig` has them too; `trl-agents search` adds them to any method's config."""

    stage_steps: int = field(
        default=50,
        metadata={"help": "S, RL steps per stage: each child trains this many steps from its parent's checkpoint; "
        "it replaces max_steps in every stage (our choice: 50, the paper's stage length is not known to us; "
        "docs/methods/llmzero.md)."},
    )
    children_per_node: int = field(
        default=3,
        metadata={"help": "K, coordinated transitions proposed at a trained node (our choice: 3)."},
    )
    search_budget: int = field(
        default=10,
        metadata={"help": "Stages trained in all, the root stage included (our choice: the paper matches the budget "
        "to a grid search's compute; `--stages` on `trl-agents search`)."},
    )
    ucb_c: float = field(
        default=1.0,
        metadata={"help": "c of UCB, score + c·sqrt(ln N_parent / N_child) (our choice: 1.0; 0 = greedy on the "
        "backed-up score)."},
    )
    search_selection: str = field(
        default="ucb",
        metadata={"help": "'ucb' (descend by UCB, an unvisited child first) or 'best_first' (grow the best trained "
        "node)."},
    )
    search_backup: str = field(
        default="max",
        metadata={"help": "A node's value: 'max' or 'mean' of the held-out scores in its subtree (our choice: max, "
        "the search looks for the best strategy)."},
    )
    search_metric: str = field(
        default="success_rate",
        metadata={"help": "Held-out metric a stage is scored by: success_rate, episode_return or valid_action_rate "
        "(our choice: success_rate; the eval split of RunArguments)."},
    )
    proposer: str = field(
        default="rules",
        metadata={"help": "Who proposes the transitions: 'rules' (the built-in diagnosis rules, no model) or 'llm' "
        "(an OpenAI-compatible endpoint at `proposer_url`; our choice of default: rules, runs offline)."},
    )
    proposer_url: str | None = field(
        default=None, metadata={"help": "Base URL of the OpenAI-compatible proposer (e.g. http://localhost:8000)."}
    )
    proposer_model: str | None = field(
        default=None, metadata={"help": "Served model name of the proposer (None: the first one it lists)."}
    )
    proposer_timeout: float = field(default=120.0, metadata={"help": "Seconds one proposer request may take."})
    proposer_max_tokens: int = field(default=1024, metadata={"help": "Token budget of a proposer answer."})
    capacity_params: list[str] = field(
        default_factory=lambda: list(CAPACITY_PARAMS),
        metadata={"help": "Searched capacity parameters (config fields): never decrease along a path [P]."},
    )
    regularisation_params: list[str] = field(
        default_factory=lambda: list(REGULARISATION_PARAMS),
        metadata={"help": "Searched regularisation parameters (config fields): move either way [P]."},
    )
    search_dir: str | None = field(
        default=None,
        metadata={"help": "Where search_tree.json and the stages (nodes/<id>/) go (None: output_dir)."},
    )

    def __post_init__(self):
        self.check_search()

    def check_search(self) -> None:
        """One-line ValueErrors naming the field and the fix."""
        for name in ("stage_steps", "children_per_node", "search_budget", "proposer_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.ucb_c, int | float) and math.isfinite(self.ucb_c) and self.ucb_c >= 0):
            raise ValueError(f"ucb_c must be a finite number >= 0, got {self.ucb_c!r}")
        if not (isinstance(self.proposer_timeout, int | float) and self.proposer_timeout > 0):
            raise ValueError(f"proposer_timeout must be a number of seconds > 0, got {self.proposer_timeout!r}")
        check_choice("search_selection", self.search_selection, ("ucb", "best_first"))
        check_choice("search_backup", self.search_backup, ("max", "mean"))
        check_choice("search_metric", self.search_metric, SCORE_METRICS)
        check_choice("proposer", self.proposer, PROPOSERS)
        if self.proposer == "llm" and not self.proposer_url:
            raise ValueError("proposer='llm' needs proposer_url (an OpenAI-compatible server, e.g. "
                             "http://localhost:8000), or use proposer='rules'")
        self.capacity_params = list(self.capacity_params or [])
        self.regularisation_params = list(self.regularisation_params or [])
        both = sorted(set(self.capacity_params) & set(self.regularisation_params))
        if both:
            raise ValueError(f"{', '.join(both)} listed in both capacity_params and regularisation_params: a parameter "
                             "is either monotone (capacity) or free (regularisation)")
        if not self.capacity_params and not self.regularisation_params:
            raise ValueError("capacity_params and regularisation_params are both empty: name the parameters to search")
