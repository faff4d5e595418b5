"""Shared pieces of the credit-assignment (advantage) estimators, and the registry of estimators by name.

An estimator is a pure function `estimator(group, **options) -> StepAdvantages`: it reads ONE `Group` (the healthy
trajectories of one task; the trainer drops infrastructure-failed episodes before calling) and returns, for each
trajectory of `group.trajectories` (same order), one advantage per step (same order). Empty groups give `[]`,
zero-step trajectories give `[]` rows.

Invalid-action penalty λ (`invalid_penalty`), applied to every step row with `step.valid == False`. verl-agent
subtracts λ from the row's score before its group statistics (docs/concepts/verl_agent_conventions.md, "Invalid
actions and their penalty"). We follow it when the statistic is taken over step rows, and change the order when it
is taken over trajectories:

* statistic over STEP ROWS (verl-agent):   s_{i,t} = R_i − λ·[invalid_{i,t}],  μ, σ over all s_{i,t} of the group,
  A_{i,t} = (s_{i,t} − μ)/(σ + ε)  or  s_{i,t} − μ.
* statistic over TRAJECTORIES:             μ, σ over the n episode returns {R_j},
  A_{i,t} = norm(R_i) − λ·[invalid_{i,t}]   (the penalty is never divided by a std that may be ~0).
* GiGPO step returns always carry it before the anchor statistic: ρ_{i,t} = R_{i,t} − λ·[invalid_{i,t}]
  (verl-agent: local to the offending step, applied after discounting, not propagated to earlier steps).

Example:
    >>> from trl_agents.credit import get_estimator
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> group = Group(task={}, trajectories=[Trajectory(task={}, steps=[Step("s", "a", reward=r)]) for r in (1, 0)])
    >>> get_estimator("grpo")(group, scale="none")
    [[0.5], [-0.5]]
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Sequence

from ..envs.parsing import extract_answer
from ..names import did_you_mean
from ..trajectory import Group, Step

StepAdvantages = list[list[float]]
"""One list per trajectory of the group, one advantage per step."""

CreditEstimator = Callable[..., StepAdvantages]

CREDIT_ESTIMATORS: dict[str, CreditEstimator] = {}

STATISTICS = ("trajectories", "step_rows")


def register_estimator(name: str) -> Callable[[CreditEstimator], CreditEstimator]:
    """Decorator: register an advantage function under `name` (used by `get_estimator` and configs)."""

    def decorator(fn: CreditEstimator) -> CreditEstimator:
        if name in CREDIT_ESTIMATORS and CREDIT_ESTIMATORS[name] is not fn:
            raise ValueError(f"a credit estimator named {name!r} is already registered")
        CREDIT_ESTIMATORS[name] = fn
        return fn

    return decorator


def get_estimator(name: str) -> CreditEstimator:
    """The advantage function registered under `name`, or a ValueError listing the known names.

    >>> get_estimator("gigpp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Unknown credit estimator 'gigpp'. Known: ...gigpo, grpo... Did you mean 'gigpo'?
    """
    try:
        return CREDIT_ESTIMATORS[name]
    except (KeyError, TypeError):
        known = sorted(CREDIT_ESTIMATORS)
        hint = did_you_mean(name, known)
        raise ValueError(f"Unknown credit estimator {name!r}. Known: {', '.join(known)}.{hint}") from None


def check_choice(argument: str, value: str, choices: Sequence[str]) -> None:
    """Raise a ValueError naming the allowed values when `value` is not one of `choices`."""
    if value not in choices:
        raise ValueError(f"{argument} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_group(group: Group, invalid_penalty: float) -> None:
    """Reject inputs that would make advantages NaN/inf: non-finite rewards or penalty."""
    if not math.isfinite(invalid_penalty):
        raise ValueError(f"invalid_penalty must be finite, got {invalid_penalty}")
    for index, traj in enumerate(group.trajectories):
        # Any NaN/inf step reward makes the episode return NaN/inf, so one check per trajectory suffices.
        if not math.isfinite(traj.episode_return):
            rewards = [step.reward for step in traj.steps]
            raise ValueError(f"trajectory {index} of the group has a non-finite reward: {rewards}")


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Per-step discounted returns R_t = Σ_{k≥t} γ^{k−t} r_k, computed backwards as R_t = r_t + γ·R_{t+1}.

    >>> discounted_returns([0.0, 0.0, 1.0], 0.5)
    [0.25, 0.5, 1.0]
    """
    returns = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and Bessel-corrected std (as `torch.std` / TRL `nanstd`); the std of fewer than two values is 0.

    The mean is taken around the first value, so equal values give exactly zero deviations (advantage 0, never a
    rounding residue divided by ε).

    >>> mean_std([1.0, 0.0, 0.0, 1.0])
    (0.5, 0.5773502691896257)
    """
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    shift = values[0]
    mean = shift + sum(v - shift for v in values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def normalize(values: Sequence[float], mean: float, std: float, *, scale: bool, eps: float) -> list[float]:
    """(x − μ)/(σ + ε) when `scale`, else x − μ (Dr. GRPO / GiGPO `mean_norm`)."""
    if scale:
        return [(v - mean) / (std + eps) for v in values]
    return [v - mean for v in values]


def episode_advantages(
    group: Group,
    *,
    scale: bool,
    statistic: str,
    invalid_penalty: float,
    eps: float,
    singleton_stats: tuple[float, float] | None = None,
) -> StepAdvantages:
    """Group-relative advantage of the episode return, broadcast to every step (GRPO, and GiGPO's A^E).

    Args:
        group: The trajectories of one task.
        scale: Divide by (σ + ε) after centring (GRPO z-score, GiGPO `mean_std_norm`), or only centre.
        statistic: "trajectories": μ, σ over the n episode returns; "step_rows": over one score per step row, so
            longer episodes weigh more (verl-agent). See the module docstring for where λ enters in each case.
        invalid_penalty: λ, subtracted on rows whose action was invalid.
        eps: ε in the denominator.
        singleton_stats: (μ, σ) used when the population has exactly one element; None keeps the natural ones
            (μ = that value, σ = 0, so the advantage is 0). GiGPO passes (0, 1) as verl-agent does.
    """
    check_choice("statistic", statistic, STATISTICS)
    trajectories = group.trajectories
    returns = [traj.episode_return for traj in trajectories]

    if statistic == "step_rows":
        # s_{i,t} = R_i − λ·[invalid]; the statistic is over every step row of the group.
        scores = [
            [R - invalid_penalty if not step.valid else R for step in traj.steps]
            for R, traj in zip(returns, trajectories, strict=True)
        ]
        population = [s for row in scores for s in row]
        mean, std = singleton_stats if (singleton_stats is not None and len(population) == 1) else mean_std(population)
        return [normalize(row, mean, std, scale=scale, eps=eps) for row in scores]

    # Statistic over the n episode returns; the penalty is subtracted after normalisation.
    mean, std = singleton_stats if (singleton_stats is not None and len(returns) == 1) else mean_std(returns)
    return broadcast_to_steps(normalize(returns, mean, std, scale=scale, eps=eps), group, invalid_penalty)


def broadcast_to_steps(episode_values: Sequence[float], group: Group, invalid_penalty: float) -> StepAdvantages:
    """Give every step of trajectory i the value A_i, minus λ on invalid steps: A_{i,t} = A_i − λ·[invalid]."""
    return [
        [a - invalid_penalty if not step.valid else a for step in traj.steps]
        for a, traj in zip(episode_values, group.trajectories, strict=True)
    ]


# ---- what a step did and where: shared by the methods that group steps by state or by action -----------------------

INVALID_ACTION = "<invalid>"  # the one canonical action of every rejected step, when rejected actions are merged
ACTION_INFO_KEYS = ("action", "command")  # where envs report the action they parsed (ALFWorld uses "command")


def normalize_text(text: str) -> str:
    """Lower-case text with runs of whitespace collapsed to one space.

    >>> normalize_text("  Go to   Shelf 1\\n")
    'go to shelf 1'
    """
    return " ".join(str(text).lower().split())


def canonical_action(step: Step, *, merge_invalid: bool = False) -> str:
    """The action a step took, as the environment understood it.

    In order: `INVALID_ACTION` for a rejected step when `merge_invalid` (every rejected action is the same no-op,
    whatever its text); the env's parsed action (`info["action"]`, or ALFWorld's `info["command"]`); else the
    answer region of the reply (`extract_answer`: the last <action>/``` block, else the text without <think>).
    Always normalised (`normalize_text`); non-string values are JSON-encoded, so the result hashes.

    >>> canonical_action(Step("s", "I go <action>UP</action>", info={"action": "up"}))
    'up'
    >>> canonical_action(Step("s", "  Go   North "))
    'go north'
    >>> canonical_action(Step("s", "<think>left is a wall</think><action> Go  UP </action>"))
    'go up'
    >>> rejected = Step("s", "Jump!", valid=False)
    >>> canonical_action(rejected, merge_invalid=True), canonical_action(rejected)
    ('<invalid>', 'jump!')
    """
    if merge_invalid and not step.valid:
        return INVALID_ACTION
    info = step.info if isinstance(step.info, dict) else {}
    for key in ACTION_INFO_KEYS:
        value = info.get(key)
        if value is not None and value != "":
            return normalize_text(value) if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return normalize_text(extract_answer(step.action_text))


def anchor_key(step: Step, anchor: str) -> Hashable:
    """The state a step acted from: its `state_key` when `anchor == "state_key"` and the env gave one, else the
    observation text (verl-agent's anchor_obs)."""
    if anchor == "state_key" and step.state_key is not None:
        return step.state_key
    return step.observation
