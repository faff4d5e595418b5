"""Preemption, a full disk, broken checkpoints and finished runs, through `trl-agents train` as a user runs it (issue 29:
items 2, 4 and 5).

Every case runs the CLI in a subprocess (this checkout's trl_agents, HOME a temporary folder) on the tiny Sokoban
config, 4 steps with a checkpoint after each, and compares the trajectory rows with those of an uninterrupted run of
the same seed (`finished`): no row lost, none repeated.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import checkout_env

from trl_agents.records import load_trajectories
from trl_agents.testing import failing_save_train

STEPS = 4
TRAIN = ["-m", "trl_agents.cli", "train", "--config", "gigpo_sokoban_tiny", "--max_steps", str(STEPS),
         "--save_strategy", "steps", "--save_steps", "1", "--num_train_tasks", "40", "--num_eval_tasks", "4",
         "--warm_start_steps", "0"]


def _env(home) -> dict[str, str]:
    return checkout_env({**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                         "TRL_EXPERIMENTAL_SILENCE": "1"})


def train(out, home, *extra: str, code: str | None = None) -> subprocess.CompletedProcess:
    """`trl-agents train` into `out`, or the Python `code` that runs it with these arguments (sys.argv[1:])."""
    head = ["-c", code] if code is not None else TRAIN[:3]
    return subprocess.run([sys.executable, *head, *TRAIN[3:], "--output_dir", str(out), *extra], env=_env(home),
                          capture_output=True, text=True, timeout=600, check=False)


def error_line(done: subprocess.CompletedProcess) -> str:
    """The last line of stderr, the one the CLI's error is on; no traceback before it."""
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if line.strip()][-1]


def rows(out) -> tuple[int, list[int], list]:
    table = load_trajectories(str(out))
    steps = [(step, uid) for step, uid in zip(table["global_step"], table["episode_uid"], strict=True)]
    return len(table), sorted(set(table["global_step"])), sorted(steps)


def files(out) -> dict[str, str]:
    found = {}
    for folder, _, names in os.walk(out):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, out)] = hashlib.md5(handle.read()).hexdigest()
    return found


