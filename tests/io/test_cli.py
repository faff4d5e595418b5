"""The `trl-agents` command line: train writes every output, eval reads the checkpoint back, errors are clear."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from helpers import cli_error_line, TINY_RUN

from trl_agents.cli import main, packaged_config
from trl_agents.evaluation import read_eval_results



def write_config(tmp_path, **overrides):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**TINY_RUN, "output_dir": str(tmp_path / "out"), **overrides}))
    return str(path)


@pytest.mark.slow
def test_train_writes_checkpoint_trajectories_metrics_eval_and_plot(tmp_path, capsys):
    main(["train", "--config", write_config(tmp_path), "--learning_rate", "0.001"])
    out = tmp_path / "out"
    for name in ["config.json", "model.safetensors", "tokenizer_config.json", "metrics.json", "eval_results.json",
                 "learning_curve.png"]:
        assert (out / name).exists(), name
    assert len(list((out / "trajectories").glob("*.parquet"))) == 2
    results = json.loads((out / "eval_results.json").read_text())
    assert results["method"] == "gigpo" and results["rl_steps"] == 2
    assert set(results["eval_before_rl"]) >= {"success_rate", "episode_length", "valid_action_rate"}
    # The after-RL evaluation is also one eval result of the run (the format `trl-agents push` publishes).
    [record] = read_eval_results(out)
    assert record["name"] == "frozenlake-eval-greedy" and record["model"] == str(out)
    assert record["max_turns"] == record["train_max_turns"] == 4 and record["num_tasks"] == 8
    assert record["metrics"]["success_rate"] == results["eval_after_rl"]["success_rate"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["warm_start"]["examples"] == 24 * 6 and len(metrics["warm_start"]["validation_success"]) == 2
    printed = capsys.readouterr().out
    assert "held-out success after warm start" in printed and "held-out success after RL" in printed
    # the compact console: one short line per logging step, not the metrics dict (which metrics.json keeps)
    assert re.search(r"^step 2/2 \| success \d\.\d{3} \| return \S+ \| loss \S+ \| \S+ s/step$", printed, re.M)
    assert "'env/success_rate'" not in printed and "env/success_rate" in metrics["rl"][0]

    agent = json.loads((out / "agent_config.json").read_text())
    assert agent["env_name"] == "frozenlake" and agent["history_length"] == 0 and agent["max_turns"] == 4
    # eval reads the prompting settings from agent_config.json: the same held-out tasks give the same greedy result
    main(["eval", "--model_name_or_path", str(out), "--num_eval_tasks", "8", "--output_file", str(tmp_path / "e.json")])
    evaluated = json.loads((tmp_path / "e.json").read_text())
    assert evaluated["num_tasks"] == 8
    assert evaluated["success_rate"] == results["eval_after_rl"]["success_rate"]
    assert evaluated["episode_length"] == results["eval_after_rl"]["episode_length"]
    # the training run's record is kept; the new one takes the next free name (--overwrite true would replace it)
    assert sorted(r["name"] for r in read_eval_results(out)) == ["frozenlake-eval-greedy", "frozenlake-eval-greedy-2"]


def test_quickstart_config_is_packaged_and_parses():
    from trl import ModelConfig, TrlParser

    from trl_agents import GiGPOConfig
    from trl_agents.run import RunArguments

    path = packaged_config("quickstart.yaml")
    assert os.path.isfile(path)
    run, config, _ = TrlParser((RunArguments, GiGPOConfig, ModelConfig)).parse_args_and_config(["--config", path])
    assert run.method == "gigpo" and run.tiny_model and config.env_name == "frozenlake"
    assert run.time_budget is not None and run.time_budget < 600


def test_wrong_type_on_the_command_line(tmp_path):
    with pytest.raises(SystemExit):  # argparse: "argument --max_turns: invalid int value: 'ten'"
        main(["train", "--config", write_config(tmp_path), "--max_turns", "ten"])


def test_unknown_method_in_the_config(tmp_path):
    with pytest.raises(SystemExit, match="trl-agents train: error: Unknown method 'gipgo'"):
        main(["train", "--config", write_config(tmp_path, method="gipgo")])


def test_missing_config_file(tmp_path):
    with pytest.raises(SystemExit, match="config file not found"):
        main(["train", "--config", str(tmp_path / "nope.yaml")])


def test_envs_and_methods_listings(capsys):
    main(["envs"])
    listing = capsys.readouterr().out
    assert "sokoban" in listing and "solver_value" in listing and "frozenlake" in listing
    main(["methods"])
    listing = capsys.readouterr().out
    assert "gigpo" in listing and "GiGPOTrainer" in listing and "rloo" in listing
    assert "max_staleness: 0 (on-policy: the paper keeps every update strictly on-policy" in listing  # CANOPY
    assert listing.count("max_staleness: 1 (one-step-off training accepted") >= 19


def test_envs_detail_and_unknown_name(capsys):
    main(["envs", "frozenlake"])
    detail = capsys.readouterr().out
    assert "capabilities: optimal_plan, restore, snapshot, solver_value, state_key" in detail
    assert "splits: train, eval" in detail and "instructions shown to the policy" in detail
    assert "README: envs/frozenlake/README.md" in detail
    with pytest.raises(SystemExit, match="Did you mean 'sokoban'"):
        main(["envs", "sokobn"])


def test_every_env_names_an_existing_readme(capsys):
    from trl_agents.envs import list_envs

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    builtin = ["alfworld", "dealnodeal", "frozenlake", "gymnasium", "minesweeper", "openenv", "rushhour",
               "scienceworld", "searchqa", "sokoban", "textarena", "textcraft", "textworld", "trl-environment",
               "webshop", "webshop-lite", "telesales", "corridor"]
    assert set(builtin) <= set(list_envs())  # other tests register more; these ship with the library
    for name in builtin:
        main(["envs", name])
        readme = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("README: "))
        assert os.path.exists(os.path.join(root, readme.split()[1])), readme


# ---- first contact: every mistake below is one line that names the key and the fix (no traceback, no usage dump)


def _error_line(capsys, argv) -> str:
    return cli_error_line(capsys, argv)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["--num_generations", "0"], "num_generations must be >= 2"),
    (["--per_device_train_batch_size", "6"], "must be a multiple of num_generations=4"),
    (["--learning_rate", "abc"], "invalid float value: 'abc'"),
    (["--leanring_rate", "0.1"], "unknown key 'leanring_rate' in the command line. Did you mean 'learning_rate'?"),
    (["--num_train_tasks", "0"], "has no tasks (num_train_tasks=0)"),
    (["--train_split", "nosuch"], "Unknown FrozenLake split 'nosuch'"),
])
def test_bad_settings_are_one_line_errors_and_leave_no_output_dir(tmp_path, capsys, overrides, expected):
    message = _error_line(capsys, ["train", "--config", write_config(tmp_path), *overrides])
    assert expected in message
    assert not (tmp_path / "out").exists()  # nothing written before the settings were known to be good


def test_a_method_refuses_a_value_for_a_field_it_fixes(tmp_path, capsys):
    # grpo_opsd is SDAR with the gate off (sdar_gate_beta = 0): a config that sets the gate would run gated SDAR
    # recorded as grpo_opsd. The SDAR tiny config sets sdar_gate_beta 5.0.
    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "sdar_searchqa_tiny.yaml")
    message = _error_line(capsys, ["train", "--config", config, "--method", "grpo_opsd"])
    assert "method 'grpo_opsd' fixes sdar_gate_beta=0.0" in message and "sdar_gate_beta=5.0" in message
    assert "--method sdar" in message
    message = _error_line(capsys, ["train", "--config", write_config(tmp_path, method="dr_grpo"), "--loss_type", "dapo"])
    assert "method 'dr_grpo' fixes loss_type='dr_grpo'" in message
    assert not (tmp_path / "out").exists()


def test_bad_config_files_are_one_line_errors(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("method: gigpo\nenv_name: [frozenlake\nmax_steps: 2\n")
    assert "not valid YAML: line 3, column 10" in _error_line(capsys, ["train", "--config", str(broken)])
    typo = write_config(tmp_path, lernrate=1)
    assert "unknown key 'lernrate' in the config file" in _error_line(capsys, ["train", "--config", typo])
    (tmp_path / "file").write_text("x")
    assert "is a file" in _error_line(capsys, ["train", "--config", write_config(tmp_path, output_dir=str(tmp_path / "file"))])


def test_eval_of_a_missing_checkpoint_and_the_subcommands_help(tmp_path, capsys):
    missing = str(tmp_path / "nope")
    assert "no such directory" in _error_line(capsys, ["eval", "--model_name_or_path", missing])
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert capsys.readouterr().out.startswith("usage: trl-agents eval")
    with pytest.raises(SystemExit):
        main(["methods", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: trl-agents methods") and "GiGPOTrainer" not in out
