"""Solver demonstrations, the SFT warm start and its early stop; evaluation helpers."""

from __future__ import annotations

import pytest
from transformers import TrainerControl, TrainerState

from trl_agents.envs import get_env_class
from trl_agents.evaluation import evaluate_policy, summarize
from trl_agents.rollout import PromptRenderer, RolloutEngine
from trl_agents.rollout.env_pool import EnvPool
from trl_agents.warmstart import SuccessStopper, solver_demonstrations, warm_start


@pytest.mark.parametrize("env_name, history", [("frozenlake", 0), ("sokoban", 2)])
def test_demonstrations_are_rendered_like_rl_prompts_and_solve_the_tasks(env_name, history, tokenizer, scripted):
    tasks = get_env_class(env_name).task_split("train", 3)
    examples = solver_demonstrations(env_name, tasks, history_length=history)
    # The policy answers by looking its prompt up among the demonstrations: a KeyError would mean the SFT prompts
    # differ from what the RL rollout renders.
    demos = {
        tuple(tokenizer.apply_chat_template(e["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)):
        e["completion"][0]["content"]
        for e in examples
    }
    generator = scripted(lambda prompt, *a: demos[tuple(prompt)])
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=history), max_turns=40)
    batch = engine.run(tasks, num_generations=1)
    assert all(t.success for t in batch.trajectories)
    assert sum(t.num_steps for t in batch.trajectories) == len(examples)


def test_an_expert_plan_gives_demonstrations_where_there_is_no_solver(tokenizer, scripted):
    # Search-QA has no `optimal_plan` (answering at once is shorter) but an expert: one search per hop, then the
    # answer. A 1-hop question: 2 demonstrations (search, answer), and replaying them succeeds.
    tasks = [{"env": "searchqa", "seed": s, "hops": 1} for s in range(3)]
    examples = solver_demonstrations("searchqa", tasks, env_kwargs={"num_entities": 200}, history_length=1)
    assert len(examples) == 2 * len(tasks)
    assert [e["completion"][0]["content"].split("[")[0] for e in examples[:2]] == ["search", "answer"]
    demos = {
        tuple(tokenizer.apply_chat_template(e["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)):
        e["completion"][0]["content"]
        for e in examples
    }
    engine = RolloutEngine(scripted(lambda prompt, *a: demos[tuple(prompt)]), PromptRenderer(tokenizer,
                           history_length=1), max_turns=3, env_pool=EnvPool(env_kwargs={"num_entities": 200}))
    assert all(t.success for t in engine.run(tasks, num_generations=1).trajectories)


def test_demonstrations_need_a_solver():
    with pytest.raises(ValueError, match="has no solver"):
        solver_demonstrations("test-keyword", [{"seed": 0}])


def test_success_stopper_stops_at_the_target():
    values = iter([0.1, 0.3, 0.5, 0.9])
    stopper = SuccessStopper(lambda: next(values), every=5, target=0.45)
    state, control = TrainerState(), TrainerControl()
    for step in range(1, 16):
        state.global_step = step
        stopper.on_step_end(None, state, control)
        if control.should_training_stop:
            break
    assert stopper.history == [(5, 0.1), (10, 0.3), (15, 0.5)] and control.should_training_stop


@pytest.mark.slow
def test_warm_start_teaches_the_action_format(tiny_model, tokenizer, tmp_path):
    tasks = get_env_class("frozenlake").task_split("train", 64)
    examples = solver_demonstrations("frozenlake", tasks, history_length=0, system_prompt="Reach G.")
    before = evaluate_policy(tiny_model, tokenizer, "frozenlake", tasks=tasks[:16], max_turns=6, history_length=0,
                             system_prompt="Reach G.", max_new_tokens=3)
    warm_start(tiny_model, tokenizer, examples, output_dir=str(tmp_path), max_steps=40, learning_rate=3e-3,
               batch_size=32)
    after = evaluate_policy(tiny_model, tokenizer, "frozenlake", tasks=tasks[:16], max_turns=6, history_length=0,
                            system_prompt="Reach G.", max_new_tokens=3)
    assert before["valid_action_rate"] < 0.5 < after["valid_action_rate"]


def test_evaluation_summary_and_pass_at_k(tokenizer, scripted):
    tasks = get_env_class("frozenlake").task_split("eval", 2)
    # Two samples per task: the first sample of each batch answers 'jump' (invalid), the second 'up'.
    generator = scripted(lambda prompt, call, row, size: "jump" if row % 2 == 0 else "up")
    result = evaluate_policy(None, tokenizer, "frozenlake", tasks=tasks, max_turns=2, greedy=False, num_samples=2,
                             generator=generator, return_rollout=True)
    assert result["num_tasks"] == 2 and result["num_episodes"] == 4 and result["pass_at_2"] == 0.0
    assert result["valid_action_rate"] == 0.5 and result["episode_length"] == 2.0
    assert summarize(result["rollout"])["success_rate"] == 0.0
    with pytest.raises(ValueError, match="num_samples > 1 needs sampling"):
        evaluate_policy(None, tokenizer, "frozenlake", tasks=tasks, num_samples=2, generator=generator)
