"""`DarkRoomMonitor`: watch a run for the dark-room collapse of a dense reward (docs/methods/dark_room.md).

A dense shaping term in the *reward* (e.g. a prediction-accuracy bonus) can take over GRPO's z-scored advantage in
the groups where every episode failed: there the outcome has no variance, so whatever varies — the dense term — is
normalised to unit scale, whatever its coefficient (the Dark Room study, arXiv 2607.21273). The agent then maximises
the dense term alone: predictions get accurate while success drops to 0 and episodes run to the horizon.

After every new rollout the monitor reads `trainer.last_rollout` (any trainer that sets it: every trl-agents
trainer) and computes `trl_agents.distill.dark_room.collapse_diagnostics` (summed over processes); it logs them as `dark_room/*` metrics
(through `trainer.log_metric` when the trainer has it, else into the next `logs` of `on_log`) and warns once per
condition (`logger.warning`):

* collapse: prediction accuracy ≥ `accuracy_high` while success ≤ `success_low` and the mean episode length ≥
  `length_high` × the horizon (`max_turns`);
* dense share: the dense term's share of the within-group variance of the shaped return > `share_high` (50 %):
  most of the advantage comes from the dense term, not from the outcome.

Example:
    ```python
    from trl_agents.callbacks import DarkRoomMonitor

    trainer = AgentGRPOTrainer(model=..., args=config, train_dataset=tasks)
    trainer.add_callback(DarkRoomMonitor(trainer))
    ```
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from ..distill.dark_room import collapse_totals, diagnostics_from_totals, trajectory_dense

logger = logging.getLogger(__name__)

METRICS = ("success_rate", "episode_length", "length_ratio", "prediction_accuracy", "all_fail_fraction",
           "dense_share", "dense_share_all_fail", "dense_to_outcome_variance")


class DarkRoomMonitor(TrainerCallback):
    """Collapse monitor for the dense-reward "dark room" (see the module docstring).

    Args:
        trainer: The trainer whose `last_rollout` is read (it may also be set later with `bind(trainer)`).
        horizon: Episode horizon; default `trainer.args.max_turns`.
        dense: `dense(trajectory) -> float`, the dense part of an episode's return; default the sum of the steps'
            `prediction_shaping` signal (what the Dark Room trainer's reward channel adds).
        accuracy_high, success_low, length_high: Thresholds of the collapse warning (0.9, 0.05, 0.95).
        share_high: Threshold of the dense-share warning (0.5).
    """

    def __init__(
        self,
        trainer: Any = None,
        *,
        horizon: int | None = None,
        dense: Callable[[Any], float] = trajectory_dense,
        accuracy_high: float = 0.9,
        success_low: float = 0.05,
        length_high: float = 0.95,
        share_high: float = 0.5,
    ):
        self.trainer = trainer
        self.horizon = horizon
        self.dense = dense
        self.accuracy_high, self.success_low = accuracy_high, success_low
        self.length_high, self.share_high = length_high, share_high
        self.history: list[dict[str, Any]] = []
        self.warned: set[str] = set()
        self._seen: int | None = None
        self._pending: dict[str, float] = {}

    def bind(self, trainer: Any) -> DarkRoomMonitor:
        self.trainer = trainer
        return self

    def _horizon(self) -> int | None:
        if self.horizon is not None:
            return self.horizon
        return getattr(getattr(self.trainer, "args", None), "max_turns", None)

    def observe(self, rollout: Any, step: int | None = None) -> dict[str, Any]:
        """Diagnostics of one rollout (a `RolloutBatch`), recorded in `history`; warns when a condition holds."""
        groups = [group.healthy() for group in rollout.groups]
        totals = collapse_totals(groups, dense=self.dense)
        sum_over_processes = getattr(self.trainer, "sum_over_processes", None)
        if sum_over_processes is not None:  # the whole batch's diagnostics, on every process
            names = sorted(totals)
            flat = sum_over_processes([value for name in names for value in totals[name]])
            totals = {name: (flat[2 * i], flat[2 * i + 1]) for i, name in enumerate(names)}
        stats = diagnostics_from_totals(totals, horizon=self._horizon())
        self.history.append({"step": step, **stats})
        self.check(stats)
        return stats

    def check(self, stats: dict[str, Any]) -> list[str]:
        """The warnings `stats` raise (each logged once per monitor)."""
        raised = []
        accuracy, success, ratio = stats.get("prediction_accuracy"), stats.get("success_rate"), stats.get("length_ratio")
        if (accuracy is not None and success is not None and ratio is not None and accuracy >= self.accuracy_high
                and success <= self.success_low and ratio >= self.length_high):
            raised.append("collapse")
            if "collapse" not in self.warned:
                logger.warning(
                    "dark room: prediction accuracy %.2f while success %.2f and episodes run to %.0f%% of the horizon; "
                    "the dense reward has taken over (remove std normalisation: scale_rewards='none', or move the "
                    "signal into an auxiliary loss; docs/methods/dark_room.md).", accuracy, success, 100 * ratio)
        share = stats.get("dense_share")
        if share is not None and share > self.share_high:
            raised.append("dense_share")
            if "dense_share" not in self.warned:
                logger.warning(
                    "dark room: the dense term makes %.0f%% of the within-group variance of the shaped return (%.0f%% "
                    "of the groups failed entirely); under z-scoring it drives the advantage. Consider "
                    "scale_rewards='none' or an auxiliary loss (docs/methods/dark_room.md).",
                    100 * share, 100 * (stats.get("all_fail_fraction") or 0.0))
        self.warned.update(raised)
        return raised

    def on_step_end(self, args, state, control, **kwargs):
        rollout = getattr(self.trainer, "last_rollout", None)
        if rollout is None or id(rollout) == self._seen:
            return
        self._seen = id(rollout)  # a rollout serves several optimizer steps when steps_per_generation > 1
        stats = self.observe(rollout, state.global_step)
        values = {f"dark_room/{name}": float(stats[name]) for name in METRICS if stats.get(name) is not None}
        log_metric = getattr(self.trainer, "log_metric", None)
        if log_metric is not None:
            for name, value in values.items():
                log_metric(name, value)
        else:
            self._pending.update(values)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and self._pending:
            logs.update(self._pending)
            self._pending = {}
