"""Rollout topologies: the independent topology reproduces the pre-topology engine row for row; adaptive groups grow
until they carry signal; branching forks from snapshots share their prefix (generated and recorded once)."""

from __future__ import annotations

import itertools
import json
import os

import pytest

from trl_agents.envs import get_env_class, make_env, register_env
from trl_agents.records import TrajectoryWriter
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.training.rows import build_rows
from trl_agents.rollout.topologies import AdaptiveTopology, BranchingTopology, Fork, Launch, Topology, get_topology
from trl_agents.trajectory import RolloutBatch

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "data", "independent_rollout_rows.json")
ACTIONS = ["up", "down", "left", "right", "jump", "<action>right</action>", "search[red]"]
# Signals that the engine before the topology refactor recorded in `Step.info` and now records in `Step.signals`.
OLD_SIGNAL_NAMES = {"solver_value": "solver_value", "verify": "verifier_atoms"}


def golden_policy(prompt_ids, call, row, batch_size):
    """The deterministic policy the golden rows were recorded with."""
    return ACTIONS[(sum(prompt_ids) + 3 * row + call) % len(ACTIONS)]


def _expected_row(row: dict) -> tuple[dict, dict]:
    """A golden row with the keys that moved from info to signals taken out, and the signals they make."""
    info = json.loads(row["info"])
    signals = {}
    if "solver_value" in info:
        signals["solver_value"] = [info.pop("solver_value"), info.pop("solver_value_next")]
    if "verifier_atoms" in info:
        signals["verifier_atoms"] = info.pop("verifier_atoms")
    return {**row, "info": json.dumps(info, sort_keys=True)}, signals


@pytest.mark.parametrize("scenario", ["frozenlake_step", "sokoban_conversation", "frozenlake_solver",
                                      "searchqa_verify"])
def test_independent_topology_reproduces_the_recorded_rows(scenario, tokenizer, scripted):
    golden = json.load(open(GOLDEN))[scenario]
    settings = golden["settings"]
    generator = scripted(golden_policy)
    engine = RolloutEngine(
        generator, PromptRenderer(tokenizer, history_length=settings["history"]), max_turns=settings["max_turns"],
        sampling=SamplingParams(max_new_tokens=8), row_format=settings["row_format"],
        signals=[OLD_SIGNAL_NAMES[name] for name in settings["signals"]],
    )
    batch = engine.run(settings["tasks"], num_generations=settings["G"])
    assert [len(call) for call in generator.calls] == golden["generator_calls"]
    rows = batch.to_rows()
    assert len(rows) == len(golden["to_rows"])
    for row, old in zip(rows, golden["to_rows"], strict=True):
        expected, signals = _expected_row(old)
        assert {k: row[k] for k in expected} == expected
        # The columns trees and signals added are neutral for independent episodes.
        assert (row["branch_id"], row["parent_id"], row["fork_step"]) == (None, None, 0)
        assert json.loads(row["signals"]) == signals
    writer = TrajectoryWriter("/nonexistent", run_info={"run_id": "golden", "config_hash": "0" * 16,
                                                        "method": "grpo", "env": None})
    advantages = {(g, t.episode_id): [0.25 * i for i in range(t.num_steps)]
                  for g, group in enumerate(batch.groups) for t in group.trajectories}
    records = writer.rows(batch, advantages, rollout=0, global_step=0)
    for row, old in zip(records, golden["records"], strict=True):
        expected, _ = _expected_row(old)
        assert {k: row[k] for k in expected} == expected


# ---------------------------------------------------------------- adaptive groups


@register_env
class SeededOutcome(get_env_class("test-keyword")):  # one turn; success iff the reply contains "a"
    name = "test-seeded-outcome"

    def reset(self, task):
        self.turn, self.seed, self.length = 0, task["seed"], 1
        return f"Round 0 of task {task['seed']}."


