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
from .base import (STATISTICS, CreditParams, Stats, StepAdvantages, anchor_key, canonical_action, check_choice,
                   check_group, check_positive, discounted_returns, episode_advantages, group_totals, mean_std,
                   normalize, register_estimator, runtime_field)

MODES = ("mean_norm", "mean_std_norm")
PREFIXES = ("interaction", "actions")
ANCHORS = ("state_key", "observation")
TRANSITION_NORMS = ("batch", "group", "none")
PROGPO_STATS = ("peer_fraction", "mean_prefix_group_size", "outcome_contrast", "mean_potential", "transition_std")
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


@dataclass(frozen=True, kw_only=True)
class ProGPOParams(CreditParams):
    """Settings of `progpo_advantages` and `progpo_parts` (config fields of `ProGPOConfig`).

    Attributes:
        gamma: γ of the step returns and of the potential difference γΦ(s') − Φ(s).
        peer_weight, transition_weight: w_p and w_tr.
        transition_norm: σ_tr: "batch" (std of the transition credits over the groups of the call with outcome
            contrast, the only ones with transition credit, summed over the processes with `sum_over_processes`;
            docs/methods/progpo.md#our-choices), "group" (std of each group's transition credits) or "none" (1). A
            std of 0 counts as 1.
        progpo_mode: "mean_std_norm" (F = σ + ε; HGPO z-scores its groups) or "mean_norm" (F = 1), for A^E and
            A^peer.
        episode_statistic: Population of the A^E statistic, "trajectories" (GRPO) or "step_rows" (verl-agent); see
            `trl_agents.credit.base` for where the invalid-action penalty enters.
        prefix: "interaction": peers share every observation and canonical action before the step, and the current
            observation; "actions": the canonical actions before the step only.
        anchor: State identity of the potentials: "state_key" (the observation text when a step has none) or
            "observation".
        potential_depth: K, the deepest history context C_K(s_t) = (s_{t−K}, …, s_t) fused into Φ.
        potential_smoothing: Beta(1, 1) prior on each success rate, Φ̂ = (succ + 1)/(n + 2); False gives succ/n.
        potential_variance_floor: ε₀ added to each Var_k (> 0: a context with Φ̂ ∈ {0, 1} would have variance 0).
        invalid_action_penalty: λ, for steps with `valid=False`; in A^E and in the peer returns ρ.
        transition_std: Run-time input: σ_tr given by the caller (> 0), which overrides `transition_norm`; None.
        eps: ε of `mean_std_norm`; not a config field.
    """

    gamma: float = 0.95
    peer_weight: float = 1.0
    transition_weight: float = 1.0
    transition_norm: str = "group"
    progpo_mode: str = "mean_std_norm"
    episode_statistic: str = "trajectories"
    prefix: str = "interaction"
    anchor: str = "state_key"
    potential_depth: int = 2
    potential_smoothing: bool = True
    potential_variance_floor: float = 1e-4
    transition_std: float | None = runtime_field()
    eps: float = runtime_field(1e-6)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("mode", self.progpo_mode, MODES)
        check_choice("prefix", self.prefix, PREFIXES)
        check_choice("anchor", self.anchor, ANCHORS)
        check_choice("transition_norm", self.transition_norm, TRANSITION_NORMS)
        check_choice("statistic", self.episode_statistic, STATISTICS)
        if not (math.isfinite(self.gamma) and 0.0 <= self.gamma <= 1.0):
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        depth = self.potential_depth
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"max_depth must be an integer >= 0, got {depth!r}")
        floor = self.potential_variance_floor
        if not (math.isfinite(floor) and floor > 0):
            raise ValueError(f"variance_floor must be > 0, got {floor}")
        check_positive("eps", self.eps)
        if self.transition_std is not None:
            _check_scale(self.transition_std)


def _check_scale(scale: float) -> None:
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"the transition scale must be finite and > 0, got {scale}")


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


