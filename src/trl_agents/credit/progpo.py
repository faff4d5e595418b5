"""ProGPO advantages: exact-prefix peer comparison plus potential-based transition credit.

ProGPO (Fan & Liu 2026, arXiv 2607.04242). Only the abstract was available; the formalisation is ours, in
docs/methods/progpo.md ([P] = abstract, [D] = our design, built on HGPO's history-context groups):

    R_{i,t}     = Σ_{k≥t} γ^{k−t} r_{i,k}                         discounted step return
    ρ_{i,t}     = R_{i,t} − λ·[invalid_{i,t}]                     invalid-action penalty, local to the step
    A^E_{i,t}   = (R_i − μ)/F                                     episode level (GRPO)                 step 5 [D]
    G_full(i,t) = {(j,t) : h_{j,t} = h_{i,t}}                     same exact interaction prefix        step 1 [P]
    A^peer_{i,t}= (ρ_{i,t} − μ_{G_full})/F  if |G_full| ≥ 2, else 0                                    step 1 [P]
    C_k(s_t)    = (s_{t−k}, …, s_t),  k = 0..min(K, t)            HGPO history contexts (anchor states)
    Φ̂_k(s_t)    = (succ_k + 1)/(n_k + 2)   (or succ_k/n_k)         success rate of the context           step 2 [D]
    Var_k       = Φ̂_k(1 − Φ̂_k)/n_k + ε₀                                                                 step 2 [D]
    Φ(s_t)      = Σ_k Φ̂_k/Var_k ÷ Σ_k 1/Var_k                     inverse-variance fusion across depths step 2 [P]
    A^tr_{i,t}  = γ·Φ(s_{t+1}) − Φ(s_t),   Φ(after the last step) = 1[success_i]                       step 4 [P]
    A_{i,t}     = A^E_{i,t} + w_p·A^peer_{i,t} + w_tr·A^tr_{i,t}/σ_tr                                  step 5 [D]

h_{i,t} is everything the policy saw before acting at t: (o_0, a_0, …, o_{t−1}, a_{t−1}, o_t), with a = the
canonical action (`canonical_action`); `prefix="actions"` compares the action sequence only. n_k and succ_k count the
step rows of the group whose depth-k context is C_k(s_t) and those of them in successful episodes. F = 1
("mean_norm") or σ + ε ("mean_std_norm", Bessel std). σ_tr is the std of the transition credits (the trainer passes
the batch's, over the groups with outcome contrast; this per-group function uses the group's when it gets none); when
it is 0, σ_tr = 1.

Documented behaviour: a group whose episodes all have the same outcome gets A^tr ≡ 0 (its potentials carry no
contrast; unsmoothed they would be the constant outcome, giving the same (γ−1)·outcome on every step, smoothed
they would reflect visit counts only). All-equal rewards therefore give A ≡ 0 (minus λ on invalid steps). The
paper's semantic expansion (step 3: merging anchors by embedding similarity) is not implemented.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ..trajectory import Group
from .base import (
    StepAdvantages,
    anchor_key,
    canonical_action,
    check_choice,
    check_group,
    discounted_returns,
    episode_advantages,
    mean_std,
    normalize,
    register_estimator,
)

MODES = ("mean_norm", "mean_std_norm")
PREFIXES = ("interaction", "actions")
ANCHORS = ("state_key", "observation")
"""`step.info` keys holding the environment's parsed action, in order of preference ("command": ALFWorld)."""








def fuse_inverse_variance(estimates: Sequence[tuple[float, float]]) -> float:
    """Inverse-variance weighted mean Σ_k x_k/v_k ÷ Σ_k 1/v_k of (estimate x_k, variance v_k > 0) pairs.

    docs/methods/progpo.md#hand-computed-case: Φ̂_0 = 0.6 (n=10, Var 0.024) and Φ̂_1 = 0.9 (n=2, Var 0.045):
        >>> round(fuse_inverse_variance([(0.6, 0.024), (0.9, 0.045)]), 4)
        0.7043
    """
    if not estimates:
        raise ValueError("fuse_inverse_variance needs at least one (estimate, variance) pair")
    numerator = denominator = 0.0
    for estimate, variance in estimates:
        if not variance > 0:
            raise ValueError(f"variances must be > 0, got {variance}")
        numerator += estimate / variance
        denominator += 1.0 / variance
    return numerator / denominator


