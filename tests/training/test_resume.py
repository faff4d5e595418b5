"""Resuming a killed run: `trl-agents train --resume_from_checkpoint` continues at the next step, as if never killed.

The end-to-end check kills a CLI run with SIGKILL right after a checkpoint, resumes it through the CLI, and compares
it with an uninterrupted run of the same config and seed: the losses and rewards of every step, and the trajectory
rows (none lost, none repeated). The pieces are checked on their own below it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers import dying_shard_writer
from helpers import TINY_RUN

from trl_agents.records import TRAJECTORY_SCHEMA, config_hash, load_trajectories, supersede_shards
from trl_agents.checkpoints import resolve_checkpoint

RUN = {**TINY_RUN, "max_steps": 5, "save_strategy": "steps", "save_steps": 1, "seed": 3}


def _train(config_path: str, *extra: str, wait: bool = True):
    command = [sys.executable, "-m", "trl_agents.cli", "train", "--config", config_path, *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    if wait:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _config(tmp_path, name: str) -> tuple[str, str]:
    out = str(tmp_path / name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**RUN, "output_dir": out}))
    return str(path), out


def _steps(out: str) -> list[tuple[int, float, float]]:
    history = json.load(open(os.path.join(out, "metrics.json")))["rl"]
    return [(entry["step"], entry["loss"], entry["reward"]) for entry in history if "loss" in entry]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The output_dir of the uninterrupted run both kills are compared with."""
    config_a, out_a = _config(tmp_path_factory.mktemp("straight"), "straight")
    done = _train(config_a)
    assert done.returncode == 0, done.stderr[-2000:]
    return out_a


def _same_as_uninterrupted(out_a: str, out_b: str) -> None:
    # Every step's loss and reward, the ones before the kill (from the checkpoint's state) and after it.
    assert [step for step, _, _ in _steps(out_b)] == [1, 2, 3, 4, 5]
    assert _steps(out_b) == _steps(out_a)
    # The trajectory rows: each rollout once, the same episodes as the uninterrupted run, one config hash.
    rows_a, rows_b = load_trajectories(out_a), load_trajectories(out_b)
    columns = ["rollout", "global_step", "episode_uid", "step", "action_ids", "reward", "advantage"]
    assert rows_b.select_columns(columns).to_list() == rows_a.select_columns(columns).to_list()
    assert sorted(set(rows_b["global_step"])) == [0, 1, 2, 3, 4] and len(set(rows_b["config_hash"])) == 1
    results = json.load(open(os.path.join(out_b, "eval_results.json")))
    assert results["rl_steps"] == 5
    assert results["eval_before_rl"] == json.load(open(os.path.join(out_a, "eval_results.json")))["eval_before_rl"]


