"""Every built-in "free" or "task" topology gives the same rollout under lockstep, "task" and "free" scheduling.

Each scenario runs one rollout three times (`RolloutEngine(schedule=...)`, deterministic sampling, the same seed) with
`SeededScriptGenerator` (its answer depends only on the prompt ids and the request seed: batch invariant) and
`LatencyEnv` ("test-latency": keyed step latencies, so episodes finish in an order that differs from the episode
order). The model signals a topology computes mid-rollout, and PATR's scorer, are batch invariant too: each value is a
hash of the step's (or the partial trajectory's) own prompt and action ids, whatever other trajectories share the call.
Then the rows (tree columns, signals and info included), the content stats and the topology's stats are the same under
the three schedules; every scenario also checks that it exercised its topology (forks, rounds, prunes, ...).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.env_pool import EnvPool
from trl_agents.rollout.topologies import AdaptiveTopology, BranchingTopology, Topology, get_topology
from trl_agents.rollout.topologies.appo import POLICY_LOGPROBS
from trl_agents.rollout.topologies.base import SUPERVISION
from trl_agents.rollout.topologies.igrpo import GOLD_LIKELIHOOD, node_indices
from trl_agents.rollout.topologies.patr import PRUNED, SCORE
from trl_agents.testing import SeededScriptGenerator

SCHEDULES = ("lockstep", "task", "free")
LATENCY = {"median": 0.003, "sigma": 1.0, "low": 0.0005, "high": 0.03}  # seconds, per environment step
CONTENT_STATS = ("generated_tokens", "env_steps", "episodes")
# FrozenLake moves (down and right lead to the goal; "stay" is an invalid action: no direction word).
MOVES = ["```down```", "```right```", "```up```", "```left```", "```down```", "```right```", "stay"]
# Countdown answers: two valid, two invalid, so returns vary within a group (or not: adaptive then grows it).
ANSWERS = ["```up```", "no idea", "```left```", "pass"]


# ---------------------------------------------------------------- batch-invariant signals and scorer


def unit(*parts: Any) -> float:
    """A number in [0, 1) from a hash of `parts` (the same in any process, any call, any batch)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big") / 2**64


def token_values(kind: str, step, scale: float) -> list[float]:
    """One value per action token of `step`, from its own prompt and action ids."""
    prompt, action = tuple(step.prompt_ids), tuple(step.action_ids)
    return [scale * unit(kind, prompt, action, k) for k in range(len(action))]


def entropy_signal(name, trajectories):
    """`entropy` (branching's score): per-token values of every step of the backbones it is asked about."""
    assert name == "entropy"
    for trajectory in trajectories:
        for step in trajectory.steps:
            step.signals["entropy"] = token_values("entropy", step, 3.0)


def policy_logprobs_signal(name, trajectories):
    """`policy_logprobs` and `entropy` (token branching): varied entropies and current − sampler log-ratios; flat
    entropies on the task of seed 3 (no z(H) > 0: no split point, its whole budget becomes fill-up rollouts)."""
    assert name == POLICY_LOGPROBS
    for trajectory in trajectories:
        flat = trajectory.task.get("seed") == 3
        for step in trajectory.steps:
            step.signals["entropy"] = [1.0] * len(step.action_ids) if flat else token_values("entropy", step, 3.0)
            ratios = token_values("ratio", step, 0.4)
            step.signals[POLICY_LOGPROBS] = [lp + r - 0.2 for lp, r in zip(step.action_logprobs, ratios, strict=True)]


def gold_signal(name, trajectories):
    """`gold_likelihood` (info_gain): p(a* | h) in [0.05, 0.95] from each node step's prompt (h)."""
    assert name == GOLD_LIKELIHOOD
    for trajectory in trajectories:
        for j in node_indices(trajectory):
            step = trajectory.steps[j]
            step.signals.setdefault(name, 0.05 + 0.9 * unit("gold", tuple(step.prompt_ids)))


def patr_scorer(trajectories):
    """q of each partial trajectory from its last step and length: 0.1 (low: pruned twice in a row), 0.5 or 0.9
    (expandable)."""
    scores = []
    for trajectory in trajectories:
        last = trajectory.steps[-1]
        u = unit("q", tuple(last.prompt_ids), tuple(last.action_ids), len(trajectory.steps))
        scores.append(0.1 if u < 0.35 else 0.5 if u < 0.6 else 0.9)
    return scores


# ---------------------------------------------------------------- the scenarios


@dataclass(frozen=True)
class Scenario:
    build: Callable[[], Topology]
    tasks: list[dict[str, Any]]  # rows without "env": the pool's default, "test-latency" around `inner`
    num_generations: int
    max_turns: int
    actions: list[str] = field(default_factory=lambda: list(MOVES))
    inner: str = "frozenlake"
    signal_fn: Callable | None = None
    row_format: str = "step"


FROZENLAKE = [{"seed": seed} for seed in (3, 4, 5, 6)]

