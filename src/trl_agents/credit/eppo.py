"""EPPO: entropy-paced, task-wise dynamic clipping (Hu et al. 2026, arXiv 2607.07178; docs/methods/eppo.md).

In multi-task agentic RL the tasks explore at different paces: an easy task converges early to a low-entropy policy
while a hard one still explores, and the shared update pushes them back and forth (entropy crossovers and spikes).
EPPO replaces GRPO's fixed clipping range ε with a per-task bound that follows each task's entropy relative to the
others: tighter for over-confident (low-entropy) tasks, looser for under-explored (high-entropy) ones. Only the
abstract of the paper was available; the rule below is our reading of it ([D] on the docs page).

For each task type k (a dataset column, e.g. ALFWorld's `task_type`):

    H_k ← d·H_k + (1 − d)·mean_{action tokens of k} H        (EMA of the mean token entropy; d = 0.9)
    r_k = H_k / mean_{k'} H_{k'}                               (relative pace: > 1 explores more than the average)
    s_k = clip(r_k^α, 1/c, c)                                  (α = 1, c = 2)
    ε_low[k] = s_k·ε_low,  ε_high[k] = s_k·ε_high              ("both" sides; "high" scales ε_high only: clip-higher)
    L = −min(ρ·A, clamp(ρ, 1 − ε_low[k_i], 1 + ε_high[k_i])·A) (TRL's clipped objective, bounds of sample i's task)

Optional crossover freeze (`freeze_steps` W > 0): when the order of two tasks' entropies flips between two updates
(H_j > H_k became H_j < H_k), the scales s_k are held for W updates while the EMAs keep tracking.

With every H_k equal (or a single task type) r_k = 1 and s_k = 1: EPPO is GRPO exactly.

Numerical guards: a task type's first measurement sets its EMA (no bias towards 0); a mean entropy of the known
types below `TINY` (all policies deterministic) gives r_k = 1 for all; H_k = 0 gives s_k = 1/c (α > 0); no task
type measured yet, or a row whose type is unknown: s = 1; measurements with no token (count 0) or non-finite sums
are ignored. No NaN or inf can come out.

Hand-computed case (the docs page): two task types with H = [0.4, 1.2] (mean 0.8) ⇒ r = [0.5, 1.5] ⇒ ε = [0.1, 0.3]
with ε₀ = 0.2; a ratio ρ = 1.25 with A > 0 is clipped to 1.1 for the first task and left at 1.25 < 1.3 for the
second.

    >>> scales = pace_scales({"easy": 0.4, "hard": 1.2})
    >>> {k: round(0.2 * s, 4) for k, s in scales.items()}
    {'easy': 0.1, 'hard': 0.3}
    >>> round(clipped_objective(1.25, 1.0, 0.1, 0.1), 4), round(clipped_objective(1.25, 1.0, 0.3, 0.3), 4)
    (1.1, 1.25)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

TINY = 1e-8  # below this mean entropy every policy is deterministic: no pace can be measured (r = 1)
SIDES = ("both", "high")


def update_entropy_ema(ema: Mapping[str, float], totals: Mapping[str, tuple[float, float]],
                       decay: float = 0.9) -> dict[str, float]:
    """H_k ← d·H_k + (1 − d)·(Σ entropy / Σ tokens) for every task type measured in `totals` (name -> (entropy
    sum, token count)); a type's first measurement sets H_k; types with no token keep their value.

    >>> ema = update_entropy_ema({}, {"a": (2.0, 4)})          # first measurement: H_a = 2/4
    >>> ema
    {'a': 0.5}
    >>> update_entropy_ema(ema, {"a": (1.5, 1), "b": (0.0, 0)})  # 0.9·0.5 + 0.1·1.5 = 0.6; b has no token
    {'a': 0.6}
    """
    out = dict(ema)
    for name, (total, count) in totals.items():
        if count <= 0 or not math.isfinite(total):
            continue
        mean = max(total / count, 0.0)
        out[name] = mean if name not in out else decay * out[name] + (1.0 - decay) * mean
    return out


def relative_pace(ema: Mapping[str, float]) -> dict[str, float]:
    """r_k = H_k / mean_{k'} H_{k'} (1 for every type when the mean is below `TINY`).

    >>> {k: round(r, 6) for k, r in relative_pace({"easy": 0.4, "hard": 1.2}).items()}  # mean 0.8: 0.4/0.8, 1.2/0.8
    {'easy': 0.5, 'hard': 1.5}
    >>> relative_pace({"a": 0.0, "b": 0.0})
    {'a': 1.0, 'b': 1.0}
    """
    if not ema:
        return {}
    mean = sum(ema.values()) / len(ema)
    if mean < TINY:
        return {name: 1.0 for name in ema}
    return {name: value / mean for name, value in ema.items()}


def pace_scale(pace: float, alpha: float = 1.0, max_scale: float = 2.0) -> float:
    """s = clip(r^α, 1/c, c) with c = `max_scale`.

    >>> pace_scale(0.5), pace_scale(1.5), pace_scale(5.0), pace_scale(0.0), pace_scale(0.25, alpha=0.5)
    (0.5, 1.5, 2.0, 0.5, 0.5)
    """
    if alpha == 0:
        return 1.0
    value = pace**alpha if pace > 0 else (0.0 if alpha > 0 else math.inf)
    return min(max(value, 1.0 / max_scale), max_scale)


def pace_scales(ema: Mapping[str, float], alpha: float = 1.0, max_scale: float = 2.0) -> dict[str, float]:
    """s_k for every task type of `ema` (the EMA entropies).

    >>> pace_scales({"a": 0.7, "b": 0.7})   # equal entropies: GRPO's bounds
    {'a': 1.0, 'b': 1.0}
    """
    return {name: pace_scale(r, alpha, max_scale) for name, r in relative_pace(ema).items()}


def task_bounds(scale: float, epsilon_low: float, epsilon_high: float, sides: str = "both") -> tuple[float, float]:
    """(ε_low[k], ε_high[k]) for a task of scale s: both bounds scaled ("both"), or only ε_high ("high", clip-higher).

    >>> task_bounds(0.5, 0.2, 0.28), task_bounds(0.5, 0.2, 0.28, sides="high")
    ((0.1, 0.14), (0.2, 0.14))
    """
    if sides not in SIDES:
        raise ValueError(f"sides must be one of {SIDES}, got {sides!r}")
    return (scale * epsilon_low if sides == "both" else epsilon_low), scale * epsilon_high


def clipped_objective(ratio: float, advantage: float, epsilon_low: float, epsilon_high: float) -> float:
    """min(ρ·A, clamp(ρ, 1 − ε_low, 1 + ε_high)·A): what TRL's loss maximises for one token (its loss is minus this).

    >>> clipped_objective(1.25, 1.0, 0.2, 0.2), clipped_objective(0.5, -1.0, 0.2, 0.2)   # clipped at 1.2 / 0.8
    (1.2, -0.8)
    """
    clamped = min(max(ratio, 1.0 - epsilon_low), 1.0 + epsilon_high)
    return min(ratio * advantage, clamped * advantage)


def crossovers(previous: Mapping[str, float], current: Mapping[str, float]) -> list[tuple[str, str]]:
    """The pairs of task types (j, k), both in `previous` and `current`, whose entropy order flipped strictly.

    >>> crossovers({"a": 0.5, "b": 1.0, "c": 2.0}, {"a": 1.2, "b": 1.0, "c": 2.0})
    [('a', 'b')]
    >>> crossovers({"a": 0.5, "b": 0.5}, {"a": 0.4, "b": 0.6})   # a tie is not an order: no flip
    []
    """
    names = sorted(set(previous) & set(current))
    flipped = []
    for i, j in enumerate(names):
        for k in names[i + 1:]:
            before, after = previous[j] - previous[k], current[j] - current[k]
            if before * after < 0:
                flipped.append((j, k))
    return flipped


class EntropyPacer:
    """The state of EPPO's controller: per-task EMA entropies, the scales s_k they give, and the crossover freeze.

    `observe(totals)` folds one generation batch's (entropy sum, token count) per task type into the EMAs (the
    trainer sums them over processes first, so every process holds the same state); `scale(name)` is s_k (1 for a
    type never measured, or unseen during a freeze). `state_dict()` / `load_state_dict()` survive a resume.

    >>> pacer = EntropyPacer(freeze_steps=2)
    >>> pacer.observe({"easy": (0.4, 1), "hard": (1.2, 1)})
    {'crossovers': 0, 'frozen': 0.0}
    >>> round(pacer.scale("easy"), 6), round(pacer.scale("hard"), 6), pacer.scale("new")
    (0.5, 1.5, 1.0)
    >>> pacer.decay = 0.0                                 # (so that the next updates replace the EMAs)
    >>> pacer.observe({"easy": (1.2, 1), "hard": (0.4, 1)})  # the order flipped: scales held for 2 updates
    {'crossovers': 1, 'frozen': 1.0}
    >>> round(pacer.scale("easy"), 6), pacer.observe({"easy": (1.2, 1), "hard": (0.4, 1)})
    (0.5, {'crossovers': 0, 'frozen': 1.0})
    >>> pacer.observe({"easy": (1.2, 1), "hard": (0.4, 1)}), round(pacer.scale("easy"), 6)  # released
    ({'crossovers': 0, 'frozen': 0.0}, 1.5)
    """

    def __init__(self, decay: float = 0.9, alpha: float = 1.0, max_scale: float = 2.0, freeze_steps: int = 0):
        self.decay, self.alpha, self.max_scale, self.freeze_steps = decay, alpha, max_scale, freeze_steps
        self.ema: dict[str, float] = {}
        self.scales: dict[str, float] = {}
        self.frozen_left = 0  # further updates during which `scales` stay as they are
        self.updates = 0

    def observe(self, totals: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
        """Fold `totals` (name -> (Σ entropy, tokens)) into the EMAs and update the scales, unless a crossover
        freeze holds them; returns {"crossovers": flipped pairs, "frozen": 1.0 when the scales were held}."""
        previous = dict(self.ema)
        self.ema = update_entropy_ema(self.ema, totals, self.decay)
        flips = crossovers(previous, self.ema)
        self.updates += 1
        held = True
        if self.frozen_left > 0:
            self.frozen_left -= 1
        elif flips and self.freeze_steps > 0 and self.scales:
            self.frozen_left = self.freeze_steps - 1  # hold the scales of before the crossover for W updates
        else:
            held = False
            self.scales = pace_scales(self.ema, self.alpha, self.max_scale)
        return {"crossovers": len(flips), "frozen": float(held)}

    def scale(self, name: str) -> float:
        return self.scales.get(name, 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"ema": dict(self.ema), "scales": dict(self.scales), "frozen_left": self.frozen_left,
                "updates": self.updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ema = {str(k): float(v) for k, v in state.get("ema", {}).items()}
        self.scales = {str(k): float(v) for k, v in state.get("scales", {}).items()}
        self.frozen_left = int(state.get("frozen_left", 0))
        self.updates = int(state.get("updates", 0))
