"""Logging: per-turn metrics and credit diagnostics reach `report_to` backends, completions tables show whole
episodes, and rollouts have a live progress display."""

from __future__ import annotations

import glob
import json
import sqlite3
from io import StringIO

import pandas as pd
import pytest
from datasets import Dataset
from rich.console import Console

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer, GiGPOConfig, GiGPOTrainer
from trl_agents.envs import get_env_class
from trl_agents.rollout import PromptRenderer, RolloutEngine, RolloutProgress, SamplingParams, TurnProgress
from trl_agents.testing import tiny_training_config
from trl_agents.training.metrics import TRANSCRIPT_TEXT_CHARS, TRANSCRIPT_TURNS, episode_prompt, episode_transcript
from trl_agents.trajectory import Step, Trajectory

# Metrics every rollout logs, and one credit diagnostic of GiGPO (its anchor groups).
ROLLOUT_METRICS = ("env/success_rate", "env/valid_action_rate", "credit/advantage_by_turn/0")
GIGPO_METRIC = "gigpo/mean_anchor_group_size"


def train_gigpo(tiny_model, tokenizer, output_dir, **overrides):
    """One GiGPO step on 2 FrozenLake tasks x 4 episodes (FrozenLake states repeat across episodes: anchor groups)."""
    tasks = get_env_class("frozenlake").task_split("train", 2)
    settings = {"max_steps": 1, "max_turns": 3, "max_completion_length": 3, **overrides}
    trainer = GiGPOTrainer(
        model=tiny_model,
        args=tiny_training_config(GiGPOConfig, output_dir, env_name="frozenlake", **settings),
        train_dataset=Dataset.from_list(tasks),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer


# ---- report_to -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tensorboard_receives_rollout_metrics_and_credit_diagnostics(tiny_model, tokenizer, tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    trainer = train_gigpo(tiny_model, tokenizer, tmp_path / "out", report_to="tensorboard")
    [event_file] = glob.glob(str(tmp_path / "out" / "runs" / "*" / "events.out.tfevents.*"))
    events = event_accumulator.EventAccumulator(event_file)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in (*ROLLOUT_METRICS, GIGPO_METRIC):
        assert f"train/{name}" in tags, (name, sorted(tags))
    logged = next(h for h in trainer.state.log_history if "env/success_rate" in h)
    [point] = events.Scalars("train/env/success_rate")
    assert point.step == 1 and point.value == pytest.approx(logged["env/success_rate"])


@pytest.mark.slow
def test_trackio_receives_metrics_and_whole_episode_completions(tiny_model, tokenizer, tmp_path):
    storage = pytest.importorskip("trackio.sqlite_storage")
    # Local-only trackio: a SQLite database per project under TRACKIO_DIR (in the tests' temporary HOME), no Space.
    project = f"trl-agents-{tmp_path.name}"
    train_gigpo(tiny_model, tokenizer, tmp_path / "out", report_to="trackio", project=project,
                trackio_static_space_id=False, log_completions=True)
    with sqlite3.connect(storage.SQLiteStorage.get_project_db_path(project)) as database:
        rows = [json.loads(payload) for (payload,) in database.execute("SELECT metrics FROM metrics")]
    logged = {key for row in rows for key in row}
    for name in (*ROLLOUT_METRICS, GIGPO_METRIC):
        assert f"train/{name}" in logged, (name, sorted(logged))
    tables = [row["completions"]["_value"] for row in rows if "completions" in row]  # (TRL logs it again at the end)
    assert tables and all(len(entries) == 8 for entries in tables)  # one row per episode: 2 tasks x 4 episodes
    entries = tables[0]
    assert all(entry["completion"].startswith("Action 1: ") for entry in entries)
    assert {"prompt", "environment_return", "advantage", "success", "turns"} <= set(entries[0])


# ---- completions tables ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_completions_table_has_one_entry_per_episode(tiny_model, tokenizer, tmp_path, capsys):
    tasks = [{"env": "test-keyword", "seed": seed, "length": 3} for seed in range(2)]
    config = tiny_training_config(AgentGRPOConfig, tmp_path / "out", max_steps=1, max_turns=3, log_completions=True)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list(tasks),
                               processing_class=tokenizer)
    trainer.train()
    batch = trainer.last_rollout
    table = pd.read_parquet(tmp_path / "out" / "completions" / "completions_00001.parquet")
    assert list(table.columns) == ["step", "prompt", "completion", "environment_return", "success", "turns",
                                   "advantage"]
    assert len(table) == len(batch.trajectories) == 8
    for (_, row), trajectory in zip(table.iterrows(), batch.trajectories, strict=True):
        assert row["prompt"] == trajectory.steps[0].observation  # test-keyword has no task text
        assert row["completion"] == episode_transcript(trajectory)
        for index, step in enumerate(trajectory.steps):
            assert f"Action {index + 1}: {step.action_text.strip()[:50]}" in row["completion"]
        assert row["completion"].count("Observation ") == trajectory.num_steps - 1 == 2
        assert row["environment_return"] == trajectory.episode_return and row["turns"] == 3
        assert row["success"] == trajectory.success
    printed = capsys.readouterr().out  # TRL's rich table of the completions
    assert "Step 1" in printed and "Action 1:" in printed and "=> " in printed
    assert all(f" {column} " in printed for column in ("Prompt", "Completion", "Advantage", "success", "turns"))