def adaptive_engine(tokenizer, scripted, policy, max_group_size, round_size=None):
    generator = scripted(policy)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=0), max_turns=1,
                           sampling=SamplingParams(4),
                           topology=AdaptiveTopology(max_group_size=max_group_size, round_size=round_size))
    return engine, generator


def test_adaptive_groups_grow_until_they_carry_signal_or_hit_the_cap(tokenizer, scripted):
    # Task 0 succeeds on the 5th episode it plays, task 1 never does, task 2 mixes at once. The episode counter per
    # task comes from how many times its prompt was answered.
    answered: dict[str, int] = {}

    def policy(prompt_ids, call, row, size):
        key = tokenizer.decode(prompt_ids).rsplit("task ", 1)[1].split(".")[0]
        answered[key] = answered.get(key, 0) + 1
        if key == "0":
            return "a" if answered[key] == 5 else "b"
        if key == "2":
            return "a" if answered[key] == 1 else "b"
        return "b"

    engine, generator = adaptive_engine(tokenizer, scripted, policy, max_group_size=8, round_size=2)
    tasks = [{"env": "test-seeded-outcome", "seed": s} for s in range(3)]
    batch = engine.run(tasks, num_generations=2)
    sizes = [len(g.trajectories) for g in batch.groups]
    # Task 0: rounds of 2 -> 2 (no), 4 (no), 6 (the 5th episode succeeds: mixed). Task 1: capped at 8. Task 2: 2.
    assert sizes == [6, 8, 2]
    assert [[t.success for t in g.trajectories].count(True) for g in batch.groups] == [1, 0, 1]
    assert [t.episode_id for t in batch.groups[0].trajectories] == [0, 1, 2, 3, 4, 5]
    # One generation call per turn for every active episode of every task. Rounds: 1: 2 + 2 + 2 = 6 (task 2 mixes);
    # 2: tasks 0 and 1, 2 + 2 = 4; 3: the same 4 (task 0's 5th episode succeeds); 4: task 1 alone, 2 (cap 8).
    assert [len(call) for call in generator.calls] == [6, 4, 4, 2]
    stats = batch.stats
    assert stats["episodes"] == 16 and stats["topology/mean_episodes_per_task"] == pytest.approx(16 / 3)
    assert stats["topology/max_episodes_per_task"] == 8 and stats["topology/rounds"] == 4
    assert stats["topology/signal_fraction"] == pytest.approx(2 / 3)
    assert stats["topology/capped_without_signal_fraction"] == pytest.approx(1 / 3)


@register_env
class FlakyOutcome(SeededOutcome):
    """Fails at reset on its 2nd and 3rd episodes of every task (an infrastructure failure)."""

    name = "test-flaky-outcome"
    resets: dict[int, int] = {}

    def reset(self, task):
        count = FlakyOutcome.resets[task["seed"]] = FlakyOutcome.resets.get(task["seed"], 0) + 1
        if count in (2, 3):
            raise ConnectionError("simulator unreachable")
        return super().reset(task)


def test_failed_episodes_count_towards_the_cap_but_never_towards_the_signal(tokenizer, scripted):
    # Round 1: episode 0 says "a" (success), episode 1 fails at reset: one healthy episode carries no signal.
    # Round 2: episode 2 fails too, episode 3 says "b": now [success, failure] among the healthy ones.
    FlakyOutcome.resets = {}
    replies = iter(["a", "b", "b", "b"])
    engine, _ = adaptive_engine(tokenizer, scripted, lambda *a: next(replies), max_group_size=6)
    batch = engine.run([{"env": "test-flaky-outcome", "seed": 0}], num_generations=2)
    group = batch.groups[0]
    assert [t.failed for t in group.trajectories] == [False, True, True, False]
    assert [t.success for t in group.healthy().trajectories] == [True, False]
    assert batch.stats["topology/failed_episode_fraction"] == 0.5


