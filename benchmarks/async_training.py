"""Does one-step-off training pay? Trained tokens per second of `AgentGRPOTrainer` with `max_staleness` 0 and 1,
under lockstep and per-episode (`free`) scheduling, on the same rollouts.

Workload per training step: 8 tasks × 8 episodes × 8 turns of `CountdownEnv` behind `LatencyEnv` (every step sleeps
clip(lognormal(median m, σ = 1), m/10, 20 m), keyed so every mode sees the same latency for the same step; 64 env
threads). The policy is a small model trained for real on the CPU (step rows, TRL's loss, AdamW); its update takes U
seconds a step. The latency median m is calibrated first so that the lockstep rollout takes about U too (R ≈ U: the
case one-step-off is for; its ceiling is then 2×).

Cases (`--cases`):

* `simulated`: `SeededScriptGenerator` (answers from a hash of prompt and request seed; a call costs 20 ms + 2 ms per
  sequence as a sleep). The rollouts do not depend on the weights, so every mode generates and trains the same
  tokens (checked): the ratio is pure schedule.
* `tiny`: the built-in generator, the policy itself (a behaviour snapshot under one-step-off), so generation and
  training share the 2 cores: the ratio includes that contention.

In both cases every group's episodes end alike (all succeed, or all fail), so advantages are 0 and the weights do not
move: the modes train the same tokens, and the update's cost is real all the same (forwards, backward, optimizer
step). torch runs one intra-op thread in every mode (`--torch_threads`): the update keeps one core and the rollout's
host work (prompts, tokenizer, environments, scheduler) the other, as on a machine whose trainer computes on a GPU.
With two threads, any work beside the update stalls torch's parallel regions, which one-step-off adds by design.

Modes: `sync-lockstep` (today's default), `1off-lockstep`, `sync-free`, `1off-free`. For each: the wall time of
`train()` over `--steps` steps (the first rollout included: one-step-off generates it in place), trained action
tokens per second, and the trainer's wait and the generator's idle time that one-step-off logs. Ratios are against
sync-lockstep, measured in this run. Writes `benchmarks/results/async_training.md`.

    python benchmarks/async_training.py                  # both cases: ~15 min on 2 cores
    python benchmarks/async_training.py --cases simulated --steps 6
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer  # noqa: E402
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams  # noqa: E402
from trl_agents.rollout.env_pool import EnvPool  # noqa: E402
from trl_agents.testing import SeededScriptGenerator, build_tiny_model, build_tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ACTIONS = ["```up```", "```down```", "```left```", "```right```"]
TASKS, GROUP, TURNS = 8, 8, 8
MODES = {"sync-lockstep": (0, "lockstep"), "1off-lockstep": (1, "lockstep"), "sync-free": (0, "free"),
         "1off-free": (1, "free")}
CASES = ("simulated", "tiny")
MODEL = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 256}


def latency(median: float) -> dict:
    return {"inner": "test-countdown", "median": median, "sigma": 1.0, "low": median / 10, "high": 20 * median}


def tasks(steps: int) -> list[dict]:
    return [{"env": "test-latency", "seed": seed, "turns": TURNS} for seed in range(TASKS * steps)]


def generator_for(case: str, tokenizer):
    if case == "simulated":
        return SeededScriptGenerator(tokenizer, ACTIONS, call_seconds=0.020, seconds_per_prompt=0.002)
    return None  # the built-in generator


def train(case: str, mode: str, median: float, steps: int, tokenizer, output_root: str) -> dict:
    staleness, schedule = MODES[mode]
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer, **MODEL)
    args = AgentGRPOConfig(
        output_dir=os.path.join(output_root, f"{case}-{mode}"), max_steps=steps,
        per_device_train_batch_size=TASKS * GROUP, num_generations=GROUP, gradient_accumulation_steps=1,
        max_turns=TURNS, max_completion_length=8,
        learning_rate=1e-4, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
        env_kwargs=latency(median), env_workers=TASKS * GROUP, rollout_schedule=schedule, max_staleness=staleness,
        deterministic_sampling=True, history_length=2, beta=0.0, save_trajectories=False,
    )
    trainer = AgentGRPOTrainer(model=model, args=args, train_dataset=tasks(steps), processing_class=tokenizer,
                               generator=generator_for(case, tokenizer))
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    logs = [log for log in trainer.state.log_history if "rollout/generated_tokens" in log]
    tokens = sum(log["rollout/generated_tokens"] for log in logs)
    return {"wall": wall, "tokens": tokens, "tokens_per_second": tokens / wall,
            "trainer_wait": sum(log.get("async/trainer_wait_seconds", 0.0) for log in logs),
            "generator_idle": sum(log.get("async/generator_idle_seconds", 0.0) for log in logs),
            # the steady state: the median step after the first two (one-step-off generates the first rollout in place)
            "steady_step": statistics.median(log["step_time"] for log in logs[2:]) if len(logs) > 2 else float("nan"),
            "success": statistics.fmean(log["env/success_rate"] for log in logs)}


def rollout_seconds(case: str, median: float, tokenizer) -> float:
    """One lockstep rollout of a step's tasks (median of 3): R."""
    generator = generator_for(case, tokenizer)
    if generator is None:
        from trl_agents.rollout import TransformersGenerator

        torch.manual_seed(0)
        generator = TransformersGenerator(build_tiny_model(tokenizer, **MODEL), tokenizer, backend="generate")
    pool = EnvPool(env_kwargs=latency(median), backend="thread", num_workers=TASKS * GROUP)
    engine = RolloutEngine(generator, PromptRenderer(tokenizer, history_length=2), max_turns=TURNS,
                           sampling=SamplingParams(max_new_tokens=8), env_pool=pool, schedule="lockstep",
                           deterministic_sampling=True, seed=0)
    times = []
    for index in range(3):
        started = time.perf_counter()
        engine.run(tasks(1), GROUP, rollout_index=index)
        times.append(time.perf_counter() - started)
    pool.close()
    return statistics.median(times)


