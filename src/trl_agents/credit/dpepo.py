"""DPEPO advantages: GRPO's outcome z-score, shrunk or amplified by a step-level diversity weight W.

DPEPO (Diverse Parallel Exploration Policy Optimization, arXiv 2604.24320; docs/methods/dpepo.md). One policy turn
acts in any subset of K parallel copies of the same task (the `parallel` environment, `trl_agents.envs.parallel`):
it answers `<think>…</think><parallel><env_1>a_1</env_1>…</parallel>`. The weight W of a turn measures how much the
turn repeats itself, computed as the released code computes it (`calculate_penalties` of its ALFWorld rollout loop).
For the parsed actions {e: a_e} of the turn, each acting environment e (1 ≤ e ≤ K) with action history H_e (the
actions taken in e at earlier turns) and previous action a_e⁻ = H_e[−1]:

    C_depth(e) = #{j : H_e[j] = a_e}                                  a_e was already taken in e (anywhere)
    M_depth(e) = #{j : (H_e[j], H_e[j+1]) = (a_e⁻, a_e)}              the transition a_e⁻ → a_e was already made in e
    M_width(e) = Σ_{w acting, w≠e} #{j : (H'_w[j], H'_w[j+1]) = (a_e⁻, a_e)},   H'_w = H_w + [a_w]
    W_env(e)   = ( α^C_depth(e) + γ^M_depth(e) + β^M_width(e) ) / 3
    C_width    = #{actions of the turn, "look" excluded} − #{distinct ones}   two copies doing the same thing
    W          = round( ( ω^C_width + mean_e W_env(e) ) / 2, 4 )              ∈ (0, 1]
    W          = w_none (0.5)   when the turn has no parsable action

(The previous action stands in for the state: a "transition" is a consecutive action pair. With an empty history
there is no previous action and no pair can match: M_depth = M_width = 0.) The ScienceWorld loop adds the number n
of sub-actions the simulator rejected ("No known action matches that input."), ψ = 0.95:

    formula "scienceworld":           W = round( ( ω^C_width + mean_e W_env(e) + ψ^n ) / 3, 4 )
    formula "scienceworld_released":  W = round( ψ^n, 4 )

The second is what the released ScienceWorld script trains with: a second loop overwrites the weight of every turn
with the invalid-action term alone (a quirk we reproduce as an option, docs/methods/dpepo.md).

The advantage (verl-agent `compute_grpo_outcome_advantage` with `add_step_penalty`): with R_i the episode return
(sum over turns of the best sub-environment reward) and μ_g, σ_g the mean and Bessel std over every STEP ROW of the
group (each trajectory's return counted once per turn, "cross-step" statistics; a group with a single row uses
μ = 0, σ = 1):

    z_{i,t} = (R_i − λ·[invalid_{i,t}] − μ_g) / (σ_g + 1e-6)
    W'      = 2 − W_{i,t}  if z_{i,t} < 0  else  W_{i,t}
    A_{i,t} = z_{i,t} · W'

so repetition shrinks a positive advantage (×W ≤ 1) and amplifies a negative one (×(2 − W) ≥ 1).

Numerical guards: an empty group gives []; all-equal returns (all failed, all solved) give σ = 0 and z = 0 exactly
(the mean is taken around the first value), so A = 0 whatever W; a singleton row gets μ = 0, σ = 1 as in verl-agent;
a turn whose parsed actions all name environments outside 1..K would divide by zero in the released code and gets
w_none here; every factor is a power of a number in (0, 1], so W is finite and in (0, 1].

Example (the hand case of docs/methods/dpepo.md; s = "go to shelf 1", d = "open drawer 1", c = "go to cabinet 2"):
    >>> histories = {1: ["go to shelf 1", "open drawer 1", "go to shelf 1", "open drawer 1"],
    ...              2: ["go to shelf 1", "open drawer 1"], 3: []}
    >>> actions = [(1, "go to shelf 1"), (2, "go to shelf 1"), (3, "go to cabinet 2")]
    >>> terms = weight_terms(actions, histories, num_envs=4)
    >>> [(e.env, e.c_depth, e.m_depth, e.m_width) for e in terms.envs]
    [(1, 2, 1, 1), (2, 1, 0, 2), (3, 0, 0, 0)]
    >>> terms.c_width, terms.weight  # (0.8¹ + (2.54/3 + 2.7025/3 + 3/3)/3) / 2 = 0.857917
    (1, 0.8579)
    >>> diversity_weight([], histories, num_envs=4)  # nothing parsable
    0.5
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..trajectory import Group, Trajectory
from .base import (CreditParams, Stats, StepAdvantages, batch_result, check_choice, check_group, episode_advantages,
                   register_estimator, runtime_field)

# The released configuration (`ppo_trainer_parallel.yaml`; the launchers set ω = 0.80 instead of the yaml's 0.95).
DEPTH_ALPHA = 0.8  # α: base of the repeated-action term
DEPTH_GAMMA = 0.95  # γ: base of the repeated-transition term within an environment
WIDTH_BETA = 0.95  # β: base of the repeated-transition term across environments
WIDTH_OMEGA = 0.8  # ω: base of the same-action-in-several-environments term (launchers)
INVALID_PSI = 0.95  # ψ: base of the rejected-sub-action term (ScienceWorld)
NO_ACTION_WEIGHT = 0.5  # W of a turn without any parsable action
EPS = 1e-6  # verl-agent's ε in (R − μ)/(σ + ε)
WIDTH_EXEMPT = ("look",)  # actions C_width does not count (ALFWorld's "look" may be repeated freely)
FORMULAS = ("alfworld", "scienceworld", "scienceworld_released")
DPEPO_STATS = ("mean_weight", "no_action_fraction", "mean_envs_per_step", "amplified_fraction")

Actions = Sequence[tuple[int, str]] | Mapping[int, str]


@dataclass(frozen=True)
class EnvTerms:
    """The counts of one acting environment e: C_depth, M_depth, M_width and W_env(e)."""

    env: int
    c_depth: int
    m_depth: int
    m_width: int
    weight: float


@dataclass(frozen=True)
class WeightTerms:
    """Everything W of one turn is made of: the per-environment terms, C_width, the rejected count n, and W."""

    envs: tuple[EnvTerms, ...]
    c_width: int
    invalid: int
    weight: float


def consecutive_pairs(actions: Sequence[str]) -> list[tuple[str, str]]:
    """The transitions of an action history: (a_0, a_1), (a_1, a_2), ...

    >>> consecutive_pairs(["a", "b", "a"])
    [('a', 'b'), ('b', 'a')]
    """
    return list(itertools.pairwise(actions))


def _check_base(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")


def _check_weight_settings(alpha: float, gamma: float, beta: float, omega: float, psi: float, formula: str) -> None:
    check_choice("formula", formula, FORMULAS)
    for name, value in (("alpha", alpha), ("gamma", gamma), ("beta", beta), ("omega", omega), ("psi", psi)):
        _check_base(name, value)


def weight_terms(
    actions: Actions,
    histories: Mapping[int, Sequence[str]],
    *,
    num_envs: int,
    alpha: float = DEPTH_ALPHA,
    gamma: float = DEPTH_GAMMA,
    beta: float = WIDTH_BETA,
    omega: float = WIDTH_OMEGA,
    formula: str = "alfworld",
    invalid: int = 0,
    psi: float = INVALID_PSI,
    no_action_weight: float = NO_ACTION_WEIGHT,
    width_exempt: Sequence[str] = WIDTH_EXEMPT,
) -> WeightTerms:
    """The diversity weight W of one turn, with its parts (module docstring).

    Args:
        actions: The parsed actions of the turn, (environment number, action text) in the order they were written
            (or a dict); numbers outside 1..`num_envs` count towards C_width only, as in the released code.
        histories: Environment number -> the actions taken in it at earlier turns, oldest first (missing = none).
        num_envs: K, the number of parallel environments.
        alpha, gamma, beta, omega, psi: The bases α, γ, β, ω, ψ, each in (0, 1].
        formula: "alfworld" (the default), "scienceworld" (adds ψ^n) or "scienceworld_released" (ψ^n alone).
        invalid: n, the sub-actions of this turn the environment rejected (read by the ScienceWorld formulas).
        no_action_weight: W of a turn without any parsable action (0.5).
        width_exempt: Actions that C_width does not count ("look").
    """
    _check_weight_settings(alpha, gamma, beta, omega, psi, formula)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
    if isinstance(invalid, bool) or not isinstance(invalid, int) or invalid < 0:
        raise ValueError(f"invalid must be an integer >= 0, got {invalid!r}")
    pairs = list(actions.items()) if isinstance(actions, Mapping) else list(actions)
    parsed = {int(env): str(text).strip() for env, text in pairs}  # later duplicates overwrite, as a dict does
    history = {int(env): [str(a).strip() for a in past] for env, past in histories.items()}
    if not parsed:
        return WeightTerms((), 0, invalid, no_action_weight)
    acting = sorted(env for env in parsed if 1 <= env <= num_envs)

    envs = []
    for env in acting:
        action, past = parsed[env], history.get(env, [])
        c_depth = past.count(action)  # C_depth: a_e anywhere in e's history
        last = (past[-1], action) if past else None  # the transition a_e⁻ → a_e (none with an empty history)
        m_depth = consecutive_pairs(past).count(last) if last else 0  # M_depth: made before in e
        m_width = 0  # M_width: made in the other acting environments, their action of this turn included
        if last:
            for other in acting:
                if other != env:
                    m_width += consecutive_pairs(history.get(other, []) + [parsed[other]]).count(last)
        w_env = (alpha**c_depth + gamma**m_depth + beta**m_width) / 3  # W_env(e)
        envs.append(EnvTerms(env, c_depth, m_depth, m_width, w_env))

    counted = [a for a in parsed.values() if a not in width_exempt]
    c_width = len(counted) - len(set(counted))  # C_width: the same action in several environments
    if formula == "scienceworld_released":
        weight = psi**invalid  # the released ScienceWorld script's overwrite: the invalid-action term alone
    elif not envs:
        weight = no_action_weight  # only out-of-range numbers: the released code divides by zero here
    else:
        mean_env = sum(e.weight for e in envs) / len(envs)
        if formula == "alfworld":
            weight = (omega**c_width + mean_env) / 2  # W = (ω^C_width + mean_e W_env) / 2
        else:
            weight = (omega**c_width + mean_env + psi**invalid) / 3  # ScienceWorld: + ψ^n, over 3
    return WeightTerms(tuple(envs), c_width, invalid, round(weight, 4))


def diversity_weight(actions: Actions, histories: Mapping[int, Sequence[str]], **options: Any) -> float:
    """W of one turn (`weight_terms(...).weight`)."""
    return weight_terms(actions, histories, **options).weight


def reweight(z: float, weight: float) -> float:
    """A = z·W when z ≥ 0, z·(2 − W) when z < 0: repetition shrinks credit and amplifies blame.

    >>> reweight(1.0, 0.8), reweight(-1.0, 0.8), reweight(0.0, 0.8)
    (0.8, -1.2, 0.0)
    """
    return z * ((2.0 - weight) if z < 0 else weight)


# ---- from recorded trajectories ----------------------------------------------------------------------------------

INFO_ACTIONS = "env_actions"  # [[env, action], ...]: the parsed actions of the turn, in written order
INFO_APPLIED = "applied"  # [env, ...]: the environments the turn actually stepped (their actions join the history)
INFO_INVALID = "invalid_count"  # n: the applied sub-actions the inner environment rejected
INFO_NUM_ENVS = "num_envs"  # K


def trajectory_weights(trajectory: Trajectory, **options: Any) -> list[float]:
    """W of every turn of a trajectory of the `parallel` environment, rebuilt from its steps' `info` (the parsed
    actions, which of them were applied, the rejected count, K): the history of environment e at turn t is the
    actions applied in e at turns 0..t−1, as in the released code (an action sent to an environment outside 1..K,
    or to one that has ended, is not applied and joins no history)."""
    histories: dict[int, list[str]] = {}
    weights = []
    for index, step in enumerate(trajectory.steps):
        info = step.info or {}
        if INFO_ACTIONS not in info or INFO_NUM_ENVS not in info:
            raise ValueError(
                f"step {index} of episode {trajectory.episode_id} has no parallel-environment info "
                f"({INFO_ACTIONS!r}, {INFO_NUM_ENVS!r}): DPEPO trains on the 'parallel' environment "
                "(env_name: parallel, env_kwargs: {inner: <env>, num_envs: 4})"
            )
        actions = [(int(env), str(action)) for env, action in info[INFO_ACTIONS]]
        weights.append(diversity_weight(actions, histories, num_envs=int(info[INFO_NUM_ENVS]),
                                        invalid=int(info.get(INFO_INVALID, 0)), **options))
        parsed = dict(actions)
        for env in info.get(INFO_APPLIED, []):
            histories.setdefault(int(env), []).append(parsed[int(env)].strip())
    return weights


@dataclass(frozen=True, kw_only=True)
class DPEPOParams(CreditParams):
    """Settings of `dpepo_advantages` (config fields of `DPEPOConfig`).

    Attributes:
        dpepo_depth_alpha, dpepo_depth_gamma, dpepo_width_beta, dpepo_width_omega, dpepo_invalid_psi: The bases α, γ,
            β, ω, ψ of the diversity weight W (`weight_terms`), each in (0, 1].
        dpepo_no_action_weight: W of a turn without any parsable action (0.5).
        dpepo_weight_formula: How W combines its terms: "alfworld", "scienceworld" or "scienceworld_released".
        dpepo_diversity_weight: False gives the plain cross-step GRPO z-score (DPEPO without `parallel_reward`).
        invalid_action_penalty: λ, subtracted from the score of a step row whose action was invalid before the
            statistic (default 0 here).
        weights: Run-time input: W per step, one entry per group (one list per trajectory); None computes them from
            the steps' info (`trajectory_weights`).
        width_exempt: Actions that C_width does not count ("look"); not a config field.
        eps: ε of (σ + ε) (verl-agent: 1e-6); not a config field.
    """

    invalid_action_penalty: float = 0.0
    dpepo_depth_alpha: float = DEPTH_ALPHA
    dpepo_depth_gamma: float = DEPTH_GAMMA
    dpepo_width_beta: float = WIDTH_BETA
    dpepo_width_omega: float = WIDTH_OMEGA
    dpepo_invalid_psi: float = INVALID_PSI
    dpepo_no_action_weight: float = NO_ACTION_WEIGHT
    dpepo_weight_formula: str = "alfworld"
    dpepo_diversity_weight: bool = True
    weights: Sequence[Sequence[Sequence[float]]] | None = runtime_field(compare=False, repr=False)
    width_exempt: Sequence[str] = runtime_field(WIDTH_EXEMPT)
    eps: float = runtime_field(EPS)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_weight_settings(self.dpepo_depth_alpha, self.dpepo_depth_gamma, self.dpepo_width_beta,
                               self.dpepo_width_omega, self.dpepo_invalid_psi, self.dpepo_weight_formula)
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps must be a finite number > 0, got {self.eps}")

    def weight_options(self) -> dict[str, Any]:
        """The keyword arguments of `trajectory_weights` / `weight_terms` these params set."""
        return {"alpha": self.dpepo_depth_alpha, "gamma": self.dpepo_depth_gamma, "beta": self.dpepo_width_beta,
                "omega": self.dpepo_width_omega, "psi": self.dpepo_invalid_psi, "formula": self.dpepo_weight_formula,
                "no_action_weight": self.dpepo_no_action_weight, "width_exempt": self.width_exempt}


@register_estimator("dpepo", DPEPOParams)
def dpepo_advantages(groups: Sequence[Group], params: DPEPOParams) -> tuple[list[StepAdvantages], Stats]:
    """A_{i,t} = z_{i,t}·W' (module docstring) for every step of every trajectory of every group.

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats, per group then
        averaged over the groups: "mean_weight" (mean W over the group's steps; 1 for a group without steps),
        "no_action_fraction" (steps with nothing parsable), "mean_envs_per_step" (acting environments per step) and
        "amplified_fraction" (steps whose negative advantage was scaled by 2 − W > 1).

    Example (returns 1 over two turns and 0 over one turn; W = 0.8579 then 1 for the first, 0.5 for the second):
        >>> from trl_agents.trajectory import Step, Trajectory
        >>> group = Group(task={}, trajectories=[
        ...     Trajectory(task={}, steps=[Step("o", "x"), Step("o", "y", reward=1.0)]),
        ...     Trajectory(task={}, steps=[Step("o", "z")], episode_id=1)])
        >>> params = DPEPOParams(weights=[[[0.8579, 1.0], [0.5]]])
        >>> (rows,), _ = dpepo_advantages([group], params)  # z = +0.57735, +0.57735, −1.1547
        >>> [[round(a, 4) for a in row] for row in rows]  # 0.57735·0.8579, 0.57735·1, −1.1547·(2 − 0.5); ε shows
        [[0.4953, 0.5773], [-1.732]]
    """
    weights = [None] * len(groups) if params.weights is None else list(params.weights)
    if len(weights) != len(groups):
        raise ValueError(f"weights has {len(weights)} entries for {len(groups)} groups (one per group)")
    pairs = zip(groups, weights, strict=True)
    return batch_result((_dpepo_group(group, group_weights, params) for group, group_weights in pairs), DPEPO_STATS)


def _dpepo_group(
    group: Group, weights: Sequence[Sequence[float]] | None, params: DPEPOParams
) -> tuple[StepAdvantages, dict[str, float]]:
    """DPEPO on one group (`weights`: W per step, or None to compute them from the steps' info)."""
    check_group(group)
    z = episode_advantages(group, scale=True, statistic="step_rows", invalid_penalty=params.invalid_action_penalty,
                           eps=params.eps, singleton_stats=(0.0, 1.0))
    diversity = params.dpepo_diversity_weight
    if weights is None:  # (also without the diversity weight: W is logged)
        weights = [trajectory_weights(t, **params.weight_options()) for t in group.trajectories]
    if not diversity:
        advantages = z
    else:
        if [len(w) for w in weights] != [len(row) for row in z]:
            raise ValueError(f"weights must give one value per step: lengths {[len(w) for w in weights]} for "
                             f"trajectories of {[len(row) for row in z]} steps")
        advantages = [[reweight(a, w) for a, w in zip(row, ws)] for row, ws in zip(z, weights)]
    steps = [s for t in group.trajectories for s in t.steps]
    flat_w = [w for row in weights for w in row]
    flat_a = [a for row in advantages for a in row]
    count = max(len(steps), 1)
    stats = {
        "mean_weight": sum(flat_w) / count if steps else 1.0,
        "no_action_fraction": sum(not s.info.get(INFO_ACTIONS) for s in steps) / count,
        "mean_envs_per_step": sum(len(s.info.get(INFO_APPLIED, [])) for s in steps) / count,
        "amplified_fraction": sum(a < 0 and w < 1 for a, w in zip(flat_a, flat_w)) / count if diversity else 0.0,
    }
    return advantages, stats
