"""Trajectory records: the shard schema, crash-safe writing, loading back, replay into SFT rows, run_info.json."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from datasets import Dataset, Features
from helpers import checkout_env, dying_shard_writer

from trl_agents import records
from trl_agents.records import (
    TRAJECTORY_FEATURES,
    TRAJECTORY_SCHEMA,
    TrajectoryWriter,
    config_hash,
    load_trajectories,
    read_run_info,
    sft_examples,
)
from trl_agents.trajectory import ROW_COLUMNS, Group, RolloutBatch, Step, Trajectory


class Killed(BaseException):
    """Stands for the process being killed: nothing in the writer may catch it."""


RUN_INFO = {"run_id": "run-1", "config_hash": "c0ffee", "method": "grpo", "env": "fallback-env"}



def listing(directory) -> list[str]:
    """The folder's names, a writer's temporary `.{name}.{pid}.{thread}.tmp` shown as `.{name}.tmp`."""
    return sorted(re.sub(r"\.\d+\.\d+\.tmp$", ".tmp", name) for name in os.listdir(directory))

def make_batch() -> RolloutBatch:
    """Group 0: a solved two-step episode (its 2nd action rejected) and a crashed one; group 1: an unsolved episode
    of a task without an `env` field, in a two-role environment."""
    solved = Trajectory(
        task={"env": "x", "seed": 1},
        steps=[
            Step("o0", "I go <action> UP </action>", prompt_ids=[1, 2], action_ids=[3, 4], action_logprobs=[-0.5, -0.25],
                 reward=0.0, state_key=(0, 0), info={"valid": True}),
            Step("o1", "jump", prompt_ids=[1, 2, 5], action_ids=[6], action_logprobs=[-1.0], reward=1.0, done=True,
                 valid=False, info={"valid": False, "action": "Jump"}),
        ],
        success=True,
        episode_id=0,
    )
    crashed = Trajectory(task={"env": "x", "seed": 1}, steps=[], error="reset failed", episode_id=1)
    unsolved = Trajectory(
        task={"seed": 2},
        steps=[Step("p0", "[Propose: book=1]", prompt_ids=[7], action_ids=[8, 9], action_logprobs=[-2.0, -0.5],
                    done=True, info={"role": "alice"})],
        episode_id=0,
    )
    return RolloutBatch([Group(solved.task, [solved, crashed]), Group(unsolved.task, [unsolved])])


ADVANTAGES = {(0, 0): [0.5, -0.75], (1, 0): [-1.0]}  # the crashed episode (0, 1) was not credited


def sha256(path) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def write(directory, batch=None, rank=0, global_step=0, advantages=ADVANTAGES):
    return TrajectoryWriter(str(directory), run_info=RUN_INFO, rank=rank).write(
        batch or make_batch(), advantages, global_step=global_step
    )


def test_schema_holds_every_row_column_and_travels_with_the_shard(tmp_path):
    assert set(ROW_COLUMNS) <= set(TRAJECTORY_FEATURES)
    assert Features.from_arrow_schema(TRAJECTORY_SCHEMA) == TRAJECTORY_FEATURES
    path = write(tmp_path / "trajectories")
    assert os.path.basename(path) == "shard-000000-rank00.parquet"
    schema = pq.read_schema(path)
    assert Features.from_arrow_schema(schema) == TRAJECTORY_FEATURES
    assert str(schema.field("prompt_ids").type.value_type) == "int32"


def test_shard_rows_add_the_run_and_rollout_columns(tmp_path):
    write(tmp_path / "trajectories", global_step=7)
    rows = load_trajectories(str(tmp_path)).to_list()
    assert [(r["group_id"], r["episode_uid"], r["step"]) for r in rows] == [
        ("0-0-0", "0-0-0-0", 0), ("0-0-0", "0-0-0-0", 1), ("0-0-0", "0-0-0-1", -1), ("0-0-1", "0-0-1-0", 0)
    ]
    assert [r["advantage"] for r in rows] == [0.5, -0.75, None, -1.0]
    assert [r["action"] for r in rows] == ["up", "jump", "", "[propose: book=1]"]  # env's info["action"] wins
    assert [r["role"] for r in rows] == ["agent", "agent", "agent", "alice"]
    assert [r["env"] for r in rows] == ["x", "x", "x", "fallback-env"]  # the task's env, else the run's
    assert {(r["run_id"], r["config_hash"], r["method"], r["rollout"], r["rank"], r["global_step"]) for r in rows} == {
        ("run-1", "c0ffee", "grpo", 0, 0, 7)
    }
    assert {(r["branch_id"], r["parent_id"]) for r in rows} == {(None, None)}
    assert rows[2]["error"] == "reset failed" and rows[2]["prompt_ids"] == [] and rows[0]["state_key"] == "(0, 0)"


def test_load_gives_back_the_rows_written_with_their_types(tmp_path):
    writer = TrajectoryWriter(str(tmp_path / "trajectories"), run_info=RUN_INFO)
    expected = writer.rows(make_batch(), ADVANTAGES, rollout=0, global_step=3)
    path = writer.write(make_batch(), ADVANTAGES, global_step=3)
    for source in (tmp_path, tmp_path / "trajectories", path):  # run dir, its trajectories folder, one shard
        loaded = load_trajectories(str(source))
        assert loaded.features == TRAJECTORY_FEATURES
        assert loaded.to_list() == expected  # values, nulls, list columns (log-probs are exact in float32)
        assert {k: type(v) for k, v in loaded[2].items()} == {k: type(v) for k, v in expected[2].items()}
    steps = RolloutBatch.from_rows(load_trajectories(str(tmp_path))).groups[0].trajectories[0].steps
    assert [s.action_ids for s in steps] == [[3, 4], [6]] and steps[1].info == {"valid": False, "action": "Jump"}


def test_load_orders_shards_by_rollout_then_rank(tmp_path):
    directory = tmp_path / "trajectories"
    writers = {rank: TrajectoryWriter(str(directory), run_info=RUN_INFO, rank=rank) for rank in (1, 0)}
    for rollout in range(11):  # past 10: the order is numeric, whatever the names' lengths
        for rank in (1, 0):
            writers[rank].write(make_batch(), ADVANTAGES, global_step=rollout)
    rows = load_trajectories(str(tmp_path))
    order = [(r["rollout"], r["rank"]) for r in rows.select_columns(["rollout", "rank"])]
    assert order == [(rollout, rank) for rollout in range(11) for rank in (0, 1) for _ in range(4)]


def test_a_dataset_in_the_hub_layout_loads_with_its_types(tmp_path):
    """What `load_dataset` reads (a Hub repo id, or here a local folder in the layout `push_to_hub` writes) loads
    with the same rows and features."""
    write(tmp_path / "run" / "trajectories")
    written = load_trajectories(str(tmp_path / "run"))
    (tmp_path / "repo" / "data").mkdir(parents=True)
    written.to_parquet(str(tmp_path / "repo" / "data" / "train-00000-of-00001.parquet"))
    loaded = load_trajectories(str(tmp_path / "repo"))
    assert loaded.features == TRAJECTORY_FEATURES and loaded.to_list() == written.to_list()


def test_a_run_without_shards_is_a_clear_error(tmp_path):
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "trajectories" / ".shard-000000-rank00.parquet.tmp").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="holds no complete trajectory shard.*save_trajectories=False"):
        load_trajectories(str(tmp_path))


def test_a_crash_mid_write_leaves_the_completed_shards_and_the_writer_resumes_after_them(tmp_path, monkeypatch, caplog):
    directory = tmp_path / "trajectories"
    writer = TrajectoryWriter(str(directory), run_info=RUN_INFO)
    complete = [writer.write(make_batch(), ADVANTAGES, global_step=step) for step in (0, 1)]
    digests = [sha256(path) for path in complete]
    real_write_table = pq.write_table

    def write_half_then_crash(table, where, **kwargs):
        real_write_table(table, where, **kwargs)
        where.truncate(where.tell() // 2)
        raise Killed

    monkeypatch.setattr(records.pq, "write_table", write_half_then_crash)
    with pytest.raises(Killed):
        writer.write(make_batch(), ADVANTAGES, global_step=2)
    monkeypatch.undo()
    other_rank_tmp = directory / ".shard-000000-rank01.parquet.tmp"  # another process, still writing: left alone
    other_rank_tmp.write_bytes(b"PAR1")
    assert listing(directory) == [
        ".shard-000000-rank01.parquet.tmp", ".shard-000002-rank00.parquet.tmp",
        "shard-000000-rank00.parquet", "shard-000001-rank00.parquet",
    ]
    assert sorted(set(load_trajectories(str(tmp_path))["global_step"])) == [0, 1]  # the partial shard is not read

    with caplog.at_level(logging.WARNING, logger="trl_agents.records"):
        resumed = TrajectoryWriter(str(directory), run_info=RUN_INFO)
    assert resumed.next_rollout == 2 and "shard-000002-rank00.parquet." in caplog.text
    assert listing(directory) == [".shard-000000-rank01.parquet.tmp", "shard-000000-rank00.parquet",
                                  "shard-000001-rank00.parquet"] and other_rank_tmp.exists()
    assert os.path.basename(resumed.write(make_batch(), ADVANTAGES, global_step=2)) == "shard-000002-rank00.parquet"
    assert [sha256(path) for path in complete] == digests
    assert sorted(set(load_trajectories(str(tmp_path))["global_step"])) == [0, 1, 2]
    assert TrajectoryWriter(str(directory), run_info=RUN_INFO, rank=1).next_rollout == 0  # numbering is per rank


# ---- replay into SFT rows ---------------------------------------------------------------------------------------


def test_step_replay_keeps_the_valid_actions_of_the_episodes_asked_for(tmp_path):
    write(tmp_path / "trajectories")
    steps = load_trajectories(str(tmp_path))
    # Only the solved episode, and of it only the accepted first action (the crashed episode never counts).
    assert sft_examples(steps).to_list() == [{"input_ids": [1, 2, 3, 4], "assistant_masks": [0, 0, 1, 1]}]
    assert sft_examples(steps, only_successful=False).to_list() == [
        {"input_ids": [1, 2, 3, 4], "assistant_masks": [0, 0, 1, 1]},
        {"input_ids": [7, 8, 9], "assistant_masks": [0, 1, 1]},
    ]
    assert len(sft_examples(steps, only_successful=False, min_return=0.5)) == 1  # returns are 1.0 and 0.0
    assert sft_examples(str(tmp_path)).to_list() == sft_examples(steps).to_list()  # a source is loaded first
    assert sft_examples(steps, min_return=2.0).column_names == ["input_ids", "assistant_masks"]


def test_step_replay_decodes_with_a_tokenizer(tokenizer, tmp_path):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Round 0"}], tokenize=False,
                                         add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    action = tokenizer.encode("up", add_special_tokens=False) + [tokenizer.eos_token_id]
    episode = Trajectory({"env": "x"}, [Step("Round 0", "up", prompt, action, [-0.5] * len(action), 1.0, True)],
                         success=True)
    write(tmp_path / "trajectories", RolloutBatch([Group(episode.task, [episode])]), advantages={(0, 0): [1.0]})
    assert text.endswith("<|im_start|>user\nRound 0<|im_end|>\n<|im_start|>assistant\n")
    assert sft_examples(load_trajectories(str(tmp_path)), tokenizer).to_list() == [
        {"prompt": text, "completion": "up<|im_end|>"}
    ]


def conversation_batch() -> RolloutBatch:
    """Three turns recorded in conversation format: each prompt extends the last by its action and env tokens; the
    second action was rejected."""
    turns = [([1, 2], [3], [4, 5], True), ([1, 2, 3, 4, 5], [6, 7], [8], False), ([1, 2, 3, 4, 5, 6, 7, 8], [9], [], True)]
    steps = [Step(f"o{t}", "a", prompt, action, [-0.5] * len(action), env_ids=env, valid=valid, done=t == 2)
             for t, (prompt, action, env, valid) in enumerate(turns)]
    episode = Trajectory({"env": "x"}, steps, success=True)
    return RolloutBatch([Group(episode.task, [episode])])


def test_conversation_replay_trains_the_valid_actions_of_the_whole_episode(tmp_path):
    write(tmp_path / "trajectories", conversation_batch(), advantages={})
    assert sft_examples(load_trajectories(str(tmp_path)), row_format="conversation").to_list() == [
        {"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9], "assistant_masks": [0, 0, 1, 0, 0, 0, 0, 0, 1]}
    ]


def test_replay_refuses_what_it_cannot_replay(tmp_path, tokenizer):
    write(tmp_path / "trajectories")
    steps = load_trajectories(str(tmp_path))
    with pytest.raises(ValueError, match="was not recorded in conversation format.*row_format='step'"):
        sft_examples(steps, row_format="conversation")
    with pytest.raises(ValueError, match="pass tokenizer=None"):
        sft_examples(steps, tokenizer, row_format="conversation")
    with pytest.raises(ValueError, match="row_format must be 'step' or 'conversation', got 'turns'"):
        sft_examples(steps, row_format="turns")
    with pytest.raises(ValueError, match="Not a trl-agents trajectory dataset: it lacks the columns run_id, episode_uid"):
        sft_examples(Dataset.from_list(make_batch().to_rows()))


# ---- run_info.json ----------------------------------------------------------------------------------------------


def test_the_method_name_follows_the_trainer_class_and_its_defining_settings(tmp_path):
    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer, GiGPOConfig, GiGPOTrainer
    from trl_agents.testing import tiny_training_config

    def method_of(trainer_class, config):
        trainer = trainer_class.__new__(trainer_class)  # (no model needed to name the method)
        trainer.args = config
        return records.method_name(trainer)

    class MyTrainer(AgentGRPOTrainer):
        pass

    grpo = tiny_training_config(AgentGRPOConfig, tmp_path)
    dr_grpo = tiny_training_config(AgentGRPOConfig, tmp_path, scale_rewards="none", loss_type="dr_grpo")
    rloo = tiny_training_config(AgentGRPOConfig, tmp_path, advantage_estimator="rloo")
    assert method_of(AgentGRPOTrainer, grpo) == "grpo" and method_of(AgentGRPOTrainer, dr_grpo) == "dr_grpo"
    assert method_of(AgentGRPOTrainer, rloo) == "rloo"
    assert method_of(GiGPOTrainer, tiny_training_config(GiGPOConfig, tmp_path)) == "gigpo"
    assert method_of(MyTrainer, grpo) == "MyTrainer"


def test_read_run_info_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no run_info.json.*AgentGRPOTrainer.train"):
        read_run_info(str(tmp_path))


# ---- in a real run: crash, resume, replay -------------------------------------------------------------------------

# Trains on FrozenLake with checkpoints every step and kills itself (os._exit: no cleanup of any kind) when half of
# the third trajectory shard is on disk, i.e. during the rollout of step 3, after checkpoint-2.
CRASHING_RUN = dying_shard_writer(3) + """
import json, sys
from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
from trl_agents.testing import tiny_training_config

