"""vLLM generation through TRL's real vLLM code, against the loopback vLLM server (CPU, vllm not installed).

What runs for real here: TRL's `VLLMClient` (requests, response parsing), `VLLMGeneration` (server-mode gather,
broadcast and slicing; `sync_weights` and its parameter walk) and `GRPOTrainer.__init__` with `use_vllm=True`. Only
the NCCL weight transport is replaced by a file (`trl_agents.loopback.loopback_trl_vllm`).

The `gpu` tests at the end check the real thing and are skipped unless CUDA and vllm (`SUPPORTED_VLLM_VERSION`) are
installed; they need a small chat model, `TRL_AGENTS_VLLM_TEST_MODEL` (a Hub id or a local path, default
Qwen/Qwen2.5-0.5B-Instruct). On a CUDA machine:

    pip install -e ".[vllm,dev]"
    # colocate mode (1 GPU): vLLM inside the training process
    pytest tests/rollout/test_vllm.py -m gpu -k colocate
    # server mode with NCCL weight sync (2 GPUs: the test starts `vllm serve` on GPU 1, trains on GPU 0)
    pytest tests/rollout/test_vllm.py -m gpu -k server
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
import sys
import time

import pytest
import requests
import torch
from accelerate import Accelerator

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
from trl_agents.loopback import LOAD_WEIGHTS_ROUTE, LoopbackVLLMServer, loopback_trl_vllm
from trl_agents.rollout import EnvPool, PromptRenderer, RolloutEngine, SamplingParams, TransformersGenerator
from trl_agents.rollout.vllm import SUPPORTED_VLLM_VERSION, VLLMGenerator
from trl_agents.testing import build_tiny_model, tiny_training_config
from trl_agents.training.loss import importance_sampling_ratio

# ---- fixtures and helpers --------------------------------------------------------------------------------------------


def other_tiny_model(tokenizer, seed):
    """The conftest tiny model's architecture with other weights (the trainer and the server then disagree)."""
    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=seed)


@pytest.fixture
def client(server):
    from trl.generation.vllm_client import VLLMClient

    return VLLMClient(base_url=server.base_url)


def vllm_generation(model, tokenizer, server):
    """TRL's own server-mode backend, built the way GRPOTrainer builds it (needs `loopback_trl_vllm()` active)."""
    from trl.generation.vllm_generation import VLLMGeneration

    return VLLMGeneration(model, Accelerator(), tokenizer, mode="server", server_base_url=server.base_url, logprobs=0)


