"""`EchoTrapMonitor`: watch any trl-agents run for the "echo trap" collapse, optionally filter low-variance groups.

RAGEN (StarPO, arXiv 2504.20073) names the echo trap: after some updates, multi-turn PPO/GRPO agents fall into
near-identical trajectories; the in-group reward variance collapses first (an early sign), the rollout entropy drops,
and gradient-norm spikes mark the irreversible part. Its fix StarPO-S keeps only the groups (prompts) with the
highest in-group reward std (top 25 % in its v1 code); RAGEN-2 (arXiv 2604.06268) filters low reward-variance groups
the same way. Tool-use RL adds a fourth sign: the share of parsable (valid) actions falls when the action format
breaks (arXiv 2606.26027). docs/concepts/monitors.md describes all of it.

After every new rollout (`trainer.last_rollout`) the monitor computes, over the healthy episodes of every process:

| metric (logged as `collapse/<name>`) | what |
|---|---|
| `reward_std` | mean over groups of the std of the episode returns within the group (Bessel-corrected; 0 for one episode) |
| `zero_std_fraction` | share of groups whose episodes all returned the same |
| `rollout_entropy` | −mean log-prob of the sampled action tokens: an estimate of the sampling policy's token entropy |
| `distinct_trajectories` | mean over groups of (distinct action sequences − 1) / (G − 1): 0 when every episode repeats one |
| `valid_action_rate` | share of steps whose action the environment accepted |

and reads TRL's `entropy` (the exact per-token entropy of the policy in the loss) and the Trainer's `grad_norm` from
each log. A warning (`logger.warning`, once per condition; every occurrence goes to `alerts`) fires when, for
`patience` logs in a row,

* `reward_std`, `entropy`, `rollout_entropy` or `distinct_trajectories` is at most `drop_ratio` × its baseline (the
  mean of its first `baseline_logs` values);
* `valid_action_rate` is at most `valid_ratio` × its baseline;
* `zero_std_fraction` is at least `zero_std_high` (no group carries a learning signal);
* `grad_norm` exceeds `grad_spike` × the median of its earlier values (at least `baseline_logs` of them).

`stop_on` names conditions that also stop training. Filtering (off by default): `filter_min_std` drops the groups
whose reward std is below it, `filter_top_fraction` keeps the top fraction of groups by reward std (over every
process); a dropped group is not trained on but still counts in the rollout metrics. It acts through the trainer's
`group_filters` (after credit, before the training rows; `AgentGRPOTrainer`), so groups are normalised as usual and
only their rows are left out. When a filter would drop every group, the rollout is kept whole (`collapse/
filter_bypassed`), so that a collapsed run is reported rather than stopped by an empty batch.

Example:
    ```python
    from trl_agents.callbacks import EchoTrapMonitor

    trainer = AgentGRPOTrainer(model=..., args=config, train_dataset=tasks)
    trainer.add_callback(EchoTrapMonitor(trainer, filter_top_fraction=0.5))  # RAGEN's filter, keep the top 50 %
    ```
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

from ..credit.base import mean_std
from ..trajectory import Group, first_occurrences

logger = logging.getLogger(__name__)

ROLLOUT_METRICS = ("reward_std", "zero_std_fraction", "rollout_entropy", "distinct_trajectories", "valid_action_rate")
DROPS = ("reward_std", "entropy", "rollout_entropy", "distinct_trajectories")  # collapse = fall to drop_ratio × start
CONDITIONS = (*DROPS, "valid_action_rate", "zero_std_fraction", "grad_spike")
ADVICE = {
    "reward_std": "the in-group reward variance collapsed (RAGEN's early sign of the echo trap): consider "
                  "filter_top_fraction (keep the high-variance groups), more diverse tasks, or a higher temperature",
    "entropy": "the policy's token entropy collapsed: trajectories become near-identical",
    "rollout_entropy": "the sampled actions became near-deterministic (the rollout entropy collapsed)",
    "distinct_trajectories": "the episodes of a group repeat one another (the echo trap)",
    "valid_action_rate": "the share of valid actions fell: the action format may be breaking down",
    "zero_std_fraction": "almost no group has reward variance: GRPO's advantages are 0 and nothing is learned",
    "grad_spike": "gradient-norm spike (RAGEN: the sign of an irreversible collapse): lower the learning rate, "
                  "restart from an earlier checkpoint, or use clip-higher (epsilon_high 0.28)",
}


def group_reward_std(group: Group) -> float:
    """Bessel-corrected std of the episode returns of a group (0 for fewer than two episodes).

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> group = Group({}, [Trajectory({}, steps=[Step("o", "a", reward=r)]) for r in (0.0, 1.0, 1.0, 0.0)])
    >>> round(group_reward_std(group), 4)   # mean 0.5, Σ(r - 0.5)² = 1, sqrt(1 / 3)
    0.5774
    """
    return mean_std([t.episode_return for t in group.trajectories])[1]


def distinct_fraction(group: Group) -> float | None:
    """(distinct action sequences − 1) / (G − 1) over the episodes of a group; None for fewer than two episodes.

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> episodes = [Trajectory({}, steps=[Step("o", a)]) for a in ("up", "up", "left")]
    >>> distinct_fraction(Group({}, episodes))   # 2 distinct of 3: (2 - 1) / (3 - 1)
    0.5
    """
    if len(group.trajectories) < 2:
        return None
    sequences = {tuple(s.action_text for s in t.steps) for t in group.trajectories}
    return (len(sequences) - 1) / (len(group.trajectories) - 1)


def rollout_totals(groups: Sequence[Group]) -> dict[str, tuple[float, float]]:
    """(total, count) of each of `ROLLOUT_METRICS` over `groups` (healthy episodes), to be summed over processes."""
    nonempty = [g for g in groups if g.trajectories]
    stds = [group_reward_std(g) for g in nonempty]
    distinct = [d for d in (distinct_fraction(g) for g in nonempty) if d is not None]
    nll, tokens, valid, steps = 0.0, 0, 0, 0
    for trajectory, indices in first_occurrences(nonempty):  # each step once (trees share steps)
        for index in indices:
            step = trajectory.steps[index]
            steps += 1
            valid += bool(step.valid)
            for logprob in step.action_logprobs or ():
                if logprob is not None and math.isfinite(logprob):
                    nll -= logprob
                    tokens += 1
    return {
        "reward_std": (sum(stds), len(stds)),
        "zero_std_fraction": (sum(s < 1e-8 for s in stds), len(stds)),
        "rollout_entropy": (nll, tokens),
        "distinct_trajectories": (sum(distinct), len(distinct)),
        "valid_action_rate": (valid, steps),
    }


def variance_keep(stds: Sequence[float | None], min_std: float | None = None, top_fraction: float | None = None,
                  bypass: bool = True) -> list[bool]:
    """Which groups a reward-variance filter keeps (None = an empty group: never kept, not counted).

    `min_std`: keep std >= min_std. `top_fraction` p: keep the ceil(p·N) groups of highest std among the N non-empty
    ones (ties: the earlier). Both: a group must pass both. When nothing would be kept and `bypass`, every non-empty
    group is.

    >>> variance_keep([0.0, 0.5, 0.2, None], min_std=0.1)
    [False, True, True, False]
    >>> variance_keep([0.0, 0.5, 0.2, 0.4], top_fraction=0.5)      # the 2 of highest std
    [False, True, False, True]
    >>> variance_keep([0.0, 0.0], min_std=0.1)                     # nothing passes: all kept (bypass)
    [True, True]
    """
    present = [i for i, s in enumerate(stds) if s is not None]
    keep = [s is not None and (min_std is None or s >= min_std) for s in stds]
    if top_fraction is not None and present:
        k = max(1, math.ceil(top_fraction * len(present)))
        ranked = sorted(present, key=lambda i: (-stds[i], i))[:k]
        top = set(ranked)
        keep = [ok and i in top for i, ok in enumerate(keep)]
    if bypass and present and not any(keep):
        keep = [s is not None for s in stds]
    return keep


class RewardVarianceFilter:
    """A trainer group filter (`trainer.group_filters`): RAGEN's reward-variance filtering over every process.

    Args:
        trainer: Its accelerator gathers the groups' stds (top fraction over the whole batch); may be None (one
            process).
        min_std: Drop the groups whose reward std is below this (e.g. 1e-6: DAPO's zero-variance groups).
        top_fraction: Keep this fraction of the groups, the highest reward std first (RAGEN v1: 0.25).
    """

    def __init__(self, trainer: Any = None, min_std: float | None = None, top_fraction: float | None = None):
        if min_std is not None and not (math.isfinite(min_std) and min_std >= 0):
            raise ValueError(f"filter_min_std must be a finite number >= 0 or None, got {min_std!r}")
        if top_fraction is not None and not 0.0 < top_fraction <= 1.0:
            raise ValueError(f"filter_top_fraction must be in (0, 1] or None (RAGEN: 0.25), got {top_fraction!r}")
        self.trainer, self.min_std, self.top_fraction = trainer, min_std, top_fraction
        self.last: dict[str, float] = {}

    def __call__(self, groups: Sequence[Group]) -> list[bool]:
        local = [group_reward_std(g) if g.trajectories else None for g in groups]
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            parts = gather_object([local])  # one list per process, in process order
            offset = sum(len(p) for p in parts[: accelerator.process_index])
            everything = [s for part in parts for s in part]
        else:
            offset, everything = 0, local
        keep_all = variance_keep(everything, self.min_std, self.top_fraction, bypass=False)
        present = sum(s is not None for s in everything)
        bypassed = present > 0 and not any(keep_all)
        if bypassed:  # nothing passes: train on the whole rollout rather than on nothing
            keep_all = [s is not None for s in everything]
        self.last = {"filtered_group_fraction": (present - sum(keep_all)) / present if present else 0.0,
                     "filter_bypassed": float(bypassed)}
        log_metric = getattr(self.trainer, "log_metric", None)
        if log_metric is not None:
            for name, value in self.last.items():
                log_metric(f"collapse/{name}", value)
        return keep_all[offset: offset + len(local)]


class EchoTrapMonitor(TrainerCallback):
    """Echo-trap collapse monitor (see the module docstring) for any trl-agents trainer.

    Args:
        trainer: The trainer whose `last_rollout` is read and whose `group_filters` get the variance filter (may be
            set later with `bind(trainer)`).
        baseline_logs: How many first logs make each metric's baseline (3).
        drop_ratio: A DROPS metric collapses at <= drop_ratio × its baseline (0.2).
        valid_ratio: `valid_action_rate` collapses at <= valid_ratio × its baseline (0.7).
        zero_std_high: `zero_std_fraction` at or above this warns (0.9).
        grad_spike: `grad_norm` above grad_spike × the median of its earlier values warns (10).
        patience: Consecutive logs a condition must hold before it is reported (2).
        stop_on: Conditions (names of `CONDITIONS`) that also stop training.
        filter_min_std, filter_top_fraction: The reward-variance filter (`RewardVarianceFilter`); both None = off.
    """

    def __init__(
        self,
        trainer: Any = None,
        *,
        baseline_logs: int = 3,
        drop_ratio: float = 0.2,
        valid_ratio: float = 0.7,
        zero_std_high: float = 0.9,
        grad_spike: float = 10.0,
        patience: int = 2,
        stop_on: Sequence[str] = (),
        filter_min_std: float | None = None,
        filter_top_fraction: float | None = None,
    ):
        unknown = sorted(set(stop_on) - set(CONDITIONS))
        if unknown:
            raise ValueError(f"stop_on names unknown conditions {unknown}; known: {', '.join(CONDITIONS)}")
        if baseline_logs < 1 or patience < 1:
            raise ValueError(f"baseline_logs and patience must be >= 1, got {baseline_logs} and {patience}")
        self.baseline_logs, self.drop_ratio, self.valid_ratio = baseline_logs, drop_ratio, valid_ratio
        self.zero_std_high, self.grad_spike, self.patience = zero_std_high, grad_spike, patience
        self.stop_on = tuple(stop_on)
        self.filter = None
        if filter_min_std is not None or filter_top_fraction is not None:
            self.filter = RewardVarianceFilter(None, filter_min_std, filter_top_fraction)
        self.trainer = None
        self.values: dict[str, list[float]] = {}  # every value seen per metric, in order
        self.streaks: dict[str, int] = {}
        self.alerts: list[dict[str, Any]] = []  # every (step, condition, value) that held for `patience` logs
        self.warned: set[str] = set()
        self.history: list[dict[str, Any]] = []
        self._seen: int | None = None
        self._pending: dict[str, float] = {}
        self.verbose = True  # warnings on this process (on_log: the main process only)
        if trainer is not None:
            self.bind(trainer)

    def bind(self, trainer: Any) -> EchoTrapMonitor:
        """Attach to `trainer` (and register the filter in its `group_filters`)."""
        self.trainer = trainer
        if self.filter is not None:
            filters = getattr(trainer, "group_filters", None)
            if filters is None:
                raise TypeError(f"{type(trainer).__name__} has no `group_filters`: the reward-variance filter needs "
                                "an AgentGRPOTrainer (trl_agents); use the monitor without filter_* options")
            self.filter.trainer = trainer
            if self.filter not in filters:
                filters.append(self.filter)
        return self

    # ---- observations ------------------------------------------------------------------------------------------

    def observe_rollout(self, rollout: Any) -> dict[str, float]:
        """The rollout metrics of a `RolloutBatch` (summed over processes when the trainer can)."""
        totals = rollout_totals([group.healthy() for group in rollout.groups])
        sum_over_processes = getattr(self.trainer, "sum_over_processes", None)
        names = sorted(totals)
        if sum_over_processes is not None:
            flat = sum_over_processes([v for name in names for v in totals[name]])
            totals = {name: (flat[2 * i], flat[2 * i + 1]) for i, name in enumerate(names)}
        return {name: total / count for name, (total, count) in totals.items() if count > 0}

    def check(self, values: dict[str, float], step: int | None = None) -> list[str]:
        """Update the baselines and streaks with one log's `values` (names of ROLLOUT_METRICS, `entropy`,
        `grad_norm`); return the conditions reported at this log (held for `patience` logs in a row)."""
        holding = []
        for name in (*ROLLOUT_METRICS, "entropy", "grad_norm"):
            value = values.get(name)
            if value is None or not math.isfinite(value):
                continue
            earlier = self.values.setdefault(name, [])
            if len(earlier) >= self.baseline_logs:
                baseline = sum(earlier[: self.baseline_logs]) / self.baseline_logs
                ratio = self.drop_ratio if name in DROPS else self.valid_ratio if name == "valid_action_rate" else None
                if ratio is not None and baseline > 0 and value <= ratio * baseline:
                    holding.append(name)
                elif name == "grad_norm" and value > self.grad_spike * statistics.median(earlier):
                    holding.append("grad_spike")
            if name == "zero_std_fraction" and value >= self.zero_std_high:
                holding.append(name)
            earlier.append(value)
        reported = []
        for condition in CONDITIONS:
            self.streaks[condition] = self.streaks.get(condition, 0) + 1 if condition in holding else 0
            if self.streaks[condition] >= self.patience:
                reported.append(condition)
                metric = "grad_norm" if condition == "grad_spike" else condition
                self.alerts.append({"step": step, "condition": condition, "value": values.get(metric)})
                if condition not in self.warned:
                    self.warned.add(condition)
                    if self.verbose:
                            logger.warning("echo trap at step %s: %s = %.4g (%s).", step, metric, values.get(metric),
                                       ADVICE[condition])
        self.history.append({"step": step, **values, "alerts": reported})
        return reported

    # ---- callback events ---------------------------------------------------------------------------------------

    def on_step_end(self, args, state, control, **kwargs):
        rollout = getattr(self.trainer, "last_rollout", None)
        if rollout is None or id(rollout) == self._seen:
            return
        self._seen = id(rollout)  # a rollout serves several optimizer steps when steps_per_generation > 1
        values = {f"collapse/{name}": value for name, value in self.observe_rollout(rollout).items()}
        log_metric = getattr(self.trainer, "log_metric", None)
        if log_metric is not None and getattr(self.trainer.model, "training", True):
            for name, value in values.items():
                log_metric(name, value)
        else:
            self._pending.update(values)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or any(key.startswith("eval_") for key in logs):
            return
        if self._pending:
            logs.update(self._pending)
            self._pending = {}
        values = {name: logs[f"collapse/{name}"] for name in ROLLOUT_METRICS if f"collapse/{name}" in logs}
        for name in ("entropy", "grad_norm"):
            if isinstance(logs.get(name), int | float):
                values[name] = float(logs[name])
        if not values:
            return
        self.verbose = state.is_world_process_zero
        reported = self.check(values, state.global_step)
        if any(condition in self.stop_on for condition in reported):
            control.should_training_stop = True
        return control
