"""Callbacks that keep a run resumable when it is stopped or resumed: `AgentGRPOTrainer.train()` adds them.

* `StopOnSignal`: SIGTERM (a cloud preemption, `kill`, a scheduler's time limit) lets the current optimizer step
  finish, saves a checkpoint and stops training; `train()` then raises `TrainingStopped` ("stopped by SIGTERM at step
  N ...; resume with --resume_from_checkpoint true"), so a preempted job never looks finished. A second SIGTERM ends
  the process at once. It replaces transformers' `enable_jit_checkpoint` handler while `train()` runs (which saves
  too, but then lets the job finish with exit status 0).
* `ResumeBookkeeping`: a resumed run moves aside the trajectory shards of rollouts after its checkpoint
  (`records.supersede_shards`) only once the checkpoint has loaded (`on_train_begin`), and `restore()` puts them back
  when the resume fails before its first rollout is recorded; before each save into a folder that already holds a
  checkpoint (a resumed run passing its old steps), that folder's `trainer_state.json` is removed, so a save
  interrupted halfway leaves a folder that reads as incomplete rather than a mix of two runs.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class TrainingStopped(SystemExit):
    """Training stopped early by a signal, after saving a checkpoint: not a success. A SystemExit whose status is
    128 + the signal (143 for SIGTERM), as when the signal ends a process, so schedulers see a stopped job; the
    message (printed by `train()` before) is `str(error)`."""

    def __init__(self, message: str, signum: int, step: int, checkpoint: str | None):
        super().__init__(message)
        self.code = 128 + signum
        self.step, self.checkpoint, self.signum = step, checkpoint, signum

    def __str__(self) -> str:
        return str(self.args[0])


class StopOnSignal(TrainerCallback):
    """Stop training cleanly on `signals` (SIGTERM): after the current step, with a checkpoint (see the module
    docstring). `install()` sets the handler (main thread only) and `uninstall()` restores the previous one, unless
    something replaced ours meanwhile. `stopped_at`: the step training stopped at because of a signal, else None.
    Under `accelerate launch` the processes agree at each step's end (one gets the signal: all stop)."""

    def __init__(self, trainer: Any, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.trainer = trainer
        self.signals = signals
        self.received: int | None = None
        self.stopped_at: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:  # (transformers' JIT callback may have restored its own)
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # the second one: end now, as the default handler would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        logger.warning("%s received: finishing the current step, then saving a checkpoint and stopping (send it again "
                       "to stop at once).", signal.Signals(signum).name)

    def _agreed(self) -> bool:
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is None or accelerator.num_processes <= 1:
            return self.received is not None
        import torch

        flag = torch.tensor([0 if self.received is None else int(self.received)], device=accelerator.device)
        agreed = int(accelerator.gather(flag).max().item())
        if agreed and self.received is None:
            self.received = agreed
        return bool(agreed)

    def _stop(self, state, control) -> None:
        control.should_training_stop = True
        if state.global_step < state.max_steps:  # else training ends here anyway, as planned
            self.stopped_at = state.global_step
            self.trainer.stopped_by_signal = signal.Signals(self.received).name

    def on_step_end(self, args, state, control, **kwargs):
        if self._agreed():
            control.should_save = True
            self._stop(state, control)
        return control

    def on_save(self, args, state, control, **kwargs):
        accelerator = getattr(self.trainer, "accelerator", None)
        if self.received is not None and (accelerator is None or accelerator.num_processes <= 1):
            self._stop(state, control)  # the signal came during this save: the checkpoint is complete, stop now
        return control


class ResumeBookkeeping(TrainerCallback):
    """See the module docstring. `trajectories`: the run's trajectories folder; `resume_step`: the checkpoint's step
    (None when not resuming); `main_process`: whether this process moves files. `started`: the first step began."""

    def __init__(self, trajectories: str, resume_step: int | None, main_process: bool):
        self.trajectories, self.resume_step, self.main_process = trajectories, resume_step, main_process
        self.moved: list[tuple[str, str]] = []  # (original path, path in superseded/)
        self.started = False

    def on_train_begin(self, args, state, control, **kwargs):
        if self.resume_step is None or not self.main_process or not args.save_trajectories:
            return
        from ..records import supersede_shards

        before = set(os.listdir(self.trajectories)) if os.path.isdir(self.trajectories) else set()
        for path in supersede_shards(self.trajectories, self.resume_step):
            name = os.path.basename(path)
            if name in before:
                self.moved.append((os.path.join(self.trajectories, name), path))

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = True

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save and self.main_process:
            state_file = os.path.join(args.output_dir, f"checkpoint-{state.global_step}", "trainer_state.json")
            if os.path.isfile(state_file):
                os.remove(state_file)  # the folder is rewritten: incomplete until its new trainer_state.json

    def restore(self) -> None:
        """Put the moved shards back (the resume did not start)."""
        folders = set()
        for original, moved in self.moved:
            if os.path.isfile(moved) and not os.path.exists(original):
                os.replace(moved, original)
                folders.add(os.path.dirname(moved))
        for folder in folders:
            for empty in (folder, os.path.dirname(folder)):  # resume-N-TIME/, then superseded/
                if os.path.isdir(empty) and not os.listdir(empty):
                    os.rmdir(empty)
        if self.moved:
            logger.warning("The resume did not start: put %d trajectory shard(s) back into %s.", len(self.moved),
                           self.trajectories)
        self.moved = []
