"""ADRS: a privileged self-teacher's token scores, gated by whether following it pays off, added to GRPO's advantage.

ADRS (2026, "Agentic Reinforcement Learning with Self-Distilled Reward Shaping", arXiv 2608.03223; reference code
`gitrxh/ADRS-arxiv`, `verl/trainer/ppo/adrs_utils.py` and the GRPO advantage of `verl/trainer/ppo/core_algos.py`,
run by the `*_grpo_star_fix5.sh` launchers). The teacher is the current policy shown privileged text before the step
prompt; ℓ^T_{i,t} is its log-prob of the student's sampled token t of row i (the `teacher_logprobs` signal). A row is
one step (verl-agent's layout, `unit="step"`) or one episode (`unit="episode"`, for conversation rows).

    r̂_{i,t} = (ℓ^T_{i,t} − mean_{t'∈step(t)} ℓ^T_{i,t'}) / (std_i + 1e-8)     centred within the step; std_i =
              population std of the row's centred scores ("per_seq"), or the Bessel std over the batch ("global")
    c_i     = mean_t ℓ^T_{i,t}                                                 the row's teacher alignment
    α_i     = σ((c_i − mean_batch c) / T_α)                                    T_α = 1
    TVA_g   = Σ_g α_i R_i / Σ_g α_i − Σ_g (1−α_i) R_i / Σ_g (1−α_i)           (+1e-8 in both denominators; 0 when
                                                                               the group has fewer than 2 rows)
    m_g     = σ(τ·TVA_g)                                                       τ = 2: the TVA gate
    z_i     = (R_i − μ_g) / (σ_g + 1e-6)                                       GRPO over the group's rows (Bessel σ;
                                                                               a one-row group: μ = 0, σ = 1, verl)

R_i is the row's score: with step rows the episode return minus the invalid-action penalty of the step (verl-agent's
cross-step statistics); with episode rows the episode return (the penalty is subtracted from z afterwards, as
`credit.base` does). Then, with η_eff the scheduled coefficient (`adrs_eta_schedule`: 0 for the first 20 steps, η for
the next 50, 0 after):

    "released" (what fix5 optimises):
        q_{i,t}   = η·m_g·r̂_{i,t}
        ẑ^T_{i,t} = (q_{i,t} − mean_g q) / sqrt(var_g q + 1e-8)                 over all tokens of the group (Bessel)
        c_g       = c·min(1, σ_g / (median σ + 1e-6))                          c = 0.2; median over the groups with
                                                                               ≥ 2 rows and σ ≥ 1e-6
        A_{i,t}   = z_i + clip(η_eff·ẑ^T_{i,t}, −c_g, c_g)                     only for groups with ≥ 2 rows and
                                                                               σ_g ≥ 1e-6; others A = z_i
    "paper" (the paper's text, the reference's "pure paper" ablation):
        A_{i,t}   = z_i + η_eff·m_g·r̂_{i,t}                                   every group, no restandardisation

In the released form m_g and η are constant within a group, so they cancel in ẑ^T (up to the 1e-8): the gate only
matters through the scale of q against that 1e-8, and σ(·) > 0 never flips the teacher's direction.

Numerical guards (ours unless said): a step of one token, or of equal scores, has r̂ = 0 exactly (centring around the
first value, as `credit.base.mean_std`); a non-finite ℓ^T is left out of every mean and std and gets r̂ = 0 and no
teacher term (the reference has no guard: NaN spreads over the whole group); a row with no finite score has no
alignment and is left out of mean_batch c and of TVA; a group of fewer than two rows has TVA = 0 (m = 0.5). The
median is the lower middle value (`torch.median`, as the reference), and the reference's one-row groups (whose σ is
its placeholder 1) are left out of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..credit.base import CreditParams, Stats, check_choice, mean_std, register_estimator, runtime_field
from ..trajectory import Group

ADRS_VARIANTS = ("released", "paper")
ADRS_UNITS = ("step", "episode")
NORMALIZE_MODES = ("per_seq", "global")
GRPO_EPS = 1e-6  # verl's epsilon in (R − μ)/(σ + ε), also the "σ_g ≈ 0" threshold of the teacher term
SIGNAL = "teacher_logprobs"

TokenAdvantages = list[list[list[float]]]
"""One list per trajectory of the group, one list per step, one advantage per action token."""


def sigmoid(x: float) -> float:
    """σ(x) = 1/(1 + e^−x), without overflow for large |x|."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def adrs_eta_schedule(step: int, eta: float, warmup_steps: int = 20, active_steps: int | None = 50) -> float:
    """η_eff of training step `step` (1-based, verl's `global_steps`): 0 while step ≤ warmup_steps (pure GRPO), η for
    the next `active_steps` steps, 0 after them (None: η until the end).

    >>> [adrs_eta_schedule(s, 0.02) for s in (1, 20, 21, 70, 71)]
    [0.0, 0.0, 0.02, 0.02, 0.0]
    >>> adrs_eta_schedule(500, 0.1, warmup_steps=0, active_steps=None)
    0.1
    """
    if step <= warmup_steps:
        return 0.0
    if active_steps is not None and step > warmup_steps + active_steps:
        return 0.0
    return float(eta)


