"""Environment execution backends (EnvPool): hanging and crashing environments fail their own episode only, the
backends give the same rollouts, calls really run concurrently, and nothing is left running after close()."""

from __future__ import annotations

import multiprocessing
import threading
import time

import envs_for_pools
import pytest
from envs_for_pools import RELEASE

from trl_agents.rollout import EnvCallError, EnvPool, EnvTimeoutError, PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.env_pool import ProcessEnv, check_execution_settings

LOCAL_BACKENDS = ["thread", "process"]


@pytest.fixture(autouse=True)
def release_hung_steps():
    """Hung steps of the thread backend wait on RELEASE: let their threads finish after each test."""
    RELEASE.clear()
    yield
    RELEASE.set()


def engine_for(scripted, tokenizer, pool, policy, max_turns=3, **kwargs):
    return RolloutEngine(
        scripted(policy), PromptRenderer(tokenizer), max_turns=max_turns, sampling=SamplingParams(max_new_tokens=4),
        env_pool=pool, **kwargs,
    )


def act_at(call_index: int, row_index: int, action: str):
    """A policy that says `action` in row `row_index` of generation call `call_index`, "good" everywhere else."""

    def policy(prompt_ids, call, row, batch_size):
        return action if (call, row) == (call_index, row_index) else "good"

    return policy


def episodes(batch):
    return {(g, t.episode_id): t for g, group in enumerate(batch.groups) for t in group.trajectories}


def env_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("trl-agents-env-")]


TASKS = [{"env": "test-sleepy", "seed": 0}, {"env": "test-sleepy", "seed": 1}]


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_a_hanging_env_fails_its_episode_and_the_rollout_goes_on(backend, tokenizer, scripted):
    pool = EnvPool(backend=backend, num_workers=4, step_timeout=1.0)
    try:
        # Turn 2 (call 1), row 1 = task 0, episode 1 hangs; the three other episodes play their 3 good turns.
        engine = engine_for(scripted, tokenizer, pool, act_at(1, 1, "hang"))
        started = time.monotonic()
        batch = engine.run(TASKS, num_generations=2)
        assert time.monotonic() - started < 30
        hung = episodes(batch)[(0, 1)]
        assert hung.error == "step timed out after 1 s"
        assert [s.action_text for s in hung.steps] == ["good", "hang"]  # the step before and the hung one, kept
        assert hung.steps[0].reward == 1.0 and hung.steps[0].state_key == (0, 0)
        assert batch.groups[0].healthy().trajectories == [episodes(batch)[(0, 0)]]
        for key, trajectory in episodes(batch).items():
            if key != (0, 1):
                assert trajectory.error is None and trajectory.success and trajectory.num_steps == 3
        # The hung environment is never handed out again; the next rollout runs on healthy ones.
        assert sum(len(envs) for envs in pool._free.values()) == 3
        again = engine_for(scripted, tokenizer, pool, lambda *a: "good").run(TASKS, num_generations=2)
        assert all(t.success for t in again.trajectories)
    finally:
        pool.close()


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_an_env_that_raises_fails_its_episode(backend, tokenizer, scripted):
    pool = EnvPool(backend=backend, num_workers=2)
    try:
        batch = engine_for(scripted, tokenizer, pool, act_at(0, 2, "raise")).run(TASKS, num_generations=2)
        failed = episodes(batch)[(1, 0)]
        assert failed.error == "step failed: RuntimeError: the environment broke"
        assert [s.action_text for s in failed.steps] == ["raise"] and failed.steps[0].state_key == (1, 0)
        assert sum(t.failed for t in batch.trajectories) == 1
    finally:
        pool.close()


def test_a_crashing_worker_fails_its_episode(tokenizer, scripted):
    pool = EnvPool(backend="process")
    try:
        batch = engine_for(scripted, tokenizer, pool, act_at(1, 3, "crash")).run(TASKS, num_generations=2)
        crashed = episodes(batch)[(1, 1)]
        assert crashed.error == "step failed: the environment worker died (exit code 3)"
        assert [s.action_text for s in crashed.steps] == ["good", "crash"]
        assert sum(t.success for t in batch.trajectories) == 3
        assert sum(len(envs) for envs in pool._free.values()) == 3
    finally:
        pool.close()


