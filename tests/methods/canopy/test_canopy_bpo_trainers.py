"""CANOPY and BPO trainers: the adaptive and branching topologies under training, their rules and their logs.

The math (coverage, sibling leave-one-out, prefix propagation) is in tests/methods/canopy/test_canopy_credit.py and
tests/methods/bpo/test_bpo_credit.py; the topologies with scripted generators in tests/rollout/test_topologies.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset

from trl_agents.envs import get_env_class, register_env
from trl_agents.records import load_trajectories
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.bpo import BPOConfig, BPOTrainer
from trl_agents.trainers.canopy import CANOPYConfig, CANOPYTrainer, group_cap


@register_env
class OneShot(get_env_class("test-keyword")):  # one turn: success iff the reply contains "a"
    name = "test-one-shot"

    def reset(self, task):
        self.turn, self.seed, self.length = 0, task["seed"], 1
        return f"Round 0 of task {task['seed']}."


@register_env
class CrashOnSecondReset(OneShot):
    """Its second reset of each task fails (an infrastructure failure: not scored, removed)."""

    name = "test-one-shot-flaky"
    resets: dict[int, int] = {}

    def reset(self, task):
        count = CrashOnSecondReset.resets[task["seed"]] = CrashOnSecondReset.resets.get(task["seed"], 0) + 1
        if count == 2:
            raise ConnectionError("simulator unreachable")
        return super().reset(task)


def canopy_config(tmp_path, **overrides):
    values = {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4, "max_turns": 1,
              "canopy_round_size": 2, "canopy_max_group_size": 6, **overrides}
    return tiny_training_config(CANOPYConfig, tmp_path / "canopy", **values)


def test_canopy_groups_grow_until_they_mix_and_the_episodes_are_logged(tiny_model, tokenizer, scripted, tmp_path):
    # Task 0 answers "a" on the 3rd episode it plays (mixed after round 2: 4 episodes); task 1 never does (capped, 6).
    answered: dict[str, int] = {}

    def policy(prompt_ids, call, row, size):
        key = tokenizer.decode(prompt_ids).rsplit("task ", 1)[1].split(".")[0]
        answered[key] = answered.get(key, 0) + 1
        return "a" if key == "0" and answered[key] == 3 else "b"

    trainer = CANOPYTrainer(model=tiny_model, args=canopy_config(tmp_path), processing_class=tokenizer,
                            train_dataset=[{"env": "test-one-shot", "seed": s} for s in (0, 1)],
                            generator=scripted(policy))
    trainer.train()
    groups = trainer.last_rollout.groups
    assert [len(g.trajectories) for g in groups] == [4, 6]
    log = next(h for h in trainer.state.log_history if "topology/mean_episodes_per_task" in h)
    assert log["topology/mean_episodes_per_task"] == 5.0 and log["topology/max_episodes_per_task"] == 6.0
    assert log["topology/signal_fraction"] == 0.5 and log["topology/capped_without_signal_fraction"] == 0.5
    assert log["rollout/episodes"] == 10.0 and log["topology/rounds"] == 3.0
    # GRPO over each healthy group: task 0's [0, 0, 1, 0] gives the success +1.5 / σ; task 1 is all zero.
    rows = load_trajectories(str(tmp_path / "canopy"))
    advantages = {(r["group_index"], r["episode_id"]): r["advantage"] for r in rows}
    assert advantages[(0, 2)] == pytest.approx(0.75 / 0.5, rel=1e-3)  # (1 − 0.25) / std([0, 0, 1, 0]) = 0.5
    assert all(advantages[(1, e)] == 0.0 for e in range(6))


def test_canopy_removes_infrastructure_failures_instead_of_scoring_them(tiny_model, tokenizer, scripted, tmp_path):
    # Round 1: episode 0 answers "a" (success), episode 1 fails at reset: one healthy episode carries no signal.
    # Round 2 (round size 1): episode 2 answers "b". Healthy returns [1, 0]: the group mixes.
    CrashOnSecondReset.resets = {}
    config = canopy_config(tmp_path, per_device_train_batch_size=2, canopy_round_size=1)
    trainer = CANOPYTrainer(model=tiny_model, args=config, processing_class=tokenizer,
                            train_dataset=[{"env": "test-one-shot-flaky", "seed": 0}],
                            generator=scripted(lambda prompt, call, row, size: "a" if call == 0 else "b"))
    trainer.train()
    group = trainer.last_rollout.groups[0]
    assert [t.failed for t in group.trajectories] == [False, True, False]  # the 2nd reset failed
    rows = load_trajectories(str(tmp_path / "canopy"))
    failed = [r for r in rows if r["error"] is not None]
    assert failed and all(r["advantage"] is None for r in failed)  # kept in the records, never trained on
    healthy = [r["advantage"] for r in rows if r["error"] is None and r["group_index"] == 0]
    # Healthy returns [1, 0]: z-scores ±0.7071 (Bessel std 0.7071); a failure scored 0 would have given [1, 0, 0].
    assert sorted(healthy) == pytest.approx([-0.70707, 0.70707], abs=1e-4)


def test_canopy_refuses_a_config_that_reuses_a_rollout(tmp_path):
    with pytest.raises(ValueError, match="strictly on-policy"):
        canopy_config(tmp_path, num_iterations=2)
    with pytest.raises(ValueError, match="strictly on-policy"):
        canopy_config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=4)
    with pytest.raises(ValueError, match="below num_generations"):
        canopy_config(tmp_path, canopy_max_group_size=1)


def test_canopy_defaults_and_coverage_sizing(tmp_path):
    config = canopy_config(tmp_path)
    assert (config.topology, config.beta, config.loss_type, config.invalid_action_penalty) == (
        "adaptive", 1e-4, "dapo", 0.0)
    # p̂ = 0.05, τ = 0.8: the smallest n with 1 − 0.05ⁿ − 0.95ⁿ ≥ 0.8 is 32 (docs/methods/canopy.md).
    assert group_cap(canopy_config(tmp_path, canopy_pilot_success_rate=0.05)) == 32
    assert METHODS["canopy"].topology == "adaptive" and METHODS["bpo"].topology == "branching"


@pytest.mark.slow
@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_canopy_trains_two_steps(row_format, tiny_model_dir, tokenizer, tmp_path):
    # beta > 0 (the KL anchor) needs the model by path (TRL rebuilds the reference model from it).
    config = tiny_training_config(CANOPYConfig, tmp_path / "out", row_format=row_format, max_turns=2,
                                  num_generations=2, per_device_train_batch_size=4, canopy_max_group_size=6)
    trainer = CANOPYTrainer(model=tiny_model_dir, args=config, processing_class=tokenizer,
                            train_dataset=Dataset.from_list([{"env": "test-keyword", "seed": s} for s in range(8)]))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "topology/mean_episodes_per_task" in h]
    assert len(logs) == 2 and all("kl" in h and math.isfinite(h["kl"]) for h in logs)


# ---------------------------------------------------------------- BPO


def bpo_config(tmp_path, **overrides):
    values = {"env_name": "frozenlake", "max_turns": 4, "num_generations": 2, "per_device_train_batch_size": 4,
              "bpo_branch_factor": 3, "history_length": 1, **overrides}
    return tiny_training_config(BPOConfig, tmp_path / "bpo", **values)


@pytest.mark.slow
@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_bpo_trains_two_steps(row_format, tiny_model, tokenizer, tmp_path):
    tasks = [{"env": "frozenlake", "seed": s} for s in range(4)]
    trainer = BPOTrainer(model=tiny_model, args=bpo_config(tmp_path, row_format=row_format), train_dataset=tasks,
                         processing_class=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "bpo/num_sibling_sets" in h]
    assert len(logs) == 2
    for log in logs:
        assert log["bpo/num_sibling_sets"] == 2.0 and log["bpo/mean_siblings"] == 3.0  # 2 backbones, K = 3
        assert log["topology/leaves_per_task"] == 6.0  # 2 × (1 + 2 forks)
        assert log["signals/entropy_seconds"] > 0  # the entropies that ranked the branch points
        assert log["bpo/generated_tokens_per_task"] * 2 == log["rollout/generated_tokens"]  # 2 tasks per rollout
    group = trainer.last_rollout.groups[0]
    assert [t.parent_id for t in group.trajectories] == [None, None, 0, 0, 1, 1]
    # The records hold every step once, with the tree's links.
    rows = load_trajectories(str(tmp_path / "bpo"))
    last = rows.filter(lambda r: r["rollout"] == 1 and r["group_index"] == 0)
    assert len(last) == sum(len(t.owned_steps) for t in group.trajectories)
    assert {r["parent_id"] for r in last} == {None, "0", "1"} and all(r["branch_id"] is not None for r in last)


def test_bpo_needs_snapshots_and_refuses_other_topologies(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="lacks snapshot"):
        BPOTrainer(model=tiny_model, args=bpo_config(tmp_path, env_name="test-keyword"), processing_class=tokenizer,
                   train_dataset=[{"env": "test-keyword", "seed": 0}])
    with pytest.raises(ValueError, match="'branching' topology"):
        bpo_config(tmp_path, topology="independent")
    with pytest.raises(ValueError, match="bpo_branch_score must be one of"):
        bpo_config(tmp_path, bpo_branch_score="surprise")
    assert METHODS["bpo"].signals == ("entropy",) and METHODS["bpo"].env_capabilities == ("snapshot",)


def test_evaluation_rollouts_run_the_independent_topology(tiny_model, tokenizer, scripted, tmp_path):
    # Training groups of a task that never mixes grow to the cap; evaluation plays G episodes per task, so that its
    # metrics stay per-episode rates.
    config = canopy_config(tmp_path, num_generations_eval=2, per_device_eval_batch_size=2)
    tasks = [{"env": "test-one-shot", "seed": s} for s in (0, 1)]
    trainer = CANOPYTrainer(model=tiny_model, args=config, processing_class=tokenizer, train_dataset=tasks,
                            eval_dataset=tasks[:1], generator=scripted(lambda *a: "b"))
    trainer.train()
    assert [len(g.trajectories) for g in trainer.last_rollout.groups] == [6, 6]
    trainer.evaluate()
    assert [len(g.trajectories) for g in trainer.last_rollout.groups] == [2]
