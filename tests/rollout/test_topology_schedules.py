"""Scheduling classes of the topologies (`Topology.schedule`, `topologies/base.py`): a "free" or "task" topology
answers a call about one task (`when_idle(view, i)`, and `after_turn(view, i)` for PATR) with exactly the requests
of that task that its lockstep call (`task_index=None`) gives, whatever the order in which tasks are asked, and a
task's episodes do not depend on the other tasks of the rollout. Branching's "random" score draws from a random
stream per task (the hand-worked picks are below)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from trl_agents.envs import get_env_class, register_env
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.topologies import (
    SCHEDULES,
    TOPOLOGIES,
    AdaptiveTopology,
    BranchingTopology,
    Fork,
    Launch,
    RolloutView,
    Topology,
    get_topology,
)
from trl_agents.rollout.topologies.appo import POLICY_LOGPROBS
from trl_agents.rollout.topologies.igrpo import GOLD_LIKELIHOOD, node_indices
from trl_agents.trajectory import Group, Step, Trajectory


@register_env
class SnapshotKeyword(get_env_class("test-keyword")):  # the keyword toy task, with snapshots
    name = "test-schedule-keyword"

    def snapshot(self):
        return (self.turn, self.seed, self.length)

    def restore(self, snapshot):
        self.turn, self.seed, self.length = snapshot


# ---------------------------------------------------------------- the classes


def test_schedule_of_every_topology():
    assert SCHEDULES == ("free", "task", "global")
    expected = {"independent": "free", "supervised": "free", "adaptive": "free", "branching": "free",
                "token_branching": "free", "info_gain": "free", "patr": "task", "state_score": "global"}
    assert {name: TOPOLOGIES[name].schedule for name in expected} == expected
    assert Topology.schedule == "global"

    class Undeclared(Topology):  # a third-party topology that declares nothing: lockstep
        name = ""

    assert Undeclared.schedule == "global" and Undeclared().when_idle(None) == []
    with pytest.raises(ValueError, match="schedule must be one of 'free', 'task', 'global'"):
        type("Bad", (Topology,), {"schedule": "async"})


def test_task_indices():
    view = RolloutView([{}, {}, {}], [Group(task={}) for _ in range(3)], lambda t: False, None, max_turns=2)
    assert list(view.task_indices(None)) == [0, 1, 2] and view.task_indices(1) == [1]
    for bad in (3, -1, True, "0"):
        with pytest.raises(IndexError):
            view.task_indices(bad)


# ---------------------------------------------------------------- lockstep call vs per-task calls, in a real run


class PerTask(Topology):
    """Drives `inner` under the lockstep engine. With `split`, each lockstep call is answered by asking `inner` once
    per task (`hook(view, i)`, tasks in a shuffled order; every request must concern task i); else by its lockstep
    call (`hook(view)`). `log` holds every answer as (hook, turn, {task: Counter of requests})."""

    name = ""  # a test wrapper: not registered

    def __init__(self, inner: Topology, split: bool, seed: int = 0):
        self.inner, self.split, self.order = inner, split, random.Random(seed)
        self.needs_snapshots = inner.needs_snapshots
        self.required_capabilities = inner.required_capabilities
        self.model_signals = inner.model_signals
        self.log: list[tuple[str, int, dict[int, Counter]]] = []

    def begin(self, tasks, num_generations):
        return self.inner.begin(tasks, num_generations)

    def after_turn(self, view, task_index=None):
        return self._ask("after_turn", view)

    def when_idle(self, view, task_index=None):
        return self._ask("when_idle", view)

    def stats(self, view):
        return self.inner.stats(view)

    def _ask(self, hook, view):
        method = getattr(self.inner, hook)
        if self.split:
            requests = []
            order = list(range(len(view.groups)))
            self.order.shuffle(order)
            for index in order:
                answer = method(view, index)
                assert all(request.task_index == index for request in answer), (hook, index, answer)
                requests += answer
        else:
            requests = method(view)
        per_task: dict[int, Counter] = {}
        for request in requests:
            per_task.setdefault(request.task_index, Counter())[request] += 1
        self.log.append((hook, view.turn, per_task))
        return requests


def occurrence_policy(choices):
    """A deterministic policy that does not depend on the row or call (their order differs between the two runs):
    the k-th time a prompt is seen it answers `choices[(h(prompt) + k) % len(choices)]`. Prompts of different tasks
    differ, and a task's episodes keep their relative order in every generation call, so the k-th sighting is the
    same episode in both runs."""
    seen: Counter = Counter()

    def policy(prompt_ids, call, row, size):
        key = tuple(prompt_ids)
        k = seen[key]
        seen[key] += 1
        return choices[(sum(key) * 31 + len(key) + k) % len(choices)]

    return policy


def entropy_signal(name, trajectories):
    """`entropy` for branching: per-token values from the step's prompt (deterministic, varied across steps)."""
    assert name == "entropy"
    for trajectory in trajectories:
        for step in trajectory.steps:
            step.signals["entropy"] = [((sum(step.prompt_ids) + 7 * k) % 13) / 13 for k in range(len(step.action_ids))]


