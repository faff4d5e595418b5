"""PATR's tree (rollout/topologies/patr.py), the engine's Stop request, and the trainer (trainers/patr.py): exactly B
leaves, expansion of the best-scored node, pruned paths kept as failed leaves, shared prefixes, fill-up, the scorers
(solver, callable, loopback endpoint judge, local reward model) and 2-step training on the tiny model.

The math (GRPO over the leaves, the solver progress formula, the adapters) is in tests/methods/patr/test_patr_credit.py.
"""

from __future__ import annotations

import pytest
from helpers import assert_close, group_credit, train_and_check_moved
from helpers import JudgeServer

from trl_agents.envs import AgentEnv, register_env
from trl_agents.judges import JudgeUnavailable, solver_progress
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.topologies import TOPOLOGIES, Launch, Topology, get_topology
from trl_agents.rollout.topologies.base import Stop
from trl_agents.rollout.topologies.patr import PRUNED, SCORE, PATRTopology
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.patr import PATRConfig, PATRTrainer, build_scorer
from trl_agents.trajectory import Step, Trajectory


@register_env
class Walk(AgentEnv):
    """A deterministic walk: every valid action but "stay" moves one cell; "bad" is rejected (no move). The episode
    ends after `length` turns (task field, default 5), with reward 1 when the last action contains the letter a."""

    name = "test-patr-walk"
    instructions = "Walk to the end."
    task_keys = ("seed",)

    def reset(self, task):
        self.seed, self.length, self.pos, self.turn = task["seed"], task.get("length", 5), 0, 0
        return f"Task {self.seed} at {self.pos}."

    def step(self, action_text):
        self.turn += 1
        valid = "bad" not in action_text
        if valid and "stay" not in action_text:
            self.pos += 1
        done = self.turn >= self.length
        reward = 1.0 if done and "a" in action_text else 0.0
        return f"Task {self.seed} at {self.pos}.", reward, done, {"valid": valid, "success": reward > 0}

    def snapshot(self):
        return (self.seed, self.length, self.pos, self.turn)

    def restore(self, snapshot):
        self.seed, self.length, self.pos, self.turn = snapshot

    @classmethod
    def task_split(cls, split, count=None, **env_kwargs):
        return [{"env": cls.name, "seed": i} for i in range(count or 8)]


def stub_scorer(table, default=0.5):
    """A scorer with a fixed q per node: node = (episode id, steps played); records every call."""
    calls = []

    def score(trajectories):
        calls.append([(t.episode_id, len(t.steps)) for t in trajectories])
        return [table.get((t.episode_id, len(t.steps)), default) for t in trajectories]

    score.calls = calls
    return score


def patr_engine(scripted, tokenizer, scorer, policy=lambda prompt, call, row, size: "a", max_turns=5, **options):
    topology = PATRTopology(scorer=scorer, **{"budget": 4, "roots": 1, "branch_factor": 2, **options})
    generator = scripted(policy)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=1), max_turns=max_turns,
                           sampling=SamplingParams(4), topology=topology)
    return engine, generator, topology


# Fixed scores per node (episode, steps played). B = 4, n₀ = 1, b = 2, τ_exp = 0.6, τ_prune = 0.2, m = 2, top-1:
# turn 1: node (0,1) q = 0.9 ≥ τ_exp  → expanded: 1 child forked at its state s_1 after ep 0's next turn (ep 1);
# turn 2: (0,2) 0.5                    → survives (middle);
# turn 3: (0,3) 0.7 and (1,2) 0.95     → both ≥ τ_exp, top-1 = the argmax (1,2): child ep 2 forked from ep 1 at step 2;
# turn 4: (0,4) 0.1, (1,3) 0.5; turn 5: (1,4) 0.1, (2,3) 0.1; turn 6: (2,4) 0.1 → ep 2 below τ_prune twice: pruned;
# idle with 3 leaves: the 4th is forked from the best recorded node, (1,2) q = 0.95, at step 2 (ep 3).
TABLE = {(0, 1): 0.9, (0, 2): 0.5, (0, 3): 0.7, (1, 2): 0.95, (0, 4): 0.1, (1, 3): 0.5, (1, 4): 0.1, (2, 3): 0.1,
         (2, 4): 0.1}


