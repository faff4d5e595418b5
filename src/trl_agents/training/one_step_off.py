"""One-step-off training (`max_staleness=1`): the next rollout generates while the trainer trains on this one
(docs/async.md#one-step-off; the schedule of verl's one-step-off, the correction of AReaL's decoupled PPO,
arXiv 2505.24298).

At the generation step of optimizer step s the trainer

1. takes the rollout R_s that the weights of step s-1 generated in the background (`OneStepOff.take`);
2. hands the weights of step s to the generator: nothing is in flight then, so no trajectory mixes two versions;
3. starts R_{s+1} on the tasks of the next generation batch, on one background thread (`OneStepOff.launch`);
4. scores R_s and trains on it.

The first rollout, and one whose tasks could not be seen in advance (the first of an epoch: the Trainer opens the
next epoch's iterator only when it gets there), are generated in place by the weights of step s: lag 0. Every
other rollout has lag 1. Nothing is dropped for staleness: admission bounds it (R_{s+2} cannot start before step
s+1 takes R_{s+1}).

* `Lookahead` keeps the Trainer's batches with the next generation batch visible: `get_batch_samples` pulls it
  from the epoch's iterator one generation early.
* `OneStepOff` owns the rollout in flight, its policy version and the key of its tasks, the drain before a
  checkpoint or an evaluation, the pending rollout written with a checkpoint and read back on resume, and the
  timings (`async/trainer_wait_seconds`: the trainer blocked on a rollout; `async/generator_idle_seconds`: a finished
  rollout waiting for the next launch).
* `BehaviourSnapshot` is the copy of the trained weights the built-in generator samples from while the policy
  trains (frozen weights, e.g. a LoRA model's base, are shared).
* `stamp_version` writes `policy_version` into every step's info; `check_version` asserts it on every trained row.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ..fileio import atomic_write
from ..trajectory import RolloutBatch

logger = logging.getLogger(__name__)

PENDING_FILE = "pending_rollout-{rank}.pkl"  # in a checkpoint's folder, one per process
VERSION_KEY = "policy_version"  # step.info key: the optimizer step whose weights sampled the step


def tasks_key(tasks: list[dict[str, Any]]) -> str:
    """A fingerprint of a generation batch's tasks, so a prefetched rollout is trained only on the step it was
    generated for."""
    text = json.dumps(tasks, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamp_version(batch: RolloutBatch, version: int) -> None:
    """Record in every step of `batch` the policy version that sampled it (one version per rollout: weights change
    only while nothing is in flight)."""
    for trajectory in batch.trajectories:
        for step in trajectory.steps:
            step.info[VERSION_KEY] = version


def check_version(batch: RolloutBatch, expected: int, global_step: int) -> None:
    """Every step about to be trained was sampled by version `expected` (the trainer's bookkeeping of lags: 0 for a
    rollout generated in place, 1 rollout for a prefetched one); anything else is a bug, never trained silently."""
    found = {step.info.get(VERSION_KEY) for trajectory in batch.trajectories for step in trajectory.steps}
    if found - {expected}:
        raise RuntimeError(
            f"one-step-off bookkeeping: at step {global_step} the rollout should come from policy version {expected}, "
            f"but its steps carry {sorted(found, key=str)}; please report this"
        )


class Lookahead:
    """The Trainer's batches with the next generation batch visible.

    `pull(iterator, count, ahead)` hands the Trainer `count` items of the epoch's iterator while holding `ahead` more
    (pulled early); `consume()` moves past the item the trainer is preparing, and `peek(distance)` is the item
    `distance` places after it (None past the epoch's end). A new iterator (a new epoch) starts afresh."""

    def __init__(self):
        self._iterator: Iterator | None = None
        self._stream: deque = deque()  # pulled, not yet prepared: the handed-out ones first, then the held ones
        self._handed = 0

    def pull(self, iterator: Iterator, count: int, ahead: int) -> list:
        if iterator is not self._iterator:
            self._iterator, self._stream, self._handed = iterator, deque(), 0
        while len(self._stream) < self._handed + count + ahead:
            try:
                self._stream.append(next(iterator))
            except StopIteration:
                break
        batch = list(self._stream)[self._handed:self._handed + count]
        self._handed += len(batch)
        return batch

    def consume(self) -> None:
        if self._handed:
            self._stream.popleft()
            self._handed -= 1

    def peek(self, distance: int) -> Any | None:
        return self._stream[distance - 1] if 0 < distance <= len(self._stream) else None


@dataclass
class Prefetched:
    """A rollout started in the background: the tasks it is for (`key`), the weights that generate it
    (`version`), its rollout key, and its result (a future, or the batch itself after a resume)."""

    key: str
    version: int
    rollout_index: str
    future: Future | None = None
    batch: RolloutBatch | None = None
    finished_at: float | None = None


class OneStepOff:
    """The rollout in flight of a one-step-off run (at most one, on one background thread).

    Args:
        run: `run(tasks, rollout_index) -> RolloutBatch`, the rollout itself (runs on the background thread).
    """

    def __init__(self, run: Callable[[list[dict[str, Any]], str], RolloutBatch]):
        self._run = run
        self._executor: ThreadPoolExecutor | None = None
        self.pending: Prefetched | None = None
        self.lookahead = Lookahead()
        self.trainer_wait = 0.0  # seconds the trainer waited for a rollout, since the last `timings()`
        self.generator_idle = 0.0  # seconds a finished rollout waited for the next launch, since the last `timings()`
        self._lock = threading.Lock()

    def launch(self, tasks: list[dict[str, Any]], key: str, version: int, rollout_index: str,
               idle_since: float | None) -> None:
        """Start the rollout of `tasks` in the background with the weights of `version` (already synced)."""
        if self.pending is not None:
            raise RuntimeError("one-step-off: a rollout is already in flight; the trainer must take it first")
        if idle_since is not None:
            self.generator_idle += time.perf_counter() - idle_since
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="trl-agents-rollout")
        pending = Prefetched(key, version, rollout_index)

        def finished(_future):
            pending.finished_at = time.perf_counter()

        def run():
            batch = self._run(tasks, rollout_index)
            stamp_version(batch, version)
            return batch

        pending.future = self._executor.submit(run)
        pending.future.add_done_callback(finished)
        self.pending = pending

    def take(self, key: str) -> Prefetched | None:
        """The rollout prefetched for the tasks `key`, finished (waiting for it), or None when there is none (the
        caller generates in place). A prefetched rollout for other tasks (a resume with other batch settings) is
        set aside with a warning, and the step generates its own. A rollout that raised raises here."""
        pending = self.drain()
        if pending is None:
            return None
        self.pending = None
        if pending.key != key:
            logger.warning("the rollout prefetched for this step was generated for other tasks (different batch "
                           "settings after a resume?): it is set aside and this step's rollout is generated now")
            return None
        return pending

    def drain(self) -> Prefetched | None:
        """Wait for the rollout in flight (before a checkpoint, an evaluation or the end of training)."""
        pending = self.pending
        if pending is not None and pending.batch is None:
            start = time.perf_counter()
            try:
                pending.batch = pending.future.result()
            except BaseException:
                self.pending = None
                raise
            finally:
                self.trainer_wait += time.perf_counter() - start
        return pending

    def timings(self) -> dict[str, float]:
        values = {"async/trainer_wait_seconds": self.trainer_wait, "async/generator_idle_seconds": self.generator_idle}
        self.trainer_wait = self.generator_idle = 0.0
        return values

    def save(self, folder: str, rank: int) -> None:
        """Drain the rollout in flight and write it into a checkpoint's folder with its version, so that a resumed
        run trains on it first (a killed-and-resumed run then equals an uninterrupted one)."""
        pending = self.drain()
        if pending is None:
            return
        record = {"key": pending.key, "version": pending.version, "rollout_index": pending.rollout_index,
                  "batch": pending.batch}
        try:
            data = pickle.dumps(record)
        except (pickle.PicklingError, TypeError, AttributeError) as err:  # e.g. an env put an object in step.info
            logger.warning("one-step-off: the rollout in flight cannot be stored with %s (%s: %s); a run resumed there "
                           "generates that step's rollout again, from the checkpoint's weights", folder,
                           type(err).__name__, err)
            return
        atomic_write(os.path.join(folder, PENDING_FILE.format(rank=rank)), data)

    def load(self, folder: str, rank: int) -> None:
        """Read the rollout a checkpoint holds (none: nothing was in flight when it was written)."""
        path = os.path.join(folder, PENDING_FILE.format(rank=rank))
        if not os.path.exists(path):
            return
        with open(path, "rb") as file:
            record = pickle.load(file)
        self.pending = Prefetched(record["key"], record["version"], record["rollout_index"], batch=record["batch"])

    def discard_unused(self) -> None:
        """At the end of training: a rollout prefetched for a step that did not come (a token budget stopped the
        run) is waited for and left untrained."""
        if self.pending is not None:
            with contextlib.suppress(Exception):
                self.drain()
            logger.info("one-step-off: the rollout prefetched for the next step is not trained (training ended)")
            self.pending = None

    def close(self) -> None:
        self.discard_unused()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


