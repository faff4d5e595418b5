"""One run per output folder (issue 29, item 3): `trl_agents.runlock`, `AgentGRPOTrainer.train()` and `trl-agents
train` refuse a second run into a folder in use, with one line naming the folder and the process holding it; a lock
left by a dead process is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import checkout_env

from trl_agents.runlock import LOCK_NAME, OutputDirInUse, acquire, hold_output_dir, release
from trl_agents.testing import HELD_OPEN_TRAIN

HOLD = """
import sys, time
from trl_agents.runlock import acquire
acquire(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def _holder(folder):
    """A process holding `folder`'s lock (until killed)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], env=checkout_env(), stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_the_lock_is_reentrant_in_a_process_and_gone_after_the_run(tmp_path):
    folder = tmp_path / "run"
    with hold_output_dir(str(folder)):
        holder = json.loads((folder / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] and holder["started"]
        with hold_output_dir(str(folder)):  # trl-agents train holds it; its trainer's train() takes it again
            pass
        assert (folder / LOCK_NAME).exists()
    assert not (folder / LOCK_NAME).exists()


def test_a_second_process_is_refused_naming_the_folder_and_the_holder(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(OutputDirInUse) as refused:
            acquire(str(tmp_path))
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(f"output_dir {str(tmp_path)!r} is in use by another run (pid {holder.pid} on ")
        assert message.endswith("wait for it to end, or pass another --output_dir")
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, caplog):
    holder = _holder(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.pid  # left behind, stale
    with caplog.at_level("WARNING", logger="trl_agents.runlock"):
        key = acquire(str(tmp_path))
    try:
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert f"ended without releasing it (pid {holder.pid} on " in caplog.text
    finally:
        release(key)


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    # Environment workers forked during a run must not hold the folder after the run ends.
    key = acquire(str(tmp_path))
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        release(key)
        holder = _holder(tmp_path)  # another process takes it while the child still lives
        holder.kill()
        holder.wait()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_trainer_train_is_refused_while_another_process_holds_the_folder(tmp_path, tiny_model, tokenizer):
    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.testing import tiny_training_config

    out = tmp_path / "run"
    config = tiny_training_config(AgentGRPOConfig, out, env_name="frozenlake", max_turns=2, max_steps=1)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, processing_class=tokenizer,
                               train_dataset=[{"env": "frozenlake", "seed": seed} for seed in range(8)])
    holder = _holder(out)
    try:
        with pytest.raises(OutputDirInUse, match=f"pid {holder.pid}"):
            trainer.train()
    finally:
        holder.kill()
        holder.wait()
    assert sorted(os.listdir(out)) == [LOCK_NAME]  # nothing written: not even run_info.json
    trainer.train()  # the holder is gone: the lock it left is taken over
    assert trainer.state.global_step == 1 and not (out / LOCK_NAME).exists()


# ---- through the CLI --------------------------------------------------------------------------------------------

TRAIN = [sys.executable, "-m", "trl_agents.cli", "train", "--config", "gigpo_sokoban_tiny", "--max_steps", "3",
         "--save_strategy", "steps", "--save_steps", "1", "--num_train_tasks", "40", "--num_eval_tasks", "4",
         "--warm_start_steps", "0"]


# The CLI, holding its job open (in the plot of its learning curve, after training) until the RELEASE file exists: the
# second run meets a run in progress however slowly either starts.
HELD_OPEN = HELD_OPEN_TRAIN


@pytest.mark.slow
def test_a_second_cli_run_into_a_folder_in_use_is_refused_and_the_first_is_intact(tmp_path):
    from trl_agents.records import load_trajectories

    out, release = tmp_path / "run", tmp_path / "release"
    env = checkout_env({**os.environ, "HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
                        "OMP_NUM_THREADS": "1", "RELEASE": str(release)})
    first = subprocess.Popen([sys.executable, "-c", HELD_OPEN, *TRAIN[4:], "--output_dir", str(out), "--seed", "0"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "run_info.json").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the first run is training
        second = subprocess.run([*TRAIN, "--output_dir", str(out), "--seed", "1"], env=env, capture_output=True,
                                text=True, timeout=600, check=False)
    finally:
        release.touch()
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith(f"trl-agents train: error: output_dir {str(out)!r} is in use by another run (pid "
                           f"{first.pid} on ")
    # The first run's records are whole: every step once, its seed, one run id.
    rows = load_trajectories(str(out))
    assert sorted(set(rows["global_step"])) == [0, 1, 2] and len(os.listdir(out / "trajectories")) == 3
    assert len(set(rows["run_id"])) == 1
    assert json.loads((out / "run_info.json").read_text())["config"]["seed"] == 0
    assert json.loads((out / "eval_results.json").read_text())["seed"] == 0
    assert not (out / LOCK_NAME).exists()
