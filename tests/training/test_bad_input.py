"""Bad input gets a clear error that names the field and the fix."""

from __future__ import annotations

import copy

import pytest
from datasets import Dataset

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer, GiGPOConfig, GiGPOTrainer, get_method
from trl_agents.envs import make_env


def config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path), report_to="none", num_generations=2, per_device_train_batch_size=2)
    values.update(overrides)
    return AgentGRPOConfig(**values)


def test_unknown_env_name():
    with pytest.raises(ValueError, match=r"Unknown environment 'sokobn'\. Did you mean 'sokoban'\?"):
        make_env("sokobn")


def test_unknown_env_name_in_the_dataset(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="Unknown environment 'frozen-lake'.*frozenlake"):
        AgentGRPOTrainer(model=tiny_model, args=config(tmp_path), train_dataset=[{"env": "frozen-lake", "seed": 1}],
                         processing_class=tokenizer)


def test_unknown_method_name():
    with pytest.raises(ValueError, match=r"Unknown method 'gipgo'\. Did you mean 'gigpo'\?.*Known methods"):
        get_method("gipgo")


@pytest.mark.parametrize(
    "config_class, field, value",
    [
        (AgentGRPOConfig, "max_turns", "ten"),
        (AgentGRPOConfig, "history_length", 1.5),
        (AgentGRPOConfig, "invalid_action_penalty", "high"),
        (AgentGRPOConfig, "save_trajectories", "yes"),
        (GiGPOConfig, "gamma", "0.95"),
    ],
)
def test_config_field_of_the_wrong_type(config_class, field, value, tmp_path):
    with pytest.raises(ValueError, match=rf"{config_class.__name__}\.{field} must be of type .* Fix the value of `{field}`"):
        config_class(output_dir=str(tmp_path), **{field: value})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("row_format", "turns", "row_format must be one of 'step', 'conversation'"),
        ("advantage_estimator", "ppo", "advantage_estimator must be one of 'grpo', 'rloo'"),
        ("max_turns", 0, "max_turns must be >= 1"),
        ("scale_rewards", "batch", "scale_rewards='batch' is not supported for agents"),
        ("env_kwargs", "{size: 4", "env_kwargs must be a dict or a JSON object string"),
        ("remove_unused_columns", True, "remove_unused_columns=True would strip the task columns"),
        ("rollout_schedule", "async", "rollout_schedule must be one of 'lockstep', 'task', 'free'"),
        ("generation_window", -1.0, "generation_window must be a number of seconds >= 0 or None"),
    ],
)
def test_config_values_out_of_range(field, value, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **{field: value})


def test_groups_must_fit_on_one_process(tmp_path):
    # One process: TRL's own check says it; several processes: ours (episodes per process) does.
    with pytest.raises(ValueError, match="divisible by num_generations|multiple of num_generations"):
        config(tmp_path, num_generations=4, per_device_train_batch_size=6)


def test_prompt_dataset_instead_of_tasks(tiny_model, tokenizer, tmp_path):
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(ValueError, match="looks like a prompt dataset.*rows are tasks"):
        AgentGRPOTrainer(model=tiny_model, args=config(tmp_path), train_dataset=prompts, processing_class=tokenizer)


def test_rows_without_a_task(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="have no task: they need an 'env' column"):
        AgentGRPOTrainer(model=tiny_model, args=config(tmp_path), train_dataset=[{"difficulty": 3}],
                         processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"no task for environment 'sokoban': it needs a column among 'seed', 'layout'"):
        AgentGRPOTrainer(model=tiny_model, args=config(tmp_path), train_dataset=[{"env": "sokoban", "level": 1}],
                         processing_class=tokenizer)
    with pytest.raises(ValueError, match="needs a `train_dataset` of task rows"):
        AgentGRPOTrainer(model=tiny_model, args=config(tmp_path), processing_class=tokenizer)
    # an empty dataset would "train" 0 steps without a word
    empty = Dataset.from_list([{"env": "sokoban", "seed": 1}]).select([])
    with pytest.raises(ValueError, match="`train_dataset` has no task rows: training on it would run 0 steps"):
        AgentGRPOTrainer(model=tiny_model, args=config(tmp_path), train_dataset=empty, processing_class=tokenizer)


def test_model_without_a_chat_template(tiny_model, tokenizer, tmp_path):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    with pytest.raises(ValueError, match="no chat template.*qwen2_5_chat_template"):
        AgentGRPOTrainer(model=tiny_model, args=config(tmp_path), train_dataset=[{"env": "sokoban", "seed": 1}],
                         processing_class=plain)


def test_grpo_config_instead_of_agent_config(tiny_model, tokenizer, tmp_path):
    from trl import GRPOConfig

    grpo = GRPOConfig(output_dir=str(tmp_path), bf16=False, report_to="none")
    with pytest.raises(TypeError, match=r"needs a AgentGRPOConfig.*AgentGRPOConfig.from_grpo_config\(grpo_config"):
        AgentGRPOTrainer(model=tiny_model, args=grpo, train_dataset=[{"env": "sokoban", "seed": 1}],
                         processing_class=tokenizer)
    converted = AgentGRPOConfig.from_grpo_config(grpo, max_turns=7)
    assert converted.max_turns == 7 and converted.output_dir == grpo.output_dir
    with pytest.raises(TypeError, match="GiGPOTrainer needs a GiGPOConfig"):
        GiGPOTrainer(model=tiny_model, args=converted, train_dataset=[{"env": "sokoban", "seed": 1}],
                     processing_class=tokenizer)


def test_cpu_defaults_do_not_ask_for_bf16(tmp_path):
    assert config(tmp_path).bf16 is False


def test_free_scheduling_on_one_environment_thread_is_flagged(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        config(tmp_path, rollout_schedule="free")
    assert "set env_workers to the episodes per rollout" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        config(tmp_path, rollout_schedule="free", env_workers=8)
    assert "env_workers" not in caplog.text
