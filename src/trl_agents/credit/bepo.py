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
the Bellman credit (to unit spread), never amplifies it. `bepo_batch_advantages` takes σ_B over the whole batch, as
the paper's text says.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from itertools import chain, pairwise

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import spsolve

from ..trajectory import Group
from .base import StepAdvantages, canonical_action, check_choice, mean_std, register_estimator
from .ecpo import group_anchors
from .grpo import grpo_advantages

GATES = ("successors", "actions", "none")
MIXINGS = ("visits", "fixed")
BELLMAN_NORMS = ("batch_std", "std", "none")
"""Scale of the Bellman credit: σ_B over the gated rows of the batch (`bepo_batch_advantages`), of each group, or 1."""

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

    The arguments are those of `bepo_advantages_with_stats` (`lam` is the GAE λ). Raises a ValueError on non-finite
    rewards.

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
    check_choice("gate", gate, GATES)
    check_choice("anchor", anchor, ("state_key", "observation"))
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma (the discount β) must be in (0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam (the GAE λ) must be in [0, 1], got {lam}")
    if similarity_threshold is not None and not 0.0 < similarity_threshold < 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1) or None, got {similarity_threshold}")

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


def _distinct_per_anchor(anchors: np.ndarray, labels: np.ndarray, num_nodes: int) -> np.ndarray:
    """For each anchor 0..num_nodes−1, how many distinct non-negative `labels` its rows carry."""
    if not len(anchors):
        return np.zeros(num_nodes, dtype=np.int64)
    base = int(labels.max()) + 1
    pairs = np.unique(anchors * base + labels)  # one entry per distinct (anchor, label)
    return np.bincount(pairs // base, minlength=num_nodes)


@register_estimator("bepo")
def bepo_advantages(
    group: Group,
    *,
    gamma: float = 0.95,
    lam: float = 0.95,
    gate: str = "successors",
    mixing: str = "visits",
    n0: float = 4.0,
    bellman_norm: str = "std",
    std_floor: float = 1.0,
    episode_scale: str = "group",
    episode_statistic: str = "trajectories",
    anchor: str = "state_key",
    similarity_threshold: float | None = None,
    merge_invalid_actions: bool = True,
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> StepAdvantages:
    """Gated-BEPO advantages A = A^GRPO + g·w·Â^B for every step of every trajectory of `group`.

    See `bepo_advantages_with_stats` for the arguments; this returns only the advantages.

    Example (the toy group of docs/methods/bepo.md, β = λ = 1, the bare σ_B = √(5/18) without the floor; the gate of
    s2 is closed, so C's last step keeps A^GRPO):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(second_state, reward):
        ...     steps = [Step("s0", "a"), Step(second_state, "b", reward=reward)]
        ...     return Trajectory(task={}, steps=steps, success=reward > 0)
        >>> group = Group(task={}, trajectories=[episode(*c) for c in [("s1", 1), ("s1", 0), ("s2", 0), ("s1", 1)]])
        >>> [[round(a, 4) for a in row] for row in bepo_advantages(group, gamma=1.0, lam=1.0, std_floor=0.0)]
        [[1.8146, 1.3402], [-1.8146, -1.8146], [-1.8146, -0.8659], [1.8146, 1.3402]]
        >>> [[round(a, 4) for a in row] for row in bepo_advantages(group, gamma=1.0, lam=1.0)]  # σ_min = 1 > σ_B
        [[1.3659, 1.1159], [-1.3659, -1.3659], [-1.3659, -0.8659], [1.3659, 1.1159]]
    """
    advantages, _ = bepo_advantages_with_stats(
        group,
        gamma=gamma,
        lam=lam,
        gate=gate,
        mixing=mixing,
        n0=n0,
        bellman_norm=bellman_norm,
        std_floor=std_floor,
        episode_scale=episode_scale,
        episode_statistic=episode_statistic,
        anchor=anchor,
        similarity_threshold=similarity_threshold,
        merge_invalid_actions=merge_invalid_actions,
        invalid_penalty=invalid_penalty,
        eps=eps,
    )
    return advantages


def bepo_advantages_with_stats(
    group: Group,
    *,
    gamma: float = 0.95,
    lam: float = 0.95,
    gate: str = "successors",
    mixing: str = "visits",
    n0: float = 4.0,
    bellman_norm: str = "std",
    std_floor: float = 1.0,
    bellman_sigma: float | None = None,
    episode_scale: str = "group",
    episode_statistic: str = "trajectories",
    anchor: str = "state_key",
    similarity_threshold: float | None = None,
    merge_invalid_actions: bool = True,
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> tuple[StepAdvantages, dict[str, float]]:
    """Gated-BEPO advantages plus graph diagnostics.

    Args:
        group: The healthy trajectories of one task.
        gamma: β ∈ (0, 1], discount of the backup, the TD residuals and the GAE (our choice 0.95, verl-agent's γ;
            CRBC used 0.98; docs/methods/bepo.md#our-choices).
        lam: GAE λ ∈ [0, 1] (our choice 0.95, step 5 [D]); 0 gives the one-step credit Q − V of CRBC, 1 gives the
            discounted return minus V(s_t).
        gate: "successors": open at anchors with ≥ 2 distinct observed successors, z⁺/z⁻ included (our choice,
            step 6 [D]); "actions": ≥ 2 distinct canonical actions (CRBC Eq. 13); "none": always open (the
            "+fixed-point credit" ablation).
        mixing: "visits": w = min(1, N(s)/n0) (our choice, step 7 [D] "adaptive mixing"); "fixed": w = 1.
        n0: Visits at which the Bellman credit gets full weight (our choice 4, step 7 [D]).
        bellman_norm: "batch_std": A^B divided by (max(σ_B, std_floor) + ε), σ_B = `bellman_sigma`, the Bessel std
            of A^B over the gated rows of the whole batch (`bepo_batch_advantages` computes it; without it, this
            group's); "std": the same with σ_B over this group's gated rows; "none": no division. Our choice,
            step 7 [D]; docs/methods/bepo.md#our-choices.
        std_floor: σ_min ≥ 0, the least σ_B divided by (our choice 1.0: the normalisation never amplifies the
            Bellman credit; 0 = the bare std, which blows up over a few nearly equal gated rows).
        bellman_sigma: σ_B of the batch for `bellman_norm="batch_std"`.
        episode_scale, episode_statistic: A^GRPO, as `grpo_advantages(scale=..., statistic=...)`.
        anchor, similarity_threshold: What identifies a graph node, as in `gigpo_advantages`.
        merge_invalid_actions: Treat every rejected action as one canonical action (only `gate="actions"` reads
            actions: in the mean backup μ(a|s)·P(x|s,a) sums to N(s→x)/N(s) whatever the action labels).
        invalid_penalty: λ, for steps with `valid=False`; enters A^GRPO only.
        eps: ε of the Bellman normalisation.

    Returns:
        (advantages, stats): one list per trajectory with one advantage per step, and {"num_states": graph nodes
        besides z⁺/z⁻, "gated_row_fraction": fraction of the step rows whose gate is open, "bellman_std": the σ_B
        divided by (before the floor; 0 when no row is gated)}; all 0 for a group without steps.
    """
    parts = bepo_parts(
        group, gamma=gamma, lam=lam, gate=gate, episode_scale=episode_scale, episode_statistic=episode_statistic,
        anchor=anchor, similarity_threshold=similarity_threshold, merge_invalid_actions=merge_invalid_actions,
        invalid_penalty=invalid_penalty,
    )
    if bellman_norm == "batch_std" and bellman_sigma is None:
        bellman_sigma = mean_std(parts.gated_values())[1]
    return fuse_bepo(parts, mixing=mixing, n0=n0, bellman_norm=bellman_norm, std_floor=std_floor,
                     bellman_sigma=bellman_sigma, eps=eps)


@dataclass(frozen=True)
class BEPOParts:
    """A group's GRPO episode advantages and its Bellman credit (steps 1-6), before the fusion of step 7."""

    episode: StepAdvantages
    bellman: BellmanCredit

    def gated_values(self) -> list[float]:
        """A^B of the gated rows."""
        return [value for values, gated in zip(self.bellman.advantages, self.bellman.gated, strict=True)
                for value, open_ in zip(values, gated, strict=True) if open_]


def bepo_parts(
    group: Group,
    *,
    gamma: float = 0.95,
    lam: float = 0.95,
    gate: str = "successors",
    episode_scale: str = "group",
    episode_statistic: str = "trajectories",
    anchor: str = "state_key",
    similarity_threshold: float | None = None,
    merge_invalid_actions: bool = True,
    invalid_penalty: float = 0.1,
) -> BEPOParts:
    """Steps 1-6 for one group: A^GRPO (with its invalid-action rule; it also rejects non-finite rewards and
    penalties) and the Bellman credit (graph, V, δ, A^B, gate)."""
    episode = grpo_advantages(group, scale=episode_scale, statistic=episode_statistic, invalid_penalty=invalid_penalty)
    bellman = bellman_credit(
        group, gamma=gamma, lam=lam, gate=gate, anchor=anchor, similarity_threshold=similarity_threshold,
        merge_invalid_actions=merge_invalid_actions,
    )
    return BEPOParts(episode, bellman)


def fuse_bepo(
    parts: BEPOParts,
    *,
    mixing: str = "visits",
    n0: float = 4.0,
    bellman_norm: str = "std",
    std_floor: float = 1.0,
    bellman_sigma: float | None = None,
    eps: float = 1e-6,
) -> tuple[StepAdvantages, dict[str, float]]:
    """Step 7: Â^B = A^B/(max(σ_B, σ_min) + ε) over the gated rows; A = A^GRPO + g·w·Â^B (see
    `bepo_advantages_with_stats` for the arguments and the returned stats)."""
    check_choice("mixing", mixing, MIXINGS)
    check_choice("bellman_norm", bellman_norm, BELLMAN_NORMS)
    if not (math.isfinite(n0) and n0 > 0):
        raise ValueError(f"n0 must be > 0, got {n0}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if not (math.isfinite(std_floor) and std_floor >= 0):
        raise ValueError(f"std_floor (bellman_std_floor) must be a finite number >= 0, got {std_floor}")
    episode, bellman = parts.episode, parts.bellman
    a_e = np.array(list(chain.from_iterable(episode)), dtype=np.float64)
    a_b = np.array(list(chain.from_iterable(bellman.advantages)), dtype=np.float64)
    gated = np.array(list(chain.from_iterable(bellman.gated)), dtype=bool)
    visits = np.array(list(chain.from_iterable(bellman.row_visits)), dtype=np.float64)
    gated_count = int(gated.sum())
    if bellman_norm == "std" or (bellman_norm == "batch_std" and bellman_sigma is None):
        sigma = mean_std(a_b[gated].tolist())[1]
    else:
        sigma = float(bellman_sigma) if bellman_norm == "batch_std" else 0.0
    denominator = max(sigma, std_floor) + eps if bellman_norm != "none" else 1.0  # σ_min keeps Â^B from blowing up
    weight = np.minimum(1.0, visits / n0) if mixing == "visits" else 1.0
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


def bepo_batch_advantages(
    groups: list[Group], *, reduce=None, **options
) -> tuple[list[StepAdvantages], list[dict[str, float]]]:
    """Gated-BEPO over a batch of groups with σ_B over the gated rows of all of them (`bellman_norm="batch_std"`).

    Args:
        groups: The batch's groups (on this process).
        reduce: Sums (Σx, Σx², n) over processes (the trainer's all-reduce), so σ_B is the whole batch's; None = this
            process's groups.
        options: As `bepo_advantages_with_stats` (`bellman_sigma` is computed here).

    Returns:
        (advantages per group, stats per group).
    """
    fuse_options = {key: options.pop(key) for key in ("mixing", "n0", "bellman_norm", "std_floor", "eps")
                    if key in options}
    parts = [bepo_parts(group, **options) for group in groups]
    sigma = None
    if fuse_options.get("bellman_norm", "std") == "batch_std":
        values = [value for part in parts for value in part.gated_values()]
        totals = (float(sum(values)), float(sum(v * v for v in values)), float(len(values)))
        sigma = pooled_std(reduce(totals) if reduce is not None else totals)
    results = [fuse_bepo(part, bellman_sigma=sigma, **fuse_options) for part in parts]
    return [advantages for advantages, _ in results], [stats for _, stats in results]