class BehaviourSnapshot:
    """A copy of the policy's weights for the built-in generator to sample from while the policy trains.

    Only what training changes is copied: the trainable parameters and the buffers. Frozen parameters (the base
    weights under LoRA, quantized or not) are shared with the policy, since no update touches them; a LoRA policy's
    snapshot costs its adapter. Refused (one line) when the copy does not fit on the policy's device."""

    def __init__(self, model: torch.nn.Module):
        frozen = [p for p in model.parameters() if not p.requires_grad]
        copied = [*(p for p in model.parameters() if p.requires_grad), *model.buffers()]
        size = sum(t.numel() * t.element_size() for t in copied)
        device = next(model.parameters()).device
        free = _free_memory(device)
        if free is not None and size > 0.9 * free:
            raise ValueError(
                f"max_staleness=1 with the built-in generator keeps a copy of the trained weights to generate from "
                f"({size / 2**30:.2f} GiB), but {free / 2**30:.2f} GiB is free on {device}: generate with a vLLM "
                "server (use_vllm=True, vllm_mode='server'), or set max_staleness=0"
            )
        try:  # deepcopy's memo maps each frozen parameter to itself: shared, not copied
            self.model = copy.deepcopy(model, memo={id(p): p for p in frozen})
        except Exception as err:  # e.g. a module that cannot be copied
            raise ValueError(
                f"max_staleness=1 with the built-in generator needs a copy of the weights, and this model cannot be "
                f"copied ({type(err).__name__}: {err}): generate with a vLLM server (use_vllm=True, "
                "vllm_mode='server'), or set max_staleness=0"
            ) from err
        self.model.eval()
        self.model.requires_grad_(False)  # (the shared frozen parameters were frozen already)
        self.nbytes = size
        self.shared = len(frozen)

    @torch.no_grad()
    def sync(self, model: torch.nn.Module) -> None:
        """Copy the policy's current trained weights and buffers (nothing generates meanwhile)."""
        for mine, theirs in zip(self.model.parameters(), model.parameters(), strict=True):
            if mine is theirs:
                if theirs.requires_grad:
                    raise RuntimeError("max_staleness=1: a parameter frozen when the behaviour snapshot was made now "
                                       "trains, and the snapshot shares it; unfreeze before training starts")
                continue
            mine.copy_(theirs)
        for mine, theirs in zip(self.model.buffers(), model.buffers(), strict=True):
            mine.copy_(theirs)

    @contextlib.contextmanager
    def context(self):
        """The generator's `model_context`."""
        yield self.model


def _free_memory(device: torch.device) -> int | None:
    """Bytes free on `device` (None when unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            import psutil
        except ImportError:
            return None
        return int(psutil.virtual_memory().available)
    return None