def centred_step_scores(logps: Sequence[float]) -> list[float | None]:
    """ℓ_t − mean ℓ over one step's finite scores (None where ℓ is not finite). Centred around the first finite
    value, so equal scores give exact zeros.

    >>> centred_step_scores([-1.0, -3.0, float("nan")])
    [1.0, -1.0, None]
    """
    finite = [v for v in logps if math.isfinite(v)]
    if not finite:
        return [None] * len(logps)
    shift = finite[0]
    mean = sum(v - shift for v in finite) / len(finite)
    return [(v - shift) - mean if math.isfinite(v) else None for v in logps]


def population_std(values: Sequence[float]) -> float:
    """√(mean (v − mean v)²) (verl's per_seq std); 0 for fewer than two values.

    >>> population_std([1.0, -1.0])
    1.0
    """
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / n)


def lower_median(values: Sequence[float]) -> float:
    """The lower of the two middle values for an even count (`torch.median`); ValueError when empty.

    >>> lower_median([0.4, 0.7, 0.5]), lower_median([0.4, 0.7])
    (0.5, 0.4)
    """
    if not values:
        raise ValueError("lower_median of no values")
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def adaptive_clip(sigma: float, median_sigma: float | None, clip: float = 0.2) -> float:
    """c_g = c·min(1, σ_g/(median σ + 1e-6)): a group whose rewards separate its rows less than the batch's median
    group lets the teacher move its advantages less. `median_sigma=None` (adaptive clipping off) gives c.

    >>> round(adaptive_clip(0.4, 0.5), 6), round(adaptive_clip(0.7, 0.5), 6), adaptive_clip(0.1, None)
    (0.16, 0.2, 0.2)
    """
    if median_sigma is None:
        return clip
    return clip * min(1.0, sigma / (median_sigma + GRPO_EPS))


def tva_gate(
    alignments: Sequence[float | None],
    scores: Sequence[float],
    batch_mean: float,
    *,
    temperature: float = 1.0,
    tau: float = 2.0,
) -> tuple[float, float, list[float | None]]:
    """(TVA_g, m_g = σ(τ·TVA_g), α_i) of one group from its rows' alignments c_i (None: no finite score, left out)
    and scores R_i; `batch_mean` is mean_batch c.

    Example (c = [−2, −1], mean −1.5, R = [1, 0]: α = [σ(−0.5), σ(0.5)] = [0.377541, 0.622459],
    TVA = 0.377541/1 − 0.622459/1 = −0.244919, m = σ(−0.489837) = 0.379932):
        >>> tva, gate, alpha = tva_gate([-2.0, -1.0], [1.0, 0.0], -1.5)
        >>> round(tva, 6), round(gate, 6), [round(a, 6) for a in alpha]
        (-0.244919, 0.379932, [0.377541, 0.622459])
    """
    alpha = [None if c is None else sigmoid((c - batch_mean) / temperature) for c in alignments]
    pairs = [(a, r) for a, r in zip(alpha, scores, strict=True) if a is not None]
    if len(pairs) < 2:
        return 0.0, sigmoid(0.0), alpha
    aligned = sum(a * r for a, r in pairs) / (sum(a for a, _ in pairs) + 1e-8)
    divergent = sum((1 - a) * r for a, r in pairs) / (sum(1 - a for a, _ in pairs) + 1e-8)
    tva = aligned - divergent
    return tva, sigmoid(tau * tva), alpha


