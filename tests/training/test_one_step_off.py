"""One-step-off training (`max_staleness=1`, trl_agents.training.one_step_off; docs/async.md#one-step-off): the
exact checks. Staleness 0 through the machinery equals today's path; one-step-off trains every task once, in
order, each rollout with the lag it should have (read back from the trajectory records); a run killed with a
rollout in flight and resumed equals the uninterrupted run; methods that need on-policy data refuse."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
from trl_agents.envs import get_env_class
from trl_agents.records import load_trajectories
from trl_agents.testing import SeededScriptGenerator, tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.training import one_step_off as oso
from trl_agents.training.one_step_off import OneStepOff, VERSION_KEY

ACTIONS = ["```up```", "```down```", "```left```", "```right```"]


def config(output_dir, **overrides):
    settings = dict(env_name="frozenlake", max_steps=3, per_device_train_batch_size=8, num_generations=4,
                    max_turns=3, seed=0, save_strategy="no", report_to="none")
    return tiny_training_config(AgentGRPOConfig, output_dir, **{**settings, **overrides})


def tasks(count=32):
    return get_env_class("frozenlake").task_split("train", count)


def trained(trainer) -> list[tuple]:
    """(step, loss, grad_norm) of every logged training step."""
    return [(log["step"], log["loss"], log["grad_norm"]) for log in trainer.state.log_history if "loss" in log]


def rows(output_dir) -> list[dict]:
    """The recorded steps without the run's identity (run_id, config hash) and the policy version."""
    out = []
    for row in load_trajectories(str(output_dir)):
        row = {k: v for k, v in row.items() if k not in ("run_id", "config_hash")}
        info = json.loads(row.pop("info") or "{}")
        info.pop(VERSION_KEY, None)
        out.append({**row, "info": info})
    return out


def versions(output_dir) -> list[tuple[int, int]]:
    """(trained at step, policy version) of every recorded step."""
    return [(row["global_step"], json.loads(row["info"])[VERSION_KEY]) for row in load_trajectories(str(output_dir))]


