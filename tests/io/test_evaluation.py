"""Evaluation: unbiased pass@k, a test-time turn budget, eval result files, the `evaluate` metric, `trl-agents eval`."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from trl_agents.cli import main
from trl_agents.envs import get_env_class
from trl_agents.evaluation import (
    EVAL_RESULT_FIELDS,
    eval_result_name,
    evaluate_policy,
    read_eval_results,
    summarize,
    to_eval_result,
    write_eval_result,
)
from trl_agents.metrics import load_metric, metric_path, pass_at_k, pass_at_k_values

# The shared eval result format (issue 6): these keys, in this order, and the metrics under "metrics".
SHARED_FORMAT_KEYS = [
    "name", "env", "split", "num_tasks", "num_episodes", "greedy", "temperature", "num_samples", "max_turns",
    "train_max_turns", "metrics", "model", "config_hash", "created", "trl_agents_version",
]


def keyword_tasks(count, length):
    """test-keyword tasks (tests/conftest.py): an episode lasts `length` turns and succeeds when the last action
    contains an 'a'."""
    return [{"env": "test-keyword", "seed": seed, "length": length} for seed in range(count)]


# ---- pass@k ----------------------------------------------------------------------------------------------------------


def test_pass_at_k_hand_computed():
    assert [pass_at_k(4, 1, k) for k in (1, 2, 3, 4)] == [0.25, 0.5, 0.75, 1.0]
    assert [pass_at_k(4, 0, k) for k in (1, 2, 4)] == [0.0, 0.0, 0.0]
    assert [pass_at_k(4, 4, k) for k in (1, 4)] == [1.0, 1.0]
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)  # big binomials stay exact
    assert pass_at_k_values(1) == [] and pass_at_k_values(2) == [1, 2] and pass_at_k_values(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError, match="1 <= k <= num_samples"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="num_correct"):
        pass_at_k(4, 5, 1)


def test_sampled_evaluation_reports_unbiased_pass_at_k(tokenizer, scripted):
    # 2 tasks x 4 episodes in one generation call: only row 0 (task 0, episode 0) says 'a', so task 0 is solved
    # once in 4 and task 1 never.
    generator = scripted(lambda prompt, call, row, size: "a" if row == 0 else "b")
    result = evaluate_policy(None, tokenizer, "test-keyword", tasks=keyword_tasks(2, length=1), max_turns=1,
                             greedy=False, num_samples=4, generator=generator)
    assert result["num_tasks"] == 2 and result["num_episodes"] == 8 and result["success_rate"] == 1 / 8
    assert (result["pass_at_1"], result["pass_at_2"], result["pass_at_4"]) == (0.125, 0.25, 0.5)
    assert "pass_at_3" not in result  # reported k: powers of two and n (our choice)
    assert result["greedy"] is False and result["num_samples"] == 4 and result["env"] == "test-keyword"


def test_deterministic_sampling_makes_a_sampled_evaluation_independent_of_its_batches(tiny_model, tokenizer):
    # Every request samples from its own seed: the same episodes whatever the generation batch size (with torch's
    # global generator, the draws of a row depend on the rows sampled with it).
    settings = dict(tasks=get_env_class("frozenlake").task_split("eval", 6), max_turns=3, greedy=False,
                    num_samples=2, seed=3, return_rollout=True, deterministic_sampling=True)

    def actions(result):
        return [[step.action_ids for step in t.steps] for t in result["rollout"].trajectories]

    whole = evaluate_policy(tiny_model, tokenizer, "frozenlake", **settings)
    in_threes = evaluate_policy(tiny_model, tokenizer, "frozenlake", batch_size=3, **settings)
    assert actions(whole) == actions(in_threes) and len(actions(whole)) == 12
    other_seed = evaluate_policy(tiny_model, tokenizer, "frozenlake", **{**settings, "seed": 4})
    assert actions(other_seed) != actions(whole)


def test_greedy_evaluation_has_no_pass_at_k(tokenizer, scripted):
    generator = scripted(lambda prompt, call, row, size: "a")
    result = evaluate_policy(None, tokenizer, "test-keyword", tasks=keyword_tasks(3, length=1), max_turns=1,
                             generator=generator, return_rollout=True)
    assert result["success_rate"] == 1.0 and not any(key.startswith("pass_at") for key in result)
    assert summarize(result["rollout"])["success_rate"] == 1.0


# ---- test-time turn budget -------------------------------------------------------------------------------------------


def test_a_turn_budget_larger_than_training_shows_up_in_the_result(tokenizer, scripted):
    """Episodes need 3 turns: at the training budget (2) none succeeds, at the test-time budget (3) all do; the
    result records both budgets and its name tells it apart."""
    generator = scripted(lambda prompt, call, row, size: "a")
    tasks = keyword_tasks(2, length=3)
    at_training = evaluate_policy(None, tokenizer, "test-keyword", tasks=tasks, max_turns=2, train_max_turns=2,
                                  generator=generator)
    larger = evaluate_policy(None, tokenizer, "test-keyword", tasks=tasks, max_turns=3, train_max_turns=2,
                             generator=generator)
    assert at_training["success_rate"] == 0.0 and at_training["episode_length"] == 2.0
    assert larger["success_rate"] == 1.0 and larger["episode_length"] == 3.0
    assert (larger["max_turns"], larger["train_max_turns"]) == (3, 2)
    assert to_eval_result(at_training, model="m")["name"] == "test-keyword-eval-greedy"
    record = to_eval_result(larger, model="m")
    assert record["name"] == "test-keyword-eval-greedy-t3"
    assert (record["max_turns"], record["train_max_turns"]) == (3, 2)


def test_eval_result_names():
    assert eval_result_name("sokoban", "eval", True, 15, 15) == "sokoban-eval-greedy"
    assert eval_result_name("sokoban", "unseen", False, 30, 15) == "sokoban-unseen-sampled-t30"
    assert eval_result_name("sokoban", "eval", True, 30, None) == "sokoban-eval-greedy"  # training budget unknown


# ---- result files ----------------------------------------------------------------------------------------------------


def sampled_result():
    return {"env": "sokoban", "split": "eval", "num_tasks": 100, "num_episodes": 400, "greedy": False,
            "temperature": 0.6, "num_samples": 4, "max_turns": 30, "train_max_turns": 15, "success_rate": 0.41,
            "episode_return": 0.38, "episode_length": 9.2, "valid_action_rate": 0.97, "failed_episodes": 0,
            "pass_at_1": 0.41, "pass_at_2": 0.52, "pass_at_4": 0.6}


def test_eval_result_file_round_trip_in_the_shared_format(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run_info.json").write_text(json.dumps({"method": "gigpo", "config_hash": "0123456789abcdef"}))
    record = to_eval_result(sampled_result(), model=str(run_dir))
    assert list(record) == SHARED_FORMAT_KEYS == list(EVAL_RESULT_FIELDS)
    assert record["name"] == "sokoban-eval-sampled-t30" and record["config_hash"] == "0123456789abcdef"
    assert record["metrics"] == {"success_rate": 0.41, "episode_return": 0.38, "episode_length": 9.2,
                                 "valid_action_rate": 0.97, "pass_at_1": 0.41, "pass_at_2": 0.52, "pass_at_4": 0.6}
    assert record["model"] == str(run_dir) and record["created"].endswith("+00:00") and record["trl_agents_version"]

    path = write_eval_result(run_dir, record)
    assert path == os.path.join(run_dir, "eval", "sokoban-eval-sampled-t30.json")
    assert os.listdir(run_dir / "eval") == ["sokoban-eval-sampled-t30.json"]  # no temporary file left
    assert read_eval_results(run_dir) == [record]
    assert json.loads((run_dir / "eval" / "sokoban-eval-sampled-t30.json").read_text()) == record

    greedy = to_eval_result({**sampled_result(), "greedy": True, "num_samples": 1, "max_turns": 15}, model="hub/id")
    assert greedy["config_hash"] is None and "pass_at_4" in greedy["metrics"]  # (as given)
    write_eval_result(run_dir, greedy)
    updated = dict(record, metrics=dict(record["metrics"], success_rate=0.5))
    write_eval_result(run_dir, updated)  # same name: replaced
    assert read_eval_results(run_dir) == [greedy, updated]  # sorted by name


def test_reading_skips_unfinished_writes_and_reports_broken_files(tmp_path):
    assert read_eval_results(tmp_path) == []
    write_eval_result(tmp_path, to_eval_result(sampled_result(), model="m"))
    (tmp_path / "eval" / ".sokoban-eval-greedy.json.tmp").write_text('{"name": "half')  # a crash mid-write
    assert [r["name"] for r in read_eval_results(tmp_path)] == ["sokoban-eval-sampled-t30"]
    (tmp_path / "eval" / "broken.json").write_text("{")
    with pytest.raises(ValueError, match=r"broken\.json is not a valid eval result"):
        read_eval_results(tmp_path)


def test_writing_a_flat_or_misnamed_result_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"lacks name, .*to_eval_result\(evaluate_policy"):
        write_eval_result(tmp_path, sampled_result())
    with pytest.raises(ValueError, match="lacks num_tasks"):
        to_eval_result({k: v for k, v in sampled_result().items() if k != "num_tasks"}, model="m")
    with pytest.raises(ValueError, match="must be a file name"):
        write_eval_result(tmp_path, to_eval_result(sampled_result(), model="m", name="../escape"))
    assert not (tmp_path / "eval").exists() or os.listdir(tmp_path / "eval") == []


# ---- the `evaluate` metric -------------------------------------------------------------------------------------------


def test_evaluate_metric_loads_offline_and_matches_summarize(tokenizer, scripted):
    import evaluate

    generator = scripted(lambda prompt, call, row, size: "a" if row in (0, 5, 6) else "b")
    result = evaluate_policy(None, tokenizer, "test-keyword", tasks=keyword_tasks(2, length=1), max_turns=1,
                             greedy=False, num_samples=4, generator=generator, return_rollout=True)
    successes = [[t.success for t in group.trajectories] for group in result["rollout"].groups]
    assert successes == [[True, False, False, False], [False, True, True, False]]
    metric = load_metric("agent_success")
    scores = metric.compute(successes=successes)
    for key in ("success_rate", "pass_at_1", "pass_at_2", "pass_at_4"):
        assert scores[key] == pytest.approx(result[key]), key
    assert scores["success_rate_stderr"] == pytest.approx(0.125)  # per-task rates 0.25 and 0.5
    assert metric.compute(successes=successes, k=[3]) == pytest.approx(
        {"success_rate": 0.375, "success_rate_stderr": 0.125, "pass_at_3": (0.75 + 1.0) / 2})
    combined = evaluate.combine([evaluate.load(metric_path("agent_success"))]).compute(successes=successes)
    assert combined["pass_at_4"] == pytest.approx(result["pass_at_4"])
    with pytest.raises(ValueError, match="Unknown trl-agents metric 'accuracy'"):
        metric_path("accuracy")


def test_without_evaluate_the_metric_names_the_extra_and_pass_at_k_still_works(monkeypatch):
    monkeypatch.setitem(sys.modules, "evaluate", None)  # `import evaluate` raises ImportError, as when not installed
    with pytest.raises(ImportError, match=r'needs `evaluate`: pip install "trl-agents\[metrics\]"'):
        load_metric("agent_success")
    assert pass_at_k(4, 1, 2) == 0.5


# ---- trl-agents eval -------------------------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tiny_model_dir, tmp_path):
    """A run directory as training leaves it: the tiny model, agent_config.json (trained at 2 turns) and
    run_info.json."""
    from trl_agents import AgentGRPOConfig
    from trl_agents.testing import tiny_training_config
    from trl_agents.checkpoints import save_agent_config

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run_dir, ignore=shutil.ignore_patterns("eval"))  # (other tests evaluate it)
    trained = tiny_training_config(AgentGRPOConfig, run_dir, env_name="test-keyword", max_turns=2, history_length=1,
                                   max_completion_length=3)
    save_agent_config(trained, str(run_dir))
    (run_dir / "run_info.json").write_text(json.dumps({"method": "grpo", "config_hash": "feedfacecafebeef"}))
    return run_dir


def test_cli_sampled_evaluation_with_a_larger_turn_budget_writes_its_result(checkpoint, tmp_path, capsys):
    output_file = tmp_path / "result.json"
    main(["eval", "--model_name_or_path", str(checkpoint), "--num_eval_tasks", "3", "--greedy", "false",
          "--num_samples", "4", "--max_turns", "4", "--output_file", str(output_file)])
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(output_file.read_text()) == printed  # --output_file keeps the flat result
    assert printed["num_episodes"] == 12 and printed["max_turns"] == 4 and printed["train_max_turns"] == 2
    [record] = read_eval_results(checkpoint)
    assert list(record) == SHARED_FORMAT_KEYS
    assert record["name"] == "test-keyword-eval-sampled-t4" and record["config_hash"] == "feedfacecafebeef"
    assert record["model"] == str(checkpoint) and record["num_samples"] == 4 and not record["greedy"]
    assert set(record["metrics"]) == {"success_rate", "episode_return", "episode_length", "valid_action_rate",
                                      "pass_at_1", "pass_at_2", "pass_at_4"}
    assert record["metrics"]["pass_at_4"] == printed["pass_at_4"]


def test_cli_greedy_and_sampled_in_one_call_into_an_output_dir(checkpoint, tmp_path, capsys):
    other = tmp_path / "elsewhere"
    main(["eval", "--model_name_or_path", str(checkpoint), "--num_eval_tasks", "2", "--modes", "greedy", "sampled",
          "--num_samples", "2", "--output_dir", str(other), "--progress", "false"])
    greedy, sampled = json.loads(capsys.readouterr().out)
    assert greedy["greedy"] and greedy["num_episodes"] == 2 and "pass_at_2" not in greedy
    assert not sampled["greedy"] and sampled["num_episodes"] == 4 and "pass_at_2" in sampled
    assert [r["name"] for r in read_eval_results(other)] == ["test-keyword-eval-greedy", "test-keyword-eval-sampled"]
    assert read_eval_results(checkpoint) == []


def test_cli_eval_errors_name_the_argument(checkpoint):
    with pytest.raises(SystemExit, match="--num_samples > 1 needs sampling: add --greedy false"):
        main(["eval", "--model_name_or_path", str(checkpoint), "--num_samples", "4"])
    with pytest.raises(SystemExit, match="--modes: unknown beam; choose among greedy, sampled"):
        main(["eval", "--model_name_or_path", str(checkpoint), "--modes", "greedy", "beam"])