def teacher_forced(model, prompt, completion, temperature=1.0):
    """log_softmax(logits / T) of `completion` after `prompt`: what TRL's training forward computes."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def encode(tokenizer, *texts):
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


# ---- the loopback server through TRL's VLLMClient --------------------------------------------------------------------


def test_n_completions_are_prompt_major_and_logprobs_are_the_models(client, server_model, tokenizer):
    prompts = encode(tokenizer, "P F F H", "up down left")
    out = client.generate(prompts, n=3, temperature=0.7, max_tokens=5, logprobs=0)
    assert out["prompt_ids"] == prompts
    assert len(out["completion_ids"]) == 6
    for index, (ids, logprobs) in enumerate(zip(out["completion_ids"], out["logprobs"], strict=True)):
        assert 1 <= len(ids) <= 5 and all(len(entry) == 1 for entry in logprobs)  # logprobs=0: the sampled token's
        # Choices 0-2 belong to the first prompt: their log-probs are the model's under that prompt only.
        expected = teacher_forced(server_model, prompts[index // 3], ids, temperature=0.7)
        assert torch.allclose(torch.tensor([entry[0] for entry in logprobs]), expected, atol=1e-5)
    assert out["logprob_token_ids"][0] == [[token] for token in out["completion_ids"][0]]


def test_top_logprobs_hold_the_sampled_token_and_the_models_top_n(client, server_model, tokenizer):
    prompt = encode(tokenizer, "S F H G")[0]
    out = client.generate([prompt], max_tokens=4, logprobs=2, temperature=1.0)
    ids = out["completion_ids"][0]
    for position, (values, token_ids) in enumerate(zip(out["logprobs"][0], out["logprob_token_ids"][0], strict=True)):
        assert ids[position] in token_ids and len(token_ids) in (2, 3) and values == sorted(values, reverse=True)
        with torch.no_grad():
            logits = server_model(torch.tensor([prompt + ids[:position]])).logits[0, -1]
        top = torch.log_softmax(logits.float(), -1).topk(2)
        # Sorted by probability: the top 2 come first, the sampled token third when it is not among them.
        assert token_ids[:2] == top.indices.tolist()
        assert torch.allclose(torch.tensor(values[:2]), top.values, atol=1e-5)


def test_greedy_matches_the_transformers_generator(client, server_model, tokenizer):
    prompts = encode(tokenizer, "P F", "F H G", "left right")
    out = client.generate(prompts, temperature=0.0, max_tokens=6)
    reference = TransformersGenerator(server_model, tokenizer).generate(prompts, SamplingParams(6, greedy=True))
    assert out["completion_ids"] == reference.completion_ids


def test_filters_and_repetition_penalty_follow_vllms_sampler(client, server_model, tokenizer):
    prompt = encode(tokenizer, "P F F H")[0]
    greedy = client.generate([prompt], temperature=0.0, max_tokens=4)["completion_ids"]
    for filters in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        out = client.generate([prompt], temperature=1.0, max_tokens=4, **filters)
        assert out["completion_ids"] == greedy, filters  # only the arg-max survives the filter...
        assert all(entry == [0.0] for entry in out["logprobs"][0]), filters  # ...and processed log-probs renormalise
    out = client.generate([prompt], temperature=0.0, max_tokens=4, repetition_penalty=1.5)
    ids = out["completion_ids"][0]
    for position, token in enumerate(ids):  # vLLM's penalty on every token seen so far: divide if > 0, else multiply
        context = prompt + ids[:position]
        with torch.no_grad():
            logits = server_model(torch.tensor([context])).logits[0, -1].float()
        seen = torch.zeros_like(logits, dtype=torch.bool)
        seen[context] = True
        logits = torch.where(seen, torch.where(logits > 0, logits / 1.5, logits * 1.5), logits)
        assert token == int(logits.argmax())
        assert out["logprobs"][0][position][0] == pytest.approx(torch.log_softmax(logits, -1)[token].item(), abs=1e-5)


def test_max_tokens_stop_token_ids_and_the_response_schema(server, client, tokenizer):
    prompt = encode(tokenizer, "H F G")[0]
    greedy = client.generate([prompt], temperature=0.0, max_tokens=8)["completion_ids"][0]
    assert len(greedy) == 8 or greedy[-1] == tokenizer.eos_token_id
    stop = greedy[2]
    body = {"prompt": [prompt], "temperature": 0, "max_tokens": 8, "stop_token_ids": [stop], "logprobs": 0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "model": "loopback-model"}
    answer = requests.post(f"{server.base_url}/v1/completions", json=body).json()
    choice = answer["choices"][0]
    assert choice["token_ids"] == greedy[: greedy.index(stop) + 1]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    assert choice["prompt_token_ids"] == prompt and choice["logprobs"]["tokens"][0] == f"token_id:{greedy[0]}"
    assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] == len(choice["token_ids"])
    body.update(max_tokens=2, stop_token_ids=[])
    choice = requests.post(f"{server.base_url}/v1/completions", json=body).json()["choices"][0]
    assert (choice["token_ids"], choice["finish_reason"]) == (greedy[:2], "length")


def test_info_routes_errors_and_request_counts(server, client, tokenizer):
    base = server.base_url
    assert requests.get(f"{base}/version").json() == {"version": SUPPORTED_VLLM_VERSION}
    assert client.get_server_info()["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert client.get_world_size() == 1
    assert requests.get(f"{base}/v1/chat/completions").status_code == 404
    assert requests.get(f"{base}/v1/completions").status_code == 405
    bad = requests.post(f"{base}/v1/completions", json={"prompt": [], "max_tokens": 2})
    assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]
    assert requests.post(f"{base}/v1/completions", json={"prompt": [5], "model": "other"}).status_code == 404
    refused = requests.post(f"{base}/v1/completions", json={"prompt": [5], "stream": True})
    assert refused.status_code == 400 and "stream" in refused.json()["error"]["message"]
    assert server.count("/health") == 1 and server.count("/v1/models") == 1  # VLLMClient's start-up checks
    assert server.count("/v1/completions") == 4  # every request is recorded, refused ones too


def test_sequence_logprobs_for_distillation(client, server_model, tokenizer):
    prompt, completion = encode(tokenizer, "P F F", " up down")
    out = client.get_sequence_logprobs([prompt + completion], [len(prompt)], top_logprobs=3)
    actual = torch.tensor([value[0] for value in out["actual_logprobs"][0]])
    assert torch.allclose(actual, teacher_forced(server_model, prompt, completion), atol=1e-5)
    assert all(len(values) == 3 for values in out["logprobs"][0])


def test_weight_updates_check_the_announced_tensors(server, client, server_model, tmp_path):
    from safetensors.torch import save_file

    client.init_communicator(device="cpu")  # the HTTP half of the handshake (loopback_trl_vllm)
    weights = {name: p.detach().clone() for name, p in server_model.named_parameters()}
    name = next(iter(weights))
    path = str(tmp_path / "partial.safetensors")
    save_file({name: weights[name]}, path)
    with client.weight_update():
        client._post(f"{server.base_url}/update_weights", json={"update_info": {
            "names": list(weights), "dtype_names": ["float32"] * len(weights),
            "shapes": [list(t.shape) for t in weights.values()]}})
        with pytest.raises(Exception, match="missing"):  # a file without every announced tensor is refused
            client._post(f"{server.base_url}{LOAD_WEIGHTS_ROUTE}", json={"path": path})
        with pytest.raises(Exception, match="never arrived"):  # and the update cannot finish without them
            client._finish_weight_update()
        client.update_model_params(server_model)  # the full, announced set
    assert server.weight_version == 1


# ---- VLLMGenerator on TRL's VLLMGeneration ---------------------------------------------------------------------------


def test_generator_turn_budgets_sampling_settings_and_logprobs(server, server_model, tokenizer):
    engine = vllm_generation(server_model, tokenizer, server)
    engine.generation_kwargs = {"seed": 3, "stop_token_ids": [7]}
    generator = VLLMGenerator(engine, eos_token_ids=[tokenizer.eos_token_id])
    prompts = encode(tokenizer, "P F F H", "up down")
    short = generator.generate(prompts, SamplingParams(max_new_tokens=2))
    long = generator.generate(prompts, SamplingParams(max_new_tokens=7, temperature=0.5, top_p=0.9, top_k=5))
    first, second = server.bodies("/v1/completions")
    assert (first["max_tokens"], second["max_tokens"]) == (2, 7)  # each turn's own budget
    settings = (second["temperature"], second["top_p"], second["top_k"], second["n"], second["logprobs"])
    assert settings == (0.5, 0.9, 5, 1, 0)
    assert second["seed"] == 3 and second["stop_token_ids"] == [7, tokenizer.eos_token_id]  # user kwargs kept
    assert all(len(ids) <= 2 for ids in short.completion_ids) and all(len(ids) <= 7 for ids in long.completion_ids)
    # TRL's settings are restored after each call.
    assert (engine.temperature, engine.max_completion_length, engine.generation_kwargs) == (1.0, 16, {"seed": 3,
                                                                                                "stop_token_ids": [7]})
    for prompt, ids, logprobs in zip(prompts, short.completion_ids, short.logprobs, strict=True):
        assert torch.allclose(torch.tensor(logprobs), teacher_forced(server_model, prompt, ids), atol=1e-5)


def test_generator_greedy_eos_cut_and_empty_batches(server, server_model, tokenizer):
    engine = vllm_generation(server_model, tokenizer, server)
    prompts = encode(tokenizer, "P F", "F H G")
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    reference = TransformersGenerator(server_model, tokenizer).generate(prompts, greedy).completion_ids
    generator = VLLMGenerator(engine, eos_token_ids=[tokenizer.eos_token_id])
    assert generator.generate(prompts, greedy).completion_ids == reference
    assert server.bodies("/v1/completions")[-1]["temperature"] == 0.0
    # An id the model emits early ends the turn there (kept, like an EOS).
    early = reference[0][1]
    cut = VLLMGenerator(engine, eos_token_ids=[early, tokenizer.eos_token_id]).generate(prompts[:1], greedy)
    assert cut.completion_ids[0] == reference[0][: reference[0].index(early) + 1]
    calls = server.count("/v1/completions")
    assert generator.generate([], greedy).completion_ids == [] and server.count("/v1/completions") == calls
    assert not generator.collective  # one process: nothing to pad


class FakeAccelerator:
    """Two processes without torch.distributed: `gather` answers for the other process from a script."""

    def __init__(self, other_values, num_processes=2):
        self.device = torch.device("cpu")
        self.num_processes = num_processes
        self.other_values = list(other_values)

    def gather(self, tensor):
        return torch.cat([tensor, torch.tensor([self.other_values.pop(0)], dtype=tensor.dtype)])


class FakeEngine:
    """A VLLMGeneration stand-in that answers every prompt with "a", EOS, then two more tokens (as an engine that
    ignored the stop ids would); the EOS has no log-prob (None)."""

    def __init__(self, accelerator, tokenizer, mode="server", tensor_parallel_size=1):
        self.mode, self.accelerator, self.tensor_parallel_size = mode, accelerator, tensor_parallel_size
        self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty = 1.0, 1.0, 0, 0.0, 1.0
        self.max_completion_length, self.generation_kwargs = 16, {}
        text = tokenizer.encode("a", add_special_tokens=False)
        self.answer = text + [tokenizer.eos_token_id, 5, 6]
        self.answer_logprobs = [[-0.25]] * len(text) + [[None]] + [[-0.25]] * 2
        self.turn_length = len(text) + 1  # up to and with the EOS
        self.calls = []

    def generate(self, prompts, images, num_generations):
        self.calls.append([list(p) for p in prompts])
        return prompts, [list(self.answer) for _ in prompts], [list(self.answer_logprobs) for _ in prompts], None

    def sync_weights(self):
        pass


def test_collective_calls_pad_to_the_largest_process_and_cut_after_eos(tokenizer):
    eos = tokenizer.eos_token_id
    engine = FakeEngine(FakeAccelerator(other_values=[3, 2, 0, 0]), tokenizer)
    generator = VLLMGenerator(engine, eos_token_ids=[eos], dummy_prompt=[9])
    assert generator.collective
    out = generator.generate([[1, 2]], SamplingParams(max_new_tokens=4))  # the other process has 3 prompts
    assert engine.calls[-1] == [[1, 2], [9], [9]]
    assert out.completion_ids == [engine.answer[: engine.turn_length]]  # cut after the EOS, dummies dropped
    assert out.logprobs[0][:-1] == [-0.25] * (engine.turn_length - 1) and math.isnan(out.logprobs[0][-1])
    assert generator.generate([], SamplingParams()).completion_ids == []  # the other has 2: still called, padded
    assert engine.calls[-1] == [[9], [9]]
    assert generator.generate([], SamplingParams()).completion_ids == []  # nobody has a prompt: no call
    assert len(engine.calls) == 2
    assert generator.any_active(False) is False  # the other process answered 0


def test_which_modes_are_collective(tokenizer):
    def collective(mode, processes, tp=1):
        engine = FakeEngine(FakeAccelerator([], num_processes=processes), tokenizer, mode, tp)
        return VLLMGenerator(engine, eos_token_ids=[tokenizer.eos_token_id]).collective

    assert collective("server", 2) and collective("colocate", 4, tp=2)
    assert not collective("server", 1) and not collective("colocate", 2)
    with pytest.raises(ValueError, match="mode"):
        VLLMGenerator(FakeEngine(FakeAccelerator([]), tokenizer, mode="async"), eos_token_ids=[1])


def test_a_process_whose_episodes_ended_keeps_calling_while_another_plays(tokenizer):
    # This process: 2 one-turn episodes. The other process plays 3 turns with 2 prompts each. The engine must make
    # the same 3 collective calls here, the last 2 with dummy prompts only, then stop when nobody is active: once
    # every process is idle, all topologies are asked for more episodes together, and one more any_active says none
    # has any (the last 0).
    accelerator = FakeAccelerator(other_values=[1, 2, 1, 2, 1, 2, 0, 0])  # (any_active, prompt count) per turn
    engine = FakeEngine(accelerator, tokenizer)
    generator = VLLMGenerator(engine, eos_token_ids=[tokenizer.eos_token_id], dummy_prompt=[9])
    rollout = RolloutEngine(generator, PromptRenderer(tokenizer), max_turns=5, sampling=SamplingParams(4))
    batch = rollout.run([{"env": "test-keyword", "seed": 0, "length": 1}], num_generations=2)
    assert [len(call) for call in engine.calls] == [2, 2, 2]
    assert engine.calls[1] == engine.calls[2] == [[9], [9]]
    assert [t.num_steps for t in batch.trajectories] == [1, 1] and not accelerator.other_values


# ---- rollouts and weight sync through the real client ----------------------------------------------------------------


def test_finished_episodes_stop_generating(server, server_model, tokenizer):
    generator = VLLMGenerator(vllm_generation(server_model, tokenizer, server), eos_token_ids=[tokenizer.eos_token_id])
    tasks = [{"env": "test-keyword", "seed": seed, "length": length} for seed, length in enumerate([1, 2, 3])]
    engine = RolloutEngine(generator, PromptRenderer(tokenizer), max_turns=4, sampling=SamplingParams(4),
                           env_pool=EnvPool())
    batch = engine.run(tasks, num_generations=2)
    assert [len(body["prompt"]) for body in server.bodies("/v1/completions")] == [6, 4, 2]
    assert [t.num_steps for t in batch.trajectories] == [1, 1, 2, 2, 3, 3]
    for step in (s for t in batch.trajectories for s in t.steps):
        expected = teacher_forced(server_model, step.prompt_ids, step.action_ids)
        assert torch.allclose(torch.tensor(step.action_logprobs), expected, atol=1e-5)


def test_weight_sync_is_visible_in_the_next_turns_logprobs(server, server_model, tokenizer):
    policy = other_tiny_model(tokenizer, seed=1)  # the trainer's model: other weights than the server's
    generator = VLLMGenerator(vllm_generation(policy, tokenizer, server), eos_token_ids=[tokenizer.eos_token_id])
    prompt = encode(tokenizer, "P F F H")[0]

    def turn_logprobs(model):
        out = generator.generate([prompt], SamplingParams(max_new_tokens=5))
        ids = out.completion_ids[0]
        return torch.tensor(out.logprobs[0]), teacher_forced(model, prompt, ids)

    served, expected = turn_logprobs(server_model)
    assert torch.allclose(served, expected, atol=1e-5)
    generator.sync_weights()  # TRL's parameter walk; the tensors travel as a file
    served, expected = turn_logprobs(policy)
    assert torch.allclose(served, expected, atol=1e-5)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    generator.sync_weights()
    served_after, expected_after = turn_logprobs(policy)
    assert torch.allclose(served_after, expected_after, atol=1e-5)
    for route in ("/start_weight_update", "/update_weights", LOAD_WEIGHTS_ROUTE, "/finish_weight_update",
                  "/reset_prefix_cache"):
        assert server.count(route) == 2, route
    assert server.count("/init_weight_transfer_engine") == 1 and server.weight_version == 2


def test_evaluation_through_a_vllm_server_plays_like_local_generation(server, server_model, tiny_model_dir, tokenizer):
    from trl_agents.cli import evaluate
    from trl_agents.evaluation import evaluate_policy
    from trl_agents.rollout.vllm import VLLMClientGenerator

    generator = VLLMClientGenerator(server.base_url, [tokenizer.eos_token_id])
    assert generator.generate([], SamplingParams()).completion_ids == [] and server.count("/v1/completions") == 0
    settings = {"env": "test-keyword", "num_tasks": 3, "max_turns": 2, "max_new_tokens": 4, "return_rollout": True}
    served = evaluate_policy(None, tokenizer, generator=generator, **settings)
    local = evaluate_policy(server_model, tokenizer, **settings)
    actions = [[s.action_ids for s in t.steps] for t in served["rollout"].trajectories]
    assert actions == [[s.action_ids for s in t.steps] for t in local["rollout"].trajectories]
    assert [len(body["prompt"]) for body in server.bodies("/v1/completions")] == [3, 3]  # one request per turn
    argv = ["--model_name_or_path", tiny_model_dir, "--env_name", "test-keyword", "--num_eval_tasks", "3",
            "--max_turns", "2", "--max_new_tokens", "4"]
    assert evaluate([*argv, "--vllm_server_url", server.base_url]) == evaluate(argv)  # `trl-agents eval`
    assert server.count("/v1/completions") == 4


# ---- the trainer -----------------------------------------------------------------------------------------------------


class RecordingServer(LoopbackVLLMServer):
    """Remembers every (token ids, log-probs) it sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent = []

    def _choice(self, *args, **kwargs):
        choice = super()._choice(*args, **kwargs)
        self.sent.append((tuple(choice["token_ids"]), tuple(choice["logprobs"]["token_logprobs"])))
        return choice


