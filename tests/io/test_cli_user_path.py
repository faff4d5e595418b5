"""The command line as a pip user meets it: packaged configs by name (`--config grpo_sokoban`, `trl-agents configs`),
`train` that will not silently run the quickstart, `--help`, `--version` and `trl-agents env` for bug reports."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from helpers import cli_error_line

from trl_agents import __version__
from trl_agents.cli import COMMANDS, main, packaged_configs, resolve_config


def _error_line(capsys, argv) -> str:
    return cli_error_line(capsys, argv)


@pytest.fixture
def captured(monkeypatch):
    """What `trl-agents train` / `search` would run with: their entry points record the parsed settings instead."""
    runs = []
    monkeypatch.setattr("trl_agents.run.run_training", lambda *parsed: runs.append(parsed))
    monkeypatch.setattr("trl_agents.search.run_search", lambda *parsed: runs.append(parsed))
    return runs


# ---- packaged configs by name


def test_a_config_name_resolves_to_the_packaged_file_and_a_real_path_wins(tmp_path, monkeypatch):
    packaged = resolve_config("gigpo_sokoban_tiny")
    assert os.path.isabs(packaged) and packaged.endswith(os.path.join("configs", "gigpo_sokoban_tiny.yaml"))
    assert resolve_config("gigpo_sokoban_tiny.yaml") == packaged
    assert resolve_config("ddp", kinds=("accelerate",)).endswith(os.path.join("accelerate", "ddp.yaml"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gigpo_sokoban_tiny.yaml").write_text("method: grpo\n")
    assert resolve_config("gigpo_sokoban_tiny.yaml") == "gigpo_sokoban_tiny.yaml"


def test_train_and_search_take_a_config_name(captured):
    main(["train", "--config", "gigpo_sokoban_tiny", "--max_steps", "1"])
    run, config, model = captured.pop()
    assert run.method == "gigpo" and run.tiny_model and config.env_name == "sokoban" and config.max_steps == 1
    main(["train", "--config=grpo_sokoban.yaml"])
    run, config, model = captured.pop()
    assert run.method == "grpo" and model.model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    main(["search", "--config", "llmzero_frozenlake_tiny", "--stages", "1"])
    run, config, *_ = captured.pop()
    assert run.method == "llmzero" and config.env_name == "frozenlake"


def test_an_unknown_config_name_proposes_the_closest_and_the_listing(capsys):
    message = _error_line(capsys, ["train", "--config", "gigpo_sokobn"])
    assert "config file not found: gigpo_sokobn" in message and "Did you mean 'gigpo_sokoban'?" in message
    assert "`trl-agents configs` lists the packaged configs" in message
    assert "Did you mean 'llmzero_sokoban'?" in _error_line(capsys, ["search", "--config", "llmzero_sokobn.yaml"])


# ---- train without --config


@pytest.mark.parametrize(("argv", "expected"), [
    (["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--env_name", "sokoban"],
     "--model_name_or_path and --env_name without --config: train would run the quickstart"),
    (["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--env_name", "sokoban"], "(e.g. --config grpo_sokoban)"),
    (["--method", "gigpo"], "(e.g. --config gigpo_sokoban_tiny)"),
    (["--env_name=alfworld", "--method", "gigpo"], "none is packaged for gigpo on alfworld; the closest is"),
    (["--model_name_or_path=Qwen/Qwen3-4B"], "Add --config NAME, a packaged config your flags then override"),
])
def test_train_without_config_refuses_another_model_env_or_method(capsys, captured, argv, expected):
    message = _error_line(capsys, ["train", *argv])
    assert expected in message and "`trl-agents configs` lists them" in message
    assert not captured


def test_train_without_config_still_runs_the_quickstart_with_overrides(captured, capsys):
    main(["train", "--max_steps", "5"])
    run, config, _ = captured.pop()
    assert run.tiny_model and config.env_name == "frozenlake" and config.max_steps == 5
    with pytest.raises(SystemExit):  # a method's options are still one --help away
        main(["train", "--method", "gigpo", "--help"])
    assert capsys.readouterr().out.startswith("usage: trl-agents train") and not captured


# ---- trl-agents configs


def test_configs_lists_every_packaged_config_on_100_columns(capsys):
    main(["configs"])
    listing = capsys.readouterr().out
    lines = listing.splitlines()
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("  ") and line.split()}
    assert set(packaged_configs("training")) | set(packaged_configs("accelerate")) <= set(rows)
    assert rows["gigpo_sokoban_tiny"] == ["gigpo", "sokoban", "tiny", "(built", "in)"]
    assert rows["cast_sokoban"] == ["cast", "sokoban", "Qwen/Qwen3-4B-Instruct-2507"]
    assert "DeepSpeed ZeRO-3" in " ".join(rows["deepspeed_zero3"])  # the first line of the config's header
    assert not set(packaged_configs("training")) & set(packaged_configs("accelerate"))  # a name is one config


def test_configs_prints_the_path_of_one(capsys):
    main(["configs", "--path", "ddp"])
    path = capsys.readouterr().out.strip()
    assert os.path.isabs(path) and os.path.isfile(path) and path.endswith(os.path.join("accelerate", "ddp.yaml"))
    main(["configs", "grpo_sokoban.yaml"])
    assert capsys.readouterr().out.strip() == resolve_config("grpo_sokoban")
    assert "Did you mean 'fsdp'?" in _error_line(capsys, ["configs", "fsdb"])
    message = _error_line(capsys, ["configs", "configs/accelerate/ddp.yaml"])
    assert "give a packaged config's name, not a path" in message


def test_a_listing_piped_into_a_reader_that_stops_is_not_an_error():
    # `trl-agents configs | head -1`: `true` reads nothing and exits, so every write meets a closed pipe
    result = subprocess.run(["bash", "-c", f"'{sys.executable}' -m trl_agents.cli configs | true; "
                             "echo ${PIPESTATUS[0]}"], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "0" and "Broken pipe" not in result.stderr and "Error" not in result.stderr


# ---- --help, --version, env


def test_help_lists_every_command_and_each_has_its_own_help(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--help"])
    assert raised.value.code == 0
    text = capsys.readouterr().out
    for name, description in COMMANDS.items():
        assert f"  {name:<9} {description}" in text
    for name in COMMANDS:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert capsys.readouterr().out.startswith(f"usage: trl-agents {name}"), name
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2 and "commands:" in capsys.readouterr().out
    assert "unknown command 'trian'. Did you mean 'train'?" in _error_line(capsys, ["trian"])


def test_version(capsys):
    main(["--version"])
    assert capsys.readouterr().out == f"trl-agents {__version__}\n"


def test_env_reports_versions_and_whether_a_token_is_set(capsys, monkeypatch):
    import torch
    import trl

    monkeypatch.setattr("huggingface_hub.get_token", lambda: "hf_not_a_real_token")
    main(["env"])
    report = capsys.readouterr().out
    assert "hf_not_a_real_token" not in report and "- Hub token set: yes" in report
    assert f"- trl-agents: {__version__}" in report and f"- TRL: {trl.__version__}" in report
    assert f"- PyTorch: {torch.__version__}" in report
    assert "- CUDA available: " + ("yes" if torch.cuda.is_available() else "no") in report
    for label in ("Platform", "Python", "transformers", "accelerate", "PEFT", "datasets", "huggingface_hub"):
        assert f"- {label}: " in report, label
    assert ("- vLLM: not installed" in report) == (importlib.util.find_spec("vllm") is None)
    assert ("- DeepSpeed: not installed" in report) == (importlib.util.find_spec("deepspeed") is None)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    main(["env"])
    assert "- Hub token set: no" in capsys.readouterr().out


# ---- envs NAME


def test_envs_points_to_a_readme_only_when_the_source_tree_has_it(capsys, monkeypatch, tmp_path):
    main(["envs", "frozenlake"])
    assert "README: envs/frozenlake/README.md (in the source tree)" in capsys.readouterr().out
    monkeypatch.setattr("trl_agents.cli._source_tree", lambda: tmp_path)  # an installed package: no envs/ folder
    main(["envs", "frozenlake"])
    detail = capsys.readouterr().out
    assert "README" not in detail and "capabilities:" in detail and "instructions shown to the policy" in detail