def test_the_tree_has_b_leaves_expands_the_argmax_prunes_and_shares_prefixes(tokenizer, scripted):
    scorer = stub_scorer(TABLE)
    engine, generator, topology = patr_engine(scripted, tokenizer, scorer)
    batch = engine.run([{"env": "test-patr-walk", "seed": 0}], num_generations=4)
    group = batch.groups[0]
    ep0, ep1, ep2, ep3 = group.trajectories
    # (i) exactly B = 4 leaves.
    assert len(group.trajectories) == 4 and batch.stats["topology/leaves_per_task"] == 4
    assert [(t.episode_id, t.parent_id, t.fork_step, len(t.steps)) for t in group.trajectories] == [
        (0, None, 0, 5), (1, 0, 1, 5), (2, 1, 2, 4), (3, 1, 2, 5)]
    # (ii) the expanded nodes: (0,1), the only one, then at turn 3 the argmax (1,2) (0.95 > 0.7, both ≥ τ_exp).
    assert scorer.calls[2] == [(0, 3), (1, 2)] and ep2.parent_id == 1 and ep2.fork_step == 2
    assert topology.expanded == [[(0, 1), (1, 2)]] and ep1.steps[1].signals[SCORE] == 0.95
    # (iii) ep 2: q = 0.1 < τ_prune at (2,3) and (2,4): ended after 4 of 5 turns, kept as a failed leaf (R = 0).
    assert ep2.steps[-1].signals[PRUNED] == "low_score" and not ep2.failed and not ep2.success
    assert topology.pruned == [[(2, "low_score")]] and batch.stats["topology/pruned_per_task"] == 1
    # (iv) shared prefixes: the same Step objects; a re-sampled step starts from the same state (prompt).
    assert ep1.steps[0] is ep0.steps[0] and ep2.steps[0] is ep0.steps[0] and ep2.steps[1] is ep1.steps[1]
    assert ep3.steps[:2] == ep1.steps[:2] and all(a is b for a, b in zip(ep3.steps[:2], ep1.steps[:2], strict=True))
    assert ep1.steps[1] is not ep0.steps[1] and ep1.steps[1].prompt_ids == ep0.steps[1].prompt_ids
    assert ep3.steps[2].observation == ep1.steps[2].observation == "Task 0 at 2."
    # One generation call per turn: 1, 1, 2, 2, 3, 2 episodes, then the filled leaf alone for its 3 turns.
    assert [len(call) for call in generator.calls] == [1, 1, 2, 2, 3, 2, 1, 1, 1]
    # Stats: 2 expansions, 1 filled, 11 nodes scored in 8 calls, mean q = 4.95 / 11.
    assert batch.stats["topology/expansions_per_task"] == 2 and batch.stats["topology/filled_per_task"] == 1
    assert batch.stats["topology/scored_nodes_per_task"] == 11 and topology.scorer_calls == 8  # one call per turn
    assert batch.stats["topology/mean_score"] == pytest.approx(4.95 / 11)
    assert batch.stats["topology/unscored_fraction"] == 0.0
    # GRPO over the leaves: returns [1, 1, 0 (pruned), 1]: mean 0.75, Bessel std 0.5 ⇒ +0.25/0.5001, −0.75/0.5001.
    up, down = 0.25 / (0.5 + 1e-4), -0.75 / (0.5 + 1e-4)
    assert_close(group_credit("patr", group), [[up] * 5, [up] * 5, [down] * 4, [up] * 5])
    # A new rollout starts afresh.
    assert len(engine.run([{"env": "test-patr-walk", "seed": 1}], num_generations=4).groups[0].trajectories) == 4