def policy_logprobs_signal(name, trajectories):
    """`policy_logprobs` (and `entropy`) for token branching: varied entropies and current − sampler log-ratios."""
    assert name == POLICY_LOGPROBS
    for trajectory in trajectories:
        for step in trajectory.steps:
            base = sum(step.prompt_ids)
            step.signals["entropy"] = [((base + 5 * k) % 11) / 4 for k in range(len(step.action_ids))]
            step.signals[POLICY_LOGPROBS] = [lp + ((base + 3 * k) % 7 - 3) / 20
                                             for k, lp in enumerate(step.action_logprobs)]


def gold_signal(name, trajectories):
    """`gold_likelihood` for info_gain: a value in [0.05, 0.95] from the node step's prompt."""
    assert name == GOLD_LIKELIHOOD
    for trajectory in trajectories:
        for j in node_indices(trajectory):
            step = trajectory.steps[j]
            step.signals.setdefault(name, 0.05 + ((sum(step.prompt_ids) * 17) % 10) / 10)


def patr_scorer(trajectories):
    """q of a partial trajectory from its last prompt and length: 0.1 (low), 0.5 or 0.9 (expandable)."""
    return [(0.1, 0.5, 0.9)[(sum(t.steps[-1].prompt_ids) + len(t.steps)) % 3] for t in trajectories]


MOVES = ["down", "right", "left", "up", "down"]
FROZENLAKE = [{"env": "frozenlake", "seed": seed} for seed in (3, 4, 5)]
KEYWORD = [{"env": "test-schedule-keyword", "seed": seed, "length": 2} for seed in range(4)]
ONE_TURN = [{"env": "test-schedule-keyword", "seed": seed, "length": 1} for seed in range(4)]

# name -> (a new topology, tasks, num_generations, max_turns, policy choices, signal_fn)
SCENARIOS = {
    "adaptive": (lambda: AdaptiveTopology(max_group_size=8, round_size=2), ONE_TURN, 2, 1,
                 ["b", "b", "b", "b", "b", "a", "b"], None),
    "branching-entropy": (lambda: BranchingTopology(branch_points=2, branch_factor=2, score="entropy_mean"),
                          FROZENLAKE, 2, 4, MOVES, entropy_signal),
    "branching-random": (lambda: BranchingTopology(branch_points=2, branch_factor=3, score="random", seed=3),
                         FROZENLAKE, 2, 4, MOVES, None),
    "token_branching": (lambda: get_topology("token_branching", rollouts_per_task=5), KEYWORD, 2, 2,
                        ["a b", "ab", "b a a"], policy_logprobs_signal),
    "info_gain": (lambda: get_topology("info_gain", leaf_budget=7, expansion_factor=2, expansions_per_round=2,
                                       seed=1), FROZENLAKE, 2, 4, MOVES, gold_signal),
    "patr": (lambda: get_topology("patr", scorer=patr_scorer, budget=5, roots=1, branch_factor=2,
                                  prune_patience=2, repeat_limit=0), FROZENLAKE, 5, 5, MOVES, None),
    "independent": (lambda: get_topology("independent"), KEYWORD, 3, 2, ["a", "b"], None),
}


def run(tokenizer, scripted, scenario, topology, tasks=None):
    _, default_tasks, num_generations, max_turns, choices, signal_fn = SCENARIOS[scenario]
    engine = RolloutEngine(scripted(occurrence_policy(choices)), PromptRenderer(tokenizer, history_length=2),
                           max_turns=max_turns, sampling=SamplingParams(8), topology=topology, signal_fn=signal_fn)
    return engine.run(tasks or default_tasks, num_generations=num_generations)


def counts(stats: dict[str, float]) -> dict[str, float]:
    """The rollout's stats without its timings."""
    return {k: v for k, v in stats.items() if "seconds" not in k}


