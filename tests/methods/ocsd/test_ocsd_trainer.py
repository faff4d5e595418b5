"""OCSD's replay views and `ocsd_residual` signal on real rollouts, and OCSDTrainer end to end on the tiny model.

The math (selection, gate, modulation, hand cases and guards) is in tests/methods/ocsd/test_ocsd_math.py.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from helpers import train_and_check_moved

from trl_agents.distill.ocsd import (
    DEFAULT_PLACEHOLDER,
    DEFAULT_TERMINAL_TEXT,
    SIGNAL_NAME,
    replay_observation,
    replay_views,
)
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.signals import ModelSignalContext, get_signal
from trl_agents.signals.teachers import CopyTeacher, CurrentTeacher
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.ocsd import OCSDConfig, OCSDTrainer

TASKS = [{"env": "test-keyword", "seed": s, "length": 3} for s in range(2)]  # conftest's toy env, 3 turns


def rollout(tokenizer, scripted):
    engine = RolloutEngine(
        scripted(lambda prompt, call, row, size: "a" if row % 2 else "b b"),
        PromptRenderer(tokenizer, history_length=1), max_turns=3, sampling=SamplingParams(8),
    )
    return engine.run(TASKS, num_generations=2)


def context_for(model, tokenizer, max_rows=3, max_tokens=None, row_format="step"):
    return ModelSignalContext(
        model_context=lambda: nullcontext(model), renderer=PromptRenderer(tokenizer, history_length=1),
        row_format=row_format, pad_token_id=tokenizer.pad_token_id, temperature=1.0, max_rows_per_forward=max_rows,
        max_tokens_per_forward=max_tokens,
    )


def direct_logps(model, prompt_ids, action_ids):
    """log p(action | prompt) token by token from one unpadded forward."""
    ids = torch.tensor([prompt_ids + action_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(action_ids)[:, None]).squeeze(-1)


def test_full_and_ablated_views_differ_only_in_the_observation(tokenizer, scripted):
    batch = rollout(tokenizer, scripted)
    renderer = PromptRenderer(tokenizer, history_length=1)
    full, ablated = replay_views(renderer)
    for trajectory in batch.trajectories:
        assert len(trajectory.steps) == 3
        for index, step in enumerate(trajectory.steps):
            observation = replay_observation(trajectory, index)
            assert observation == step.next_observation  # the env's reply to this action ("Round k+1 of ...")
            if index + 1 < len(trajectory.steps):
                assert observation == trajectory.steps[index + 1].observation
            full_text, ablated_text = full.user_message(trajectory, index), ablated.user_message(trajectory, index)
            assert observation in full_text and observation not in ablated_text
            assert full_text.replace(observation, DEFAULT_PLACEHOLDER) == ablated_text  # nothing else differs
            student = renderer.step_user_message(step.prompt_parts.task, step.prompt_parts.history,
                                                 step.prompt_parts.observation)
            assert full_text.startswith(student + "\n\n")  # the scaffold comes after the student's message
            full_ids, ablated_ids = full.prompt_ids(trajectory, index), ablated.prompt_ids(trajectory, index)
            assert full_ids != ablated_ids
            decoded = tokenizer.decode(full_ids)
            assert observation in decoded and decoded.index(observation) > decoded.index(step.observation)
    # the last step without a terminal observation reads the fixed terminal text
    trajectory = batch.trajectories[0]
    trajectory.steps[-1].next_observation = None
    assert replay_observation(trajectory, 2) == DEFAULT_TERMINAL_TEXT
    assert DEFAULT_TERMINAL_TEXT in full.user_message(trajectory, 2)
    trajectory.steps[0].next_observation = None  # a middle step falls back to the next step's observation
    assert replay_observation(trajectory, 0) == trajectory.steps[1].observation


@pytest.mark.parametrize("max_tokens", [None, 40])
def test_residuals_equal_direct_forwards_on_both_views(tiny_model, tokenizer, scripted, max_tokens):
    batch = rollout(tokenizer, scripted)
    tiny_model.eval()
    context = context_for(tiny_model, tokenizer, max_tokens=max_tokens)
    get_signal(SIGNAL_NAME, select_fraction=1.0).compute(batch.groups, context)  # ρ = 1: every step is scored
    full, ablated = replay_views(context.renderer)
    for trajectory in batch.trajectories:
        for index, step in enumerate(trajectory.steps):
            expected = (direct_logps(tiny_model, full.prompt_ids(trajectory, index), step.action_ids)
                        - direct_logps(tiny_model, ablated.prompt_ids(trajectory, index), step.action_ids))
            residual = torch.tensor(step.signals[SIGNAL_NAME])
            assert residual.shape == expected.shape and torch.allclose(residual, expected, atol=1e-5)
            assert torch.all(torch.isfinite(residual)) and residual.abs().max() > 0  # the observation matters


def test_only_the_most_uncertain_step_of_each_trajectory_is_scored(tiny_model, tokenizer, scripted):
    batch = rollout(tokenizer, scripted)
    for number, trajectory in enumerate(batch.trajectories):
        # behaviour log-probs: mean NLL 0.5 everywhere except one step per trajectory (k = number % 3) at 2.0
        for index, step in enumerate(trajectory.steps):
            step.action_logprobs = [-2.0 if index == number % 3 else -0.5] * len(step.action_ids)
    get_signal(SIGNAL_NAME).compute(batch.groups, context_for(tiny_model, tokenizer))  # ρ = 0.2, K = 3 → 1 step
    for number, trajectory in enumerate(batch.trajectories):
        scored = [i for i, s in enumerate(trajectory.steps) if s.signals[SIGNAL_NAME] is not None]
        assert scored == [number % 3]
        step = trajectory.steps[number % 3]
        assert len(step.signals[SIGNAL_NAME]) == len(step.action_ids)


def test_the_signal_scores_nothing_when_no_step_is_eligible(tiny_model, tokenizer, scripted):
    batch = rollout(tokenizer, scripted)
    for step in (s for t in batch.trajectories for s in t.steps):
        step.action_logprobs = [float("nan")] * len(step.action_ids)
    get_signal(SIGNAL_NAME).compute(batch.groups, context_for(tiny_model, tokenizer))
    assert all(s.signals[SIGNAL_NAME] is None for t in batch.trajectories for s in t.steps)
    get_signal(SIGNAL_NAME).compute([], context_for(tiny_model, tokenizer))  # an empty rollout


def test_step_rows_only(tiny_model, tokenizer, scripted, tmp_path):
    with pytest.raises(ValueError, match="row_format='step'"):
        get_signal(SIGNAL_NAME).compute(rollout(tokenizer, scripted).groups,
                                        context_for(tiny_model, tokenizer, row_format="conversation"))
    with pytest.raises(ValueError, match="not supported by OCSD"):
        tiny_training_config(OCSDConfig, tmp_path, row_format="conversation")


def test_config_errors_are_one_line(tmp_path):
    for field_name, value, message in [
        ("ocsd_beta", 1.0, r"ocsd_beta must be in \[0, 1\)"), ("ocsd_beta", -0.5, "ocsd_beta must be"),
        ("ocsd_select_fraction", 0.0, "ocsd_select_fraction must be"),
        ("ocsd_scaffold", "no slot here", "ocsd_scaffold must"), ("ocsd_placeholder", 3, "ocsd_placeholder must be"),
        ("advantage_estimator", "rloo", "advantage_estimator must be one of"),
    ]:
        with pytest.raises(ValueError, match=message) as info:
            tiny_training_config(OCSDConfig, tmp_path, **{field_name: value})
        assert "\n" not in str(info.value)


def test_registry_lists_ocsd():
    method = METHODS["ocsd"]
    assert method.trainer_class is OCSDTrainer and method.paper == "arXiv 2608.04788"
    assert method.signals == (SIGNAL_NAME,) and method.env_capabilities == ()
    options = OCSDTrainer.signal_options(SimpleNamespace(**method.config_defaults()))[SIGNAL_NAME]
    assert options["select_fraction"] == 0.2 and options["placeholder"] == DEFAULT_PLACEHOLDER


def test_the_views_are_scored_by_the_configured_teacher(tiny_model, tokenizer, tmp_path):
    config = tiny_training_config(OCSDConfig, tmp_path, teacher="frozen")
    trainer = OCSDTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
    assert isinstance(trainer.teacher, CopyTeacher) and trainer.signal_context.teacher is trainer.teacher


# ---------------------------------------------------------------- end to end on the tiny model


@pytest.mark.slow
def test_ocsd_trains_two_steps(tiny_model, tokenizer, tmp_path):
    config = tiny_training_config(OCSDConfig, tmp_path / "out", max_turns=3, max_completion_length=4)
    trainer = OCSDTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list(TASKS * 4),
                          processing_class=tokenizer)
    logs = train_and_check_moved(trainer)
    for h in logs:
        assert 0.0 < h["ocsd/selected_fraction"] <= 1.0 and 0.0 <= h["ocsd/mean_abs_q"] < 1.0
        assert math.isfinite(h["ocsd/mean_residual"]) and h["ocsd/nonfinite_residual_fraction"] == 0.0
        assert h["signals/ocsd_residual_seconds"] > 0
    # one step of each 3-step episode scored (⌈0.2·3⌉ = 1), with one residual per action token
    for trajectory in trainer.last_rollout.trajectories:
        scored = [s for s in trajectory.steps if s.signals.get(SIGNAL_NAME) is not None]
        assert len(scored) == 1 and len(scored[0].signals[SIGNAL_NAME]) == len(scored[0].action_ids)
    # the scored steps get one advantage per action token, the others GRPO's scalar
    groups = [group.healthy() for group in trainer.last_rollout.groups]
    for group, group_advantages in zip(groups, trainer.compute_advantages(groups), strict=True):
        for trajectory, values in zip(group.trajectories, group_advantages, strict=True):
            for step, value in zip(trajectory.steps, values, strict=True):
                if step.signals[SIGNAL_NAME] is None:
                    assert isinstance(value, float)
                else:
                    assert isinstance(value, list) and len(value) == len(step.action_ids)
    assert isinstance(trainer.teacher, CurrentTeacher)