def test_last_action_expansion_resamples_the_nodes_last_action_at_once(tokenizer, scripted):
    # q = 0.9 everywhere, B = 3: turn 1 forks at step 0 of ep 0 (a sibling of its first action); turn 2: ep 0 and
    # ep 1 tie at 0.9, the lower id (ep 0) is expanded at step 1; the budget is then spent.
    engine, generator, topology = patr_engine(scripted, tokenizer, stub_scorer({}, 0.9), budget=3,
                                              expand_from="last_action", max_turns=3)
    group = engine.run([{"env": "test-patr-walk", "seed": 0, "length": 3}], num_generations=3).groups[0]
    assert [(t.episode_id, t.parent_id, t.fork_step) for t in group.trajectories] == [(0, None, 0), (1, 0, 0),
                                                                                      (2, 0, 1)]
    assert group.trajectories[2].steps[0] is group.trajectories[0].steps[0]
    # ep 0 plays turns 1-3, ep 1 (from step 0) turns 2-4, ep 2 (from step 1) turns 3-4.
    assert [len(call) for call in generator.calls] == [1, 2, 3, 2]


def test_the_budget_caps_the_children_and_degenerate_paths_are_pruned(tokenizer, scripted):
    # B = 2, b = 4: one child only.
    engine, _, _ = patr_engine(scripted, tokenizer, stub_scorer({}, 0.9), budget=2, branch_factor=4)
    assert len(engine.run([{"env": "test-patr-walk", "seed": 0}], num_generations=9).groups[0].trajectories) == 2
    # "stay" three times in the same observation: a loop, pruned after its 3rd turn (q = 0.5 is no reason).
    engine, _, topology = patr_engine(scripted, tokenizer, stub_scorer({}), budget=1,
                                      policy=lambda prompt, call, row, size: "stay")
    (looping,) = engine.run([{"env": "test-patr-walk", "seed": 0}], num_generations=1).groups[0].trajectories
    assert len(looping.steps) == 3 and looping.steps[-1].signals[PRUNED] == "repeated_action"
    # Two rejected actions in a row (tool errors): pruned after turn 2.
    engine, _, topology = patr_engine(scripted, tokenizer, stub_scorer({}), budget=1,
                                      policy=lambda prompt, call, row, size: "bad")
    (rejected,) = engine.run([{"env": "test-patr-walk", "seed": 0}], num_generations=1).groups[0].trajectories
    assert len(rejected.steps) == 2 and rejected.steps[-1].signals[PRUNED] == "invalid_actions"


def test_without_a_usable_node_the_budget_is_filled_with_new_roots(tokenizer, scripted):
    # One-turn episodes are never scored (a finished path is a leaf, not a node): the other B − 1 leaves are roots.
    engine, _, _ = patr_engine(scripted, tokenizer, stub_scorer({}, None), budget=3)
    batch = engine.run([{"env": "test-patr-walk", "seed": 0, "length": 1}], num_generations=3)
    assert [(t.parent_id, len(t.steps)) for t in batch.groups[0].trajectories] == [(None, 1)] * 3
    assert batch.stats["topology/filled_per_task"] == 2 and batch.stats["topology/scored_nodes_per_task"] == 0
    # No node scored ≥ τ_prune (all None): roots too, never a fork from an unscored node.
    engine, _, _ = patr_engine(scripted, tokenizer, stub_scorer({}, None), budget=2)
    group = engine.run([{"env": "test-patr-walk", "seed": 0}], num_generations=2).groups[0]
    assert [t.parent_id for t in group.trajectories] == [None, None]


def test_topology_options_are_checked():
    assert TOPOLOGIES["patr"] is PATRTopology
    assert get_topology("patr", scorer=lambda ts: [0.5] * len(ts)).begin([{"seed": 0}], 4) == [Launch(0, 1)]
    for options, message in (({"branch_factor": 1}, "branch_factor must be"), ({"tau_expand": 1.5}, "tau_expand"),
                             ({"tau_prune": 0.7}, "must not exceed"), ({"budget": 0}, "budget must be"),
                             ({"expand_from": "parent"}, "expand_from must be")):
        with pytest.raises(ValueError, match=message):
            PATRTopology(scorer=lambda ts: [], **options)
    with pytest.raises(ValueError, match="has no scorer"):
        PATRTopology().begin([{"seed": 0}], 4)
    with pytest.raises(ValueError, match="below roots"):
        PATRTopology(scorer=lambda ts: [], roots=3).begin([{"seed": 0}], 2)


