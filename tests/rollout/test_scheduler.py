"""Per-episode scheduling (`rollout/scheduler.py`): the same rollout as lockstep, with episodes that do not wait for
each other.

The content checks use `SeededScriptGenerator` (its answer depends only on the prompt and the request seed: batch
invariant) and `LatencyEnv`, whose keyed step latencies make episodes finish in an order that differs from the
episode order, so a schedule that leaked arrival order into the content would show it.
"""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.env_pool import EnvPool, EnvTimeoutError
from trl_agents.rollout.scheduler import CallCost
from trl_agents.rollout.topologies import IndependentTopology, Launch, Topology
from trl_agents.testing import SeededScriptGenerator

ACTIONS = ["```up```", "```down```", "```left```", "```right```"]


def rows_hash(batch) -> str:
    """sha256 of the content of a rollout's rows: prompt ids, action ids, sampling log-probs, rewards, observations,
    in (task, episode, step) order."""
    digest = hashlib.sha256()
    for row in batch.to_rows():
        digest.update(json.dumps([row["task"], row["episode_id"], row["step"], row["prompt_ids"], row["action_ids"],
                                  row["action_logprobs"], row["reward"], row["observation"]], default=str).encode())
    return digest.hexdigest()


def play(tokenizer, schedule, *, tasks=4, group=4, median=0.005, generator=None, topology=None, workers=16,
         backend="thread", inner="test-countdown", max_turns=4, **engine_kwargs):
    generator = generator or SeededScriptGenerator(tokenizer, ACTIONS)
    pool = EnvPool(env_kwargs={"inner": inner, "median": median, "sigma": 1.0, "low": 0.0005, "high": 0.05},
                   backend=backend, num_workers=workers)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer), max_turns=max_turns,
                           sampling=SamplingParams(max_new_tokens=8), env_pool=pool, schedule=schedule,
                           topology=topology, deterministic_sampling=True, **engine_kwargs)
    try:
        rows = [{"env": "test-latency", "seed": seed, "turns": 3 + seed % 3} for seed in range(tasks)]
        return engine.run(rows, group), engine
    finally:
        pool.close()


@pytest.mark.parametrize("schedule", ["task", "free"])
def test_per_episode_schedules_give_lockstep_rows(tokenizer, schedule):
    lockstep, _ = play(tokenizer, "lockstep")
    batch, engine = play(tokenizer, schedule)
    assert engine.effective_schedule == schedule
    assert rows_hash(batch) == rows_hash(lockstep)
    for key in ("generated_tokens", "env_steps", "episodes"):  # content stats are equal; schedule stats may not be
        assert batch.stats[key] == lockstep.stats[key]
    assert lockstep.stats["env_steps"] == sum(min(3 + seed % 3, 4) for seed in range(4)) * 4  # (max_turns 4)
    assert batch.stats["scheduler_seconds"] >= 0.0


def test_request_level_generators_get_one_request_per_turn_and_the_same_rows(tokenizer):
    lockstep, _ = play(tokenizer, "lockstep")
    generator = SeededScriptGenerator(tokenizer, ACTIONS, request_level=True)
    batch, _ = play(tokenizer, "free", generator=generator)
    assert rows_hash(batch) == rows_hash(lockstep)
    assert generator.calls == [1] * int(batch.stats["env_steps"])  # every turn its own request, no batch call
    assert batch.stats["generation_calls"] == batch.stats["env_steps"]


def test_rows_come_in_task_episode_step_order_whatever_order_the_steps_finished_in(tokenizer, monkeypatch):
    applied = []
    record = RolloutEngine._record

    def spy(self, turn, *args):
        applied.append((turn.episode.task_index, turn.episode.trajectory.episode_id, len(turn.episode.trajectory.steps)))
        return record(self, turn, *args)

    monkeypatch.setattr(RolloutEngine, "_record", spy)
    batch, _ = play(tokenizer, "free", median=0.01)
    assert applied != sorted(applied)  # steps finished out of order (the latencies are keyed, so this is fixed)
    order = [(json.loads(row["task"])["seed"], row["episode_id"], row["step"]) for row in batch.to_rows()]
    assert order == sorted(order) and len(order) == len(applied)
    for group in batch.groups:
        assert [t.episode_id for t in group.trajectories] == list(range(len(group.trajectories)))


def test_episodes_overlap_their_environment_calls(tokenizer):
    """Lockstep waits for the slowest step of every turn; free scheduling only for each episode's own steps. With
    a constant latency and no tail there is nothing to win; with a long tail the free rollout is faster."""
    started = time.perf_counter()
    play(tokenizer, "lockstep", median=0.02, tasks=4, group=4)
    lockstep = time.perf_counter() - started
    started = time.perf_counter()
    play(tokenizer, "free", median=0.02, tasks=4, group=4)
    free = time.perf_counter() - started
    # Not a timing assertion on the machine's speed: the same sleeps, lockstep pays the max per turn. The bound is
    # loose (the benchmark measures the ratio); it fails only if free scheduling serialised the episodes.
    assert free < lockstep * 1.5