def calibrate(case: str, steps: int, tokenizer, output_root: str) -> tuple[float, float, float]:
    """(U, R at the chosen median, the median): U from a zero-latency sync run minus its rollouts."""
    instant = train(case, "sync-lockstep", 0.0, steps, tokenizer, output_root)
    update = max(instant["wall"] / steps - rollout_seconds(case, 0.0, tokenizer), 0.05)
    probe = 0.05
    measured = rollout_seconds(case, probe, tokenizer)
    base = rollout_seconds(case, 0.0, tokenizer)
    median = probe * max(update - base, 0.01) / max(measured - base, 1e-3)
    return update, rollout_seconds(case, median, tokenizer), median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--torch_threads", type=int, default=1,
                        help="torch's intra-op threads for every mode (default 1: the update keeps one core and the "
                             "rollout's host work the other, as on a machine whose trainer computes on a GPU)")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    tokenizer = build_tiny_tokenizer(["Task turn of name a direction up down left right"] * 4, vocab_size=512)
    results = {}
    with tempfile.TemporaryDirectory() as output_root:
        for case in args.cases:
            update, rollout, median = calibrate(case, 3, tokenizer, output_root)
            print(f"[{case}] U = {update:.2f} s per update, R = {rollout:.2f} s per lockstep rollout at median "
                  f"{1000 * median:.0f} ms", flush=True)
            rows = {}
            for mode in MODES:
                rows[mode] = train(case, mode, median, args.steps, tokenizer, output_root)
                print(f"[{case}] {mode}: {rows[mode]}", flush=True)
            results[case] = {"update": update, "rollout": rollout, "median": median, "rows": rows,
                             "command": " ".join(["python benchmarks/async_training.py", *sys.argv[1:]]),
                             "written": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"}
    path = RESULTS / "async_training.json"  # cases measured by earlier runs stay, each with its own command
    previous = json.loads(path.read_text()) if path.exists() else {}
    write({**previous, **results}, args)
    path.write_text(json.dumps({**previous, **results}, indent=1))


def write(results: dict, args) -> None:
    lines = ["# One-step-off training throughput", "",
             f"Written by `python benchmarks/async_training.py` ({args.steps} steps, {args.torch_threads} torch "
             f"thread(s)); {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
             f"{torch.__version__}, Python {sys.version.split()[0]}. One run per cell; each case names its command.",
             "", "Per step: 8 tasks × 8 episodes × 8 turns behind `LatencyEnv` (lognormal, σ 1, median calibrated so "
             "that R ≈ U), a model of hidden size 128 and 2 layers trained on step rows (512 per step). The wall ratio "
             "includes the first rollout, which one-step-off generates in place (its ceiling at R = U is "
             f"2·{args.steps}/({args.steps}+1) = {2 * args.steps / (args.steps + 1):.2f}×); the steady step is the "
             "median "
             "`step_time` after the first two steps, what a long run pays per step (ceiling 2×).", ""]
    for case, result in results.items():
        rows, base = result["rows"], result["rows"]["sync-lockstep"]
        lines += [f"## {case}", "",
                  f"`{result.get('command', '')}` on {result.get('written', '')}: U = {result['update']:.2f} s per "
                  f"update, R = {result['rollout']:.2f} s per lockstep rollout (latency median "
                  f"{1000 * result['median']:.0f} ms).", "",
                  "| mode | wall (s) | trained tokens | tokens / s | vs sync-lockstep | steady step (s) | "
                  "steady vs sync-lockstep | trainer wait (s) | generator idle (s) | success |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for mode, row in rows.items():
            lines.append(f"| {mode} | {row['wall']:.1f} | {row['tokens']:,.0f} | {row['tokens_per_second']:.1f} | "
                         f"**{row['tokens_per_second'] / base['tokens_per_second']:.2f}×** | "
                         f"{row['steady_step']:.2f} | {base['steady_step'] / row['steady_step']:.2f}× | "
                         f"{row['trainer_wait']:.1f} | {row['generator_idle']:.1f} | {row['success']:.3f} |")
        if case == "simulated":
            equal = len({row["tokens"] for row in rows.values()}) == 1
            lines += ["", f"Equal tokens in every mode: {'yes' if equal else 'NO'} (the rollouts do not depend on "
                      "the weights)."]
        lines.append("")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "async_training.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