model_dir, output_dir, settings, tasks = sys.argv[1:]
config = tiny_training_config(AgentGRPOConfig, output_dir, **json.loads(settings))
AgentGRPOTrainer(model=model_dir, args=config, train_dataset=json.loads(tasks)).train()
"""
CRASH_SETTINGS = {"env_name": "frozenlake", "max_steps": 4, "per_device_train_batch_size": 4, "num_generations": 2,
                  "max_turns": 2, "max_completion_length": 3, "save_strategy": "steps", "save_steps": 1}
CRASH_TASKS = [{"env": "frozenlake", "seed": seed} for seed in range(2)]


@pytest.mark.slow
def test_a_run_killed_mid_write_keeps_its_shards_and_resumes_after_them(tiny_model_dir, tmp_path):
    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.testing import tiny_training_config

    output_dir = tmp_path / "run"
    arguments = [tiny_model_dir, str(output_dir), json.dumps(CRASH_SETTINGS), json.dumps(CRASH_TASKS)]
    killed = subprocess.run([sys.executable, "-c", CRASHING_RUN, *arguments], capture_output=True, text=True,
                            env=checkout_env(), timeout=600, check=False)
    assert killed.returncode == 17, killed.stderr[-3000:]
    shards = output_dir / "trajectories"
    assert listing(shards) == [
        ".shard-000002-rank00.parquet.tmp", "shard-000000-rank00.parquet", "shard-000001-rank00.parquet"
    ]
    assert (output_dir / "checkpoint-2").is_dir() and not (output_dir / "checkpoint-3").exists()
    before = load_trajectories(str(output_dir))
    assert sorted(set(before["global_step"])) == [0, 1] and len(before) > 0
    info = read_run_info(str(output_dir))
    assert info["method"] == "grpo" and info["env"] == "frozenlake" and info["model"] == tiny_model_dir
    assert info["config"]["max_steps"] == 4 and info["config"]["hub_token"] == "<HUB_TOKEN>"
    assert info["config_hash"] == config_hash(info["config"]) and set(before["config_hash"]) == {info["config_hash"]}
    digests = {name: sha256(shards / name) for name in os.listdir(shards) if not name.startswith(".")}

    config = tiny_training_config(AgentGRPOConfig, output_dir, **CRASH_SETTINGS)
    trainer = AgentGRPOTrainer(model=tiny_model_dir, args=config, train_dataset=CRASH_TASKS)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 4
    assert sorted(os.listdir(shards)) == [f"shard-00000{i}-rank00.parquet" for i in range(4)]
    assert {name: sha256(shards / name) for name in digests} == digests  # the earlier shards are untouched
    after = load_trajectories(str(output_dir))
    assert after.select(range(len(before))).to_list() == before.to_list()
    assert sorted(set(zip(after["rollout"], after["global_step"]))) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    resumed = read_run_info(str(output_dir))  # the same run: same id and config, rewritten by the resumed train()
    assert (resumed["run_id"], resumed["created"], resumed["config_hash"]) == (
        info["run_id"], info["created"], info["config_hash"]
    )
    assert set(after["run_id"]) == {info["run_id"]}
    assert None not in after["advantage"]


TINY_RUN = {
    "method": "grpo",
    "tiny_model": True,
    "tiny_model_kwargs": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "vocab_size": 400},
    "env_name": "test-keyword",
    "num_train_tasks": 8,
    "num_eval_tasks": 2,
    "max_turns": 2,
    "max_completion_length": 3,
    "max_steps": 1,
    "per_device_train_batch_size": 16,
    "num_generations": 4,
    "report_to": "none",
    "save_strategy": "no",
    "gradient_checkpointing": False,
    "disable_tqdm": True,
}


def log_likelihood(model_dir: str, examples: Dataset) -> float:
    """Σ log p(recorded action tokens | recorded prompt) under a saved model."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    total = 0.0
    with torch.no_grad():
        for example in examples:
            ids = torch.tensor([example["input_ids"]])
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            token_logprobs = logprobs.gather(1, ids[0, 1:, None])[:, 0]
            total += float((token_logprobs * torch.tensor(example["assistant_masks"][1:])).sum())
    return total