class LossInputsTrainer(AgentGRPOTrainer):
    """Records the importance-sampling inputs of every loss call (`seen`), and every importance weight computed
    (`weighted`: when the rollout is scored, or, under one-step-off, inside the loss from its own forward)."""

    def _compute_loss(self, model, inputs):
        self.seen = getattr(self, "seen", [])
        self.seen.append({key: inputs.get(key) for key in ("importance_sampling_ratio", "sampling_per_token_logps")})
        return super()._compute_loss(model, inputs)

    def _add_importance_sampling_ratio(self, output, mode):
        super()._add_importance_sampling_ratio(output, mode)
        self.weighted = getattr(self, "weighted", [])
        self.weighted.append({key: output[key] for key in ("importance_sampling_ratio", "sampling_per_token_logps")})


def agent_config(tmp_path, **overrides):
    return tiny_training_config(
        AgentGRPOConfig, tmp_path / "out", **{"per_device_train_batch_size": 4, "num_generations": 2, "max_turns": 2,
                                              **overrides}
    )


TASKS = [{"env": "test-keyword", "seed": seed} for seed in range(2)]


@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_two_training_steps_with_use_vllm_server_mode(row_format, tiny_model, tokenizer, tmp_path):
    server_model = other_tiny_model(tokenizer, seed=1)  # differs from the trainer's until the first sync
    with RecordingServer(server_model, tokenizer) as server, loopback_trl_vllm():
        config = agent_config(tmp_path, row_format=row_format, use_vllm=True, vllm_mode="server",
                              vllm_server_base_url=server.base_url)
        trainer = LossInputsTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer)
        assert isinstance(trainer.generator, VLLMGenerator)
        assert trainer.generator.vllm_generation is trainer.vllm_generation  # TRL's engine, wrapped
        trainer.train()
    assert trainer.state.global_step == 2
    assert server.count("/init_weight_transfer_engine") == 1
    for route in ("/start_weight_update", LOAD_WEIGHTS_ROUTE, "/reset_prefix_cache"):
        assert server.count(route) == 2, route  # once per optimizer step, before its rollout
    bodies = server.bodies("/v1/completions")
    assert len(bodies) == 4 and all(b["n"] == 1 and b["max_tokens"] == 4 for b in bodies)  # 2 turns x 2 steps
    # The rollout's sampling log-probs are the server's, and the server holds the trainer's weights (synced), so
    # TRL's importance ratio is 1 up to float error although the server started from other weights.
    steps = [s for t in trainer.last_rollout.trajectories for s in t.steps]
    assert all((tuple(s.action_ids), tuple(s.action_logprobs)) in server.sent for s in steps)
    logs = [h for h in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in h]
    assert len(logs) == 2
    for log in logs:
        assert log["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
        assert log["sampling/sampling_logp_difference/max"] < 1e-4
    for seen in trainer.seen:
        ratio, sampled = seen["importance_sampling_ratio"], seen["sampling_per_token_logps"]
        assert ratio.shape == (sampled.shape[0], 1)  # TRL's default sequence_mask mode: one ratio per row
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4)


