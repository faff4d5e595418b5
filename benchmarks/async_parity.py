"""Learning parity of one-step-off training (`max_staleness=1`) against on-policy GRPO on the corridor evidence
test-bed (benchmarks/evidence.py's runs: the same config, warm start per seed, equal generated tokens, held-out
success of the sampled policy, paired seeds, percentile bootstrap and sign-flip test).

The gate (docs/async.md#one-step-off): the 95 % interval of the paired success difference (1off - sync) contains 0
and lies within ±5 points, and the behaviour weight changes (truncates) under 5 % of the trained tokens.

    python benchmarks/async_parity.py                 # 5 seeds x 2 arms, 2 runs at a time
    python benchmarks/async_parity.py --report_only   # the table of the recorded runs
    python benchmarks/async_parity.py --seeds 5 6 7 8 9 --arms grpo grpo_1off grpo_seeded   # more seeds
    python benchmarks/async_parity.py --report_only --seeds 0 1 2 3 4                      # a subset of them
    python benchmarks/async_parity.py --sampler_check --seeds 0   # the two samplers on seed 0's warm start

`--sampler_check` asks whether the per-request seeded sampler (one-step-off's) and torch's sampler give the same
held-out success to one policy, a seed's warm start, with no training in between: the control arm's gap should come
from learning on other random numbers, not from the sampler. It writes benchmarks/results/async_parity_sampler.{json,md}
(`--sampler_check --report_only`: the table of the recorded evaluations).

Writes benchmarks/results/async_parity.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import evidence  # noqa: E402

from trl_agents.fileio import atomic_write  # noqa: E402

ROOT = evidence.ROOT
RESULTS = evidence.RESULTS
ARMS = {"grpo": ["--method", "grpo"], "grpo_1off": ["--method", "grpo", "--max_staleness", "1"],
        # A control: one-step-off samples with a seed per request (deterministic_sampling, on by default there);
        # this arm is sync GRPO sampling the same way, to tell staleness from the sampler's random stream.
        "grpo_seeded": ["--method", "grpo", "--deterministic_sampling", "true"]}
DEFAULT_ARMS = ("grpo", "grpo_1off")
MARGIN = 0.05  # the interval must lie within ±5 points
TRUNCATION_LIMIT = 0.05  # and the behaviour weight change under 5 % of the trained tokens


def run_arm(method: str, seed: int, args, output_root: Path) -> dict:
    """evidence.run_one for an arm of this comparison, plus the run's one-step-off diagnostics."""
    evidence.RUNS.update(ARMS)
    row = evidence.run_one(method, seed, args, output_root)
    metrics = output_root / f"seed-{seed}" / method / "metrics.json"
    if row["status"] == "ok" and metrics.exists():
        history = [entry for entry in json.loads(metrics.read_text())["rl"] if "env/success_rate" in entry]
        for key in ("async/is_truncated_frac", "async/lag_rollouts", "async/trainer_wait_seconds",
                    "sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/max"):
            values = [entry[key] for entry in history if key in entry]
            if values:
                row[key] = statistics.fmean(values)
        maxima = [entry["async/is_truncated_frac"] for entry in history if "async/is_truncated_frac" in entry]
        if maxima:
            row["is_truncated_frac_max"] = max(maxima)
    return row


def sweep(args) -> list[dict]:
    """evidence.py's sweep over this comparison's arms, into async_parity.json."""
    return evidence.sweep(args, args.arms, RESULTS / "async_parity.json", run_arm)


def report(rows: list[dict]) -> str:
    return "\n\n".join([parity_table(rows), *(control_line(rows, a, b) for a, b in
                                               (("grpo_seeded", "grpo"), ("grpo_1off", "grpo_seeded"))
                                               if evidence.paired_differences(rows, a, b, "success"))])


def control_line(rows: list[dict], a: str, b: str) -> str:
    diffs = evidence.paired_differences(rows, a, b, "success")
    if len(diffs) < 2:
        return f"{a} - {b}: {len(diffs)} seed(s)."
    mean, (low, high) = statistics.fmean(diffs), evidence.bootstrap_interval(diffs)
    return (f"Control, {a} - {b} over {len(diffs)} seeds: {100 * mean:+.1f} points, 95 % interval "
            f"[{100 * low:+.1f}, {100 * high:+.1f}], sign-flip p = {evidence.sign_flip_p_value(diffs):.3f} "
            f"(per seed: {', '.join(f'{100 * d:+.1f}' for d in diffs)}).")


