"""ADRS and PCSD end to end on the tiny model (two training steps, both row formats), their trainers' hooks, the
registry entries and the config errors. The math is in tests/methods/adrs/test_adrs_math.py and tests/methods/pcsd/test_pcsd_math.py."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from helpers import train_and_check_moved

from trl_agents.distill import ADRSParams, adrs_advantages
from trl_agents.envs import get_env_class, register_env
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.adrs import ADRSConfig, ADRSTrainer
from trl_agents.trainers.pcsd import PCSDConfig, PCSDTrainer
from trl_agents.trajectory import Group, Step, Trajectory


@register_env
class SkilledKeyword(get_env_class("test-keyword")):  # the toy env of conftest.py, with a teacher-only skills text
    name = "test-keyword-skilled"

    def privileged_context(self):
        return f"Skills: in round {self.turn}, answers with the letter a win."


TASKS = [{"env": "test-keyword-skilled", "seed": s} for s in range(4)]


def train(trainer_class, config_class, tiny_model, tokenizer, tmp_path, **overrides):
    config = tiny_training_config(config_class, tmp_path / "out", max_turns=2, max_completion_length=4, **overrides)
    trainer = trainer_class(model=tiny_model, args=config, train_dataset=Dataset.from_list(TASKS * 2),
                            processing_class=tokenizer)
    return trainer, train_and_check_moved(trainer)


# ---------------------------------------------------------------- ADRS


@pytest.mark.parametrize("row_format, variant", [("step", "released"), ("conversation", "paper")])
def test_adrs_trains_two_steps_with_its_schedule(row_format, variant, tiny_model, tokenizer, tmp_path):
    # warm-up of 1 step: step 1 is pure GRPO (η_eff = 0, base entropy coefficient), step 2 has the teacher term
    trainer, logs = train(ADRSTrainer, ADRSConfig, tiny_model, tokenizer, tmp_path, row_format=row_format,
                          adrs_variant=variant, adrs_eta=0.5, adrs_warmup_steps=1, adrs_active_steps=None,
                          entropy_coef=0.001, adrs_entropy_coef_active=0.01)
    assert len(logs) == 2
    assert [h["adrs/eta_eff"] for h in logs] == [0.0, 0.5]
    assert [h["adrs/entropy_coef"] for h in logs] == pytest.approx([0.001, 0.01])
    assert trainer.entropy_coef == 0.01  # what TRL's loss of step 2 used
    assert logs[0]["adrs/teacher_term_abs_mean"] == 0.0
    for h in logs:
        assert math.isfinite(h["adrs/tva"]) and 0.0 < h["adrs/gate"] < 1.0
        assert "signals/teacher_logprobs_seconds" in h and "clip_ratio/region_mean" in h  # TRL's policy loss ran
    assert trainer.teacher.kind == "current"
    assert trainer.args.resolved_adrs_unit == ("step" if row_format == "step" else "episode")


def episode(logps_per_step, reward):
    steps = [Step("o", "a", action_ids=list(range(len(lp))), signals={"teacher_logprobs": lp}) for lp in logps_per_step]
    steps[-1].reward = reward
    return Trajectory(task={}, steps=steps)


def test_adrs_hook_uses_the_global_step_and_the_config(tiny_model, tokenizer, tmp_path):
    config = tiny_training_config(ADRSConfig, tmp_path, adrs_warmup_steps=1, adrs_active_steps=1, adrs_eta=0.1,
                                  adrs_variant="paper", entropy_coef=0.002, adrs_entropy_coef_active=0.0)
    trainer = ADRSTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
    trainer.model.train()  # as in train(): the schedule sets TRL's entropy_coef for training rollouts only
    groups = [Group(task={}, trajectories=[episode([[-1.0, -3.0]], 1.0), episode([[-0.5, -1.5], [-2.0]], 0.0)])]
    expected = {s: adrs_advantages(groups, ADRSParams(adrs_eta=0.1, eta_eff=e, adrs_variant="paper", adrs_unit="step"))[0]
                for s, e in ((0, 0.0), (1, 0.1), (2, 0.0))}
    for global_step, coef in ((0, 0.002), (1, 0.0), (2, 0.002)):  # steps 1, 2, 3: warm-up, active, after
        trainer.state.global_step = global_step
        assert trainer.compute_advantages(groups) == expected[global_step]
        assert trainer.entropy_coef == coef
    assert expected[1] != expected[0]


# ---------------------------------------------------------------- PCSD


@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_pcsd_trains_two_steps(row_format, tiny_model, tokenizer, tmp_path):
    trainer, logs = train(PCSDTrainer, PCSDConfig, tiny_model, tokenizer, tmp_path, row_format=row_format)
    assert len(logs) == 2
    for h in logs:
        assert math.isfinite(h["pcsd/loss"]) and 0.0 < h["pcsd/mean_weight"] < 1.0
        assert 0.0 <= h["pcsd/weight_above_half"] <= 1.0
        assert "clip_ratio/region_mean" in h  # on GRPO: TRL's policy loss ran too
    assert trainer.teacher.kind == "frozen"  # our sources' teacher: the step-0 policy


def test_pcsd_loss_matches_the_math_on_a_micro_batch(tiny_model, tokenizer, tmp_path):
    from trl_agents.distill import pcsd_token_terms

    config = tiny_training_config(PCSDConfig, tmp_path, teacher="current", pcsd_coef=0.5)
    trainer = PCSDTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
    student = torch.tensor([[-1.0, -2.0, -0.5, 0.0]], requires_grad=True)
    teacher = torch.tensor([[-0.5, -1.0, -1.0, 0.0]])
    inputs = {"completion_mask": torch.tensor([[1, 1, 1, 0]]), "signal/teacher_logprobs": teacher,
              "num_items_in_batch": torch.tensor(3.0)}
    loss = trainer.compute_auxiliary_loss(trainer.model, inputs, student)
    terms, _ = pcsd_token_terms(student, teacher, inputs["completion_mask"])
    # λ·Σ terms / (the generation batch's 3 loss tokens); out of training there is no steps_per_generation split
    assert not trainer.model.training
    assert loss.item() == pytest.approx(0.5 * terms[0, :3].sum().item() / 3, abs=1e-6)


# ---------------------------------------------------------------- registry and configs


def test_registry_lists_adrs_and_pcsd():
    assert METHODS["adrs"].signals == ("teacher_logprobs", "privileged_context")
    assert METHODS["pcsd"].signals == ("teacher_logprobs", "privileged_context")
    assert METHODS["adrs"].hook == "compute_advantages" and METHODS["pcsd"].hook == "compute_auxiliary_loss"
    assert METHODS["adrs"].paper == "arXiv 2608.03223" and METHODS["pcsd"].paper == "arXiv 2608.01837"
    assert ADRSTrainer.training_signals == () and PCSDTrainer.training_signals == ("teacher_logprobs",)


@pytest.mark.parametrize("config_class, overrides, message", [
    (ADRSConfig, {"adrs_variant": "fix4"}, "adrs_variant must be one of"),
    (ADRSConfig, {"adrs_unit": "token"}, "adrs_unit must be one of"),
    (ADRSConfig, {"adrs_normalize_mode": "batch"}, "adrs_normalize_mode must be one of"),
    (ADRSConfig, {"adrs_eta": -0.1}, "adrs_eta must be"),
    (ADRSConfig, {"adrs_clip": math.nan}, "adrs_clip must be"),
    (ADRSConfig, {"adrs_tva_tau": 0.0}, "adrs_tva_tau must be"),
    (ADRSConfig, {"adrs_warmup_steps": -1}, "adrs_warmup_steps must be"),
    (ADRSConfig, {"adrs_active_steps": 2.5}, "adrs_active_steps must be"),
    (ADRSConfig, {"scale_rewards": "none"}, "scale_rewards='none' is not supported by ADRS"),
    (ADRSConfig, {"adrs_entropy_coef_active": 0.01}, "needs entropy_coef != 0"),
    (ADRSConfig, {"adrs_entropy_coef_active": 0.01, "entropy_coef": 0.001, "use_adaptive_entropy": True},
     "use_adaptive_entropy"),
    (PCSDConfig, {"pcsd_coef": -1.0}, "pcsd_coef must be"),
    (PCSDConfig, {"pcsd_decay": 0.0}, "pcsd_decay"),
    (PCSDConfig, {"pcsd_var_offset": 0.0}, "pcsd_var_offset"),
    (PCSDConfig, {"pcsd_short_window": 9}, "pcsd_short_window"),
    (PCSDConfig, {"pcsd_window": "centred"}, "pcsd_window must be one of"),
    (PCSDConfig, {"pcsd_mix": "max"}, "pcsd_mix must be one of"),
])
def test_config_errors_are_one_line(config_class, overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message) as err:
        tiny_training_config(config_class, tmp_path, **overrides)
    assert "\n" not in str(err.value)
