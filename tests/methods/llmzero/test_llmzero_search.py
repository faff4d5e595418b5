"""LLMZero (arXiv 2606.18388, docs/methods/llmzero.md): the diagnosis, the proposals and their constraint, UCB and
best-first selection by hand, the outer loop with a stub proposer and a stub stage (monotone capacity, allowed fields
only, resume after a kill), the LLM proposer over a loopback OpenAI-compatible server, the CLI, and a real 3-stage
search (root + 2 children) on the tiny FrozenLake setting."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os

import pytest
from trl import ModelConfig

from trl_agents.cli import main
from trl_agents.strategy import (
    CAPACITY_PARAMS,
    REGULARISATION_PARAMS,
    RuleProposer,
    SearchTree,
    capacity_is_monotone,
    constrain,
    diagnose,
    proposals_from_text,
    summarise,
    ucb,
)
from trl_agents.judges import JudgeUnavailable
from trl_agents.loopback.base import LoopbackHTTPServer, RequestError
from trl_agents.run import RunArguments
from trl_agents.search import SEARCH_TREE, LLMProposer, SearchArguments, run_search, stage_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.llmzero import LLMZeroConfig, LLMZeroTrainer

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TINY = os.path.join(ROOT, "configs", "llmzero_frozenlake_tiny.yaml")
SEARCHED = (*CAPACITY_PARAMS, *REGULARISATION_PARAMS)


def read_json(path):
    with open(path) as handle:
        return json.load(handle)


def make_config(tmp_path, **kwargs):
    values = {"env_name": "frozenlake", "per_device_train_batch_size": 8, "num_generations": 2,
              "max_completion_length": 3, "learning_rate": 1e-4, "beta": 0.0, "report_to": "none",
              "save_strategy": "no", "stage_steps": 1, "children_per_node": 2, "search_budget": 4}
    values.update(kwargs)
    return LLMZeroConfig(output_dir=str(tmp_path / "search"), **values)


def fake_stage(scores):
    """A stage runner without a model: the score of node i is scores[i] (0.01·i past the list); it records the
    nodes it trained."""
    calls = []

    def runner(node, parent):
        calls.append(node["id"])
        score = scores[node["id"]] if node["id"] < len(scores) else 0.01 * node["id"]
        return {"score": score, "score_before": 0.0 if parent is None else parent["score"],
                "summary": {"entropy_first": 2.0, "entropy_last": 1.9, "zero_std": 0.8, "reward_slope": 0.0},
                "pathologies": diagnose({"zero_std": 0.8}, score=score, score_before=0.0)}

    runner.calls = calls
    return runner


# ---------------------------------------------------------------- UCB and selection, by hand


def test_ucb_values_by_hand():
    # c = 1, N_parent = 3 (the parent and two trained children), N_child = 1:
    # A: 0.5 + sqrt(ln 3 / 1) = 0.5 + sqrt(1.098612) = 0.5 + 1.048147 = 1.548147
    assert ucb(0.5, 3, 1, 1.0) == pytest.approx(1.548147, abs=1e-6)
    assert ucb(0.4, 3, 1, 1.0) == pytest.approx(1.448147, abs=1e-6)
    assert ucb(0.0, 3, 0, 1.0) == math.inf  # unvisited: first
    assert ucb(None, 3, 1, 1.0) == -math.inf and ucb(float("nan"), 3, 1, 1.0) == -math.inf
    assert ucb(0.7, 1, 1, 5.0) == 0.7  # ln 1 = 0: no bonus
    assert ucb(0.7, 0, 1, 5.0) == 0.7  # (guard: ln max(N, 1))


def tree_with(scores_and_parents):
    tree = SearchTree()
    for i, (parent, score, status) in enumerate(scores_and_parents):
        node = tree.add({"x": i}, parent=parent)
        node.update(score=score, status=status, expanded=status == "done")
    return tree


def test_ucb_picks_the_unvisited_child_first_then_the_highest_bound():
    # root 0.2; A (0.5) and B (0.4) trained, C proposed: C first, whatever the scores.
    tree = tree_with([(None, 0.2, "done"), (0, 0.5, "done"), (0, 0.4, "done"), (0, None, "proposed")])
    tree.nodes[1]["expanded"] = tree.nodes[2]["expanded"] = False
    assert tree.select(c=1.0) == ("train", 3)
    assert tree.select(c=0.0) == ("train", 3)
    # C trained (0.3): N_root = 4, N_child = 1 each, bonus sqrt(ln 4) = 1.177410:
    # A 0.5 + 1.177410 = 1.677410 > B 1.577410 > C 1.477410: descend into A, which has no children yet: expand it.
    tree.nodes[3].update(status="done", score=0.3)
    assert [round(ucb(tree.value(i), tree.visits(0), tree.visits(i), 1.0), 6) for i in (1, 2, 3)] == [
        1.67741, 1.57741, 1.47741]
    assert tree.select(c=1.0) == ("expand", 1)


def test_the_exploration_bonus_can_overturn_the_scores():
    # A (0.5) has two trained children (scores 0.1, 0.2): N_A = 3, value(A) = max = 0.5; B (0.45): N_B = 1;
    # N_root = 1 + 3 + 1 = 5, ln 5 = 1.609438.
    # c = 1:    A 0.5 + sqrt(1.609438 / 3) = 0.5 + 0.732447 = 1.232447;  B 0.45 + sqrt(1.609438) = 1.718636 -> B
    # c = 0.05: A 0.5 + 0.036622 = 0.536622;                          B 0.45 + 0.063432 = 0.513432 -> A
    tree = tree_with([(None, 0.0, "done"), (0, 0.5, "done"), (0, 0.45, "done"), (1, 0.1, "done"), (1, 0.2, "done")])
    for leaf in (2, 3, 4):
        tree.nodes[leaf]["expanded"] = False
    assert tree.visits(0) == 5 and tree.visits(1) == 3 and tree.value(1) == 0.5
    assert ucb(0.5, 5, 3, 1.0) == pytest.approx(1.232447, abs=1e-6)
    assert ucb(0.45, 5, 1, 1.0) == pytest.approx(1.718636, abs=1e-6)
    assert tree.select(c=1.0) == ("expand", 2)  # B: trained, no children yet
    # c = 0.05 descends into A; under A (N_A = 3) the bonus is 0.05·sqrt(ln 3) = 0.052407 for both leaves:
    # 0.1 + 0.052407 = 0.152407 < 0.2 + 0.052407 = 0.252407 -> node 4, a leaf: expand it
    assert ucb(0.2, 3, 1, 0.05) == pytest.approx(0.252407, abs=1e-6)
    assert tree.select(c=0.05) == ("expand", 4)


def test_best_first_grows_the_best_trained_node():
    tree = tree_with([(None, 0.0, "done"), (0, 0.5, "done"), (0, 0.45, "done")])
    tree.nodes[1]["expanded"] = tree.nodes[2]["expanded"] = False
    assert tree.select(selection="best_first") == ("expand", 1)
    tree.add({"x": 9}, parent=1)  # A's proposed child is trained next
    tree.nodes[1]["expanded"] = True
    assert tree.select(selection="best_first") == ("train", 3)
    with pytest.raises(ValueError, match="selection must be"):
        tree.select(selection="random")
    with pytest.raises(ValueError, match="backup must be"):
        SearchTree(backup="min")


def test_mean_backup_and_empty_tree():
    tree = tree_with([(None, 0.0, "done"), (0, 0.6, "done"), (0, None, "failed")])
    assert tree.value(0) == 0.6 and tree.trained() == 3 and tree.visits(0) == 2
    tree.backup = "mean"
    assert tree.value(0) == pytest.approx(0.3)  # (0.0 + 0.6) / 2; the failed node counts as a spent stage only
    assert SearchTree().select() is None and SearchTree().best() is None


# ---------------------------------------------------------------- diagnosis, proposals, constraint


def test_summary_and_diagnosis_by_hand():
    log = [
        {"reward": 0.0, "entropy": 2.0, "kl": 0.6, "clip_ratio/region_mean": 0.3, "frac_reward_zero_std": 0.5,
         "rollout/generated_tokens": 40, "rollout/env_steps": 10, "env/success_rate": 0.0},
        {"reward": 0.1, "entropy": 0.9, "kl": 0.8, "clip_ratio/region_mean": 0.1, "frac_reward_zero_std": 1.0,
         "rollout/generated_tokens": 40, "rollout/env_steps": 10, "env/success_rate": 0.25},
        {"train_runtime": 1.0},
    ]
    s = summarise(log, max_completion_length=4)
    # reward slope over (0, 0.1): 0.1; KL mean (0.6 + 0.8) / 2 = 0.7; clip mean 0.2; zero-std mean 0.75;
    # turn length 80 / 20 = 4 tokens = 100 % of the cap of 4
    assert s["steps"] == 2 and s["reward_slope"] == pytest.approx(0.1) and s["kl"] == pytest.approx(0.7)
    assert s["clip_ratio"] == pytest.approx(0.2) and s["zero_std"] == pytest.approx(0.75)
    assert s["length_ratio"] == 1.0 and s["success_last"] == 0.25 and s["truncation"] is None
    found = diagnose(s, score=0.3, score_before=0.4, params={"beta": 0.04})
    # entropy 0.9 / 2.0 = 0.45 < 0.5: collapse; length at the cap: truncation; KL 0.7 > 0.5: instability;
    # clip 0.2 is not > 0.2: no over-regularisation; zero-std 0.75 > 0.5; gain -0.1 <= 0.01 and slope 0.1 > 0.01:
    # not stagnating (the training reward still rises)
    assert [p["name"] for p in found] == ["entropy_collapse", "truncation", "instability", "zero_advantage"]
    assert "ratio 0.45" in found[0]["evidence"]
    # beta > 0, KL below 1e-3 and no progress: over-regularisation (and stagnation)
    quiet = diagnose({"kl": 1e-4, "reward_slope": 0.0}, score=0.2, score_before=0.2, params={"beta": 0.04})
    assert [p["name"] for p in quiet] == ["over_regularisation", "stagnation"]
    assert diagnose({"kl": 1e-4, "reward_slope": 0.0}, score=0.2, score_before=0.2, params={"beta": 0.0})[0][
        "name"] == "stagnation"


def test_empty_or_broken_histories_give_no_nan_and_no_pathology():
    for log in ([], [{"train_runtime": 1.0}], [{"reward": float("nan"), "entropy": float("inf"), "kl": None}]):
        s = summarise(log, max_completion_length=None)
        assert s["reward_first"] is None and s["entropy_last"] is None and s["kl"] is None
        assert s["reward_slope"] == 0.0 and s["length_ratio"] is None
        assert diagnose(s) == []
    assert summarise([{"rollout/generated_tokens": 5, "rollout/env_steps": 0}], 4)["turn_length"] is None


def test_rule_proposer_coordinates_the_fixes_then_fills_with_neutral_moves():
    params = {"max_completion_length": 3, "num_generations": 2, "learning_rate": 1e-4, "beta": 0.0, "epsilon": 0.2,
              "epsilon_high": 0.2, "temperature": 1.0, "entropy_coef": 0.0}
    pathologies = [{"name": "truncation", "evidence": ""}, {"name": "zero_advantage", "evidence": ""}]
    context = {"params": params, "pathologies": pathologies, "k": 4, "capacity": CAPACITY_PARAMS,
               "regularisation": REGULARISATION_PARAMS}
    proposals = RuleProposer()(context)
    assert [p["rationale"] for p in proposals] == [
        "fix truncation", "fix truncation + zero_advantage", "fix zero_advantage",
        "continue: the same strategy for one more stage"]
    # truncation: max_completion_length × 2 = 6; zero_advantage: num_generations × 2 = 4, temperature × 1.1 = 1.1
    assert proposals[1]["changes"] == {"max_completion_length": 6, "num_generations": 4, "temperature": 1.1}
    # only the searched parameters move: without max_completion_length, the truncation fix is dropped
    narrow = RuleProposer()({**context, "capacity": ("learning_rate",), "k": 2})
    assert narrow[0]["rationale"] == "fix zero_advantage" and narrow[0]["changes"] == {"temperature": 1.1}


def test_constrain_keeps_capacity_monotone_and_only_searched_fields():
    parent = {"num_generations": 8, "learning_rate": 1e-4, "beta": 0.04, "temperature": 1.0}
    params, notes = constrain(parent, {"num_generations": 4, "learning_rate": 3e-4, "beta": 0.0, "temperature": 0.7,
                                       "seed": 3, "max_steps": 9, "epsilon": "wide"},
                              capacity=("num_generations", "learning_rate"), regularisation=("beta", "temperature"))
    assert params == {"num_generations": 8, "learning_rate": 3e-4, "beta": 0.0, "temperature": 0.7}
    assert any("kept num_generations at 8" in n for n in notes)
    assert sum("not a searched parameter" in n for n in notes) == 3  # seed, max_steps, epsilon (not searched here)
    params, notes = constrain({"num_generations": 2}, {"num_generations": 5.6}, capacity=("num_generations",),
                              regularisation=())
    assert params == {"num_generations": 6}  # rounded: an integer field
    # a parent above the bounds (learning_rate 2 > 1): the clipped proposal would lower it, so the parent's is kept
    params, notes = constrain({"learning_rate": 2.0}, {"learning_rate": 3.0}, capacity=("learning_rate",),
                              regularisation=())
    assert params == {"learning_rate": 2.0} and "capacity never decreases" in notes[0]
    params, notes = constrain({"beta": 0.1}, {"beta": float("inf")}, capacity=(), regularisation=("beta",))
    assert params == {"beta": 0.1} and "not a finite number" in notes[0]


def test_llm_answers_are_parsed_from_the_first_json_list():
    text = 'Plan: [1, 2] is not it. [{"changes": {"beta": 0.01}, "rationale": "r"}]'
    assert proposals_from_text(text) == [{"changes": {"beta": 0.01}, "rationale": "r"}]
    assert proposals_from_text("[{broken") == [] and proposals_from_text("") == []


# ---------------------------------------------------------------- the outer loop with stubs


def shrinking_proposer(context):
    """A stub proposer that tries to shrink every capacity parameter, moves the regularisation ones both ways and
    touches fields it may not."""
    p = context["params"]
    return [
        {"changes": {"num_generations": max(p["num_generations"] // 2, 2), "learning_rate": p["learning_rate"] / 2,
                     "max_completion_length": p["max_completion_length"] - 1, "beta": p["beta"] + 0.02,
                     "seed": 123, "output_dir": "/elsewhere"}, "rationale": "shrink"},
        {"changes": {"num_generations": p["num_generations"] * 2, "beta": max(p["beta"] - 0.01, 0.0),
                     "temperature": p["temperature"] * 0.9}, "rationale": "grow"},
    ][: context["k"]]


def test_search_with_a_stub_proposer_keeps_capacity_monotone_and_changes_only_allowed_fields(tmp_path):
    config = make_config(tmp_path, search_budget=7)
    scores = [0.1, 0.3, 0.2, 0.5, 0.4, 0.35, 0.6]
    stage = fake_stage(scores)
    built = []

    def runner(node, parent):
        built.append(stage_config(config, node["params"], output_dir=node["checkpoint"], max_steps=1))
        return stage(node, parent)

    tree = run_search(RunArguments(method="llmzero"), config, ModelConfig(), proposer=shrinking_proposer,
                      stage_runner=runner)
    nodes = tree["nodes"]
    assert len([n for n in nodes if n["status"] == "done"]) == 7
    # UCB trains the root, then both of its (unvisited) children before going deeper
    assert stage.calls[:3] == [0, 1, 2]
    searched = {*SEARCHED}
    by_id = {n["id"]: n for n in nodes}
    for node in nodes:
        path, current = [], node
        while current is not None:
            path.append(current["params"])
            current = by_id.get(current["parent"])
        assert capacity_is_monotone(path[::-1], CAPACITY_PARAMS), node
        assert set(node["params"]) == searched
    # the stage configs differ from the given config only in searched fields (and where the stage writes, how long)
    base = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    for stage_cfg in built:
        changed = {name for name, value in base.items() if getattr(stage_cfg, name) != value}
        assert changed <= searched | {"output_dir", "max_steps"}, changed
        assert stage_cfg.seed == config.seed
    shrink = next(n for n in nodes if n["transition"].get("rationale") == "shrink")
    assert shrink["params"]["num_generations"] == 2 and shrink["params"]["learning_rate"] == 1e-4  # kept
    assert shrink["params"]["beta"] == pytest.approx(0.02)  # regularisation moved
    assert any("capacity never decreases" in note for note in shrink["transition"]["notes"])
    assert any("ignored seed" in note for note in shrink["transition"]["notes"])
    betas = [n["params"]["beta"] for n in nodes]
    assert max(betas) > 0.0 and any(b < a for a, b in itertools.pairwise(betas))  # beta moves both ways
    assert tree["best"]["score"] == 0.6 and tree["best_path"][0] == 0
    on_disk = read_json(tmp_path / "search" / SEARCH_TREE)
    assert on_disk["nodes"] == nodes


def test_num_generations_the_batch_cannot_hold_is_dropped(tmp_path):
    # per_device_train_batch_size 4 holds 2 or 4 episodes per task, not 8: the config refuses the child
    config = make_config(tmp_path, per_device_train_batch_size=4, num_generations=4, search_budget=2)

    def grow(context):
        return [{"changes": {"num_generations": 8}, "rationale": "too many"}, {"changes": {"beta": 0.01}}]

    tree = run_search(RunArguments(method="llmzero"), config, ModelConfig(), proposer=grow,
                      stage_runner=fake_stage([0.1, 0.2]))
    root = tree["nodes"][0]
    assert [n["params"]["beta"] for n in tree["nodes"][1:]] == [0.01]
    assert any("the config refuses it" in note for note in root["proposal_notes"])


def test_a_killed_search_resumes_where_it_stopped(tmp_path):
    config = make_config(tmp_path, search_budget=5)
    scores = [0.1, 0.3, 0.2, 0.5, 0.4]
    first = fake_stage(scores)

    def dying(node, parent):
        if len(first.calls) == 3:
            raise KeyboardInterrupt  # killed during the 4th stage
        return first(node, parent)

    with pytest.raises(KeyboardInterrupt):
        run_search(RunArguments(method="llmzero"), config, ModelConfig(), proposer=shrinking_proposer,
                   stage_runner=dying)
    stored = read_json(tmp_path / "search" / SEARCH_TREE)
    assert [n["status"] for n in stored["nodes"]].count("done") == 3
    assert [n["status"] for n in stored["nodes"]].count("running") == 1
    killed = next(n["id"] for n in stored["nodes"] if n["status"] == "running")
    second = fake_stage(scores)
    tree = run_search(RunArguments(method="llmzero"), config, ModelConfig(), proposer=shrinking_proposer,
                      stage_runner=second)
    assert second.calls[0] == killed and len(second.calls) == 2  # the killed stage again, then one more
    assert len(set(first.calls + second.calls)) == 5  # no stage trained twice but the killed one
    # the uninterrupted search makes the same tree
    other = make_config(tmp_path / "other", search_budget=5)
    whole = run_search(RunArguments(method="llmzero"), other, ModelConfig(), proposer=shrinking_proposer,
                       stage_runner=fake_stage(scores))
    assert [n["params"] for n in whole["nodes"]] == [n["params"] for n in tree["nodes"]]
    assert [n["status"] for n in whole["nodes"]] == [n["status"] for n in tree["nodes"]]
    # a different root config in the same directory is refused
    with pytest.raises(ValueError, match="other settings"):
        run_search(RunArguments(method="llmzero"), make_config(tmp_path, learning_rate=2e-4), ModelConfig(),
                   proposer=shrinking_proposer, stage_runner=second)


def test_a_failing_child_is_recorded_and_a_failing_root_is_raised(tmp_path):
    config = make_config(tmp_path, search_budget=3)
    stage = fake_stage([0.1, 0.2, 0.3])

    def flaky(node, parent):
        if node["id"] == 1:
            raise RuntimeError("out of memory\ntraceback")
        return stage(node, parent)

    tree = run_search(RunArguments(method="llmzero"), config, ModelConfig(), stage_runner=flaky)
    assert tree["nodes"][1]["status"] == "failed" and tree["nodes"][1]["error"] == "RuntimeError: out of memory"
    assert tree["nodes"][2]["status"] == "done"

    def broken(node, parent):
        raise ValueError("bad root")

    with pytest.raises(ValueError, match="bad root"):
        run_search(RunArguments(method="llmzero"), make_config(tmp_path / "b"), ModelConfig(), stage_runner=broken)
    assert read_json(tmp_path / "b" / "search" / SEARCH_TREE)["nodes"][0]["status"] == "proposed"


def test_settings_are_checked_in_one_line(tmp_path):
    for kwargs, message in [
        ({"children_per_node": 0}, "children_per_node must be an integer >= 1"),
        ({"ucb_c": -1.0}, "ucb_c must be a finite number >= 0"),
        ({"proposer": "llm"}, "proposer='llm' needs proposer_url"),
        ({"search_selection": "random"}, "search_selection must be one of"),
        ({"search_metric": "episode_length"}, "search_metric must be one of"),
        ({"capacity_params": ["beta"]}, "beta listed in both"),
    ]:
        with pytest.raises(ValueError, match=message):
            make_config(tmp_path, **kwargs)
    config = make_config(tmp_path, regularisation_params=["betta"])
    with pytest.raises(ValueError, match="'betta' is not a field of LLMZeroConfig. Did you mean 'beta'"):
        run_search(RunArguments(method="llmzero"), config, ModelConfig(), stage_runner=fake_stage([0.0]))
    with pytest.raises(ValueError, match="not a number"):
        run_search(RunArguments(method="llmzero"), make_config(tmp_path, regularisation_params=["lr_scheduler_type"]),
                   ModelConfig(), stage_runner=fake_stage([0.0]))
    with pytest.raises(ValueError, match="use_peft"):
        run_search(RunArguments(method="llmzero"), make_config(tmp_path), ModelConfig(use_peft=True),
                   stage_runner=fake_stage([0.0]))


# ---------------------------------------------------------------- the LLM proposer over a loopback server


class ProposerServer(LoopbackHTTPServer):
    """An OpenAI-compatible server on 127.0.0.1 whose chat answers are `answer` (a text), after `overloaded` answers
    503 (a loaded server)."""

    def __init__(self, answer: str, overloaded: int = 0):
        super().__init__()
        self.answer, self.requests, self.overloaded = answer, [], overloaded

    def handle(self, method, target, headers, body):
        if method == "GET" and target == "/v1/models":
            return 200, {}, {"object": "list", "data": [{"id": "loopback-proposer", "object": "model"}]}
        payload = json.loads(body)
        self.requests.append((target, payload))
        if len(self.requests) <= self.overloaded:
            raise RequestError(503, "overloaded", headers={"Retry-After": "0"})
        return 200, {}, {"choices": [{"message": {"role": "assistant", "content": self.answer}}]}


def test_llm_proposer_through_a_loopback_endpoint(tmp_path):
    answer = ('Here you are: [{"changes": {"num_generations": 1, "temperature": 0.8}, "rationale": "cool down"}, '
              '{"changes": {"learning_rate": 0.0002, "beta": 0.01}, "rationale": "push"}]')
    with ProposerServer(answer) as server:
        config = make_config(tmp_path, search_budget=3, proposer="llm", proposer_url=server.url)
        tree = run_search(RunArguments(method="llmzero"), config, ModelConfig(), stage_runner=fake_stage([0.1] * 3))
    target, payload = server.requests[0]
    assert target == "/v1/chat/completions" and payload["model"] == "loopback-proposer"
    assert payload["temperature"] == 0.0 and payload["max_tokens"] == 1024
    shown = json.loads(payload["messages"][1]["content"])
    assert shown["params"]["num_generations"] == 2 and [p["name"] for p in shown["pathologies"]] == [
        "zero_advantage"]
    assert "capacity parameters never decrease" in payload["messages"][0]["content"]
    children = tree["nodes"][1:]
    assert [c["transition"]["rationale"] for c in children] == ["cool down", "push"]
    assert all(c["transition"]["proposer"] == "llm" for c in children)
    assert children[0]["params"]["num_generations"] == 2  # the LLM's 1 was below the parent's 2: kept
    assert children[0]["params"]["temperature"] == 0.8 and children[1]["params"]["learning_rate"] == 2e-4


def test_llm_proposer_retries_a_loaded_endpoint():
    answer = '[{"changes": {"temperature": 0.8}, "rationale": "cool down"}]'
    context = {"params": {"temperature": 1.0, "num_generations": 2}, "pathologies": [
        {"name": "zero_advantage", "evidence": ""}], "k": 1, "capacity": CAPACITY_PARAMS,
        "regularisation": REGULARISATION_PARAMS}
    with ProposerServer(answer, overloaded=2) as server:  # two 503s (Retry-After: 0), then the answer
        proposals = LLMProposer(server.url, "loopback-proposer", timeout=5)(context)
    assert len(server.requests) == 3 and proposals[0]["proposer"] == "llm"
    assert proposals[0]["changes"] == {"temperature": 0.8}
    with ProposerServer(answer, overloaded=10) as server:  # still 503 after the 4 attempts: the rules
        proposals = LLMProposer(server.url, "loopback-proposer", timeout=5)(context)
    assert len(server.requests) == 4
    assert proposals[0]["proposer"].startswith("rules (llm fallback: HTTPError: HTTP Error 503")
    assert "(after 4 attempts)" in proposals[0]["proposer"]


def test_llm_proposer_falls_back_to_the_rules_and_an_unreachable_one_fails_first(tmp_path):
    with ProposerServer("I would lower the learning rate.") as server:
        proposer = LLMProposer(server.url, timeout=5)
        proposer.probe()
        context = {"params": {"temperature": 1.0, "num_generations": 2}, "pathologies": [
            {"name": "zero_advantage", "evidence": ""}], "k": 1, "capacity": CAPACITY_PARAMS,
            "regularisation": REGULARISATION_PARAMS}
        proposals = proposer(context)
    assert proposals[0]["changes"] == {"num_generations": 4, "temperature": 1.1}
    assert proposals[0]["proposer"].startswith("rules (llm fallback: no JSON list")
    with ProposerServer("") as server:
        url = server.url
    config = make_config(tmp_path, proposer="llm", proposer_url=url)  # the server is gone
    with pytest.raises(JudgeUnavailable, match="the proposer endpoint .* did not answer"):
        run_search(RunArguments(method="llmzero"), config, ModelConfig(), stage_runner=fake_stage([0.0]))


# ---------------------------------------------------------------- registry and CLI


def test_registered_and_listed():
    method = METHODS["llmzero"]
    assert method.trainer_class is LLMZeroTrainer and method.paper == "arXiv 2606.18388"
    assert method.hook == "controller (outer loop)" and method.topology == "independent"
    assert issubclass(method.config_class, SearchArguments)


def test_cli_train_with_llmzero_runs_the_search_and_search_wraps_any_config(monkeypatch, tmp_path):
    seen = {}

    def fake_search(run, config, model_args, search=None):
        seen.update(run=run, config=config, search=search)
        return {"nodes": []}

    monkeypatch.setattr("trl_agents.search.run_search", fake_search)
    main(["train", "--config", TINY, "--output_dir", str(tmp_path / "a"), "--search_budget", "5"])
    assert seen["run"].method == "llmzero" and seen["config"].search_budget == 5 and seen["search"] is None
    # `search` around another method's config: the controller's fields come from SearchArguments
    bpo = os.path.join(ROOT, "configs", "bpo_frozenlake_tiny.yaml")
    main(["search", "--config", bpo, "--output_dir", str(tmp_path / "b"), "--stages", "4", "--children=2",
          "--stage_steps", "3"])
    assert seen["run"].method == "bpo" and type(seen["config"]).__name__ == "BPOConfig"
    assert (seen["search"].search_budget, seen["search"].children_per_node, seen["search"].stage_steps) == (4, 2, 3)
    with pytest.raises(SystemExit, match="trl-agents search: give --config"):
        main(["search", "--stages", "2"])
    with pytest.raises(SystemExit, match="trl-agents search: error: search_budget must be an integer >= 1"):
        main(["search", "--config", bpo, "--stages", "0"])


# ---------------------------------------------------------------- a real search on the tiny setting


@pytest.mark.slow
def test_tiny_search_runs_two_stages_from_the_parent_checkpoint(tmp_path):
    # root stage (tiny model built, 1 RL step, evaluated before/after on 4 held-out maps), then its 2 children, each
    # 1 RL step from the root's checkpoint with the rule proposer's transitions: 3 stages, depth 2.
    out = tmp_path / "search"
    main(["search", "--config", TINY, "--output_dir", str(out), "--stages", "3", "--children", "2",
          "--stage_steps", "1", "--num_eval_tasks", "4", "--max_turns", "2", "--num_train_tasks", "16"])
    nodes = read_json(out / SEARCH_TREE)["nodes"]
    assert [n["status"] for n in nodes] == ["done"] * 3 and [n["depth"] for n in nodes] == [0, 1, 1]
    root, children = nodes[0], nodes[1:]
    assert root["pathologies"] and all(c["transition"]["changes"] for c in children)  # the rules moved something
    for child in children:
        info = read_json(os.path.join(child["checkpoint"], "run_info.json"))
        assert info["model"] == root["checkpoint"]  # trained from the parent's checkpoint
        assert os.path.isfile(os.path.join(child["checkpoint"], "model.safetensors"))
        assert capacity_is_monotone([root["params"], child["params"]])
        assert child["score_before"] == root["score"]  # greedy evaluation of the same weights on the same maps
        assert child["summary"]["steps"] == 1 and math.isfinite(child["score"])