def parity_table(rows: list[dict]) -> str:
    diffs = evidence.paired_differences(rows, "grpo_1off", "grpo", "success")
    by = {(r["method"], r["seed"]): r for r in rows}
    lines = ["| seed | warm start | GRPO (sync) | GRPO, max_staleness=1 | difference, points | "
             "RL steps (sync / 1off) | "
             "generated tokens (sync / 1off) | truncated tokens, mean / max step | lag-1 rollouts |",
             "|---|---|---|---|---|---|---|---|---|"]
    for seed in sorted({s for _, s in by}):
        sync, off = by.get(("grpo", seed)), by.get(("grpo_1off", seed))
        if sync is None or off is None:
            continue
        lines.append(
            f"| {seed} | {sync['before']:.3f} | {sync['after']:.3f} | {off['after']:.3f} | "
            f"{100 * (off['after'] - sync['after']):+.1f} | {sync['rl_steps']} / {off['rl_steps']} | "
            f"{sync.get('rl_generated_tokens', 0):,.0f} / {off.get('rl_generated_tokens', 0):,.0f} | "
            f"{100 * off.get('async/is_truncated_frac', 0):.2f} % / "
            f"{100 * off.get('is_truncated_frac_max', 0):.2f} % | "
            f"{100 * off.get('async/lag_rollouts', 0):.0f} % |")
    if len(diffs) >= 2:
        mean, (low, high) = statistics.fmean(diffs), evidence.bootstrap_interval(diffs)
        truncated = max(by[("grpo_1off", s)].get("async/is_truncated_frac", 0) for s in sorted({s for _, s in by})
                        if ("grpo_1off", s) in by)
        gate = low <= 0 <= high and -MARGIN <= low and high <= MARGIN and truncated < TRUNCATION_LIMIT
        lines += ["", f"Paired difference (1off - sync) over {len(diffs)} seeds: {100 * mean:+.1f} points, 95 % "
                  f"percentile bootstrap interval [{100 * low:+.1f}, {100 * high:+.1f}], sign-flip p = "
                  f"{evidence.sign_flip_p_value(diffs):.3f}. Truncated behaviour weights: at most "
                  f"{100 * truncated:.2f} % of a run's trained tokens (mean over its steps). Gate (interval contains "
                  f"0, within ±{100 * MARGIN:.0f} points, truncation < {100 * TRUNCATION_LIMIT:.0f} %): "
                  f"**{'passed' if gate else 'not passed'}**."]
    return "\n".join(lines)


