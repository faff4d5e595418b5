"""Every YAML in configs/ parses for its method (unknown keys or wrong types fail here, not on a GPU)."""

from __future__ import annotations

import glob
import os

import pytest
import yaml

from trl_agents.cli import main

CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "*.yaml")))


def test_there_are_configs():
    names = {os.path.basename(p) for p in CONFIGS}
    assert {"quickstart.yaml", "gigpo_sokoban.yaml", "grpo_sokoban.yaml", "gigpo_sokoban_tiny.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_parses(path):
    from trl import ModelConfig, TrlParser

    from trl_agents.run import RunArguments
    from trl_agents.trainers import get_method

    with open(path) as handle:
        method = get_method(yaml.safe_load(handle)["method"])
    run, config, model = TrlParser((RunArguments, method.config_class, ModelConfig)).parse_args_and_config(
        ["--config", path]
    )
    assert config.env_name and (run.tiny_model or model.model_name_or_path)
    # the env a config names has what its method needs (the trainer would refuse it at start-up otherwise)
    from trl_agents.envs import get_env_class

    missing = set(method.env_capabilities) - get_env_class(config.env_name).capabilities()
    assert not missing, f"{os.path.basename(path)}: {config.env_name} lacks {missing} needed by {method.name}"


@pytest.mark.slow
def test_tiny_sokoban_config_runs(tmp_path):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "gigpo_sokoban_tiny.yaml")
    main(["train", "--config", path, "--output_dir", str(tmp_path), "--max_steps", "1", "--warm_start_steps", "10",
          "--num_eval_tasks", "10", "--disable_tqdm", "true"])
    assert os.path.exists(tmp_path / "eval_results.json")