def test_adaptive_arguments_are_checked():
    with pytest.raises(ValueError, match="max_group_size"):
        AdaptiveTopology(max_group_size=0)
    with pytest.raises(ValueError, match="more than max_group_size"):
        AdaptiveTopology(max_group_size=2).begin([{}], num_generations=4)
    with pytest.raises(ValueError, match="Unknown topology 'adaptiv'. Did you mean 'adaptive'"):
        get_topology("adaptiv")


# ---------------------------------------------------------------- branching from snapshots


@pytest.mark.parametrize("env_name, task, actions", [
    ("frozenlake", {"seed": 3}, ["right", "down", "down", "right"]),
    ("sokoban", {"seed": 5}, ["up", "left", "down", "right"]),
    ("minesweeper", {"seed": 1}, ["reveal 0 0", "flag 1 1", "reveal 2 2", "reveal 3 0"]),
    ("rushhour", {"seed": 2}, ["A+1", "B-1", "X+1", "C+1"]),
    ("textcraft", {"seed": 0}, ["inventory", "get 1 oak log", "craft 4 oak planks using 1 oak log", "look"]),
])
def test_restore_and_the_backbones_own_action_reproduce_its_next_observation(env_name, task, actions):
    env, copy = make_env(env_name), make_env(env_name)
    env.reset({"env": env_name, **task})
    snapshots, observations = [], []
    for action in actions:
        snapshots.append(env.snapshot())
        observations.append(env.step(action)[0])
    copy.reset({"env": env_name, **task})
    for snapshot, action, observation in zip(snapshots, actions, observations, strict=True):
        copy.restore(snapshot)
        assert copy.step(action)[0] == observation  # byte for byte


def entropy_stub(scores):
    """A stand-in for the model's entropy signal: step t of a backbone gets per-token entropies `scores[t]`."""

    def compute(name, trajectories):
        assert name == "entropy"
        for trajectory in trajectories:
            for index, step in enumerate(trajectory.steps):
                step.signals["entropy"] = [scores[index]] * len(step.action_ids)

    return compute


def branching_engine(tokenizer, scripted, policy, scores, branch_points=1, branch_factor=3, row_format="step"):
    generator = scripted(policy)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=1), max_turns=4,
                           sampling=SamplingParams(4), row_format=row_format,
                           topology=BranchingTopology(branch_points=branch_points, branch_factor=branch_factor),
                           signal_fn=entropy_stub(scores))
    return engine, generator


