"""APPO: the token-branching topology (split points, token-prefix forks, fill-ups), the trainer's dual-group credit
and future-KL loss scaling, and two training steps end to end through the transformers generator and through the
loopback vLLM server. The math itself is in tests/methods/appo/test_appo_credit.py."""

from __future__ import annotations

import math

import pytest
import torch

from trl_agents.credit.appo import future_kl_advantages
from trl_agents.envs import get_env_class, register_env
from trl_agents.loopback import LoopbackVLLMServer, loopback_trl_vllm
from trl_agents.records import load_trajectories
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.rollout.topologies import TOPOLOGIES, get_topology
from trl_agents.rollout.topologies.appo import POLICY_LOGPROBS, TokenBranchingTopology, punctuation_filter
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.appo import APPOConfig, APPOTrainer


@register_env
class SnapshotKeyword(get_env_class("test-keyword")):  # the keyword toy task, with snapshots (forks restore them)
    name = "test-appo-keyword"

    def snapshot(self):
        return (self.turn, self.seed, self.length)

    def restore(self, snapshot):
        self.turn, self.seed, self.length = snapshot


TASKS = [{"env": "test-appo-keyword", "seed": seed} for seed in range(2)]


def signal_stub(entropies, deltas=None):
    """A `signal_fn` for `policy_logprobs`: entropies (and current − sampler log-ratios, default 0) by the token's
    position among the trajectory's action tokens."""

    def compute(name, trajectories):
        assert name == POLICY_LOGPROBS
        for trajectory in trajectories:
            position = 0
            for step in trajectory.steps:
                n = len(step.action_ids)
                step.signals["entropy"] = list(entropies[position: position + n])
                shift = deltas[position: position + n] if deltas else [0.0] * n
                step.signals[POLICY_LOGPROBS] = [lp + d for lp, d in zip(step.action_logprobs, shift, strict=True)]
                position += n

    return compute


def engine_with(tokenizer, scripted, policy, topology, signal_fn):
    generator = scripted(policy)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer), max_turns=2, sampling=SamplingParams(4),
                           topology=topology, signal_fn=signal_fn)
    return engine, generator


def test_the_topology_is_registered_and_checks_its_options():
    assert TOPOLOGIES["token_branching"] is TokenBranchingTopology
    assert get_topology("token_branching", rollouts_per_task=4).model_signals == (POLICY_LOGPROBS,)
    for bad in ({"rollouts_per_task": 0}, {"score": "random"}, {"gamma": 0.0}, {"gamma": 1.5}, {"value_clip": 1.0}):
        with pytest.raises(ValueError):
            TokenBranchingTopology(**bad)


def test_branches_continue_the_best_token_of_each_initial_rollout(tokenizer, scripted):
    # Every action is "a" + EOS (2 tokens), 2 turns: positions 0, 1 (step 0) and 2, 3 (step 1); the last token of a
    # step is never a split point. H = [3, 1, 2, 1], Ω ≡ 1 (log-ratios 0): z(H) alone, best position 0 (step 0,
    # token 0). Budget 4 − 2 initial rollouts = 2 branches: one per rollout, each rollout's best point.
    def policy(prompt_ids, call, row, size):
        return "a"

    topology = TokenBranchingTopology(rollouts_per_task=4)
    engine, generator = engine_with(tokenizer, scripted, policy, topology, signal_stub([3.0, 1.0, 2.0, 1.0]))
    batch = engine.run([TASKS[0]], num_generations=2)
    group = batch.groups[0]
    assert [len(s.action_ids) for s in group.trajectories[0].steps] == [2, 2]
    assert [(t.episode_id, t.parent_id, t.fork_step) for t in group.trajectories] == [
        (0, None, 0), (1, None, 0), (2, 0, 0), (3, 1, 0)]
    assert [(p.episode_id, p.origin, p.step, p.token, p.position) for p in topology.branch_points] == [
        (2, 0, 0, 0, 0), (3, 1, 0, 0, 0)]
    origin, branch = group.trajectories[0], group.trajectories[2]
    prefix = topology.branch_points[0].prefix
    assert prefix == tuple(origin.steps[0].action_ids[:1])
    assert tuple(branch.steps[0].action_ids[:1]) == prefix  # the recorded action is prefix + continuation
    assert branch.steps[0].action_logprobs[0] == origin.steps[0].action_logprobs[0]  # copied from the parent
    assert branch.steps[0].prompt_ids == origin.steps[0].prompt_ids  # the prompt without the prefix
    assert generator.calls[2][0][-1] == prefix[0]  # the generator continued after the prefix
    assert batch.stats["topology/branches_per_task"] == 2 and batch.stats["topology/fill_rollouts_per_task"] == 0
    assert batch.stats["topology/omega_fallback_fraction"] == 1.0  # Ω ≡ 1 said nothing: z(H) for both rollouts