def test_a_hung_environment_fails_its_episode_within_the_timeout_and_the_others_finish(tokenizer, tmp_path):
    generator = SeededScriptGenerator(tokenizer, ["a"])
    pool = EnvPool(backend="thread", num_workers=8, step_timeout=1.0)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer), max_turns=3, env_pool=pool, schedule="free")
    tasks = [{"env": "test-faulty", "seed": seed, "fault": "hang", "marker": str(tmp_path / f"m{seed}")}
             for seed in range(2)]
    started = time.perf_counter()
    batch = engine.run(tasks, 3)
    assert time.perf_counter() - started < 30
    failed = [t for t in batch.trajectories if t.failed]
    assert len(failed) == 2 and all("timed out after 1 s" in t.error for t in failed)
    assert all(t.num_steps == 3 and t.success for t in batch.trajectories if not t.failed)
    pool.close()


@pytest.mark.slow
def test_a_killed_worker_fails_its_episode_and_the_others_finish(tokenizer, tmp_path):
    generator = SeededScriptGenerator(tokenizer, ["a"])
    pool = EnvPool(backend="process", step_timeout=30.0)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer), max_turns=3, env_pool=pool, schedule="free")
    tasks = [{"env": "test-faulty", "seed": 0, "fault": "exit", "marker": str(tmp_path / "m")}]
    batch = engine.run(tasks, 3)
    failed = [t for t in batch.trajectories if t.failed]
    assert len(failed) == 1 and "exit code 7" in failed[0].error
    assert sum(t.success for t in batch.trajectories) == 2
    pool.close()


class RaisingGenerator(SeededScriptGenerator):
    def generate(self, prompts, sampling, seeds=None, roles=None):
        if len(self.calls) >= 2:
            raise RuntimeError("the model server went away")
        return super().generate(prompts, sampling, seeds, roles)


@pytest.mark.parametrize("request_level", [False, True])
def test_a_raising_generator_raises_from_the_rollout_with_its_message(tokenizer, request_level):
    generator = RaisingGenerator(tokenizer, ACTIONS, request_level=request_level)
    with pytest.raises(RuntimeError, match="the model server went away"):
        play(tokenizer, "free", generator=generator)


def test_the_same_seeds_give_the_same_rollout_and_another_rollout_index_another(tokenizer):
    first, _ = play(tokenizer, "free")
    again, _ = play(tokenizer, "free")
    assert rows_hash(first) == rows_hash(again)
    other, _ = play(tokenizer, "free", seed=1)
    assert rows_hash(other) != rows_hash(first)


def test_deterministic_sampling_needs_a_generator_that_takes_seeds(tokenizer):
    class Plain:
        def generate(self, prompts, sampling):
            raise AssertionError("not called")

    with pytest.raises(ValueError, match="per_request_seeds"):
        RolloutEngine(Plain(), PromptRenderer(tokenizer), deterministic_sampling=True)
    assert not RolloutEngine(Plain(), PromptRenderer(tokenizer), schedule="free").deterministic_sampling
    with pytest.raises(ValueError, match="schedule"):
        RolloutEngine(Plain(), PromptRenderer(tokenizer), schedule="async")


class Undeclared(Topology):
    name = "undeclared"

    def begin(self, tasks, num_generations):
        return [Launch(index, num_generations) for index in range(len(tasks))]


def test_a_topology_that_declares_no_class_runs_in_lockstep(tokenizer):
    assert Undeclared.schedule == "global"
    batch, engine = play(tokenizer, "free", topology=Undeclared())
    assert engine.effective_schedule == "global" and "scheduler_seconds" not in batch.stats
    assert IndependentTopology.schedule == "free"


class TaskBarrier(Topology):
    """A `task` topology that records, at each of its barriers, how many steps every active episode has played."""

    name = "barrier-probe"
    schedule = "task"

    def begin(self, tasks, num_generations):
        self.seen = []
        return [Launch(index, num_generations) for index in range(len(tasks))]

    def after_turn(self, view, task_index=None):
        for index in view.task_indices(task_index):
            self.seen.append((index, sorted({t.num_steps for t in view.groups[index].trajectories
                                              if view.is_active(t)})))
        return []


def test_the_task_class_keeps_a_turn_barrier_per_task(tokenizer):
    topology = TaskBarrier()
    play(tokenizer, "free", topology=topology, median=0.01)
    assert topology.seen and all(len(counts) <= 1 for _, counts in topology.seen)  # the task's actives: in step
    per_task = {}
    for index, counts in topology.seen:
        per_task.setdefault(index, []).append(counts)
    assert len(per_task) == 4  # every task reached its barriers, each on its own


