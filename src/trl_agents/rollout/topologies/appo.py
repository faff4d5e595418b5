"""`token_branching`: APPO's token-level branching (arXiv 2606.12384; docs/methods/appo.md).

Phase 1 plays `num_generations` initial rollouts per task (n_init), recording an environment snapshot before every
action. Phase 2, once a task's initial rollouts have all ended, scores every action token of its healthy initial
rollouts and forks branches at the best ones, until the task has `rollouts_per_task` episodes (n): a branch at token
k of step s restores the snapshot taken before step s and continues that step's action from its own tokens [0..k]
(`Fork(action_prefix=...)`: the engine appends the prefix to the prompt, the generator samples the rest of the
action, the environment then plays on).

The score of a token (its math is here, the credit's in `trl_agents.credit.appo`): its entropy H under the current
policy and its future value Ω, from the log-ratios Δ_j = log π_θ(y_j) − log π_old(y_j) between the current policy and
the sampler over the rollout's tokens from there on, both z-scored within the rollout over its non-punctuation
tokens:

    Ω_t  = clip( exp( clamp( Σ_{j≥t} γ^{j−t} Δ_j , −20, 20 ) ), 1 − ε, 1 + ε )          (`future_values`)
    BS_t = z(H)_t · z(Ω)_t,   eligible iff z(H)_t > 0, z(Ω)_t > 0 and BS_t > 0          (`branching_scores`)

The best eligible positions (`top_positions`) are the split points. H and the current policy's log-probs come from one batched no-grad forward over the initial rollouts (the
model signal `policy_logprobs`, which also fills `entropy`); the sampler's are `step.action_logprobs`. When they
coincide (a transformers generator samples with the current weights: Ω ≡ 1) or a log-prob is missing (NaN), Ω says
nothing and the score falls back to z(H) (counted in `topology/omega_fallback_fraction`). `score="entropy"` always
uses z(H) (the paper's BS→entropy ablation).

Budget per task: `rollouts_per_task − num_generations` branches, one per split point, shared round-robin over the
initial rollouts (each rollout's best point first, rollouts with the best points first; then their second best,
...). Where there are fewer eligible points than the budget, `fill_budget` launches the rest as new initial rollouts
(independent samples of the task), once the branches are done. The last token of an action is never a split point
(nothing would be left to sample), nor a token without snapshot. `branch_points` lists the splits of the last rollout
(`BranchPoint`, with the episode id the engine gives each branch), for the trainer's credit.

The phases are per task and the schedule is "free": a task's scores, budget and fill-ups read only its own rollouts
(the signal runs on that task's initial rollouts), so each task branches as soon as its initial rollouts are done; in
lockstep, all tasks at once. A task decided alone that forks nothing gets its fill-ups at once; in a lockstep call
they come at once only when no task of the call forks (else at the next idle call, with the other tasks' fill-ups).

Numerical guards: z-scores of fewer than two values, or of values whose spread is below `tolerance`, are 0 (no
eligible position rather than 0/0); the exponent of Ω is clamped to ±20 (no inf); empty inputs give empty outputs.

Example (the acceptance numbers, docs/methods/appo.md "Hand-computed case"):
    >>> from trl_agents.rollout.topologies import get_topology
    >>> topology = get_topology("token_branching", rollouts_per_task=4)
    >>> topology.begin([{"seed": 0}], num_generations=2)
    [Launch(task_index=0, count=2)]
    >>> [round(v, 4) for v in future_values([0.1, 0.0, -0.1], gamma=1.0, epsilon=None)]
    [1.0, 0.9048, 0.9048]
    >>> scores, eligible, used_omega = branching_scores([2.0, 0.5, 1.5, 0.1], [1.1, 1.0, 0.9, 1.2])
    >>> [round(s, 3) for s in scores], eligible, used_omega
    ([0.574, 0.309, -0.839, -1.634], [True, False, False, False], True)
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...signals.base import ModelSignal, register_signal
from ...signals.model import assign, score_units, scoring_units
from ...trajectory import Trajectory
from .base import Fork, Launch, Request, RolloutView, Topology

TOKEN_BRANCH_SCORES = ("bs", "entropy")
POLICY_LOGPROBS = "policy_logprobs"
DEFAULT_BRANCH_GAMMA = 1.0  # γ of Ω's future sum at branching: the released code passes `algorithm.gamma`, 1.0
EXP_CLAMP = 20.0  # the exponent of Ω and of the future-KL factor is clamped to ±20 (as the code does)
PUNCTUATION = frozenset(string.punctuation)


def is_punctuation(text: str) -> bool:
    """Whether a token's text is only whitespace and punctuation (such tokens are never split points, nor counted in
    the z-scores).

    >>> is_punctuation(" ,"), is_punctuation("go"), is_punctuation("")
    (True, False, True)
    """
    return all(ch.isspace() or ch in PUNCTUATION for ch in text)


# ---- where to branch (pure) ------------------------------------------------------------------------------------------


def future_sums(values: Sequence[float], gamma: float, keep: Sequence[bool] | None = None) -> list[float]:
    """S_t = Σ_{k≥t} γ^{k−t} 1[keep_k]·v_k, backwards: S_t = 1[keep_t]·v_t + γ·S_{t+1}.

    >>> future_sums([1.0, 0.0, 1.0], 0.5)
    [1.25, 0.5, 1.0]
    """
    sums = [0.0] * len(values)
    running = 0.0
    for t in range(len(values) - 1, -1, -1):
        term = values[t] if keep is None or keep[t] else 0.0
        running = term + gamma * running
        sums[t] = running
    return sums


def future_values(
    log_ratios: Sequence[float], gamma: float = DEFAULT_BRANCH_GAMMA, epsilon: float | None = 0.2
) -> list[float]:
    """Ω_t = clip(exp(clamp(Σ_{j≥t} γ^{j−t} Δ_j, ±20)), 1 − ε, 1 + ε), Δ_j = log π_θ(y_j) − log π_old(y_j) over the
    rollout's tokens in order; `epsilon=None` returns the unclipped values.

    >>> [round(v, 4) for v in future_values([0.1, 0.0, -0.1], gamma=1.0, epsilon=None)]  # exp(0), exp(−.1), exp(−.1)
    [1.0, 0.9048, 0.9048]
    >>> future_values([1.0], gamma=1.0)  # exp(1) = 2.718 clipped to 1 + 0.2
    [1.2]
    """
    omegas = []
    for total in future_sums(log_ratios, gamma):
        omega = math.exp(max(-EXP_CLAMP, min(EXP_CLAMP, total)))
        if epsilon is not None:
            omega = min(max(omega, 1.0 - epsilon), 1.0 + epsilon)
        omegas.append(omega)
    return omegas


def zscores(values: Sequence[float], keep: Sequence[bool] | None = None, tolerance: float = 1e-8) -> list[float]:
    """(v − μ)/σ with μ and the population σ over the kept values; 0 on values not kept, and 0 everywhere when
    fewer than two values are kept or σ < `tolerance` (no spread: nothing stands out).

    >>> [round(z, 4) for z in zscores([1.1, 1.0, 0.9, 1.2])]
    [0.4472, -0.4472, -1.3416, 1.3416]
    >>> zscores([1.0, 1.0, 1.0]), zscores([3.0, 1.0], keep=[True, False])
    ([0.0, 0.0, 0.0], [0.0, 0.0])
    """
    kept = [v for i, v in enumerate(values) if keep is None or keep[i]]
    if len(kept) < 2:
        return [0.0] * len(values)
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((v - mean) ** 2 for v in kept) / len(kept))
    if std < tolerance:
        return [0.0] * len(values)
    return [(v - mean) / std if keep is None or keep[i] else 0.0 for i, v in enumerate(values)]


def branching_scores(
    entropies: Sequence[float],
    omegas: Sequence[float] | None,
    keep: Sequence[bool] | None = None,
    omega_tolerance: float = 1e-4,
) -> tuple[list[float], list[bool], bool]:
    """(score per token, eligible per token, whether Ω was used) within one rollout.

    BS_t = z(H)_t·z(Ω)_t, eligible iff z(H) > 0, z(Ω) > 0 and BS > 0; z over the `keep` tokens (non-punctuation),
    tokens not kept are never eligible. Ω None, with a non-finite value, or with a spread (population σ over the
    kept tokens) below `omega_tolerance` falls back to score z(H), eligible iff z(H) > 0.

    >>> scores, eligible, used = branching_scores([2.0, 0.5, 1.5, 0.1], [1.1, 1.0, 0.9, 1.2])
    >>> [round(s, 3) for s in scores], eligible  # z(H) = [1.284, −0.691, 0.625, −1.218], z(Ω) = [.447, −.447, ...]
    ([0.574, 0.309, -0.839, -1.634], [True, False, False, False])
    >>> scores, eligible, used = branching_scores([2.0, 0.5, 1.5, 0.1], [1.0, 1.0, 1.0, 1.0])  # Ω ≡ 1: z(H) alone
    >>> [round(s, 3) for s in scores], eligible, used
    ([1.284, -0.691, 0.625, -1.218], [True, False, True, False], False)
    """
    n = len(entropies)
    keep = [True] * n if keep is None else list(keep)
    z_h = zscores(entropies, keep)
    use_omega = omegas is not None and len(omegas) == n and all(math.isfinite(v) for v in omegas)
    if use_omega:
        z_o = zscores(omegas, keep, tolerance=omega_tolerance)
        use_omega = any(z != 0.0 for z in z_o)
    if not use_omega:
        return z_h, [keep[t] and z_h[t] > 0 for t in range(n)], False
    scores = [z_h[t] * z_o[t] for t in range(n)]
    eligible = [keep[t] and z_h[t] > 0 and z_o[t] > 0 and scores[t] > 0 for t in range(n)]
    return scores, eligible, True


def top_positions(scores: Sequence[float], eligible: Sequence[bool], count: int) -> list[int]:
    """The `count` eligible positions with the highest scores (ties: the earliest), best first.

    >>> top_positions([0.5, 2.0, 2.0, 9.0], [True, True, True, False], 2)
    [1, 2]
    """
    ranked = sorted((t for t in range(len(scores)) if eligible[t]), key=lambda t: (-scores[t], t))
    return ranked[: max(count, 0)]


# ---- the splits of a rollout, for the credit -------------------------------------------------------------------------


@dataclass(frozen=True)
class BranchPoint:
    """One split of token-level branching: the branch episode `episode_id` of task `task_index` continues step
    `step` of the initial rollout `origin` after its tokens `[0..token]` (`prefix`), chosen with score `score`
    (BS, or z(H) on the fallback); `position` is the split token's index among all the origin's action tokens."""

    task_index: int
    episode_id: int
    origin: int
    step: int
    token: int
    position: int
    score: float
    prefix: tuple[int, ...]


def token_offsets(trajectory: Trajectory) -> list[int]:
    """Index of each step's first action token among all the trajectory's action tokens, in order.

    >>> from trl_agents.trajectory import Step
    >>> token_offsets(Trajectory(task={}, steps=[Step("o", "a", action_ids=[1, 2]), Step("o", "b", action_ids=[3])]))
    [0, 2]
    """
    offsets, total = [], 0
    for step in trajectory.steps:
        offsets.append(total)
        total += len(step.action_ids)
    return offsets


# ---- the model signal and the topology ----------------------------------------------------------------------------




class PolicyLogprobs(ModelSignal):
    """log π_θ of every recorded action token under the current policy, at the training temperature; the same
    forward also fills `entropy` (per-token entropies), so the token-branching topology runs one forward."""

    name = POLICY_LOGPROBS
    description = "current-policy log-probs of the recorded action tokens (and their entropies, as `entropy`)"
    recorded = False  # one float per token, derivable; entropies (`entropy`) are recorded

    def compute(self, groups, context) -> None:
        units = scoring_units(groups, context.row_format)
        with context.model_context() as model:
            scored = score_units(model, units, pad_token_id=context.pad_token_id, temperature=context.temperature,
                                 entropy=True, max_rows=context.max_rows_per_forward,
                                 max_tokens=context.max_tokens_per_forward)
        assign(units, [logps for logps, _ in scored], self.name)
        assign(units, [entropies for _, entropies in scored], "entropy")


register_signal(POLICY_LOGPROBS, PolicyLogprobs)


def punctuation_filter(tokenizer) -> Callable[[int], bool]:
    """`skip(token_id)`: whether the token decodes to whitespace / punctuation only (or nothing: special tokens)."""
    cache: dict[int, bool] = {}

    def skip(token_id: int) -> bool:
        if token_id not in cache:
            cache[token_id] = is_punctuation(tokenizer.decode([token_id], skip_special_tokens=True))
        return cache[token_id]

    return skip


class TokenBranchingTopology(Topology):
    """n_init initial rollouts per task, then branches at their best tokens up to `rollouts_per_task` (module doc).

    Args:
        rollouts_per_task: n, episodes per task in all (initial rollouts + branches + fill-ups); the initial ones are
            the rollout's `num_generations`.
        score: `"bs"` (z(H)·z(Ω), falling back to z(H)) or `"entropy"` (z(H) always).
        gamma: γ ∈ (0, 1] of Ω's future sum Σ_{j≥t} γ^{j−t} Δ_j (the released branching passes its
            `algorithm.gamma`, 1.0 in every launcher).
        value_clip: ε of Ω's clip to [1 − ε, 1 + ε].
        omega_tolerance: Ω whose spread (population σ over the rollout's scored tokens) is below this says nothing.
        fill_budget: Launch the budget that no eligible split point takes as new initial rollouts.
        skip_token: `skip(token_id)`, tokens that are never scored (punctuation); the trainer sets it from its
            tokenizer (`punctuation_filter`). None scores every token.
    """

    name = "token_branching"
    schedule = "free"
    needs_snapshots = True
    required_capabilities = ("snapshot",)

    def __init__(
        self,
        rollouts_per_task: int = 16,
        score: str = "bs",
        gamma: float = DEFAULT_BRANCH_GAMMA,
        value_clip: float = 0.2,
        omega_tolerance: float = 1e-4,
        fill_budget: bool = True,
        skip_token: Callable[[int], bool] | None = None,
    ):
        if isinstance(rollouts_per_task, bool) or not isinstance(rollouts_per_task, int) or rollouts_per_task < 1:
            raise ValueError(f"rollouts_per_task must be an integer >= 1, got {rollouts_per_task!r}")
        if score not in TOKEN_BRANCH_SCORES:
            raise ValueError(f"score must be one of {', '.join(map(repr, TOKEN_BRANCH_SCORES))}, got {score!r}")
        if not (isinstance(gamma, int | float) and 0.0 < gamma <= 1.0):
            raise ValueError(f"gamma must be in (0, 1] (APPO's released branching: 1.0), got {gamma!r}")
        if not 0.0 <= value_clip < 1.0:
            raise ValueError(f"value_clip must be in [0, 1) (APPO: 0.2), got {value_clip!r}")
        self.rollouts_per_task = rollouts_per_task
        self.score = score
        self.gamma = float(gamma)
        self.value_clip = value_clip
        self.omega_tolerance = omega_tolerance
        self.fill_budget = fill_budget
        self.skip_token = skip_token
        self.model_signals = (POLICY_LOGPROBS,)
        self._reset()

    def _reset(self, num_tasks: int = 0) -> None:
        self._branched = [False] * num_tasks  # per task: phase "branches" (True) or still "initial"
        self.branch_points: list[BranchPoint] = []
        self._pending_fills: list[list[Request]] = [[] for _ in range(num_tasks)]  # per task, after its branches
        self._fills = 0
        self._scored = 0
        self._fallbacks = 0
        self._tasks = num_tasks

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        self._reset(len(tasks))
        return [Launch(index, num_generations) for index in range(len(tasks))]

    def when_idle(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """For the task(s) (all for None, else `task_index`): the branches of those still in their initial phase
        (one signal call over their initial rollouts), or the fill-ups of those whose branches are done."""
        indices = view.task_indices(task_index)
        # The fill-ups once a task's branches are done (the engine checks a task's launched episodes against its
        # other roots, so launches do not share a request list with forks).
        requests: list[Request] = []
        for index in indices:
            if self._branched[index]:
                requests += self._pending_fills[index]
                self._pending_fills[index] = []
        deciding = [index for index in indices if not self._branched[index]]
        if not deciding:
            return requests
        for index in deciding:
            self._branched[index] = True
        initial = [(index, t) for index in deciding for t in view.groups[index].trajectories
                   if t.parent_id is None and not t.failed and t.steps]
        if initial:
            view.compute_signal(POLICY_LOGPROBS, [t for _, t in initial])
        forks: list[Request] = []
        for index in deciding:
            group = view.groups[index]
            budget = self.rollouts_per_task - len(group.trajectories)
            if budget <= 0:
                continue
            ranked = [self.split_points(t) for i, t in initial if i == index]
            chosen = _round_robin([points for points in ranked if points], budget)
            next_id = len(group.trajectories)  # the engine numbers a task's new episodes in request order
            for trajectory, step, token, position, score in chosen:
                prefix = tuple(trajectory.steps[step].action_ids[: token + 1])
                self.branch_points.append(BranchPoint(index, next_id, trajectory.episode_id, step, token, position,
                                                      score, prefix))
                forks.append(Fork(index, trajectory.episode_id, step, 1, action_prefix=prefix))
                next_id += 1
            if self.fill_budget and len(chosen) < budget:
                self._pending_fills[index].append(Launch(index, budget - len(chosen)))
                self._fills += budget - len(chosen)
        if not forks:  # nothing to fork for the tasks just decided: their fill-ups right away
            for index in deciding:
                forks += self._pending_fills[index]
                self._pending_fills[index] = []
        return requests + forks

    def split_points(self, trajectory: Trajectory) -> list[tuple[Trajectory, int, int, int, float]]:
        """The eligible split points of an initial rollout, best first: (trajectory, step, token, position among its
        action tokens, score). Needs the `policy_logprobs` / `entropy` signals on its steps."""
        tokens = [(s, k, token_id) for s, step in enumerate(trajectory.steps) for k, token_id in
                  enumerate(step.action_ids)]
        if not tokens:
            return []
        entropies, current, behaviour = [], [], []
        for step in trajectory.steps:
            if not step.action_ids:  # an empty action has no tokens (and no signal values)
                continue
            values = step.signals.get("entropy")
            logps = step.signals.get(POLICY_LOGPROBS)
            if values is None or logps is None:
                raise ValueError("token branching needs step.signals['entropy'] and ['policy_logprobs'] (the model "
                                 "signal 'policy_logprobs')")
            entropies += [float(v) for v in values]
            current += [float(v) for v in logps]
            sampled = list(step.action_logprobs)
            behaviour += [float(v) for v in sampled] if len(sampled) == len(step.action_ids) else (
                [math.nan] * len(step.action_ids))
        keep = [self.skip_token is None or not self.skip_token(token_id) for _, _, token_id in tokens]
        omegas = None
        if self.score == "bs":
            log_ratios = [c - b for c, b in zip(current, behaviour, strict=True)]
            if all(math.isfinite(v) for v in log_ratios):
                omegas = future_values(log_ratios, self.gamma, self.value_clip)
        scores, eligible, used_omega = branching_scores(entropies, omegas, keep, self.omega_tolerance)
        self._scored += 1
        self._fallbacks += int(self.score == "bs" and not used_omega)
        for position, (s, k, _) in enumerate(tokens):
            step = trajectory.steps[s]
            if k == len(step.action_ids) - 1 or step.snapshot is None:  # nothing left to sample / cannot restore
                eligible[position] = False
        offsets = token_offsets(trajectory)
        return [(trajectory, s, k, offsets[s] + k, scores[offsets[s] + k])
                for s, k in ((tokens[p][0], tokens[p][1]) for p in top_positions(scores, eligible, len(tokens)))]

    def stats(self, view: RolloutView) -> dict[str, float]:
        groups = view.groups
        if not groups:
            return {}
        tasks = len(groups)
        return {
            "leaves_per_task": sum(len(g.trajectories) for g in groups) / tasks,
            "branches_per_task": len(self.branch_points) / tasks,
            "fill_rollouts_per_task": self._fills / tasks,
            "omega_fallback_fraction": self._fallbacks / self._scored if self._scored else 0.0,
        }


def _round_robin(ranked: list[list[tuple]], budget: int) -> list[tuple]:
    """Up to `budget` points: every rollout's best, rollouts in the order of their best scores (ties: the first),
    then every rollout's second best, and so on.

    >>> _round_robin([[("a", 0, 0, 0, 1.0), ("a", 0, 1, 1, 0.5)], [("b", 0, 0, 0, 2.0)]], 3)
    [('b', 0, 0, 0, 2.0), ('a', 0, 0, 0, 1.0), ('a', 0, 1, 1, 0.5)]
    """
    order = sorted(range(len(ranked)), key=lambda i: -ranked[i][0][4])
    chosen, depth = [], 0
    while len(chosen) < budget and any(depth < len(ranked[i]) for i in order):
        for i in order:
            if depth < len(ranked[i]) and len(chosen) < budget:
                chosen.append(ranked[i][depth])
        depth += 1
    return chosen