def test_an_env_that_cannot_be_built_in_its_worker_fails_its_episodes(tokenizer, scripted):
    pool = EnvPool(backend="process")
    try:
        batch = engine_for(scripted, tokenizer, pool, lambda *a: "good").run([{"env": "test-unbuildable"}], 2)
        expected = "reset failed: RuntimeError: cannot build this environment"
        assert [t.error for t in batch.trajectories] == [expected] * 2
        assert not pool._free  # broken workers are not kept
        env = pool.acquire({"env": "test-unbuildable"})
        env.process.join(timeout=30)  # the worker has reported its error and exited before the first call
        with pytest.raises(RuntimeError, match="cannot build this environment"):
            env.reset({})
    finally:
        pool.close()


def test_env_classes_that_workers_cannot_import_fail_clearly(tokenizer, scripted, monkeypatch):
    import sys
    import types

    from trl_agents.envs import registry

    class Local(envs_for_pools.SleepyEnv):  # cannot be pickled: a local class
        name = "test-local"

    monkeypatch.setitem(registry._REGISTRY, "test-local", Local)
    pool = EnvPool(backend="process")
    with pytest.raises(ValueError, match="cannot be pickled .* top level of an importable module"):
        pool.acquire({"env": "test-local"})

    # Importable here (the module only exists in this process), not in the worker: it dies while starting.
    phantom = types.ModuleType("phantom_envs")
    attributes = {"name": "test-phantom", "__module__": "phantom_envs"}
    phantom.Phantom = type("Phantom", (envs_for_pools.SleepyEnv,), attributes)
    monkeypatch.setitem(sys.modules, "phantom_envs", phantom)
    monkeypatch.setitem(registry._REGISTRY, "test-phantom", phantom.Phantom)
    try:
        batch = engine_for(scripted, tokenizer, pool, lambda *a: "good").run([{"env": "test-phantom", "seed": 0}], 1)
        assert batch.trajectories[0].error.startswith(
            "reset failed: the environment worker died (exit code 1 while starting; its traceback is above."
        )
    finally:
        pool.close()


def frozenlake_policy(prompt_ids, call, row, batch_size):
    return ["```right```", "```down```", "go north", "```left```"][(call + row) % 4]


@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_backends_give_the_same_rollouts(row_format, tokenizer, scripted):
    tasks = [{"env": "test-verified-lake", "seed": seed} for seed in (3, 11, 12)]

    def rollout(**pool_args):
        pool = EnvPool(**pool_args)
        try:
            engine = engine_for(
                scripted, tokenizer, pool, frozenlake_policy, max_turns=4, row_format=row_format,
                record_snapshots=True, signals=("solver_value", "verifier_atoms"),
            )
            batch = engine.run(tasks, num_generations=3)
            assert all(s.snapshot is not None for t in batch.trajectories for s in t.steps)
            assert all("verifier_atoms" in t.steps[-1].signals for t in batch.trajectories)  # verified in the worker
            return batch.to_rows()
        finally:
            pool.close()

    sequential = rollout()
    assert any(row["info"] != "{}" for row in sequential) and any(not row["valid"] for row in sequential)
    assert rollout(num_workers=8) == sequential
    assert rollout(num_workers=8, step_timeout=30.0, reset_timeout=30.0) == sequential
    assert rollout(backend="process", step_timeout=30.0) == sequential


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)
def test_calls_of_a_turn_run_concurrently(backend, tokenizer, scripted):
    """8 episodes x one 0.2 s step: 1.6 s one after the other, ~0.2 s at once (a functional check with a generous
    bound; sleeping threads and processes need no CPU)."""
    pool = EnvPool(backend=backend, num_workers=8, env_kwargs={"delay": 0.2})
    try:
        engine = engine_for(scripted, tokenizer, pool, lambda *a: "good", max_turns=1)
        tasks = [{"env": "test-sleepy", "seed": seed, "length": 1} for seed in range(4)]
        engine.run(tasks, num_generations=2)  # process backend: start the workers first
        started = time.monotonic()
        batch = engine.run(tasks, num_generations=2)
        elapsed = time.monotonic() - started
        assert all(t.success for t in batch.trajectories)
        assert elapsed < 0.5 * 8 * 0.2, elapsed
        if backend == "process":
            assert len({t.steps[0].info["pid"] for t in batch.trajectories}) == 8  # one worker per environment
    finally:
        pool.close()


