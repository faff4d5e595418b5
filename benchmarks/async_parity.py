"""Learning parity of one-step-off training (`max_staleness=1`) against on-policy GRPO on the corridor evidence
test-bed (benchmarks/evidence.py's runs: the same config, warm start per seed, equal generated tokens, held-out
success of the sampled policy, paired seeds, percentile bootstrap and sign-flip test).

The gate (docs/async.md#one-step-off): the 95 % interval of the paired success difference (1off - sync) contains 0
and lies within ±5 points, and the behaviour weight changes (truncates) under 5 % of the trained tokens.

    python benchmarks/async_parity.py                 # 5 seeds x 2 arms, 2 runs at a time
    python benchmarks/async_parity.py --report_only   # the table of the recorded runs

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=list(ARMS))
    parser.add_argument("--generated_tokens", type=int, default=70_000)
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--num_eval_tasks", type=int, default=500)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_root", default=str(ROOT / "outputs" / "bench-async-parity"))
    parser.add_argument("--report_only", action="store_true")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = (json.loads((RESULTS / "async_parity.json").read_text())["rows"] if args.report_only else sweep(args))
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
