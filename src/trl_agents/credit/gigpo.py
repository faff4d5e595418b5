"""GiGPO advantages: an episode-level group advantage plus a step-level one among steps taken from the same state.

GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978), with the
semantics of the reference code (verl-agent `gigpo/core_gigpo.py`; docs/methods/gigpo.md#equations):

    A^E_{i,t} = (s − μ)/F                    Eq. 3   episode level; s = R_i − λ·[invalid], μ, σ over all step rows
                                                     of the group (verl-agent) or over the n episode returns (paper)
    R_{i,t}   = Σ_{k≥t} γ^{k−t} r_{i,k}     Eq. 5   discounted step return
    ρ_{i,t}   = R_{i,t} − λ·[invalid]               invalid-action penalty, local to the step, after discounting
    G^S(s)    = {(j,k): anchor_{j,k} = s}    Eq. 6   anchor-state groups (exact key, or greedy text similarity)
    A^S_{i,t} = (ρ_{i,t} − μ_c)/F            Eq. 7   step level, μ_c, σ_c over the anchor group c of the row
    A_{i,t}   = A^E_{i,t} + ω·A^S_{i,t}      Eq. 8

with F = 1 (`mode="mean_norm"`) or F = σ + ε (`mode="mean_std_norm"`, Bessel std), the same mode at both levels.
A singleton anchor group gives A^S = 0; when no state repeats GiGPO reduces to GRPO (w/o or w/ std).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from difflib import SequenceMatcher

from ..trajectory import Group
from .base import (
    StepAdvantages,
    anchor_key,
    check_choice,
    check_group,
    discounted_returns,
    episode_advantages,
    mean_std,
    normalize,
    register_estimator,
)


@register_estimator("gigpo")
def gigpo_advantages(
    group: Group,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: str = "mean_norm",
    statistic: str = "step_rows",
    anchor: str = "state_key",
    similarity_threshold: float | None = None,
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> StepAdvantages:
    """GiGPO advantages A = A^E + ω·A^S for every step of every trajectory of `group`.

    See `gigpo_advantages_with_stats` for the arguments; this returns only the advantages.

    Example (the toy group of docs/methods/gigpo.md#hand-computed-case: A, D: s0→s1→success; B: s0→s1→fail;
    C: s0→s2→fail):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(second_state, reward):
        ...     return Trajectory(task={}, steps=[Step("s0", "a"), Step(second_state, "b", reward=reward)])
        >>> group = Group(task={}, trajectories=[episode("s1", 1), episode("s1", 0), episode("s2", 0), episode("s1", 1)])
        >>> [[round(a, 4) for a in row] for row in gigpo_advantages(group, gamma=0.5)]
        [[0.75, 0.8333], [-0.75, -1.1667], [-0.75, -0.5], [0.75, 0.8333]]
    """
    advantages, _ = gigpo_advantages_with_stats(
        group,
        gamma=gamma,
        omega=omega,
        mode=mode,
        statistic=statistic,
        anchor=anchor,
        similarity_threshold=similarity_threshold,
        invalid_penalty=invalid_penalty,
        eps=eps,
    )
    return advantages


def gigpo_advantages_with_stats(
    group: Group,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: str = "mean_norm",
    statistic: str = "step_rows",
    anchor: str = "state_key",
    similarity_threshold: float | None = None,
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> tuple[StepAdvantages, dict[str, float]]:
    """GiGPO advantages plus anchor-group diagnostics.

    Args:
        group: The healthy trajectories of one task.
        gamma: Discount γ of the step returns (verl-agent scripts: 0.95; its config default 1.0 is a trap).
        omega: Weight ω of the step-level advantage (`step_advantage_w`).
        mode: "mean_norm" (F = 1, verl-agent config default, WebShop) or "mean_std_norm" (F = σ + ε, ALFWorld).
        statistic: Population of the episode-level statistic: "step_rows" (verl-agent, hard-coded
            `compute_mean_std_cross_steps=True`; longer episodes weigh more) or "trajectories" (paper Eq. 3). A
            population of exactly one element gets μ = 0, σ = 1, as in verl-agent. Invalid-action penalty: in the
            score before the statistic for "step_rows", subtracted after normalisation for "trajectories"
            (docs/concepts/verl_agent_conventions.md#invalid-actions-and-their-penalty; `trl_agents.credit.base`).
        anchor: What identifies a state: "state_key" (`step.state_key`, or `step.observation` when it is None) or
            "observation" (the raw current observation text, like verl-agent's `anchor_obs`).
        similarity_threshold: None for exact keys. A value in (0, 1) clusters text anchors greedily: a row joins the
            FIRST cluster whose first member has `SequenceMatcher(None, row, first).ratio() >= threshold`, else it
            opens a new cluster (verl-agent `enable_similarity`; its default threshold is 0.95). O(rows²).
        invalid_penalty: λ, for steps with `valid=False`; enters both A^E and the step return ρ.
        eps: ε of `mean_std_norm` (verl-agent: 1e-6).

    Returns:
        (advantages, stats): one list per trajectory with one advantage per step, and
        {"num_anchor_groups": number of anchor groups (clusters) in the group, "mean_anchor_group_size": step rows
        per anchor group, "singleton_fraction": fraction of the anchor groups that hold one step row (their A^S is
        0)}; all 0 for a group without steps.
    """
    check_choice("mode", mode, ("mean_norm", "mean_std_norm"))
    check_choice("anchor", anchor, ("state_key", "observation"))
    check_group(group, invalid_penalty)
    for name, value in (("gamma", gamma), ("omega", omega)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if similarity_threshold is not None and not 0.0 < similarity_threshold < 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1) or None, got {similarity_threshold}")
    scale = mode == "mean_std_norm"
    penalty = invalid_penalty

    # Eq. 3: episode-level advantage A^E (verl-agent: a population of one gets mean 0, std 1).
    episode = episode_advantages(
        group, scale=scale, statistic=statistic, invalid_penalty=penalty, eps=eps, singleton_stats=(0.0, 1.0)
    )

    # Eq. 5: discounted step returns, then the local invalid-action penalty ρ = R_t − λ·[invalid].
    # Rows are flattened trajectory by trajectory, step by step.
    step_returns: list[float] = []
    anchors: list[Hashable] = []
    for traj in group.trajectories:
        returns = discounted_returns([step.reward for step in traj.steps], gamma)
        for step, ret in zip(traj.steps, returns, strict=True):
            step_returns.append(ret - penalty if not step.valid else ret)
            anchors.append(anchor_key(step, anchor))

    # Eq. 6: anchor-state groups G^S(s), as lists of row indices.
    if similarity_threshold is not None:
        anchors = cluster_similar_texts(anchors, similarity_threshold)
    anchor_groups: dict[Hashable, list[int]] = {}
    try:
        for row, key in enumerate(anchors):
            anchor_groups.setdefault(key, []).append(row)
    except TypeError as err:
        raise ValueError(f"GiGPO anchors must be hashable (got {type(key).__name__}): {err}") from None

    # Eq. 7: step-level advantage A^S within each anchor group; a singleton group keeps A^S = 0 (μ_c = ρ).
    step_advantages = [0.0] * len(step_returns)
    singletons = 0
    for rows in anchor_groups.values():
        if len(rows) == 1:
            singletons += 1
            continue
        values = [step_returns[r] for r in rows]
        mean, std = mean_std(values)
        for r, a in zip(rows, normalize(values, mean, std, scale=scale, eps=eps), strict=True):
            step_advantages[r] = a

    # Eq. 8: A = A^E + ω·A^S.
    advantages: StepAdvantages = []
    offset = 0
    for episode_row in episode:
        advantages.append([a_e + omega * step_advantages[offset + t] for t, a_e in enumerate(episode_row)])
        offset += len(episode_row)

    num_groups = len(anchor_groups)
    stats = {
        "num_anchor_groups": num_groups,
        "mean_anchor_group_size": len(step_returns) / num_groups if num_groups else 0.0,
        "singleton_fraction": singletons / num_groups if num_groups else 0.0,
    }
    return advantages, stats




def cluster_similar_texts(texts: list[Hashable], threshold: float) -> list[int]:
    """Greedy clustering (verl-agent `build_step_group` with `enable_similarity`): the cluster index of each text.

    A text joins the first cluster whose representative (first member) is at least `threshold` similar, else it
    opens a new cluster. Clusters are only ever appended, so a text seen before lands in the same cluster again:
    the cache below changes nothing but the cost.
    """
    representatives: list[str] = []
    cluster_of: dict[str, int] = {}
    labels: list[int] = []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(
                f"similarity_threshold needs text anchors, got {type(text).__name__}; use anchor='observation' "
                "or exact keys (similarity_threshold=None)"
            )
        label = cluster_of.get(text)
        if label is None:
            for index, representative in enumerate(representatives):
                if SequenceMatcher(None, text, representative).ratio() >= threshold:
                    label = index
                    break
            else:
                label = len(representatives)
                representatives.append(text)
            cluster_of[text] = label
        labels.append(label)
    return labels
