"""Training with two processes (accelerate + gloo on the CPU) gives the groups, advantages, logged metrics and
parameter updates of one process on the same data, for every method (tests/multiprocess_worker.py runs them).

What makes this hold:
* TRL's sampler hands each process whole groups (the G episodes of a task), so credit never needs another process's
  episodes; batch-level statistics (CAST's RMS, ProGPO's σ_tr, 3SPO's state table, the logged metrics) are reduced
  over processes;
* TRL's default loss (`dapo`) divides by the number of loss tokens of the whole generation batch, gathered over
  processes, and DDP averages gradients: the update is that of one process holding all rows. The filler rows that
  equalise the row count of the processes (TRL's loss gathers per-row statistics) carry no loss tokens.

`dr_grpo` (and TRL's other per-micro-batch normalisations: `grpo`, `sapo`, `luspo`, `bnpo`) divides each process's
loss by its own row or token count, as in TRL, so with step rows (a different number on each process) its update
depends on how rows split over processes; it is not among the cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

REPOSITORY = Path(__file__).resolve().parents[2]
WORKER = REPOSITORY / "tests" / "multiprocess_worker.py"
ACCELERATE_CONFIG = REPOSITORY / "configs" / "accelerate" / "cpu_2proc.yaml"
TIMING_KEYS = ("step_time", "_seconds", "train_runtime", "train_samples_per_second", "train_steps_per_second")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import checkout_env, free_port  # noqa: E402 (after the sys.path entry above)
from multiprocess_worker import CASES, NUM_GENERATIONS  # noqa: E402


def _run(command: list[str]) -> None:
    # The workers import the trl_agents under test (this checkout's), whatever the installed one is.
    result = subprocess.run(command, check=False, env=checkout_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"


def _accelerate_launch(*arguments: str) -> list[str]:
    """`accelerate launch` with the two-process CPU config, on a free port (tests may run side by side)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG),
            "--main_process_port", str(free_port()), *arguments]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """Output folders of the one-process and the two-process run of every case."""
    root = tmp_path_factory.mktemp("multiprocess")
    one, two = root / "one", root / "two"
    arguments = ["--model_dir", tiny_model_dir, "--cases", ",".join(CASES)]
    _run([sys.executable, str(WORKER), "--output_dir", str(one), *arguments])
    _run(_accelerate_launch(str(WORKER), "--output_dir", str(two), *arguments))
    for run in (one, two):
        assert sorted(p.name for p in run.iterdir()) == sorted(CASES)
    return one, two


def _rollout_files(case_dir: Path) -> dict[tuple[int, int], list[dict]]:
    """(rollout index, rank) -> the step rows that process saved."""
    from trl_agents.records import SHARD_PATTERN, load_trajectories, shard_files

    files = {}
    for path in shard_files(str(case_dir / "trajectories")):
        index, rank = SHARD_PATTERN.match(os.path.basename(path)).groups()
        files[(int(index), int(rank))] = load_trajectories(path).to_list()
    return files


def _steps(files) -> dict[tuple, tuple[str, float]]:
    """(rollout, task, episode, step) -> (action, advantage), whichever process ran the episode."""
    return {
        (index, row["task_id"], row["episode_id"], row["step"]): (row["action_text"], row["advantage"])
        for (index, _), rows in files.items()
        for row in rows
    }