class OffPolicyScripted:
    """A generator that declares off-policy sampling (as VLLMGenerator does): "a" on even rows, "b" on odd ones,
    each token scored -0.5; counts weight syncs."""

    samples_off_policy = True

    def __init__(self, tokenizer):
        self.tokenizer, self.eos_token_ids, self.syncs = tokenizer, [tokenizer.eos_token_id], 0

    def generate(self, prompts, sampling):
        from trl_agents.rollout import GenerationOutput

        encode = self.tokenizer.encode
        ids = [encode("ab"[row % 2], add_special_tokens=False) + self.eos_token_ids for row in range(len(prompts))]
        return GenerationOutput(ids, [[-0.5] * len(i) for i in ids])

    def sync_weights(self):
        self.syncs += 1


@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_a_passed_off_policy_generator_gets_the_correction_in_the_loss(row_format, tiny_model, tokenizer, tmp_path):
    generator = OffPolicyScripted(tokenizer)
    config = agent_config(tmp_path, row_format=row_format, vllm_importance_sampling_mode="token_truncate",
                          vllm_importance_sampling_clip_max=10.0)
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=TASKS, processing_class=tokenizer,
                               generator=generator)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = [dict(TASKS[0])] * 2 + [dict(TASKS[1])] * 2
    output = trainer._generate_and_score_completions(inputs)
    assert generator.syncs == 1
    trainer._generate_and_score_completions(inputs)
    assert generator.syncs == 1  # same optimizer step: no second sync
    # The ratio is TRL's, over trained tokens only: environment tokens of conversation rows get ratio 1.
    trained = output["completion_mask"] * output.get("tool_mask", 1)
    ratio = output["importance_sampling_ratio"]
    expected = torch.where(trained.bool(), torch.exp(output["old_per_token_logps"] + 0.5), torch.ones(()))
    assert torch.allclose(ratio, expected, atol=1e-6)
    assert trainer._metrics["train"]["sampling/importance_sampling_ratio/max"][0] == pytest.approx(
        ratio[trained.bool()].max().item())
    if row_format == "conversation":
        assert (trained == 0).logical_and(output["completion_mask"] == 1).any()
    # TRL's loss multiplies by the ratio although use_vllm is False: doubling the ratio doubles the loss.
    loss = trainer._compute_loss(trainer.model, output)
    doubled = trainer._compute_loss(trainer.model, dict(output, importance_sampling_ratio=2 * ratio))
    assert loss.abs() > 1e-6 and doubled.item() == pytest.approx(2 * loss.item(), rel=1e-4)
    assert trainer.use_vllm is False  # raised only for the duration of the loss call