@pytest.mark.slow
def test_trl_agents_train_warm_starts_from_a_recorded_run(tmp_path):
    """Run 1 records its rollouts; run 2 (`--warm_start_dataset RUN_1`) replays its steps into an SFT warm start: the
    SFT loss falls and the recorded actions become more likely. (Every episode is replayed: the random tiny model
    rarely solves a task; the filters are checked above.)"""
    import yaml

    from trl_agents.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(TINY_RUN))
    first, second = tmp_path / "first", tmp_path / "second"
    main(["train", "--config", str(config), "--output_dir", str(first)])
    examples = sft_examples(load_trajectories(str(first)), only_successful=False)
    assert len(examples) == 4 * 4 * 2  # 4 tasks × G = 4 episodes × 2 turns, every action valid

    main(["train", "--config", str(config), "--output_dir", str(second), "--warm_start_dataset", str(first),
          "--warm_start_successful_only", "false", "--warm_start_steps", "8", "--warm_start_learning_rate", "0.01",
          "--warm_start_batch_size", "8"])
    warm = json.loads((second / "metrics.json").read_text())["warm_start"]
    assert warm["examples"] == len(examples) and warm["source"] == f"steps replayed from {first}"
    losses = [loss for _, loss in warm["loss"]]
    assert len(losses) == 8 and losses[-1] < losses[0]
    # The same tiny model and tokenizer are rebuilt from the config, so the replay is token-exact.
    assert log_likelihood(str(second / "warm-start"), examples) > log_likelihood(str(second / "base-model"), examples)


