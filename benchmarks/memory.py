"""Peak memory of a training step against the horizon, with and without `max_tokens_per_forward`.

With step rows, a generation batch holds episodes × turns rows, and a micro-step forwards
`rows / steps_per_generation` of them at once (loss, old/reference log-probs): memory grows with the horizon. The
token budget caps every forward over training rows (the loss in row chunks whose gradients accumulate inside the
micro-step), so the peak stays flat. Each (horizon, budget) runs one GRPO step of a small model on Sokoban (episodes
rarely end before the horizon under a random policy) in its own process, so that the peak is that run's alone:
peak resident memory of the process on CPU (`ru_maxrss`, model and Python included), `torch.cuda.max_memory_allocated`
on a GPU.

    python benchmarks/memory.py                   # ~1-5 min on 2 cores
    python benchmarks/memory.py --device cuda     # on a GPU

Writes `benchmarks/results/memory.md`. Benchmarks never assert; ratios are measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HORIZONS = (5, 20, 50)


def one_run(horizon: int, budget: int | None, device: str, output_dir: str) -> dict:
    """One training step; returns its peak memory (MB), rows, widest row and step time."""
    import resource

    import torch
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.envs import get_env_class
    from trl_agents.testing import build_tiny_model, build_tiny_tokenizer, env_corpus, tiny_training_config

    tokenizer = build_tiny_tokenizer(env_corpus("sokoban", num_tasks=16), vocab_size=1024)
    model = build_tiny_model(tokenizer, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    model_dir = os.path.join(output_dir, "model")  # a path: TRL builds the reference model (beta > 0) from it
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    del model
    tasks = get_env_class("sokoban").task_split("train", 1)
    config = tiny_training_config(
        AgentGRPOConfig, os.path.join(output_dir, "run"), env_name="sokoban", max_steps=1, max_turns=horizon, history_length=2,
        per_device_train_batch_size=8, num_generations=8, max_completion_length=8, max_tokens_per_forward=budget,
        beta=0.04, use_cpu=device == "cpu", save_trajectories=False,
    )
    trainer = AgentGRPOTrainer(model=model_dir, args=config, train_dataset=Dataset.from_list(tasks),
                               processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    entry = next(h for h in trainer.state.log_history if "train_rows" in h)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"horizon": horizon, "budget": budget, "peak_mb": peak, "rows": entry["train_rows"],
            "turns": entry["env/episode_length"], "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--budget", type=int, default=4096, help="max_tokens_per_forward of the bounded runs")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one case as JSON "[horizon, budget]"
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "memory.md"))
    args = parser.parse_args()
    if args.one:
        horizon, budget = json.loads(args.one)
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(one_run(horizon, budget, args.device, tmp)))
        return

    started = time.perf_counter()
    results = []
    for horizon in HORIZONS:
        for budget in (None, args.budget):
            out = subprocess.run([sys.executable, __file__, "--device", args.device, "--one", json.dumps([horizon, budget])],
                                 capture_output=True, text=True, check=False)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None and out.returncode in (-9, 137):  # the kernel's OOM killer
                results.append({"horizon": horizon, "budget": budget, "killed": True})
                print(f"horizon {horizon:3d} budget {str(budget):>6s}: killed (out of memory)", flush=True)
                continue
            if line is None:
                raise SystemExit(f"run {horizon=} {budget=} failed:\n{out.stderr[-3000:]}")
            results.append(json.loads(line[len("RESULT "):]))
            r = results[-1]
            print(f"horizon {horizon:3d} budget {str(budget):>6s}: peak {r['peak_mb']:.0f} MB, {r['rows']:.0f} rows, "
                  f"{r['seconds']:.1f} s", flush=True)
    unit = "peak GPU memory allocated (MB)" if args.device == "cuda" else "peak resident memory of the process (MB)"
    lines = [f"| horizon (turns) | mean turns played | step rows | {unit}, no budget | with budget {args.budget} | "
             "ratio | step s, no budget | with budget |", "|---|---|---|---|---|---|---|---|"]
    def cell(r, key, form):
        return "killed (out of memory)" if r.get("killed") else format(r[key], form)

    for horizon in HORIZONS:
        plain, bounded = [r for r in results if r["horizon"] == horizon]
        known = plain if not plain.get("killed") else bounded
        ratio = "—" if plain.get("killed") or bounded.get("killed") else f"{bounded['peak_mb'] / plain['peak_mb']:.2f}"
        lines.append(f"| {horizon} | {cell(known, 'turns', '.1f')} | {cell(known, 'rows', '.0f')} | "
                     f"{cell(plain, 'peak_mb', '.0f')} | {cell(bounded, 'peak_mb', '.0f')} | {ratio} | "
                     f"{cell(plain, 'seconds', '.1f')} | {cell(bounded, 'seconds', '.1f')} |")
    header = (
        f"Peak memory of one GRPO step against the horizon, `python benchmarks/memory.py --device {args.device} "
        f"--budget {args.budget}` on {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"{time.perf_counter() - started:.0f} s in all.\n\n"
        "A Qwen2-style model (hidden 128, 2 layers, vocabulary 1024), Sokoban, 8 episodes (1 task × 8) of up to "
        "`horizon` turns, step rows with a history window of 2, at most 8 new tokens per turn, KL to a reference "
        "model (beta 0.04: a reference forward too), one micro-batch per step (all rows in one forward without the "
        "budget). Each run in its own process. On CPU the peak includes the model, Python and the libraries (a few "
        "hundred MB), so the ratio understates the activations' share.\n\n"
    )
    text = header + "\n".join(lines) + "\n"
    print("\n" + text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