def sampler_check(args) -> tuple[list[dict], dict]:
    """Held-out success of each seed's warm start, sampled at the run's temperature by torch's global generator
    (GRPO's sampler) and with a seed per request (one-step-off's), `--sampler_repeats` times each with other random
    numbers; `--sampler_samples` episodes per task. (One row per evaluation, the evaluation settings), also written
    to async_parity_sampler.json."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_agents.evaluation import evaluate_policy

    torch.set_num_threads(args.threads)
    config = yaml.safe_load(evidence.CONFIG.read_text())
    settings = dict(env=config["env_name"], env_kwargs=config["env_kwargs"], split="eval",
                    num_tasks=args.num_eval_tasks, max_turns=config["max_turns"],
                    history_length=config["history_length"], system_prompt=config["system_prompt"],
                    max_new_tokens=config["max_completion_length"], greedy=False,
                    temperature=config["eval_temperature"], num_samples=args.sampler_samples)
    rows = []
    for seed in args.seeds or [0]:
        warm = Path(args.output_root) / f"seed-{seed}" / "warm-start"
        if not (warm / "config.json").exists():
            raise SystemExit(f"no warm start at {warm}: run the parity sweep for seed {seed} first")
        model, tokenizer = AutoModelForCausalLM.from_pretrained(warm), AutoTokenizer.from_pretrained(warm)
        for repeat in range(args.sampler_repeats):
            for seeded in (False, True):
                started = time.perf_counter()
                result = evaluate_policy(model, tokenizer, seed=1000 + repeat, deterministic_sampling=seeded,
                                         **settings)
                rows.append({"seed": seed, "repeat": repeat, "sampler": "per-request seeds" if seeded else "torch",
                             "success": result["success_rate"], "episodes": result["num_episodes"],
                             "episode_length": result["episode_length"],
                             "seconds": time.perf_counter() - started})
                print(json.dumps(rows[-1]), flush=True)
    atomic_write(str(RESULTS / "async_parity_sampler.json"), json.dumps({"settings": settings, "rows": rows},
                                                                         indent=1))
    return rows, settings


def sampler_report(rows: list[dict]) -> str:
    """The sampler check's table: each warm start's success under each sampler, the differences with their
    binomial standard errors, per warm start and pooled."""
    lines = ["| warm start of seed | sampler | repeats | episodes | held-out success | episode length |",
             "|---|---|---|---|---|---|"]
    summary = []
    for seed in [*sorted({r["seed"] for r in rows}), None]:  # each warm start, then all of them pooled
        mine = [r for r in rows if seed is None or r["seed"] == seed]
        (p, n), (q, m) = pooled_success(mine, "per-request seeds"), pooled_success(mine, "torch")
        error = (p * (1 - p) / n + q * (1 - q) / m) ** 0.5
        for sampler, (rate, episodes) in (("torch", (q, m)), ("per-request seeds", (p, n))):
            if seed is not None:
                lengths = [r["episode_length"] for r in mine if r["sampler"] == sampler]
                lines.append(f"| {seed} | {sampler} | {len(lengths)} | {episodes:,} | {rate:.3f} | "
                             f"{statistics.fmean(lengths):.2f} |")
        summary.append(f"{'All warm starts' if seed is None else f'Seed {seed}'}: per-request seeds - torch = "
                       f"{100 * (p - q):+.1f} points over {n:,} and {m:,} episodes (binomial standard error "
                       f"{100 * error:.1f}).")
    recorded = RESULTS / "async_parity.json"
    gap = evidence.paired_differences(json.loads(recorded.read_text())["rows"], "grpo_seeded", "grpo", "success") \
        if recorded.exists() else []
    if gap:
        summary.append(f"After RL, the control arm grpo_seeded - grpo was {100 * statistics.fmean(gap):+.1f} points "
                       f"over {len(gap)} seeds.")
    return "\n".join(lines) + "\n\n" + "\n".join(summary)


def pooled_success(rows: list[dict], sampler: str) -> tuple[float, int]:
    """(success rate, episodes) of `sampler` over `rows`."""
    mine = [r for r in rows if r["sampler"] == sampler]
    episodes = sum(r["episodes"] for r in mine)
    return sum(r["success"] * r["episodes"] for r in mine) / episodes, episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="seeds to run (default 0-4); with --report_only, the seeds to report (default: all)")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=list(ARMS))
    parser.add_argument("--generated_tokens", type=int, default=70_000)
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--num_eval_tasks", type=int, default=500)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_root", default=str(ROOT / "outputs" / "bench-async-parity"))
    parser.add_argument("--report_only", action="store_true")
    parser.add_argument("--sampler_check", action="store_true",
                        help="no training: the two samplers on each seed's warm start (module docstring)")
    parser.add_argument("--sampler_repeats", type=int, default=2)
    parser.add_argument("--sampler_samples", type=int, default=4, help="episodes per held-out task")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.sampler_check:
        if args.report_only:
            recorded = json.loads((RESULTS / "async_parity_sampler.json").read_text())
            rows, settings = recorded["rows"], recorded["settings"]
        else:
            rows, settings = sampler_check(args)
        text = (f"# The two samplers on a warm start (no training)\n\nWritten by `python benchmarks/async_parity.py "
                f"--sampler_check` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {settings['num_tasks']} "
                f"held-out corridors x {settings['num_samples']} episodes per repeat and sampler.\n\n"
                f"{sampler_report(rows)}\n")
        atomic_write(str(RESULTS / "async_parity_sampler.md"), text)
        print(text)
        return
    if args.report_only:
        rows = json.loads((RESULTS / "async_parity.json").read_text())["rows"]
        rows = [row for row in rows if args.seeds is None or row["seed"] in args.seeds]
    else:
        args.seeds = [0, 1, 2, 3, 4] if args.seeds is None else args.seeds
        rows = sweep(args)
    table = report(rows)
    settings = {k: getattr(args, k) for k in ("generated_tokens", "max_steps", "num_eval_tasks")}
    how = ("a report of the recorded runs (`--report_only`; each run's wall time is in the json)" if args.report_only
           else f"{args.jobs} runs at a time, {args.threads} CPU thread(s) each")
    text = (f"# One-step-off learning parity (corridor evidence test-bed)\n\nWritten by `python "
            f"benchmarks/async_parity.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; settings "
            f"{json.dumps(settings)}; {how}.\n\n{table}\n")
    atomic_write(str(RESULTS / "async_parity.md"), text)
    print(text)


if __name__ == "__main__":
    main()
