"""Rollout throughput of the transformers generation backends on one GPU, without vLLM (a script, not a test).

A Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 KV heads, vocab 151936, tied embeddings) with random
bf16 weights (speed does not depend on the weights) plays Sokoban through `RolloutEngine`: 64 and 256 concurrent
episodes (8 episodes per task), a few turns each, 48 new tokens per turn. Random weights write garbage, which Sokoban
rejects as an invalid move, so every episode plays every turn; throughput is what is measured. The tokenizer is the
small one `trl_agents.testing` trains on Sokoban texts (its ids are below the model's vocabulary; sampled ids above
it decode to nothing).

For each backend ("static": static KV cache + CUDA graphs; "generate": plain `model.generate`; "paged":
transformers continuous batching) and episode count it reports generated tokens/s (over the time spent in
`generate` calls), env steps/s (over the whole rollout), milliseconds per decode step (prefill included), the ratio to
plain `generate`, and the fraction of the memory-bandwidth floor: every decode step must read the weights once and
the KV cache of every row once; at 4.8 TB/s (H200 HBM3e) that is the least time a step can take. A one-turn warm-up
rollout precedes each measurement (CUDA graphs are recorded there) and is timed on its own. Before the timed runs,
greedy completions of "static" are compared with those of "generate" on the first-turn prompts.

Needs only torch, transformers and this repository (no trl, datasets or vllm). Results go to $OUT when set, else to
benchmarks/results/: gpu_rollout.json and gpu_rollout.md (gpu_rollout_smoke.* with --smoke), rewritten after every
measurement, so a run that is cut short still leaves what it measured.

Usage:
    PYTHONPATH=src python benchmarks/gpu_rollout.py          # one H200: ~3 min (no new measurement after --budget_s)
    PYTHONPATH=src python benchmarks/gpu_rollout.py --smoke  # CPU, tiny model, under a minute: the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from trl_agents.envs import get_env_class, make_env
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams, TransformersGenerator
from trl_agents.testing import build_tiny_tokenizer, env_corpus

HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e peak bandwidth
QWEN25_05B = {
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
}
SMOKE_MODEL = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 2048, "max_position_embeddings": 4096, "tie_word_embeddings": True,
}
GENERATIONS_PER_TASK = 8
# Continuous batching sizes its cache from free memory; on CPU that sizing alone takes tens of seconds.
SMOKE_PAGED_CONFIG = {"num_blocks": 64, "max_batch_tokens": 512, "block_size": 32}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, tiny counts, on CPU: checks the script runs")
    parser.add_argument("--backends", nargs="+", default=["static", "generate", "paged"])
    parser.add_argument("--episodes", nargs="+", type=int, default=[64, 256], help="concurrent episodes")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--history_length", type=int, default=2)
    parser.add_argument("--sokoban_size", type=int, default=8, help="8: prompts of ~200-370 tokens (mean ~310)")
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--budget_s", type=float, default=240.0, help="start no new measurement after this many s")
    parser.add_argument("--paged_config", type=json.loads, default=None, help="ContinuousBatchingConfig kwargs (JSON)")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.turns, args.max_new_tokens = [8, 16], 2, 8
        args.paged_config = args.paged_config or SMOKE_PAGED_CONFIG
    return args


class TimedGenerator:
    """Passes `generate` calls through and records each one: rows, prompt lengths, completion lengths, seconds."""

    def __init__(self, inner: TransformersGenerator):
        self.inner = inner
        self.eos_token_ids = inner.eos_token_ids
        self.calls: list[dict] = []

    def generate(self, prompts, sampling):
        start = time.perf_counter()
        out = self.inner.generate(prompts, sampling)  # returns Python lists: the device work is done
        self.calls.append({
            "rows": len(prompts),
            "prompt_lengths": [len(p) for p in prompts],
            "completion_lengths": [len(ids) for ids in out.completion_ids],
            "seconds": time.perf_counter() - start,
        })
        return out


def build_model(smoke: bool, tokenizer, device: torch.device):
    shape = SMOKE_MODEL if smoke else QWEN25_05B
    config = Qwen2Config(**shape, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
    )
    return model


def bandwidth_floor_seconds(model, calls: list[dict]) -> float:
    """Least time the decode steps of `calls` can take: each step reads every weight once and every row's KV cache."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    kv_bytes_per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * element
    total = 0.0
    for call in calls:
        prompt = statistics.mean(call["prompt_lengths"])
        for step in range(max(call["completion_lengths"])):
            total += weight_bytes + call["rows"] * (prompt + step) * kv_bytes_per_token
    return total / HBM_BYTES_PER_S


