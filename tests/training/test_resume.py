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
from trl_agents.checkpoints import (
    CheckpointError,
    check_checkpoint,
    find_corrupt_file,
    finished_message,
    is_disk_full,
    resolve_checkpoint,
)

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


def fake_checkpoint(folder, step: int, max_steps: int = 10) -> str:
    """A small complete checkpoint-{step} in `folder`, written as transformers writes one (weights, optimizer, RNG
    state, trainer_state.json last)."""
    import torch
    from safetensors.torch import save_file

    path = os.path.join(folder, f"checkpoint-{step}")
    os.makedirs(path)
    save_file({"w": torch.zeros(4, 4)}, os.path.join(path, "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.ones(4)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
               os.path.join(path, "optimizer.pt"))
    torch.save({"python": [1, 2, 3], "cpu": torch.zeros(3, dtype=torch.uint8)}, os.path.join(path, "rng_state.pth"))
    with open(os.path.join(path, "trainer_state.json"), "w") as handle:
        json.dump({"global_step": step, "max_steps": max_steps, "num_train_epochs": 1}, handle)
    return path


def test_resume_argument(tmp_path):
    assert resolve_checkpoint(None, str(tmp_path)) is None and resolve_checkpoint("False", str(tmp_path)) is None
    with pytest.raises(ValueError, match="has no checkpoint-\\* folder to resume"):
        resolve_checkpoint("true", str(tmp_path))
    with pytest.raises(ValueError, match="is not a checkpoint folder"):
        resolve_checkpoint(str(tmp_path / "checkpoint-9"), str(tmp_path))
    for step in (2, 10):
        fake_checkpoint(tmp_path, step)
    assert resolve_checkpoint(True, str(tmp_path)) == str(tmp_path / "checkpoint-10")  # the last, by step
    assert resolve_checkpoint("true", str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert resolve_checkpoint(str(tmp_path / "checkpoint-2"), str(tmp_path)) == str(tmp_path / "checkpoint-2")


def test_how_a_run_is_started_is_not_part_of_its_config_hash():
    assert config_hash({"learning_rate": 1e-3, "resume_from_checkpoint": "true"}) == config_hash({"learning_rate": 1e-3})
    assert config_hash({"learning_rate": 1e-3}) != config_hash({"learning_rate": 2e-3})


# ---- incomplete and broken checkpoints (issue 29) ------------------------------------------------------------------


@pytest.mark.parametrize("interrupted", ["empty", "no trainer_state", "truncated trainer_state", "no weights"])
def test_resume_true_skips_an_incomplete_last_checkpoint_with_a_warning_naming_it(tmp_path, caplog, interrupted):
    # A save cut short (a kill, a preemption, a full disk) leaves the last checkpoint without trainer_state.json,
    # which transformers writes last, or with a part of it, or before any weights: `true` takes the one before it.
    fake_checkpoint(tmp_path, 1)
    last = fake_checkpoint(tmp_path, 2)
    if interrupted == "empty":
        for name in os.listdir(last):
            os.remove(os.path.join(last, name))
    elif interrupted == "no trainer_state":
        os.remove(os.path.join(last, "trainer_state.json"))
    elif interrupted == "truncated trainer_state":
        with open(os.path.join(last, "trainer_state.json"), "r+") as handle:
            handle.truncate(10)
    else:
        os.remove(os.path.join(last, "model.safetensors"))
    with caplog.at_level("WARNING", logger="trl_agents.checkpoints"):
        assert resolve_checkpoint("true", str(tmp_path)) == str(tmp_path / "checkpoint-1")
    assert [record.getMessage() for record in caplog.records if "checkpoint-2" in record.getMessage()], caplog.text
    assert "Skipping " + str(tmp_path / "checkpoint-2") in caplog.text
    if interrupted != "truncated trainer_state":  # the same folder named as a path: one line, the earlier one named
        with pytest.raises(CheckpointError, match="checkpoint-1"):
            resolve_checkpoint(last, str(tmp_path))


def test_resume_true_with_no_complete_checkpoint_says_so(tmp_path):
    os.makedirs(tmp_path / "checkpoint-1")
    with pytest.raises(CheckpointError, match="no checkpoint-\\* folder of output_dir .* is complete"):
        resolve_checkpoint(True, str(tmp_path))


def _garbage(path: str) -> None:
    with open(path, "wb") as handle:
        handle.write(b"\x00garbage" * 50)


def _truncate(path: str) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize("name, damage", [
    ("trainer_state.json", _truncate), ("model.safetensors", _truncate), ("model.safetensors", _garbage),
    ("optimizer.pt", _truncate), ("optimizer.pt", _garbage), ("rng_state.pth", _garbage),
])
def test_a_broken_checkpoint_file_is_named_with_the_fix_before_resuming(tmp_path, name, damage):
    fake_checkpoint(tmp_path, 1)
    path = fake_checkpoint(tmp_path, 2)
    damage(os.path.join(path, name))
    with pytest.raises(CheckpointError) as error:
        resolve_checkpoint(path, str(tmp_path))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"checkpoint-2/{name} is corrupt or truncated (")
    assert message.endswith(f"resume from an earlier checkpoint (--resume_from_checkpoint {tmp_path}/checkpoint-1)")


def test_a_torch_file_that_does_not_load_is_named_after_a_failed_resume(tmp_path):
    # A well-formed archive whose pickle transformers' `weights_only` load refuses (a foreign object, or a malicious
    # pickle): the cheap check passes it, the error path finds it.
    import datetime

    import torch

    path = fake_checkpoint(tmp_path, 3)
    assert find_corrupt_file(path) is None
    torch.save({"python": datetime.datetime(2026, 1, 1)}, os.path.join(path, "rng_state.pth"))
    check_checkpoint(path)
    error = find_corrupt_file(path)
    assert str(error).startswith("checkpoint-3/rng_state.pth is corrupt or truncated (UnpicklingError: Weights only")
    assert "none is left: start again without --resume_from_checkpoint" in str(error)


def test_a_finished_checkpoint_has_nothing_to_resume(tmp_path):
    from types import SimpleNamespace

    path = fake_checkpoint(tmp_path, 6, max_steps=6)
    assert finished_message(path, SimpleNamespace(max_steps=7, num_train_epochs=1)) is None
    message = finished_message(path, SimpleNamespace(max_steps=6, num_train_epochs=1))
    assert message.startswith(f"nothing to do: {path} is at step 6, the end of training (max_steps=6)")
    # Epochs: finished at the planned step count, unless more epochs are asked for.
    assert finished_message(path, SimpleNamespace(max_steps=-1, num_train_epochs=1)) is not None
    assert finished_message(path, SimpleNamespace(max_steps=-1, num_train_epochs=2)) is None


@pytest.mark.parametrize("error, full", [
    (OSError(28, "No space left on device"), True),
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 470656 vs 470544"), True),
    (RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })"), True),
    (RuntimeError("CUDA out of memory"), False),
    (OSError(13, "Permission denied"), False),
])
def test_disk_full_errors_are_recognised(tmp_path, error, full):
    assert is_disk_full(error) is full
    wrapped = RuntimeError("while saving")
    wrapped.__cause__ = error
    assert is_disk_full(wrapped) is full
    assert is_disk_full(RuntimeError("basic_ios::clear: iostream error"), str(tmp_path)) is False  # space left here


def test_a_resume_that_does_not_start_puts_the_shards_back(tmp_path):
    # The shards after the checkpoint leave the dataset only once the checkpoint has loaded (on_train_begin), and go
    # back when the resume then fails before its first rollout is recorded (e.g. on a bad rng_state.pth).
    from types import SimpleNamespace

    from trl_agents.callbacks.preemption import ResumeBookkeeping

    for rollout in range(5):
        _shard(tmp_path, rollout, global_step=rollout)
    before = sorted(os.listdir(tmp_path))
    bookkeeping = ResumeBookkeeping(str(tmp_path), resume_step=3, main_process=True)
    bookkeeping.on_train_begin(SimpleNamespace(save_trajectories=True), None, None)
    assert sorted(load_trajectories(str(tmp_path))["global_step"]) == [0, 1, 2]
    bookkeeping.restore()
    assert sorted(os.listdir(tmp_path)) == before
    assert sorted(load_trajectories(str(tmp_path))["global_step"]) == [0, 1, 2, 3, 4]
