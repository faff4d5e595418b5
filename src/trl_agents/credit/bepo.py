"""Gated-BEPO advantages: the GRPO episode advantage plus Bellman credit from the group's empirical rollout graph, used
only at states whose observed successors disagree.

Gated-BEPO (Yan, Huang, Fan, Liu 2026, arXiv 2608.06861), as specified in docs/methods/bepo.md; the mean-backup
fixed point is the construction of the related CRBC paper (Eq. 5-14). Per group, on the anchors s of its steps:

    x_{i,t}   = s_{i,t+1}; after the last step z⁺ (success) or z⁻ (failure, time-outs included)    step 1 graph
    M(s,x)    = Σ_a μ(a|s)·P(x|s,a) = N(s→x)/N(s)        (the action cancels)                        CRBC Eq. 5
    b(s)      = Σ_a μ(a|s) Σ_x P(x|s,a)·r̄(s,a,x) = Σ_{visits of s} r / N(s)                          CRBC Eq. 7
    V         = (I − βM)⁻¹ b,   V(z⁺) = V(z⁻) = 0         mean-backup fixed point, solved exactly     CRBC Eq. 8-9
    δ_{i,t}   = r_{i,t} + β·V(x_{i,t}) − V(s_{i,t})                                                   step 4 TD
    A^B_{i,t} = Σ_{l≥0} (βλ)^l δ_{i,t+l}                                                              step 5 GAE
    g(s)      = 1[ |{x : N(s→x) > 0}| ≥ 2 ]   (z⁺, z⁻ count; or ≥ 2 canonical actions, CRBC Eq. 13)  step 6 gate
    w(s)      = min(1, N(s)/n₀)               (or w ≡ 1)                                              step 7 mixing
    A_{i,t}   = A^GRPO_i + g(s)·w(s)·A^B_{i,t}/(max(σ_B, σ_min) + ε)                                  step 7 fusion
                σ_B = std of A^B over the gated rows of the batch (or of the group), σ_min = 1 (a floor)

The system is always well posed, cycles included: every anchor lies on an observed trajectory, and every trajectory
ends in z⁺ or z⁻, so from every anchor the absorbing exits are reachable and βM has spectral radius < 1 (also at
β = 1). A state seen once has a single successor: its gate is closed and its rows keep the pure episode credit, so a
group whose states never repeat gets GRPO exactly; a group without rewards (or with the same rewards along the same
states) has δ = 0 everywhere and gets A^GRPO (0 plus the invalid-action penalty).
`r` is the environment reward of the step (with terminal-only rewards the last step's r is the episode return R_i);
the invalid-action penalty enters once, through A^GRPO, never the graph (our choice; docs/methods/bepo.md#our-choices).

The floor σ_min guards step 7 (ours): with a few nearly equal gated rows σ_B is tiny, and dividing by it turns a
Bellman credit of −0.38 into an advantage of −35 (the trajectory s0 (r=2) → s1 (−1) → s0 (1) → s1 (0) of
docs/methods/bepo.md#our-choices: two gated rows, σ_B = 0.0055). With σ_min = 1 the normalisation only ever shrinks
the Bellman credit (to unit spread), never amplifies it. With `bellman_norm="batch_std"`, σ_B is taken over the whole
batch (every group of the call, and every process with `sum_over_processes`), as the paper's text says.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import chain, pairwise

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import spsolve

from ..trajectory import Group
from .base import (AnchorParams, Stats, StepAdvantages, batch_result, canonical_action, check_choice, check_positive,
                   mean_std, register_estimator, runtime_field)
from .ecpo import group_anchors
from .grpo import GRPOOutcomeParams

GATES = ("successors", "actions", "none")
MIXINGS = ("visits", "fixed")
BELLMAN_NORMS = ("batch_std", "std", "none")
"""Scale of the Bellman credit: σ_B over the gated rows of the batch, of each group, or 1."""
BEPO_STATS = ("num_states", "gated_row_fraction", "bellman_std")

SUCCESS_EXIT, FAILURE_EXIT = -1, -2
"""Successor indices of the absorbing nodes z⁺ and z⁻ (anchors are numbered 0..K−1)."""


@dataclass(frozen=True)
class BellmanCredit:
    """The Bellman side of Gated-BEPO for one group (docs/methods/bepo.md#equations, steps 1-6).

    Attributes:
        values: V(s) of every anchor (keys as anchors are formed: state keys, observations or cluster labels).
        successors: Number of distinct observed successors of every anchor (z⁺ and z⁻ count as nodes).
        actions: Number of distinct canonical actions taken at every anchor; computed for `gate="actions"` only
            (None otherwise: the mean backup does not depend on action labels).
        visits: N(s), visits of every anchor.
        td_errors: δ_{i,t}, one list per trajectory.
        advantages: A^B_{i,t} (GAE of the δ), one list per trajectory.
        gated: g(s_{i,t}) of every step, one list per trajectory.
        row_visits: N(s_{i,t}) of every step, one list per trajectory.
    """

    values: dict[Hashable, float]
    successors: dict[Hashable, int]
    actions: dict[Hashable, int] | None
    visits: dict[Hashable, int]
    td_errors: StepAdvantages
    advantages: StepAdvantages
    gated: list[list[bool]]
    row_visits: list[list[int]]


def bellman_credit(
    group: Group,
    *,
    gamma: float = 0.95,
    lam: float = 0.95,
    gate: str = "successors",
    anchor: str = "state_key",
    similarity_threshold: float | None = None,
    merge_invalid_actions: bool = True,
) -> BellmanCredit:
    """Empirical graph, mean-backup values V, TD residuals δ, their GAE A^B and the confidence gate of one group.

    The arguments are those of `BEPOParams` (`gamma`, `lam` = `gae_lambda`, `gate` = `bepo_gate`, `anchor`,
    `similarity_threshold`, `merge_invalid_actions`). Raises a ValueError on non-finite rewards.

    Example (docs/methods/bepo.md#hand-computed-case, β = λ = 1: A, D: s0→s1→✓; B: s0→s1→✗; C: s0→s2→✗):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(second_state, reward):
        ...     steps = [Step("s0", "a"), Step(second_state, "b", reward=reward)]
        ...     return Trajectory(task={}, steps=steps, success=reward > 0)
        >>> group = Group(task={}, trajectories=[episode(*c) for c in [("s1", 1), ("s1", 0), ("s2", 0), ("s1", 1)]])
        >>> credit = bellman_credit(group, gamma=1.0, lam=1.0)
        >>> {s: round(v, 4) for s, v in credit.values.items()}
        {'s0': 0.5, 's1': 0.6667, 's2': 0.0}
        >>> [[round(a, 4) for a in row] for row in credit.advantages[:3]], credit.gated[2]
        ([[0.5, 0.3333], [-0.5, -0.6667], [-0.5, 0.0]], [True, False])
    """
    _check_graph_settings(gamma, lam, gate, anchor, similarity_threshold)

    # Step 1: number the anchors; every step row is one observed transition s → x with its reward r. Rows are
    # flattened trajectory by trajectory: x is the next row's anchor, or z⁺/z⁻ after a trajectory's last row.
    anchors = group_anchors(group, anchor, similarity_threshold)
    index: dict[Hashable, int] = {}
    try:
        src = np.array([index.setdefault(key, len(index)) for key in anchors], dtype=np.int64)
    except TypeError as err:
        raise ValueError(f"Gated-BEPO anchors must be hashable: {err}") from None
    num_nodes = len(index)
    lengths = [len(traj.steps) for traj in group.trajectories]
    bounds = np.cumsum([0, *lengths]).tolist()
    last_rows = [end - 1 for end, n in zip(bounds[1:], lengths, strict=True) if n]
    dst = np.empty_like(src)
    dst[:-1] = src[1:]
    dst[last_rows] = [SUCCESS_EXIT if traj.success else FAILURE_EXIT for traj in group.trajectories if traj.steps]
    rewards = np.array([step.reward for traj in group.trajectories for step in traj.steps], dtype=np.float64)
    if not np.isfinite(rewards).all():
        raise ValueError(f"Gated-BEPO needs finite step rewards, got non-finite ones: {rewards[~np.isfinite(rewards)]}")

    # CRBC Eq. 5-9: (I − βM)V = b with M(s,x) = N(s→x)/N(s), b(s) = mean reward of the visits of s; exits have V = 0.
    # A sparse direct solve (one row per anchor, one entry per observed edge): exact, and O(edges) for chain-like graphs.
    visits = np.bincount(src, minlength=num_nodes).astype(np.float64)
    mean_reward = np.bincount(src, weights=rewards, minlength=num_nodes) / visits
    inner = dst >= 0
    diagonal = np.arange(num_nodes)
    system = sparse.csc_matrix(
        (
            np.concatenate([np.ones(num_nodes), -gamma / visits[src[inner]]]),  # I − βM, duplicate edges summed
            (np.concatenate([diagonal, src[inner]]), np.concatenate([diagonal, dst[inner]])),
        ),
        shape=(num_nodes, num_nodes),
    )
    value = np.atleast_1d(spsolve(system, mean_reward)) if num_nodes else np.zeros(0)

    # Step 6: distinct successors (z⁺ and z⁻ included) and, for the actions gate, distinct canonical actions.
    successors = _distinct_per_anchor(src, dst - FAILURE_EXIT, num_nodes)
    actions = None
    if gate == "actions":
        ids: dict[Hashable, int] = {}
        labels = [ids.setdefault(canonical_action(step, merge_invalid=merge_invalid_actions), len(ids))
                  for traj in group.trajectories for step in traj.steps]
        actions = _distinct_per_anchor(src, np.array(labels, dtype=np.int64), num_nodes)
        open_gate = actions >= 2
    elif gate == "successors":
        open_gate = successors >= 2
    else:
        open_gate = np.ones(num_nodes, dtype=bool)

    # Step 4: δ = r + βV(x) − V(s), with V(z±) = 0 (index num_nodes of the extended values).
    extended = np.append(value, 0.0)
    delta = (rewards + gamma * extended[np.where(inner, dst, num_nodes)] - value[src]).tolist()
    # Step 5: GAE backwards within each trajectory, A^B_t = δ_t + βλ·A^B_{t+1} (0 after the last step).
    gae = [0.0] * len(delta)
    for start, end in pairwise(bounds):
        running = 0.0
        for row in range(end - 1, start - 1, -1):
            running = delta[row] + gamma * lam * running
            gae[row] = running

    def per_trajectory(values: list) -> list[list]:
        return [values[start:end] for start, end in pairwise(bounds)]

    keys = list(index)
    return BellmanCredit(
        values=dict(zip(keys, value.tolist(), strict=True)),
        successors=dict(zip(keys, successors.tolist(), strict=True)),
        actions=None if actions is None else dict(zip(keys, actions.tolist(), strict=True)),
        visits=dict(zip(keys, visits.astype(np.int64).tolist(), strict=True)),
        td_errors=per_trajectory(delta),
        advantages=per_trajectory(gae),
        gated=per_trajectory(open_gate[src].tolist()),
        row_visits=per_trajectory(visits[src].astype(np.int64).tolist()),
    )


def _check_graph_settings(gamma: float, lam: float, gate: str, anchor: str, similarity_threshold: float | None) -> None:
    check_choice("gate", gate, GATES)
    check_choice("anchor", anchor, ("state_key", "observation"))
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma (the discount β) must be in (0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam (the GAE λ) must be in [0, 1], got {lam}")
    if similarity_threshold is not None and not 0.0 < similarity_threshold < 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1) or None, got {similarity_threshold}")


def _distinct_per_anchor(anchors: np.ndarray, labels: np.ndarray, num_nodes: int) -> np.ndarray:
    """For each anchor 0..num_nodes−1, how many distinct non-negative `labels` its rows carry."""
    if not len(anchors):
        return np.zeros(num_nodes, dtype=np.int64)
    base = int(labels.max()) + 1
    pairs = np.unique(anchors * base + labels)  # one entry per distinct (anchor, label)
    return np.bincount(pairs // base, minlength=num_nodes)


@dataclass(frozen=True, kw_only=True)
class BEPOParams(AnchorParams, GRPOOutcomeParams):
    """Settings of `bepo_advantages` (config fields of `BEPOConfig`).

    Attributes:
        gamma: β ∈ (0, 1], discount of the backup, the TD residuals and the GAE (our choice 0.95, verl-agent's γ;
            CRBC used 0.98; docs/methods/bepo.md#our-choices).
        gae_lambda: GAE λ ∈ [0, 1] (our choice 0.95, step 5 [D]); 0 gives the one-step credit Q − V of CRBC, 1 gives
            the discounted return minus V(s_t).
        bepo_gate: "successors": open at anchors with ≥ 2 distinct observed successors, z⁺/z⁻ included (our choice,
            step 6 [D]); "actions": ≥ 2 distinct canonical actions (CRBC Eq. 13); "none": always open (the
            "+fixed-point credit" ablation).
        bepo_mixing: "visits": w = min(1, N(s)/n0) (our choice, step 7 [D] "adaptive mixing"); "fixed": w = 1.
        mixing_n0: n0, visits at which the Bellman credit gets full weight (our choice 4, step 7 [D]).
        bellman_norm: "batch_std": A^B divided by (max(σ_B, bellman_std_floor) + ε), σ_B the Bessel std of A^B over
            the gated rows of the whole batch (every group of the call, summed over the processes with
            `sum_over_processes`); "std": the same with σ_B over each group's gated rows; "none": no division. Our
            choice, step 7 [D]; docs/methods/bepo.md#our-choices.
        bellman_std_floor: σ_min ≥ 0, the least σ_B divided by (our choice 1.0: the normalisation never amplifies
            the Bellman credit; 0 = the bare std, which blows up over a few nearly equal gated rows).
        scale_rewards, credit_statistic: A^GRPO (`GRPOOutcomeParams`).
        anchor, similarity_threshold: What identifies a graph node (`AnchorParams`).
        merge_invalid_actions: Treat every rejected action as one canonical action (only `bepo_gate="actions"` reads
            actions: in the mean backup μ(a|s)·P(x|s,a) sums to N(s→x)/N(s) whatever the action labels).
        invalid_action_penalty: λ, for steps with `valid=False`; enters A^GRPO only.
        eps: ε of the Bellman normalisation; not a config field.
    """

    gamma: float = 0.95
    gae_lambda: float = 0.95
    bepo_gate: str = "successors"
    bepo_mixing: str = "visits"
    mixing_n0: float = 4.0
    bellman_norm: str = "std"
    bellman_std_floor: float = 1.0
    merge_invalid_actions: bool = True
    eps: float = runtime_field(1e-6)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_graph_settings(self.gamma, self.gae_lambda, self.bepo_gate, self.anchor, self.similarity_threshold)
        check_choice("mixing", self.bepo_mixing, MIXINGS)
        check_choice("bellman_norm", self.bellman_norm, BELLMAN_NORMS)
        if not (math.isfinite(self.mixing_n0) and self.mixing_n0 > 0):
            raise ValueError(f"n0 must be > 0, got {self.mixing_n0}")
        check_positive("eps", self.eps)
        floor = self.bellman_std_floor
        if not (math.isfinite(floor) and floor >= 0):
            raise ValueError(f"std_floor (bellman_std_floor) must be a finite number >= 0, got {floor}")


@register_estimator("bepo", BEPOParams)
def bepo_advantages(groups: Sequence[Group], params: BEPOParams) -> tuple[list[StepAdvantages], Stats]:
    """Gated-BEPO advantages A = A^GRPO + g·w·Â^B for every step of every trajectory of every group.

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats over the groups
        with steps: "num_states" (graph nodes besides z⁺/z⁻), "gated_row_fraction" (step rows whose gate is open),
        "bellman_std" (the σ_B divided by, before the floor; 0 for a group without a gated row).

    Example (the toy group of docs/methods/bepo.md, β = λ = 1, the bare σ_B = √(5/18) without the floor; the gate of
    s2 is closed, so C's last step keeps A^GRPO):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(second_state, reward):
        ...     steps = [Step("s0", "a"), Step(second_state, "b", reward=reward)]
        ...     return Trajectory(task={}, steps=steps, success=reward > 0)
        >>> group = Group(task={}, trajectories=[episode(*c) for c in [("s1", 1), ("s1", 0), ("s2", 0), ("s1", 1)]])
        >>> (bare,), _ = bepo_advantages([group], BEPOParams(gamma=1.0, gae_lambda=1.0, bellman_std_floor=0.0))
        >>> [[round(a, 4) for a in row] for row in bare]
        [[1.8146, 1.3402], [-1.8146, -1.8146], [-1.8146, -0.8659], [1.8146, 1.3402]]
        >>> (floored,), _ = bepo_advantages([group], BEPOParams(gamma=1.0, gae_lambda=1.0))  # σ_min = 1 > σ_B
        >>> [[round(a, 4) for a in row] for row in floored]
        [[1.3659, 1.1159], [-1.3659, -1.3659], [-1.3659, -0.8659], [1.3659, 1.1159]]
    """
    parts = [_bepo_parts(group, params) for group in groups]
    sigma = None
    if params.bellman_norm == "batch_std":  # σ_B over the gated rows of the whole batch (every process)
        values = [value for _, bellman in parts for value in _gated_values(bellman)]
        totals = (float(sum(values)), float(sum(v * v for v in values)), float(len(values)))
        sigma = pooled_std(tuple(params.summed(totals)))
    results = (_fuse(episode, bellman, params, sigma) for episode, bellman in parts)
    return batch_result(results, BEPO_STATS, counted=lambda stats: stats["num_states"])


def _bepo_parts(group: Group, params: BEPOParams) -> tuple[StepAdvantages, BellmanCredit]:
    """Steps 1-6 for one group: A^GRPO (with its invalid-action rule; it also rejects non-finite rewards) and the
    Bellman credit (graph, V, δ, A^B, gate)."""
    episode = params.episode_advantages(group)
    bellman = bellman_credit(
        group, gamma=params.gamma, lam=params.gae_lambda, gate=params.bepo_gate, anchor=params.anchor,
        similarity_threshold=params.similarity_threshold, merge_invalid_actions=params.merge_invalid_actions,
    )
    return episode, bellman


def _gated_values(bellman: BellmanCredit) -> list[float]:
    """A^B of the gated rows."""
    return [value for values, gated in zip(bellman.advantages, bellman.gated, strict=True)
            for value, open_ in zip(values, gated, strict=True) if open_]


def _fuse(
    episode: StepAdvantages, bellman: BellmanCredit, params: BEPOParams, batch_sigma: float | None
) -> tuple[StepAdvantages, dict[str, float]]:
    """Step 7 for one group: Â^B = A^B/(max(σ_B, σ_min) + ε) over the gated rows; A = A^GRPO + g·w·Â^B. σ_B is
    `batch_sigma` with `bellman_norm="batch_std"`. Returns the advantages and the group's stats (`BEPO_STATS`)."""
    a_e = np.array(list(chain.from_iterable(episode)), dtype=np.float64)
    a_b = np.array(list(chain.from_iterable(bellman.advantages)), dtype=np.float64)
    gated = np.array(list(chain.from_iterable(bellman.gated)), dtype=bool)
    visits = np.array(list(chain.from_iterable(bellman.row_visits)), dtype=np.float64)
    gated_count = int(gated.sum())
    if params.bellman_norm == "std":
        sigma = mean_std(a_b[gated].tolist())[1]
    else:
        sigma = float(batch_sigma) if params.bellman_norm == "batch_std" else 0.0
    # σ_min keeps Â^B from blowing up
    denominator = max(sigma, params.bellman_std_floor) + params.eps if params.bellman_norm != "none" else 1.0
    weight = np.minimum(1.0, visits / params.mixing_n0) if params.bepo_mixing == "visits" else 1.0
    fused = np.where(gated, a_e + weight * a_b / denominator, a_e).tolist()  # A = A^GRPO + g·w·A^B/(σ + ε)
    advantages: StepAdvantages = []
    offset = 0
    for row in episode:
        advantages.append(fused[offset : offset + len(row)])
        offset += len(row)

    rows = len(fused)
    stats = {
        "num_states": len(bellman.values),
        "gated_row_fraction": gated_count / rows if rows else 0.0,
        "bellman_std": sigma if gated_count else 0.0,
    }
    return advantages, stats


def pooled_std(totals: tuple[float, float, float]) -> float:
    """Bessel std from (Σx, Σx², n) (the batch's gated A^B, summed over processes); 0 for n < 2.

    >>> round(pooled_std((3.0, 5.0, 2.0)), 4)  # x = [1, 2]: std = 0.7071
    0.7071
    """
    total, squares, count = totals
    if count < 2:
        return 0.0
    mean = total / count
    return math.sqrt(max(squares - count * mean * mean, 0.0) / (count - 1))