def test_envs_that_are_not_thread_safe_run_one_call_at_a_time(tokenizer, scripted):
    """4 'test-lone' episodes (not thread-safe, 0.3 s steps) and 4 'test-sleepy' ones on 8 threads: the lone ones
    never overlap, and waiting for their turn does not count against the 0.5 s timeout; the others run at once."""
    from envs_for_pools import LoneEnv

    LoneEnv.most_active = 0
    pool = EnvPool(num_workers=8, step_timeout=0.5, env_kwargs={"delay": 0.3})
    try:
        engine = engine_for(scripted, tokenizer, pool, lambda *a: "good", max_turns=1)
        tasks = [{"env": "test-lone", "seed": 0, "length": 1}, {"env": "test-sleepy", "seed": 0, "length": 1}]
        started = time.monotonic()
        batch = engine.run(tasks, num_generations=4)
        elapsed = time.monotonic() - started
        assert [t.error for t in batch.trajectories] == [None] * 8
        assert LoneEnv.most_active == 1
        assert 4 * 0.3 <= elapsed < 4 * 0.3 + 3.0  # the lone steps in a row, the sleepy ones alongside
    finally:
        pool.close()


def test_thread_workers_and_hung_threads_are_gone_after_close(tokenizer, scripted):
    for thread in env_threads():  # hung threads of earlier tests, released by the fixture, finish first
        thread.join(timeout=5)
    pool = EnvPool(num_workers=4, step_timeout=0.5)
    engine = engine_for(scripted, tokenizer, pool, act_at(0, 0, "hang"), max_turns=1)
    batch = engine.run(TASKS, num_generations=2)
    assert batch.trajectories[0].error == "step timed out after 0.5 s"
    assert len(env_threads()) == 5  # 4 workers + the abandoned one, still inside step()
    pool.close()
    RELEASE.set()  # the hung step returns: its abandoned thread exits too
    for thread in env_threads():
        thread.join(timeout=5)
    assert env_threads() == []


def test_process_workers_are_reused_and_stopped_by_close(tokenizer, scripted):
    pool = EnvPool(backend="process", step_timeout=5.0)
    engine = engine_for(scripted, tokenizer, pool, lambda *a: "good", max_turns=1)
    first = engine.run(TASKS, num_generations=2)
    second = engine.run(TASKS, num_generations=2)
    pids = {t.steps[0].info["pid"] for t in first.trajectories}
    assert len(pids) == 4 and {t.steps[0].info["pid"] for t in second.trajectories} == pids
    workers = [env.process for envs in pool._free.values() for env in envs]
    assert all(worker.is_alive() for worker in workers)
    pool.close()
    assert not any(worker.is_alive() for worker in workers)
    assert not set(multiprocessing.active_children()) & set(workers)
    third = engine.run(TASKS, num_generations=2)  # a closed pool starts new workers when used again
    assert len({t.steps[0].info["pid"] for t in third.trajectories} - pids) == 4
    pool.close()


def test_process_env_forwards_the_agent_env_methods():
    pool = EnvPool(backend="process", step_timeout=2.0, env_kwargs={"delay": 0.0})
    env = pool.acquire({"env": "test-sleepy"})
    try:
        assert isinstance(env, ProcessEnv) and env.name == "test-sleepy" and env.supports("snapshot")
        assert env.reset({"seed": 7}) == "Round 0 of task 7."
        snapshot = env.snapshot()
        # The step ran, but its info holds a lock, which cannot travel back (the engine's calls make info JSON-safe).
        with pytest.raises(RuntimeError, match="could not be sent back from the environment worker"):
            env.step("good")
        assert env.state_key() == (7, 1)
        env.restore(snapshot)
        assert env.state_key() == (7, 0)
        with pytest.raises(RuntimeError, match="the environment broke"):  # the env's own exception, re-raised
            env.step("raise")
        with pytest.raises(NotImplementedError):
            env.solver_value()
        with pytest.raises(EnvTimeoutError, match="step timed out after 2 s"):
            env.step("hang")
        assert env.broken and not env.process.is_alive()
        with pytest.raises(EnvCallError, match="killed after a step timed out"):
            env.state_key()
        pool.release(env)
        assert not pool._free
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"backend": "threads"}, "backend must be one of 'thread', 'process', 'ray'"),
        ({"num_workers": 0}, "num_workers must be an integer >= 1"),
        ({"step_timeout": 0}, "step_timeout must be a positive number of seconds or None"),
        ({"reset_timeout": float("inf")}, "reset_timeout must be a positive number"),
        ({"ray_address": "auto"}, "ray_address is only used with backend='ray'"),
    ],
)
def test_bad_settings_name_the_argument(settings, message):
    with pytest.raises(ValueError, match=message):
        EnvPool(**settings)


