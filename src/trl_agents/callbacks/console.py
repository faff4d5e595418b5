"""A compact console: one short line per logging step instead of the whole metrics dict.

`trl-agents train` logs 15+ metrics a step (rollout, credit, signals, TRL's own); printed as a dict they bury what a
person watching a run wants. `compact_line` keeps five of them — step, success, return, loss, step time — and
`use_compact_console` swaps transformers' console callbacks (the progress bar's log writer, or the plain printer
when progress bars are off) for ones that print it. Everything still goes to `report_to` and to `metrics.json`:
only what the console shows changes.

Example:
    >>> from types import SimpleNamespace
    >>> state = SimpleNamespace(global_step=3, max_steps=500)
    >>> compact_line(state, {"env/success_rate": 0.4375, "reward": 0.4375, "loss": 0.01234, "step_time": 2.31})
    'step 3/500 | success 0.438 | return 0.438 | loss 0.0123 | 2.31 s/step'
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_callback import PrinterCallback, ProgressCallback

FIELDS = (  # (label, metric keys in order of preference, format)
    ("success", ("env/success_rate",), "{:.3f}"),
    ("return", ("env/episode_return", "reward"), "{:.3g}"),
    ("loss", ("loss",), "{:.3g}"),
)


TRACKER_ONLY = ("eval_before_rl/", "eval_after_rl/", "warm_start/")
"""Prefixes of entries logged for the trackers only (`trl-agents train` prints those evaluations itself)."""


def compact_line(state: Any, logs: dict[str, Any]) -> str | None:
    """One line for a log entry: training steps show step, success, return, loss and step time; evaluation entries
    their success and return; the end-of-training summary its run time; None for a tracker-only entry
    (`TRACKER_ONLY`).

    >>> compact_line(None, {"eval_after_rl/success_rate": 0.5, "epoch": 1.0}) is None
    True
    """
    own = [key for key in logs if key not in ("epoch", "step")]  # (Trainer.log adds the epoch to every entry)
    if own and all(key.startswith(TRACKER_ONLY) for key in own):
        return None
    if "train_runtime" in logs:
        ended = "stopped" if getattr(state, "max_steps", 0) and state.global_step < state.max_steps else "done"
        return f"{ended}: {state.global_step} steps in {logs['train_runtime']:.0f} s"  # stopped: early (a signal, ...)
    prefix = "eval_" if any(key.startswith("eval_") for key in logs) else ""
    parts = [f"{'eval at ' if prefix else ''}step {state.global_step}/{state.max_steps}"]
    for label, keys, form in FIELDS:
        for key in keys:
            value = logs.get(prefix + key)
            if isinstance(value, int | float):
                parts.append(f"{label} {form.format(value)}")
                break
    if isinstance(logs.get("step_time"), int | float):
        parts.append(f"{logs['step_time']:.3g} s/step")
    return " | ".join(parts)


class CompactProgressCallback(ProgressCallback):
    """transformers' progress bar, writing `compact_line` under it instead of the metrics dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = compact_line(state, logs) if logs else None
        if state.is_world_process_zero and self.training_bar is not None and line:
            self.training_bar.write(line)


class CompactPrinterCallback(PrinterCallback):
    """transformers' printer (progress bars off), printing `compact_line` instead of the metrics dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = compact_line(state, logs) if logs else None
        if state.is_local_process_zero and line:
            print(line)


def use_compact_console(trainer) -> None:
    """Replace `trainer`'s console callbacks by the compact ones (the same kind: bar or printer)."""
    for standard, compact in ((ProgressCallback, CompactProgressCallback), (PrinterCallback, CompactPrinterCallback)):
        found = [cb for cb in trainer.callback_handler.callbacks if type(cb) is standard]
        for callback in found:
            trainer.remove_callback(callback)
            trainer.add_callback(compact())