def shape(group: Group) -> list[tuple]:
    return [(t.episode_id, t.parent_id, t.fork_step, tuple(s.action_text for s in t.steps), t.episode_return,
             t.failed) for t in group.trajectories]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_per_task_calls_give_each_task_its_lockstep_requests(scenario, tokenizer, scripted):
    build = SCENARIOS[scenario][0]
    lockstep, per_task = PerTask(build(), split=False), PerTask(build(), split=True, seed=7)
    batch = run(tokenizer, scripted, scenario, lockstep)
    split_batch = run(tokenizer, scripted, scenario, per_task)
    # The same answers at every moment (per task, as multisets), hence the same rollout.
    assert per_task.log == lockstep.log
    assert [shape(g) for g in split_batch.groups] == [shape(g) for g in batch.groups]
    assert counts(split_batch.stats) == counts(batch.stats)
    # The scenario exercises the topology: some moment answers for several tasks at once (lockstep).
    answered = [per_task_requests for _, _, per_task_requests in lockstep.log if per_task_requests]
    if scenario != "independent":
        assert any(len(requests) >= 2 for requests in answered), lockstep.log
    kinds = {type(r).__name__ for requests in answered for counter in requests.values() for r in counter}
    expected_kinds = {"adaptive": {"Launch"}, "branching-entropy": {"Fork"}, "branching-random": {"Fork"},
                      "token_branching": {"Fork", "Launch"}, "info_gain": {"Fork"}, "patr": {"Fork", "Stop"},
                      "independent": set()}[scenario]
    assert expected_kinds <= kinds, kinds
    if scenario == "adaptive":  # rounds of 4, 2, 1 tasks: the tasks stop growing at different rounds
        grown = [sorted(requests) for hook, _, requests in lockstep.log if hook == "when_idle"]
        assert grown == [[0, 1, 2, 3], [1, 3], [3], []] and batch.stats["topology/rounds"] == 4
    if scenario == "token_branching":
        # Every task forks at its first idle call (a task that forks nothing gets its fill-ups at once when asked
        # alone, but one idle call later in lockstep when another task forks: the module docstring).
        first = next(requests for hook, _, requests in lockstep.log if hook == "when_idle")
        assert all(any(isinstance(r, Fork) for r in first.get(i, ())) for i in range(len(batch.groups)))


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "independent"])
def test_a_tasks_episodes_do_not_depend_on_the_other_tasks(scenario, tokenizer, scripted):
    # A free (or per-task) topology decides a task from that task's episodes only: each task run alone gives the
    # group it gets among the others (the random streams are keyed by the task, not by its index or by the order).
    build, tasks = SCENARIOS[scenario][0], SCENARIOS[scenario][1]
    together = run(tokenizer, scripted, scenario, build())
    alone = [run(tokenizer, scripted, scenario, build(), tasks=[task]).groups[0] for task in tasks]
    assert [shape(g) for g in alone] == [shape(g) for g in together.groups]


# ---------------------------------------------------------------- a task decided while the others still play


def episode(task, episode_id, returns, snapshots=True):
    return Trajectory(task=task, episode_id=episode_id,
                      steps=[Step(f"o{t}", f"a{t}", reward=r, snapshot="s" if snapshots else None)
                             for t, r in enumerate(returns)])


def test_adaptive_decides_an_idle_task_while_another_plays():
    tasks = [{"seed": 0}, {"seed": 1}, {"seed": 2}]
    topology = AdaptiveTopology(max_group_size=6, round_size=2)
    topology.begin(tasks, num_generations=2)
    groups = [Group(task=tasks[0], trajectories=[episode(tasks[0], i, [0.0]) for i in range(2)]),  # no signal
              Group(task=tasks[1], trajectories=[episode(tasks[1], i, [0.0]) for i in range(2)]),  # still playing
              Group(task=tasks[2], trajectories=[episode(tasks[2], 0, [0.0]), episode(tasks[2], 1, [1.0])])]
    playing = {id(t) for t in groups[1].trajectories}
    view = RolloutView(tasks, groups, lambda t: id(t) in playing, None, max_turns=2)
    assert topology.when_idle(view, 0) == [Launch(0, 2)] and topology.when_idle(view, 2) == []
    assert topology.rounds == 2  # task 0's second round
    groups[0].trajectories += [episode(tasks[0], i, [0.0]) for i in (2, 3)]
    assert topology.when_idle(view, 0) == [Launch(0, 2)]  # task 0's third round, task 1 still on its first
    assert topology.rounds == 3 and topology.stats(view)["rounds"] == 3.0
    playing.clear()
    assert topology.when_idle(view, 1) == [Launch(1, 2)] and topology.rounds == 3