def test_ray_backend_without_ray_says_how_to_install_it(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r"env_backend='ray' needs the ray package: pip install 'trl-agents\[ray\]'"):
        check_execution_settings("ray", 1, None, None, None, names={"backend": "env_backend"})


def test_training_goes_on_when_an_env_hangs_in_its_worker(train_one_iteration, tmp_path):
    import pandas as pd

    marker = str(tmp_path / "hung")  # the first step that creates it hangs: one episode of the rollout
    trainer = train_one_iteration(
        "test-sleepy", [{"seed": 0, "hang_marker": marker}, {"seed": 1, "hang_marker": marker}],
        env_backend="process", env_step_timeout=2.0,
    )
    try:
        logs = [h for h in trainer.state.log_history if "env/failed_episode_rate" in h]
        assert logs[0]["env/failed_episode_rate"] == 0.25
        rows = pd.read_parquet(tmp_path / "out-test-sleepy" / "trajectories")
        failed = rows[rows["error"].notna()]
        assert list(failed["error"]) == ["step timed out after 2 s"] and failed["advantage"].isna().all()
        assert len(rows[rows["error"].isna()]) == 3 * 2  # the three healthy episodes, two turns each
        # The hung episode's task is left with one healthy episode: nothing to compare it with, so its group is not
        # trained on (min_healthy_episodes=2) — it is recorded, with no advantage.
        assert logs[0]["rollout/dropped_groups"] == 1
        lone = rows[(rows["error"].isna()) & (rows["group_index"] == failed["group_index"].iloc[0])]
        assert len(lone) == 2 and lone["advantage"].isna().all()
        assert rows[rows["group_index"] != failed["group_index"].iloc[0]]["advantage"].notna().all()
        # train() stopped the environments' workers at its end (the hung one was killed at its timeout)
        assert not trainer.env_pool._free and not multiprocessing.active_children()
    finally:
        trainer.env_pool.close()


def test_config_fields_are_validated(tmp_path):
    from trl_agents import AgentGRPOConfig

    def config(**fields):
        return AgentGRPOConfig(str(tmp_path), report_to="none", **fields)

    assert config().env_backend == "thread" and config().env_workers == 1 and config().env_step_timeout is None
    with pytest.raises(ValueError, match="env_backend must be one of 'thread', 'process', 'ray', got 'processes'"):
        config(env_backend="processes")
    with pytest.raises(ValueError, match="env_workers must be an integer >= 1, got 0"):
        config(env_workers=0)
    with pytest.raises(ValueError, match="env_step_timeout must be a positive number of seconds or None"):
        config(env_step_timeout=-1.0)
    with pytest.raises(ValueError, match="ray_address is only used with env_backend='ray'"):
        config(ray_address="auto")


# ---- Ray backend, on a local instance ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance whose workers can import this test folder (for envs_for_pools)."""
    import os

    ray = pytest.importorskip("ray")
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_backend_fails_hung_and_crashed_episodes_only(local_ray, tokenizer, scripted):
    def policy(prompt_ids, call, row, batch_size):
        return {(1, 1): "hang", (1, 3): "crash"}.get((call, row), "good")

    pool = EnvPool(backend="ray", step_timeout=3.0)
    try:
        batch = engine_for(scripted, tokenizer, pool, policy).run(TASKS, num_generations=2)
        by_key = episodes(batch)
        assert by_key[(0, 1)].error == "step timed out after 3 s"
        assert by_key[(1, 1)].error.startswith("step failed: the environment worker died (")
        for key in (0, 1), (1, 1):
            assert by_key[key].steps[0].action_text == "good" and by_key[key].num_steps == 2
        assert by_key[(0, 0)].success and by_key[(1, 0)].success
        assert len({t.steps[0].info["pid"] for t in batch.trajectories}) == 4  # one actor per environment
        actors = [env._actor for envs in pool._free.values() for env in envs]
        assert len(actors) == 2
    finally:
        pool.close()
    for actor in actors:  # close() stopped the actors
        with pytest.raises(local_ray.exceptions.RayActorError):
            local_ray.get(actor.ready.remote(), timeout=30)