SCENARIOS = {
    "independent": Scenario(lambda: get_topology("independent"), FROZENLAKE, 3, 4),
    "independent-conversation": Scenario(lambda: get_topology("independent"), FROZENLAKE, 3, 4,
                                         row_format="conversation"),
    # The ground truth from plain FrozenLake (the task rows have no "env": `ground_truth_turns` takes env_name).
    "supervised": Scenario(lambda: get_topology("supervised", replace_num=1, hint_num=1, env_name="frozenlake",
                                                max_turns=6), FROZENLAKE[:3], 4, 6),
    "adaptive": Scenario(lambda: AdaptiveTopology(max_group_size=8, round_size=2),
                         [{"seed": seed, "turns": 2} for seed in range(6)], 2, 2, actions=ANSWERS,
                         inner="test-countdown"),
    "branching-random": Scenario(lambda: BranchingTopology(branch_points=2, branch_factor=3, score="random", seed=3),
                                 FROZENLAKE, 2, 4),
    "branching-entropy": Scenario(lambda: BranchingTopology(branch_points=2, branch_factor=2, score="entropy_mean"),
                                  FROZENLAKE, 2, 4, signal_fn=entropy_signal),
    "token_branching": Scenario(lambda: get_topology("token_branching", rollouts_per_task=5), FROZENLAKE, 2, 3,
                                signal_fn=policy_logprobs_signal),
    "info_gain": Scenario(lambda: get_topology("info_gain", leaf_budget=7, expansion_factor=2,
                                               expansions_per_round=2, seed=1), FROZENLAKE, 2, 4,
                          signal_fn=gold_signal),
    "patr": Scenario(lambda: get_topology("patr", scorer=patr_scorer, roots=2, branch_factor=2, prune_patience=2,
                                          repeat_limit=2), FROZENLAKE, 8, 5),
}


@pytest.fixture
def recorded(monkeypatch):
    """Spy on `RolloutEngine._record`: every engine gets `recorded`, its (task, episode, step) in the order the
    steps were applied."""
    record = RolloutEngine._record

    def spy(self, turn, *args):
        trajectory = turn.episode.trajectory
        self.recorded.append((turn.episode.task_index, trajectory.episode_id, len(trajectory.steps)))
        return record(self, turn, *args)

    monkeypatch.setattr(RolloutEngine, "_record", spy)


def play(tokenizer, scenario: Scenario, schedule: str, generator=None):
    generator = generator or SeededScriptGenerator(tokenizer, scenario.actions)
    pool = EnvPool(env_kwargs={"inner": scenario.inner, **LATENCY}, default_env="test-latency", backend="thread",
                   num_workers=16)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=2), max_turns=scenario.max_turns,
                           sampling=SamplingParams(max_new_tokens=8), env_pool=pool, topology=scenario.build(),
                           signal_fn=scenario.signal_fn, row_format=scenario.row_format, schedule=schedule,
                           deterministic_sampling=True, seed=0)
    engine.recorded = []
    try:
        return engine.run(scenario.tasks, scenario.num_generations), engine
    finally:
        pool.close()


ROW_KEYS = ("task", "episode_id", "step", "branch_id", "parent_id", "fork_step", "prompt_ids", "action_ids",
            "action_logprobs", "reward", "observation", "signals", "info")


def row_texts(batch) -> list[str]:
    rows = batch.to_rows()
    assert rows and all(key in row for row in rows for key in ROW_KEYS)
    return [json.dumps(row, sort_keys=True, default=str) for row in rows]


def rows_hash(batch) -> str:
    """sha256 of every column of the rollout's rows, in (task, episode, step) order."""
    digest = hashlib.sha256()
    for text in row_texts(batch):
        digest.update(text.encode())
    return digest.hexdigest()


def first_difference(batch, reference) -> str:
    """Where two rollouts' rows first differ (for the failure message)."""
    ours, theirs = row_texts(batch), row_texts(reference)
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            a, b = json.loads(a), json.loads(b)
            keys = sorted(k for k in a if a[k] != b.get(k))
            return (f"row {index} (task {a['group_index']}, episode {a['episode_id']}, step {a['step']}) differs in "
                    f"{keys}: {[a[k] for k in keys]} != {[b[k] for k in keys]}")
    return f"{len(ours)} rows != {len(theirs)} rows"


def content_stats(stats: dict[str, float]) -> dict[str, float]:
    assert all(key in stats for key in CONTENT_STATS)
    return {k: v for k, v in stats.items() if k in CONTENT_STATS or k.startswith("topology/")}


def trees(batch) -> list:
    return [t for group in batch.groups for t in group.trajectories if t.parent_id is not None]