def within_group_standardize(values: Sequence[float]) -> list[float]:
    """ẑ = (q − mean q)/sqrt(var q + 1e-8) over one group's tokens, Bessel variance (verl's `masked_var`); a single
    token has variance 0 (and ẑ = 0).

    >>> [round(v, 5) for v in within_group_standardize([0.0075987, -0.0075987, 0.0075987, -0.0075987])]
    [0.86597, -0.86597, 0.86597, -0.86597]
    """
    n = len(values)
    if n == 0:
        return []
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    scale = 1.0 / math.sqrt(var + 1e-8)
    return [(v - mean) * scale for v in values]


def _rows(group: Group, unit: str) -> list[list[tuple[int, int]]]:
    """The group's rows: lists of (trajectory index, step index)."""
    if unit == "step":
        return [[(i, t)] for i, traj in enumerate(group.trajectories) for t in range(len(traj.steps))]
    return [[(i, t) for t in range(len(traj.steps))] for i, traj in enumerate(group.trajectories) if traj.steps]


def _teacher_logps(group: Group, i: int, t: int) -> list[float]:
    step = group.trajectories[i].steps[t]
    if not step.action_ids:
        return []
    values = step.signals.get(SIGNAL)
    if values is None:
        raise ValueError(
            f"ADRS needs the teacher's log-probs of every action token (step.signals[{SIGNAL!r}]): declare the "
            f"{SIGNAL!r} signal (ADRSTrainer does) or compute it before the advantages"
        )
    if len(values) != len(step.action_ids):
        raise ValueError(
            f"step.signals[{SIGNAL!r}] has {len(values)} values for an action of {len(step.action_ids)} tokens"
        )
    return [float(v) for v in values]