def test_forks_share_the_prefix_generated_once(tokenizer, scripted):
    # FrozenLake seed 3, 4 turns. Backbones answer "down" every turn; at the branch point (step 2: the highest
    # entropy of [0.1, 0.2, 0.9, 0.3]) each fork answers "right" from then on.
    def policy(prompt_ids, call, row, size):
        return "down" if call < 4 else "right"

    engine, generator = branching_engine(tokenizer, scripted, policy, scores=[0.1, 0.2, 0.9, 0.3])
    batch = engine.run([{"env": "frozenlake", "seed": 3}], num_generations=2)
    group = batch.groups[0]
    assert [(t.episode_id, t.parent_id, t.fork_step) for t in group.trajectories] == [
        (0, None, 0), (1, None, 0), (2, 0, 2), (3, 0, 2), (4, 1, 2), (5, 1, 2)]
    backbone, fork = group.trajectories[0], group.trajectories[2]
    assert fork.steps[0] is backbone.steps[0] and fork.steps[1] is backbone.steps[1]  # the same Step objects
    assert fork.steps[2] is not backbone.steps[2] and fork.steps[2].observation == backbone.steps[2].observation
    assert fork.steps[2].prompt_ids == backbone.steps[2].prompt_ids  # restored: the same state, the same prompt
    # Generation: 4 backbone turns (2 episodes each), then 2 turns for the 4 forks (steps 2 and 3): one call per turn.
    assert [len(call) for call in generator.calls] == [2, 2, 2, 2, 4, 4]
    tokens = sum(len(step.action_ids) for t in group.trajectories for step in t.owned_steps)
    assert batch.stats["generated_tokens"] == tokens and batch.stats["env_steps"] == 16  # 2·4 + 4·2, no prefix
    assert batch.stats["topology/leaves_per_task"] == 6 and batch.stats["topology/branch_points_per_task"] == 2

    # Rows: every step once (8 backbone steps + 4·2 fork steps); a shared step gets the sum of its paths' values.
    advantages = [[[1.0] * t.num_steps for t in group.trajectories]]
    rows = build_rows(batch.groups, advantages, "step")
    assert len(rows) == 16
    assert rows.advantages[0] == [3.0] * len(backbone.steps[0].action_ids)  # backbone 0 + its 2 forks
    assert rows.advantages[2] == [1.0] * len(backbone.steps[2].action_ids)  # owned by the backbone alone

    # Records: each step once, with the tree's links; from_rows rebuilds the shared prefix.
    records = batch.to_rows()
    assert len(records) == 16
    assert [(r["branch_id"], r["parent_id"], r["fork_step"], r["step"]) for r in records if r["episode_id"] == 2] == [
        ("2", "0", 2, 2), ("2", "0", 2, 3)]
    rebuilt = RolloutBatch.from_rows(records).groups[0]
    assert [len(t.steps) for t in rebuilt.trajectories] == [4, 4, 4, 4, 4, 4]
    assert rebuilt.trajectories[2].steps[0] is rebuilt.trajectories[0].steps[0]


def test_conversation_forks_continue_the_parents_conversation(tokenizer, scripted):
    engine, _ = branching_engine(tokenizer, scripted, lambda prompt, call, row, size: "down", scores=[0, 1, 0, 0],
                                 row_format="conversation", branch_factor=2)
    group = engine.run([{"env": "frozenlake", "seed": 3}], num_generations=1).groups[0]
    backbone, fork = group.trajectories
    assert fork.fork_step == 1 and fork.steps[1].prompt_ids == backbone.steps[1].prompt_ids
    rows = build_rows([group], [[[0.5] * 4, [0.25] * 4]], "conversation")
    assert rows.prompt_ids[1] == backbone.steps[1].prompt_ids  # the fork's row starts at its fork
    assert rows.advantages[0][: len(backbone.steps[0].action_ids)] == [0.75] * len(backbone.steps[0].action_ids)


def test_branch_points_are_the_highest_scores_earliest_first(tokenizer, scripted):
    topology = BranchingTopology(branch_points=2, branch_factor=2)
    batch = RolloutBatch.from_rows(json.load(open(GOLDEN))["frozenlake_step"]["to_rows"])
    backbone = batch.groups[0].trajectories[0]
    for step in backbone.steps:
        step.snapshot = "s"
    entropy_stub([0.5, 0.9, 0.5, 0.9, 0.1, 0.2])("entropy", [backbone])
    assert topology.branch_steps(backbone) == [1, 3]  # ties at 0.9: both; then order by step
    backbone.steps[3].snapshot = None  # no snapshot, no branch: the next best (0.5 at step 0 before step 2)
    assert topology.branch_steps(backbone) == [0, 1]
    assert BranchingTopology(score="random").model_signals == ()
    with pytest.raises(ValueError, match="branch_factor must be an integer >= 2"):
        BranchingTopology(branch_factor=1)


class OneFork(Topology):
    """One episode of task 0, then, once it is done, the one fork `fork(view)` asks for."""

    name = "one-fork"

    def __init__(self, fork, needs_snapshots=True):
        self.fork, self.needs_snapshots = fork, needs_snapshots

    def begin(self, tasks, num_generations):
        self.done = False
        return [Launch(0, 1)]

    def when_idle(self, view):
        if self.done:
            return []
        self.done = True
        return [self.fork(view)]