def test_transcripts_are_cut_to_a_readable_size():
    long_text = "x" * (TRANSCRIPT_TEXT_CHARS + 50)
    steps = [Step(f"obs {turn}", "up" if turn else long_text, valid=turn != 2) for turn in range(20)]
    transcript = episode_transcript(Trajectory(task={}, steps=steps, task_text="Reach G."))
    assert f"Action 1: {'x' * (TRANSCRIPT_TEXT_CHARS - 1)}…\n" in transcript and long_text not in transcript
    assert "Action 3: up [invalid]" in transcript
    shown = TRANSCRIPT_TURNS // 2
    assert f"... ({20 - 2 * shown} turns not shown) ..." in transcript
    assert f"Action {shown}: up" in transcript and f"Action {shown + 1}: " not in transcript
    assert "Action 20: up" in transcript and "Observation 20: obs 19" in transcript
    assert transcript.endswith("=> unsolved when the episode stopped after 20 turns")
    assert episode_prompt(Trajectory(task={}, steps=steps, task_text="Reach G.")) == "Reach G.\nobs 0"
    failed = Trajectory(task={}, steps=steps[:1], error="step timed out after 5 s")
    assert episode_transcript(failed).endswith("=> failed: step timed out after 5 s")
    ended = Trajectory(task={}, steps=[Step("o", "down", reward=-1.0, done=True)])
    assert episode_transcript(ended) == "Action 1: down [reward -1]\n=> ended unsolved after 1 turns"
    assert episode_prompt(Trajectory(task={}, error="reset failed")) == ""


# ---- progress --------------------------------------------------------------------------------------------------------


def test_engine_reports_progress_after_resets_and_every_turn(tokenizer, scripted):
    """Tasks of 1, 2 and 3 turns, 2 episodes each; episode 0 of each task says 'a' (succeeds), episode 1 'b'."""
    tasks = [{"env": "test-keyword", "seed": seed, "length": seed + 1} for seed in range(3)]
    reports = []
    output = StringIO()
    progress = RolloutProgress("rollout", console=Console(file=output, width=100), transient=False)

    def on_turn(report):
        reports.append(report)
        progress.update(report)
        assert progress._progress.tasks[0].completed == report.finished
        assert progress._progress.tasks[0].total == report.num_episodes

    generator = scripted(lambda prompt, call, row, size: "a" if row % 2 == 0 else "b")
    engine = RolloutEngine(generator, PromptRenderer(tokenizer), max_turns=4, sampling=SamplingParams(),
                           on_turn=on_turn)
    with progress.track():
        batch = engine.run(tasks, num_generations=2)
    assert reports == [
        TurnProgress(turn=0, max_turns=4, num_episodes=6, finished=0, successes=0, failed=0),
        TurnProgress(turn=1, max_turns=4, num_episodes=6, finished=2, successes=1, failed=0),
        TurnProgress(turn=2, max_turns=4, num_episodes=6, finished=4, successes=2, failed=0),
        TurnProgress(turn=3, max_turns=4, num_episodes=6, finished=6, successes=3, failed=0),
    ]
    assert sum(t.success for t in batch.trajectories) == 3 and progress.last == reports[-1]
    # A console that is not a terminal (a log file) gets the final state once, as one line.
    assert output.getvalue().splitlines()[-1].split()[:8] == ["rollout", "━" * 40, "6/6", "episodes", "turn", "3/4",
                                                            "solved", "3/6"]