def test_the_future_value_moves_the_split_point(tokenizer, scripted):
    # Same H = [3, 1, 2, 1]; log-ratios Δ = [−0.15, 0, 0.1, 0], γ = 1 (the released branching's): suffix sums
    # [−.05, .1, .1, 0] -> Ω = [.951, 1.105, 1.105, 1.0]. z(Ω) at position 0 is negative: not eligible; position 2
    # (z(H) > 0, z(Ω) > 0) is the only split point: step 1, token 0.
    topology = TokenBranchingTopology(rollouts_per_task=3)
    engine, _ = engine_with(tokenizer, scripted, lambda *a: "a", topology,
                            signal_stub([3.0, 1.0, 2.0, 1.0], deltas=[-0.15, 0.0, 0.1, 0.0]))
    batch = engine.run([TASKS[0]], num_generations=2)
    assert [(p.origin, p.step, p.token, p.position) for p in topology.branch_points] == [(0, 1, 0, 2)]
    assert batch.stats["topology/omega_fallback_fraction"] == 0.0
    branch = batch.groups[0].trajectories[2]
    assert (branch.parent_id, branch.fork_step) == (0, 1)
    assert branch.steps[0] is batch.groups[0].trajectories[0].steps[0]  # the shared step, recorded once


def test_budget_without_split_points_is_filled_with_new_initial_rollouts(tokenizer, scripted):
    # Equal entropies: every z(H) is 0, nothing is eligible; the 2 unused branches become initial rollouts.
    topology = TokenBranchingTopology(rollouts_per_task=4)
    engine, _ = engine_with(tokenizer, scripted, lambda *a: "a", topology, signal_stub([1.0] * 4))
    batch = engine.run([TASKS[0]], num_generations=2)
    assert [t.parent_id for t in batch.groups[0].trajectories] == [None] * 4
    assert topology.branch_points == [] and batch.stats["topology/fill_rollouts_per_task"] == 2
    # One split point per rollout (H = [3, 1, 1, 1]: only position 0 has z(H) > 0), budget 3: two branches, then
    # (once they are done: launches never share a request list with forks) one fill-up.
    topology = TokenBranchingTopology(rollouts_per_task=5)
    engine, generator = engine_with(tokenizer, scripted, lambda *a: "a", topology, signal_stub([3.0, 1.0, 1.0, 1.0]))
    batch = engine.run([TASKS[0]], num_generations=2)
    assert [(t.episode_id, t.parent_id) for t in batch.groups[0].trajectories] == [
        (0, None), (1, None), (2, 0), (3, 1), (4, None)]
    assert [len(call) for call in generator.calls] == [2, 2, 2, 2, 1, 1]  # initial, branches, fill-up
    assert batch.stats["topology/fill_rollouts_per_task"] == 1
    topology = TokenBranchingTopology(rollouts_per_task=4, fill_budget=False)
    engine, _ = engine_with(tokenizer, scripted, lambda *a: "a", topology, signal_stub([1.0] * 4))
    assert len(engine.run([TASKS[0]], num_generations=2).groups[0].trajectories) == 2


def test_split_points_of_a_rollout_by_hand():
    # Step 0 is empty (no tokens, no signals), step 1 has 3 tokens: positions 0, 1, 2 of the rollout; position 2 is
    # its action's last token. H = [1, 3, 9]: z(H) = [−.98, −.39, 1.37] over all three, but only positions 0, 1 can
    # split and neither has z(H) > 0 -> none; a step without snapshot cannot split either.
    from trl_agents.trajectory import Step, Trajectory

    empty = Step("o", "", action_ids=[], action_logprobs=[])
    step = Step("o", "x", action_ids=[5, 6, 7], action_logprobs=[-1.0, -1.0, -1.0])
    step.snapshot = "s"
    step.signals.update({"entropy": [1.0, 3.0, 9.0], POLICY_LOGPROBS: [-1.0, -1.0, -1.0]})
    topology = TokenBranchingTopology()
    assert topology.split_points(Trajectory(task={}, steps=[empty, step])) == []
    step.signals["entropy"] = [1.0, 9.0, 3.0]  # μ = 4.333, σ = 3.399: z(H) = [−.981, 1.373, −.392]; position 1 splits
    trajectory = Trajectory(task={}, steps=[empty, step])
    [(_, s, k, position, score)] = topology.split_points(trajectory)
    assert (s, k, position) == (1, 1, 1) and score == pytest.approx(1.373, abs=1e-3)
    step.snapshot = None
    assert topology.split_points(trajectory) == []
    step.signals.pop(POLICY_LOGPROBS)
    with pytest.raises(ValueError, match="policy_logprobs"):
        topology.split_points(trajectory)


