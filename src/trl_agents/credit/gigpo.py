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

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from ..trajectory import Group
from .base import (STATISTICS, AnchorParams, Stats, StepAdvantages, anchor_key, batch_result, check_choice,
                   check_finite, check_group, check_positive, discounted_returns, episode_advantages, mean_std,
                   normalize, register_estimator, runtime_field)

GIGPO_METRICS = ("mean_anchor_group_size", "singleton_anchor_fraction")
GIGPO_STATS = ("num_anchor_groups", *GIGPO_METRICS)


@dataclass(frozen=True, kw_only=True)
class GiGPOParams(AnchorParams):
    """Settings of `gigpo_advantages` (config fields of `GiGPOConfig`).

    Attributes:
        gamma: Discount γ of the step returns (verl-agent scripts: 0.95; its config default 1.0 is a trap).
        step_advantage_w: Weight ω of the step-level advantage.
        gigpo_mode: "mean_norm" (F = 1, verl-agent config default, WebShop) or "mean_std_norm" (F = σ + ε, ALFWorld).
        episode_statistic: Population of the episode-level statistic: "step_rows" (verl-agent, hard-coded
            `compute_mean_std_cross_steps=True`; longer episodes weigh more) or "trajectories" (paper Eq. 3). A
            population of exactly one element gets μ = 0, σ = 1, as in verl-agent. Invalid-action penalty: in the
            score before the statistic for "step_rows", subtracted after normalisation for "trajectories"
            (docs/concepts/verl_agent_conventions.md#invalid-actions-and-their-penalty; `trl_agents.credit.base`).
        anchor, similarity_threshold: What identifies a state (`AnchorParams`).
        invalid_action_penalty: λ, for steps with `valid=False`; enters both A^E and the step return ρ.
        eps: ε of `mean_std_norm` (verl-agent: 1e-6); not a config field.
    """

    gamma: float = 0.95
    step_advantage_w: float = 1.0
    gigpo_mode: str = "mean_norm"
    episode_statistic: str = "step_rows"
    eps: float = runtime_field(1e-6)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("mode", self.gigpo_mode, ("mean_norm", "mean_std_norm"))
        check_choice("statistic", self.episode_statistic, STATISTICS)
        check_finite(gamma=self.gamma, omega=self.step_advantage_w)
        check_positive("eps", self.eps)


@register_estimator("gigpo", GiGPOParams, metrics=GIGPO_METRICS)
def gigpo_advantages(groups: Sequence[Group], params: GiGPOParams) -> tuple[list[StepAdvantages], Stats]:
    """GiGPO advantages A = A^E + ω·A^S for every step of every trajectory of every group.

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats over the groups
        that have steps (anchor groups): "num_anchor_groups" (anchor groups, i.e. clusters, per group),
        "mean_anchor_group_size" (step rows per anchor group) and "singleton_anchor_fraction" (fraction of the
        anchor groups that hold one step row: their A^S is 0). A trainer logs the last two.

    Example (the toy group of docs/methods/gigpo.md#hand-computed-case: A, D: s0→s1→success; B: s0→s1→fail;
    C: s0→s2→fail):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(second_state, reward):
        ...     return Trajectory(task={}, steps=[Step("s0", "a"), Step(second_state, "b", reward=reward)])
        >>> group = Group(task={}, trajectories=[episode("s1", 1), episode("s1", 0), episode("s2", 0), episode("s1", 1)])
        >>> (advantages,), stats = gigpo_advantages([group], GiGPOParams(gamma=0.5))
        >>> [[round(a, 4) for a in row] for row in advantages]
        [[0.75, 0.8333], [-0.75, -1.1667], [-0.75, -0.5], [0.75, 0.8333]]
        >>> stats["num_anchor_groups"]  # s0, s1, s2 in the one group
        (3, 1)
    """
    results = (gigpo_group(group, params) for group in groups)
    return batch_result(results, GIGPO_STATS, counted=lambda stats: stats["num_anchor_groups"])


def gigpo_group(group: Group, params: GiGPOParams, omega: float | None = None) -> tuple[StepAdvantages, dict]:
    """GiGPO on one group (the body of `gigpo_advantages`, for estimators built on it): the advantages, and the
    group's anchor diagnostics (`GIGPO_STATS`; all 0 for a group without steps). `omega` replaces
    `params.step_advantage_w` when given."""
    check_group(group)
    omega = params.step_advantage_w if omega is None else omega
    scale = params.gigpo_mode == "mean_std_norm"
    penalty, eps = params.invalid_action_penalty, params.eps

    # Eq. 3: episode-level advantage A^E (verl-agent: a population of one gets mean 0, std 1).
    episode = episode_advantages(
        group, scale=scale, statistic=params.episode_statistic, invalid_penalty=penalty, eps=eps,
        singleton_stats=(0.0, 1.0),
    )

    # Eq. 5: discounted step returns, then the local invalid-action penalty ρ = R_t − λ·[invalid].
    # Rows are flattened trajectory by trajectory, step by step.
    step_returns: list[float] = []
    anchors: list[Hashable] = []
    for traj in group.trajectories:
        returns = discounted_returns([step.reward for step in traj.steps], params.gamma)
        for step, ret in zip(traj.steps, returns, strict=True):
            step_returns.append(ret - penalty if not step.valid else ret)
            anchors.append(anchor_key(step, params.anchor))

    # Eq. 6: anchor-state groups G^S(s), as lists of row indices.
    if params.similarity_threshold is not None:
        anchors = cluster_similar_texts(anchors, params.similarity_threshold)
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
        "singleton_anchor_fraction": singletons / num_groups if num_groups else 0.0,
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
