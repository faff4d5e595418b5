"""Prompts are bounded by default (issue 29, item 6): with `max_prompt_length` None, the bound is the model's context
length minus `max_completion_length`; an episode whose prompt cannot fit fails with a message naming its length and
the bound (once explained in a warning), and the run goes on. No memory is measured: the prompts that reach the
policy and the records are checked against the bound."""

from __future__ import annotations

import logging
import re

import pytest

from trl_agents.envs import AgentEnv, register_env
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout import engine as engine_module
from trl_agents.rollout.prompts import prompt_length_limit

HUGE = "G " * 100_000  # 200,000 characters: tens of thousands of tokens, far over the tiny model's 4096 positions


@register_env
class HugeObservationEnv(AgentEnv):
    """A 3-turn task (reward 1 for an answer with the letter "a") whose observation at turn `huge_at` (task field;
    None = never) is 200,000 characters long (`huge_chars`). Its splits' tasks are huge from the start."""

    name = "test-huge-observation"
    instructions = "Say something with the letter a."
    task_keys = ("seed",)

    def __init__(self, huge_chars: int = len(HUGE)):
        self.huge = HUGE[:huge_chars]

    def reset(self, task):
        self.seed, self.turn, self.huge_at = task["seed"], 0, task.get("huge_at")
        return self._observation()

    def _observation(self):
        return self.huge if self.turn == self.huge_at else f"Round {self.turn} of task {self.seed}."

    @classmethod
    def task_split(cls, split, count=None, **env_kwargs):
        return [{"env": cls.name, "seed": i, "huge_at": 0} for i in range(count or 4)]

    def step(self, action_text):
        self.turn += 1
        reward = 1.0 if "a" in action_text else 0.0
        done = self.turn >= 3
        return self._observation(), reward, done, {"valid": True, "success": done and reward > 0}


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(engine_module, "_TOO_LONG_WARNED", set())


def test_default_bound_is_the_model_context_minus_the_completion_budget(tiny_model):
    assert tiny_model.config.max_position_embeddings == 4096
    limit, origin = prompt_length_limit(None, tiny_model, 8)
    assert limit == 4088 and "4096" in origin and "max_completion_length=8" in origin
    assert prompt_length_limit(300, tiny_model, 8) == (300, "")
    assert prompt_length_limit(None, None, 8) == (None, "")  # no model (a vLLM server): nothing to derive it from
    with pytest.raises(ValueError, match="max_completion_length=4096 leaves no room for a prompt"):
        prompt_length_limit(None, tiny_model, 4096)


def test_training_fails_the_episodes_whose_prompt_cannot_fit_and_goes_on(train_one_iteration, caplog,
                                                                          fresh_warning):
    from trl_agents.records import load_trajectories

    tasks = [{"seed": 0, "huge_at": 0}, {"seed": 1, "huge_at": 1}, {"seed": 2}]
    with caplog.at_level(logging.WARNING, logger="trl_agents.rollout.engine"):
        trainer = train_one_iteration("test-huge-observation", tasks, max_turns=3, max_completion_length=8)
    bound = trainer.renderer.max_prompt_length
    assert trainer.args.max_prompt_length is None and bound == 4096 - 8
    by_seed = {}
    for trajectory in trainer.last_rollout.trajectories:
        by_seed.setdefault(trajectory.task["seed"], []).append(trajectory)
    for seed, steps in ((0, 0), (1, 1)):  # failed at the turn of the huge observation, earlier steps kept
        for trajectory in by_seed[seed]:
            assert trajectory.failed and trajectory.num_steps == steps
            assert "tokens without any history, more than max_prompt_length=4088 (the default: the model's " \
                   "context of 4096 tokens" in trajectory.error
    assert all(not t.failed and t.num_steps == 3 for t in by_seed[2])
    explained = [r for r in caplog.records if "Episodes whose prompt does not fit" in r.getMessage()]
    assert len(explained) == 1  # once, however many episodes fail
    rows = load_trajectories(trainer.args.output_dir)
    prompts = [ids for ids in rows["prompt_ids"] if ids]
    assert prompts and max(len(ids) for ids in prompts) <= bound


def test_evaluation_bounds_prompts_by_default(tiny_model, tokenizer, fresh_warning):
    from trl_agents.evaluation import evaluate_policy

    tasks = [{"seed": 0, "huge_at": 0}, {"seed": 1, "huge_at": 2}, {"seed": 2}]
    result = evaluate_policy(tiny_model, tokenizer, "test-huge-observation", tasks=tasks, max_turns=3,
                             max_new_tokens=4, return_rollout=True)
    failed = {t.task["seed"]: t.error for t in result["rollout"].trajectories if t.failed}
    assert sorted(failed) == [0, 1] and result["failed_episodes"] == 2
    assert "more than max_prompt_length=4092" in failed[0]
    assert max(len(step.prompt_ids) for t in result["rollout"].trajectories for step in t.steps) <= 4092


def test_conversations_end_at_the_bound_and_fail_when_they_cannot_start(tiny_model, tokenizer, scripted,
                                                                        fresh_warning):
    generator = scripted(lambda *a: "a")
    limit, origin = prompt_length_limit(None, tiny_model, 4)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, max_prompt_length=limit,
                                                     max_prompt_length_origin=origin),
                           max_turns=3, sampling=SamplingParams(max_new_tokens=4), row_format="conversation")
    batch = engine.run([{"env": "test-huge-observation", "seed": 0, "huge_at": 0},
                        {"env": "test-huge-observation", "seed": 1, "huge_at": 1}], num_generations=1)
    first, second = batch.trajectories
    assert first.failed and first.num_steps == 0
    assert "The first prompt of this conversation has" in first.error and "max_prompt_length=4092" in first.error
    assert not second.failed and second.num_steps == 1  # outgrew its context after turn 0: ended (truncated) there
    assert all(len(p) <= limit for call in generator.calls for p in call)
    assert HUGE not in engine.renderer._env_turn_cache  # the tokens of huge observations are not kept for reuse


def test_a_run_whose_every_prompt_is_too_long_stops_in_one_line(tmp_path, fresh_warning):
    """The probe's `max_prompt_length 1024` run: every episode fails, and after `EmptyRollouts.limit` such rollouts
    the run stops with one line naming the prompt length and the bound, not a traceback."""
    from trl_agents.cli import main

    config = tmp_path / "huge.yaml"
    config.write_text(
        "method: grpo\ntiny_model: true\ntiny_model_kwargs: {hidden_size: 32, num_layers: 1, num_heads: 2, "
        "num_kv_heads: 1}\nenv_name: test-huge-observation\nenv_kwargs: {huge_chars: 3000}\nnum_train_tasks: 2\n"
        "num_eval_tasks: 1\nmax_turns: 2\nmax_completion_length: 4\nmax_steps: 4\nper_device_train_batch_size: 4\n"
        "num_generations: 2\ngradient_checkpointing: false\nreport_to: none\nsave_strategy: 'no'\n"
        "disable_tqdm: true\n"
    )
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--config", str(config), "--max_prompt_length", "1024", "--output_dir", str(tmp_path / "run")])
    message = str(stopped.value.code)
    assert "\n" not in message
    assert message.startswith("trl-agents train: error: 3 rollouts in a row left nothing to train on")
    assert re.search(r"The prompt of this turn has \d{4} tokens without any history, more than "
                     r"max_prompt_length=1024\. Raise `max_prompt_length`", message)
