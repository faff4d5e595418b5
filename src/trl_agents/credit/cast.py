"""CAST advantages: the GRPO outcome advantage plus a shaped per-turn solver advantage, normalised over the batch.

CAST (Credit Assignment from Solver Teachers, arXiv 2607.25308), with the semantics of the reference code
(`Wloner0809/CAST`: `rllm/trainer/verl/oracle_advantage_mapping.py::mapping_cast` / `mapping_cast_ablate`, the
games' `step()`; docs/methods/cast.md#equations):

    Ã_{i,t} = N(s_t) − N(s_{t+1})                 solver advantage of turn t, N = solver cost-to-go (boundary rules
                                                  below; an invalid action gives Ã = 0)
    A_i     = (R_i − mean_g R) / std_g R          GRPO outcome advantage over the G episodes of the task, Bessel std;
                                                  a group of one, or with std < 1e-6, gives A_i = 0
    g(x)    = asinh(x)                            compression (ablations: identity, sign(x)·log(1 + |x|))
    RMS_B   = sqrt(mean_{all turns of all trajectories of the batch} g(Ã)²)   zeros included; 1 when no turns
    h(x)    = g(x) / (RMS_B + ε)                  ε = 1e-8 (ablation "none": h = g)
    A_{i,t} = A_i + α·h(Ã_{i,t}) − λ·[invalid]    α = 0.1 (paper); λ = 0 in CAST (no invalid-action penalty)

The solver term is added even when the group has zero reward variance, and RMS_B is a statistic of the whole batch:
every group of the call (and of every process, with `sum_over_processes`).

Boundary rules (INF = unsolvable):

* "shortest_path" (Sokoban `sokoban.py::step`, Rush Hour `rush_hour_env.py::step`):
  N(s_t) = INF → Ã = 0 (already dead);  N(s_{t+1}) = INF → Ã = −N(s_t) (fatal move);  else N(s_t) − N(s_{t+1}).
* "minesweeper" (`minesweeper_env.py::_compute_oracle_adv`, `oracle.py::oracle_advantage`), K = solver reveals:
  win → Ã = K(s_t), or the board's number of safe cells when K(s_t) = INF (K(s_{t+1}) := 0);
  mine hit → Ã = −K(s_t), 0 when K(s_t) = INF (K(s_{t+1}) := INF);
  otherwise both INF → 0; only K(s_{t+1}) = INF → −K(s_t); only K(s_t) = INF → +K(s_{t+1}) ("rescue");
  else K(s_t) − K(s_{t+1}).

N(s_t) and N(s_{t+1}) come from the `"solver_value"` signal, `step.signals["solver_value"] = (N(s_t), N(s_{t+1}))`,
which the rollout engine records where the environment lives when the trainer declares it (`trl_agents.signals`).
Which rules a group gets follows its environment's `solver_semantics` (the env contract, `envs/base.py`). The
board's number of safe cells that a Minesweeper rescue win earns is the env's `info["safe_cells"]`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..trajectory import Group, Step
from .base import CreditParams, StepAdvantages, Stats, check_choice, check_group, mean_std, register_estimator

SOLVER_RULES = ("shortest_path", "minesweeper")
TRANSFORMS = ("asinh", "identity", "signed_log")
NORMS = ("rms", "none")
ZERO_STD = 1e-6  # CAST `_compute_grpo_trajectory_advantages`: groups with std < 1e-6 get A_i = 0

Moments = tuple[float, float]
"""(Σ g(Ã)², number of turns): what RMS_B needs, summable across processes."""


@dataclass(frozen=True, kw_only=True)
class CASTParams(CreditParams):
    """Settings of `cast_advantages` (config fields of `CASTConfig`).

    Attributes:
        cast_alpha: α, weight of the shaped solver term (paper 0.1; the code's default when unset is 0.3).
        cast_transform: g: "asinh" (CAST), "identity" or "signed_log" (the `cast_ablate` ablation).
        cast_norm: "rms" (divide g by the batch RMS, CAST) or "none" (the ablation without normalisation).
        cast_eps: ε of h = g / (RMS + ε) (CAST `cast_eps`, 1e-8).
        solver_rule: "shortest_path" (Sokoban, Rush Hour) or "minesweeper" boundary rules, for all groups, or one per
            group (the trainer resolves its config's "auto" per group and gives that list at run time).
        invalid_action_penalty: λ, subtracted on steps with `valid=False` after the rest (CAST has none: 0).
        sum_over_processes: sums the local (Σ g², count) over the processes, so that RMS_B covers the global batch
            (docs/methods/cast.md, 'Our choices'); None: this call's groups are the batch.
    """

    invalid_action_penalty: float = 0.0
    cast_alpha: float = 0.1
    cast_transform: str = "asinh"
    cast_norm: str = "rms"
    cast_eps: float = 1e-8
    solver_rule: str | Sequence[str] = "shortest_path"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("transform", self.cast_transform, TRANSFORMS)
        check_choice("norm", self.cast_norm, NORMS)
        for rule in [self.solver_rule] if isinstance(self.solver_rule, str) else self.solver_rule:
            check_choice("solver_rule", rule, SOLVER_RULES)
        if not (math.isfinite(self.cast_alpha) and self.cast_alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {self.cast_alpha}")
        if not self.cast_eps > 0:
            raise ValueError(f"eps must be > 0, got {self.cast_eps}")


@register_estimator("cast", CASTParams)
def cast_advantages(groups: Sequence[Group], params: CASTParams) -> tuple[list[StepAdvantages], Stats]:
    """CAST advantages `A[g][i][t]` for every step of every trajectory of every group of a batch, plus diagnostics.

    Args:
        groups: The groups of one rollout (healthy trajectories only), each step carrying the `"solver_value"`
            signal (N(s_t), N(s_{t+1})).
        params: `CASTParams`.

    Returns:
        (advantages, stats): `advantages[g][i][t]`, and the stats "rms" (RMS_B, with count 1: already the global
        batch's), "solver_advantage_mean" (mean Ã over local turns), "nonzero_solver_fraction" (turns with Ã ≠ 0),
        "dead_step_fraction" (valid turns that started in an unsolvable state, N(s_t) = INF), "fatal_step_fraction"
        (valid turns from a solvable into an unsolvable state), "zero_variance_group_fraction" (groups whose
        outcome advantage is 0: only the solver term trains them).

    Example (one task, two episodes; A solves it in two optimal moves, B makes a fatal move from N = 2):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> def turn(before, after, reward=0.0):
        ...     return Step("s", "a", reward=reward, signals={"solver_value": (before, after)})
        >>> solved = Trajectory(task={}, steps=[turn(2, 1), turn(1, 0, reward=1.0)])
        >>> fatal = Trajectory(task={}, steps=[turn(2, float("inf"))])
        >>> (advantages,), _ = cast_advantages([Group(task={}, trajectories=[solved, fatal])], CASTParams())
        >>> [[round(a, 4) for a in row] for row in advantages]
        [[0.7871, 0.7871], [-0.8382]]
    """
    solver_rule, alpha, transform = params.solver_rule, params.cast_alpha, params.cast_transform
    invalid_penalty = params.invalid_action_penalty
    rules = [solver_rule] * len(groups) if isinstance(solver_rule, str) else list(solver_rule)
    if len(rules) != len(groups):
        raise ValueError(f"solver_rule has {len(rules)} entries for {len(groups)} groups")
    for group in groups:
        check_group(group)

    # Ã_{i,t}: the solver advantage of every turn, from the recorded N(s_t), N(s_{t+1}).
    solver = [solver_advantages(group, rule) for group, rule in zip(groups, rules, strict=True)]

    # RMS_B over ALL turns of ALL trajectories of the batch (zeros included); 1 when the batch has no turns.
    sum_squares, count = params.summed(shaping_moments(solver, transform))
    rms = math.sqrt(sum_squares / count) if count > 0 else 1.0
    scale = 1.0 / (rms + params.cast_eps) if params.cast_norm == "rms" else 1.0

    advantages: list[StepAdvantages] = []
    zero_variance = 0
    for group, group_solver in zip(groups, solver, strict=True):
        outcome = outcome_advantages(group)  # A_i
        zero_variance += bool(group.trajectories) and all(a == 0.0 for a in outcome)
        advantages.append(
            [
                [
                    # A_{i,t} = A_i + α·h(Ã_{i,t}) − λ·[invalid]
                    a_i + alpha * _transform(value, transform) * scale - (invalid_penalty if not step.valid else 0.0)
                    for step, value in zip(traj.steps, row, strict=True)
                ]
                for a_i, traj, row in zip(outcome, group.trajectories, group_solver, strict=True)
            ]
        )

    steps = [step for group in groups for traj in group.trajectories for step in traj.steps]
    values = [v for group_solver in solver for row in group_solver for v in row]
    valid = [_solver_values(step) for step in steps if step.valid]
    dead = sum(before == math.inf for before, _ in valid)
    fatal = sum(before < math.inf and after == math.inf for before, after in valid)
    stats = {
        "rms": (rms, 1.0),
        "solver_advantage_mean": (sum(values), len(values)),
        "nonzero_solver_fraction": (sum(v != 0.0 for v in values), len(values)),
        "dead_step_fraction": (dead, len(valid)),
        "fatal_step_fraction": (fatal, len(valid)),
        "zero_variance_group_fraction": (zero_variance, len(groups)),
    }
    return advantages, stats


def solver_advantages(group: Group, rule: str = "shortest_path") -> StepAdvantages:
    """Ã_{i,t} for every step of `group` under the boundary rules `rule` (see the module docstring).

    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> inf = float("inf")
    >>> steps = [Step("s", "a", signals={"solver_value": (n, m)}) for n, m in [(3, 2), (2, inf), (inf, inf)]]
    >>> solver_advantages(Group(task={}, trajectories=[Trajectory(task={}, steps=steps)]))
    [[1.0, -2.0, 0.0]]
    """
    check_choice("solver_rule", rule, SOLVER_RULES)
    return [[_solver_advantage(step, rule) for step in traj.steps] for traj in group.trajectories]


def outcome_advantages(group: Group) -> list[float]:
    """CAST's GRPO outcome advantage A_i = (R_i − μ)/σ over the group's episode returns (Bessel σ, no ε); 0 for a
    group of one episode or with σ < 1e-6 (`_compute_grpo_trajectory_advantages`).

    `credit.base.episode_advantages` divides by σ + ε and has no σ threshold, so it cannot give these numbers
    exactly; the formula is written out here.

    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> group = Group(task={}, trajectories=[Trajectory(task={}, steps=[Step("s", "a", reward=r)]) for r in (1, 0, 0, 1)])
    >>> [round(a, 4) for a in outcome_advantages(group)]
    [0.866, -0.866, -0.866, 0.866]
    """
    returns = [traj.episode_return for traj in group.trajectories]
    if len(returns) <= 1:
        return [0.0] * len(returns)
    mean, std = mean_std(returns)
    if std < ZERO_STD:
        return [0.0] * len(returns)
    return [(r - mean) / std for r in returns]


def shaping_moments(solver: Sequence[StepAdvantages], transform: str = "asinh") -> Moments:
    """(Σ g(Ã)², number of turns) over all turns of the given groups' solver advantages (zeros included)."""
    check_choice("transform", transform, TRANSFORMS)
    values = [_transform(v, transform) for group_solver in solver for row in group_solver for v in row]
    return float(sum(v * v for v in values)), float(len(values))


def _transform(x: float, name: str) -> float:
    """g(x): asinh (CAST), identity, or sign(x)·log(1 + |x|). All odd with g(0) = 0."""
    if name == "asinh":
        return math.asinh(x)
    if name == "signed_log":
        return math.copysign(math.log1p(abs(x)), x) if x else 0.0
    return x


def _solver_values(step: Step) -> tuple[float, float]:
    try:
        before, after = step.signals["solver_value"]
    except KeyError:
        raise ValueError(
            "CAST needs the solver values N(s_t), N(s_{t+1}) of every step (step.signals['solver_value']): run the "
            "rollout with the 'solver_value' signal (CASTTrainer declares it) on an environment with the "
            "`solver_value` capability."
        ) from None
    before, after = float(before), float(after)
    for value in (before, after):
        if math.isnan(value) or value < 0:
            raise ValueError(f"solver values must be >= 0 or inf, got N(s_t)={before}, N(s_t+1)={after}")
    return before, after


def _solver_advantage(step: Step, rule: str) -> float:
    """Ã of one turn (CAST boundary rules)."""
    if not step.valid:  # the state did not change: no signal
        return 0.0
    before, after = _solver_values(step)
    inf = math.inf
    if rule == "minesweeper":
        if step.info.get("success"):  # win: K(s_{t+1}) := 0; a "rescue win" from K = INF earns #safe cells
            return float(_minesweeper_safe_cells(step)) if before == inf else before
        if step.info.get("mine_hit"):  # K(s_{t+1}) := INF
            return 0.0 if before == inf else -before
        if before == inf:
            return 0.0 if after == inf else after  # "rescue": the agent beat the solver
        return -before if after == inf else before - after
    if before == inf:  # shortest_path: already dead
        return 0.0
    return -before if after == inf else before - after


def _minesweeper_safe_cells(step: Step) -> int:
    """The board's number of safe cells (rows·cols − mines), which CAST pays for a win from K(s_t) = INF: the
    environment reports it as `info["safe_cells"]` (our Minesweeper does on every step)."""
    if "safe_cells" in step.info:
        return int(step.info["safe_cells"])
    raise ValueError(
        "A Minesweeper win from K(s_t) = inf is credited with the board's number of safe cells, but the step's info "
        "has no 'safe_cells': report it from the environment's step(), or use solver_rule='shortest_path' for "
        "environments whose solver_value counts actions to success."
    )