@pytest.mark.slow
def test_ray_backend_gives_the_same_rollouts(local_ray, tokenizer, scripted):
    tasks = [{"env": "frozenlake", "seed": seed} for seed in (3, 11)]

    def rollout(**pool_args):
        pool = EnvPool(**pool_args)
        try:
            engine = engine_for(scripted, tokenizer, pool, frozenlake_policy, max_turns=4,
                                signals=("solver_value",))
            return engine.run(tasks, num_generations=2).to_rows()
        finally:
            pool.close()

    assert rollout(backend="ray", step_timeout=30.0) == rollout()


# ---- built-in environments stepped on threads ------------------------------------------------------------------------


def test_rush_hour_tables_survive_many_threads(monkeypatch):
    """Threads look up and evict Rush Hour tables at once. The cache's get/move_to_end is widened (a sleep in get) so
    that an eviction lands in between whenever look-up and update are not one atomic step."""
    from collections import OrderedDict

    from trl_agents.envs import rushhour

    class Sluggish(OrderedDict):
        def get(self, key, default=None):
            value = super().get(key, default)
            time.sleep(0.002)
            return value

    boards = [rushhour.generate_board(seed, 3, 2, 6, 0, 100_000, 200) for seed in range(4)]
    expected = {board: rushhour.distance_table(board).num_states for board in boards}
    monkeypatch.setattr(rushhour, "_TABLES", Sluggish())
    monkeypatch.setattr(rushhour, "_TABLE_CACHE_SIZE", 2)
    errors, results = [], []

    def look_up(offset):
        try:
            for index in range(20):
                board = boards[(offset + index) % len(boards)]
                results.append(rushhour.distance_table(board).num_states == expected[board])
        except Exception as err:  # noqa: BLE001 — collected for the assertion below
            errors.append(repr(err))

    threads = [threading.Thread(target=look_up, args=(offset,)) for offset in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(results) == 160 and all(results)
    assert len(rushhour._TABLES) == 2


def test_textarena_episodes_on_threads_stay_deterministic(monkeypatch):
    """2048 spawns tiles from the global random module, which the adapter swaps per episode: episodes stepped on
    many threads must play exactly as when played one after the other. A sleep right after the swap (in the
    adapter's stdout silencer) lets other threads run inside the window whenever the swap is not exclusive."""
    import io
    import types

    pytest.importorskip("textarena")
    from trl_agents.envs.adapters import textarena
    from trl_agents.envs.adapters.textarena import TextArenaEnv

    def sluggish_string_io():
        time.sleep(0.001)
        return io.StringIO()

    monkeypatch.setattr(textarena, "io", types.SimpleNamespace(StringIO=sluggish_string_io))

    moves = ["[up]", "[left]", "[down]", "[right]"] * 4

    def play(seed):
        env = TextArenaEnv(game="2048-v0")
        observations = [env.reset({"seed": seed})]
        observations += [env.step(move)[0] for move in moves]
        return observations

    expected = {seed: play(seed) for seed in range(2)}
    results = [None] * 8

    def run(index):
        results[index] = play(index % 2)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected[index % 2] for index in range(8)]


SPLIT_KWARGS = {"textarena": {"game": "2048-v0"}, "gymnasium": {"env_id": "FrozenLake-v1"}}


def solver_turn(env):
    """One turn of a solver-guided policy (the first planned or admissible action), run where the env lives."""
    action = "hello"
    if env.supports("optimal_plan"):
        action = (env.optimal_plan() or [action])[0]
    elif env.admissible_actions():
        action = env.admissible_actions()[0]
    return env.step(action)[:3]


def built_in_envs() -> list[str]:
    from trl_agents.envs import list_envs

    return [name for name, cls in list_envs().items() if cls.__module__.startswith("trl_agents.envs")]