def test_branching_forks_an_idle_task_once_while_another_plays():
    tasks = [{"seed": 0}, {"seed": 1}]
    topology = BranchingTopology(branch_points=1, branch_factor=2, score="entropy_mean")
    topology.begin(tasks, num_generations=1)
    groups = [Group(task=tasks[0], trajectories=[episode(tasks[0], 0, [0.0, 0.0, 0.0])]),
              Group(task=tasks[1], trajectories=[episode(tasks[1], 0, [0.0])])]
    signalled = []

    def signal(name, trajectories):
        signalled.append([(t.task["seed"], t.episode_id) for t in trajectories])
        entropy_signal(name, trajectories)
        for t in trajectories:  # step 1 of every backbone has the highest entropy
            t.steps[min(1, len(t.steps) - 1)].signals["entropy"] = [9.0]

    playing = {id(groups[1].trajectories[0])}
    view = RolloutView(tasks, groups, lambda t: id(t) in playing, signal, max_turns=3)
    assert topology.when_idle(view, 0) == [Fork(0, 0, 1, 1)]
    assert signalled == [[(0, 0)]]  # the entropy of task 0's backbones only
    assert topology.when_idle(view, 0) == []  # task 0 is in its branch phase
    playing.clear()
    assert topology.when_idle(view, 1) == [Fork(1, 0, 0, 1)] and signalled[-1] == [(1, 0)]
    assert topology.when_idle(view) == [] and topology.stats(view)["branch_points_per_task"] == 1.0


# ---------------------------------------------------------------- branching's per-task random streams


def test_branching_random_picks_come_from_each_tasks_own_stream():
    # The documented rule: task `task` of the r-th rollout this topology begins draws from
    # random.Random(f"{seed}:{r}:{task id}") (task id: the row's task_id, else its sorted items), one
    # `sample(candidates, branch_points)` per healthy backbone, in episode order; the picks are sorted.
    tasks = [{"env": "frozenlake", "seed": 5}, {"task_id": "t9", "seed": 9}]
    lengths = [[6, 4], [5]]  # steps of the backbones of each task

    def view_of(tasks, lengths):
        groups = [Group(task=task, trajectories=[episode(task, i, [0.0] * n) for i, n in enumerate(sizes)])
                  for task, sizes in zip(tasks, lengths, strict=True)]
        return RolloutView(tasks, groups, lambda t: False, None, max_turns=6)

    def expected(rollout, task, sizes, task_index):
        stream = random.Random(f"0:{rollout}:{task.get('task_id', sorted(task.items()))}")
        return [Fork(task_index, i, step, 2) for i, n in enumerate(sizes)
                for step in sorted(stream.sample(range(n), 2))]

    topology = BranchingTopology(branch_points=2, branch_factor=3, score="random", seed=0)
    topology.begin(tasks, num_generations=2)
    view = view_of(tasks, lengths)
    second, first = topology.when_idle(view, 1), topology.when_idle(view, 0)  # task 1 becomes idle first
    assert first == expected(0, tasks[0], lengths[0], 0) and second == expected(0, tasks[1], lengths[1], 1)
    # The picks themselves (seed 0, rollout 0), as the rule gives them with CPython's random module:
    assert [(r.episode_id, r.step) for r in first + second] == [(0, 1), (0, 5), (1, 1), (1, 2), (0, 1), (0, 4)]

    lockstep = BranchingTopology(branch_points=2, branch_factor=3, score="random", seed=0)
    lockstep.begin(tasks, num_generations=2)
    assert lockstep.when_idle(view_of(tasks, lengths)) == first + second  # the same picks, in task order

    alone = BranchingTopology(branch_points=2, branch_factor=3, score="random", seed=0)
    alone.begin([tasks[1]], num_generations=2)  # the task at another index, without the other task
    assert alone.when_idle(view_of([tasks[1]], [lengths[1]])) == expected(0, tasks[1], lengths[1], 0)

    # The next rollout of the same topology draws from rollout 1's streams.
    topology.begin(tasks, num_generations=2)
    view = view_of(tasks, lengths)
    assert topology.when_idle(view) == expected(1, tasks[0], lengths[0], 0) + expected(1, tasks[1], lengths[1], 1)