@dataclass
class ProGPOParts:
    """The three credit terms of one group, before they are weighted and summed (`combine_parts`).

    Attributes:
        episode: A^E, one row per trajectory (it includes the invalid-action penalty).
        peer: A^peer (exact-prefix peer comparison), 0 where the prefix is unshared.
        transition: A^tr = γΦ(s_{t+1}) − Φ(s_t), not yet divided by σ_tr.
        potentials: Φ(s_t) of every step row.
        stats: Diagnostics (see `progpo_parts`).
    """

    episode: StepAdvantages
    peer: StepAdvantages
    transition: StepAdvantages
    potentials: StepAdvantages
    stats: dict[str, float] = field(default_factory=dict)


def progpo_parts(
    group: Group,
    *,
    gamma: float = 0.95,
    mode: str = "mean_std_norm",
    statistic: str = "trajectories",
    prefix: str = "interaction",
    anchor: str = "state_key",
    max_depth: int = 2,
    smoothing: bool = True,
    variance_floor: float = 1e-4,
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> ProGPOParts:
    """A^E, A^peer, A^tr and Φ for every step of `group` (see the module docstring for the equations).

    Args:
        group: The healthy trajectories of one task.
        gamma: γ of the step returns and of the potential difference γΦ(s') − Φ(s).
        mode: "mean_std_norm" (F = σ + ε; HGPO z-scores its groups) or "mean_norm" (F = 1), for A^E and A^peer.
        statistic: Population of the A^E statistic, "trajectories" (GRPO) or "step_rows" (verl-agent); see
            `trl_agents.credit.base` for where the invalid-action penalty enters.
        prefix: "interaction": peers share every observation and canonical action before the step, and the current
            observation; "actions": the canonical actions before the step only.
        anchor: State identity of the potentials: "state_key" (the observation text when a step has none) or
            "observation".
        max_depth: K, the deepest history context C_K(s_t) = (s_{t−K}, …, s_t) fused into Φ.
        smoothing: Beta(1, 1) prior on each success rate, Φ̂ = (succ + 1)/(n + 2); False gives succ/n.
        variance_floor: ε₀ added to each Var_k (> 0: a context with Φ̂ ∈ {0, 1} would have variance 0).
        invalid_penalty: λ, for steps with `valid=False`; in A^E and in the peer returns ρ.
        eps: ε of `mean_std_norm`.

    Returns:
        `ProGPOParts`, with stats {"prefix_groups": number of distinct prefixes, "peer_fraction": fraction of step
        rows with at least one peer, "mean_prefix_group_size": rows per prefix, "outcome_contrast": 1 when the
        group has both successful and failed episodes (else A^tr ≡ 0), "mean_potential": mean Φ over the rows,
        "num_rows": step rows}.
    """
    check_choice("mode", mode, MODES)
    check_choice("prefix", prefix, PREFIXES)
    check_choice("anchor", anchor, ANCHORS)
    check_group(group, invalid_penalty)
    if not (math.isfinite(gamma) and 0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be an integer >= 0, got {max_depth!r}")
    if not (math.isfinite(variance_floor) and variance_floor > 0):
        raise ValueError(f"variance_floor must be > 0, got {variance_floor}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    scale = mode == "mean_std_norm"
    trajectories = group.trajectories

    # Step 5, first term: A^E (GRPO episode advantage; a group of one gets 0).
    episode = episode_advantages(group, scale=scale, statistic=statistic, invalid_penalty=invalid_penalty, eps=eps)

    # Step 1: exact-prefix peer groups G_full, as prefix ids of a trie (h_t = h_{t−1} + (a_{t−1}, o_t)), so that
    # equal histories get equal ids in O(1) per step.
    trie: dict[tuple, int] = {}
    peers: dict[int, list[tuple[int, int]]] = {}
    returns: list[list[float]] = []
    for i, traj in enumerate(trajectories):
        rho = discounted_returns([step.reward for step in traj.steps], gamma)
        returns.append([r - invalid_penalty if not step.valid else r for r, step in zip(rho, traj.steps, strict=True)])
        node = -1  # the empty history
        for t, step in enumerate(traj.steps):
            if t == 0:
                edge = (node, None, step.observation if prefix == "interaction" else None)
            else:
                observation = step.observation if prefix == "interaction" else None
                edge = (node, canonical_action(traj.steps[t - 1]), observation)
            node = trie.setdefault(edge, len(trie))
            peers.setdefault(node, []).append((i, t))
    peer = [[0.0] * len(traj.steps) for traj in trajectories]
    for rows in peers.values():
        if len(rows) < 2:
            continue  # no peer: A^peer = 0
        values = [returns[i][t] for i, t in rows]
        mean, std = mean_std(values)
        for (i, t), a in zip(rows, normalize(values, mean, std, scale=scale, eps=eps), strict=True):
            peer[i][t] = a

    # Step 2: potentials Φ(s_t), fused over the history contexts C_k(s_t), k = 0..min(K, t). Anchors are interned
    # as integers; a context is the tuple of its k + 1 anchor ids (its length is its depth, so one table holds all).
    outcomes = [1.0 if traj.success else 0.0 for traj in trajectories]
    interned: dict[Hashable, int] = {}
    try:
        anchors = [[interned.setdefault(anchor_key(step, anchor), len(interned)) for step in traj.steps]
                   for traj in trajectories]
    except TypeError as err:
        raise ValueError(f"ProGPO anchors must be hashable: {err}") from None
    contexts = [[[tuple(row[t - k : t + 1]) for k in range(min(max_depth, t) + 1)] for t in range(len(row))]
                for row in anchors]
    counts: dict[tuple[int, ...], list[float]] = {}  # context -> [visits n, successes]
    for outcome, row in zip(outcomes, contexts, strict=True):
        for keys in row:
            for key in keys:
                tally = counts.setdefault(key, [0, 0.0])
                tally[0] += 1
                tally[1] += outcome
    potentials: StepAdvantages = []
    for row in contexts:
        values = []
        for keys in row:
            estimates = []
            for key in keys:
                n, successes = counts[key]
                phi = (successes + 1.0) / (n + 2.0) if smoothing else successes / n
                estimates.append((phi, phi * (1.0 - phi) / n + variance_floor))
            values.append(fuse_inverse_variance(estimates))
        potentials.append(values)

    # Step 4: transition credit γΦ(s_{t+1}) − Φ(s_t); after the last step Φ = the episode's outcome (a time-out is
    # a failure). Without outcome contrast the group gets none (module docstring).
    contrast = len({outcome for outcome, row in zip(outcomes, anchors, strict=True) if row}) > 1
    transition: StepAdvantages = []
    for outcome, phis in zip(outcomes, potentials, strict=True):
        following = [*phis[1:], outcome] if phis else []
        transition.append([gamma * nxt - cur if contrast else 0.0 for cur, nxt in zip(phis, following, strict=True)])

    num_rows = sum(len(row) for row in anchors)
    stats = {
        "prefix_groups": float(len(peers)),
        "peer_fraction": sum(len(r) for r in peers.values() if len(r) > 1) / num_rows if num_rows else 0.0,
        "mean_prefix_group_size": num_rows / len(peers) if peers else 0.0,
        "outcome_contrast": float(contrast),
        "mean_potential": sum(sum(row) for row in potentials) / num_rows if num_rows else 0.0,
        "num_rows": float(num_rows),
    }
    return ProGPOParts(episode, peer, transition, potentials, stats)


def transition_scale(transitions: Sequence[float]) -> float:
    """σ_tr: the Bessel std of the transition credits, or 1 when it is 0 (no spread: nothing to rescale).

    >>> transition_scale([0.5, -0.5]), transition_scale([0.25, 0.25])
    (0.7071067811865476, 1.0)
    """
    _, std = mean_std(list(transitions))
    return std if std > 0 else 1.0


def combine_parts(
    parts: ProGPOParts, *, peer_weight: float = 1.0, transition_weight: float = 1.0, scale: float = 1.0
) -> StepAdvantages:
    """Step 5: A = A^E + w_p·A^peer + w_tr·A^tr/σ_tr, with σ_tr = `scale` (> 0)."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"the transition scale must be finite and > 0, got {scale}")
    return [
        [e + peer_weight * p + transition_weight * tr / scale for e, p, tr in zip(*rows, strict=True)]
        for rows in zip(parts.episode, parts.peer, parts.transition, strict=True)
    ]


@register_estimator("progpo")
def progpo_advantages(
    group: Group,
    *,
    gamma: float = 0.95,
    peer_weight: float = 1.0,
    transition_weight: float = 1.0,
    transition_norm: str = "group",
    transition_std: float | None = None,
    mode: str = "mean_std_norm",
    statistic: str = "trajectories",
    prefix: str = "interaction",
    anchor: str = "state_key",
    max_depth: int = 2,
    smoothing: bool = True,
    variance_floor: float = 1e-4,
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> StepAdvantages:
    """ProGPO advantages A = A^E + w_p·A^peer + w_tr·A^tr/σ_tr for every step of every trajectory of `group`.

    Args:
        peer_weight, transition_weight: w_p and w_tr.
        transition_norm: σ_tr: "group" (std of this group's transition credits), "none" (1). The trainer's "batch"
            (our default, docs/methods/progpo.md#our-choices) passes the batch std as `transition_std`, which
            overrides this.
        transition_std: σ_tr given by the caller (> 0), or None.
        The other arguments are those of `progpo_parts`.

    Example (docs/methods/progpo.md#hand-computed-case; the GiGPO toy: A, D: s0 -a-> s1 -b-> success;
    B: s0 -a-> s1 -c-> fail; C: s0 -d-> s2 -e-> fail; γ = 1, F = 1, K = 0, no smoothing, σ_tr = 1):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(state, first, second, won):
        ...     steps = [Step("s0", first), Step(state, second, reward=float(won), done=True)]
        ...     return Trajectory(task={}, steps=steps, success=won)
        >>> group = Group(task={}, trajectories=[episode("s1", "a", "b", True), episode("s1", "a", "c", False),
        ...                                      episode("s2", "d", "e", False), episode("s1", "a", "b", True)])
        >>> options = dict(gamma=1.0, mode="mean_norm", max_depth=0, smoothing=False, transition_norm="none")
        >>> [[round(a, 4) for a in row] for row in progpo_advantages(group, **options)]
        [[1.1667, 1.1667], [-0.8333, -1.8333], [-1.5, -0.5], [1.1667, 1.1667]]
    """
    check_choice("transition_norm", transition_norm, ("group", "none"))
    parts = progpo_parts(
        group,
        gamma=gamma,
        mode=mode,
        statistic=statistic,
        prefix=prefix,
        anchor=anchor,
        max_depth=max_depth,
        smoothing=smoothing,
        variance_floor=variance_floor,
        invalid_penalty=invalid_penalty,
        eps=eps,
    )
    if transition_std is not None:
        scale = transition_std
    elif transition_norm == "group":
        scale = transition_scale([v for row in parts.transition for v in row])
    else:
        scale = 1.0
    return combine_parts(parts, peer_weight=peer_weight, transition_weight=transition_weight, scale=scale)