def _parameters(case_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(case_dir / "parameters.pt")


def _logs(case_dir: Path) -> list[dict]:
    return [entry for entry in json.loads((case_dir / "log_history.json").read_text()) if "loss" in entry]


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_train_like_one(case, runs, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    one, two = (run / case for run in runs)
    files_one, files_two = _rollout_files(one), _rollout_files(two)
    assert sorted(files_one) == [(0, 0), (1, 0)] and sorted(files_two) == [(0, 0), (0, 1), (1, 0), (1, 1)]

    # Whole groups stay on one process: every task a process ran has all its episodes there (G, or as many as an
    # adaptive group grew to, or backbones and their forks), and no task ran on both; together the processes ran the
    # tasks of the one-process rollout.
    for index in (0, 1):
        episodes_by_rank = [
            {(row["task_id"], row["episode_id"]) for row in files_two[(index, rank)]} for rank in (0, 1)
        ]
        tasks_by_rank = [{task for task, _ in episodes} for episodes in episodes_by_rank]
        assert not tasks_by_rank[0] & tasks_by_rank[1]
        episodes_one = {(row["task_id"], row["episode_id"]) for row in files_one[(index, 0)]}
        for episodes, tasks in zip(episodes_by_rank, tasks_by_rank, strict=True):
            assert len(tasks) == 2 and episodes == {e for e in episodes_one if e[0] in tasks}
            assert len(episodes) >= NUM_GENERATIONS * len(tasks)
        assert tasks_by_rank[0] | tasks_by_rank[1] == {row["task_id"] for row in files_one[(index, 0)]}

    # The same episodes (actions), credited with the same advantages.
    steps_one, steps_two = _steps(files_one), _steps(files_two)
    assert steps_one.keys() == steps_two.keys()
    for key, (action, advantage) in steps_one.items():
        assert steps_two[key][0] == action, key
        assert steps_two[key][1] == pytest.approx(advantage, abs=1e-6), key
    assert max(abs(advantage) for _, advantage in steps_one.values()) > 0.1  # the update below is not a no-op

    # The same logged losses and metrics (reduced over processes), timings aside.
    logs_one, logs_two = _logs(one), _logs(two)
    assert len(logs_one) == len(logs_two) == 2
    # With max_tokens_per_forward the loss runs in row chunks, and TRL's per-call means (entropy, KL, clip ratios)
    # become means over chunks, which hold other rows with one process than with two; the loss, the advantages and
    # the update are still the same.
    per_call = ("entropy", "kl", "clip_ratio/") if case == "grpo_token_budget" else ()
    if case.endswith("_free"):  # per-episode scheduling: how many generation calls depends on timing
        per_call = (*per_call, "rollout/generation_calls")
    if case.endswith("_1off"):  # TRL's sampling/ metrics average each process's own mean (or extreme)
        per_call = (*per_call, "sampling/")
    for entry_one, entry_two in zip(logs_one, logs_two, strict=True):
        assert entry_one.keys() == entry_two.keys()
        for key, value in entry_one.items():
            if not key.endswith(TIMING_KEYS) and not key.startswith(per_call or ("\0",)):
                assert entry_two[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key

    # The same parameters after two optimizer steps (SGD: the update is the gradient, so a gradient normalised
    # differently would show).
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    after_one, after_two = _parameters(one), _parameters(two)
    assert after_one.keys() == after_two.keys()
    # (One-step-off multiplies the loss by the behaviour weight π/μ, and the stand-in sampler's log-probs, -1 per
    # token, are far above the tiny model's: the update is ~e^-5 smaller, still far above float noise.)
    moved = 1e-4 if case.endswith("_1off") else 1e-2
    assert max((after_one[n] - initial[n].detach()).abs().max().item() for n in after_one) > moved
    for name in after_one:
        torch.testing.assert_close(after_two[name], after_one[name], rtol=0, atol=1e-5, msg=name)


def test_the_runs_exercise_what_crosses_processes(runs):
    """Preconditions that make the comparisons above sensitive: in some rollout the two processes had different
    numbers of step rows (so filler rows equalised them), and each process had a group with both a success and a
    failure (so ProGPO's σ_tr, a std over such groups, needs both processes' rows)."""
    files = _rollout_files(runs[1] / "progpo")

    def has_contrast(rows) -> bool:
        outcomes = defaultdict(set)
        for row in rows:
            outcomes[row["task_id"]].add(row["success"])
        return any(len(values) == 2 for values in outcomes.values())

    assert any(len(files[(index, 0)]) != len(files[(index, 1)]) for index in (0, 1))
    assert any(has_contrast(files[(index, 0)]) and has_contrast(files[(index, 1)]) for index in (0, 1))


def test_trl_agents_train_under_accelerate_launch(tmp_path):
    """The launch form the README documents, `accelerate launch --config_file ... -m trl_agents.cli train ...`, on
    two CPU processes: one training group (trajectories from both ranks), the main process alone writes the outputs,
    and the warm start stops at the same step on both (the main process's validation decides)."""
    output_dir = tmp_path / "run"
    _run(_accelerate_launch(
        "-m", "trl_agents.cli", "train", "--config", str(REPOSITORY / "configs" / "gigpo_sokoban_tiny.yaml"),
        "--output_dir", str(output_dir), "--num_train_tasks", "80", "--warm_start_steps", "20",
        "--warm_start_tasks", "60", "--warm_start_val_tasks", "10", "--warm_start_eval_every", "5",
        "--warm_start_min_steps", "10", "--warm_start_target_success", "0.0", "--num_eval_tasks", "4",
        "--max_steps", "1", "--per_device_train_batch_size", "8", "--disable_tqdm", "true",
    ))
    assert sorted(p.name for p in (output_dir / "trajectories").iterdir()) == [
        "shard-000000-rank00.parquet", "shard-000000-rank01.parquet"
    ]
    results = json.loads((output_dir / "eval_results.json").read_text())
    assert results["rl_steps"] == 1 and results["eval_after_rl"]["num_tasks"] == 4
    metrics = json.loads((output_dir / "metrics.json").read_text())
    assert [step for step, _ in metrics["warm_start"]["validation_success"]] == [5, 10]  # stopped at min_steps
    assert (output_dir / "model.safetensors").exists() and (output_dir / "learning_curve.png").exists()


@pytest.mark.skipif(not {"grpo_seeded", "grpo_free"} <= set(CASES), reason="the per-episode scheduling cases are off")
def test_per_episode_scheduling_gives_every_process_the_rows_of_lockstep(runs):
    """With a seed per request, free scheduling (episodes advancing alone, env calls on 4 threads) saves, on each
    process, the very rows lockstep saves: the same episodes, actions, rewards and advantages, in the same order."""
    for run in runs:
        lockstep, free = _rollout_files(run / "grpo_seeded"), _rollout_files(run / "grpo_free")
        assert sorted(lockstep) == sorted(free)
        for key, rows in lockstep.items():
            assert len(free[key]) == len(rows) > 0, key
            for row_free, row in zip(free[key], rows, strict=True):
                differ = {name for name in row if row_free[name] != row[name]}
                assert differ <= {"run_id", "config_hash"}, (key, differ)  # (run_id: each run has its own)