def test_punctuation_tokens_are_never_split_points(tokenizer):
    skip = punctuation_filter(tokenizer)
    comma, = tokenizer.encode(",", add_special_tokens=False)[:1]
    assert skip(comma) and skip(tokenizer.eos_token_id)
    assert not skip(tokenizer.encode("down", add_special_tokens=False)[0])


def appo_config(tmp_path, **overrides):
    values = {"per_device_train_batch_size": 4, "num_generations": 2, "appo_rollouts_per_task": 4, "max_turns": 2,
              "save_trajectories": True, **overrides}
    return tiny_training_config(APPOConfig, tmp_path / "appo", **values)


def check_trained(trainer, tmp_path):
    assert trainer.state.global_step == 2
    logs = [h for h in trainer.state.log_history if "appo/branches" in h]
    assert len(logs) == 2
    for log in logs:
        assert log["topology/leaves_per_task"] == 4.0  # n = 4 episodes per task: 2 initial + 2 branches or fills
        assert log["appo/init_rollouts"] + log["appo/branches"] == 4.0
        assert log["appo/future_kl_factor"] == pytest.approx(2.0)  # one on-policy pass: Δ = 0, f = 1, 1 + b·f = 2
        assert log["appo/dropped_row_fraction"] == 0.0
    # Branches train nothing: their own steps' recorded advantage is 0; and each branch continued its split point.
    rows = load_trajectories(str(tmp_path / "appo"))
    branches = [r for r in rows if r["parent_id"] is not None]
    assert branches and all(r["advantage"] == 0.0 for r in branches)
    points = {(p.task_index, p.episode_id): p for p in trainer.rollout_topology.branch_points}
    for index, group in enumerate(trainer.last_rollout.groups):
        for trajectory in group.trajectories:
            if trajectory.parent_id is not None:
                point = points[(index, trajectory.episode_id)]
                action = trajectory.steps[point.step].action_ids
                assert tuple(action[: len(point.prefix)]) == point.prefix
    return logs


@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_appo_trains_two_steps_with_the_transformers_generator(row_format, tiny_model, tokenizer, tmp_path):
    before = [p.detach().clone() for p in tiny_model.parameters()]
    trainer = APPOTrainer(model=tiny_model, args=appo_config(tmp_path, row_format=row_format), train_dataset=TASKS,
                          processing_class=tokenizer)
    assert trainer.args.delta == 3.0  # TRL's two-sided clip = the dual clip of negative advantages
    trainer.train()
    logs = check_trained(trainer, tmp_path)
    # The transformers generator samples with the current weights: Ω ≡ 1 up to float noise, z(H) decides.
    assert all(log["topology/omega_fallback_fraction"] == 1.0 for log in logs)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


class StaleServer(LoopbackVLLMServer):
    """A vLLM stand-in that acknowledges weight syncs but keeps its own weights: it samples off-policy, as an
    inference engine whose numerics differ from the trainer's, so the current-vs-sampler log-ratios (Ω) vary."""

    def _load_weights_file(self, body):
        self._announced = None
        return {"message": "Weights loaded", "weight_version": self.weight_version, "num_tensors": 0}


def test_appo_trains_two_steps_through_the_loopback_vllm_server(tiny_model, tokenizer, tmp_path):
    from trl_agents.rollout.vllm import VLLMGenerator
    from trl_agents.testing import build_tiny_model

    server_model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=1)
    with StaleServer(server_model, tokenizer) as server, loopback_trl_vllm():
        config = appo_config(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_base_url=server.base_url)
        trainer = APPOTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
        assert isinstance(trainer.generator, VLLMGenerator)
        trainer.train()
        prompts = [body["prompt"] for body in server.bodies("/v1/completions")]
    logs = check_trained(trainer, tmp_path)
    # Off-policy samples: Ω varies and the branching score z(H)·z(Ω) decides (no fallback on at least one rollout).
    assert any(log["topology/omega_fallback_fraction"] < 1.0 for log in logs)
    assert all("sampling/importance_sampling_ratio/mean" in log for log in logs)
    # The branches' prompts went to the server with their prefix appended (token ids, one request per turn).
    sent = [list(p) for batch in prompts for p in batch]
    for point in trainer.rollout_topology.branch_points:
        assert any(p[-len(point.prefix):] == list(point.prefix) for p in sent)