def test_branching_without_snapshots_is_refused(tokenizer, scripted):
    careless = OneFork(lambda view: Fork(0, 0, 0, 1), needs_snapshots=False)  # forks without asking for snapshots
    engine = RolloutEngine(scripted(lambda *a: "down"), PromptRenderer(tokenizer), max_turns=2,
                           sampling=SamplingParams(4), topology=careless)
    with pytest.raises(ValueError, match="no environment snapshot"):
        engine.run([{"env": "frozenlake", "seed": 3}], num_generations=1)


def test_a_token_prefix_fork_continues_the_parents_action(tokenizer, scripted):
    # APPO-style token branching: fork at step 0 keeping the first token of the parent's action.
    token_fork = OneFork(lambda view: Fork(0, 0, 0, 1, action_prefix=tuple(
        view.groups[0].trajectories[0].steps[0].action_ids[:1])))
    generator = scripted(lambda prompt, call, row, size: "down" if call == 0 else "ight")
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=0), max_turns=1,
                           sampling=SamplingParams(4), topology=token_fork)
    group = engine.run([{"env": "frozenlake", "seed": 3}], num_generations=1).groups[0]
    parent, child = group.trajectories
    prefix = parent.steps[0].action_ids[:1]
    assert generator.calls[1][0] == parent.steps[0].prompt_ids + prefix  # prompt = context + kept prefix tokens
    assert child.steps[0].prompt_ids == parent.steps[0].prompt_ids and child.fork_step == 0
    assert child.steps[0].action_ids[:1] == prefix
    assert child.steps[0].action_logprobs[0] == parent.steps[0].action_logprobs[0]  # copied, not re-sampled


def test_a_role_routing_generator_receives_each_prompts_role(tokenizer, scripted):
    seen = []

    class Routed:
        routes_by_role = True

        def __init__(self):
            self.inner = scripted(lambda *a: "I accept.")
            self.eos_token_ids = self.inner.eos_token_ids

        def generate(self, prompts, sampling, roles):
            seen.append(list(roles))
            return self.inner.generate(prompts, sampling)

    engine = RolloutEngine(Routed(), PromptRenderer(tokenizer), max_turns=2, sampling=SamplingParams(8))
    engine.run([{"env": "dealnodeal", "seed": 0}], num_generations=2)
    env = make_env("dealnodeal")
    assert seen and seen[0] == [env.roles[0]] * 2 and set(seen[1]) <= set(env.roles)


def test_a_topology_missing_its_options_is_a_one_line_config_error(tiny_model, tokenizer, tmp_path):
    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.testing import tiny_training_config

    config = tiny_training_config(AgentGRPOConfig, tmp_path, topology="adaptive")
    with pytest.raises(ValueError, match=r"topology='adaptive' cannot be built from topology_kwargs=\{\}.*max_group_size"):
        AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=[{"env": "test-keyword", "seed": 0}],
                         processing_class=tokenizer)
    config = tiny_training_config(AgentGRPOConfig, tmp_path, topology="branching")
    with pytest.raises(ValueError, match="lacks snapshot"):  # the topology's capability, checked at start-up
        AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=[{"env": "test-keyword", "seed": 0}],
                         processing_class=tokenizer)
    # GRPO's credit treats every path as its own episode: on a tree it would count shared steps once per path.
    with pytest.raises(ValueError, match="not written for trees.*BPOTrainer"):
        AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=[{"env": "frozenlake", "seed": 0}],
                         processing_class=tokenizer)
    config = tiny_training_config(AgentGRPOConfig, tmp_path, topology="branching",
                                  topology_kwargs={"branch_factor": "4"})
    with pytest.raises(ValueError, match="cannot be built from topology_kwargs.*branch_factor must be an integer"):
        AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=[{"env": "frozenlake", "seed": 0}],
                         processing_class=tokenizer)