def sokoban_tasks(count: int, args) -> list[dict]:
    return get_env_class("sokoban").task_split("train", count, size=args.sokoban_size)


def first_turn_prompts(renderer: PromptRenderer, tasks: list[dict]) -> list[list[int]]:
    env = make_env("sokoban")
    prompts = []
    for task in tasks:
        observation = env.reset(task)
        prompts.append(renderer.step_prompt_ids(env.instructions, env.task_description(), [], observation))
    return prompts


def compare_greedy(model, tokenizer, prompts, max_new_tokens: int) -> dict:
    """Greedy completions of "static" against "generate": identical rows, and log-prob gaps where tokens agree."""
    greedy = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    plain = TransformersGenerator(model, tokenizer, backend="generate").generate(prompts, greedy)
    fast = TransformersGenerator(model, tokenizer, backend="static").generate(prompts, greedy)
    identical = sum(a == b for a, b in zip(plain.completion_ids, fast.completion_ids, strict=True))
    gaps, first_diverging = [], []
    for ids_a, ids_b, lps_a, lps_b in zip(plain.completion_ids, fast.completion_ids, plain.logprobs, fast.logprobs):
        agree = next((i for i, (a, b) in enumerate(zip(ids_a, ids_b)) if a != b), min(len(ids_a), len(ids_b)))
        gaps.extend(abs(a - b) for a, b in zip(lps_a[:agree], lps_b[:agree]))
        if ids_a != ids_b:
            first_diverging.append(agree)
    return {
        "rows": len(prompts),
        "identical_rows": identical,
        "max_logprob_gap_where_tokens_agree": max(gaps, default=0.0),
        "first_diverging_position": first_diverging,
    }


def measure(backend: str, episodes: int, model, tokenizer, renderer, args) -> dict:
    tasks = sokoban_tasks(episodes // GENERATIONS_PER_TASK, args)
    generator = TransformersGenerator(
        model, tokenizer, backend=backend, continuous_batching_config=args.paged_config
    )
    timed = TimedGenerator(generator)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)

    def rollout(turns: int) -> tuple[float, int]:
        engine = RolloutEngine(timed, renderer, max_turns=turns, sampling=sampling)
        start = time.perf_counter()
        batch = engine.run(tasks, GENERATIONS_PER_TASK)
        return time.perf_counter() - start, sum(t.num_steps for t in batch.trajectories)

    warmup_s, _ = rollout(1)  # records CUDA graphs, autotunes kernels
    timed.calls.clear()
    torch.manual_seed(0)
    wall_s, env_steps = rollout(args.turns)
    generate_s = sum(c["seconds"] for c in timed.calls)
    tokens = sum(sum(c["completion_lengths"]) for c in timed.calls)
    decode_steps = sum(max(c["completion_lengths"]) for c in timed.calls)
    floor_s = bandwidth_floor_seconds(model, timed.calls)
    return {
        "backend": backend,
        "active_backend": generator.active_backend,
        "episodes": episodes,
        "turns": args.turns,
        "mean_prompt_tokens": statistics.mean(n for c in timed.calls for n in c["prompt_lengths"]),
        "generated_tokens": tokens,
        "env_steps": env_steps,
        "warmup_s": warmup_s,
        "rollout_s": wall_s,
        "generate_s": generate_s,
        "generated_tokens_per_s": tokens / generate_s,
        "env_steps_per_s": env_steps / wall_s,
        "ms_per_decode_step": 1000 * generate_s / decode_steps,
        "bandwidth_floor_s": floor_s,
        "fraction_of_bandwidth_floor": floor_s / generate_s,
    }