def test_the_generation_window_trades_calls_for_waiting(tokenizer):
    """Window 0 launches whatever is pending as soon as the model is free (many small calls); an infinite window
    launches only when no environment call is in flight, like lockstep's one call per turn."""
    greedy = SeededScriptGenerator(tokenizer, ACTIONS, call_seconds=0.002)
    play(tokenizer, "free", generator=greedy, generation_window=0.0, median=0.01)
    patient = SeededScriptGenerator(tokenizer, ACTIONS, call_seconds=0.002)
    play(tokenizer, "free", generator=patient, generation_window=1e9, median=0.01)
    assert sum(greedy.calls) == sum(patient.calls)
    assert len(patient.calls) < len(greedy.calls)


def test_call_cost_estimates_the_fixed_cost_of_a_call():
    cost = CallCost()
    assert cost.fixed == 0.0 and not cost.measured
    cost.add(8, 1600, 0.46)  # calls of 8 prompts costing 0.3 s + 0.1 ms per token position, prompts growing
    assert cost.fixed == 0.46  # one size seen: the shortest call, an upper bound
    for work in (800, 3200, 400):
        cost.add(8, work, 0.3 + 0.0001 * work)
    assert cost.fixed == pytest.approx(0.3)  # the line against token positions fits exactly (and is the lower)
    cost.add(1, 100, 0.2)  # a call faster than the fit says: the estimate never exceeds the shortest recent call
    assert cost.fixed <= 0.2
    per_prompt = CallCost()  # a server costing 20 ms + 2 ms per prompt, whatever the prompts' lengths
    for size, width in ((64, 100), (40, 300), (8, 500), (20, 200)):
        per_prompt.add(size, size * width, 0.02 + 0.002 * size)
    assert per_prompt.fixed == pytest.approx(0.02)  # the line against prompts fits exactly (and is the lower)
    steep = CallCost()  # costs growing faster than linearly: a negative intercept is clamped to 0 (launch greedily)
    for size in (10, 20, 40):
        steep.add(size, size * 100, (size / 10) ** 2)
    assert steep.fixed == 0.0


# ---- EnvPool.submit --------------------------------------------------------------------------------------------------


def slow(env, seconds):
    time.sleep(seconds)
    return seconds


def test_submit_runs_at_most_num_workers_calls_at_once_off_the_calling_thread():
    pool = EnvPool(default_env="frozenlake", num_workers=2)
    envs = [pool.acquire({}) for _ in range(4)]
    started = time.perf_counter()
    futures = [pool.submit(env, slow, (0.2,), "step") for env in envs]
    assert time.perf_counter() - started < 0.1  # returned at once
    assert [future.result() for future in futures] == [0.2] * 4
    assert 0.35 < time.perf_counter() - started < 2.0  # two at a time: two rounds of 0.2 s
    pool.close()


def test_a_submitted_call_past_its_timeout_is_an_outcome_and_its_env_is_never_reused():
    pool = EnvPool(default_env="frozenlake", num_workers=2, step_timeout=0.3)
    env = pool.acquire({})
    outcome = pool.submit(env, slow, (5.0,), "step").result(timeout=3.0)
    assert isinstance(outcome, EnvTimeoutError) and "step timed out after 0.3 s" in str(outcome)
    pool.release(env)
    assert pool.acquire({}) is not env
    assert pool.submit(pool.acquire({}), slow, (0.01,), "step").result(timeout=3.0) == 0.01  # a fresh thread serves
    pool.close()


@pytest.mark.slow
def test_submit_on_the_process_backend_runs_every_environment_at_once():
    pool = EnvPool(default_env="frozenlake", backend="process", step_timeout=10.0)
    envs = [pool.acquire({}) for _ in range(3)]
    for env in envs:  # started: the workers have built their environments
        assert env.reset({"seed": 0})
    started = time.perf_counter()
    futures = [pool.submit(env, slow, (0.5,), "step") for env in envs]
    assert [future.result() for future in futures] == [0.5] * 3
    assert time.perf_counter() - started < 1.4
    pool.close()


def test_a_sharded_policy_generating_itself_runs_in_lockstep(tokenizer):
    """Under FSDP / ZeRO-3 over several processes a forward of the policy is a collective: per-episode generation
    calls (a different number per process) would hang, so the rollout keeps lockstep; a vLLM server does not."""
    local = RolloutEngine(SeededScriptGenerator(tokenizer, ACTIONS), PromptRenderer(tokenizer), schedule="free",
                          sharded_model=True)
    assert local.effective_schedule == "global"
    served = RolloutEngine(SeededScriptGenerator(tokenizer, ACTIONS, request_level=True), PromptRenderer(tokenizer),
                           schedule="free", sharded_model=True)
    assert served.effective_schedule == "free"
