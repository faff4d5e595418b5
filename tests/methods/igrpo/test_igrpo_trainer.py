"""IGRPO: the `info_gain` topology on Search-QA (budget, selection, suppression, root fallback), the `gold_likelihood`
model signal on the tiny model, and 2 training steps end to end. The math is in tests/methods/igrpo/test_igrpo_credit.py."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from trl_agents.envs import make_env
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.env_pool import EnvPool
from trl_agents.rollout.topologies import get_topology
from trl_agents.rollout.topologies.igrpo import GOLD_LIKELIHOOD, node_indices
from trl_agents.signals.model import ModelSignalContext
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.igrpo import GoldLikelihood, IGRPOConfig, IGRPOTrainer, answer_from_context
from trl_agents.trajectory import Group

ENV_KWARGS = {"num_entities": 100, "hops": 1}
TASK = {"env": "searchqa", "seed": 0}


def expert():
    env = make_env("searchqa", **ENV_KWARGS)
    env.reset(dict(TASK))
    return env.expert_plan(), env.question.answer  # ['search[<name> born]', 'answer[<gold>]'], gold


def two_roots_policy(first_search: str, later: str):
    """Call 0 (the two roots' first turn): row 0 searches `first_search`, row 1 a query that finds nothing useful;
    every later turn: `later`."""

    def policy(prompt, call, row, batch):
        if call == 0:
            return first_search if row % 2 == 0 else "search[zzz qqq]"
        return later

    return policy


def stub_likelihood(tokenizer, gold: str, calls: list):
    """A signal_fn for the engine: p = 0.9 on node steps whose prompt shows the gold answer, 0.1 elsewhere."""

    def signal_fn(name, trajectories):
        assert name == GOLD_LIKELIHOOD
        calls.append(len(trajectories))
        for trajectory in trajectories:
            for j in node_indices(trajectory):
                step = trajectory.steps[j]
                step.signals.setdefault(name, 0.9 if gold in tokenizer.decode(step.prompt_ids) else 0.1)

    return signal_fn


def run_topology(tokenizer, scripted, policy, signal_fn, num_generations=2, max_turns=3, **options):
    topology = get_topology("info_gain", **options)
    engine = RolloutEngine(scripted(policy), PromptRenderer(tokenizer), max_turns=max_turns,
                           sampling=SamplingParams(max_new_tokens=8), env_pool=EnvPool(env_kwargs=ENV_KWARGS),
                           topology=topology, signal_fn=signal_fn)
    return topology, engine.run([dict(TASK)], num_generations=num_generations)


# ---------------------------------------------------------------- the topology


def test_informative_node_is_expanded_and_the_flat_one_suppressed(tokenizer, scripted):
    (search, answer), gold = expert()
    calls = []
    topology, batch = run_topology(tokenizer, scripted, two_roots_policy(search, answer),
                                   stub_likelihood(tokenizer, gold, calls), leaf_budget=8, expansion_factor=2)
    group = batch.groups[0]
    # 2 roots + 3 expansions of k = 2 = 8 leaves, exactly the budget
    assert len(group.trajectories) == 8
    # Node A (after root 0's expert search): I = 0.9 − 0.1 = 0.8; node B (root 1's junk search): I = 0.1 − 0.1 = 0.
    # P(A) = e^8/(e^8 + 1) = 0.99966 each round: every fork is at A (root 0, step 1).
    assert [(t.parent_id, t.fork_step) for t in group.trajectories[2:]] == [(0, 1)] * 6
    assert all(t.steps[0] is group.trajectories[0].steps[0] for t in group.trajectories[2:])  # the shared prefix
    # B was a candidate with I ≤ 0 in rounds 1 and 2: suppressed by round 3 (A never: I > 0).
    node_b = id(group.trajectories[1].steps[0])
    assert topology._suppressed[0] == {node_b}
    assert topology._strikes[0][node_b] == 2  # not a candidate in round 3 any more (a third strike would be 3)
    stats = batch.stats
    assert stats["topology/leaves_per_task"] == 8.0 and stats["topology/expansions_per_task"] == 3.0
    assert stats["topology/suppressed_fraction"] == 0.5 and stats["topology/root_launches_per_task"] == 0.0
    assert stats["topology/mean_info_gain"] == pytest.approx((0.8 + 0.0) / 2)
    # One call per idle moment (the same count on every process), but only the first has anything to score: the
    # forks' first own step is the node they forked from (same prompt) and copies its value; the roots' nodes 0 and 1
    # were the only ones scored (4 steps).
    assert calls == [2, 0, 0, 0] and stats["topology/scored_nodes_per_task"] == 4.0
    for trajectory in group.trajectories:
        assert all(GOLD_LIKELIHOOD in trajectory.steps[j].signals for j in node_indices(trajectory))
    assert stats["topology/rounds"] == 4.0  # the roots, then 3 expansion rounds


def test_suppressed_nodes_are_never_picked_again(tokenizer, scripted):
    # Both roots search junk: both nodes have I = 0.1 − 0.1 = 0. Rounds 1 and 2 expand them (strikes 1, 2: both
    # suppressed); from round 3 the frontier is empty (the forks answer at once: no new node), so the budget goes to
    # fresh roots, which are never forks of a suppressed node.
    _, gold = expert()
    topology, batch = run_topology(tokenizer, scripted, two_roots_policy("search[zzz qqq]", "answer[nobody]"),
                                   stub_likelihood(tokenizer, gold, []), leaf_budget=10, expansion_factor=2)
    group = batch.groups[0]
    assert len(group.trajectories) == 10
    forks = [t for t in group.trajectories if t.parent_id is not None]
    assert len(forks) == 4 and [t.parent_id is None for t in group.trajectories[6:]] == [True] * 4
    assert batch.stats["topology/suppressed_fraction"] == 1.0 and len(topology._suppressed[0]) == 2
    assert batch.stats["topology/root_launches_per_task"] == 4.0 and batch.stats["topology/expansions_per_task"] == 2.0


def test_conversation_rows_share_the_nodes_value_too(tokenizer, scripted):
    (search, answer), gold = expert()
    calls = []
    topology = get_topology("info_gain", leaf_budget=6, expansion_factor=2)
    engine = RolloutEngine(scripted(two_roots_policy(search, answer)), PromptRenderer(tokenizer), max_turns=3,
                           sampling=SamplingParams(max_new_tokens=8), row_format="conversation",
                           env_pool=EnvPool(env_kwargs=ENV_KWARGS), topology=topology,
                           signal_fn=stub_likelihood(tokenizer, gold, calls))
    group = engine.run([dict(TASK)], num_generations=2).groups[0]
    assert len(group.trajectories) == 6 and calls == [2, 0, 0]  # the forks copied the node's value
    assert all(t.parent_id == 0 and t.fork_step == 1 for t in group.trajectories[2:])


def test_budget_is_trimmed_and_rounds_can_draw_several_nodes(tokenizer, scripted):
    (search, answer), gold = expert()
    _, batch = run_topology(tokenizer, scripted, two_roots_policy(search, answer), stub_likelihood(tokenizer, gold, []),
                            leaf_budget=7, expansion_factor=2, expansions_per_round=2)
    group = batch.groups[0]
    # 2 roots; round 1 draws twice (2 + 2 children); round 2 has room for 1: trimmed to 7
    assert len(group.trajectories) == 7 and batch.stats["topology/expansions_per_task"] == 3.0


def test_an_empty_frontier_spends_the_budget_on_fresh_roots(tokenizer, scripted):
    # Every episode answers at once: no tool observation, no node; the budget goes to new root episodes (GRPO).
    _, gold = expert()
    calls = []
    _, batch = run_topology(tokenizer, scripted, lambda *a: "answer[nobody]", stub_likelihood(tokenizer, gold, calls),
                            leaf_budget=6, expansion_factor=2)
    group = batch.groups[0]
    assert len(group.trajectories) == 6 and all(t.parent_id is None for t in group.trajectories)
    assert batch.stats["topology/root_launches_per_task"] == 4.0
    assert batch.stats["topology/mean_info_gain"] == 0.0
    assert len(calls) == 3  # each round's new roots are scored (their root state)


def test_options_are_checked():
    for options, match in (({"leaf_budget": 0}, "leaf_budget"), ({"expansion_factor": 1.5}, "expansion_factor"),
                           ({"temperature": 0.0}, "temperature"), ({"suppress_after": 0}, "suppress_after")):
        with pytest.raises(ValueError, match=match):
            get_topology("info_gain", **options)
    with pytest.raises(ValueError, match="exceed leaf_budget"):
        get_topology("info_gain", leaf_budget=2).begin([dict(TASK)], num_generations=4)


# ---------------------------------------------------------------- the gold-likelihood signal


def test_gold_likelihood_is_a_teacher_forced_forward_of_the_gold_answer(tiny_model, tokenizer, scripted):
    (search, answer), gold = expert()
    renderer = PromptRenderer(tokenizer)
    context = ModelSignalContext(model_context=lambda: contextlib.nullcontext(tiny_model), renderer=renderer,
                                 pad_token_id=tokenizer.pad_token_id or 0, max_rows_per_forward=3)
    signal = GoldLikelihood(source="env")
    assert signal.requires() == ("privileged_context",)
    calls = []

    def signal_fn(name, trajectories):
        calls.append(name)
        signal.compute([Group(task={}, trajectories=trajectories)], context)
        if len(calls) == 1:
            first_stats.update(signal.stats)

    first_stats = {}

    topology = get_topology("info_gain", leaf_budget=4, expansion_factor=2)
    engine = RolloutEngine(scripted(two_roots_policy(search, answer)), renderer, max_turns=3,
                           sampling=SamplingParams(max_new_tokens=8), env_pool=EnvPool(env_kwargs=ENV_KWARGS),
                           signals=["privileged_context"], topology=topology, signal_fn=signal_fn)
    group = engine.run([dict(TASK)], num_generations=2).groups[0]
    assert len(group.trajectories) == 4 and calls == [GOLD_LIKELIHOOD] * 2
    # The first call: the two roots' steps 0 have the same prompt (one row), their steps 1 differ (different
    # searches): 3 rows for 4 node steps. The second (after the expansion) has nothing new: the forks copied.
    assert first_stats == {"rows": 3.0, "nodes": 4.0} and signal.stats == {"rows": 0.0, "nodes": 0.0}
    step = group.trajectories[0].steps[1]
    answer_ids = tokenizer.encode(f"answer[{gold}]", add_special_tokens=False)
    with torch.no_grad():
        ids = torch.tensor([step.prompt_ids + answer_ids])
        logps = torch.log_softmax(tiny_model(input_ids=ids).logits[0, len(step.prompt_ids) - 1 : -1].float(), -1)
        token_logps = logps.gather(-1, torch.tensor(answer_ids).unsqueeze(-1)).squeeze(-1)
    assert step.signals[GOLD_LIKELIHOOD] == pytest.approx(math.exp(token_logps.mean().item()), rel=1e-4)
    assert 0.0 < step.signals[GOLD_LIKELIHOOD] < 1.0


def test_answer_sources():
    assert answer_from_context("Reasoning chain:\n1. x\nAnswer: Port Zandria") == "Port Zandria"
    with pytest.raises(ValueError, match="'Answer:' line"):
        answer_from_context("Go right twice.")
    from trl_agents.trajectory import Step, Trajectory

    trajectory = Trajectory(task={"gold": "1984"}, steps=[Step("o", "a")])
    assert GoldLikelihood(source="task:gold").answer(trajectory, 0) == "1984"
    assert GoldLikelihood(source="task:gold").requires() == ()
    with pytest.raises(ValueError, match="no field 'other'"):
        GoldLikelihood(source="task:other").answer(trajectory, 0)
    with pytest.raises(ValueError, match="igrpo_answer_source"):
        GoldLikelihood(source="future")
    with pytest.raises(ValueError, match="igrpo_answer_template"):
        GoldLikelihood(template="answer[{gold}]")


# ---------------------------------------------------------------- the trainer


def igrpo_config(tmp_path, **overrides):
    values = {"env_name": "searchqa", "env_kwargs": ENV_KWARGS, "max_turns": 3, "num_generations": 2,
              "per_device_train_batch_size": 4, "igrpo_leaf_budget": 6, "history_length": 1,
              "max_completion_length": 8, **overrides}
    return tiny_training_config(IGRPOConfig, tmp_path / "igrpo", **values)


def test_config_rules_and_registry(tmp_path):
    with pytest.raises(ValueError, match="'info_gain' topology"):
        igrpo_config(tmp_path, topology="branching")
    with pytest.raises(ValueError, match="igrpo_leaf_budget=2 must be >= num_generations=4"):
        igrpo_config(tmp_path, igrpo_leaf_budget=2, num_generations=4)
    with pytest.raises(ValueError, match="igrpo_temperature"):
        igrpo_config(tmp_path, igrpo_temperature=-1.0)
    with pytest.raises(ValueError, match="credit_statistic"):
        igrpo_config(tmp_path, credit_statistic="step_rows")
    with pytest.raises(ValueError, match="igrpo_expansion_factor"):
        igrpo_config(tmp_path, igrpo_expansion_factor=0)
    method = METHODS["igrpo"]
    assert method.topology == "info_gain" and method.paper == "arXiv 2607.06223"
    assert method.signals == ("gold_likelihood", "privileged_context")
    assert set(method.env_capabilities) == {"privileged_context", "snapshot"}


@pytest.mark.slow
def test_igrpo_trains_two_steps_on_searchqa(tiny_model, tokenizer, scripted, tmp_path):
    # Roots: row 0 of each task searches the expert query, row 1 a junk one; later turns answer the gold answer or a
    # wrong one by turns, so leaves differ in return.
    tasks = [{"env": "searchqa", "seed": s} for s in range(2)]
    golds, searches = {}, {}
    for task in tasks:
        env = make_env("searchqa", **ENV_KWARGS)
        env.reset(dict(task))
        searches[task["seed"]], golds[task["seed"]] = env.expert_plan()[0], env.question.answer
    counter = {"n": 0}

    def policy(prompt, call, row, batch):
        text = tokenizer.decode(prompt)
        seed = next(s for s in golds if searches[s][len("search["):-1].split()[0] in text)
        if "No documents retrieved yet" in text:
            return searches[seed] if row % 2 == 0 else "search[zzz qqq]"
        counter["n"] += 1
        return f"answer[{golds[seed]}]" if counter["n"] % 2 else "answer[nobody]"

    config = igrpo_config(tmp_path, num_generations_eval=2, per_device_eval_batch_size=2)
    trainer = IGRPOTrainer(model=tiny_model, args=config, train_dataset=tasks, eval_dataset=tasks[:1],
                           processing_class=tokenizer, generator=scripted(policy))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "igrpo/mean_info_gain" in h]
    assert len(logs) == 2
    for log in logs:
        assert log["topology/leaves_per_task"] == 6.0 and log["igrpo/num_leaves"] == 6.0
        assert log["topology/expansions_per_task"] == 2.0  # (6 − 2 roots) / k = 2
        assert log["signals/gold_likelihood_seconds"] > 0  # the real forward on the tiny model
        assert 0.0 <= log["topology/suppressed_fraction"] <= 1.0 and math.isfinite(log["igrpo/mean_info_gain"])
        assert 0.0 < log["igrpo/effective_leaf_fraction"] <= 1.0 + 1e-9
    group = trainer.last_rollout.groups[0]
    assert [t.parent_id is None for t in group.trajectories] == [True, True, False, False, False, False]
    for trajectory in group.trajectories:  # every node on every path carries its likelihood, for credit
        assert all(0.0 < trajectory.steps[j].signals[GOLD_LIKELIHOOD] < 1.0 for j in node_indices(trajectory))
    # Evaluation plays independent episodes (no tree, no likelihoods): credited as GRPO, no error.
    metrics = trainer.evaluate()
    assert [len(g.trajectories) for g in trainer.last_rollout.groups] == [2] and "eval_loss" in metrics
