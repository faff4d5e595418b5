"""Teacher signals under privileged views, the three teachers, and OPSD / SDAR end to end on the tiny model.

The math of the losses (hand cases) is in tests/methods/opsd/test_opsd_math.py and tests/methods/sdar/test_sdar_math.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from helpers import train_and_check_moved

from trl_agents.envs import get_env_class, register_env
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.signals import ModelSignalContext, get_signal
from trl_agents.signals.teachers import CopyTeacher, CurrentTeacher, EMATeacher, FrozenAdapterTeacher, build_teacher
from trl_agents.signals.views import PrivilegedView
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.opsd import OPSDConfig, OPSDTrainer
from trl_agents.trainers.sdar import SDARConfig, SDARTrainer


@register_env
class HintedKeyword(get_env_class("test-keyword")):  # the toy env of conftest.py, with a teacher-only hint
    name = "test-keyword-hinted"

    def privileged_context(self):
        return f"The answer to round {self.turn} contains the letter a."


TASKS = [{"env": "test-keyword-hinted", "seed": s} for s in range(4)]


def rollout(tokenizer, scripted, row_format="step", signals=("privileged_context",)):
    engine = RolloutEngine(
        scripted(lambda prompt, call, row, size: "a" if row % 2 else "b b"),
        PromptRenderer(tokenizer, history_length=1), max_turns=2, sampling=SamplingParams(8),
        row_format=row_format, signals=signals,
    )
    return engine.run(TASKS[:2], num_generations=2)


def context_for(model, tokenizer, teacher, row_format="step", max_rows=3, max_tokens=None):
    from contextlib import nullcontext

    return ModelSignalContext(
        model_context=lambda: nullcontext(model), renderer=PromptRenderer(tokenizer, history_length=1),
        row_format=row_format, pad_token_id=tokenizer.pad_token_id, temperature=1.0, max_rows_per_forward=max_rows,
        max_tokens_per_forward=max_tokens, teacher=teacher,
    )


def direct_logps(model, prompt_ids, action_ids):
    """log p(action | prompt) token by token from one unpadded forward."""
    ids = torch.tensor([prompt_ids + action_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(action_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("max_tokens", [None, 40])
def test_teacher_logprobs_equal_a_direct_forward_on_the_privileged_prompt(tiny_model, tokenizer, scripted, max_tokens):
    batch = rollout(tokenizer, scripted)
    tiny_model.eval()
    context = context_for(tiny_model, tokenizer, CurrentTeacher(context_for(tiny_model, tokenizer, None).model_context),
                          max_tokens=max_tokens)
    get_signal("teacher_logprobs", source="env").compute(batch.groups, context)
    view = PrivilegedView(context.renderer, "env")
    for group in batch.groups:
        for trajectory in group.trajectories:
            for index, step in enumerate(trajectory.steps):
                teacher_prompt = view.prompt_ids(trajectory, index)
                assert teacher_prompt != step.prompt_ids and len(teacher_prompt) > len(step.prompt_ids)
                text = tokenizer.decode(teacher_prompt)
                assert step.signals["privileged_context"] in text  # the hint is in the teacher's prompt only
                assert step.signals["privileged_context"] not in tokenizer.decode(step.prompt_ids)
                expected = direct_logps(tiny_model, teacher_prompt, step.action_ids)
                assert torch.allclose(torch.tensor(step.signals["teacher_logprobs"]), expected, atol=1e-5)


def test_conversation_rows_score_every_action_of_an_episode_in_one_unit(tiny_model, tokenizer, scripted):
    batch = rollout(tokenizer, scripted, row_format="conversation")
    tiny_model.eval()
    context = context_for(tiny_model, tokenizer, CurrentTeacher(context_for(tiny_model, tokenizer, None).model_context),
                          row_format="conversation")
    get_signal("teacher_logprobs", source="env").compute(batch.groups, context)
    view = PrivilegedView(context.renderer, "env", row_format="conversation")
    for trajectory in batch.trajectories:
        prompt = view.prompt_ids(trajectory, 0)  # the first user message carries the first step's hint
        continuation, spans = [], []
        for index, step in enumerate(trajectory.steps):
            spans.append((len(continuation), len(step.action_ids)))
            continuation += step.action_ids + (step.env_ids if index < len(trajectory.steps) - 1 else [])
        expected = direct_logps(tiny_model, prompt, continuation)
        for step, (start, length) in zip(trajectory.steps, spans, strict=True):
            assert torch.allclose(torch.tensor(step.signals["teacher_logprobs"]), expected[start : start + length],
                                  atol=1e-5)


def test_task_and_future_sources(tokenizer, scripted):
    batch = rollout(tokenizer, scripted, signals=())
    trajectory = batch.trajectories[0]
    trajectory.task["answer"] = "aaa"
    renderer = PromptRenderer(tokenizer, history_length=1)
    assert PrivilegedView(renderer, "task:answer").context(trajectory, 0) == "aaa"
    assert PrivilegedView(renderer, "future").context(trajectory, 0) == trajectory.steps[1].observation
    assert PrivilegedView(renderer, lambda t, i: f"step {i}").context(trajectory, 1) == "step 1"
    with pytest.raises(ValueError, match="no field 'gold'"):
        PrivilegedView(renderer, "task:gold").context(trajectory, 0)
    with pytest.raises(ValueError, match="privileged_context"):  # source 'env' without the env signal recorded
        PrivilegedView(renderer, "env").context(trajectory, 0)
    with pytest.raises(ValueError, match="privileged_source must be"):
        PrivilegedView(renderer, "oracle")


def test_frozen_lora_teacher_is_the_adapter_disabled_base(tiny_model, tokenizer, scripted):
    from peft import LoraConfig, get_peft_model

    base = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    peft_model = get_peft_model(tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                       init_lora_weights=False))  # a non-zero adapter
    peft_model.eval()
    teacher = build_teacher("frozen", peft_model, lambda: _yield(peft_model))
    assert isinstance(teacher, FrozenAdapterTeacher)  # no second copy of the weights
    batch = rollout(tokenizer, scripted)
    get_signal("teacher_logprobs", source="env").compute(batch.groups, context_for(peft_model, tokenizer, teacher))
    view = PrivilegedView(PromptRenderer(tokenizer, history_length=1), "env")
    trajectory = batch.trajectories[0]
    prompt, action = view.prompt_ids(trajectory, 0), trajectory.steps[0].action_ids
    with peft_model.disable_adapter():
        base_logps = direct_logps(peft_model, prompt, action)
    with_adapter = direct_logps(peft_model, prompt, action)
    assert torch.allclose(torch.tensor(trajectory.steps[0].signals["teacher_logprobs"]), base_logps, atol=1e-5)
    assert not torch.allclose(base_logps, with_adapter, atol=1e-4)  # the adapter does change the scores
    after = {n.replace(".base_layer", ""): p for n, p in peft_model.get_base_model().named_parameters() if "lora_" not in n}
    assert after.keys() == base.keys() and all(torch.equal(base[n], after[n]) for n in base)  # untouched


def _yield(model):
    from contextlib import nullcontext

    return nullcontext(model)


def test_full_model_teachers(tiny_model):
    assert isinstance(build_teacher("current", tiny_model, lambda: _yield(tiny_model)), CurrentTeacher)
    frozen = build_teacher("frozen", tiny_model, lambda: _yield(tiny_model))
    assert isinstance(frozen, CopyTeacher) and frozen.model is not tiny_model
    reference = object()
    assert build_teacher("frozen", tiny_model, lambda: _yield(tiny_model), reference=reference).model is reference
    ema = build_teacher("ema", tiny_model, lambda: _yield(tiny_model), ema_decay=0.75)
    assert isinstance(ema, EMATeacher)
    weight = next(tiny_model.parameters())
    before = weight.detach().clone()
    with torch.no_grad():
        weight.add_(4.0)
    ema.update(tiny_model)
    # θ_T = 0.75·θ_0 + 0.25·(θ_0 + 4) = θ_0 + 1
    assert torch.allclose(next(ema.model.parameters()), before + 1.0, atol=1e-6)
    assert all(not p.requires_grad for p in ema.model.parameters())
    with pytest.raises(ValueError, match="teacher must be one of"):
        build_teacher("oracle", tiny_model, lambda: _yield(tiny_model))


def test_ema_adapter_teacher_tracks_the_adapter(tiny_model):
    from peft import LoraConfig, get_peft_model

    from trl_agents.signals.teachers import EMA_ADAPTER

    peft_model = get_peft_model(tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"],
                                                       init_lora_weights=False))
    teacher = build_teacher("ema", peft_model, lambda: _yield(peft_model), ema_decay=0.5)
    pairs = teacher._pairs(peft_model)
    assert pairs and all(torch.equal(t, s) for t, s in pairs)
    assert all(not t.requires_grad for t, _ in pairs) and all(s.requires_grad for _, s in pairs)
    with torch.no_grad():
        for _, student in pairs:
            student.add_(2.0)
    teacher.update(peft_model)
    assert all(torch.allclose(t, s - 1.0) for t, s in pairs)  # halfway: 0.5·θ + 0.5·(θ + 2)
    with teacher.context() as model:
        assert model.active_adapter == EMA_ADAPTER
    assert peft_model.active_adapter == "default" and all(not t.requires_grad for t, _ in pairs)


# ---------------------------------------------------------------- end to end on the tiny model


def train(trainer_class, config_class, tiny_model, tokenizer, tmp_path, **overrides):
    config = tiny_training_config(config_class, tmp_path / "out", max_turns=2, max_completion_length=4, **overrides)
    trainer = trainer_class(model=tiny_model, args=config, train_dataset=Dataset.from_list(TASKS * 2),
                            processing_class=tokenizer)
    return trainer, train_and_check_moved(trainer)


@pytest.mark.slow
@pytest.mark.parametrize("row_format", ["step", "conversation"])
@pytest.mark.parametrize("loss", ["jsd", "sampled_token"])
def test_opsd_trains_two_steps(loss, row_format, tiny_model, tokenizer, tmp_path):
    trainer, logs = train(OPSDTrainer, OPSDConfig, tiny_model, tokenizer, tmp_path, opsd_loss=loss,
                          row_format=row_format)
    assert len(logs) == 2 and all(math.isfinite(h["opsd/loss"]) for h in logs)
    assert "clip_ratio/region_mean" not in logs[0]  # policy_loss_coef = 0: TRL's policy loss never ran
    name = "teacher_prompt" if loss == "jsd" else "teacher_logprobs"
    assert f"signals/{name}_seconds" in logs[0]
    assert isinstance(trainer.teacher, CopyTeacher)  # the frozen step-0 copy (no LoRA, no reference model)


@pytest.mark.slow
@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_sdar_trains_two_steps(row_format, tiny_model, tokenizer, tmp_path):
    trainer, logs = train(SDARTrainer, SDARConfig, tiny_model, tokenizer, tmp_path, row_format=row_format)
    assert all(math.isfinite(h["sdar/loss"]) and 0.0 < h["sdar/mean_gate"] < 1.0 for h in logs)
    assert "clip_ratio/region_mean" in logs[0]  # on GRPO: TRL's policy loss ran too
    assert isinstance(trainer.teacher, CurrentTeacher)


@pytest.mark.slow
def test_opsd_as_an_auxiliary_loss_on_grpo_with_an_ema_teacher(tiny_model, tokenizer, tmp_path):
    trainer, logs = train(OPSDTrainer, OPSDConfig, tiny_model, tokenizer, tmp_path, opsd_loss="sampled_token",
                          policy_loss_coef=1.0, teacher="ema", teacher_ema_decay=0.5)
    assert "clip_ratio/region_mean" in logs[0]
    policy = dict(trainer.model.named_parameters())
    moved = [n for n, p in trainer.teacher.model.named_parameters() if not torch.equal(p, policy[n].detach())]
    assert moved  # the EMA lags behind the policy


def test_registry_lists_the_distillation_methods():
    assert METHODS["sdar"].signals == ("teacher_logprobs", "privileged_context")
    assert METHODS["opsd"].signals == ("teacher_prompt", "privileged_context")
    assert METHODS["grpo_opsd"].defaults == {"sdar_gate_beta": 0.0}
    assert "privileged_context" in METHODS["sdar"].env_capabilities


def test_an_env_without_privileged_context_is_refused_at_start_up(tiny_model, tokenizer, tmp_path):
    config = tiny_training_config(SDARConfig, tmp_path)
    with pytest.raises(ValueError, match="lacks privileged_context"):
        SDARTrainer(model=tiny_model, args=config, train_dataset=[{"env": "test-keyword", "seed": 0}],
                    processing_class=tokenizer)
    # A task-field view needs no environment capability.
    config = tiny_training_config(SDARConfig, tmp_path, privileged_source="task:hint")
    SDARTrainer(model=tiny_model, args=config, train_dataset=[{"env": "test-keyword", "seed": 0, "hint": "a"}],
                processing_class=tokenizer)


def test_config_errors_are_one_line(tmp_path):
    for field_name, value, message in [
        ("opsd_beta", 1.5, "opsd_beta must be in"), ("opsd_loss", "kl", "opsd_loss must be one of"),
        ("opsd_top_k", 0, "opsd_top_k must be"), ("teacher", "oracle", "teacher must be one of"),
        ("privileged_source", "oracle", "privileged_source must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            tiny_training_config(OPSDConfig, tmp_path, **{field_name: value})
    with pytest.raises(ValueError, match="nothing would be trained"):
        tiny_training_config(OPSDConfig, tmp_path, opsd_coef=0.0)
    with pytest.raises(ValueError, match="sdar_gate_beta"):
        tiny_training_config(SDARConfig, tmp_path, sdar_gate_beta=-1.0)


def test_settings_that_would_fail_later_fail_at_start_up(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="privileged_template must format with only"):
        tiny_training_config(SDARConfig, tmp_path, privileged_template="{context} {prompt} {task}")
    with pytest.raises(ValueError, match="beta=0.04 is the KL term of TRL's policy loss"):
        tiny_training_config(OPSDConfig, tmp_path, beta=0.04)
    config = tiny_training_config(SDARConfig, tmp_path, privileged_source="task:answer")
    with pytest.raises(ValueError, match="reads the task field 'answer'"):
        SDARTrainer(model=tiny_model, args=config, train_dataset=[{"env": "test-keyword", "seed": 0}],
                    processing_class=tokenizer)
    config = tiny_training_config(SDARConfig, tmp_path, teacher="frozen", sync_ref_model=True, beta=0.04)
    with pytest.raises(ValueError, match="sync_ref_model=True moves TRL's reference model"):
        SDARTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