@pytest.mark.slow
@pytest.mark.parametrize("name", built_in_envs())
def test_every_built_in_env_plays_the_same_on_threads(name):
    """Each built-in environment, 4 episodes of 4 solver turns: the thread backend (4 workers) plays exactly as one
    environment after the other. TextWorld's parse cache is cleared first, so its games are parsed concurrently."""
    from trl_agents.envs import get_env_class
    from trl_agents.rollout.env_pool import call_method

    env_cls = get_env_class(name)
    if env_cls.missing_requirements():
        pytest.skip(f"needs {env_cls.missing_requirements()}")
    kwargs = SPLIT_KWARGS.get(name, {})
    try:
        tasks = env_cls.task_split("train", 4, **kwargs)
    except (NotImplementedError, ValueError) as err:
        pytest.skip(f"no built-in task split: {err}")

    def play(pool):
        envs = [pool.acquire(task) for task in tasks]
        try:
            transcript = [pool.run([(env, call_method, ("reset", task)) for env, task in zip(envs, tasks)], "reset")]
            if any(isinstance(outcome, ConnectionError) for outcome in transcript[0]):
                pytest.skip(f"needs a server: {transcript[0][0]}")
            playing = list(envs)
            for _ in range(4):
                outcomes = pool.run([(env, solver_turn, ()) for env in playing], "step")
                transcript.append(outcomes)
                done = [isinstance(outcome, tuple) and outcome[2] for outcome in outcomes]
                playing = [env for env, finished in zip(playing, done) if not finished]
            return transcript
        finally:
            for env in envs:
                pool.release(env)
            pool.close()

    sequential = play(EnvPool(env_kwargs=kwargs))
    assert not any(isinstance(outcome, Exception) for phase in sequential for outcome in phase), sequential
    if name in ("textworld", "alfworld"):
        from textworld.logic import GameLogic

        GameLogic.parse.cache_clear()
    assert play(EnvPool(env_kwargs=kwargs, num_workers=4, step_timeout=300.0)) == sequential


def test_trl_agents_eval_runs_environments_on_the_chosen_backend(tiny_model_dir):
    from trl_agents.cli import evaluate

    argv = ["--model_name_or_path", tiny_model_dir, "--env_name", "sokoban", "--num_eval_tasks", "3",
            "--max_turns", "2", "--max_new_tokens", "4"]
    in_workers = evaluate([*argv, "--env_backend", "process", "--env_step_timeout", "30"])
    assert in_workers == evaluate(argv) and in_workers["failed_episodes"] == 0
    assert not multiprocessing.active_children()  # eval stopped its workers
    with pytest.raises(ValueError, match="env_backend must be one of"):
        evaluate([*argv, "--env_backend", "processes"])


def test_a_long_phase_without_a_timeout_is_reported_with_the_option_to_set(caplog):
    import logging

    from trl_agents.rollout.env_pool import call_method

    def slow_step(env, action):
        time.sleep(0.6)
        return env.step(action)

    pool = EnvPool(default_env="frozenlake", backend="thread", hang_warning=0.2)
    env = pool.acquire({"seed": 0})
    pool.run([(env, call_method, ("reset", {"seed": 0}))], "reset")
    with caplog.at_level(logging.WARNING, logger="trl_agents.rollout.env_pool"):
        [outcome] = pool.run([(env, slow_step, ("right",))], "step")
        pool.run([(env, call_method, ("step", "right"))], "step")  # quick: no second warning
    pool.close()
    assert not isinstance(outcome, BaseException)  # a warning only: the call still completes
    [record] = [r for r in caplog.records if "running for" in r.getMessage()]
    assert "frozenlake" in record.getMessage() and "set env_step_timeout" in record.getMessage()


def test_groups_shrunk_to_one_episode_are_not_trained_unless_asked():
    from helpers import group_credit

    from trl_agents.training.credit_phase import trainable_groups
    from trl_agents.trajectory import Group, Step, Trajectory

    def episode(reward, error=None):
        return Trajectory({"seed": 0}, [Step("s", "a", reward=reward, done=True)], success=reward > 0, error=error)

    shrunk = Group({"seed": 0}, [episode(10.0), episode(0.0, error="step timed out after 2 s")])
    whole = Group({"seed": 1}, [episode(10.0), episode(0.0)])
    kept, dropped = trainable_groups([shrunk, whole], 2)
    assert dropped == 1 and [len(g.trajectories) for g in kept] == [0, 2]
    # min_healthy_episodes=1 restores verl-agent's rule: the lone episode (mean 0, std 1) trains with its raw return
    kept, dropped = trainable_groups([shrunk, whole], 1)
    assert dropped == 0 and group_credit("gigpo", kept[0])[0][0] == pytest.approx(10.0)
