"""Shared pieces of the credit-assignment (advantage) estimators, and the registry that dispatches to them by name.

Every estimator is ONE pure function with one signature:

    x_advantages(groups, params) -> (advantages, stats)

* `groups`: a sequence of `Group`, one per task of the batch (the healthy trajectories of that task; the trainer
  drops infrastructure-failed episodes before calling). Batch-wide statistics are taken over these groups (and over
  every training process where the params carry `sum_over_processes`).
* `params`: a frozen dataclass `XParams` (a `CreditParams`), whose field names are the config field names of the
  method (`invalid_action_penalty`, `gamma`, `scale_rewards`, ...): `XParams.from_config(args, **runtime)` reads
  them off a config, `runtime` gives the run-time inputs (fields made with `runtime_field`). Its `__post_init__`
  validates the settings, once.
* `advantages`: one entry per group: for each trajectory of the group (same order) one advantage per step (same
  order), or one list of per-token values per step where the estimator works per token. Empty groups give `[]`,
  zero-step trajectories give `[]` rows.
* `stats`: the call's diagnostics, `name -> (total, count)` summed over its groups; a trainer logs each as
  `<method>/<name>` = Σ total / Σ count over all processes (`AgentGRPOTrainer.estimate`), skipped where Σ count is
  0; `stat_means` gives the means of one call. Every call returns the same names whatever the groups, so that every
  process logs the same metrics.

`register_estimator(name, XParams)` records a function with its params class; `get_estimator(name)` returns the
`Estimator`, from which a caller builds the params (`estimator.from_config(args)`, or `estimator.params(...)`) and
calls the function (`estimator(groups, params)`).

Invalid-action penalty λ (`invalid_action_penalty`), applied to every step row with `step.valid == False`.
verl-agent subtracts λ from the row's score before its group statistics (docs/concepts/verl_agent_conventions.md,
"Invalid actions and their penalty"). We follow it when the statistic is taken over step rows, and change the order
when it is taken over trajectories:

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
    >>> grpo = get_estimator("grpo")
    >>> grpo([group], grpo.params(scale_rewards="none"))
    ([[[0.5], [-0.5]]], {})
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..envs.parsing import extract_answer
from ..names import check_choice, did_you_mean
from ..trajectory import Group, Step

StepAdvantages = list[list[float]]
"""One list per trajectory of the group, one advantage per step."""

Stats = dict[str, tuple[float, float]]
"""Diagnostics of one estimator call: name -> (total, count), summed over its groups; the logged value is
Σ total / Σ count (over every process)."""

STATISTICS = ("trajectories", "step_rows")
RUNTIME = "runtime"  # field metadata key of the run-time inputs (`runtime_field`)


def runtime_field(default: Any = None, **kwargs: Any) -> Any:
    """A params field that `CreditParams.from_config` does not read from the config: a run-time input, known only
    when the estimator runs (a state-score table, the policy's hidden states, the all-reduce of the trainer), or a
    constant of the method that no config sets (an ε). Given as a keyword of `from_config(args, **runtime)`, or
    left at its default."""
    return field(default=default, metadata={RUNTIME: True}, **kwargs)


def _sum_locally(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values]


@dataclass(frozen=True, kw_only=True)
class CreditParams:
    """The settings of one credit estimator: the base of every `XParams`.

    Field names are config field names (`trainers/agent_grpo_config.py`, the method's config class), so that
    `XParams.from_config(args)` reads them off a config; fields made with `runtime_field` are run-time inputs
    instead. Defaults are the estimator's own (not necessarily the config's). Subclasses validate their fields in
    `__post_init__` (calling this one), once, so that a bad setting fails when the params are built.

    Attributes:
        invalid_action_penalty: λ, subtracted from the credit of steps whose action the environment rejected (where
            and how: the module docstring of `trl_agents.credit.base`).
        sum_over_processes: Run-time input: sums a list of floats elementwise over the training processes (the
            trainer's all-reduce), for estimators with a batch-wide statistic; None = the groups of the call are the
            whole batch. Every process must make the same calls.
    """

    invalid_action_penalty: float = 0.1
    sum_over_processes: Callable[[Sequence[float]], list[float]] | None = runtime_field(compare=False, repr=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.invalid_action_penalty):
            raise ValueError(f"invalid_penalty must be finite, got {self.invalid_action_penalty}")

    @classmethod
    def from_config(cls, args: Any, **runtime: Any) -> CreditParams:
        """These params from a config: every field that is not a run-time input is read off `args` (an attribute of
        the same name); `runtime` gives run-time inputs, and may override a config value with the one that applies
        at run time (e.g. a per-group resolution of an "auto" setting).

        >>> from types import SimpleNamespace
        >>> CreditParams.from_config(SimpleNamespace(invalid_action_penalty=0.5))
        CreditParams(invalid_action_penalty=0.5)
        """
        known = {f.name: f for f in fields(cls) if f.init}
        unknown = sorted(set(runtime) - set(known))
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(map(repr, unknown))}; fields: {', '.join(known)}")
        from_args = [name for name, f in known.items() if not f.metadata.get(RUNTIME) and name not in runtime]
        missing = [name for name in from_args if not hasattr(args, name)]
        if missing:
            raise ValueError(
                f"{cls.__name__}.from_config needs the config field(s) {', '.join(map(repr, missing))}, which "
                f"{type(args).__name__} does not have"
            )
        return cls(**{name: getattr(args, name) for name in from_args}, **runtime)

    def summed(self, values: Sequence[float]) -> list[float]:
        """`values` summed elementwise over the processes (`sum_over_processes`), or as they are without it."""
        return (self.sum_over_processes or _sum_locally)(values)


ANCHORS = ("state_key", "observation")


@dataclass(frozen=True, kw_only=True)
class AnchorParams(CreditParams):
    """The settings of the estimators that group step rows by the state they acted from (GiGPO Eq. 6; `anchor_key`).

    Attributes:
        anchor: What identifies a state: "state_key" (`step.state_key`, or `step.observation` when it is None) or
            "observation" (the raw current observation text, like verl-agent's `anchor_obs`).
        similarity_threshold: None for exact keys. A value in (0, 1) clusters text anchors greedily: a row joins the
            FIRST cluster whose first member has `SequenceMatcher(None, row, first).ratio() >= threshold`, else it
            opens a new cluster (verl-agent `enable_similarity`; its default threshold is 0.95). O(rows²).
    """

    anchor: str = "state_key"
    similarity_threshold: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("anchor", self.anchor, ANCHORS)
        if self.similarity_threshold is not None and not 0.0 < self.similarity_threshold < 1.0:
            raise ValueError(f"similarity_threshold must be in (0, 1) or None, got {self.similarity_threshold}")


@dataclass(frozen=True)
class Estimator:
    """A registered credit estimator: `function(groups, params) -> (advantages, stats)` and its params class.

    Attributes:
        name: The registry name.
        function: The estimator.
        params: Its `CreditParams` class (`estimator.params(...)` builds params, `estimator.from_config(args)` reads
            them off a config).
        metrics: The stats a trainer logs (all when None); the others are diagnostics for direct callers.
    """

    name: str
    function: Callable[..., tuple[list, Stats]]
    params: type[CreditParams]
    metrics: tuple[str, ...] | None = None

    def __call__(self, groups: Sequence[Group], params: CreditParams) -> tuple[list, Stats]:
        if not isinstance(params, self.params):
            raise TypeError(f"the {self.name!r} estimator takes {self.params.__name__}, got {type(params).__name__}")
        return self.function(groups, params)

    def from_config(self, args: Any, **runtime: Any) -> CreditParams:
        """`self.params.from_config(args, **runtime)`."""
        return self.params.from_config(args, **runtime)

    def logged(self, stats: Stats) -> Stats:
        """The stats a trainer logs (`metrics`)."""
        return dict(stats) if self.metrics is None else {name: stats[name] for name in self.metrics}


CREDIT_ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(
    name: str, params: type[CreditParams], *, metrics: Sequence[str] | None = None
) -> Callable[[Callable], Callable]:
    """Decorator: register an estimator `fn(groups, params) -> (advantages, stats)` under `name`, with its params
    class (used by `get_estimator`, configs and `AgentGRPOTrainer.estimate`); `metrics`: the stats a trainer logs
    (None: all)."""
    if not (isinstance(params, type) and issubclass(params, CreditParams)):
        raise TypeError(f"register_estimator({name!r}, ...) needs a CreditParams subclass, got {params!r}")

    def decorator(fn: Callable) -> Callable:
        entry = Estimator(name, fn, params, None if metrics is None else tuple(metrics))
        if name in CREDIT_ESTIMATORS and CREDIT_ESTIMATORS[name] != entry:
            raise ValueError(f"a credit estimator named {name!r} is already registered")
        CREDIT_ESTIMATORS[name] = entry
        return fn

    return decorator


def get_estimator(name: str) -> Estimator:
    """The estimator registered under `name`, or a ValueError listing the known names.

    >>> get_estimator("rloo").params
    <class 'trl_agents.credit.rloo.RLOOParams'>
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


def group_totals(per_group: Sequence[Mapping[str, float]], names: Sequence[str]) -> Stats:
    """Each of `names` as (Σ value, number of groups) over per-group diagnostics: logged, their mean over those
    groups (pass only the groups a mean is over, e.g. those with anchor states).

    >>> group_totals([{"size": 2.0}, {"size": 3.0}], ["size"])
    {'size': (5.0, 2)}
    """
    return {name: (sum(values[name] for values in per_group), len(per_group)) for name in names}


def batch_result(
    results: Iterable[tuple[Any, Mapping[str, float]]],
    names: Sequence[str],
    counted: Callable[[Mapping[str, float]], Any] | None = None,
) -> tuple[list, Stats]:
    """An estimator's (advantages, stats) from its groups' (advantages, diagnostics), in group order: the advantages,
    one entry per group, and `names` of the diagnostics as `group_totals` over the groups `counted` keeps (all when
    None; e.g. those with anchor states).

    >>> batch_result([([[1.0]], {"size": 2.0}), ([], {"size": 0.0})], ["size"], counted=lambda stats: stats["size"])
    ([[[1.0]], []], {'size': (2.0, 1)})
    """
    results = list(results)
    kept = [stats for _, stats in results if counted is None or counted(stats)]
    return [advantages for advantages, _ in results], group_totals(kept, names)


def stat_means(stats: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """The value of each stat of one call, total / count (0.0 where the count is 0).

    >>> stat_means({"size": (5.0, 2), "rate": (0.0, 0)})
    {'size': 2.5, 'rate': 0.0}
    """
    return {name: total / count if count else 0.0 for name, (total, count) in stats.items()}


def check_positive(name: str, value: float) -> None:
    """Raise a ValueError naming `name` when `value` is not > 0 (NaN included)."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def check_finite(**values: float) -> None:
    """Raise a ValueError naming the first of `values` (name=value) that is not a finite number."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")


def check_group(group: Group) -> None:
    """Reject inputs that would make advantages NaN/inf: non-finite rewards (`CreditParams` checks the penalty)."""
    group.check_finite_rewards()


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