def test_a_failed_parents_shared_steps_are_trained_by_its_child(tokenizer, scripted):
    # A parent that fails after its child forked (e.g. from an after_turn fork) leaves the healthy groups; the child
    # then trains the shared steps it still needs, with its own values.
    engine, _ = branching_engine(tokenizer, scripted, lambda prompt, call, row, size: "down", scores=[0, 1, 0, 0],
                                 branch_factor=2)
    group = engine.run([{"env": "frozenlake", "seed": 3}], num_generations=1).groups[0]
    parent, child = group.trajectories
    parent.error = "worker died"
    healthy = group.healthy()
    rows = build_rows([healthy], [[[0.5] * child.num_steps]], "step")
    assert len(rows) == child.num_steps and rows.prompt_ids[0] == parent.steps[0].prompt_ids
    assert all(values == [0.5] * len(values) for values in rows.advantages)


def test_random_branch_points_change_from_one_rollout_to_the_next():
    topology = BranchingTopology(branch_points=1, branch_factor=2, score="random", seed=0)
    backbone = RolloutBatch.from_rows(json.load(open(GOLDEN))["frozenlake_step"]["to_rows"]).groups[0].trajectories[0]
    for step in backbone.steps:
        step.snapshot = "s"
    chosen = []
    for _ in range(6):  # the trainer reuses one topology: begin() starts a rollout, the generator carries on
        topology.begin([{}], 1)
        chosen.append(topology.branch_steps(backbone)[0])
    assert len(set(chosen)) > 1


def test_each_step_records_the_observation_that_followed_it(tokenizer, scripted):
    # o_{t+1} of a transition (s_t, a_t, o_{t+1}): the next step's observation while the episode goes on, the
    # terminal observation after its last step; it survives the rows round trip.
    golden = json.load(open(GOLDEN))["frozenlake_step"]
    settings = golden["settings"]
    engine = RolloutEngine(
        scripted(golden_policy), PromptRenderer(tokenizer, history_length=settings["history"]),
        max_turns=settings["max_turns"], sampling=SamplingParams(max_new_tokens=8), row_format=settings["row_format"],
    )
    batch = engine.run(settings["tasks"], num_generations=settings["G"])
    for trajectory in batch.trajectories:
        steps = trajectory.steps
        assert steps and all(isinstance(step.next_observation, str) for step in steps)
        for step, following in itertools.pairwise(steps):
            assert step.next_observation == following.observation
    rebuilt = RolloutBatch.from_rows(batch.to_rows())
    assert [s.next_observation for t in rebuilt.trajectories for s in t.steps] == [
        s.next_observation for t in batch.trajectories for s in t.steps]


def test_a_launch_and_a_fork_of_one_task_in_one_answer(tokenizer, scripted):
    # when_idle asks at once for a new root (Launch) and a fork from step 1 of episode 0 of the same task. The fork
    # moves along "right" from the restored state, so its first observation differs from the roots': the check that
    # a task's roots start alike must not count it as a root (it once did, and refused the request).
    class RootAndFork(Topology):
        name = ""  # (a test topology: not registered)
        needs_snapshots = True

        def begin(self, tasks, num_generations):
            self.asked = False
            return [Launch(0, num_generations)]

        def when_idle(self, view):
            if self.asked:
                return []
            self.asked = True
            return [Launch(0, 1), Fork(0, 0, 1, 1)]

    generator = scripted(lambda prompt_ids, call, row, size: "down" if call < 3 else "right")
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=1), max_turns=3,
                           sampling=SamplingParams(4), topology=RootAndFork())
    group = engine.run([{"env": "frozenlake", "seed": 3}], num_generations=1).groups[0]
    assert [(t.episode_id, t.parent_id, t.fork_step) for t in group.trajectories] == [(0, None, 0), (1, None, 0),
                                                                                       (2, 0, 1)]
    assert group.trajectories[2].steps[0] is group.trajectories[0].steps[0] and not group.trajectories[2].failed