@dataclass(frozen=True, kw_only=True)
class ADRSParams(CreditParams):
    """Settings of `adrs_advantages` (config fields of `ADRSConfig`).

    Attributes:
        adrs_eta: η (fix5: 0.02), the scale of q = η·m·r̂.
        adrs_variant: "released" (fix5: z + clip(η_eff·ẑ^T, ±c_g)) or "paper" (z + η_eff·m·r̂).
        adrs_unit: "step" (a row per step, verl-agent) or "episode" (a row per trajectory); the trainer resolves
            its config's "auto" from `row_format` and gives it at run time.
        adrs_normalize_mode: "per_seq" (std over the row's tokens) or "global" (over the batch's tokens).
        adrs_tva_tau: τ of the gate σ(τ·TVA) (2).
        adrs_tva_temperature: T_α of α = σ((c − mean c)/T_α) (1).
        adrs_clip: c of the released clip (0.2); 0 = no clipping.
        adrs_adaptive_clip: scale the clip by min(1, σ_g/median σ) (fix5: on).
        invalid_action_penalty: λ, on the score of invalid steps (verl-agent 0.1).
        adrs_std_eps: ε of the z-score (R − μ)/(σ + ε) and the σ below which a group gets no teacher term (verl's
            1e-6). A tiny ε inflates tiny spreads: a return difference of 1e-5 gives z = ±0.6 at 1e-6, ±0.047 at 1e-4.
        eta_eff: Run-time input: η_eff of this step (`adrs_eta_schedule`); None = η.
        gather: Run-time input: collects a list of floats from every process (the trainer's all-gather), so that
            the batch statistics are those of the whole generation batch; None = the groups of the call only.
    """

    adrs_eta: float = 0.02
    adrs_variant: str = "released"
    adrs_unit: str = "step"
    adrs_normalize_mode: str = "per_seq"
    adrs_tva_tau: float = 2.0
    adrs_tva_temperature: float = 1.0
    adrs_clip: float = 0.2
    adrs_adaptive_clip: bool = True
    adrs_std_eps: float = GRPO_EPS
    eta_eff: float | None = runtime_field()
    gather: Callable[[list[float]], list[float]] | None = runtime_field(compare=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("variant", self.adrs_variant, ADRS_VARIANTS)
        check_choice("unit", self.adrs_unit, ADRS_UNITS)
        check_choice("normalize_mode", self.adrs_normalize_mode, NORMALIZE_MODES)


@register_estimator("adrs", ADRSParams)
def adrs_advantages(groups: Sequence[Group], params: ADRSParams) -> tuple[list[TokenAdvantages], Stats]:
    """ADRS per-token advantages of every group of a batch (module docstring for the formulas).

    Args:
        groups: The healthy trajectories of each task; every step with action tokens carries
            `step.signals["teacher_logprobs"]` (one value per action token). Batch statistics (mean_batch c, the
            median group σ, the "global" std) are taken over all of them.
        params: `ADRSParams`.

    Returns:
        (advantages, stats): `advantages[g][i][t]` = one value per action token of step t of trajectory i (an empty
        list for a step without tokens); `stats` maps names (tva, gate, eta_eff, teacher_term_abs_mean,
        teacher_groups, clip_fraction) to (total, count) pairs.

    Example (one group, two one-step episodes: ℓ^T = [−1, −3] with return 1 and [−0.5, −1.5] with return 0; every
    intermediate number is in tests/methods/adrs/test_adrs_math.py):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def episode(logps, reward):
        ...     step = Step("o", "a", action_ids=[1, 2], reward=reward, signals={"teacher_logprobs": logps})
        ...     return Trajectory(task={}, steps=[step])
        >>> group = Group(task={}, trajectories=[episode([-1.0, -3.0], 1.0), episode([-0.5, -1.5], 0.0)])
        >>> advantages, stats = adrs_advantages([group], ADRSParams(adrs_eta=0.02))
        >>> [[round(a, 5) for a in traj[0]] for traj in advantages[0]]  # z = ±0.70711, teacher term ±0.01732
        [[0.72443, 0.68979], [-0.68979, -0.72443]]
    """
    eta, variant, unit = params.adrs_eta, params.adrs_variant, params.adrs_unit
    normalize_mode = params.adrs_normalize_mode
    tau, alpha_temperature, clip, adaptive = (params.adrs_tva_tau, params.adrs_tva_temperature, params.adrs_clip,
                                              params.adrs_adaptive_clip)
    invalid_penalty, std_eps, gather = params.invalid_action_penalty, params.adrs_std_eps, params.gather
    eta_eff = eta if params.eta_eff is None else params.eta_eff

    # Per group: rows, their tokens' centred scores (per step), alignments c_i and scores R_i.
    prepared = []
    for group in groups:
        rows = _rows(group, unit)
        returns = [traj.episode_return for traj in group.trajectories]
        row_tokens, row_alignment, row_scores = [], [], []
        for row in rows:
            tokens, raw = [], []
            for i, t in row:
                logps = _teacher_logps(group, i, t)
                tokens.append(centred_step_scores(logps))
                raw += [v for v in logps if math.isfinite(v)]
            row_tokens.append(tokens)
            row_alignment.append(sum(raw) / len(raw) if raw else None)  # c_i
            i, t = row[0]
            if unit == "step":  # s_{i,t} = R_i − λ·[invalid]
                step = group.trajectories[i].steps[t]
                row_scores.append(returns[i] - (invalid_penalty if not step.valid else 0.0))
            else:
                row_scores.append(returns[i])
        prepared.append((group, rows, row_tokens, row_alignment, row_scores))

    # Batch statistics: mean_batch c, and the global std of the centred scores.
    everywhere = gather or (lambda values: values)  # the batch's values, from every process
    alignments = everywhere([c for *_, aligned, _ in prepared for c in aligned if c is not None])
    batch_mean = sum(alignments) / len(alignments) if alignments else 0.0
    global_scale = 1.0
    if normalize_mode == "global":
        centred = everywhere([v for *_, tokens, _, _ in prepared for row in tokens for step in row for v in step
                              if v is not None])
        global_scale = 1.0 / (mean_std(centred)[1] + 1e-8) if len(centred) > 1 else 1.0

    # GRPO z-scores and σ_g of every group; the median σ for the adaptive clip.
    sigmas = [mean_std(scores) if len(scores) > 1 else (0.0, 1.0) for *_, scores in prepared]  # verl: (0, 1) for one
    valid_sigmas = everywhere([s for (_, s), p in zip(sigmas, prepared, strict=True) if len(p[1]) > 1 and s >= std_eps])
    median_sigma = lower_median(valid_sigmas) if (adaptive and valid_sigmas) else None

    stats = {name: [0.0, 0.0] for name in ("tva", "gate", "teacher_term_abs_mean", "teacher_groups", "clip_fraction")}
    out = []
    for (group, rows, row_tokens, row_alignment, row_scores), (mean, std) in zip(prepared, sigmas, strict=True):
        tva, gate, _ = tva_gate(row_alignment, row_scores, batch_mean, temperature=alpha_temperature, tau=tau)
        if rows:
            stats["tva"][0] += tva
            stats["tva"][1] += 1
            stats["gate"][0] += gate
            stats["gate"][1] += 1

        # r̂ of every token of every row (None where ℓ is not finite)
        rhat = []
        for tokens in row_tokens:
            if normalize_mode == "per_seq":
                finite = [v for step in tokens for v in step if v is not None]
                scale = 1.0 / (population_std(finite) + 1e-8)
            else:
                scale = global_scale
            rhat.append([[None if v is None else v * scale for v in step] for step in tokens])

        # the teacher term of every token
        if variant == "paper":
            terms = [[[0.0 if v is None else eta_eff * gate * v for v in step] for step in row] for row in rhat]
            active = eta_eff != 0
        else:
            active = eta_eff > 0 and len(rows) > 1 and std >= std_eps
            if active:
                q = [eta * gate * v for row in rhat for step in row for v in step if v is not None]
                zhat = iter(within_group_standardize(q))
                bound = adaptive_clip(std, median_sigma, clip) if clip > 0 else math.inf
                clipped = 0
                terms = []
                for row in rhat:
                    row_terms = []
                    for step in row:
                        step_terms = []
                        for v in step:
                            if v is None:
                                step_terms.append(0.0)
                                continue
                            raw = eta_eff * next(zhat)
                            clipped += abs(raw) > bound
                            step_terms.append(min(max(raw, -bound), bound))
                        row_terms.append(step_terms)
                    terms.append(row_terms)
                stats["clip_fraction"][0] += clipped
                stats["clip_fraction"][1] += len(q)
            else:
                terms = [[[0.0] * len(step) for step in row] for row in rhat]
        if rows:
            stats["teacher_groups"][0] += float(active)
            stats["teacher_groups"][1] += 1
        for row in terms:
            for step in row:
                stats["teacher_term_abs_mean"][0] += sum(abs(v) for v in step)
                stats["teacher_term_abs_mean"][1] += len(step)

        # A = z + teacher term, laid out per trajectory and step
        advantages: TokenAdvantages = [[[] for _ in traj.steps] for traj in group.trajectories]
        for row, score, row_terms in zip(rows, row_scores, terms, strict=True):
            z = (score - mean) / (std + std_eps)
            for (i, t), step_terms in zip(row, row_terms, strict=True):
                step = group.trajectories[i].steps[t]
                base = z - (invalid_penalty if unit == "episode" and not step.valid else 0.0)
                advantages[i][t] = [base + v for v in step_terms]
        out.append(advantages)

    stats_out = {name: (total, count) for name, (total, count) in stats.items()}
    stats_out["eta_eff"] = (float(eta_eff), 1.0)
    return out, stats_out