class StopFirst(Topology):
    """Two episodes; ends episode 0 after its first turn (and asks again after the next: a no-op)."""

    name = ""  # not registered

    def begin(self, tasks, num_generations):
        return [Launch(0, 2)]

    def after_turn(self, view):
        return [Stop(0, 0)] if view.turn <= 2 else []


def test_stop_ends_an_episode_between_turns_without_failing_it(tokenizer, scripted):
    engine = RolloutEngine(scripted(lambda prompt, call, row, size: "a"), PromptRenderer(tokenizer), max_turns=3,
                           sampling=SamplingParams(4), topology=StopFirst())
    first, second = engine.run([{"env": "test-keyword", "seed": 0, "length": 3}], 2).groups[0].trajectories
    assert (len(first.steps), first.failed, first.success) == (1, False, False)
    assert len(second.steps) == 3 and second.success


# ---------------------------------------------------------------- the trainer


def patr_config(tmp_path, **overrides):
    values = {"env_name": "frozenlake", "max_turns": 6, "num_generations": 4, "per_device_train_batch_size": 8,
              "history_length": 1, **overrides}
    return tiny_training_config(PATRConfig, tmp_path / "patr", **values)


def test_config_defaults_and_checks(tmp_path):
    config = patr_config(tmp_path)
    assert (config.topology, config.patr_branch_factor, config.patr_expand_threshold, config.patr_prune_threshold,
            config.patr_prune_patience, config.patr_roots, config.patr_scorer) == ("patr", 2, 0.6, 0.2, 2, 1, "solver")
    assert METHODS["patr"].topology == "patr"
    assert PATRTrainer.signal_names(config) == ("solver_value",)
    assert PATRTrainer.signal_names(patr_config(tmp_path, patr_scorer="callable")) == ()
    for overrides, message in (({"topology": "branching"}, "runs on the 'patr' topology"),
                               ({"patr_branch_factor": 1}, "patr_branch_factor must be"),
                               ({"patr_roots": 5}, "must be >= patr_roots"),
                               ({"patr_prune_threshold": 0.9}, "must not exceed"),
                               ({"patr_scorer": "endpoint"}, "needs patr_scorer_url"),
                               ({"patr_scorer": "reward_model"}, "needs patr_scorer_model"),
                               ({"patr_scorer": "oracle"}, "patr_scorer must be one of")):
        with pytest.raises(ValueError, match=message):
            patr_config(tmp_path, **overrides)
    with pytest.raises(ValueError, match="needs PATRTrainer"):
        build_scorer(patr_config(tmp_path, patr_scorer="callable"))
    with pytest.raises(ValueError, match="used with patr_scorer='callable'"):
        build_scorer(config, scorer=lambda ts: [])


@pytest.mark.slow
def test_patr_trains_two_steps_with_the_solver_scorer(tiny_model, tokenizer, tmp_path):
    tasks = [{"env": "frozenlake", "seed": s} for s in range(4)]
    trainer = PATRTrainer(model=tiny_model, args=patr_config(tmp_path), train_dataset=tasks,
                          processing_class=tokenizer)
    logs = train_and_check_moved(trainer)
    for group in trainer.last_rollout.groups:
        assert len(group.trajectories) == 4  # B = num_generations leaves per task
        for trajectory in group.trajectories:  # the recorded scores are the solver progress of each node
            for t in range(trajectory.fork_step, len(trajectory.steps)):
                q = trajectory.steps[t].signals.get(SCORE)
                if q is not None:
                    node = Trajectory(task={}, steps=trajectory.steps[: t + 1])
                    assert q == solver_progress(node, 6) and 0.0 <= q <= 1.0
    assert all(log["topology/leaves_per_task"] == 4 and "topology/pruned_per_task" in log for log in logs)
    assert all("patr/pruned_fraction" in log and log["patr/num_leaves"] == 4 for log in logs)