def test_generator_and_use_vllm_are_exclusive(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="use_vllm=True"):
        AgentGRPOTrainer(model=tiny_model, args=agent_config(tmp_path, use_vllm=True, vllm_mode="server"),
                         train_dataset=TASKS, processing_class=tokenizer, generator=OffPolicyScripted(tokenizer))
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        AgentGRPOTrainer(model=tiny_model, args=agent_config(tmp_path, loss_type="vespo"), train_dataset=TASKS,
                         processing_class=tokenizer, generator=OffPolicyScripted(tokenizer))


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token_truncate", [[2.0, 0.5, 1.0], [2.0, 1.0, 1.0]]),  # clamped to [0.5, 2]; untrained tokens give 1
        ("token_mask", [[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]]),  # outside [0.5, 2]: 0
        ("sequence_truncate", [[0.625], [2.0]]),  # the product over trained tokens: 2.5 x 0.25, 3 x 1
        ("sequence_mask", [[0.625], [0.0]]),
    ],
)
def test_importance_sampling_ratio_modes(mode, expected):
    old = torch.log(torch.tensor([[2.5, 0.25, 7.0], [3.0, 1.0, 7.0]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    ratio = importance_sampling_ratio(old, torch.zeros(2, 3), mask, mode, clip_min=0.5, clip_max=2.0)
    assert torch.allclose(ratio, torch.tensor(expected))


def test_importance_sampling_ratio_unknown_mode():
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        importance_sampling_ratio(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "token", None, None)


# ---- what this relies on in TRL 1.16 ---------------------------------------------------------------------------------


def test_trl_vllm_contract():
    """The TRL behaviours VLLMGenerator, the trainer and loopback_trl_vllm drive; revisit them when bumping TRL."""
    import inspect

    from trl import GRPOTrainer
    from trl.generation import vllm_client, vllm_generation

    # The loss applies the ratio only under `use_vllm` (AgentGRPOTrainer._compute_loss raises it for passed generators).
    assert 'self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type != "vespo"' in (
        inspect.getsource(GRPOTrainer._compute_loss))
    generate = vllm_generation.VLLMGeneration.generate
    assert list(inspect.signature(generate).parameters) == ["self", "prompts", "images", "num_generations", "profiler"]
    source = inspect.getsource(generate)
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_completion_length",
                 "generation_kwargs"):
        assert f"self.{name}" in source, name  # the attributes VLLMGenerator sets per turn
    assert "accelerator.process_index * len(prompts)" in source  # why collective calls pad to equal counts
    assert list(inspect.signature(vllm_client.VLLMClient.init_communicator).parameters) == ["self", "device"]
    assert list(inspect.signature(vllm_client.VLLMClient.update_named_params).parameters) == [
        "self", "metadata", "named_params"]
    assert callable(vllm_client.is_vllm_available) and callable(vllm_generation.is_vllm_available)  # patched names


# ---- GPU: real vLLM (skipped on CPU machines) ------------------------------------------------------------------------

needs_vllm_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
    reason="needs CUDA and vllm (pip install -e '.[vllm]')",
)
GPU_MODEL = os.environ.get("TRL_AGENTS_VLLM_TEST_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")


@pytest.mark.gpu
@needs_vllm_gpu
def test_gpu_colocate_mode_trains_with_the_correction(tmp_path):
    """vLLM in the training process: one step, the generator is not collective, TRL's correction is logged and the
    engine's log-probs agree with the trainer's (same weights, bf16 numerics)."""
    from importlib.metadata import version

    assert version("vllm").split("+")[0] == SUPPORTED_VLLM_VERSION
    config = agent_config(tmp_path, max_steps=1, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
                          max_completion_length=16)
    trainer = AgentGRPOTrainer(model=GPU_MODEL, args=config, train_dataset=TASKS)
    assert isinstance(trainer.generator, VLLMGenerator) and not trainer.generator.collective
    trainer.train()
    log = next(h for h in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in h)
    assert log["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=0.1)


@pytest.mark.gpu
@needs_vllm_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL weight sync needs the server on another GPU")
def test_gpu_server_mode_with_nccl_weight_sync(tmp_path):
    """`vllm serve` on GPU 1, training on GPU 0: two steps with NCCL weight sync; the engine's log-probs track the
    trainer's (ratio near 1 after each sync)."""
    port = 8765
    command = [shutil.which("vllm") or "vllm", "serve", GPU_MODEL, "--port", str(port), "--gpu-memory-utilization",
               "0.5", "--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode", "processed_logprobs",
               "--max-logprobs", "-1"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="1", VLLM_SERVER_DEV_MODE="1")
    process = subprocess.Popen(command, env=env, stdout=sys.stderr, stderr=sys.stderr)
    try:
        config = agent_config(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_timeout=600,
                              vllm_server_base_url=f"http://127.0.0.1:{port}", max_completion_length=16)
        trainer = AgentGRPOTrainer(model=GPU_MODEL, args=config, train_dataset=TASKS)
        trainer.train()
        logs = [h for h in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in h]
        assert len(logs) == 2
        assert all(h["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=0.1) for h in logs)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        time.sleep(1)


def test_one_step_off_through_a_vllm_server_syncs_between_rollouts_and_corrects_with_the_behaviour_weight(
        tiny_model, tokenizer, tmp_path):
    # max_staleness=1 with TRL's vLLM server mode: the server generates rollout s + 1 while the trainer trains on
    # rollout s; weights move to the server only when nothing is in flight, once per launch; the loss multiplies by
    # the truncated behaviour weight (token_truncate, C = 2) instead of TRL's sequence mask.
    tasks = [{"env": "test-keyword", "seed": seed} for seed in range(6)]  # 3 steps of 2 tasks: one epoch
    server_model = other_tiny_model(tokenizer, seed=1)
    with RecordingServer(server_model, tokenizer) as server, loopback_trl_vllm():
        config = agent_config(tmp_path, max_steps=3, use_vllm=True, vllm_mode="server",
                              vllm_server_base_url=server.base_url, max_staleness=1)
        trainer = LossInputsTrainer(model=tiny_model, args=config, train_dataset=tasks, processing_class=tokenizer)
        synced = trainer.generator.sync_weights
        in_flight = []

        def sync_weights():
            in_flight.append(trainer.one_step_off.pending is not None)
            synced()

        trainer.generator.sync_weights = sync_weights
        trainer.train()
    # Step 0's weights once (its rollout in place, then the launch of rollout 1 with the same weights), step 1's at
    # the launch of rollout 2; never while a rollout is in flight.
    assert in_flight == [False, False]
    logs = [h for h in trainer.state.log_history if "async/lag_rollouts" in h]
    assert [log["async/lag_rollouts"] for log in logs] == [0.0, 1.0, 1.0]
    # one weight per loss call, from the loss's own forward (one optimizer step per generation batch)
    assert len(trainer.weighted) == len(trainer.seen) == 3
    for weighted in trainer.weighted:
        ratio, sampled = weighted["importance_sampling_ratio"], weighted["sampling_per_token_logps"]
        assert ratio.shape == sampled.shape and float(ratio.max()) <= 2.0  # per token, truncated at C
    assert any(not torch.allclose(w["importance_sampling_ratio"], torch.ones(())) for w in trainer.weighted[1:])
