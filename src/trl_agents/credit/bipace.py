"""BiPACE advantages: GiGPO's episode advantage plus a step advantage that compares actions among steps whose
states the policy itself represents alike.

BiPACE (Bisimulation-Guided Policy Optimization + Action Counterfactual Estimation, arXiv 2606.25556; spec and
provenance: docs/methods/bipace.md), built on verl-agent/GiGPO. For the steps (i, t) of ONE
group (the G episodes of one task), rows taken trajectory by trajectory, step by step:

    φ_{i,t}   = f_θ(s_{i,t}) / ‖f_θ(s_{i,t})‖₂              BiGPO: the policy's hidden state of the step prompt at a
                                                             late layer (−12 for 1.5B, −8 for 7B), unit norm
    d(φ, c)   = 1 − ⟨φ, c⟩                                   cosine distance to a cluster centroid c
    C(i,t)    = greedy single pass: join the nearest centroid if d ≤ ε, else open a new cluster
                (centroid: the re-normalised mean of the members' φ, or the first member's φ)
    ρ_{i,t}   = Σ_{k≥t} γ^{k−t} r_{i,k} − λ·[invalid_{i,t}]   step return (GiGPO Eq. 5, local invalid-action penalty)
    x_{i,t}   = action key (the canonical action, or the first 8 action tokens)
    Q̂(s, a)  = mean{ρ_j : j ∈ C, x_j = x(a)}                 PACE, same-action peers (the step included)
    V̂(s)     = mean{ρ_j : j ∈ C}
    Â^S_{i,t} = Q̂ − V̂                                        "q_style" (default)
              = ρ_{i,t} − mean{ρ_j : j ∈ C, x_j ≠ x_{i,t}}     "diff_peer" (0 when no peer took another action)
    A^ep      = GiGPO Eq. 3 episode advantage (mean_norm or mean_std_norm, over step rows or trajectories)
    A_{i,t}   = A^ep_{i,t} + w·Â^S_{i,t}

Consequences: a singleton cluster, a cluster where every member took the same action, or one whose members have equal
returns ρ gives Â^S = 0 exactly. So when every episode earns the same rewards at the same turns (all actions valid),
A^ep = 0 and every advantage is exactly 0 as long as no cluster mixes turns with different returns (always, for
all-zero rewards). Without hidden states the clusters are the exact state keys: GiGPO's special case ε = 0 with a
one-hot identity embedder (docs/methods/bipace.md#what-it-does).

Example (two states in 2-D, one taken twice with different actions):
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> group = Group(task={}, trajectories=[
    ...     Trajectory(task={}, steps=[Step("s", "<action>left</action>", reward=1.0)]),
    ...     Trajectory(task={}, steps=[Step("s", "<action>right</action>", reward=0.0)]),
    ...     Trajectory(task={}, steps=[Step("u", "<action>left</action>", reward=0.0)])])
    >>> params = BiPACEParams(hidden_states=[[[1.0, 0.0], [1.0, 0.01], [0.0, 1.0]]], cluster_epsilon=0.05)
    >>> (advantages,), _ = bipace_advantages([group], params)
    >>> [[round(a, 4) for a in row] for row in advantages]  # A^ep = R − 1/3, Â^S = ±0.5 in the cluster {s, s}
    [[1.1667], [-0.8333], [-0.3333]]
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..trajectory import Group, Step
from .base import (STATISTICS, CreditParams, Stats, StepAdvantages, batch_result, canonical_action, check_choice,
                   check_finite, check_group, check_positive, discounted_returns, episode_advantages, mean_std,
                   register_estimator, runtime_field)

PACE_ESTIMATORS = ("q_style", "diff_peer")
ACTION_KEYS = ("action_tag", "first_tokens")
CENTROIDS = ("mean", "first")
EPISODE_MODES = ("mean_norm", "mean_std_norm")
FIRST_TOKENS = 8  # the README's `first-token` key: the first 8 response tokens (docs/methods/bipace.md#equations)
DISTANCE_TOLERANCE = 1e-6  # rounding slack on d ≤ ε (float32 states), so identical directions always meet ε = 0
BIPACE_METRICS = ("mean_cluster_size", "singleton_cluster_fraction", "mixed_action_cluster_fraction")


@dataclass(frozen=True, kw_only=True)
class BiPACEParams(CreditParams):
    """Settings of `bipace_advantages` (config fields of `BiPACEConfig`).

    Attributes:
        cluster_epsilon: ε, the largest cosine distance to a centroid that joins its cluster (README: 0.05 for
            Qwen2.5-1.5B, 0.10 for 7B). In [0, 2].
        gamma: γ of the step returns (GiGPO: 0.95).
        step_advantage_w: w, weight of the step advantage (GiGPO default 1).
        pace_estimator: "q_style" (Q̂ − V̂, the README's default) or "diff_peer" (ρ minus the mean of the peers that
            took another action).
        action_key: "action_tag": the env's canonical action `step.info["action"]` when present, else the answer
            region of the reply (`<action>` body, `extract_answer`), lower-cased with whitespace collapsed;
            "first_tokens": the first 8 action token ids.
        centroid: "mean": the re-normalised running mean of the members' unit vectors (our choice,
            docs/methods/bipace.md#our-choices); "first": the first member's (as GiGPO's similarity mode compares
            with a cluster's first member).
        episode_mode: Normalisation of A^ep: "mean_norm" (R − μ) or "mean_std_norm" ((R − μ)/(σ + eps)). Â^S is not
            normalised (Q̂ − V̂ is already centred; docs/methods/bipace.md#our-choices).
        episode_statistic: Population of A^ep's μ, σ: "step_rows" (verl-agent) or "trajectories" (see
            `trl_agents.credit.base`); a population of one gets μ = 0, σ = 1 as in verl-agent GiGPO.
        invalid_action_penalty: λ, on steps with `valid=False`, in A^ep and in ρ.
        hidden_states: Run-time input, one entry per group (None: every group clusters by exact state key): one row
            per step of the group, trajectory by trajectory then step by step, the policy's hidden state of that
            step's prompt (a 2-D array-like, any width); an entry None clusters that group by exact state key
            (`step.state_key`, else the observation text): the ε = 0 identity-embedder case.
        eps: ε of `mean_std_norm`; not a config field.
    """

    cluster_epsilon: float = 0.05
    gamma: float = 0.95
    step_advantage_w: float = 1.0
    pace_estimator: str = "q_style"
    action_key: str = "action_tag"
    centroid: str = "mean"
    episode_mode: str = "mean_norm"
    episode_statistic: str = "step_rows"
    hidden_states: Sequence[Any] | None = runtime_field(compare=False, repr=False)
    eps: float = runtime_field(1e-6)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("estimator", self.pace_estimator, PACE_ESTIMATORS)
        check_choice("action_key", self.action_key, ACTION_KEYS)
        check_choice("centroid", self.centroid, CENTROIDS)
        check_choice("episode_mode", self.episode_mode, EPISODE_MODES)
        check_choice("statistic", self.episode_statistic, STATISTICS)
        check_finite(gamma=self.gamma, omega=self.step_advantage_w)
        epsilon = self.cluster_epsilon
        if not (isinstance(epsilon, (int, float)) and 0.0 <= epsilon <= 2.0):
            raise ValueError(f"epsilon must be a cosine distance in [0, 2], got {epsilon!r}")
        check_positive("eps", self.eps)


@register_estimator("bipace", BiPACEParams, metrics=BIPACE_METRICS)
def bipace_advantages(groups: Sequence[Group], params: BiPACEParams) -> tuple[list[StepAdvantages], Stats]:
    """BiPACE advantages A = A^ep + w·Â^S for every step of every trajectory of every group.

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats over the groups
        with steps: "num_clusters", "mean_cluster_size" (step rows per cluster), "singleton_cluster_fraction"
        (clusters of one row), "mixed_action_cluster_fraction" (clusters whose members took at least two different
        actions: the only ones with a non-zero Â^S). A trainer logs all but the first.
    """
    hidden_states = [None] * len(groups) if params.hidden_states is None else list(params.hidden_states)
    if len(hidden_states) != len(groups):
        raise ValueError(f"hidden_states has {len(hidden_states)} entries for {len(groups)} groups (one per group)")
    results = (_bipace_group(group, matrix, params) for group, matrix in zip(groups, hidden_states, strict=True))
    return batch_result(results, ("num_clusters", *BIPACE_METRICS), counted=lambda stats: stats["num_clusters"])


def _bipace_group(group: Group, hidden_states: Any, params: BiPACEParams) -> tuple[StepAdvantages, dict]:
    """BiPACE on one group (`hidden_states`: its step vectors, or None for exact state keys)."""
    check_group(group)
    invalid_penalty = params.invalid_action_penalty
    steps = [step for traj in group.trajectories for step in traj.steps]

    # A^ep: GiGPO Eq. 3 (verl-agent: a population of one gets mean 0, std 1).
    episode = episode_advantages(
        group,
        scale=params.episode_mode == "mean_std_norm",
        statistic=params.episode_statistic,
        invalid_penalty=invalid_penalty,
        eps=params.eps,
        singleton_stats=(0.0, 1.0),
    )

    # ρ: discounted step returns (GiGPO Eq. 5) with the local invalid-action penalty.
    returns: list[float] = []
    for traj in group.trajectories:
        discounted = discounted_returns([step.reward for step in traj.steps], params.gamma)
        for step, ret in zip(traj.steps, discounted, strict=True):
            returns.append(ret - invalid_penalty if not step.valid else ret)

    # BiGPO: clusters of steps whose prompts the policy represents alike (or exact state keys without vectors).
    if hidden_states is None:
        clusters = _exact_state_clusters(steps)
    else:
        clusters = greedy_cosine_clusters(
            _checked_vectors(hidden_states, len(steps)), params.cluster_epsilon, params.centroid
        )

    # PACE: action-conditioned peer baselines inside each cluster.
    keys = [step_action_key(step, params.action_key) for step in steps]
    step_advantages = pace_step_advantages(returns, clusters, keys, params.pace_estimator)

    # A = A^ep + w·Â^S.
    advantages: StepAdvantages = []
    offset, omega = 0, params.step_advantage_w
    for episode_row in episode:
        advantages.append([a_ep + omega * step_advantages[offset + t] for t, a_ep in enumerate(episode_row)])
        offset += len(episode_row)
    return advantages, _cluster_stats(clusters, keys)


def greedy_cosine_clusters(vectors: Any, epsilon: float, centroid: str = "mean") -> list[int]:
    """BiGPO's greedy cosine clustering: the cluster index of every row of `vectors`, in one pass in row order.

    Each row φ (scaled to unit norm; an all-zero row stays zero and is at distance 1 from everything) joins the
    nearest existing centroid when its cosine distance 1 − ⟨φ, c⟩ is at most ε (ties: the earliest cluster), else
    it opens a new cluster. Centroid "mean": c = S/‖S‖ with S the sum of the members' φ; "first": the first member.

    The distances come from the Gram matrix G = ΦΦᵀ (`unit_gram`): ⟨φ_r, S_k⟩ = Σ_{m∈k} G[m, r] and
    ‖S_k + φ_r‖² = ‖S_k‖² + 2⟨S_k, φ_r⟩ + G[r, r], so a pass costs one n×n×d product plus O(n²).

    >>> greedy_cosine_clusters([[1, 0], [1, 0.1], [0, 1], [0.6, 0.8]], epsilon=0.05)
    [0, 0, 1, 2]
    """
    check_choice("centroid", centroid, CENTROIDS)
    gram = unit_gram(vectors)
    n = gram.shape[0]
    member_sums = np.zeros((n, n))  # row k: ⟨S_k, φ_r⟩ for every row r
    sum_norms = np.zeros(n)  # ‖S_k‖
    labels: list[int] = []
    num_clusters = 0
    for r in range(n):
        if num_clusters:
            scale = sum_norms[:num_clusters]
            similarity = np.divide(member_sums[:num_clusters, r], scale, out=np.zeros(num_clusters), where=scale > 0)
            best = int(np.argmax(similarity))
            if 1.0 - similarity[best] <= epsilon + DISTANCE_TOLERANCE:
                labels.append(best)
                if centroid == "mean":
                    sum_norms[best] = math.sqrt(max(sum_norms[best] ** 2 + 2 * member_sums[best, r] + gram[r, r], 0.0))
                    member_sums[best] += gram[r]
                continue
        member_sums[num_clusters] = gram[r]
        sum_norms[num_clusters] = math.sqrt(gram[r, r])
        labels.append(num_clusters)
        num_clusters += 1
    return labels


def unit_gram(vectors: Any) -> np.ndarray:
    """G = ΦΦᵀ (float64, n×n) of the rows of `vectors` scaled to unit norm; all-zero rows stay zero.

    A torch tensor on an accelerator is multiplied there (the trainer's hidden states stay on the model's device,
    where the n×n×d product is cheap); anything else, CPU tensors included, with numpy.

    >>> unit_gram([[3, 4], [0, 0]]).tolist()
    [[1.0, 0.0], [0.0, 0.0]]
    """
    if hasattr(vectors, "detach") and _is_host_tensor(vectors):
        vectors = _cpu_tensor_to_numpy(vectors)
    if hasattr(vectors, "detach"):  # torch, on an accelerator
        import torch

        dtype = torch.float32 if vectors.device.type == "mps" else torch.float64  # MPS has no float64
        phi = vectors.detach().to(dtype)
        if phi.dim() != 2:
            raise ValueError(f"hidden state vectors must be a 2-D matrix, got shape {tuple(phi.shape)}")
        phi = torch.nn.functional.normalize(phi, dim=1)  # zero rows stay zero
        return (phi @ phi.T).double().cpu().numpy()
    phi = np.asarray(vectors, dtype=np.float64)
    if phi.ndim != 2:
        raise ValueError(f"hidden state vectors must be a 2-D matrix, got shape {phi.shape}")
    norms = np.linalg.norm(phi, axis=1, keepdims=True)
    phi = np.divide(phi, norms, out=np.zeros_like(phi), where=norms > 0)
    return phi @ phi.T


def step_action_key(step: Step, kind: str = "action_tag") -> Hashable:
    """The action key x(a) PACE compares (see `BiPACEParams.action_key`).

    >>> step_action_key(Step("s", "<think>the box is left</think><action> Go  LEFT </action>"))
    'go left'
    >>> step_action_key(Step("s", "whatever", info={"action": "left"}))
    'left'
    """
    check_choice("action_key", kind, ACTION_KEYS)
    if kind == "first_tokens":
        return tuple(step.action_ids[:FIRST_TOKENS])
    return canonical_action(step)


def pace_step_advantages(
    returns: Sequence[float], clusters: Sequence[int], keys: Sequence[Hashable], estimator: str = "q_style"
) -> list[float]:
    """PACE: Â^S for every row from its cluster's action-conditioned peer baselines (module docstring).

    >>> [round(a, 4) for a in pace_step_advantages([1.0, 0.0, 0.0, 5.0], [0, 0, 0, 1], ["a", "b", "b", "a"])]
    [0.6667, -0.3333, -0.3333, 0.0]
    """
    check_choice("estimator", estimator, PACE_ESTIMATORS)
    members: dict[int, list[int]] = {}
    for row, cluster in enumerate(clusters):
        members.setdefault(cluster, []).append(row)
    advantages = [0.0] * len(returns)
    for rows in members.values():
        by_action: dict[Hashable, list[int]] = {}
        for row in rows:
            by_action.setdefault(keys[row], []).append(row)
        if len(by_action) < 2:
            continue  # a singleton, or one action for everyone: Q̂ = V̂, no peer took another action -> 0
        if estimator == "q_style":
            value, _ = mean_std([returns[r] for r in rows])  # V̂(s)
            for same in by_action.values():
                q_value, _ = mean_std([returns[r] for r in same])  # Q̂(s, a)
                for row in same:
                    advantages[row] = q_value - value
        else:
            for key, same in by_action.items():
                others, _ = mean_std([returns[r] for r in rows if keys[r] != key])
                for row in same:
                    advantages[row] = returns[row] - others
    return advantages


def _checked_vectors(hidden_states: Any, num_rows: int) -> Any:
    """The hidden states (a torch tensor as it is, anything else as a float array) after checking that there is one
    finite vector per step; a ValueError saying what is wrong otherwise."""
    if hasattr(hidden_states, "detach") and _is_host_tensor(hidden_states):
        hidden_states = _cpu_tensor_to_numpy(hidden_states)
    if hasattr(hidden_states, "detach"):  # torch on an accelerator: checked where it lives, never copied here
        shape, finite = tuple(hidden_states.shape), bool(hidden_states.isfinite().all())
    else:
        hidden_states = np.asarray(hidden_states, dtype=np.float64)
        shape, finite = hidden_states.shape, bool(np.isfinite(hidden_states).all())
    if num_rows == 0 and math.prod(shape) == 0:
        return np.zeros((0, 0))
    if len(shape) != 2 or shape[0] != num_rows:
        raise ValueError(
            f"hidden_states must hold one vector per step of the group ({num_rows} rows, trajectory by trajectory), "
            f"got shape {shape}"
        )
    if not finite:
        raise ValueError("hidden_states contain NaN or inf values")
    return hidden_states


def _is_host_tensor(tensor: Any) -> bool:
    return tensor.device.type == "cpu"


def _cpu_tensor_to_numpy(tensor: Any) -> np.ndarray:
    """A CPU tensor as a float64 array, through numpy (torch CPU kernels would leave OpenMP threads spinning against
    numpy's BLAS threads; bf16/fp16 need one torch cast first)."""
    tensor = tensor.detach()
    if not (tensor.dtype.is_floating_point and tensor.element_size() >= 4):
        tensor = tensor.float()
    return np.asarray(tensor.numpy(), dtype=np.float64)


def _exact_state_clusters(steps: Sequence[Step]) -> list[int]:
    """Clusters by exact state key (`state_key`, else the observation): the identity embedder with ε = 0."""
    index: dict[Hashable, int] = {}
    labels = []
    for step in steps:
        key = step.state_key if step.state_key is not None else step.observation
        try:
            labels.append(index.setdefault(key, len(index)))
        except TypeError as err:
            raise ValueError(f"state keys must be hashable (got {type(key).__name__}): {err}") from None
    return labels


def _cluster_stats(clusters: Sequence[int], keys: Sequence[Hashable]) -> dict[str, float]:
    actions: dict[int, set] = {}
    sizes: dict[int, int] = {}
    for cluster, key in zip(clusters, keys, strict=True):
        actions.setdefault(cluster, set()).add(key)
        sizes[cluster] = sizes.get(cluster, 0) + 1
    count = len(sizes)
    if not count:
        return {"num_clusters": 0, "mean_cluster_size": 0.0, "singleton_cluster_fraction": 0.0,
                "mixed_action_cluster_fraction": 0.0}
    return {
        "num_clusters": count,
        "mean_cluster_size": len(clusters) / count,
        "singleton_cluster_fraction": sum(size == 1 for size in sizes.values()) / count,
        "mixed_action_cluster_fraction": sum(len(a) > 1 for a in actions.values()) / count,
    }
