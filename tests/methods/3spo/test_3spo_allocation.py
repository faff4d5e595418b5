"""3SPO's adaptive rollout allocation: n(s) = ⌈G_max·S(s)⌉ (Eq. 3) and the ranked backtracking search of the
`state_score` topology, its tree credit, and 2 training steps with `sspo_allocation="adaptive"`.

The step-reward and table math is in tests/methods/3spo/test_3spo_credit.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import group_credit

from trl_agents.envs import AgentEnv, register_env
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.topologies import TOPOLOGIES, Launch, get_topology
from trl_agents.rollout.topologies.state_score import (
    StateScoreTable,
    StateScoreTopology,
    allocated_rollouts,
    transition_reward,
)
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.sspo import SSPOConfig, SSPOTrainer
from trl_agents.trajectory import Group, Step, Trajectory


@register_env
class LineEnv(AgentEnv):
    """Positions 0, 1, 2 on a line, from 0: "r" moves right, "l" left (stays at 0), "j" jumps two, anything else is
    invalid (no move). Reaching 2 ends the episode with success."""

    name = "test-line"
    instructions = "Reach 2."
    task_keys = ("seed",)

    def reset(self, task):
        self.pos = 0
        return "at 0"

    def step(self, action_text):
        action = action_text.strip()
        moves = {"r": 1, "l": -1, "j": 2}
        if action in moves:
            self.pos = max(0, self.pos + moves[action])
        done = self.pos >= 2
        return f"at {self.pos}", float(done), done, {"valid": action in moves, "success": done, "action": action}

    def state_key(self):
        return self.pos

    def snapshot(self):
        return self.pos

    def restore(self, snapshot):
        self.pos = snapshot

    @classmethod
    def task_split(cls, split, count=None, **env_kwargs):
        return [{"env": cls.name, "seed": i} for i in range(count or 4)]


class StubTable(StateScoreTable):
    """Fixed scores S(s) and a fixed ω = 0.25 (the counts the search adds change nothing)."""

    def __init__(self, scores, omega=0.25):
        super().__init__(scope="global")
        self.scores, self.fixed_omega = scores, omega

    def score_of_key(self, key):
        return self.scores[int(key)]

    def omega_of_key(self, key):
        return self.fixed_omega

    def copy(self):
        return StubTable(self.scores, self.fixed_omega)


# ---- Eq. 3 --------------------------------------------------------------------------------------------------------


def test_rollouts_per_state_is_the_ceiling_of_g_max_times_the_score():
    # ⌈8·1⌉ = 8, ⌈8·0.3⌉ = ⌈2.4⌉ = 3, ⌈8·0.01⌉ = ⌈0.08⌉ = 1, ⌈8·0⌉ = 0.
    assert [allocated_rollouts(s, 8) for s in (1.0, 0.3, 0.01, 0.0)] == [8, 3, 1, 0]
    table = StubTable({0: 1.0, 1: 0.3, 2: 0.01, 3: 0.0})
    assert [table.num_rollouts(s, g_max=8) for s in range(4)] == [8, 3, 1, 0]
    # A real table: unseen -> S = 1 -> 8; 10 failed visits, no success -> S = 0 -> truncate; one success in two
    # visits at t = 3 with α = 1: S = exp(−log 3 · 0.5) = 0.577 -> ⌈4.62⌉ = 5.
    real = StateScoreTable(alpha=1.0, scope="global", counts={"'dead'": [10, 0], "'half'": [2, 1]}, t=3)
    assert real.num_rollouts("new") == 8 and real.num_rollouts("dead") == 0
    assert real.num_rollouts("half") == math.ceil(8 * math.exp(-math.log(3) * 1 / (2 + 1e-6))) == 5


# ---- the ranked backtracking search on a toy env ---------------------------------------------------------------------


def run_search(tokenizer, scripted, replies, scores, max_samples=2, max_turns=4, min_root_rollouts=2):
    generator = scripted(lambda prompt, call, row, size: replies[call][row])
    topology = StateScoreTopology(g_max=8, max_samples=max_samples, table=StubTable(scores),
                                  min_root_rollouts=min_root_rollouts)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=0), max_turns=max_turns,
                           sampling=SamplingParams(max_new_tokens=4), topology=topology)
    batch = engine.run([{"env": "test-line", "seed": 0}], num_generations=8)
    return batch, topology, generator


def test_the_search_branches_ranks_skips_explored_actions_and_backtracks(tokenizer, scripted):
    # S(0) = 0.3 -> n = ⌈2.4⌉ = 3 siblings at state 0; S(1) = 0.01 -> n = ⌈0.08⌉ = 1 (continue); ω = 0.25.
    # R_3SPO = ω·novel + (0.5 − ω)·(S(s) − S(s')) + 0.5·success; a next state nobody acted from yet is unknown
    # (terminal_score "current": novel = 1[valid], S(s') := S(s)).
    replies = [
        ["l"],       # call 0: e0 at 0 plays "l" (stays). n(0) = 3: e0 held, e1 and e2 forked from before that action
        ["r", "l"],  # call 1: e1 "r" -> 1 (unknown yet: R = 0.25), e2 "l" -> 0 (R = 0). e0 "l": R = 0.
                     #   rank e1 > e0 > e2 (ties: creation order); e2 repeats e0's "l": skipped; follow e1, push e0
        ["r"],       # call 2: e1 at 1 "r" -> 2, success. n(1) = 1: it just ends. Finished 1 of 2; pop e0
        ["r"],       # call 3: e0 (resumed) at 0 "r" -> 1. n(0) = 3 again: e0 held, e3 and e4 forked at its step 1
        ["j", "l"],  # call 4: e3 "j" -> 2, success: R = 0.25 + 0 + 0.5 = 0.75; e4 "l": R = 0;
                     #   e0 "r" -> 1, now known (e1 acted from "at 1"): R = 0.25 + 0.25·(0.3 − 0.01) = 0.3225.
                     #   rank e3 > e0 > e4; "r" and "l" were explored from 0: e0, e4 skipped; follow e3 (ended):
                     #   finished 2 of 2, the search closes
    ]
    batch, topology, generator = run_search(tokenizer, scripted, replies, {0: 0.3, 1: 0.01, 2: 1.0})
    assert [len(call) for call in generator.calls] == [1, 2, 1, 1, 2]  # one call per turn, held episodes skip
    assert topology.events == [
        ("decide", 0, 0, 3), ("skip", 0, 2), ("push", 0, 0), ("follow", 0, 1),
        ("decide", 0, 1, 1), ("finish", 0, 1), ("pop", 0, 0), ("follow", 0, 0),
        ("decide", 0, 0, 3), ("skip", 0, 0), ("skip", 0, 4), ("follow", 0, 3), ("finish", 0, 3), ("close", 0),
    ]
    group = batch.groups[0]
    paths = {t.episode_id: [s.action_text for s in t.steps] for t in group.trajectories}
    assert paths == {0: ["l", "r"], 1: ["r", "r"], 2: ["l"], 3: ["l", "j"], 4: ["l", "l"]}
    assert [(t.parent_id, t.fork_step) for t in group.trajectories] == [(None, 0), (0, 0), (0, 0), (0, 1), (0, 1)]
    assert group.trajectories[3].steps[0] is group.trajectories[0].steps[0]  # the shared prefix: one Step
    assert [t.success for t in group.trajectories] == [False, True, False, True, False]
    assert not any(t.failed for t in group.trajectories)
    # Finished trajectories are the followed paths that ended (e1, e3); the held or skipped siblings ended with the
    # rollout and are not counted in the table.
    ids = {id(t): t.episode_id for t in group.trajectories}
    assert sorted(ids[i] for i in topology.uncounted) == [0, 2, 4]
    stats = batch.stats
    assert stats["topology/finished_per_task"] == 2 and stats["topology/decisions_per_task"] == 3
    assert stats["topology/branched_per_task"] == 4 and stats["topology/skipped_per_task"] == 3
    assert stats["topology/backtracks_per_task"] == 1 and stats["generation_calls"] == 5
    # The ranking numbers above, from the same function the search uses.
    stub = StubTable({0: 0.3, 1: 0.01, 2: 1.0})
    assert transition_reward(stub, 0, 1, False) == pytest.approx(0.3225)
    assert transition_reward(stub, 0, None, True) == pytest.approx(0.75)
    assert transition_reward(stub, 0, 0, False) == 0.0


def test_a_zero_score_truncates_and_a_score_of_one_over_g_max_continues(tokenizer, scripted):
    # S(0) = 0 -> n = 0 (Eq. 3 alone, min_root_rollouts=0): the first episode ends after its first action, the
    # search has nothing to backtrack to.
    batch, topology, generator = run_search(tokenizer, scripted, [["r"]], {0: 0.0, 1: 0.0}, max_samples=3,
                                            min_root_rollouts=0)
    assert [len(t.steps) for t in batch.groups[0].trajectories] == [1] and len(generator.calls) == 1
    assert topology.events == [("decide", 0, 0, 0), ("finish", 0, 0), ("close", 0)]
    assert batch.stats["topology/truncated_per_task"] == 1 and not topology.uncounted
    # S = 1/8 everywhere -> n = 1: one plain episode, no forks.
    batch, topology, _ = run_search(tokenizer, scripted, [["r"], ["r"]], {0: 0.125, 1: 0.125}, max_samples=1,
                                    min_root_rollouts=0)
    assert [[s.action_text for s in t.steps] for t in batch.groups[0].trajectories] == [["r", "r"]]
    assert [e[0] for e in topology.events] == ["decide", "decide", "finish", "close"]


def test_unexplored_siblings_left_on_the_frontier_end_with_the_rollout(tokenizer, scripted):
    # n(0) = 3; the best sibling ends at once with success: the budget of 1 is spent, the two others stay held
    # until the rollout ends (unfinished, trained as siblings, not counted).
    replies = [["r"], ["j", "x"]]
    batch, topology, _ = run_search(tokenizer, scripted, replies, {0: 0.3, 1: 0.3}, max_samples=1)
    group = batch.groups[0]
    assert [len(t.steps) for t in group.trajectories] == [1, 1, 1]
    assert ("follow", 0, 1) in topology.events and topology.events[-2:] == [("finish", 0, 1), ("close", 0)]
    assert len(topology.uncounted) == 2 and all(not t.failed for t in group.trajectories)


def test_begin_starts_each_rollout_afresh(tokenizer, scripted):
    topology = get_topology("state_score", g_max=2, max_samples=3)
    assert "state_score" in TOPOLOGIES and topology.needs_snapshots and topology.required_capabilities == ("snapshot",)
    assert topology.begin([{"seed": 0}, {"seed": 1}], num_generations=8) == [Launch(0, 1), Launch(1, 1)]
    assert topology.events == [] and topology.uncounted == set()
    with pytest.raises(ValueError, match="g_max must be an integer >= 1"):
        StateScoreTopology(g_max=0)
    with pytest.raises(ValueError, match="max_samples must be an integer >= 1 or None"):
        StateScoreTopology(max_samples=0)


# ---- tree credit ----------------------------------------------------------------------------------------------------


def test_tree_credit_counts_a_shared_step_once_in_its_owner():
    # A root [a@s0, b@s1] and a fork at step 1 [a@s0 (shared), c@s1]; empty table, global scope: S = 1, ω = 0.5.
    #   a: s0 -> s1: 0.5·1 + 0 = 0.5 (alone at s0: singleton -> A = 0)
    #   b: s1 -> unrecorded, valid, success: 0.5 + 0 + 0.5 = 1.0;   c: s1 -> s1 (its next observation is "o1",
    #   which s1 was acted from): novel 0 -> R = 0.   Siblings at s1: mean 0.5 -> A_b = +0.5, A_c = −0.5.
    shared = Step("o0", "a", state_key="s0", next_observation="o1")
    root = Trajectory(task={}, steps=[shared, Step("o1", "b", state_key="s1", next_observation="o2")],
                      success=True, episode_id=0)
    fork = Trajectory(task={}, steps=[shared, Step("o1", "c", state_key="s1", next_observation="o1")],
                      episode_id=1, parent_id=0, fork_step=1)
    advantages = group_credit("3spo", Group(task={}, trajectories=[root, fork]),
                              state_scores=StateScoreTable(scope="global"), invalid_action_penalty=0.0)
    assert advantages == [[0.0, 0.5], [0.0, -0.5]]  # the shared step: 0 in both (singleton), counted once
    # Counted once: were it counted per path, s0 would have two copies (still a 0 spread); check with a penalty
    # that the shared invalid step is charged once: ρ(a) = 0.5 − 0.1 with one more sibling at s0.
    other = Trajectory(task={}, steps=[Step("o0", "d", state_key="s0", next_observation="o0")], episode_id=2)
    shared.valid = False
    advantages = group_credit("3spo", Group(task={}, trajectories=[root, fork, other]),
                              state_scores=StateScoreTable(scope="global"), invalid_action_penalty=0.1)
    # s0 siblings: a (ρ = 0.5 − 0.1 = 0.4), d (next "o0" = its own state: R = 0) -> mean 0.2 -> A_a = 0.2, A_d = −0.2
    assert advantages[0][0] == pytest.approx(0.2) and advantages[1][0] == 0.0 and advantages[2] == [
        pytest.approx(-0.2)]


def test_table_update_skips_the_unfinished_siblings():
    won = Trajectory(task={}, steps=[Step("o0", "a", state_key="s0")], success=True)
    left = Trajectory(task={}, steps=[Step("o0", "b", state_key="s0")], episode_id=1)
    table = StateScoreTable(scope="global")
    assert table.update_records(table.group_records(Group(task={}, trajectories=[won, left]), skip={id(left)})) == 1
    assert table.visits("s0") == 1 and table.successes("s0") == 1 and table.t == 2


# ---- the trainer --------------------------------------------------------------------------------------------------


def sspo_config(tmp_path, **overrides):
    values = {"max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 4, "max_turns": 3,
              "sspo_allocation": "adaptive", "sspo_g_max": 2, "state_scope": "task", **overrides}
    return tiny_training_config(SSPOConfig, tmp_path / "sspo", **values)


def test_sspo_trains_two_steps_with_the_adaptive_allocation(tiny_model, tokenizer, tmp_path):
    tasks = [{"env": "frozenlake", "seed": s} for s in range(4)]
    trainer = SSPOTrainer(model=tiny_model, args=sspo_config(tmp_path), train_dataset=tasks,
                          processing_class=tokenizer)
    assert isinstance(trainer.rollout_topology, StateScoreTopology)
    assert trainer.rollout_topology.table is trainer.state_scores and trainer.rollout_topology.g_max == 2
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "topology/decisions_per_task" in h]
    # Up to G = 2 finished trajectories per task (fewer when a search runs out of unexplored actions).
    assert len(logs) == 2 and all(1.0 <= log["topology/finished_per_task"] <= 2.0 for log in logs)
    # Unseen states score 1: n = ⌈2·1⌉ = 2 at the first state, so every search forks.
    assert all(log["topology/branched_per_task"] >= 1 for log in logs)
    group = trainer.last_rollout.groups[0]
    assert group.is_tree
    # The table counts the finished trajectories only (not the siblings left on a frontier), one per episode.
    finished = sum(log["topology/finished_per_task"] * 2 for log in logs)  # 2 tasks per rollout
    assert trainer.state_scores.t - 1 == finished


def test_the_allocation_option_picks_the_topology(tmp_path):
    assert sspo_config(tmp_path).topology == "state_score"
    assert sspo_config(tmp_path, sspo_allocation="independent").topology == "independent"
    # The episode-level term: on by default without branching (R_3SPO alone credits no step before an outcome),
    # off with the adaptive search (the 3SPO code: R_3SPO only); an explicit value wins.
    assert sspo_config(tmp_path).episode_advantage_w == 0.0
    assert sspo_config(tmp_path, sspo_allocation="independent").episode_advantage_w == 1.0
    assert sspo_config(tmp_path, sspo_allocation="independent", episode_advantage_w=0.0).episode_advantage_w == 0.0
    with pytest.raises(ValueError, match="sspo_allocation must be one of"):
        sspo_config(tmp_path, sspo_allocation="dfs")
    with pytest.raises(ValueError, match="3SPO picks its topology from sspo_allocation"):
        sspo_config(tmp_path, sspo_allocation="independent", topology="branching")
    with pytest.raises(ValueError, match="sspo_g_max must be an integer >= 1"):
        sspo_config(tmp_path, sspo_g_max=0)
    info = METHODS["3spo"]
    assert "sspo_allocation='adaptive'" in info.hook
    assert any("tests/methods/3spo/test_3spo_allocation.py".startswith(tests) for tests in info.info.tests)
    assert SSPOTrainer.topology_options(sspo_config(tmp_path)) == {"g_max": 2, "max_samples": None,
                                                                   "min_root_rollouts": 2}
    with pytest.raises(ValueError, match="sspo_min_root_rollouts must be >= 0"):
        sspo_config(tmp_path, sspo_min_root_rollouts=-1)


def test_the_initial_state_gets_at_least_min_root_rollouts_actions(tokenizer, scripted):
    # S = 0 everywhere (every state has led to a success before: at α = 50, S ≈ 0). Eq. 3 alone gives n(s_0) = 0, a
    # group of one episode that credit cannot compare (min_healthy_episodes drops it); the guard raises n(s_0) to 2:
    # e0 acts, is held, and e1 is forked from the state before e0's action. Later states keep Eq. 3 (n = 0).
    replies = [["r"], ["l"], ["r"], ["r"]]
    batch, topology, _ = run_search(tokenizer, scripted, replies, {0: 0.0, 1: 0.0}, max_samples=3)
    group = batch.groups[0]
    assert topology.events[0] == ("decide", 0, 0, 2)
    assert [(t.parent_id, t.fork_step) for t in group.trajectories] == [(None, 0), (0, 0)]
    assert all(event[3] == 0 for event in topology.events[1:] if event[0] == "decide")
    with pytest.raises(ValueError, match="min_root_rollouts must be an integer >= 0"):
        StateScoreTopology(min_root_rollouts=-1)