def progpo_parts(group: Group, params: ProGPOParams) -> ProGPOParts:
    """A^E, A^peer, A^tr and Φ for every step of `group` (see the module docstring for the equations).

    Returns:
        `ProGPOParts`, with stats {"prefix_groups": number of distinct prefixes, "peer_fraction": fraction of step
        rows with at least one peer, "mean_prefix_group_size": rows per prefix, "outcome_contrast": 1 when the
        group has both successful and failed episodes (else A^tr ≡ 0), "mean_potential": mean Φ over the rows,
        "num_rows": step rows}.
    """
    check_group(group)
    gamma, mode, statistic, prefix, anchor, max_depth, smoothing, variance_floor, invalid_penalty, eps = (
        params.gamma, params.progpo_mode, params.episode_statistic, params.prefix, params.anchor,
        params.potential_depth, params.potential_smoothing, params.potential_variance_floor,
        params.invalid_action_penalty, params.eps,
    )
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
    _check_scale(scale)
    return [
        [e + peer_weight * p + transition_weight * tr / scale for e, p, tr in zip(*rows, strict=True)]
        for rows in zip(parts.episode, parts.peer, parts.transition, strict=True)
    ]


@register_estimator("progpo", ProGPOParams)
def progpo_advantages(groups: Sequence[Group], params: ProGPOParams) -> tuple[list[StepAdvantages], Stats]:
    """ProGPO advantages A = A^E + w_p·A^peer + w_tr·A^tr/σ_tr for every step of every trajectory of every group.

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats over the groups
        with steps: "peer_fraction", "mean_prefix_group_size", "outcome_contrast", "mean_potential" (see
        `progpo_parts`) and "transition_std" (the σ_tr the group's transition credit was divided by).

    Example (docs/methods/progpo.md#hand-computed-case; the GiGPO toy: A, D: s0 -a-> s1 -b-> success;
    B: s0 -a-> s1 -c-> fail; C: s0 -d-> s2 -e-> fail; γ = 1, F = 1, K = 0, no smoothing, σ_tr = 1):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(state, first, second, won):
        ...     steps = [Step("s0", first), Step(state, second, reward=float(won), done=True)]
        ...     return Trajectory(task={}, steps=steps, success=won)
        >>> group = Group(task={}, trajectories=[episode("s1", "a", "b", True), episode("s1", "a", "c", False),
        ...                                      episode("s2", "d", "e", False), episode("s1", "a", "b", True)])
        >>> params = ProGPOParams(gamma=1.0, progpo_mode="mean_norm", potential_depth=0, potential_smoothing=False,
        ...                       transition_norm="none")
        >>> (advantages,), _ = progpo_advantages([group], params)
        >>> [[round(a, 4) for a in row] for row in advantages]
        [[1.1667, 1.1667], [-0.8333, -1.8333], [-1.5, -0.5], [1.1667, 1.1667]]
    """
    parts = [progpo_parts(group, params) for group in groups]
    if params.transition_std is not None:
        scales = [params.transition_std] * len(parts)
    elif params.transition_norm == "batch":
        scales = [_batch_transition_std(parts, params)] * len(parts)
    elif params.transition_norm == "group":
        scales = [transition_scale([v for row in p.transition for v in row]) for p in parts]
    else:
        scales = [1.0] * len(parts)
    advantages = [
        combine_parts(p, peer_weight=params.peer_weight, transition_weight=params.transition_weight, scale=scale)
        for p, scale in zip(parts, scales, strict=True)
    ]
    with_rows = [{**p.stats, "transition_std": scale} for p, scale in zip(parts, scales, strict=True)
                 if p.stats["num_rows"]]
    return advantages, group_totals(with_rows, PROGPO_STATS)


def _batch_transition_std(parts: Sequence[ProGPOParts], params: ProGPOParams) -> float:
    """σ_tr over the step rows of the batch (every process, with `sum_over_processes`; two passes: mean, then
    squares), or 1 when it is 0 or has fewer than two values.

    Only groups with outcome contrast count: the others have A^tr ≡ 0, and in a batch of mostly all-failed groups
    (early training) their zeros would shrink σ_tr and inflate the credit of the rest (our choice).
    """
    values = [v for p in parts if p.stats["outcome_contrast"] for row in p.transition for v in row]
    count, value_sum = params.summed([float(len(values)), float(sum(values))])
    if count < 2:
        return 1.0
    mean = value_sum / count
    (squares,) = params.summed([float(sum((v - mean) ** 2 for v in values))])
    std = math.sqrt(squares / (count - 1))
    return std if std > 0 else 1.0