def write_results(results: dict, smoke: bool) -> Path:
    folder = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    folder.mkdir(parents=True, exist_ok=True)
    stem = "gpu_rollout_smoke" if smoke else "gpu_rollout"
    (folder / f"{stem}.json").write_text(json.dumps(results, indent=2))
    plain = {
        m["episodes"]: m["generated_tokens_per_s"]
        for m in results["measurements"]
        if m["backend"] == "generate" and "error" not in m
    }
    settings = results["settings"]
    description = (
        f"torch {results['torch']}, transformers {results['transformers']}; Sokoban {settings['sokoban_size']}x"
        f"{settings['sokoban_size']}, {GENERATIONS_PER_TASK} episodes per task, {settings['turns']} turns, "
        f"{settings['max_new_tokens']} new tokens per turn, temperature 1. Bandwidth floor: weights + KV cache read "
        f"once per decode step at {HBM_BYTES_PER_S / 1e12:.1f} TB/s (prefill and sampling not counted)."
    )
    header = (
        "| backend | episodes | prompt tokens (mean) | generated tokens/s | env steps/s | ms per decode step "
        "| x generate | fraction of bandwidth floor | warm-up s | rollout s |"
    )
    lines = [f"# Rollout throughput: {results['device']}, {results['model']['name']}", "", description, "", header,
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in results["measurements"]:
        if "error" in m:
            lines.append(f"| {m['backend']} | {m['episodes']} | failed: {m['error'][:120]} |||||||")
            continue
        ratio = m["generated_tokens_per_s"] / plain[m["episodes"]] if m["episodes"] in plain else float("nan")
        lines.append(
            f"| {m['backend']} | {m['episodes']} | {m['mean_prompt_tokens']:.0f} | {m['generated_tokens_per_s']:,.0f} "
            f"| {m['env_steps_per_s']:,.1f} | {m['ms_per_decode_step']:.2f} | {ratio:.1f} "
            f"| {m['fraction_of_bandwidth_floor']:.3g} | {m['warmup_s']:.1f} | {m['rollout_s']:.1f} |"
        )
    check = results.get("greedy_check")
    if check:
        summary = (
            f"Greedy check, static vs generate ({check['rows']} first-turn prompts): "
            f"{check.get('identical_rows', '-')} identical rows; largest log-prob gap where tokens agree "
            f"{check.get('max_logprob_gap_where_tokens_agree', float('nan')):.2e}; {check.get('error', '')}"
        )
        lines += ["", summary]
    lines += ["", "Phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in results["phases"].items())]
    (folder / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return folder


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    phases: dict[str, float] = {}

    def phase(name: str, since: float) -> float:
        phases[name] = time.perf_counter() - since
        print(f"[{time.perf_counter() - start:6.1f} s] {name}: {phases[name]:.1f} s", flush=True)
        return time.perf_counter()

    mark = time.perf_counter()
    tokenizer = build_tiny_tokenizer(env_corpus("sokoban", num_tasks=16, size=args.sokoban_size), vocab_size=1024)
    renderer = PromptRenderer(tokenizer, history_length=args.history_length)
    mark = phase("tokenizer", mark)
    model = build_model(args.smoke, tokenizer, device)
    mark = phase("model", mark)
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor()})",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": {"name": "tiny (smoke)" if args.smoke else "Qwen2.5-0.5B shape, random bf16 weights",
                  "parameters": sum(p.numel() for p in model.parameters())},
        "settings": {k: v for k, v in vars(args).items()},
        "assumptions": {"hbm_bytes_per_s": HBM_BYTES_PER_S, "episodes_per_task": GENERATIONS_PER_TASK},
        "phases": phases,
        "measurements": [],
    }
    if "static" in args.backends and "generate" in args.backends:
        tasks = sokoban_tasks(min(args.episodes) // GENERATIONS_PER_TASK, args)
        prompts = first_turn_prompts(renderer, tasks * GENERATIONS_PER_TASK)
        try:
            results["greedy_check"] = compare_greedy(model, tokenizer, prompts, min(16, args.max_new_tokens))
        except Exception as err:  # noqa: BLE001 — report and go on to the measurements
            results["greedy_check"] = {
                "rows": len(prompts), "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(-8)
            }
        print("greedy check:", results["greedy_check"], flush=True)
        mark = phase("greedy check", mark)
    for backend in args.backends:
        for episodes in args.episodes:
            name = f"{backend} x {episodes}"
            if time.perf_counter() - start > args.budget_s:
                results["measurements"].append({"backend": backend, "episodes": episodes, "error": "skipped: budget"})
                continue
            try:
                measurement = measure(backend, episodes, model, tokenizer, renderer, args)
            except Exception as err:  # noqa: BLE001 — a failing backend is a result too
                measurement = {"backend": backend, "episodes": episodes, "error": f"{type(err).__name__}: {err}",
                               "traceback": traceback.format_exc(limit=-8)}
            results["measurements"].append(measurement)
            print(name, {k: round(v, 3) if isinstance(v, float) else v for k, v in measurement.items()}, flush=True)
            mark = phase(name, mark)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            folder = write_results(results, args.smoke)
    phases["total"] = time.perf_counter() - start
    folder = write_results(results, args.smoke)
    print((folder / ("gpu_rollout_smoke.md" if args.smoke else "gpu_rollout.md")).read_text())


if __name__ == "__main__":
    main()
