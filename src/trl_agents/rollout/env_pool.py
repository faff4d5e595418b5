"""Where environments live and how their calls run: `EnvPool` and its three backends.

The rollout engine hands the pool the environment calls of one phase (the resets of a rollout, or the steps of a
turn) and gets one outcome per episode back. The backend decides where the environments live:

| backend   | environments are                        | calls of a phase run                  | a call past timeout    |
|-----------|-----------------------------------------|---------------------------------------|------------------------|
| `thread`  | objects in this process                 | on `num_workers` threads (1 = inline) | is abandoned (thread)  |
| `process` | one worker process each (`ProcessEnv`)  | all at once                           | kills the worker       |
| `ray`     | one Ray actor each (`RayEnv`), any node | all at once                           | kills the actor        |

On the `thread` backend, the calls of environments whose class sets `thread_safe = False` (ALFWorld and TextWorld:
TextWorld parses with module-level parsers) run one at a time on a thread of their own, each timed from its start.

A call that times out, or whose worker died (crash, segfault, `os._exit`), raises `EnvCallError` for that episode
only: the engine records it as the episode's `Trajectory.error` (an infrastructure failure, excluded from credit) and
the rollout goes on. A broken environment is never handed out again. A thread cannot be killed, so a hung call on the
`thread` backend keeps its thread (a daemon) busy until it returns; use `process` for environments that can hang for
good.

`process` and `ray` workers build their environment themselves, from its class and the pool's `env_kwargs`. The
class travels by reference (module and name), so an environment you register must live at the top level of an
importable module, or of your script (outside `if __name__ == "__main__":`). Worker processes import your script as
DataLoader workers do, so the script's training code must be under that guard, or every worker runs it again. Workers are reused across rollouts, like the environments of the `thread` backend, and
stopped by `close()`.

Example:
    >>> from trl_agents.rollout.env_pool import EnvPool, call_method
    >>> pool = EnvPool(backend="process", step_timeout=30.0)
    >>> env = pool.acquire({"env": "frozenlake"})  # a ProcessEnv: the environment lives in a worker process
    >>> env.reset({"seed": 0}).splitlines()[0]
    'P F F F'
    >>> pool.run([(env, call_method, ("step", "```right```"))], "step")[0][1:3]  # one phase: (obs, reward, done, info)
    (0.0, False)
    >>> pool.release(env)
    >>> pool.close()
    >>> env.process.is_alive()
    False
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import logging
import math
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from ..envs import AgentEnv, get_env_class

logger = logging.getLogger(__name__)

BACKENDS = ("thread", "process", "ray")
START_TIMEOUT = 120.0  # our choice: seconds a process/ray worker may take to start and build its environment
RAY_INSTALL_HINT = "pip install 'trl-agents[ray]'"

# A call run where the environment lives: `fn(env, *args)`. Module-level functions only, so that they pickle.
EnvCall = tuple[Any, Callable[..., Any], tuple]


class EnvCallError(RuntimeError):
    """An environment call failed for infrastructure reasons (timeout, dead worker); the message says which."""


class EnvTimeoutError(EnvCallError):
    """An environment call did not return within its timeout."""


def call_method(env: AgentEnv, name: str, *args: Any) -> Any:
    """`env.<name>(*args)`: the call that proxies forward (a module-level function, so it pickles)."""
    return getattr(env, name)(*args)


def check_execution_settings(
    backend: str,
    num_workers: int,
    step_timeout: float | None,
    reset_timeout: float | None,
    ray_address: str | None,
    names: dict[str, str] | None = None,
) -> None:
    """Raise a ValueError naming the setting (as `names` maps `EnvPool`'s argument names) when one is invalid."""
    names = names or {}

    def name(argument: str) -> str:
        return names.get(argument, argument)

    if backend not in BACKENDS:
        raise ValueError(f"{name('backend')} must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"{name('num_workers')} must be an integer >= 1, got {num_workers!r}")
    for argument, value in (("step_timeout", step_timeout), ("reset_timeout", reset_timeout)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value)
        ):
            raise ValueError(f"{name(argument)} must be a positive number of seconds or None (no limit), got {value!r}")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError(f"{name('backend')}='ray' needs the ray package: {RAY_INSTALL_HINT}")
    if ray_address is not None and backend != "ray":
        raise ValueError(
            f"{name('ray_address')} is only used with {name('backend')}='ray' (got {name('backend')}={backend!r}); "
            f"set {name('backend')}='ray' or drop {name('ray_address')}."
        )


HANG_WARNING = 300.0
"""Seconds after which a phase of environment calls without a timeout is reported as possibly hung (`EnvPool`)."""


class EnvPool:
    """Reusable environment instances by name, and where and how their calls run.

    Constructing some environments is expensive (resetting is not), so released environments are kept and handed out
    again; with the `process` and `ray` backends that keeps their workers alive across rollouts too.

    Args:
        env_kwargs: Constructor keyword arguments of every environment.
        default_env: Environment of task rows without an `env` key.
        backend: `"thread"` (environments in this process), `"process"` (one worker process per environment) or
            `"ray"` (one Ray actor per environment; `pip install 'trl-agents[ray]'`). See the module docstring.
        num_workers: Threads that run the calls of one phase at once on the `thread` backend; 1 runs them one after
            the other on the calling thread, as before (unless a timeout is set: timing a call out needs a thread).
            Environments with `thread_safe = False` always run one call at a time. `process` and `ray` run every
            environment in its own worker, so all calls of a phase run at once.
        step_timeout: Seconds one episode's environment calls of a turn (step, and state key, snapshot, solver value
            when recorded) may take; None = no limit. Also bounds single calls forwarded to `process`/`ray` workers.
        reset_timeout: Seconds one episode's reset (with its instructions, task description and solver value) may
            take; None = no limit.
        ray_address: Address of the Ray cluster (`"auto"`, `"ray://host:10001"`); None starts a local instance,
            listening on 127.0.0.1 only, unless Ray is already initialised or `RAY_ADDRESS` names a cluster. Ray
            backend only.
        ray_actor_options: `.options(...)` of the environment actors (default `{"scheduling_strategy": "SPREAD"}`,
            which spreads them over the cluster's nodes); e.g. `{"num_cpus": 1}` to reserve a CPU per environment.
        start_timeout: Seconds a `process`/`ray` worker may take to start and build its environment.
        hang_warning: Without a timeout for a phase, log a warning naming the environments and the timeout option
            when its calls are still running after this many seconds (a hung environment would otherwise stall the
            run without a word); None = never warn.

    Example:
        >>> pool = EnvPool(default_env="frozenlake")
        >>> env = pool.acquire({"seed": 0})
        >>> pool.release(env)
        >>> pool.acquire({"seed": 1}) is env
        True
        >>> pool.close()
    """

    @classmethod
    def from_config(cls, args: Any) -> EnvPool:
        """The pool a training config asks for: its `env_kwargs`, `env_name`, `env_backend`, `env_workers`,
        `env_step_timeout`, `env_reset_timeout` and `ray_address` (`AgentGRPOConfig`'s execution fields)."""
        return cls(env_kwargs=args.env_kwargs, default_env=args.env_name, backend=args.env_backend,
                   num_workers=args.env_workers, step_timeout=args.env_step_timeout,
                   reset_timeout=args.env_reset_timeout, ray_address=args.ray_address)

    def __init__(
        self,
        env_kwargs: dict[str, Any] | None = None,
        default_env: str | None = None,
        backend: str = "thread",
        num_workers: int = 1,
        step_timeout: float | None = None,
        reset_timeout: float | None = None,
        ray_address: str | None = None,
        ray_actor_options: dict[str, Any] | None = None,
        start_timeout: float = START_TIMEOUT,
        hang_warning: float | None = HANG_WARNING,
    ):
        check_execution_settings(backend, num_workers, step_timeout, reset_timeout, ray_address)
        if not start_timeout > 0:
            raise ValueError(f"start_timeout must be a positive number of seconds, got {start_timeout!r}")
        self.env_kwargs = dict(env_kwargs or {})
        self.default_env = default_env
        self.backend = backend
        self.num_workers = num_workers
        self.timeouts = {"reset": reset_timeout, "step": step_timeout}
        self.ray_address = ray_address
        self.ray_actor_options = {"scheduling_strategy": "SPREAD"} if ray_actor_options is None else ray_actor_options
        self.start_timeout = start_timeout
        self.hang_warning = hang_warning
        self._free: dict[str, list[Any]] = {}
        self._abandoned: dict[int, AgentEnv] = {}  # thread backend: environments whose call timed out
        self._threads = _ThreadRunner(num_workers) if backend == "thread" else None
        self._collectors: _Collectors | None = None  # process/ray backends: threads waiting for submitted calls
        self._remote: weakref.WeakSet = weakref.WeakSet()  # every proxy handed out, to stop them all on close
        self._started_ray = False
        # Workers of a pool nobody closed still stop when it is garbage collected.
        self._finalizer = weakref.finalize(self, _close_all, self._free, self._remote, self._threads)

    def env_name(self, task: dict[str, Any]) -> str:
        name = task.get("env", self.default_env)
        if not name:
            raise ValueError(
                f"Task {task!r} does not name an environment: add an 'env' column to the dataset or set the "
                "config field `env_name`."
            )
        return name

    def acquire(self, task: dict[str, Any]) -> Any:
        """An environment for `task`: a free one of its name, or a new one (an `AgentEnv`, or a proxy that forwards
        the `AgentEnv` methods to its worker)."""
        name = self.env_name(task)
        free = self._free.get(name)
        if free:
            return free.pop()
        if self.backend == "thread":
            from ..envs import make_env

            return make_env(name, **self.env_kwargs)
        env_cls = get_env_class(name)  # a clear error for unknown names, here rather than in the worker
        if self.backend == "process":
            env = ProcessEnv(env_cls, self.env_kwargs, self.timeouts, self.start_timeout)
        else:
            self._init_ray()
            env = RayEnv(env_cls, self.env_kwargs, self.timeouts, self.start_timeout, self.ray_actor_options)
        self._remote.add(env)
        return env

    def release(self, env: Any) -> None:
        """Take an environment back. A broken one (its call timed out or its worker died) is dropped, never reused."""
        if self._abandoned.pop(id(env), None) is not None:
            return  # its thread may still be inside it: leave it alone
        if getattr(env, "broken", False):
            env.close()
            return
        self._free.setdefault(env.name, []).append(env)

    def discard(self, env: Any) -> None:
        """Drop an environment a call may still be running in (a rollout that raised while its calls were in
        flight): never handed out again; a `process`/`ray` worker is stopped."""
        if self._abandoned.pop(id(env), None) is None and self.backend != "thread":
            env.close()

    def run(self, calls: Sequence[EnvCall], kind: str) -> list[Any]:
        """Run `fn(env, *args)` for every `(env, fn, args)` of one phase, each where its environment lives.

        Returns one outcome per call, in order: its return value, or the exception it raised (`EnvTimeoutError` after
        the `kind` timeout, `"reset"` or `"step"`; `EnvCallError` when the worker died). Never raises for one call.
        """
        timeout = self.timeouts.get(kind)
        if timeout is not None or self.hang_warning is None or not calls:
            return self._run(calls, kind, timeout)
        names = sorted({str(getattr(env, "name", type(env).__name__)) for env, _, _ in calls})
        watchdog = threading.Timer(self.hang_warning, _warn_hung, (kind, names, self.hang_warning))
        watchdog.daemon = True
        watchdog.start()
        try:
            return self._run(calls, kind, timeout)
        finally:
            watchdog.cancel()

    def submit(self, env: Any, fn: Callable[..., Any], args: tuple, kind: str) -> Future:
        """Start `fn(env, *args)` where `env` lives and return at once: a `Future` whose result is the call's outcome
        as `run` gives it (its return value, or the exception it raised, `EnvTimeoutError` after the `kind` timeout,
        `EnvCallError` when the worker died); `result()` never raises for the call itself.

        This is what per-episode scheduling uses: every episode's reset or step is its own future, so no call waits
        for another's. On the `thread` backend at most `num_workers` calls run at once (environments with
        `thread_safe = False` one at a time on a thread of their own), each timed from its start, never on the calling
        thread; on `process` and `ray` every environment runs in its own worker, so all calls run at once.
        """
        timeout = self.timeouts.get(kind)
        future: Future = Future()
        if self.backend == "thread":
            def abandon(done: Future) -> None:  # a call that timed out keeps its thread: never hand the env out again
                if isinstance(done.result(), EnvTimeoutError):
                    self._abandoned[id(env)] = env

            future.add_done_callback(abandon)
            self._threads.submit(functools.partial(fn, env, *args), not getattr(env, "thread_safe", True), timeout,
                                 kind, future)
            return future
        env.submit(fn, args)  # its worker starts now; a thread waits for the answer
        if self._collectors is None:
            self._collectors = _Collectors()
        self._collectors.start(functools.partial(_outcome, functools.partial(env.collect, timeout, kind)), future)
        return future

    def _run(self, calls: Sequence[EnvCall], kind: str, timeout: float | None) -> list[Any]:
        if self.backend == "thread":
            jobs = [
                (functools.partial(fn, env, *args), not getattr(env, "thread_safe", True))
                for env, fn, args in calls
            ]
            outcomes = self._threads.run(jobs, timeout, kind)
            for (env, _, _), outcome in zip(calls, outcomes, strict=True):
                if isinstance(outcome, EnvTimeoutError):
                    self._abandoned[id(env)] = env
            return outcomes
        for env, fn, args in calls:  # every environment has its own worker: start them all, then collect
            env.submit(fn, args)
        return [_outcome(functools.partial(env.collect, timeout, kind)) for env, _, _ in calls]

    def close(self) -> None:
        """Close every free environment and stop the pool's threads and workers (environments still handed out are
        closed as well on the `process`/`ray` backends). Idempotent."""
        _close_all(self._free, self._remote, self._threads)
        if self._collectors is not None:
            self._collectors.close()
            self._collectors = None
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        if self.ray_address not in (None, "local") or os.environ.get("RAY_ADDRESS"):  # a cluster the user named
            ray.init(address=self.ray_address, include_dashboard=False)
        else:
            _init_loopback_ray(ray)
        self._started_ray = True


def _init_loopback_ray(ray) -> None:
    """Start a local Ray instance whose processes (GCS, raylet, workers, actors, agents) listen on 127.0.0.1 only.

    Ray binds its servers to loopback only when the node's IP is 127.0.0.1, but on Linux it replaces a loopback
    `_node_ip_address` with the machine's routable address (`resolve_ip_for_localhost`) unless its "no clusters"
    mode is on (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, the default on macOS and Windows): turned on for this start
    only, in this process and in the processes it starts. Nothing else on the machine or the network can reach it.
    """
    from ray._private import ray_constants

    variable = getattr(ray_constants, "ENABLE_RAY_CLUSTERS_ENV_VAR", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    saved_flag, saved_env = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None), os.environ.get(variable)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[variable] = "0"
    try:
        ray.init(address=None, include_dashboard=False, _node_ip_address="127.0.0.1")
    finally:
        if saved_flag is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved_env


def _warn_hung(kind: str, names: list[str], seconds: float) -> None:
    option = {"step": "env_step_timeout", "reset": "env_reset_timeout"}.get(kind, f"env_{kind}_timeout")
    logger.warning(
        "The %s calls of environment %s have been running for %g s and no %s is set, so a hung environment would "
        "stall training for good: set %s (seconds; EnvPool(%s_timeout=...)) to fail such episodes and go on.",
        kind, ", ".join(names), seconds, option, option, kind,
    )


def _close_all(free: dict[str, list[Any]], remote: weakref.WeakSet, threads: _ThreadRunner | None) -> None:
    for envs in free.values():
        for env in envs:
            try:
                env.close()
            except Exception as err:  # noqa: BLE001 — closing one environment must not stop closing the others
                logger.warning("Closing environment %s failed: %s", getattr(env, "name", env), err)
    free.clear()
    for env in list(remote):
        env.close()
    if threads is not None:
        threads.close()


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as err:  # noqa: BLE001 — an outcome, reported per episode
        return err


# ---- thread backend --------------------------------------------------------------------------------------------------


class _Phase:
    """The calls of one `run`: their outcomes, and when and on which thread each running call started."""

    def __init__(self, size: int):
        self.changed = threading.Condition()
        self.outcomes: list[Any] = [None] * size
        self.pending = set(range(size))
        self.running: dict[int, tuple[float, threading.Thread]] = {}

    def start(self, index: int) -> None:
        with self.changed:
            self.running[index] = (time.monotonic(), threading.current_thread())
            self.changed.notify_all()

    def finish(self, index: int, outcome: Any) -> None:
        with self.changed:
            self.running.pop(index, None)
            if index in self.pending:  # a call that already timed out keeps its timeout outcome
                self.pending.discard(index)
                self.outcomes[index] = outcome
            self.changed.notify_all()


class _Job:
    """A call of `EnvPool.submit` on the thread backend: its future, and when and on which thread it started (the
    `_Phase` interface the worker threads call)."""

    def __init__(self, future: Future, timeout: float | None, kind: str):
        self.future, self.timeout, self.kind = future, timeout, kind
        self.started: float | None = None
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._runner_wake: Callable[[], None] | None = None

    def start(self, index: int) -> None:
        with self._lock:
            self.started, self.thread = time.monotonic(), threading.current_thread()
        if self.timeout is not None and self._runner_wake is not None:
            self._runner_wake()

    def finish(self, index: int, outcome: Any) -> None:
        with self._lock:
            if not self.future.done():  # a call that already timed out keeps its timeout outcome
                self.future.set_result(outcome)

    def expire(self) -> bool:
        """Give the call its timeout outcome unless it finished first; whether it did."""
        with self._lock:
            if self.future.done():
                return False
            self.future.set_result(EnvTimeoutError(f"{self.kind} timed out after {self.timeout:g} s"))
            return True


class _Collectors:
    """Threads that wait for the answers of calls submitted to `process`/`ray` workers (`EnvPool.submit`): one
    thread per call in flight, reused."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self._executor = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="trl-agents-env-collect")

    def start(self, wait: Callable[[], Any], future: Future) -> None:
        def run() -> None:
            future.set_result(wait())  # `_outcome`: never raises

        self._executor.submit(run)

    def close(self) -> None:
        self._executor.shutdown(wait=False)


class _ThreadRunner:
    """Runs calls on long-lived daemon threads, timing each out from the moment it starts: up to `num_workers` calls
    at once, except those marked serial (environments that are not thread-safe), which one dedicated thread runs one
    after the other, so that waiting for their turn never counts against their timeout.

    A thread cannot be killed: the thread of a call that timed out is abandoned (left to finish or hang on its own,
    then it exits) and a fresh thread takes its place, so the other calls keep their workers.
    """

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self._queues = {False: queue.SimpleQueue(), True: queue.SimpleQueue()}  # serial? -> its queue
        self._workers: dict[threading.Thread, bool] = {}  # live worker -> serial?
        self._abandoned: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._names = itertools.count()
        self._timed: set[_Job] = set()  # submitted calls with a timeout, not yet done
        self._timed_changed = threading.Condition(self._lock)
        self._watcher: threading.Thread | None = None
        self._closed = False

    def run(self, calls: list[tuple[Callable[[], Any], bool]], timeout: float | None, kind: str) -> list[Any]:
        """Outcomes of `(call, serial)` pairs, in order (see `EnvPool.run`)."""
        if self.num_workers == 1 and timeout is None:  # one after the other on the calling thread
            return [_outcome(call) for call, _ in calls]
        phase = _Phase(len(calls))
        for index, (call, serial) in enumerate(calls):
            self._queues[serial].put((phase, index, call))
        num_serial = sum(serial for _, serial in calls)
        with self._lock:
            for serial, wanted in ((True, min(num_serial, 1)), (False, min(len(calls) - num_serial, self.num_workers))):
                while sum(is_serial == serial for is_serial in self._workers.values()) < wanted:
                    self._add_worker(serial)
        with phase.changed:
            while phase.pending:
                wait = None
                if timeout is not None:
                    now = time.monotonic()
                    for index, (started, thread) in list(phase.running.items()):
                        if now - started >= timeout:
                            phase.running.pop(index)
                            phase.pending.discard(index)
                            phase.outcomes[index] = EnvTimeoutError(f"{kind} timed out after {timeout:g} s")
                            self._abandon(thread)
                    if phase.running:
                        wait = max(min(started for started, _ in phase.running.values()) + timeout - now, 0.0)
                if phase.pending:
                    phase.changed.wait(wait)
        return phase.outcomes

    def submit(self, call: Callable[[], Any], serial: bool, timeout: float | None, kind: str, future: Future) -> None:
        """Run `call` on a worker thread (never the calling one) and put its outcome in `future`; past `timeout`
        seconds from its start, the outcome is an `EnvTimeoutError` and its thread is abandoned (`EnvPool.submit`)."""
        job = _Job(future, timeout, kind)
        if timeout is not None:
            job._runner_wake = self._wake_watcher
        self._queues[serial].put((job, 0, call))
        with self._lock:
            wanted = 1 if serial else self.num_workers
            if sum(is_serial == serial for is_serial in self._workers.values()) < wanted:
                self._add_worker(serial)
            if timeout is not None:
                self._timed.add(job)
                if self._watcher is None:
                    self._watcher = threading.Thread(target=self._watch, name="trl-agents-env-timeouts", daemon=True)
                    self._watcher.start()
                self._timed_changed.notify()

    def _wake_watcher(self) -> None:
        with self._lock:
            self._timed_changed.notify()

    def _watch(self) -> None:
        """Time out the running submitted calls (`submit`): one thread for all of them."""
        with self._lock:
            while not self._closed:
                now, wait = time.monotonic(), None
                for job in list(self._timed):
                    if job.future.done():
                        self._timed.discard(job)
                    elif job.started is not None:
                        left = job.started + job.timeout - now
                        if left <= 0:
                            self._timed.discard(job)
                            if job.expire():
                                self._abandon_locked(job.thread)
                        else:
                            wait = left if wait is None else min(wait, left)
                    # (a queued call's clock starts when a thread takes it: `_Job.start` wakes this loop)
                self._timed_changed.wait(wait)

    def close(self) -> None:
        """Stop the idle workers and wait for them (abandoned ones cannot be stopped; they are daemons)."""
        with self._lock:
            self._closed = True
            self._timed_changed.notify()
            workers = list(self._workers.items())
            for _, serial in workers:
                self._queues[serial].put(None)
            self._workers.clear()
        for worker, _ in workers:
            worker.join(timeout=5.0)

    def _add_worker(self, serial: bool) -> None:
        worker = threading.Thread(
            target=self._work, args=(self._queues[serial],), name=f"trl-agents-env-{next(self._names)}", daemon=True
        )
        self._workers[worker] = serial
        worker.start()

    def _abandon(self, thread: threading.Thread) -> None:
        with self._lock:
            self._abandon_locked(thread)

    def _abandon_locked(self, thread: threading.Thread | None) -> None:
        serial = self._workers.pop(thread, None)
        if serial is not None:
            self._abandoned.add(thread)
            self._add_worker(serial)

    def _work(self, jobs: queue.SimpleQueue) -> None:
        me = threading.current_thread()
        while True:
            item = jobs.get()
            if item is None:
                return
            phase, index, call = item  # a `_Phase` of `run`, or a `_Job` of `submit`
            phase.start(index)
            try:
                outcome = call()
            except BaseException as err:  # noqa: BLE001 — even SystemExit from env code fails only its episode
                outcome = err
            phase.finish(index, outcome)
            with self._lock:
                if me in self._abandoned:  # replaced while hung: leave
                    self._abandoned.discard(me)
                    return


# ---- process and ray backends: proxies -------------------------------------------------------------------------------


class _RemoteEnv:
    """An `AgentEnv` look-alike whose environment lives in a worker. `submit` + `collect` run one call there;
    the `AgentEnv` methods are forwarded one call each (bounded by the step timeout)."""

    def __init__(self, env_cls: type[AgentEnv], timeouts: dict[str, float | None], start_timeout: float):
        self.env_cls = env_cls
        self.name = env_cls.name
        self.instructions = env_cls.instructions
        self.tools = env_cls.tools
        self.roles = env_cls.roles
        self.timeouts = dict(timeouts)  # {"reset": seconds or None, "step": seconds or None}
        self.start_timeout = start_timeout
        self.broken = False
        self.broken_reason = ""
        self._started = False
        self._closed = False
        self._submitted_at = 0.0
        self._unsent = False  # the last call could not be sent: the worker is gone

    # Subclasses implement _send(fn, args), _receive(timeout, kind) -> (received, reply), _kill(), _stop() and
    # _death() (why the worker is gone).

    def submit(self, fn: Callable[..., Any], args: tuple) -> None:
        """Start `fn(env, *args)` in the worker."""
        self._submitted_at = time.monotonic()
        self._unsent = False
        if not self.broken:
            try:
                self._send(fn, args)
            except Exception:  # noqa: BLE001 — the worker is gone (its pipe is broken); `collect` says why
                self._unsent = True

    def collect(self, timeout: float | None, kind: str) -> Any:
        """The result of the submitted call; raises what the environment raised, or `EnvCallError`."""
        if self.broken:
            raise EnvCallError(f"{kind} failed: {self.broken_reason}")
        if not self._started:  # the first reply says that the worker has built its environment
            received, reply = self._receive(self.start_timeout, kind)
            if not received:
                self._kill(f"the environment worker did not start within {self.start_timeout:g} s")
                raise EnvCallError(f"{kind} failed: {self.broken_reason}")
            self._started = True
            self._submitted_at = max(self._submitted_at, time.monotonic())  # the call ran once the worker was ready
            if reply[0] == "raised":  # the constructor failed; so does every call
                self._fail(f"the environment could not be built: {type(reply[1]).__name__}: {reply[1]}")
                raise reply[1]
        if self._unsent:
            raise self._dead(kind)
        remaining = None if timeout is None else max(self._submitted_at + timeout - time.monotonic(), 0.0)
        received, reply = self._receive(remaining, kind)
        if not received:
            self._kill(f"the environment worker was killed after a {kind} timed out")
            raise EnvTimeoutError(f"{kind} timed out after {timeout:g} s")
        status, value = reply
        if status == "raised":
            raise value
        return value

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, kind: str = "call") -> Any:
        """Run `fn(env, *args)` in the worker and wait for it (at most `timeout` seconds)."""
        self.submit(fn, args)
        return self.collect(timeout, kind)

    def capabilities(self) -> frozenset[str]:
        return self.env_cls.capabilities()

    def supports(self, capability: str) -> bool:
        return capability in self.capabilities()

    def close(self) -> None:
        """Stop the worker (it closes its environment first); kill it if it does not stop. Idempotent."""
        if not self._closed:
            self._closed = True
            self._stop()
        self._fail("the environment was closed")

    def _fail(self, reason: str) -> None:
        if not self.broken:
            self.broken, self.broken_reason = True, reason

    def _dead(self, kind: str) -> EnvCallError:
        self._fail(f"the environment worker died ({self._death()})")
        return EnvCallError(f"{kind} failed: {self.broken_reason}")


def _forward(method: str) -> Callable[..., Any]:
    def forwarded(self, *args):
        timeout = self.timeouts["reset" if method == "reset" else "step"]
        return self.call(call_method, method, *args, timeout=timeout, kind=method)

    forwarded.__name__ = method
    forwarded.__doc__ = f"`AgentEnv.{method}`, run in the worker."
    return forwarded


FORWARDED_METHODS = (
    "reset", "step", "task_description", "admissible_actions", "current_role", "snapshot", "restore", "state_key",
    "solver_value", "optimal_plan", "verify", "privileged_context",
)
for _method in FORWARDED_METHODS:
    setattr(_RemoteEnv, _method, _forward(_method))


class ProcessEnv(_RemoteEnv):
    """An environment in its own worker process (forkserver where the platform has it, else spawn: never fork, which
    is unsafe once torch has started threads), driven over a pipe. A call past its timeout kills the worker."""

    def __init__(
        self,
        env_cls: type[AgentEnv],
        env_kwargs: dict[str, Any],
        timeouts: dict[str, float | None],
        start_timeout: float = START_TIMEOUT,
    ):
        super().__init__(env_cls, timeouts, start_timeout)
        try:  # what the worker receives travels by pickle: fail here, clearly, rather than in the worker
            pickle.dumps((env_cls, env_kwargs))
        except Exception as err:
            raise ValueError(
                f"backend='process' sends the environment class and env_kwargs to a worker process, but "
                f"{env_cls.__qualname__} (module {env_cls.__module__}) or its env_kwargs cannot be pickled "
                f"({type(err).__name__}: {err}). Define the class at the top level of an importable module and use "
                "picklable env_kwargs."
            ) from err
        context = _process_context()
        self._conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=_process_worker, args=(child_conn, env_cls, env_kwargs), name=f"trl-agents-env-{env_cls.name}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()

    def _send(self, fn, args) -> None:
        self._conn.send((fn, args))

    def _receive(self, timeout: float | None, kind: str) -> tuple[bool, Any]:
        if not self._conn.poll(timeout):
            return False, None
        try:
            return True, self._conn.recv()
        except (EOFError, OSError):  # the worker is gone: its end of the pipe closed or reset
            raise self._dead(kind) from None
        except Exception as err:  # noqa: BLE001 — a reply that does not unpickle here (e.g. an odd exception class)
            return True, ("raised", EnvCallError(f"{kind} failed: unreadable reply ({type(err).__name__}: {err})"))

    def _death(self) -> str:
        self.process.join(timeout=5.0)
        code = self.process.exitcode
        death = f"exit code {code}" if code is None or code >= 0 else f"killed by signal {signal.Signals(-code).name}"
        if not self._started:
            death += (
                " while starting; its traceback is above. A worker imports your script, as DataLoader workers do, "
                "and the environment class by module and name: put the script's training code under "
                "`if __name__ == '__main__':` (code outside it runs again in every worker) and define the class at the "
                "top level, outside that block (not in a notebook)"
            )
        return death

    def _kill(self, reason: str) -> None:
        self._fail(reason)
        self._closed = True
        try:  # the worker leads its own process group: this also stops what it started (e.g. a JVM)
            os.killpg(self.process.pid, signal.SIGKILL)
        except (AttributeError, OSError):  # no process groups here, or the worker had not created its group yet
            self.process.kill()
        self.process.join(timeout=5.0)
        self._conn.close()

    def _stop(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=5.0)
        if self.process.is_alive():
            self._kill("the environment worker did not stop")
        self._conn.close()


@functools.cache
def _process_context():
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Workers fork from a server that has imported this module and the built-in environments: cheap starts.
    context.set_forkserver_preload([__name__])
    return context


def _process_worker(conn, env_cls: type[AgentEnv], env_kwargs: dict[str, Any]) -> None:
    """The worker's loop: build the environment, then run `(fn, args)` messages until None or the pipe closes."""
    if hasattr(os, "setpgrp"):  # own process group: Ctrl-C in the terminal stops the trainer, which stops us
        os.setpgrp()
    try:
        env = env_cls(**env_kwargs)
    except Exception as err:  # noqa: BLE001 — reported to the trainer, which fails the episodes that needed it
        _reply(conn, "raised", err)
        return
    _reply(conn, "ready", None)
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the trainer is gone
            break
        if message is None:
            break
        fn, args = message
        try:
            _reply(conn, "ok", fn(env, *args))
        except Exception as err:  # noqa: BLE001
            _reply(conn, "raised", err)
    try:
        env.close()
    except Exception as err:  # noqa: BLE001 — the worker exits anyway
        logger.warning("Closing environment %s failed: %s", env_cls.name, err)


def _reply(conn, status: str, value: Any) -> None:
    try:
        payload = pickle.dumps((status, value))
    except Exception as err:  # noqa: BLE001 — e.g. a snapshot holding a lock, or an exception with odd arguments
        what = f"{type(value).__name__}: {value}" if status == "raised" else "the result"
        message = f"{what} could not be sent back from the environment worker ({type(err).__name__}: {err})"
        payload = pickle.dumps(("raised", RuntimeError(message)))
    conn.send_bytes(payload)


class RayEnv(_RemoteEnv):
    """An environment in a Ray actor (any node of the cluster). A call past its timeout kills the actor."""

    def __init__(
        self,
        env_cls: type[AgentEnv],
        env_kwargs: dict[str, Any],
        timeouts: dict[str, float | None],
        start_timeout: float = START_TIMEOUT,
        actor_options: dict[str, Any] | None = None,
    ):
        super().__init__(env_cls, timeouts, start_timeout)
        self._actor = _ray_actor_class().options(**(actor_options or {})).remote(env_cls, env_kwargs)
        self._pending = [self._actor.ready.remote()]

    def _send(self, fn, args) -> None:
        self._pending.append(self._actor.run.remote(fn, args))

    def _receive(self, timeout: float | None, kind: str) -> tuple[bool, Any]:
        import ray

        try:
            reply = ray.get(self._pending[0], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            return False, None
        except ray.exceptions.RayActorError as err:
            self._actor_error = err
            raise self._dead(kind) from None
        self._pending.pop(0)
        return True, reply

    def _death(self) -> str:
        return str(getattr(self, "_actor_error", "unknown cause")).splitlines()[0]

    def _kill(self, reason: str) -> None:
        import ray

        self._fail(reason)
        self._closed = True
        ray.kill(self._actor)

    def _stop(self) -> None:
        import ray

        if not ray.is_initialized():  # Ray was shut down first (e.g. at exit): its actors are gone with it
            return
        try:
            ray.get(self._actor.close.remote(), timeout=5.0)
        except Exception as err:  # noqa: BLE001 — the actor is killed anyway
            logger.warning("Closing environment %s failed: %s", self.name, err)
        ray.kill(self._actor)
        _wait_until_dead(self._actor, RAY_STOP_TIMEOUT)


RAY_STOP_TIMEOUT = 10.0  # our choice: seconds `close()` waits for a killed actor to be gone


def _wait_until_dead(actor, timeout: float) -> None:
    """Return once `actor` answers no more calls (`ray.kill` is asynchronous: a call sent right after it may still
    run), so that `close()` returns with its actors stopped; give up with a warning after `timeout` seconds."""
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=max(deadline - time.monotonic(), 0.1))
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            break
        time.sleep(0.05)
    logger.warning("A killed Ray environment actor still answered after %.0f s", timeout)


_RAY_ACTOR = None


def _ray_actor_class():
    """The Ray actor that holds one environment (defined on first use: ray is an optional dependency)."""
    global _RAY_ACTOR
    if _RAY_ACTOR is None:
        import ray

        @ray.remote
        class EnvActor:
            def __init__(self, env_cls, env_kwargs):
                self.error = None
                try:
                    self.env = env_cls(**env_kwargs)
                except Exception as err:  # noqa: BLE001 — reported by `ready`
                    self.error = err

            def ready(self):
                return ("raised", self.error) if self.error is not None else ("ready", None)

            def run(self, fn, args):
                try:
                    return ("ok", fn(self.env, *args))
                except Exception as err:  # noqa: BLE001
                    return ("raised", err)

            def close(self):
                if self.error is None:
                    self.env.close()

        _RAY_ACTOR = EnvActor
    return _RAY_ACTOR