def test_progress_stays_out_of_logs_and_shows_failures(tokenizer):
    output = StringIO()
    progress = RolloutProgress("eval", console=Console(file=output, force_terminal=False))  # transient: nothing drawn
    with progress.track():
        progress.update(TurnProgress(turn=1, max_turns=5, num_episodes=4, finished=2, successes=1, failed=1))
    assert output.getvalue() == "" and progress.last.failed == 1
    terminal = StringIO()
    console = Console(file=terminal, force_terminal=True, color_system=None, width=120)
    progress = RolloutProgress("eval", console=console)
    with progress.track():
        progress.update(TurnProgress(turn=1, max_turns=5, num_episodes=4, finished=2, successes=1, failed=1))
        progress._progress.refresh()
    assert "2/4 episodes turn 1/5 solved 1/2 failed 1" in terminal.getvalue()
    progress.update(TurnProgress(turn=2, max_turns=5, num_episodes=4, finished=4, successes=1, failed=1))  # after
    assert progress.last.turn == 2  # kept, nothing drawn outside track()


@pytest.mark.slow
def test_trainer_shows_rollout_progress_unless_progress_bars_are_disabled(train_one_iteration):
    quiet = train_one_iteration("test-keyword", [{"seed": 0}, {"seed": 1}])
    assert quiet.rollout_progress is None  # disable_tqdm=True (tests' setting)
    shown = train_one_iteration("test-keyword", [{"seed": 0}, {"seed": 1}], disable_tqdm=False)
    last = shown.rollout_progress.last
    assert last.num_episodes == last.finished == 4 and last.turn == 2
    assert last.successes == sum(t.success for t in shown.last_rollout.trajectories)


@pytest.mark.slow
def test_trl_agents_train_sends_the_held_out_evaluations_to_the_trackers_run(tmp_path):
    """`run_training` logs the evaluation before RL and the one after it (from inside train(), before trackio closes
    its run) into the same trackio run as the training metrics."""
    storage = pytest.importorskip("trackio.sqlite_storage")
    from trl import ModelConfig

    from trl_agents.run import RunArguments, run_training

    project = f"trl-agents-{tmp_path.name}"
    run = RunArguments(method="gigpo", tiny_model=True, num_train_tasks=4, num_eval_tasks=2,
                       tiny_model_kwargs={"hidden_size": 32, "num_layers": 1, "vocab_size": 300})
    config = tiny_training_config(GiGPOConfig, tmp_path / "out", env_name="frozenlake", max_steps=1, max_turns=2,
                                  max_completion_length=2, report_to="trackio", project=project, run_name="one-run",
                                  trackio_static_space_id=False)
    results = run_training(run, config, ModelConfig())
    with sqlite3.connect(storage.SQLiteStorage.get_project_db_path(project)) as database:
        runs = {name for (name,) in database.execute("SELECT DISTINCT run_name FROM metrics")}
        rows = [json.loads(payload) for (payload,) in database.execute("SELECT metrics FROM metrics")]
    logged = {key: value for row in rows for key, value in row.items()}
    assert runs == {"one-run"}  # the evaluation after RL did not open a second run
    # (transformers' trackers file `eval_*` keys under eval/)
    assert logged["eval/before_rl/success_rate"] == results["eval_before_rl"]["success_rate"]
    assert logged["eval/after_rl/success_rate"] == results["eval_after_rl"]["success_rate"]
    assert "train/env/success_rate" in logged
    assert not any(key.startswith(("eval/before_rl/max_turns", "eval/after_rl/temperature")) for key in logged)
