"""Stop training after a wall-clock budget (for runs that must finish in a fixed time, like the quickstart)."""

from __future__ import annotations

import time

from transformers import TrainerCallback


class TimeBudgetCallback(TrainerCallback):
    """Stop training at the end of the first optimizer step that ends after `seconds` of training.

    Example:
        >>> from trl_agents.callbacks import TimeBudgetCallback
        >>> TimeBudgetCallback(seconds=300).seconds
        300
    """

    def __init__(self, seconds: float):
        if seconds <= 0:
            raise ValueError(f"the time budget must be positive, got {seconds}")
        self.seconds = seconds
        self.start: float | None = None
        self.stopped_at_step: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.start is not None and time.monotonic() - self.start >= self.seconds:
            control.should_training_stop = True
            self.stopped_at_step = state.global_step
        return control