def loss_inputs(trainer, tokenizer):
    """A hand-made micro-batch of two rows (prompt 3 tokens, completion 3 tokens), advantages −1 / +1."""
    ids = tokenizer.encode("left right down up left right", add_special_tokens=False)[:6]
    prompt = torch.tensor([ids[:3], ids[:3]])
    completion = torch.tensor([ids[3:6], ids[3:6]])
    return {
        "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion, "completion_mask": torch.ones_like(completion),
        "advantages": torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]),
        "sampling_per_token_logps": torch.zeros(2, 3),
        "num_items_in_batch": torch.tensor(6.0),
    }


def test_the_future_kl_scaling_goes_into_trls_loss(tiny_model, tokenizer, tmp_path):
    trainer = APPOTrainer(model=tiny_model, args=appo_config(tmp_path), train_dataset=TASKS,
                          processing_class=tokenizer)
    inputs = loss_inputs(trainer, tokenizer)
    on = trainer._compute_loss(trainer.model, dict(inputs))
    trainer.args.appo_future_kl = False
    off = trainer._compute_loss(trainer.model, dict(inputs))
    # Δ = 0 (no old log-probs: TRL uses the current ones): f = 1 and every advantage is doubled, so is the loss.
    assert float(on.detach()) == pytest.approx(2 * float(off.detach()), rel=1e-5)

    # Old log-probs 2 below the current ones on row 0's first two tokens: ratio e^2 = 7.4 > 3 with A < 0 on two
    # tokens -> row 0 is dropped; row 1 (Δ = 0) keeps factor 2.
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    with torch.no_grad():
        current, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, torch.ones_like(input_ids), 3)
    old = current.clone()
    old[0, :2] -= 2.0
    trainer.args.appo_future_kl = True
    on = trainer._compute_loss(trainer.model, {**inputs, "old_per_token_logps": old})
    trainer.args.appo_future_kl = False
    without_row0 = {**inputs, "old_per_token_logps": old, "advantages": torch.tensor([[0.0] * 3, [1.0] * 3])}
    off = trainer._compute_loss(trainer.model, without_row0)
    assert float(on.detach()) == pytest.approx(2 * float(off.detach()), rel=1e-5)
    # The hook's advantages are future_kl_advantages of (A, Δ vs old, TRL's ratio): the same numbers by hand.
    trainer.args.appo_future_kl = True
    scaled = trainer.loss_advantages({**inputs, "old_per_token_logps": old}, current)
    expected, _, dropped = future_kl_advantages(inputs["advantages"], current - old, torch.exp(current - old),
                                                torch.ones(2, 3), gamma=2 ** (-1 / 64))
    assert torch.allclose(scaled, expected) and dropped.tolist() == [True, False]
    # 'sampler': Δ against the generator's log-probs (here 0, so Δ = current log-probs < 0: FutureKL < 0, f = 1).
    trainer.args.appo_future_kl_reference = "sampler"
    scaled = trainer.loss_advantages({**inputs, "old_per_token_logps": old}, current)
    assert torch.allclose(scaled[1], 2 * inputs["advantages"][1])


def test_config_checks_and_registry(tmp_path):
    for bad, match in (({"appo_rollouts_per_task": 1}, "appo_rollouts_per_task"),
                       ({"appo_branch_score": "random"}, "appo_branch_score"),
                       ({"appo_future_kl_reference": "ref"}, "appo_future_kl_reference"),
                       ({"appo_dual_clip": 1.0}, "appo_dual_clip"),
                       ({"appo_future_kl_clip": 1.5}, "appo_future_kl_clip"),
                       ({"appo_prefix_decay": 2.0}, "appo_prefix_decay"),
                       ({"appo_future_kl_weight": -1.0}, "appo_future_kl_weight"),
                       ({"appo_branch_gamma": 0.0}, "appo_branch_gamma"),
                       ({"topology": "branching"}, "token_branching")):
        with pytest.raises(ValueError, match=match):
            appo_config(tmp_path, **bad)
    assert appo_config(tmp_path, delta=5.0).delta == 5.0  # an explicit TRL delta is kept
    method = METHODS["appo"]
    assert method.trainer_class is APPOTrainer and method.paper == "arXiv 2606.12384"
    assert method.env_capabilities == ("snapshot",) and POLICY_LOGPROBS in method.signals
    config = APPOConfig(output_dir=str(tmp_path))
    assert math.isclose(config.appo_future_decay_rate, 64.0)  # FutureKL's γ = 2^(−1/64) in the loss
    assert config.appo_branch_gamma == 1.0  # Ω's γ at branching: the released launchers' algorithm.gamma
    assert APPOTrainer.topology_options(config)["gamma"] == 1.0
