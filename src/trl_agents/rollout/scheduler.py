"""Per-episode scheduling: the episodes of a rollout advance on their own instead of in lockstep.

Under lockstep (`RolloutEngine(schedule="lockstep")`, the default) every turn waits for the slowest environment
call of all active episodes before anyone plays the next turn. With heavy-tailed step latency (tools, sandboxes, web
services) that pays the maximum of N draws on every turn. `EpisodeScheduler` plays the same rollout with every
episode as its own little state machine

    reset/restore -> prompt -> generation -> environment step -> prompt -> ... -> finished

driven by one event loop that owns all episode state (this thread). Environment calls are futures on the pool
(`EnvPool.submit`, with the pool's timeouts and broken-environment rules); generation is a request per episode turn:

* a request-level generator (`request_level = True` and `submit(prompt_ids, sampling, seed=)`, e.g. vLLM in server
  mode) gets each request as soon as it exists, and its server batches them continuously;
* any other generator (a batch `generate`) gets micro-batches, called on this thread, which is therefore the one
  "model lane": mid-rollout model signals a topology computes run here too, never concurrently with generation. A
  call launches when no environment call is in flight (nothing else can arrive soon) or when the oldest waiting
  request has waited the generation window: by default the fixed cost of one call, measured as the rollout goes
  (`CallCost`). Launching whatever is pending at once would pay the fixed cost on many small calls when it is large
  (`docs/async.md` works the numbers).

What a topology sees is fixed by its scheduling class (`Topology.schedule`): `"free"` topologies are asked
`when_idle(view, task_index)` as soon as that task has nothing left to play, `"task"` topologies keep a turn
barrier per task, `after_turn(view, task_index)` once all of the task's active episodes played the turn; `"global"`
ones are played by the lockstep loop. The rules of the lockstep engine stay: a failing reset, step or signal fails
its own episode; episode ids follow request order; the engine's records are read in (task, episode, step) order,
whatever order calls finished in. With deterministic sampling (a seed per request) and a batch-invariant generator,
the rows are the same as lockstep's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import time
from concurrent.futures import Future
from typing import Any

from ..trajectory import task_id
from .episode import Episode, Turn, end_calls, reset_calls

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.5  # seconds between progress reports under per-episode scheduling
CALL_COST_DECAY = 0.8  # our choice: weight of the older measurements at each new generation call (`CallCost`)


class CallCost:
    """The fixed cost of one generation call, in seconds, from the calls measured so far.

    A call on b prompts costs about a + c·x, where x is either b (a server or a simulated model whose cost is per
    sequence) or the token positions it computes, b × (the longest prompt + the turn's token budget) (a local model,
    whose calls grow with the prompts over a rollout). `fixed` is the smaller of the intercepts of the two
    least-squares lines of the measured seconds, against b and against the token positions (our choice: a line that
    leaves out the real cost driver overstates a, since early calls are both the largest and the shortest-prompted,
    and overstating a makes requests wait for nothing), older calls weighted down by `CALL_COST_DECAY` at each new
    one, kept within [0, the shortest recent call]; before the calls differ in size, the shortest recent call (an
    upper bound on a); 0 before any call (`measured` is False then). When a is large, both lines find it.

    Example (calls costing 20 ms + 2 µs per token position):
        >>> cost = CallCost()
        >>> for size, width in ((64, 100), (8, 100), (30, 100), (3, 100)):
        ...     cost.add(size, size * width, 0.020 + 0.000002 * size * width)
        >>> round(cost.fixed, 4)
        0.02
    """

    def __init__(self, decay: float = CALL_COST_DECAY):
        self.decay = decay
        self._sums = {"size": [0.0] * 5, "work": [0.0] * 5}  # weighted sums of 1, x, t, x², x·t
        self._shortest: float | None = None

    def add(self, size: int, work: float, seconds: float) -> None:
        for name, x in (("size", float(size)), ("work", float(work))):
            sums = self._sums[name]
            for index, value in enumerate((1.0, x, seconds, x * x, x * seconds)):
                sums[index] = sums[index] * self.decay + value
        self._shortest = seconds if self._shortest is None else min(seconds, self._shortest / self.decay)

    @property
    def measured(self) -> bool:
        return self._shortest is not None

    @property
    def fixed(self) -> float:
        if self._shortest is None:
            return 0.0
        intercepts = []
        for n, x, t, xx, xt in self._sums.values():
            sxx, sxt = xx - x * x / n, xt - x * t / n
            if sxx > 1e-9 * max(xx, 1.0):
                intercepts.append((t - sxt / sxx * x) / n)
        if not intercepts:
            return self._shortest
        return min(max(min(intercepts), 0.0), self._shortest)


class _Task:
    """Where one task of the rollout stands."""

    def __init__(self):
        self.episodes: list[Episode] = []  # in creation order
        self.cohort: list[Episode] | None = None  # "task" class: the episodes playing the current turn
        self.done = False
        self.first_start: str | None = None
        self.started: list[Episode] = []  # root episodes whose reset has returned


class EpisodeScheduler:
    """Plays one rollout of a `RolloutEngine` with per-episode scheduling (see the module docstring).

    Built by `RolloutEngine.run` for the `"task"` and `"free"` scheduling classes; it uses the engine's own steps
    (`_prepare`, `_generate`, `_record`, `_apply_start`, ...), so contracts, failures and records are the lockstep
    engine's. `stats` gains `scheduler_seconds`: the CPU time of the event loop outside generation calls.
    """

    def __init__(self, engine: Any, schedule: str, groups, episodes, by_trajectory, view, plan,
                 stats: dict[str, float]):
        self.engine = engine
        self.schedule = schedule
        self.groups, self.episodes, self.by_trajectory = groups, episodes, by_trajectory
        self.view, self.plan, self.stats = view, plan, stats
        self.topology = engine.topology
        self.pool = engine.env_pool
        generator = engine.generator
        self.request_level = (bool(getattr(generator, "request_level", False)) and hasattr(generator, "submit")
                              and not plan.role)
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: list[tuple[Turn, float]] = []  # turns waiting for a generation call (batch generators)
        self.env_calls = 0  # environment calls in flight
        self.requests = 0  # generation requests in flight (request-level generators)
        self.cost = CallCost()
        self.tasks = [_Task() for _ in groups]
        self._last_report = 0.0
        self._generation_cpu = 0.0
        self._work_cpu = 0.0
        self._hang_warned = False

    # ---- the loop --------------------------------------------------------------------------------------------------

    def play(self, tasks, num_generations: int) -> None:
        cpu = time.thread_time()
        self.stats["scheduler_seconds"] = 0.0
        try:
            with self._work():
                requests = self.topology.begin(tasks, num_generations)
            self._serve(requests, None)
            self.engine._report(0, self.episodes)
            while True:
                self._drain(block=False)
                self._advance()
                wait = self._launch_or_wait()
                if wait == 0.0:
                    continue
                if not self._in_flight():
                    if all(task.done for task in self.tasks):
                        break
                    raise RuntimeError(f"the rollout scheduler stalled: tasks {self._stalled()} have episodes that "
                                       "neither play nor end (please report this with the topology used)")
                self._drain(block=True, timeout=wait)
            held = [episode for episode in self.episodes if not episode.finished]  # still held: they end now
            for episode in held:
                self._end(episode)
            while self.env_calls:
                self._drain(block=True, timeout=None)
            self.engine._report(self._turns_played(), self.episodes)
        finally:
            self.stats["scheduler_seconds"] = max(time.thread_time() - cpu - self._generation_cpu - self._work_cpu, 0.0)

    @contextlib.contextmanager
    def _work(self):
        """Time the engine's and the topology's own work (rendering, recording, decisions): rollout work lockstep
        does too, so it is not counted in `scheduler_seconds`."""
        cpu = time.thread_time()
        try:
            yield
        finally:
            self._work_cpu += time.thread_time() - cpu

    def _stalled(self) -> list[int]:
        return [index for index, task in enumerate(self.tasks) if not task.done]

    def _in_flight(self) -> bool:
        return bool(self.env_calls or self.requests or self.pending)

    def _drain(self, block: bool, timeout: float | None = None) -> None:
        """Handle the finished calls: all that are queued, after waiting for one when `block`."""
        if block:
            limit = timeout
            if limit is None and self.pool.hang_warning is not None and not self._hang_warned:
                limit = self.pool.hang_warning
            try:
                event = self.events.get(timeout=limit)
            except queue.Empty:
                if timeout is None:
                    self._warn_hung()
                return
            self._handle(event)
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            self._handle(event)

    def _warn_hung(self) -> None:
        self._hang_warned = True
        logger.warning(
            "No environment call or generation request of the rollout has finished for %g s (%d environment calls "
            "and %d generation requests in flight). A hung environment stalls training: set env_step_timeout / "
            "env_reset_timeout (EnvPool(step_timeout=..., reset_timeout=...)) to fail such episodes and go on.",
            self.pool.hang_warning, self.env_calls, self.requests,
        )

    # ---- deciding what runs next -----------------------------------------------------------------------------------

    def _advance(self) -> None:
        """Start every episode that can play, and ask the topology about the tasks that wait for it, until nothing
        changes."""
        changed = True
        while changed:
            changed = False
            for index, task in enumerate(self.tasks):
                if not task.done:
                    changed |= (self._advance_task if self.schedule == "task" else self._advance_free)(index, task)

    def _advance_free(self, index: int, task: _Task) -> bool:
        for episode in task.episodes:
            if not episode.finished and not episode.held and not episode.busy:
                self._dispatch(episode)
        if any(episode.busy for episode in task.episodes):
            return False
        if any(not episode.finished and not episode.held for episode in task.episodes):
            return False  # (cannot happen: a dispatched episode waits for a call or has ended)
        return self._when_idle(index, task)

    def _advance_task(self, index: int, task: _Task) -> bool:
        if any(episode.busy for episode in task.episodes):
            return False
        if task.cohort is not None:  # every episode of the turn has played it: the barrier
            task.cohort = None
            self.view.turn = max(self.view.turn, self._turns_played())
            with self._work():
                requests = self.topology.after_turn(self.view, index)
            self._serve(requests, index)
            return True
        cohort = [episode for episode in task.episodes if not episode.finished and not episode.held]
        if not cohort:
            return self._when_idle(index, task)
        task.cohort = cohort
        for episode in cohort:
            self._dispatch(episode)
        return True

    def _when_idle(self, index: int, task: _Task) -> bool:
        """Ask the topology for more of an idle task; the task is done when it asks for nothing to play."""
        with self._work():
            requests = self.topology.when_idle(self.view, index)
        self._serve(requests, index)
        if any(episode.busy or (not episode.finished and not episode.held) for episode in task.episodes):
            return True
        task.done = True
        return False

    def _serve(self, requests, task_index: int | None) -> None:
        """Carry out a topology's requests (see `RolloutEngine._serve`): new episodes' resets and restores become
        futures; a stopped episode ends now, or when the call it is in returns."""
        requests = list(requests)
        if task_index is not None and any(request.task_index != task_index for request in requests):
            raise ValueError(f"topology {self.topology.name!r} answered for task {task_index} with requests for other "
                             f"tasks; a {self.topology.schedule!r} topology decides for the task it is asked about")
        with self._work():
            launched, forked, stopped = self.engine._create(requests, self.groups, self.episodes, self.by_trajectory)
        for episode in stopped:
            if episode.busy:
                episode.stop_requested = True
            else:
                self._end(episode)
        for episode in launched:
            self.tasks[episode.task_index].episodes.append(episode)
            self._env_call(episode, (episode.env, reset_calls, (episode.trajectory.task, self.plan)), "reset",
                           ("reset", episode))
        for episode, parent, request in forked:
            self.tasks[episode.task_index].episodes.append(episode)
            call = self.engine._fork_call(episode, parent, request, self.plan)
            self._env_call(episode, call, "reset", ("restore", episode, parent, request))

    def _dispatch(self, episode: Episode) -> None:
        """Start an episode's next turn: its generation request (or its forced action's step)."""
        with self._work():
            turn = self.engine._prepare(episode)
        if turn is None:  # failed
            return
        if turn.ended:
            self._end(episode)
            return
        if turn.forced is not None:
            with self._work():
                forced = self.engine._forced(turn)
            self._step_env(turn, *forced)
            return
        episode.busy = "generation"
        if self.request_level:
            self.requests += 1
            seed = self.engine._seed(episode) if self.engine.deterministic_sampling else None
            future = self.engine.generator.submit(turn.sampling_ids, self.engine.sampling, seed=seed)
            future.add_done_callback(lambda done, turn=turn: self.events.put(("generated", turn, done)))
        else:
            self.pending.append((turn, time.monotonic()))

    def _launch_or_wait(self) -> float | None:
        """Launch a generation call on the pending turns when the rule says so (0.0: launched); else how long to
        wait for an event (None: until one comes)."""
        if not self.pending:
            return None
        window = self.engine.generation_window
        if window is None:  # before the first call, its cost is unknown: batch what the resets start together
            window = self.cost.fixed if self.cost.measured else float("inf")
        waited = time.monotonic() - self.pending[0][1]
        if self.env_calls and waited < window:
            return None if math.isinf(window) else window - waited
        turns = [turn for turn, _ in self.pending]
        self.pending.clear()
        width = max(len(turn.sampling_ids) for turn in turns) + self.engine.sampling.max_new_tokens
        cpu = time.thread_time()
        sampled, seconds = self.engine._sample(turns, self.stats)
        self._generation_cpu += time.thread_time() - cpu
        self.cost.add(len(turns), len(turns) * width, seconds)
        for turn, (ids, lps, text) in zip(turns, sampled, strict=True):
            self._step_env(turn, ids, lps, text)
        return 0.0

    # ---- calls and their outcomes ----------------------------------------------------------------------------------

    def _env_call(self, episode: Episode, call, kind: str, event: tuple) -> None:
        env, fn, args = call
        episode.busy = "env"
        self.env_calls += 1
        future = self.pool.submit(env, fn, args, kind)
        future.add_done_callback(lambda done: self.events.put((*event, done)))

    def _step_env(self, turn: Turn, ids, lps, text: str) -> None:
        self.stats["env_steps"] += 1
        with self._work():
            call = self.engine._step_call(turn, text, self.plan)
        self._env_call(turn.episode, call, "step",
                       ("step", turn, ids, lps, text))

    def _end(self, episode: Episode) -> None:
        """End an episode between turns (stopped, held to the end, context outgrown): its episode-end signals run
        where its environment lives."""
        if not self.plan.episode_end:
            episode.finished = True
            return
        self._env_call(episode, (episode.env, end_calls, (self.plan,)), "step", ("end", episode))

    def _handle(self, event: tuple) -> None:
        kind, *payload, future = event
        if kind == "generated":
            self._generated(payload[0], future)
            return
        self.env_calls -= 1
        outcome = future.result()  # (`EnvPool.submit`: an exception is an outcome, never raised)
        if kind == "step":
            turn, ids, lps, text = payload
            turn.episode.busy = ""
            with self._work():
                self.engine._record(turn, ids, lps, text, outcome, self.plan)
            self._after_step(turn.episode)
        elif kind == "reset":
            (episode,) = payload
            episode.busy = ""
            with self._work():
                self.engine._apply_start(episode, outcome)
                self._check_start(episode)
        elif kind == "restore":
            episode, parent, request = payload
            episode.busy = ""
            with self._work():
                self.engine._apply_fork(episode, parent, request, outcome, self.plan)
        else:  # "end"
            (episode,) = payload
            episode.busy = ""
            self.engine._apply_end(episode, outcome)
        self._progress()

    def _generated(self, turn: Turn, future: Future) -> None:
        self.requests -= 1
        episode = turn.episode
        try:
            output = future.result()
        except Exception as err:
            raise RuntimeError(f"generation failed for episode {episode.trajectory.episode_id} of task "
                               f"{task_id(episode.trajectory.task)}: {type(err).__name__}: {err}") from err
        ids = episode.action_prefix + list(output.completion_ids[0])
        lps = episode.prefix_logprobs + list(output.logprobs[0])
        self.stats["generation_calls"] += 1
        self.stats["generated_tokens"] += len(output.completion_ids[0])
        with self._work():
            text = self.engine.tokenizer.decode(ids, skip_special_tokens=True)
        self._step_env(turn, ids, lps, text)

    def _after_step(self, episode: Episode) -> None:
        if episode.stop_requested and not episode.finished:
            episode.stop_requested = False
            self._end(episode)
        if self.schedule == "free":
            with self._work():
                requests = self.topology.after_turn(self.view, episode.task_index)
            self._serve(requests, episode.task_index)

    def _check_start(self, episode: Episode) -> None:
        """The lockstep engine's identical-starts check, as each root reset of a task returns."""
        trajectory = episode.trajectory
        if trajectory.parent_id is not None or trajectory.failed:
            return
        task = self.tasks[episode.task_index]
        task.started.append(episode)
        if task.first_start is None:
            task.first_start = episode.first_observation
        elif episode.first_observation != task.first_start:
            self.engine._check_identical_starts(self.groups[episode.task_index], self.by_trajectory, task.started)

    def _turns_played(self) -> int:
        return max((len(episode.trajectory.steps) for episode in self.episodes), default=0)

    def _progress(self) -> None:
        now = time.monotonic()
        if self.engine.on_turn is not None and now - self._last_report >= PROGRESS_INTERVAL:
            self._last_report = now
            self.engine._report(self._turns_played(), self.episodes)