@pytest.mark.slow
def test_a_killed_cli_run_resumes_at_the_next_step_as_if_never_killed(tmp_path, straight):
    out_a = straight

    config_b, out_b = _config(tmp_path, "killed")
    process = _train(config_b, wait=False)
    state = os.path.join(out_b, "checkpoint-2", "trainer_state.json")
    deadline = time.monotonic() + 300
    while not os.path.isfile(state) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not os.path.isfile(os.path.join(out_b, "eval_results.json"))
    killed_at = max(int(name.split("-")[1]) for name in os.listdir(out_b) if name.startswith("checkpoint-"))
    hash_before = json.load(open(os.path.join(out_b, "run_info.json")))["config_hash"]

    resumed = _train(config_b, "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "warm start skipped" in resumed.stdout  # the checkpoint holds the weights: no second warm start
    assert json.load(open(os.path.join(out_b, "run_info.json")))["config_hash"] == hash_before

    _same_as_uninterrupted(out_a, out_b)
    assert set(load_trajectories(out_b)["config_hash"]) == {hash_before}
    superseded = os.path.join(out_b, "trajectories", "superseded")
    if os.path.isdir(superseded):  # rollouts the killed run generated after its last checkpoint: kept aside
        for folder in os.listdir(superseded):
            assert folder.startswith(f"resume-{killed_at}-")


# The CLI (`trl_agents.cli.main`), with the parquet writer made to die halfway through the 4th shard (rollout 3,
# generated after checkpoint-3): a crash in the middle of writing a shard.
DYING_CLI = dying_shard_writer(4) + """
import sys
from trl_agents.cli import main
main(["train", "--config", sys.argv[1]])
"""


@pytest.mark.slow
def test_a_cli_run_killed_while_writing_a_shard_resumes_as_if_never_killed(tmp_path, straight):
    config_b, out_b = _config(tmp_path, "killed-mid-write")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    died = subprocess.run([sys.executable, "-c", DYING_CLI, config_b], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert died.returncode == 17, died.stderr[-3000:]
    shards = os.path.join(out_b, "trajectories")
    assert sorted(name.split(".parquet")[0] for name in os.listdir(shards)) == [
        ".shard-000003-rank00", "shard-000000-rank00", "shard-000001-rank00", "shard-000002-rank00"]
    resumed = _train(config_b, "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not [name for name in os.listdir(shards) if name.endswith(".tmp")]  # the half-written shard is gone
    _same_as_uninterrupted(straight, out_b)


def _shard(directory, rollout: int, global_step: int) -> None:
    row = {name: None for name in TRAJECTORY_SCHEMA.names}
    row.update(rollout=rollout, rank=0, global_step=global_step, step=0)
    table = pa.Table.from_pylist([row], schema=TRAJECTORY_SCHEMA)
    pq.write_table(table, os.path.join(directory, f"shard-{rollout:06d}-rank00.parquet"))


def test_resuming_moves_aside_the_shards_after_the_checkpoint(tmp_path):
    # Rollouts 0-4 were generated after 0..4 optimizer steps; the run resumes from checkpoint-3, so rollouts 3 and 4
    # are generated again: their shards leave the dataset (kept in superseded/), and so does an interrupted write.
    for rollout in range(5):
        _shard(tmp_path, rollout, global_step=rollout)
    (tmp_path / ".shard-000005-rank00.parquet.123.456.tmp").write_bytes(b"PAR1")
    moved = supersede_shards(str(tmp_path), 3)
    assert sorted(os.path.basename(path) for path in moved) == ["shard-000003-rank00.parquet",
                                                                "shard-000004-rank00.parquet"]
    assert sorted(os.listdir(tmp_path)) == ["shard-000000-rank00.parquet", "shard-000001-rank00.parquet",
                                            "shard-000002-rank00.parquet", "superseded"]
    assert all(os.path.isfile(path) for path in moved)
    assert sorted(load_trajectories(str(tmp_path))["global_step"]) == [0, 1, 2]
    assert supersede_shards(str(tmp_path), 3) == []  # nothing left to move


def test_resume_argument(tmp_path):
    assert resolve_checkpoint(None, str(tmp_path)) is None and resolve_checkpoint("False", str(tmp_path)) is None
    with pytest.raises(ValueError, match="has no checkpoint-\\* folder to resume"):
        resolve_checkpoint("true", str(tmp_path))
    with pytest.raises(ValueError, match="is not a checkpoint folder"):
        resolve_checkpoint(str(tmp_path / "checkpoint-9"), str(tmp_path))
    for step in (2, 10):
        os.makedirs(tmp_path / f"checkpoint-{step}")
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert resolve_checkpoint(True, str(tmp_path)) == str(tmp_path / "checkpoint-10")  # the last, by step
    assert resolve_checkpoint("true", str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert resolve_checkpoint(str(tmp_path / "checkpoint-2"), str(tmp_path)) == str(tmp_path / "checkpoint-2")


def test_how_a_run_is_started_is_not_part_of_its_config_hash():
    assert config_hash({"learning_rate": 1e-3, "resume_from_checkpoint": "true"}) == config_hash({"learning_rate": 1e-3})
    assert config_hash({"learning_rate": 1e-3}) != config_hash({"learning_rate": 2e-3})
