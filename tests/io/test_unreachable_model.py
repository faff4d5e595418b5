"""`trl-agents train` with a Hub model it cannot reach (offline, private, misspelled) says so in one line naming the
model, as `eval` does (issue 29, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from trl_agents.cli import packaged_config


def test_train_with_an_unreachable_hub_model_is_one_line_naming_it(tmp_path):
    with open(packaged_config("gigpo_sokoban.yaml")) as handle:
        model = yaml.safe_load(handle)["model_name_or_path"]  # a real Hub model, not in the empty cache below
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"), "TRL_AGENTS_DEBUG": ""}
    result = subprocess.run([sys.executable, "-m", "trl_agents.cli", "train", "--config", "gigpo_sokoban",
                             "--max_steps", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert f"model_name_or_path {model!r}" in lines[0]
    assert "hf auth login" in lines[0] and "HF_HUB_OFFLINE" in lines[0]


def test_a_missing_local_model_folder_is_named(tmp_path):
    from trl import ModelConfig

    from trl_agents import GiGPOConfig
    from trl_agents.run import RunArguments, _load_model

    config = GiGPOConfig(str(tmp_path / "run"), env_name="frozenlake", report_to="none")
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match=rf"^model_name_or_path .{missing}.: no such folder") as info:
        _load_model(RunArguments(), config, ModelConfig(model_name_or_path=missing))
    assert "\n" not in str(info.value)