def test_staleness_zero_through_the_machinery_gives_todays_rows_losses_and_grad_norms(tiny_model_dir, tokenizer,
                                                                                      tmp_path):
    # The built-in generator (the tiny model, sampled from the global random state as today), fp32, 3 steps. The
    # second run goes through the one-step-off machinery (look-ahead batches, version stamps and checks) with
    # max_staleness=0, so every rollout is generated in place: rows, losses and gradient norms must be identical.
    results = []
    for name, machinery in (("today", False), ("machinery", True)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        trainer = AgentGRPOTrainer(model=model, args=config(tmp_path / name), train_dataset=tasks(),
                                   processing_class=tokenizer)
        if machinery:
            trainer.one_step_off = OneStepOff(trainer._background_rollout)
        trainer.train()
        results.append((trained(trainer), rows(tmp_path / name)))
    (today_losses, today_rows), (losses, machinery_rows) = results
    assert len(today_losses) == 3 and losses == today_losses
    assert machinery_rows == today_rows
    assert {version for _, version in versions(tmp_path / "machinery")} == {0, 1, 2}
    assert all(step == version for step, version in versions(tmp_path / "machinery"))  # lag 0 everywhere


def test_one_step_off_trains_every_task_once_in_order_with_lag_one(tiny_model, tokenizer, tmp_path):
    # A generator whose answers depend only on (prompt, request seed): the sync run and the one-step-off run see the
    # same episodes, so the records show that no task is lost, duplicated or moved. 16 tasks, 2 per step: an epoch
    # is 8 steps; 10 steps cross into the second epoch, whose first rollout cannot be seen in advance (lag 0).
    runs = {}
    for staleness in (0, 1):
        trainer = AgentGRPOTrainer(
            model=tiny_model, args=config(tmp_path / str(staleness), max_steps=10, max_staleness=staleness,
                                          deterministic_sampling=True),
            train_dataset=tasks(16), processing_class=tokenizer, generator=SeededScriptGenerator(tokenizer, ACTIONS))
        trainer.train()
        runs[staleness] = trainer
    assert rows(tmp_path / "1") == rows(tmp_path / "0")
    assert len({row["task_id"] for row in rows(tmp_path / "1")}) == 16
    lags = {}
    for step, version in versions(tmp_path / "1"):
        lags[step] = step - version
    # trained at global step s (0-based in the records) from the weights of step s - 1, but the first rollout of
    # each epoch (steps 0 and 8)
    assert lags == {s: 0 if s in (0, 8) else 1 for s in range(10)}
    assert all(step == version for step, version in versions(tmp_path / "0"))
    logs = [log for log in runs[1].state.log_history if "async/lag_rollouts" in log]
    assert [log["async/lag_rollouts"] for log in logs] == [0.0 if i in (0, 8) else 1.0 for i in range(10)]
    assert all("async/is_truncated_frac" in log and "sampling/importance_sampling_ratio/mean" in log for log in logs)


def test_behaviour_weight_from_the_loss_forward_equals_the_proximal_forward(tiny_model_dir, tokenizer, tmp_path,
                                                                          monkeypatch):
    # Under max_staleness=1 with one optimizer step per generation batch, π_prox is taken from the loss forward's
    # own log-probs instead of one more forward over the rollout. The run with that forward forced (the deferral
    # switched off) must train the same: losses and gradient norms within float noise, the same behaviour weights'
    # metrics, the same rows. Built-in generator on its behaviour snapshot (real off-policy weights), fp32, 4 steps.
    results = {}
    for name, defer in (("deferred", True), ("forward", False)):
        if not defer:
            monkeypatch.setattr(AgentGRPOTrainer, "_defers_behaviour_weight", property(lambda self: False))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        trainer = AgentGRPOTrainer(model=model, args=config(tmp_path / name, max_steps=4, max_staleness=1,
                                                            deterministic_sampling=True, learning_rate=5e-3),
                                   train_dataset=tasks(), processing_class=tokenizer)
        forwards = []
        original = AgentGRPOTrainer._get_per_token_logps_and_entropies
        monkeypatch.setattr(AgentGRPOTrainer, "_get_per_token_logps_and_entropies",
                            lambda *a, **k: forwards.append(torch.is_grad_enabled()) or original(*a, **k))
        trainer.train()
        monkeypatch.setattr(AgentGRPOTrainer, "_get_per_token_logps_and_entropies", original)
        logs = [log for log in trainer.state.log_history if "async/is_truncated_frac" in log]
        results[name] = (trained(trainer), logs, rows(tmp_path / name), forwards)
    (losses, logs, deferred_rows, deferred_forwards), (ref_losses, ref_logs, ref_rows, ref_forwards) = \
        results["deferred"], results["forward"]
    assert deferred_rows == ref_rows
    # 4 steps: the forced run does one no-grad forward per step more (the proximal log-probs)
    assert ref_forwards.count(False) - deferred_forwards.count(False) == 4
    assert len(losses) == 4
    for (step, loss, norm), (ref_step, ref_loss, ref_norm) in zip(losses, ref_losses, strict=True):
        assert step == ref_step and loss == pytest.approx(ref_loss, abs=1e-5) and norm == pytest.approx(ref_norm,
                                                                                                       rel=1e-4)
    # lag-1 rollouts sampled by older weights: weights away from 1, the same in both runs
    assert any(abs(log["sampling/importance_sampling_ratio/mean"] - 1) > 1e-4 for log in logs)
    for log, ref in zip(logs, ref_logs, strict=True):
        for key in ("sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/max",
                    "async/is_truncated_frac"):
            assert log[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key


class KillAfterCheckpoint(TrainerCallback):
    """Stops the run at the start of the step after `step` (its checkpoint is written, the next rollout in flight)."""

    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt("killed")


def test_killed_with_a_rollout_in_flight_and_resumed_equals_the_uninterrupted_run(tiny_model_dir, tokenizer,
                                                                                  tmp_path):
    # The built-in generator on its behaviour snapshot, seeded sampling. Checkpoint at step 2 (the rollout for step 3
    # in flight: drained and stored with it); killed at the start of step 3; resumed from checkpoint-2.
    def trainer_for(output_dir, callbacks=()):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        args = config(output_dir, max_steps=4, max_staleness=1, save_strategy="steps", save_steps=2,
                      deterministic_sampling=True)
        return AgentGRPOTrainer(model=model, args=args, train_dataset=tasks(), processing_class=tokenizer,
                                callbacks=list(callbacks))

    whole = trainer_for(tmp_path / "whole")
    whole.train()
    assert os.path.exists(tmp_path / "whole" / "checkpoint-2" / oso.PENDING_FILE.format(rank=0))

    killed = trainer_for(tmp_path / "killed", [KillAfterCheckpoint(2)])
    with pytest.raises(KeyboardInterrupt):
        killed.train()
    resumed = trainer_for(tmp_path / "killed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "killed" / "checkpoint-2"))

    after = [entry for entry in trained(resumed) if entry[0] > 2]
    assert len(after) == 2 and after == [entry for entry in trained(whole) if entry[0] > 2]
    whole_rows, resumed_rows = rows(tmp_path / "whole"), rows(tmp_path / "killed")
    assert resumed_rows == whole_rows  # 0 tasks lost, 0 duplicated, the same rows after the resume
    assert versions(tmp_path / "killed") == versions(tmp_path / "whole")
    assert [step - version for step, version in versions(tmp_path / "whole")].count(0) == \
        sum(1 for step, _ in versions(tmp_path / "whole") if step == 0)  # lag 0 on the first rollout only


def test_a_rollout_that_raises_in_the_background_stops_the_run_with_its_message(tiny_model, tokenizer, tmp_path):
    class Failing(SeededScriptGenerator):
        def generate(self, prompts, sampling, seeds=None):
            if len(self.calls) >= 4:
                raise RuntimeError("the generator broke")
            return super().generate(prompts, sampling, seeds=seeds)

    trainer = AgentGRPOTrainer(model=tiny_model, args=config(tmp_path, max_staleness=1), train_dataset=tasks(),
                               processing_class=tokenizer, generator=Failing(tokenizer, ACTIONS))
    with pytest.raises(RuntimeError, match="the generator broke"):
        trainer.train()


def test_a_token_budget_stop_leaves_no_rollout_generated_for_a_step_that_does_not_come(tiny_model, tokenizer,
                                                                                         tmp_path, monkeypatch):
    # The weight-independent generator: both runs generate the same tokens. The budget is what the sync run's first
    # 3 rollouts generated, so both stop after step 3 of 10. One-step-off generates rollout 1 in place and launches
    # those of steps 2 and 3 in the background; once rollout 3 brings the total to the budget, the rollout of step 4
    # (which would never be trained) is not started.
    settings = dict(max_steps=10, deterministic_sampling=True, logging_steps=1)
    sync = AgentGRPOTrainer(model=tiny_model, args=config(tmp_path / "0", **settings), train_dataset=tasks(16),
                            processing_class=tokenizer, generator=SeededScriptGenerator(tokenizer, ACTIONS))
    sync.train()
    per_step = [log["rollout/generated_tokens"] for log in sync.state.log_history if "rollout/generated_tokens" in log]
    budget = int(sum(per_step[:3]))
    launched = []
    launch = OneStepOff.launch
    monkeypatch.setattr(OneStepOff, "launch", lambda self, *args: launched.append(args[3]) or launch(self, *args))
    runs = {}
    for staleness in (0, 1):
        runs[staleness] = AgentGRPOTrainer(
            model=tiny_model, args=config(tmp_path / f"budget-{staleness}", max_generated_tokens=budget,
                                          max_staleness=staleness, **settings),
            train_dataset=tasks(16), processing_class=tokenizer, generator=SeededScriptGenerator(tokenizer, ACTIONS))
        runs[staleness].train()
    assert [runs[s].state.global_step for s in (0, 1)] == [3, 3]
    assert runs[1].rollout_totals == runs[0].rollout_totals and runs[1].rollout_totals["generated_tokens"] == budget
    assert launched == ["train:1:0", "train:2:0"]  # rollout keys of (optimizer step, rollout in the step)
    assert rows(tmp_path / "budget-1") == rows(tmp_path / "budget-0")


def test_a_lora_policys_behaviour_snapshot_copies_the_adapter_and_shares_the_base(tiny_model, tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    snapshot = oso.BehaviourSnapshot(policy)
    pairs = list(zip(snapshot.model.named_parameters(), policy.named_parameters(), strict=True))
    adapter = [name for (name, _), (_, theirs) in pairs if theirs.requires_grad]
    assert adapter and all("lora_" in name for name in adapter)
    assert all((mine is theirs) == (not theirs.requires_grad) for (_, mine), (_, theirs) in pairs)
    assert snapshot.shared == len(pairs) - len(adapter) > 0
    trained_bytes = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
    assert snapshot.nbytes == trained_bytes + sum(b.numel() * b.element_size() for b in policy.buffers())
    # An update of the adapter reaches the snapshot at the next sync, and then both give the same logits.
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.1)
    ids = torch.tensor([[3, 4, 5, 6]])
    policy.eval()
    assert not torch.equal(snapshot.model(ids).logits, policy(ids).logits)
    snapshot.sync(policy)
    torch.testing.assert_close(snapshot.model(ids).logits, policy(ids).logits, rtol=0, atol=0)
    # A frozen (shared) weight that starts training would be read by the generator while it changes: refused.
    next(p for p in policy.parameters() if not p.requires_grad).requires_grad_(True)
    with pytest.raises(RuntimeError, match="frozen when the behaviour snapshot was made now trains"):
        snapshot.sync(policy)


def test_a_lora_policy_trains_one_step_off_on_its_behaviour_snapshot(tiny_model, tokenizer, tmp_path):
    from peft import LoraConfig

    trainer = AgentGRPOTrainer(
        model=tiny_model, args=config(tmp_path, max_steps=3, max_staleness=1, logging_steps=1),
        train_dataset=tasks(), processing_class=tokenizer,
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    base = {id(p) for p in trainer.model.parameters() if not p.requires_grad}
    assert {id(p) for p in trainer._behaviour_snapshot.model.parameters()} & base == base  # the base: shared
    trainer.train()
    logs = [log for log in trainer.state.log_history if "async/lag_rollouts" in log]
    assert [log["async/lag_rollouts"] for log in logs] == [0.0, 1.0, 1.0]
    assert [step - version for step, version in versions(tmp_path)] == [0] * 24 + [1] * 48  # 24 rows a step


def test_the_behaviour_snapshot_is_refused_when_it_does_not_fit(tiny_model, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(oso, "_free_memory", lambda device: 1000)
    with pytest.raises(ValueError, match=r"copy of the trained weights .* is free on cpu: generate with a vLLM server"):
        AgentGRPOTrainer(model=tiny_model, args=config(tmp_path, max_staleness=1), train_dataset=tasks(),
                         processing_class=tokenizer)


def test_every_method_declares_its_staleness_and_the_on_policy_ones_refuse(tmp_path):
    refusing = {name for name, method in METHODS.items() if method.info.max_staleness == 0}
    assert {name: method.info.max_staleness for name, method in METHODS.items()
            if method.info.max_staleness not in (0, 1)} == {}
    assert {"canopy", "ib_rl", "opsd", "sdar", "grpo_opsd", "pcsd", "toolrl", "appo"} <= refusing
    for name, method in METHODS.items():
        args = method.config_class(output_dir=str(tmp_path), **{**method.defaults, "max_staleness": 1})
        reason = method.trainer_class.staleness_refusal(args)
        if name in refusing:
            assert reason is not None and method.info.staleness_reason in reason, name
        elif name == "grsd":  # its reflection term (on by default) refuses; without it GRSD trains one-step-off
            assert "reflection term" in reason
            args.grsd_reflect_coef = 0.0
            assert method.trainer_class.staleness_refusal(args) is None
        else:
            assert reason is None, (name, reason)


def test_a_refusing_method_raises_one_line_naming_the_reason(tiny_model, tokenizer, tmp_path):
    method = METHODS["canopy"]
    args = method.config_class(output_dir=str(tmp_path), max_staleness=1, report_to="none")
    with pytest.raises(ValueError) as raised:
        method.trainer_class(model=tiny_model, args=args, train_dataset=tasks(), processing_class=tokenizer)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("CANOPYTrainer: max_staleness=1 is refused: CANOPY needs")
    assert message.endswith("set max_staleness=0")


def test_a_topology_with_mid_rollout_model_signals_refuses(tmp_path):
    args = AgentGRPOConfig(output_dir=str(tmp_path), max_staleness=1, topology="branching", report_to="none")
    assert "computes model signals mid-rollout (entropy)" in AgentGRPOTrainer.staleness_refusal(args)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_staleness", 2, r"max_staleness must be 0 \(on-policy\) or 1 \(one-step-off\), got 2"),
    ("behaviour_weight_mode", "clip", "behaviour_weight_mode"),
    ("behaviour_weight_cap", 0.5, "behaviour_weight_cap must be >= 1"),
])
def test_bad_one_step_off_settings_are_one_line_errors(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        AgentGRPOConfig(output_dir=str(tmp_path), report_to="none", **{field: value})


def test_lookahead_hands_out_batches_and_shows_the_next_generation():
    look = oso.Lookahead()
    iterator = iter(range(6))
    assert look.pull(iterator, 2, 2) == [0, 1]  # holds 2 and 3
    look.consume()  # preparing 0
    assert look.peek(2) == 2  # two items after 0
    look.consume()  # preparing 1
    assert look.pull(iterator, 2, 2) == [2, 3] and look.peek(1) == 2
    look.consume()
    look.consume()
    assert look.pull(iterator, 2, 2) == [4, 5] and look.peek(3) is None  # past the epoch's end
    assert look.pull(iter([7]), 1, 2) == [7]  # a new epoch starts afresh


def test_the_docs_list_every_method_that_refuses_and_every_one_that_opts_in():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "async.md").read_text()
    section = text[text.index("## One-step-off"):]
    opt_in, refusals = section.split("These methods refuse:")
    for name, method in METHODS.items():
        where = refusals if method.info.max_staleness == 0 else opt_in
        assert method.title in where, (name, method.title)


def _finished(batch, key="k", version=3):
    """A OneStepOff holding a finished rollout (as after a resume)."""
    runner = OneStepOff(lambda tasks, index: batch)
    runner.pending = oso.Prefetched(key, version, "train:4:0", batch=batch)
    return runner


def test_a_rollout_that_cannot_be_stored_is_left_out_of_the_checkpoint_with_a_warning(tmp_path, caplog):
    import threading

    from trl_agents.trajectory import Group, RolloutBatch, Step, Trajectory

    def one_step(**info):
        trajectory = Trajectory(task={}, steps=[Step("o", "a", info=info)])
        return RolloutBatch(groups=[Group(task={}, trajectories=[trajectory])])

    batch = one_step(lock=threading.Lock())
    with caplog.at_level("WARNING"):
        _finished(batch).save(str(tmp_path), rank=0)
    assert os.listdir(tmp_path) == [] and "cannot be stored" in caplog.text
    good = one_step(seed=1)
    _finished(good).save(str(tmp_path), rank=1)
    loaded = OneStepOff(lambda tasks, index: None)
    loaded.load(str(tmp_path), rank=1)
    assert (loaded.pending.key, loaded.pending.version, loaded.pending.batch) == ("k", 3, good)
    loaded.load(str(tmp_path), rank=0)  # nothing stored for that process: nothing pending
    assert loaded.pending.batch == good


def test_a_stored_rollout_for_other_tasks_is_set_aside_and_the_step_generates_its_own(caplog):
    from trl_agents.trajectory import RolloutBatch

    runner = _finished(RolloutBatch(), key="other tasks")
    with caplog.at_level("WARNING"):
        assert runner.take("these tasks") is None
    assert runner.pending is None and "generated for other tasks" in caplog.text
    assert _finished(RolloutBatch(), key="these").take("these").version == 3
