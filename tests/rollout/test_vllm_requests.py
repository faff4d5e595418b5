"""The per-request path of the vLLM generators (`submit`, `generate(..., seeds=...)`), against the loopback vLLM
server: one `/v1/completions` request per prompt, sent from each process's own thread pool, without TRL's collective.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from trl_agents.rollout import SamplingParams, TransformersGenerator
from trl_agents.rollout.vllm import VLLMClientGenerator, VLLMGenerator, server_url

ROUTE = "/v1/completions"

# ---- fixtures and helpers --------------------------------------------------------------------------------------------


@pytest.fixture
def generator(server, tokenizer):
    made = VLLMClientGenerator(server.base_url, [tokenizer.eos_token_id])
    yield made
    made.close()


def encode(tokenizer, *texts):
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def eight_prompts(tokenizer):
    return encode(tokenizer, "P F F H", "up down", "left right", "S F H G", "H F G", "P F", "F H G", "down up left")


def teacher_forced(model, prompt, completion, temperature=1.0):
    """log_softmax(logits / T) of `completion` after `prompt`."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


class Gate:
    """Wraps the server's request handler: `/v1/completions` requests are counted while open and held until
    `release` is set; `answer` (an (HTTP status, headers, body) tuple) replaces the server's answer when set (such
    requests are not in the server's record: `seen` counts them)."""

    def __init__(self, server, hold=True, answer=None):
        self.inner, self.answer = server.handle, answer
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.changed = threading.Condition()
        self.open = self.most = self.seen = 0
        server.handle = self  # the request handler calls `server.handle(...)`

    def __call__(self, method, target, headers, body):
        if not target.startswith(ROUTE):
            return self.inner(method, target, headers, body)
        with self.changed:
            self.open += 1
            self.seen += 1
            self.most = max(self.most, self.open)
            self.changed.notify_all()
        try:
            self.release.wait(timeout=30)
            return self.answer if self.answer is not None else self.inner(method, target, headers, body)
        finally:
            with self.changed:
                self.open -= 1
                self.changed.notify_all()

    def wait_open(self, count, timeout=10.0):
        with self.changed:
            return self.changed.wait_for(lambda: self.open >= count, timeout=timeout)


# ---- submit and generate(seeds=...) ----------------------------------------------------------------------------------


def test_concurrent_submits_equal_one_by_one_and_generate_with_seeds(server, server_model, generator, tokenizer):
    eos = tokenizer.eos_token_id
    prompts, seeds = eight_prompts(tokenizer), [100 + i for i in range(8)]
    sampling = SamplingParams(max_new_tokens=6, temperature=0.8)
    futures = [generator.submit(prompt, sampling, seed) for prompt, seed in zip(prompts, seeds, strict=True)]
    assert len(futures) == 8
    together = [future.result(timeout=60) for future in futures]
    assert all(len(out.completion_ids) == len(out.logprobs) == 1 for out in together)
    bodies = server.bodies(ROUTE)
    assert len(bodies) == 8  # one request per prompt (TRL's client sent none)
    by_seed = {body["seed"]: body for body in bodies}
    assert sorted(by_seed) == seeds
    for prompt, seed in zip(prompts, seeds, strict=True):
        body = by_seed[seed]
        assert body["prompt"] == prompt and body["n"] == 1 and body["max_tokens"] == 6 and body["logprobs"] == 0
        assert eos in body["stop_token_ids"] and body["temperature"] == 0.8 and body["model"] == "loopback-model"
        assert body["return_token_ids"] and body["return_tokens_as_token_ids"]
    one_by_one = [generator.submit(p, sampling, s).result(timeout=60) for p, s in zip(prompts, seeds, strict=True)]
    batch = generator.generate(prompts, sampling, seeds=seeds)
    assert server.count(ROUTE) == 24
    for row, (alone, concurrent) in enumerate(zip(one_by_one, together, strict=True)):
        assert alone.completion_ids == concurrent.completion_ids == [batch.completion_ids[row]]
        assert alone.logprobs == concurrent.logprobs == [batch.logprobs[row]]
    # The log-probs are the server's processed ones (temperature-scaled), cut with the ids after an EOS.
    for prompt, ids, values in zip(prompts, batch.completion_ids, batch.logprobs, strict=True):
        assert len(ids) <= 6 and (eos not in ids or ids.index(eos) == len(ids) - 1)
        assert torch.allclose(torch.tensor(values), teacher_forced(server_model, prompt, ids, 0.8), atol=1e-5)