def test_a_warm_start_dataset_needs_warm_start_steps(tmp_path):
    from trl import ModelConfig

    from trl_agents import AgentGRPOConfig
    from trl_agents.run import RunArguments, run_training
    from trl_agents.testing import tiny_training_config

    config = tiny_training_config(AgentGRPOConfig, tmp_path, env_name="frozenlake")
    with pytest.raises(ValueError, match="warm_start_dataset='user/traj' is set but warm_start_steps=0"):
        run_training(RunArguments(warm_start_dataset="user/traj"), config, ModelConfig())


def test_a_warm_start_dataset_must_have_steps_to_replay_in_the_models_vocabulary(tmp_path, tokenizer):
    from trl_agents import AgentGRPOConfig
    from trl_agents.run import RunArguments, _replayed_examples
    from trl_agents.testing import tiny_training_config

    config = tiny_training_config(AgentGRPOConfig, tmp_path / "out", env_name="frozenlake")
    unsolved = RolloutBatch([Group({"seed": 2}, [make_batch().groups[1].trajectories[0]])])
    write(tmp_path / "unsolved" / "trajectories", unsolved)
    run = RunArguments(warm_start_dataset=str(tmp_path / "unsolved"), warm_start_steps=1)
    with pytest.raises(ValueError, match="no valid steps to replay in successful episodes.*successful_only false"):
        _replayed_examples(run, config, tokenizer)
    run.warm_start_successful_only = False
    assert _replayed_examples(run, config, tokenizer).to_list() == [{"input_ids": [7, 8, 9], "assistant_masks": [0, 1, 1]}]

    foreign = make_batch()
    foreign.groups[0].trajectories[0].steps[0].action_ids = [3, len(tokenizer)]
    write(tmp_path / "foreign" / "trajectories", foreign)
    run = RunArguments(warm_start_dataset=str(tmp_path / "foreign"), warm_start_steps=1)
    with pytest.raises(ValueError, match=f"holds token id {len(tokenizer)}, beyond the vocabulary.*another tokenizer"):
        _replayed_examples(run, config, tokenizer)