@pytest.mark.slow
@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_patr_trains_with_a_callable_scorer(row_format, tiny_model, tokenizer, tmp_path):
    seen = []

    def scorer(trajectories):
        seen.append(len(trajectories))
        return [0.9] * len(trajectories)  # every node is worth expanding: the budget goes to forks

    config = patr_config(tmp_path, env_name="test-patr-walk", patr_scorer="callable", max_turns=3,
                         row_format=row_format)
    trainer = PATRTrainer(model=tiny_model, args=config, processing_class=tokenizer, scorer=scorer,
                          train_dataset=[{"env": "test-patr-walk", "seed": s, "length": 3} for s in range(4)])
    logs = train_and_check_moved(trainer)
    assert seen and all(log["topology/expansions_per_task"] >= 1 for log in logs)
    assert all(len(g.trajectories) == 4 and g.is_tree for g in trainer.last_rollout.groups)


def test_endpoint_scorer_through_a_loopback_judge(tmp_path):
    nodes = [Trajectory(task={}, steps=[Step("Task 0 at 0.", "a", next_observation="Task 0 at 1.")])] * 3
    with JudgeServer() as server:
        scorer = build_scorer(patr_config(tmp_path, patr_scorer="endpoint", patr_scorer_url=server.url))
        scores = scorer(nodes)
        path, payload = server.requests[0]
    assert sorted(scores) == pytest.approx([1 / 3, 2 / 3, 1.0])  # answers "Score: 1", "2", "3" in some order
    assert path == "/v1/chat/completions" and "making progress" in payload["messages"][1]["content"]
    with JudgeServer(mode="garbage") as server:
        assert build_scorer(patr_config(tmp_path, patr_scorer="endpoint", patr_scorer_url=server.url))(nodes) == [
            None] * 3  # no score: the nodes survive, neither expanded nor counted towards pruning
    with pytest.raises(JudgeUnavailable, match="did not answer"):  # a dead URL stops the trainer before the model
        PATRTrainer(model="unused", args=patr_config(tmp_path, patr_scorer="endpoint",
                                                     patr_scorer_url="http://127.0.0.1:9"),
                    train_dataset=[{"env": "frozenlake", "seed": 0}])


def test_local_judge_scorer_on_the_tiny_model(tiny_model_dir, tmp_path):
    scorer = build_scorer(patr_config(tmp_path, patr_scorer="local", patr_scorer_model=tiny_model_dir,
                                      patr_scorer_max_tokens=2))
    scores = scorer([Trajectory(task={}, steps=[Step("Task 0 at 0.", "a")])] * 2)
    assert len(scores) == 2 and all(s is None or 0.0 <= s <= 1.0 for s in scores)  # a random model rarely answers


@pytest.mark.slow
def test_patr_trains_with_the_local_reward_model_scorer(tiny_model, tiny_model_dir, tokenizer, tmp_path):
    config = patr_config(tmp_path, env_name="test-patr-walk", patr_scorer="reward_model",
                         patr_scorer_model=tiny_model_dir, max_turns=3, max_steps=1,
                         patr_expand_threshold=0.0, patr_prune_threshold=0.0)  # a random head: expand whatever
    trainer = PATRTrainer(model=tiny_model, args=config, processing_class=tokenizer,
                          train_dataset=[{"env": "test-patr-walk", "seed": s, "length": 3} for s in range(4)])
    trainer.train()
    groups = trainer.last_rollout.groups
    assert all(len(g.trajectories) == 4 for g in groups)
    scores = [s.signals[SCORE] for g in groups for t in g.trajectories for s in t.owned_steps if SCORE in s.signals]
    assert scores and all(0.0 < q < 1.0 for q in scores)
