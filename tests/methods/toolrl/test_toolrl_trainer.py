"""Tool-RL collapse fixes (arXiv 2606.26027; docs/methods/toolrl.md): the math by hand (group composition, LUFFY's
shaping and its gradient, hints, ETS's task selection), the engine's teacher-forced and hinted episodes, the
`supervised` topology on Search-QA, the control-token monitor firing on a constructed collapse and staying quiet on
a healthy run, the SFT phase, the LUFFY loss hooks, and 2 training steps end to end with every switch on."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
from trl_agents.callbacks import ControlTokenMonitor
from trl_agents.callbacks.control_tokens import ControlTokens, control_totals
from trl_agents.credit.toolrl import (
    off_policy_token_loss,
    shaped_off_policy_ratio,
    zero_reward_tasks,
)
from trl_agents.envs import get_env_class
from trl_agents.rollout import EnvPool, PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.generators import GenerationOutput
from trl_agents.training.batch import token_signal_key
from trl_agents.rollout.topologies import Launch, Topology, get_topology
from trl_agents.rollout.topologies.supervised import ground_truth_turns, group_composition, plan_hint
from trl_agents.testing import tiny_training_config
from trl_agents.trainers.toolrl import FORCED_SIGNAL, ToolRLConfig, ToolRLTrainer, rollout_kind, sft_steps
from trl_agents.trajectory import Group, Step, Trajectory

pytest.importorskip("bm25s")

QA = {"num_entities": 40, "hops": 1}
SYSTEM = "Answer the question. Reply search[query] or answer[text]."


def qa_tasks(count=2):
    return get_env_class("searchqa").task_split("train", count, **QA)


# ---------------------------------------------------------------- the math, by hand


def test_group_composition_by_hand():
    assert group_composition(8, replace_num=1) == (7, 1, 0)  # OPS: 1 of 8 teacher forced
    assert group_composition(8, hint_num=2) == (6, 0, 2)  # HBG: 2 of 8 hinted
    assert group_composition(8, 1, 2) == (5, 1, 2)
    assert group_composition(2, 1, 0) == (1, 1, 0)  # at least one ordinary rollout stays
    with pytest.raises(ValueError, match="at least one ordinary"):
        group_composition(4, 2, 2)
    with pytest.raises(ValueError, match="toolrl_hint_num"):
        group_composition(4, 0, -1)


def test_luffy_shaping_clip_and_gradient_by_hand():
    # π = [0.1, 0.4, 0.9], γ = 0.1: f = π/(π+γ) = [0.1/0.2, 0.4/0.5, 0.9/1.0] = [0.5, 0.8, 0.9].
    logps = torch.log(torch.tensor([0.1, 0.4, 0.9], dtype=torch.float64)).requires_grad_()
    assert shaped_off_policy_ratio(logps).tolist() == pytest.approx([0.5, 0.8, 0.9])
    # Clamped to [1 − 0.2, 1 + 0.2] (the released actor): [0.8, 0.8, 0.9].
    assert shaped_off_policy_ratio(logps, clip=(0.8, 1.2)).tolist() == pytest.approx([0.8, 0.8, 0.9])
    # loss = −A·f with A = 2: d loss / d log π = −A·γπ/(π+γ)² = −2·0.01/0.04, −2·0.04/0.25, −2·0.09/1.0
    #                                               = −0.5, −0.32, −0.18.
    loss = off_policy_token_loss(logps.unsqueeze(0), torch.tensor([2.0], dtype=torch.float64),
                                 torch.ones(1, 3)).sum()
    assert float(loss.detach()) == pytest.approx(-2 * (0.5 + 0.8 + 0.9))
    loss.backward()
    assert logps.grad.tolist() == pytest.approx([-0.5, -0.32, -0.18])
    # Guards: a NaN (masked) log-prob gives a finite value; masked tokens give 0 loss; γ <= 0 is refused.
    masked = off_policy_token_loss(torch.tensor([[float("nan"), -1.0]]), torch.tensor([[1.0, 1.0]]),
                                   torch.tensor([[0, 1]]))
    assert masked[0, 0] == 0.0 and math.isfinite(float(masked[0, 1]))
    assert torch.isfinite(shaped_off_policy_ratio(torch.tensor([float("nan"), 5.0, -1e9]))).all()
    with pytest.raises(ValueError, match="toolrl_luffy_gamma"):
        shaped_off_policy_ratio(logps, gamma=0.0)


def luffy_gradient(pi: float, advantage: float, clip=(0.8, 1.2)) -> float:
    logp = torch.tensor([[math.log(pi)]], dtype=torch.float64, requires_grad=True)
    off_policy_token_loss(logp, torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 1), clip=clip).sum() \
        .backward()
    return float(logp.grad)


def test_luffy_with_the_clip_is_the_released_pessimistic_loss():
    # The released compute_token_on_off_policy_loss (Tool-RL-Box): f = π/(π + 0.1), loss = max(−A·f, −A·clip(f, .8,
    # 1.2)) (its dual clip for A < 0, min(·, −A·3), cannot bind: clip(f) ≤ 1 < 3). Gradient d loss / d log π:
    # * A = +1, π = .05: f = .3333 < .8, the max keeps −A·f: −γπ/(π+γ)² = −.1·.05/.0225 = −.2222 (a plain
    #   −A·clip(f) would give 0: the unlikely ground-truth token LUFFY exists to push would not move);
    # * A = +1, π = .39: f = .7959 < .8: −.1·.39/.2401 = −.1624;
    # * A = +1, π = .60: f = .8571 inside the clip: −.1·.6/.49 = −.1224;
    # * A = −1, π = .20: f = .6667 < .8, the max keeps −A·.8 (constant): 0.
    assert luffy_gradient(0.05, 1.0) == pytest.approx(-0.2222, abs=1e-4)
    assert luffy_gradient(0.39, 1.0) == pytest.approx(-0.1624, abs=1e-4)
    assert luffy_gradient(0.60, 1.0) == pytest.approx(-0.1224, abs=1e-4)
    assert luffy_gradient(0.20, -1.0) == 0.0
    # A = −1, π = .9: f = .9091 inside the clip: −A·f, gradient +.1·.9/1.0 = +.09 (pushed down)
    assert luffy_gradient(0.90, -1.0) == pytest.approx(0.09, abs=1e-4)
    # loss values: A = 2, π = [.1, .4, .9]: f = [.5, .8, .9] -> max(−2f, −2·[.8, .8, .9]) = [−1, −1.6, −1.8]
    logps = torch.log(torch.tensor([[0.1, 0.4, 0.9]]))
    loss = off_policy_token_loss(logps, torch.tensor([2.0]), torch.ones(1, 3), clip=(0.8, 1.2))
    assert loss.tolist() == [pytest.approx([-1.0, -1.6, -1.8])]


def test_hint_text_and_ets_selection_by_hand():
    assert plan_hint(["search[x born]", "answer[Y]"], "Try: {plan}.") == "Try: search[x born] then answer[Y]."
    with pytest.raises(ValueError, match="non-empty"):
        plan_hint([])
    forced = Trajectory({"seed": 3}, [Step("o", "gt", reward=1.0, info={"supervision": "forced"})])
    hinted_failure = Trajectory({"seed": 3}, [Step("o", "h", reward=0.0, info={"supervision": "hinted"})])
    groups = [
        Group({"seed": 1}, [Trajectory({"seed": 1}, [Step("o", "a", reward=1.0)])] * 2),  # all solved
        Group({"seed": 2}, [Trajectory({"seed": 2}, [Step("o", "a", reward=r)]) for r in (1.0, 0.0)]),  # one 0
        Group({"seed": 3}, [forced, hinted_failure, Trajectory({"seed": 3}, [Step("o", "a", reward=1.0)])]),
        Group({"seed": 4}, [Trajectory({"seed": 4}, [Step("o", "a")], error="crashed")]),  # failed: not a 0
    ]
    # Only seed 2: seed 3's zero is a hinted (supervised) rollout, seed 4's a failure.
    assert list(zero_reward_tasks(groups).values()) == [{"seed": 2}]


# ---------------------------------------------------------------- the engine: teacher forcing and hints


class _Mixed(Topology):
    name = "test-mixed-supervision"

    def __init__(self, plan, hint):
        self.plan, self.hint = plan, hint

    def begin(self, tasks, num_generations):
        return [Launch(0, 1), Launch(0, 1, forced_actions=self.plan), Launch(0, 1, hint=self.hint)]


def test_engine_forces_ground_truth_actions_and_hints_only_the_sampling_prompt(tokenizer, scripted):
    task = qa_tasks(1)[0]
    truth = ground_truth_turns(task, "searchqa", QA, max_turns=5)
    plan = tuple(action for _, action in truth["turns"])
    assert len(plan) == 2 and plan[0].startswith("search[") and plan[1].startswith("answer[")  # 1 hop
    hint = "NOTE: " + plan_hint(plan)
    seen = []
    generator = scripted(lambda prompt, call, row, size: seen.append(tokenizer.decode(prompt)) or "search[nothing]")
    renderer = PromptRenderer(tokenizer, history_length=1)

    def engine(plan, **options):
        return RolloutEngine(generator, renderer, max_turns=3, sampling=SamplingParams(max_new_tokens=8),
                             env_pool=EnvPool(env_kwargs=QA, default_env="searchqa"), topology=_Mixed(plan, hint),
                             system_prompt=SYSTEM, **options)

    group = engine(plan).run([task], num_generations=3).groups[0]
    ordinary, forced, hinted = group.trajectories
    # Teacher forcing: the GT actions, tokenised + EOS, NaN sampling log-probs, rewarded by the env; no generation.
    assert [s.action_text for s in forced.steps] == list(plan) and forced.success and forced.episode_return == 1.0
    assert forced.steps[0].action_ids == tokenizer.encode(plan[0], add_special_tokens=False) + [tokenizer.eos_token_id]
    assert all(math.isnan(lp) for s in forced.steps for lp in s.action_logprobs)
    assert [s.info["supervision"] for s in forced.steps] == ["forced", "forced"]
    assert len(generator.calls) == 3 and all(len(call) == 2 for call in generator.calls)  # ordinary + hinted only
    # Hints: the sampling prompt carries the hint, the recorded one does not (and equals the ordinary prompt).
    assert sum(hint in text for text in seen) == 3  # the hinted episode's 3 turns
    assert hint not in tokenizer.decode(hinted.steps[0].prompt_ids)
    assert hinted.steps[0].prompt_ids == ordinary.steps[0].prompt_ids == forced.steps[0].prompt_ids
    assert hinted.steps[0].info["supervision"] == "hinted" and "supervision" not in ordinary.steps[0].info
    assert rollout_kind(forced) == "forced" and rollout_kind(hinted) == "hinted" and rollout_kind(ordinary) == "ordinary"
    # A forced episode that runs out of actions ends there.
    assert len(engine(plan[:1]).run([task], 3).groups[0].trajectories[1].steps) == 1
    # Hints need step rows.
    with pytest.raises(ValueError, match="row_format='step'"):
        engine(plan, row_format="conversation").run([task], 3)


def test_supervised_topology_composes_groups_and_falls_back_without_ground_truth():
    topology = get_topology("supervised", replace_num=1, hint_num=2, env_name="searchqa", env_kwargs=QA)
    requests = topology.begin(qa_tasks(2), num_generations=8)
    assert [(r.task_index, r.count, r.forced_actions is not None, r.hint is not None) for r in requests] == [
        (0, 5, False, False), (0, 1, True, False), (0, 2, False, True),
        (1, 5, False, False), (1, 1, True, False), (1, 2, False, True)]
    assert requests[1].forced_actions == topology.plan(qa_tasks(2)[0]) and "then answer[" in requests[2].hint
    # Hints from a column: a task whose hint is empty gets ordinary rollouts instead (and is counted).
    column = get_topology("supervised", hint_num=1, hint_column="hint")
    requests = column.begin([{"seed": 0, "hint": "look it up"}, {"seed": 1, "hint": ""}], num_generations=2)
    assert [(r.task_index, r.count, r.hint) for r in requests] == [(0, 1, None), (0, 1, "look it up"), (1, 2, None)]
    assert column.stats(None) == {"no_ground_truth_fraction": 0.5}
    assert get_topology("supervised").begin([{"seed": 0}], 4) == [Launch(0, 4)]  # both 0: independent
    with pytest.raises(ValueError, match="no ground-truth actions"):
        ground_truth_turns({"env": "test-keyword", "seed": 0})


# ---------------------------------------------------------------- the control-token monitor


def test_control_token_totals_and_the_detector_by_hand(tokenizer, caplog):
    eos = tokenizer.eos_token_id
    bracket = tokenizer.convert_tokens_to_ids("[")
    control = ControlTokens(tokenizer, ["search", "["], [eos])
    assert bracket in control and eos in control and tokenizer.encode("zzz", add_special_tokens=False)[0] not in control
    # Totals: ordinary steps only; prob over control tokens with a finite log-prob.
    steps = [Step("o", "x", action_ids=[bracket, 100, eos], action_logprobs=[math.log(0.5), -1.0, math.log(0.7)]),
             Step("o", "y", action_ids=[100, eos], action_logprobs=[-1.0, float("nan")], valid=False),
             Step("o", "gt", action_ids=[bracket], action_logprobs=[float("nan")], info={"supervision": "forced"})]
    totals = control_totals([Group({}, [Trajectory({}, steps)])], control)
    assert totals["prob"] == pytest.approx((1.2, 2))  # (0.5 + 0.7) / 2 = 0.6; the NaN eos is not a probability
    assert totals["token_share"] == (3, 5) and totals["valid_action_rate"] == (1, 2)  # forced step left out
    # The detector: baseline of the last 2 unflagged values.
    monitor = ControlTokenMonitor(baseline_logs=2, prob_jump=0.25, share_ratio=2.0, valid_ratio=0.7)
    healthy = {"prob": 0.5, "token_share": 0.2, "valid_action_rate": 0.9}
    assert monitor.check(dict(healthy), 1) == [] and monitor.check(dict(healthy, prob=0.6), 2) == []
    assert monitor.check(dict(healthy, prob=0.79), 3) == []  # 0.79 < mean(0.5, 0.6) + 0.25 = 0.8
    # Baseline now mean(0.6, 0.79) = 0.695: 0.95 >= 0.945 spikes; share 0.4 >= 2 × 0.2; valid 0.6 <= 0.7 × 0.9.
    with caplog.at_level(logging.WARNING, logger="trl_agents.callbacks.control_tokens"):
        assert monitor.check({"prob": 0.95, "token_share": 0.4, "valid_action_rate": 0.6}, 4) == [
            "control_prob_spike", "control_share_spike", "valid_action_drop"]
        assert monitor.check({"prob": 0.95, "token_share": 0.4, "valid_action_rate": 0.6}, 5) == [
            "control_prob_spike", "control_share_spike", "valid_action_drop"]  # flagged values stay out of the base
    assert sum("control-token collapse sign at step 4" in r.message for r in caplog.records) == 3  # once per sign
    assert monitor.check(dict(healthy), 6) == []
    with pytest.raises(ValueError, match="unknown signs"):
        ControlTokenMonitor(stop_on=("boredom",))


class PhasedSearcher:
    """Valid `search[...]` actions whose control tokens ('search', '[', ']', EOS) are sampled with probability 0.5
    for `healthy_calls` generation calls, then a collapsed policy: ']]]]' + EOS, invalid, control probability 0.99."""

    def __init__(self, tokenizer, healthy_calls):
        self.tokenizer, self.healthy_calls, self.calls = tokenizer, healthy_calls, 0
        self.eos_token_ids = [tokenizer.eos_token_id]

    def generate(self, prompts, sampling):
        collapsed = self.calls >= self.healthy_calls
        self.calls += 1
        text = "]]]]" if collapsed else "search[mayor]"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        logprob = math.log(0.99) if collapsed else math.log(0.5)
        return GenerationOutput([list(ids) for _ in prompts], [[logprob] * len(ids) for _ in prompts])


def run_monitored(tiny_model, tokenizer, tmp_path, healthy_calls, steps=6, **monitor_options):
    config = tiny_training_config(AgentGRPOConfig, tmp_path, env_name="searchqa", env_kwargs=QA, max_steps=steps,
                                  max_turns=2, num_generations=2, per_device_train_batch_size=4, learning_rate=1e-5,
                                  max_completion_length=8, system_prompt=SYSTEM, history_length=0)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=qa_tasks(4), processing_class=tokenizer,
                               generator=PhasedSearcher(tokenizer, healthy_calls))
    monitor = ControlTokenMonitor(trainer, baseline_logs=2, **monitor_options)
    trainer.add_callback(monitor)
    trainer.train()
    return trainer, monitor


def test_the_monitor_fires_on_a_constructed_collapse(tiny_model, tokenizer, tmp_path, caplog):
    # Steps 1-3 healthy (2 generation calls per 2-turn rollout), from step 4 on ']]]]': invalid, prob 0.99.
    with caplog.at_level(logging.WARNING, logger="trl_agents.callbacks.control_tokens"):
        trainer, monitor = run_monitored(tiny_model, tokenizer, tmp_path, healthy_calls=6,
                                         stop_on=("valid_action_drop",))
    assert {a["sign"] for a in monitor.alerts} == {"control_prob_spike", "valid_action_drop", "control_share_spike"}
    assert min(a["step"] for a in monitor.alerts) == 4 and trainer.state.global_step == 4  # stopped at once
    assert any("valid_action_drop" in r.message and "step 4" in r.message for r in caplog.records)
    logged = [h for h in trainer.state.log_history if "control/prob" in h]
    assert logged[0]["control/prob"] == pytest.approx(0.5) and logged[0]["control/valid_action_rate"] == 1.0
    assert logged[-1]["control/prob"] == pytest.approx(0.99) and logged[-1]["control/valid_action_rate"] == 0.0
    assert logged[-1]["control/alert"] == 1.0 and logged[0]["control/alert"] == 0.0


def test_the_monitor_stays_quiet_on_a_healthy_run(tiny_model, tokenizer, tmp_path):
    trainer, monitor = run_monitored(tiny_model, tokenizer, tmp_path, healthy_calls=10**6, steps=5)
    assert trainer.state.global_step == 5 and monitor.alerts == [] and monitor.warned == set()
    assert len(monitor.history) == 5


# ---------------------------------------------------------------- the trainer: SFT phase, LUFFY hooks, end to end


def toolrl_config(tmp_path, **overrides):
    values = {"env_name": "searchqa", "env_kwargs": QA, "max_turns": 2, "history_length": 1, "num_generations": 4,
              "per_device_train_batch_size": 8, "max_completion_length": 6, "system_prompt": SYSTEM,
              "loss_type": "dapo"}
    return tiny_training_config(ToolRLConfig, tmp_path / "toolrl", **{**values, **overrides})


def test_config_switches_are_validated(tmp_path):
    for overrides, match in [
        ({"toolrl_replace_num": 2, "toolrl_hint_num": 2}, "at least one ordinary"),
        ({"toolrl_off_policy_loss": "sft"}, "toolrl_off_policy_loss"),
        ({"toolrl_monitor_action": "panic"}, "toolrl_monitor_action"),
        ({"toolrl_hint_num": 1, "row_format": "conversation"}, "row_format='step'"),
        ({"toolrl_monitor": False, "toolrl_monitor_action": "stop"}, "needs toolrl_monitor"),
        ({"toolrl_hint_template": "no placeholder"}, "toolrl_hint_template"),
        ({"topology": "independent"}, "supervised"),
        ({"toolrl_luffy_gamma": 0.0}, "toolrl_luffy_gamma"),
    ]:
        with pytest.raises(ValueError, match=match):
            toolrl_config(tmp_path, **overrides)


def test_sft_phase_demonstrations_match_the_rl_prompts_and_lower_the_loss(tiny_model, tokenizer, tmp_path):
    trainer = ToolRLTrainer(model=tiny_model, args=toolrl_config(tmp_path, toolrl_sft_every=1, toolrl_replace_num=1),
                            train_dataset=qa_tasks(2), processing_class=tokenizer)
    task = qa_tasks(1)[0]
    examples = trainer.demonstrations({"t": task})
    assert len(examples) == 2  # one per GT turn (search, answer)
    # The demonstration prompts are the RL step prompts: those the teacher-forced rollout recorded.
    trainer.model.train()  # (the training topology: evaluation rollouts are independent)
    batch = trainer._engine().run([task], 4)
    forced = next(t for t in batch.groups[0].trajectories if rollout_kind(t) == "forced")
    assert [(s.prompt_ids, s.action_ids) for s in forced.steps] == [(p, c) for p, c in examples]
    losses = sft_steps(trainer.model, examples * 4, rng=__import__("random").Random(0), epochs=3, batch_size=4,
                       micro_batch_size=2, learning_rate=1e-2, pad_token_id=tokenizer.pad_token_id)
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert all(p.grad is None for p in trainer.model.parameters())
    # Selection: tasks with a zero-reward ordinary rollout in the window; a repair with none takes every task.
    trainer._window.append(({}, {"a": {"seed": 0}}))
    assert trainer.selected_tasks() == {} and trainer.selected_tasks(repair=True) == {"a": {"seed": 0}}


def test_luffy_hooks_move_the_forced_tokens_to_the_shaped_loss(tiny_model, tokenizer, tmp_path):
    trainer = ToolRLTrainer(model=tiny_model, processing_class=tokenizer, train_dataset=qa_tasks(2),
                            args=toolrl_config(tmp_path, toolrl_replace_num=1, toolrl_off_policy_loss="luffy",
                                               toolrl_luffy_clip=False))
    assert FORCED_SIGNAL in trainer.training_signal_names(trainer.args)
    # Two rows of 2 tokens; row 1 is teacher forced. A = [1, −2] per row, π = [0.1, 0.5 | 0.1, 0.5].
    inputs = {"advantages": torch.tensor([1.0, -2.0]), "completion_mask": torch.ones(2, 2, dtype=torch.long),
              token_signal_key(FORCED_SIGNAL): torch.tensor([[0.0, 0.0], [1.0, 1.0]]),
              "num_items_in_batch": torch.tensor(4.0)}
    logps = torch.log(torch.tensor([[0.1, 0.5], [0.1, 0.5]])).requires_grad_()
    assert trainer.loss_advantages(inputs, logps).tolist() == [[1.0, 1.0], [0.0, 0.0]]  # forced: out of TRL's loss
    # Auxiliary: −A·f on the forced row, token mean over the batch's 4 loss tokens (÷ steps_per_generation = 1):
    # −(−2)·(0.1/0.2 + 0.5/0.6) / 4 = 2·(0.5 + 0.8333) / 4 = 0.6667.
    loss = trainer.compute_auxiliary_loss(trainer.model, inputs, logps)
    assert float(loss.detach()) == pytest.approx(2 * (0.5 + 0.5 / 0.6) / 4, rel=1e-5)
    vanilla = ToolRLTrainer(model=tiny_model, processing_class=tokenizer, train_dataset=qa_tasks(2),
                            args=toolrl_config(tmp_path, toolrl_replace_num=1))
    assert vanilla.training_signal_names(vanilla.args) == () and vanilla.compute_auxiliary_loss(None, inputs, logps) is None


@pytest.mark.parametrize("off_policy_loss", ["luffy", "vanilla"])
def test_toolrl_trains_two_steps_with_every_switch_on(tiny_model, tokenizer, tmp_path, off_policy_loss):
    config = toolrl_config(tmp_path, toolrl_replace_num=1, toolrl_hint_num=1, toolrl_off_policy_loss=off_policy_loss,
                           toolrl_sft_every=1, toolrl_sft_batch_size=4, toolrl_sft_epochs=1,
                           toolrl_monitor_action="repair")
    before = [p.detach().clone() for p in tiny_model.parameters()]
    trainer = ToolRLTrainer(model=tiny_model, args=config, train_dataset=qa_tasks(4), processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [h for h in trainer.state.log_history if "toolrl/forced_success" in h]
    assert len(logs) == 2 and all(h["toolrl/forced_success"] == 1.0 for h in logs)  # the GT always answers right
    assert all(h["rollout/episodes"] == 8 and "toolrl/hinted_success" in h and "control/valid_action_rate" in h
               for h in logs)
    if off_policy_loss == "luffy":  # f = π/(π + .1) lies in (0, 1/1.1]
        assert all(0.0 < h["toolrl/luffy_ratio"] <= 1 / 1.1 + 1e-6 for h in logs)
    else:
        assert not any("toolrl/luffy_ratio" in h for h in logs)
    # ETS: a phase after step 1 (not after the last step), on the tasks with a failed ordinary rollout.
    assert [phase["step"] for phase in trainer.sft_history] == [1] and trainer.sft_history[0]["examples"] > 0
    assert logs[0]["toolrl/sft_phases"] == 1.0
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_a_reported_collapse_sign_starts_an_sft_repair_phase(tiny_model, tokenizer, tmp_path):
    config = toolrl_config(tmp_path, max_steps=5, num_generations=2, per_device_train_batch_size=4, history_length=0,
                           max_completion_length=8, learning_rate=1e-5, toolrl_monitor_action="repair",
                           toolrl_monitor_baseline=2, toolrl_sft_batch_size=4, toolrl_sft_epochs=1)
    trainer = ToolRLTrainer(model=tiny_model, args=config, train_dataset=qa_tasks(4), processing_class=tokenizer,
                            generator=PhasedSearcher(tokenizer, healthy_calls=6))
    trainer.train()
    assert trainer.state.global_step == 5  # 'repair' does not stop training
    # The collapse starts at step 4: a repair phase there (none after the last step, 5), on the tasks whose ordinary
    # rollouts scored 0 (all of them: ']]]]' never answers).
    assert [(p["step"], p["repair"]) for p in trainer.sft_history] == [(4, 1.0)]
    assert all(p["tasks"] > 0 and p["examples"] >= 2 * p["tasks"] for p in trainer.sft_history)


def test_the_ets_window_and_the_monitor_survive_a_resume(tiny_model, tokenizer, tmp_path):
    def trainer():
        return ToolRLTrainer(model=tiny_model, args=toolrl_config(tmp_path, toolrl_sft_every=5),
                             train_dataset=qa_tasks(2), processing_class=tokenizer)

    first = trainer()
    first._window.append(({"a": {"seed": 0}}, {"a": {"seed": 0}, "b": {"seed": 1}}))
    first.sft_phases = 2
    first.monitor.check({"prob": 0.5, "token_share": 0.1, "valid_action_rate": 1.0}, 1)
    first.save_extra_state(str(tmp_path))
    second = trainer()
    second.load_extra_state(str(tmp_path))
    assert list(second._window) == list(first._window) and second.sft_phases == 2
    assert second.monitor.baselines == {"prob": [0.5], "token_share": [0.1], "valid_action_rate": [1.0]}


def test_toolrl_refuses_an_environment_without_ground_truth(tiny_model, tokenizer, tmp_path):
    config = tiny_training_config(ToolRLConfig, tmp_path, env_name="test-keyword", toolrl_replace_num=1)
    with pytest.raises(ValueError, match="no ground-truth actions"):
        ToolRLTrainer(model=tiny_model, args=config, train_dataset=[{"env": "test-keyword", "seed": 0}],
                      processing_class=tokenizer)
    # The monitor alone works on any environment.
    plain = tiny_training_config(ToolRLConfig, tmp_path / "plain", env_name="test-keyword", max_steps=1)
    trainer = ToolRLTrainer(model=tiny_model, args=plain, train_dataset=[{"env": "test-keyword", "seed": 0}],
                            processing_class=tokenizer)
    assert trainer.monitor is not None and trainer.args.toolrl_replace_num == 0