def test_a_seed_gives_the_same_turn_alone_or_among_others(generator, tokenizer):
    prompts = eight_prompts(tokenizer)
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0)
    alone = generator.submit(prompts[0], sampling, seed=5).result(timeout=60)
    among = generator.generate([prompts[3], prompts[0], prompts[5]], sampling, seeds=[1, 5, 2])
    assert among.completion_ids[1] == alone.completion_ids[0] and among.logprobs[1] == alone.logprobs[0]
    first = generator.generate(prompts, sampling, seeds=[1] * 8)
    second = generator.generate(prompts, sampling, seeds=[2] * 8)
    assert first.completion_ids != second.completion_ids  # another seed, another sample (for some prompt)
    assert generator.generate(prompts, sampling, seeds=[1] * 8).completion_ids == first.completion_ids


def test_greedy_sends_temperature_zero(server, server_model, generator, tokenizer):
    prompts = encode(tokenizer, "P F", "F H G")
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    out = generator.generate(prompts, greedy, seeds=[0, 1])
    assert [body["temperature"] for body in server.bodies(ROUTE)] == [0.0, 0.0]
    reference = TransformersGenerator(server_model, tokenizer).generate(prompts, greedy)
    assert out.completion_ids == reference.completion_ids
    assert generator.submit(prompts[0], greedy).result(timeout=60).completion_ids == reference.completion_ids[:1]
    assert "seed" not in server.bodies(ROUTE)[-1]  # no seed given: none sent


def test_requests_overlap_up_to_the_pool_size(server, tokenizer):
    generator = VLLMClientGenerator(server.base_url, [tokenizer.eos_token_id], max_concurrent_requests=4)
    gate = Gate(server)
    try:
        prompts = eight_prompts(tokenizer)
        futures = [generator.submit(p, SamplingParams(max_new_tokens=3), seed=i) for i, p in enumerate(prompts)]
        # Every submit returned while the server holds all requests; 4 are open on the server at once (the pool's
        # size), the other 4 wait in the pool.
        assert gate.wait_open(4), f"only {gate.open} requests reached the server together"
        time.sleep(0.2)
        assert gate.open == 4 and not any(future.done() for future in futures)
        gate.release.set()
        outs = [future.result(timeout=60) for future in futures]
    finally:
        gate.release.set()
        generator.close()
    assert len(outs) == 8 and gate.most == 4 and server.count(ROUTE) == 8


# ---- failures ----------------------------------------------------------------------------------------------------------


def test_a_server_error_fails_the_future_naming_the_url_and_status(server, generator, tokenizer):
    error = {"error": {"message": "engine\ndead", "type": "InternalServerError", "param": None, "code": 500}}
    gate = Gate(server, hold=False, answer=(500, {}, error))
    future = generator.submit(encode(tokenizer, "P F")[0], SamplingParams(max_new_tokens=3), seed=1)
    with pytest.raises(RuntimeError) as caught:
        future.result(timeout=30)
    message = str(caught.value)
    assert f"{server.base_url}{ROUTE}" in message and "HTTP 500 Internal Server Error" in message
    assert "engine dead" in message and "\n" not in message
    with pytest.raises(RuntimeError, match="HTTP 500"):  # generate(seeds=...) raises the request's error
        generator.generate(encode(tokenizer, "P F", "F H"), SamplingParams(max_new_tokens=3), seeds=[1, 2])
    assert gate.seen == 3  # no retries


def test_a_stopped_server_or_a_silent_one_fails_within_the_timeout(server, tokenizer):
    silent = VLLMClientGenerator(server.base_url, [tokenizer.eos_token_id], request_timeout=0.5)
    gate = Gate(server)  # holds every request: no answer
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"failed: no answer within request_timeout=0\.5 s") as caught:
            silent.submit(encode(tokenizer, "P F")[0], SamplingParams(max_new_tokens=3)).result(timeout=30)
        assert time.monotonic() - started < 10 and server.base_url in str(caught.value)
    finally:
        gate.release.set()
        silent.close()
    stopped = VLLMClientGenerator(server.base_url, [tokenizer.eos_token_id])
    url = server.base_url
    server.stop()
    try:
        with pytest.raises(RuntimeError, match="ConnectionError") as caught:
            stopped.submit(encode(tokenizer, "P F")[0], SamplingParams(max_new_tokens=3)).result(timeout=30)
        assert f"{url}{ROUTE}" in str(caught.value) and "\n" not in str(caught.value)
    finally:
        stopped.close()