def complete(folder) -> bool:
    return os.path.isfile(os.path.join(folder, "trainer_state.json")) and os.path.isfile(
        os.path.join(folder, "model.safetensors"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """An uninterrupted run, 4 steps, a checkpoint after each (copied by the tests that change it)."""
    root = tmp_path_factory.mktemp("finished")
    done = train(root / "run", root / "home")
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "run"


def copy_of(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_stops_with_an_error_and_the_resume_loses_no_row(tmp_path, finished):
    # SIGTERM (cloud preemption) the moment checkpoint-2's folder appears, i.e. while it is written: the run lets the
    # save (or the step under way) finish, saves, stops with a non-zero status and says how to resume.
    out, log = tmp_path / "run", tmp_path / "log"
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, *TRAIN, "--output_dir", str(out)], env=_env(tmp_path / "home"),
                                   stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not os.path.isdir(out / "checkpoint-2") and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=300)
    text = log.read_text()
    assert process.returncode == 128 + signal.SIGTERM, text[-3000:]
    last = [line for line in text.splitlines() if line.strip()][-1]
    stopped = int(last.split(" at step ")[1].split(" ")[0]) if " at step " in last else None
    assert stopped in (2, 3), last
    assert last == (f"[trl-agents] stopped by SIGTERM at step {stopped} of {STEPS}: saved {out}/checkpoint-{stopped}; "
                    "resume with --resume_from_checkpoint true")
    assert complete(out / f"checkpoint-{stopped}") and not os.path.exists(out / f"checkpoint-{stopped + 1}")
    assert not os.path.exists(out / "eval_results.json") and "held-out success gain" not in text  # no success claim
    assert not os.path.exists(out / ".trl-agents.lock")  # the output folder's lock went with the run

    resumed = train(out, tmp_path / "home", "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rows(out) == rows(finished)


@pytest.mark.slow
def test_sigterm_without_checkpoints_and_with_transformers_jit_checkpoint_still_saves_and_fails(tmp_path, finished):
    # transformers' --enable_jit_checkpoint saved, then let the job run its evaluation and exit 0 ("done: 6 steps"), as
    # if finished; with save_strategy "no" nothing at all was saved. Both now save and stop with the error.
    out, log = tmp_path / "run", tmp_path / "log"
    command = [sys.executable, *TRAIN, "--output_dir", str(out), "--save_strategy", "no", "--enable_jit_checkpoint",
               "true"]
    with open(log, "w") as handle:
        process = subprocess.Popen(command, env=_env(tmp_path / "home"), stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        shard = out / "trajectories" / "shard-000001-rank00.parquet"
        while not shard.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=300)
    text = log.read_text()
    assert process.returncode == 128 + signal.SIGTERM, text[-3000:]
    checkpoints = [name for name in os.listdir(out) if name.startswith("checkpoint-")]
    assert len(checkpoints) == 1 and complete(out / checkpoints[0])
    assert f"stopped by SIGTERM at step {checkpoints[0].split('-')[1]} of {STEPS}" in text
    assert "done:" not in text and not os.path.exists(out / "eval_results.json")
    resumed = train(out, tmp_path / "home", "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rows(out) == rows(finished)


# The CLI with torch.save dying (as a SIGKILL would) halfway through checkpoint-3's optimizer.pt.
DIES_MID_SAVE = """
import os, sys, torch
save = torch.save
def dying(obj, f, *args, **kwargs):
    if str(f).endswith(os.path.join("checkpoint-3", "optimizer.pt")):
        with open(f, "wb") as handle:
            handle.write(b"PK")
        os._exit(17)
    return save(obj, f, *args, **kwargs)
torch.save = dying
from trl_agents.cli import main
main(["train", *sys.argv[1:]])
"""


@pytest.mark.slow
def test_resume_true_skips_a_checkpoint_whose_save_was_cut_off(tmp_path, finished):
    out = tmp_path / "run"
    died = train(out, tmp_path / "home", code=DIES_MID_SAVE)
    assert died.returncode == 17, died.stderr[-3000:]
    assert os.path.isdir(out / "checkpoint-3") and not complete(out / "checkpoint-3")

    resumed = train(out, tmp_path / "home", "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Skipping {out}/checkpoint-3: an incomplete checkpoint (it has no trainer_state.json" in resumed.stderr
    assert rows(out) == rows(finished)


@pytest.mark.slow
def test_resuming_a_finished_run_says_there_is_nothing_to_do_and_changes_nothing(tmp_path, finished):
    out = copy_of(finished, tmp_path)
    before = files(out)
    again = train(out, tmp_path / "home", "--resume_from_checkpoint", "true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == (
        f"[trl-agents] nothing to do: {out}/checkpoint-{STEPS} is at step {STEPS}, the end of training "
        f"(max_steps={STEPS}); the run is finished and was left unchanged (raise --max_steps to train further)")
    assert files(out) == before


def _foreign_pickle(path) -> None:
    import datetime

    import torch

    torch.save({"python": datetime.datetime(2026, 1, 1)}, path)  # a zip archive `weights_only` refuses


@pytest.mark.slow
def test_a_failed_resume_moves_no_shard_and_the_next_one_loses_no_row(tmp_path, finished):
    out = copy_of(finished, tmp_path)
    shards = sorted(os.listdir(out / "trajectories"))
    # Truncated weights: caught by the check before anything starts.
    with open(out / "checkpoint-2" / "model.safetensors", "r+b") as handle:
        handle.truncate(1000)
    failed = train(out, tmp_path / "home", "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert failed.returncode == 1
    assert error_line(failed).startswith("trl-agents train: error: checkpoint-2/model.safetensors is corrupt or "
                                         "truncated (")
    assert error_line(failed).endswith(f"resume from an earlier checkpoint (--resume_from_checkpoint "
                                       f"{out}/checkpoint-1)")
    assert sorted(os.listdir(out / "trajectories")) == shards
    # An RNG state that loads only as a foreign pickle: found once the checkpoint's state has loaded, so the shards
    # after it were moved aside, and go back.
    shutil.copy(finished / "checkpoint-2" / "model.safetensors", out / "checkpoint-2" / "model.safetensors")
    _foreign_pickle(out / "checkpoint-2" / "rng_state.pth")
    failed = train(out, tmp_path / "home", "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert failed.returncode == 1
    assert error_line(failed).startswith("trl-agents train: error: checkpoint-2/rng_state.pth is corrupt or "
                                         "truncated (UnpicklingError: Weights only load failed)")
    assert sorted(os.listdir(out / "trajectories")) == shards
    assert rows(out) == rows(finished)
    # The next resume (the last checkpoint, the end of training) has nothing to do, and every row is still there.
    again = train(out, tmp_path / "home", "--resume_from_checkpoint", "true")
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert rows(out) == rows(finished)


def _truncate(path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


def _garbage(path) -> None:
    with open(path, "wb") as handle:
        handle.write(os.urandom(4096))


@pytest.mark.slow
@pytest.mark.parametrize("name, damage", [("trainer_state.json", _truncate), ("model.safetensors", _garbage),
                                          ("optimizer.pt", _truncate), ("rng_state.pth", _garbage)])
def test_a_broken_checkpoint_file_is_one_line_naming_it(tmp_path, finished, name, damage):
    out = tmp_path / "run"
    shutil.copytree(finished / "checkpoint-3", out / "checkpoint-3")
    shutil.copytree(finished / "checkpoint-2", out / "checkpoint-2")
    damage(out / "checkpoint-3" / name)
    failed = train(out, tmp_path / "home", "--resume_from_checkpoint", str(out / "checkpoint-3"))
    assert failed.returncode == 1
    line = error_line(failed)
    assert line.startswith(f"trl-agents train: error: checkpoint-3/{name} is corrupt or truncated ("), line
    assert line.endswith(f"resume from an earlier checkpoint (--resume_from_checkpoint {out}/checkpoint-2)"), line


# The CLI with torch's zip writer failing as on a full disk in checkpoint-2's optimizer.pt (after writing a part).
DISK_FULL_WRITER = failing_save_train('RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos '
                                      '470656 vs 470544")')  # what torch says when the disk fills mid-save


def _check_disk_full(done, out, tmp_path, finished, partial: str) -> None:
    assert done.returncode == 1
    assert error_line(done) == (
        f"trl-agents train: error: the disk holding output_dir '{out}' is full (no space left on device) while "
        f"writing {out}/{partial} (removed: it was incomplete): free space there or pass an --output_dir on a "
        "larger disk, then resume with --resume_from_checkpoint true")
    assert not os.path.exists(out / partial)
    resumed = train(out, tmp_path / "home", "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rows(out) == rows(finished)


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_is_one_line_and_the_run_resumes(tmp_path, finished):
    out = tmp_path / "run"
    done = train(out, tmp_path / "home", code=DISK_FULL_WRITER)
    _check_disk_full(done, out, tmp_path, finished, "checkpoint-2")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_real_full_disk_tmpfs(tmp_path, finished):
    # A 5 MB tmpfs fills up while a checkpoint is written (each takes ~1.4 MB); then it grows and the run resumes.
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5M", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not allowed here")
    try:
        out = mount / "run"
        done = train(out, tmp_path / "home")
        assert done.returncode == 1, done.stderr[-3000:]
        assert "is full (no space left on device) while writing" in error_line(done)
        left = [name for name in os.listdir(out) if name.startswith("checkpoint-")]
        assert left and all(complete(out / name) for name in left)  # the partial one was removed
        subprocess.run(["mount", "-o", "remount,size=40M", str(mount)], check=True)
        resumed = train(out, tmp_path / "home", "--resume_from_checkpoint", "true")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert rows(out) == rows(finished)
    finally:
        subprocess.run(["umount", str(mount)], check=False)
