"""OCSD: observation-calibrated self-distillation, a per-token modulation of GRPO's advantage.

OCSD (arXiv 2608.04788, "Observation-Calibrated Self-Distillation"; docs/methods/ocsd.md). The policy re-scores its
own action y of turn k under two replay views that differ only in one slot: the Full view shows the observation the
environment returned after the action (o_{k+1}), the Observation-Ablated view shows a fixed placeholder there. What
the real observation adds to the log-probability of each action token is the residual; it nudges the trajectory's
GRPO advantage up on tokens the outcome supports and down on the others, without ever flipping its sign. Only the
most uncertain steps of each trajectory are scored. Per trajectory i, step k, action token t:

    u_{i,k}   = −(1/T_{i,k}) Σ_t log π_old(y_t | h_k)                   step uncertainty (behaviour log-probs)
    S_i       = the ⌈ρ·K_i⌉ steps of trajectory i with the largest u    (at least 1; ρ = 0.2)
    e_{i,k,t} = log π_F(y_t | h_k, E^F(o_{k+1})) − log π_A(y_t | h_k, E^A)   observation residual (k ∈ S_i)
    q_{i,k,t} = tanh(e_{i,k,t} / 2) = 2σ(e) − 1 ∈ (−1, 1)
    Â_{i,k,t} = A_{i,k} · (1 + β·sgn(A_{i,k})·q_{i,k,t}) = A + β·|A|·q      k ∈ S_i;  Â = A elsewhere

A is GRPO's advantage of the step (the episode's z-scored return, minus the invalid-action penalty on a rejected
step); with β ∈ [0, 1) the multiplier 1 ± β·|q| stays in (1 − β, 1 + β), so Â has A's sign, and A = 0 gives Â = 0.

Numerical guards (ours): a token whose residual is not finite (a view that gives the token probability 0, a NaN
from a bad forward) gets q = 0, i.e. keeps A. Behaviour log-probs that are not finite are left out of u's mean; a
step with no finite one (or no action token) is not eligible for selection. ⌈ρ·K⌉ is taken with a 1e-9 slack so
that floating-point products such as 0.2·15 = 3.0000000000000004 give 3, not 4.

This module also holds the model signal that computes e after the rollout (`OCSDResidual`, registered as
`ocsd_residual`): the replay views (`replay_views`) are `PrivilegedView`s whose text comes after the student's user
message, so the teacher sees it right before the response tokens.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..credit.base import Stats, register_estimator, runtime_field
from ..credit.grpo import GRPOOutcomeParams
from ..signals.base import ModelSignal, register_signal
from ..signals.model import ScoringUnit, assign, score_units
from ..signals.views import PrivilegedView
from ..trajectory import Group, Trajectory, first_occurrences

SIGNAL_NAME = "ocsd_residual"
REPLAY_TEMPLATE = "{prompt}\n\n{context}"
"""Our choice: the replay scaffold follows the student's own user message, so that the teacher reads it right
before the response tokens it scores (the paper appends its scaffold to the step's context)."""
DEFAULT_SCAFFOLD = (
    "Replay note: this turn has already been played. The environment's reply to the response that follows was:\n"
    "<next_observation>\n{observation}\n</next_observation>"
)
"""Our wording of the replay scaffold E (the paper's text is not public): `{observation}` is o_{k+1} in the Full view
and the placeholder in the Observation-Ablated view; everything else is identical."""
DEFAULT_PLACEHOLDER = "[observation withheld]"
DEFAULT_TERMINAL_TEXT = "[episode ended]"
_CEIL_SLACK = 1e-9


# ---- step selection --------------------------------------------------------------------------------------------


def step_uncertainty(action_logprobs: Sequence[float]) -> float | None:
    """u = −mean_t log π_old(y_t) over the step's finite behaviour log-probs; None when there is none.

    >>> step_uncertainty([-0.5, -1.5])  # −(−0.5 − 1.5)/2
    1.0
    >>> step_uncertainty([-2.0, float("-inf")]), step_uncertainty([])  # non-finite tokens are left out
    (2.0, None)
    """
    finite = [float(x) for x in action_logprobs if math.isfinite(float(x))]
    if not finite:
        return None
    return -sum(finite) / len(finite)


def num_selected(num_eligible: int, fraction: float = 0.2) -> int:
    """⌈ρ·K⌉ steps out of K eligible ones, at least 1 (0 when K = 0).

    >>> [num_selected(k) for k in (0, 1, 5, 6, 10, 15)]  # ⌈0.2·6⌉ = ⌈1.2⌉ = 2; 0.2·15 → 3
    [0, 1, 1, 2, 2, 3]
    """
    check_fraction(fraction)
    if num_eligible <= 0:
        return 0
    return min(num_eligible, max(1, math.ceil(fraction * num_eligible - _CEIL_SLACK)))


def select_steps(uncertainties: Sequence[float | None], fraction: float = 0.2) -> list[int]:
    """Indices (ascending) of the ⌈ρ·K⌉ most uncertain steps of one trajectory, K = the steps whose u is not None.

    Ties go to the earlier step (our choice).

    >>> select_steps([0.1, 0.9, None, 0.4, 0.9, 0.2], fraction=0.5)  # K = 5 → 3 steps: 0.9, 0.9, 0.4
    [1, 3, 4]
    >>> select_steps([None, None]), select_steps([])
    ([], [])
    """
    eligible = [(i, u) for i, u in enumerate(uncertainties) if u is not None and math.isfinite(u)]
    count = num_selected(len(eligible), fraction)
    ranked = sorted(eligible, key=lambda pair: (-pair[1], pair[0]))  # largest u first, then the earlier step
    return sorted(i for i, _ in ranked[:count])


# ---- residual and modulation -----------------------------------------------------------------------------------


def residual_gate(residual: torch.Tensor) -> torch.Tensor:
    """q = tanh(e/2) (= 2σ(e) − 1), elementwise; 0 where e is not finite.

    >>> import torch
    >>> [round(q, 4) for q in residual_gate(torch.tensor([2.0, 0.0, -1.0, float("nan"), float("inf")])).tolist()]
    [0.7616, 0.0, -0.4621, 0.0, 0.0]
    """
    residual = torch.as_tensor(residual, dtype=torch.float32)
    finite = torch.isfinite(residual)
    safe = torch.where(finite, residual, torch.zeros_like(residual))
    return torch.where(finite, torch.tanh(safe / 2), torch.zeros_like(safe))  # q = tanh(e/2)


def modulate_advantage(advantage: float, q: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Â_t = A·(1 + β·sgn(A)·q_t) = A + β·|A|·q_t for every token of a selected step.

    >>> import torch
    >>> q = residual_gate(torch.tensor([2.0, 0.0, -1.0]))
    >>> [round(a, 4) for a in modulate_advantage(1.0, q).tolist()]   # 1 + 0.5·q
    [1.3808, 1.0, 0.7689]
    >>> [round(a, 4) for a in modulate_advantage(-1.0, q).tolist()]  # −1·(1 − 0.5·q)
    [-0.6192, -1.0, -1.2311]
    >>> modulate_advantage(0.0, q).tolist()
    [0.0, 0.0, 0.0]
    """
    check_beta(beta)
    q = torch.as_tensor(q, dtype=torch.float32)
    advantage = float(advantage)
    return advantage + beta * abs(advantage) * q  # Â = A + β·|A|·q = A·(1 + β·sgn(A)·q)


@dataclass(frozen=True, kw_only=True)
class OCSDParams(GRPOOutcomeParams):
    """Settings of `ocsd_advantages` (config fields of `OCSDConfig`).

    Attributes:
        scale_rewards, credit_statistic, invalid_action_penalty: GRPO's outcome advantage (`GRPOOutcomeParams`).
        ocsd_beta: β ∈ [0, 1) of the modulation Â = A + β·|A|·q.
        outcome_advantages: Run-time input: the step advantages to modulate, `advantages[g][i][k]`; None = GRPO's
            with the settings above (ε = 1e-4).
        signal: The step signal that holds a selected step's residuals; not a config field.
    """

    ocsd_beta: float = 0.5
    outcome_advantages: Sequence[Sequence[Sequence[float]]] | None = runtime_field(compare=False, repr=False)
    signal: str = runtime_field(SIGNAL_NAME)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_beta(self.ocsd_beta)


@register_estimator("ocsd", OCSDParams)
def ocsd_advantages(groups: Sequence[Group], params: OCSDParams) -> tuple[list[list[list[float | list[float]]]], Stats]:
    """GRPO's step advantages `advantages[g][i][k]` with the selected steps modulated token by token.

    A step is selected when `step.signals[signal]` holds its residuals (one per action token, as `OCSDResidual`
    stores them); it then gets a list Â_t, every other step keeps its scalar A.

    Returns:
        (advantages, stats): stats "selected_fraction" (selected steps / steps with action tokens), "mean_abs_q"
        (Σ|q| / action tokens of the selected steps), "mean_residual" (Σ e / tokens with a finite e),
        "nonfinite_residual_fraction" (tokens with a non-finite e / tokens) and "mean_abs_advantage_change"
        (Σ|Â − A| / tokens).

    Example (one trajectory, two steps, A = 1; the first is selected with e = [2, −1]):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> steps = [Step("o0", "a", action_ids=[5, 6], signals={SIGNAL_NAME: [2.0, -1.0]}),
        ...          Step("o1", "b", action_ids=[7], signals={SIGNAL_NAME: None})]
        >>> params = OCSDParams(outcome_advantages=[[[1.0, 1.0]]])
        >>> adv, stats = ocsd_advantages([Group({}, [Trajectory({}, steps)])], params)
        >>> [[round(a, 4) for a in adv[0][0][0]], adv[0][0][1]]
        [[1.3808, 0.7689], 1.0]
        >>> stats["selected_fraction"], round(stats["mean_abs_q"][0], 4)
        ((1.0, 2.0), 1.2237)
    """
    outcome = params.outcome_advantages
    if outcome is None:
        outcome = [params.episode_advantages(group) for group in groups]
    stats = dict.fromkeys(("steps", "selected", "tokens", "abs_q", "residual", "finite", "abs_change"), 0.0)
    out = []
    for group, group_advantages in zip(groups, outcome, strict=True):
        group_out = []
        for trajectory, step_advantages in zip(group.trajectories, group_advantages, strict=True):
            row = []
            for step, value in zip(trajectory.steps, step_advantages, strict=True):
                residual = step.signals.get(params.signal)
                stats["steps"] += bool(step.action_ids)
                if residual is None or not step.action_ids or not isinstance(value, (int, float)):
                    row.append(value)
                    continue
                if len(residual) != len(step.action_ids):
                    raise ValueError(
                        f"step.signals[{params.signal!r}] has {len(residual)} values for {len(step.action_ids)} "
                        "action tokens"
                    )
                e = torch.tensor([float(x) for x in residual], dtype=torch.float32)
                q = residual_gate(e)
                modulated = modulate_advantage(value, q, params.ocsd_beta)
                finite = torch.isfinite(e)
                stats["selected"] += 1
                stats["tokens"] += len(residual)
                stats["abs_q"] += float(q.abs().sum())
                stats["residual"] += float(torch.where(finite, e, torch.zeros_like(e)).sum())
                stats["finite"] += float(finite.sum())
                stats["abs_change"] += float((modulated - float(value)).abs().sum())
                row.append(modulated.tolist())
            group_out.append(row)
        out.append(group_out)
    return out, {
        "selected_fraction": (stats["selected"], stats["steps"]),
        "mean_abs_q": (stats["abs_q"], stats["tokens"]),
        "mean_residual": (stats["residual"], stats["finite"]),
        "nonfinite_residual_fraction": (stats["tokens"] - stats["finite"], stats["tokens"]),
        "mean_abs_advantage_change": (stats["abs_change"], stats["tokens"]),
    }


# ---- the replay views and the model signal ---------------------------------------------------------------------


def replay_observation(trajectory: Trajectory, index: int, terminal_text: str = DEFAULT_TERMINAL_TEXT) -> str:
    """o_{k+1} of step `index`: its `next_observation`; else the next step's observation; else (the last step of an
    episode without a terminal observation) `terminal_text`."""
    step = trajectory.steps[index]
    if step.next_observation is not None:
        return step.next_observation
    if index + 1 < len(trajectory.steps):
        return trajectory.steps[index + 1].observation
    return terminal_text


def replay_views(
    renderer,
    scaffold: str = DEFAULT_SCAFFOLD,
    placeholder: str = DEFAULT_PLACEHOLDER,
    terminal_text: str = DEFAULT_TERMINAL_TEXT,
) -> tuple[PrivilegedView, PrivilegedView]:
    """(Full, Observation-Ablated) views: the step's own prompt followed by the scaffold, with o_{k+1} or the
    placeholder in its `{observation}` slot; the same chat template, roles and text otherwise.

    Example:
        >>> from trl_agents.rollout.prompts import PromptRenderer
        >>> from trl_agents.testing import build_tiny_tokenizer
        >>> from trl_agents.trajectory import PromptParts, Step, Trajectory
        >>> step = Step("P F G", "right", prompt_parts=PromptParts("Reach G.", "", (), "P F G"),
        ...             next_observation="F P G")
        >>> full, ablated = replay_views(PromptRenderer(build_tiny_tokenizer()), scaffold="After: {observation}")
        >>> trajectory = Trajectory(task={}, steps=[step])
        >>> full.user_message(trajectory, 0), ablated.user_message(trajectory, 0)
        ('P F G\\n\\nAfter: F P G', 'P F G\\n\\nAfter: [observation withheld]')
    """
    check_scaffold(scaffold)

    def full(trajectory: Trajectory, index: int) -> str:
        return scaffold.format(observation=replay_observation(trajectory, index, terminal_text))

    def ablated(trajectory: Trajectory, index: int) -> str:
        return scaffold.format(observation=placeholder)

    return (PrivilegedView(renderer, full, REPLAY_TEMPLATE), PrivilegedView(renderer, ablated, REPLAY_TEMPLATE))


class OCSDResidual(ModelSignal):
    """e = log π_F − log π_A of every action token of the selected steps (None on the other steps).

    The steps are selected per trajectory by their behaviour uncertainty u (`select_steps`); the selected steps'
    action ids are scored under both replay views in one batched pass (`score_units`, within the context's
    rows/tokens per forward), by the context's teacher (the current policy by default), at the training
    temperature. Step rows only.
    """

    name = SIGNAL_NAME
    description = "observation residual log pi_F - log pi_A of the most uncertain steps' actions (two replay views)"
    layout = "tokens"

    def __init__(
        self,
        select_fraction: float = 0.2,
        scaffold: str = DEFAULT_SCAFFOLD,
        placeholder: str = DEFAULT_PLACEHOLDER,
        terminal_text: str = DEFAULT_TERMINAL_TEXT,
    ):
        check_fraction(select_fraction)
        check_scaffold(scaffold)
        self.select_fraction = select_fraction
        self.scaffold, self.placeholder, self.terminal_text = scaffold, placeholder, terminal_text

    def compute(self, groups: Sequence[Group], context) -> None:
        if context.row_format != "step":
            raise ValueError("ocsd_residual scores step rows only: set row_format='step'")
        full_view, ablated_view = replay_views(context.renderer, self.scaffold, self.placeholder, self.terminal_text)
        full_units, ablated_units = [], []
        for trajectory, indices in first_occurrences(groups):
            for index in indices:
                trajectory.steps[index].signals[self.name] = None
            uncertainties = [
                step_uncertainty(trajectory.steps[i].action_logprobs) if trajectory.steps[i].action_ids else None
                for i in indices
            ]
            for position in select_steps(uncertainties, self.select_fraction):
                index = indices[position]
                step = trajectory.steps[index]
                span = [(0, len(step.action_ids), step)]
                full_units.append(ScoringUnit(full_view.prompt_ids(trajectory, index), list(step.action_ids), span))
                ablated_units.append(
                    ScoringUnit(ablated_view.prompt_ids(trajectory, index), list(step.action_ids), span)
                )
        if not full_units:
            return
        teacher = context.teacher.context() if context.teacher is not None else context.model_context()
        with teacher as model:
            scored = score_units(model, full_units + ablated_units, pad_token_id=context.pad_token_id,
                                 temperature=context.temperature, max_rows=context.max_rows_per_forward,
                                 max_tokens=context.max_tokens_per_forward)
        n = len(full_units)
        residuals = [
            [f - a for f, a in zip(full, ablated, strict=True)]  # e_t = log π_F(y_t) − log π_A(y_t)
            for (full, _), (ablated, _) in zip(scored[:n], scored[n:], strict=True)
        ]
        assign(full_units, residuals, self.name)


def check_beta(beta: float) -> None:
    """β must be in [0, 1), so that the multiplier 1 + β·sgn(A)·q never flips the sign of A."""
    if isinstance(beta, bool) or not (isinstance(beta, int | float) and 0.0 <= beta < 1.0):
        raise ValueError(f"ocsd_beta must be in [0, 1) so that the advantage keeps its sign (e.g. 0.5), got {beta!r}")


def check_scaffold(scaffold: str) -> None:
    """The scaffold must format with one `{observation}` slot and no other field (double literal braces: `{{`)."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(scaffold) if name is not None]
    except (TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"ocsd_scaffold must be a string with one '{{observation}}' slot and no stray braces "
                         f"(double them: '{{{{'), got {scaffold!r}: {err}") from None
    if fields != ["observation"]:
        raise ValueError(f"ocsd_scaffold must contain '{{observation}}' exactly once and no other field (double "
                         f"literal braces: '{{{{'), got {scaffold!r}")


def check_fraction(fraction: float) -> None:
    if isinstance(fraction, bool) or not (isinstance(fraction, int | float) and 0.0 < fraction <= 1.0):
        raise ValueError(f"ocsd_select_fraction must be in (0, 1] (the paper: 0.2), got {fraction!r}")


register_signal(SIGNAL_NAME, OCSDResidual)