# ---- VLLMGenerator on TRL's VLLMGeneration ---------------------------------------------------------------------------


def test_vllm_generator_in_server_mode_sends_per_request(server, server_model, tokenizer):
    from trl.generation.vllm_generation import VLLMGeneration

    eos = tokenizer.eos_token_id
    engine = VLLMGeneration(server_model, Accelerator(), tokenizer, mode="server", server_base_url=server.base_url)
    engine.generation_kwargs = {"stop_token_ids": [7], "seed": 3}
    generator = VLLMGenerator(engine, eos_token_ids=[eos])
    assert generator.request_level and generator.per_request_seeds
    prompts, sampling = eight_prompts(tokenizer)[:3], SamplingParams(max_new_tokens=5, temperature=0.7, top_k=9)
    try:
        futures = [generator.submit(prompt, sampling, seed=20 + i) for i, prompt in enumerate(prompts)]
        submitted = [future.result(timeout=60) for future in futures]
        batch = generator.generate(prompts, sampling, seeds=[20, 21, 22])
    finally:
        generator.close()
    assert [out.completion_ids[0] for out in submitted] == batch.completion_ids
    bodies = server.bodies(ROUTE)
    assert len(bodies) == 6 and all(body["prompt"] in prompts for body in bodies)  # one flat prompt per request
    assert sorted(body["seed"] for body in bodies) == [20, 20, 21, 21, 22, 22]  # ours, not generation_kwargs'
    assert all(body["stop_token_ids"] == [7, eos] and body["top_k"] == 9 and body["n"] == 1 for body in bodies)
    assert server.count("/v1/models") == 1  # TRL's client start-up; the main process reuses its model id
    # Without seeds: today's path through TRL (one request with every prompt).
    generator.generate(prompts, sampling)
    assert server.bodies(ROUTE)[-1]["prompt"] == prompts and server.count(ROUTE) == 7


class NoGather:
    """An accelerator of a non-main process among two: any collective fails the test."""

    device, num_processes, process_index, is_main_process = torch.device("cpu"), 2, 1, False

    def gather(self, tensor):
        raise AssertionError("the per-request path must not run a collective")


def test_every_process_derives_the_url_and_sends_without_a_collective(server, tokenizer):
    host, port = server.base_url.removeprefix("http://").split(":")
    engine = SimpleNamespace(mode="server", accelerator=NoGather(), server_base_url=None, server_host=host,
                             server_port=int(port), generation_kwargs={})  # no vllm_client: not the main process
    generator = VLLMGenerator(engine, eos_token_ids=[tokenizer.eos_token_id])
    assert generator.collective and generator.request_level
    try:
        prompts = eight_prompts(tokenizer)
        out = generator.generate(prompts, SamplingParams(max_new_tokens=3), seeds=list(range(8)))
    finally:
        generator.close()
    assert len(out.completion_ids) == 8 and server.count(ROUTE) == 8
    assert server.count("/v1/models") == 1  # the served model's id, asked once for all 8 concurrent requests
    assert server_url(SimpleNamespace(server_base_url="http://h:1/")) == "http://h:1"


def test_colocate_mode_refuses_per_request_seeds(tokenizer):
    engine = SimpleNamespace(mode="colocate", accelerator=NoGather(), tensor_parallel_size=1)
    generator = VLLMGenerator(engine, eos_token_ids=[tokenizer.eos_token_id])
    assert not generator.request_level and not generator.per_request_seeds
    with pytest.raises(ValueError, match="^per-request seeds need vLLM server mode: this VLLMGenerator is in colocate "
                                         "mode$"):
        generator.generate([[5, 6]], SamplingParams(), seeds=[1])
    with pytest.raises(ValueError, match="^submit needs vLLM server mode"):
        generator.submit([5, 6], SamplingParams(), seed=1)
    generator.close()  # nothing to close


def test_seed_count_must_match_and_close_reopens(server, generator, tokenizer):
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        generator.generate([[5, 6]], SamplingParams(), seeds=[1, 2])
    assert generator.generate([], SamplingParams(), seeds=[]).completion_ids == []
    first = generator.submit([5, 6], SamplingParams(max_new_tokens=3), seed=4).result(timeout=60)
    generator.close()
    again = generator.submit([5, 6], SamplingParams(max_new_tokens=3), seed=4).result(timeout=60)
    assert again.completion_ids == first.completion_ids