def exercised(name: str, batch) -> None:
    """The scenario really ran its topology's mechanism (counts, so that the test cannot pass on a no-op)."""
    stats, groups = batch.stats, batch.groups
    sizes = [len(group.trajectories) for group in groups]
    if name.startswith("independent"):
        assert sizes == [3] * len(groups) and not trees(batch)
        if name.endswith("conversation"):  # one growing chat: a step's prompt extends the previous step's
            steps = [t.steps for group in groups for t in group.trajectories if len(t.steps) >= 2]
            assert steps and all(s[1].prompt_ids[: len(s[0].prompt_ids)] == s[0].prompt_ids for s in steps)
    elif name == "supervised":
        kinds = Counter(step.info.get(SUPERVISION) for t in batch.trajectories for step in t.steps)
        assert kinds["forced"] >= 6 * len(groups) and kinds["hinted"] >= len(groups) and kinds[None] >= 2 * len(groups)
        assert stats["topology/no_ground_truth_fraction"] == 0.0
    elif name == "adaptive":  # the tasks grew a different number of rounds, some beyond the first
        assert max(sizes) > 2 and len(set(sizes)) >= 2 and stats["topology/rounds"] >= 3, sizes
    elif name.startswith("branching"):
        assert len(trees(batch)) >= 4 and stats["topology/branch_points_per_task"] >= 1.0
    elif name == "token_branching":  # task 0 (seed 3, flat entropies) forks nothing: 3 fill-up rollouts
        assert sizes == [5] * len(groups) and stats["topology/fill_rollouts_per_task"] >= 3 / len(groups)
        assert not any(t.parent_id is not None for t in groups[0].trajectories)
        forked = [t for t in trees(batch) if t.steps[t.fork_step].action_ids]
        assert len(forked) >= 4 and stats["topology/branches_per_task"] >= 1.0
    elif name == "info_gain":
        assert len(trees(batch)) >= 4 and stats["topology/expansions_per_task"] >= 1.0 and sizes == [7] * len(groups)
        assert stats["topology/rounds"] >= 2
    elif name == "patr":
        pruned = sum(PRUNED in step.signals for t in batch.trajectories for step in t.steps)
        scored = sum(SCORE in step.signals for t in batch.trajectories for step in t.steps)
        assert pruned >= 2 and stats["topology/pruned_per_task"] > 0 and scored >= 40
        assert stats["topology/expansions_per_task"] >= 1.0 and len(trees(batch)) >= 8 and sizes == [8] * len(groups)
        assert stats["topology/filled_per_task"] > 0  # some task ended below B: filled when idle
    else:
        raise AssertionError(f"no check for scenario {name!r}")


# ---------------------------------------------------------------- the same rollout under every schedule


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_schedule_plays_the_lockstep_rollout(name, tokenizer, recorded):
    scenario = SCENARIOS[name]
    played = {schedule: play(tokenizer, scenario, schedule) for schedule in SCHEDULES}
    lockstep, _ = played["lockstep"]
    exercised(name, lockstep)
    declared = scenario.build().schedule
    assert declared in ("free", "task")
    for schedule, (batch, engine) in played.items():
        expected = {"lockstep": "global", "task": "task", "free": declared}[schedule]
        assert engine.effective_schedule == expected
        assert rows_hash(batch) == rows_hash(lockstep), f"{schedule}: {first_difference(batch, lockstep)}"
        assert content_stats(batch.stats) == content_stats(lockstep.stats), schedule
        assert len(engine.recorded) == lockstep.stats["env_steps"]
    # The per-episode schedules really applied the steps in another order than lockstep's (keyed latencies).
    lockstep_order = played["lockstep"][1].recorded
    for schedule in ("task", "free"):
        order = played[schedule][1].recorded
        assert sorted(order) == sorted(lockstep_order) and order != lockstep_order, schedule


def test_episodes_finish_out_of_order_under_free_scheduling(tokenizer, recorded):
    """Under "free" an episode plays its next turn as soon as its own step returns: a fast episode records step s + 1
    before a slow one records step s (lockstep never does: it applies turn t of every episode before turn t + 1),
    and episodes finish in another order than lockstep's; the rows are lockstep's."""
    scenario = SCENARIOS["independent"]
    (lockstep, before), (free, engine) = (play(tokenizer, scenario, schedule) for schedule in ("lockstep", "free"))
    assert rows_hash(free) == rows_hash(lockstep)

    def overtaken(order):  # (a, b): a step of one episode applied before an earlier step of another
        return [(a, b) for i, a in enumerate(order) for b in order[i + 1:] if b[2] < a[2]]

    def finishing(order):  # episodes in the order of their last applied step
        last = {record[:2]: index for index, record in enumerate(order)}
        return sorted(last, key=last.__getitem__)

    assert not overtaken(before.recorded) and len(overtaken(engine.recorded)) >= 3
    assert engine.recorded != sorted(engine.recorded)
    assert finishing(engine.recorded) != finishing(before.recorded)
    assert finishing(engine.recorded) != sorted(finishing(engine.recorded))  # nor in (task, episode) order


@pytest.mark.parametrize("name", ["patr", "info_gain"])
def test_a_request_level_generator_gives_the_same_tree(name, tokenizer, recorded):
    """With a request-level generator (one request per turn, answered on threads in any order) too."""
    scenario = SCENARIOS[name]
    lockstep, _ = play(tokenizer, scenario, "lockstep")
    generator = SeededScriptGenerator(tokenizer, scenario.actions, request_level=True)
    batch, _ = play(tokenizer, scenario, "free", generator=generator)
    assert rows_hash(batch) == rows_hash(lockstep), first_difference(batch, lockstep)
    assert content_stats(batch.stats) == content_stats(lockstep.stats)
    assert generator.calls == [1] * int(batch.stats["env_steps"])
