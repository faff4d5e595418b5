"""Per-request seeds in TransformersGenerator (`per_request_seeds`): a prompt's sampled tokens depend on its logits and
its seed only, not on the other prompts of the call, their order or earlier calls; the draws follow the warped
distribution and the recorded log-probs stay log_softmax(raw logits / T)."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from trl_agents.rollout.fast_generation import SeededSampler
from trl_agents.rollout.generators import GenerationOutput, SamplingParams, TransformersGenerator

TEXTS = ["P F F H", "up", "F H G left right down", "S", "down down"]
SAME_LENGTH_TEXTS = ["up down left right", "F H G S", "left left up up", "S F F G", "right up down down"]
TEMPERATURE = SamplingParams(max_new_tokens=8, temperature=0.7)
ALL_PROCESSORS = SamplingParams(
    max_new_tokens=8, temperature=1.3, top_p=0.9, top_k=40, min_p=0.01, repetition_penalty=1.2
)
SAMPLINGS = pytest.mark.parametrize("sampling", [TEMPERATURE, ALL_PROCESSORS], ids=["temperature", "all-processors"])
SEEDED_BACKENDS = pytest.mark.parametrize("backend", ["generate", "static"])


def encode(tokenizer, texts):
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def assert_same(expected: GenerationOutput, actual: GenerationOutput, atol: float = 1e-5):
    assert actual.completion_ids == expected.completion_ids
    for want, got in zip(expected.logprobs, actual.logprobs, strict=True):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=atol, rtol=0)


def pick(output: GenerationOutput, rows) -> GenerationOutput:
    return GenerationOutput([output.completion_ids[r] for r in rows], [output.logprobs[r] for r in rows])


@pytest.fixture
def peaked_model(tokenizer):
    """A tiny model whose next-token distribution is far from uniform (top token ~0.18 at T=0.7 after "F H G"), so
    the distribution checks have power."""
    from trl_agents.testing import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    with torch.no_grad():
        model.model.norm.weight.fill_(6.0)  # scales the logits
    return model.eval()


# ---- batch composition, order and calls ---------------------------------------------------------------------------


@SEEDED_BACKENDS
@SAMPLINGS
def test_a_prompt_samples_the_same_completion_alone_and_in_a_batch(tiny_model, tokenizer, backend, sampling):
    # batch_size=1: every prompt runs alone, so its logits are the same bits in any call and so is its completion.
    generator = TransformersGenerator(tiny_model, tokenizer, backend=backend, batch_size=1)
    prompts, seeds = encode(tokenizer, TEXTS), [101, 7, 2**40 + 3, -5, 0]
    alone = generator.generate([prompts[2]], sampling, seeds=[seeds[2]])
    batch = generator.generate(prompts, sampling, seeds=seeds)
    assert generator.active_backend == backend
    assert batch.completion_ids[2] == alone.completion_ids[0] and batch.logprobs[2] == alone.logprobs[0]
    # The same prompt and seed at another position, among other prompts.
    moved = generator.generate([prompts[0], prompts[2], prompts[4]], sampling, seeds=[55, seeds[2], 56])
    assert moved.completion_ids[1] == alone.completion_ids[0] and moved.logprobs[1] == alone.logprobs[0]


@SEEDED_BACKENDS
@SAMPLINGS
def test_batched_same_length_prompts_sample_what_they_sample_alone(tiny_model, tokenizer, backend, sampling):
    # One batched call: no padding, but a batched forward may round differently from a single-row one, so tokens
    # must agree and log-probs to float rounding (they do on this model; a flip would need a Gumbel-max tie).
    prompts, seeds = encode(tokenizer, SAME_LENGTH_TEXTS), [3, 1, 4, 1, 5]
    assert len({len(p) for p in prompts}) == 1
    one_by_one = TransformersGenerator(tiny_model, tokenizer, backend=backend, batch_size=1)
    together = TransformersGenerator(tiny_model, tokenizer, backend=backend)
    assert_same(one_by_one.generate(prompts, sampling, seeds=seeds), together.generate(prompts, sampling, seeds=seeds))


@SEEDED_BACKENDS
def test_same_seeds_in_another_order_and_call_give_the_same_outputs(tiny_model, tokenizer, backend):
    generator = TransformersGenerator(tiny_model, tokenizer, backend=backend, batch_size=1)
    prompts, seeds = encode(tokenizer, TEXTS), [10, 20, 30, 40, 50]
    torch.manual_seed(0)
    first = generator.generate(prompts, ALL_PROCESSORS, seeds=seeds)
    torch.manual_seed(1)  # the global generator plays no part
    torch.rand(17)
    order = [3, 0, 4, 2, 1]
    second = generator.generate([prompts[i] for i in order], ALL_PROCESSORS, seeds=[seeds[i] for i in order])
    assert_same(pick(first, order), second, atol=0)


def test_seeded_sampling_leaves_the_global_generator_alone(tiny_model, tokenizer):
    for backend in ("generate", "static"):
        generator = TransformersGenerator(tiny_model, tokenizer, backend=backend)
        state = torch.get_rng_state()
        generator.generate(encode(tokenizer, TEXTS), TEMPERATURE, seeds=[1, 2, 3, 4, 5])
        assert torch.equal(torch.get_rng_state(), state)


def test_different_seeds_give_different_samples(tiny_model, tokenizer):
    generator = TransformersGenerator(tiny_model, tokenizer, backend="generate")
    prompt = encode(tokenizer, ["F H G"])[0]
    out = generator.generate([prompt] * 8, TEMPERATURE, seeds=list(range(8)))
    assert len({tuple(ids) for ids in out.completion_ids}) >= 6  # 8 seeds over a near-flat 512-token vocabulary
    again = generator.generate([prompt, prompt], TEMPERATURE, seeds=[5, 5])
    assert again.completion_ids[0] == again.completion_ids[1] == out.completion_ids[5]


def test_static_and_generate_sample_the_same_tokens_for_a_seed(tiny_model, tokenizer):
    prompts, seeds = encode(tokenizer, TEXTS), [9, 8, 7, 6, 5]
    for sampling in (TEMPERATURE, ALL_PROCESSORS):
        plain = TransformersGenerator(tiny_model, tokenizer, backend="generate").generate(prompts, sampling, seeds=seeds)
        fast = TransformersGenerator(tiny_model, tokenizer, backend="static").generate(prompts, sampling, seeds=seeds)
        assert_same(plain, fast, atol=1e-4)


def test_static_is_batch_composition_independent(tiny_model, tokenizer):
    # Static slots pad the batch to a power of two (1, 2, 8 rows here) and reuse their caches across calls.
    generator = TransformersGenerator(tiny_model, tokenizer, backend="static")
    prompts, seeds = encode(tokenizer, SAME_LENGTH_TEXTS), [21, 22, 23, 24, 25]
    alone = [generator.generate([p], ALL_PROCESSORS, seeds=[s]) for p, s in zip(prompts, seeds, strict=True)]
    whole = generator.generate(prompts, ALL_PROCESSORS, seeds=seeds)
    pair = generator.generate([prompts[4], prompts[1]], ALL_PROCESSORS, seeds=[seeds[4], seeds[1]])
    for row, single in enumerate(alone):
        assert_same(single, pick(whole, [row]))
    assert_same(pick(whole, [4, 1]), pair)


def test_greedy_ignores_seeds(tiny_model, tokenizer):
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    prompts = encode(tokenizer, TEXTS)
    for backend in ("generate", "static"):
        generator = TransformersGenerator(tiny_model, tokenizer, backend=backend)
        assert_same(generator.generate(prompts, greedy), generator.generate(prompts, greedy, seeds=[1, 2, 3, 4, 5]))


# ---- the sampled distribution and the recorded log-probs ----------------------------------------------------------


def first_token_probabilities(model, prompt, temperature, top_k=0):
    with torch.no_grad():
        scores = model(torch.tensor([prompt])).logits[0, -1].float() / temperature
    if top_k:
        scores = scores.masked_fill(scores < scores.topk(top_k).values[-1], -float("inf"))
    return torch.softmax(scores, -1)


def assert_matches_distribution(tokens, probabilities, max_abs_diff=0.03):
    counts = torch.bincount(torch.tensor(tokens), minlength=len(probabilities)).double()
    frequencies = counts / counts.sum()
    assert (frequencies - probabilities).abs().max() < max_abs_diff
    assert counts[probabilities == 0].sum() == 0  # filtered tokens are never drawn
    # Chi-square over the tokens expected at least 5 times, the rest pooled in one bin.
    expected = probabilities.double() / probabilities.double().sum() * counts.sum()
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    result = stats.chisquare(observed[keep].numpy(), expected[keep].numpy())
    assert result.pvalue > 1e-3, (result, int(big.sum()))


@SEEDED_BACKENDS
@pytest.mark.parametrize("top_k", [0, 5])
def test_first_tokens_over_seeds_follow_the_warped_distribution(peaked_model, tokenizer, backend, top_k):
    prompt = encode(tokenizer, ["F H G"])[0]
    sampling = SamplingParams(max_new_tokens=1, temperature=0.7, top_k=top_k)
    generator = TransformersGenerator(peaked_model, tokenizer, backend=backend)
    out = generator.generate([prompt] * 2000, sampling, seeds=range(2000))
    probabilities = first_token_probabilities(peaked_model, prompt, 0.7, top_k)
    assert probabilities.max() > 0.15  # a peaked distribution: the check has power
    assert_matches_distribution([ids[0] for ids in out.completion_ids], probabilities)


def test_seeded_sampler_draws_from_softmax_independently_across_steps():
    # A skewed 8-token distribution with two filtered tokens, 20000 seeds, two decode steps.
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -float("inf"), -2.0, -float("inf")])
    probabilities = torch.softmax(logits, -1)
    seeds = range(20000)
    sampler = SeededSampler(seeds, steps=2, device="cpu")
    scores = logits.expand(len(seeds), -1)
    first, second = sampler.sample(scores, 0), sampler.sample(scores, 1)
    assert_matches_distribution(first.tolist(), probabilities, max_abs_diff=0.01)
    assert_matches_distribution(second.tolist(), probabilities, max_abs_diff=0.01)
    assert (first != second).float().mean() > 0.5  # steps get fresh noise
    # Independence of the two steps: the joint counts against the product of the marginals.
    live = probabilities > 0
    index = torch.full((8,), -1, dtype=torch.long)
    index[live] = torch.arange(int(live.sum()))
    table = torch.zeros(int(live.sum()), int(live.sum()), dtype=torch.long)
    table.index_put_((index[first], index[second]), torch.ones_like(first), accumulate=True)
    assert stats.chi2_contingency(table.numpy()).pvalue > 1e-3
    # A row's draw does not depend on the rows around it.
    subset = [17, 3, 19999, 0]
    assert torch.equal(SeededSampler([seeds[i] for i in subset], 2, "cpu").sample(scores[:4], 1), second[subset])


@SEEDED_BACKENDS
@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_logprobs_are_those_of_the_raw_logits_over_temperature(tiny_model, tokenizer, backend, repetition_penalty):
    sampling = SamplingParams(
        max_new_tokens=8, temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=repetition_penalty
    )
    prompts = encode(tokenizer, TEXTS)
    generator = TransformersGenerator(tiny_model, tokenizer, backend=backend)
    out = generator.generate(prompts, sampling, seeds=[1, 2, 3, 4, 5])
    for prompt, ids, logprobs in zip(prompts, out.completion_ids, out.logprobs, strict=True):
        with torch.no_grad():
            logits = tiny_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float() / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)
        if repetition_penalty == 1.0:  # every token is among the top 5 of its step's logits (top-k applied)
            assert all(logits[i, token] >= logits[i].topk(5).values[-1] for i, token in enumerate(ids))


# ---- refusals and wrappers ----------------------------------------------------------------------------------------


def test_paged_refuses_seeds(tiny_model, tokenizer):
    generator = TransformersGenerator(tiny_model, tokenizer, backend="paged")
    with pytest.raises(ValueError, match="backend 'paged' cannot sample with per-request seeds.*use backend 'generate'"):
        generator.generate(encode(tokenizer, TEXTS[:2]), TEMPERATURE, seeds=[1, 2])


def test_seeds_must_match_the_prompts(tiny_model, tokenizer):
    generator = TransformersGenerator(tiny_model, tokenizer)
    assert generator.per_request_seeds
    with pytest.raises(ValueError, match="got 1 seeds for 2 prompts"):
        generator.generate(encode(tokenizer, TEXTS[:2]), TEMPERATURE, seeds=[1])


def test_the_role_router_hands_each_role_its_prompts_seeds():
    from trl_agents.trainers.ib_rl import RoleRoutedGenerator

    class Recorder:
        per_request_seeds = True

        def __init__(self):
            self.seeds = []

        def generate(self, prompts, sampling, seeds=None):
            self.seeds.append(seeds)
            return GenerationOutput([[seed or 0] for seed in seeds or [None] * len(prompts)], [[0.0]] * len(prompts))

    a, b = Recorder(), Recorder()
    router = RoleRoutedGenerator({"a": a, "b": b})
    assert router.per_request_seeds
    out = router.generate([[5], [6], [7]], None, roles=["a", "b", "a"], seeds=[11, 12, 13])
    assert a.seeds == [[11, 13]] and b.seeds == [[12]] and out.completion_ids == [[11], [12], [13]]
    router.generate([[5]], None, roles=["b"])
    assert b.seeds[-1] is None

    class Unseeded:
        def generate(self, prompts, sampling):
            return GenerationOutput([[1]] * len(prompts), [[0.0]] * len(prompts))

    assert not RoleRoutedGenerator({"a": a, "b": Unseeded()}).per_request_seeds
