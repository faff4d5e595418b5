"""Does RL improve the quickstart agent? `trl-agents train` (the embedded default) over several seeds.

Each seed runs as a fresh `trl-agents train --seed S` process, exactly what a user runs, one after the other (not in
parallel: they would share the 2 cores). Prints held-out success after the warm start and after RL, the gain in
points, RL steps and wall time per seed, and the mean gain.

    python benchmarks/quickstart_seeds.py                 # seeds 0 1 2
    python benchmarks/quickstart_seeds.py --seeds 3 4 --output_root outputs/bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--output_root", default="outputs/bench-quickstart")
    parser.add_argument("extra", nargs="*", help="extra `trl-agents train` arguments, after --")
    args = parser.parse_args()

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    rows = []
    for seed in args.seeds:
        output_dir = os.path.join(args.output_root, f"seed-{seed}")
        command = [sys.executable, "-m", "trl_agents.cli", "train", "--seed", str(seed), "--output_dir", output_dir,
                   *args.extra]
        started = time.monotonic()
        completed = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        if completed.returncode != 0:
            print(completed.stdout[-3000:], completed.stderr[-3000:], sep="\n")
            raise SystemExit(f"seed {seed} failed with exit code {completed.returncode}")
        with open(os.path.join(output_dir, "eval_results.json")) as handle:
            result = json.load(handle)
        rows.append(
            {
                "seed": seed,
                "before": result["eval_before_rl"]["success_rate"],
                "after": result["eval_after_rl"]["success_rate"],
                "gain_points": result["success_gain_points"],
                "rl_steps": result["rl_steps"],
                "wall_seconds": wall,
            }
        )
        row = rows[-1]
        print(f"seed {seed}: held-out success {row['before']:.3f} -> {row['after']:.3f} "
              f"({row['gain_points']:+.1f} points, {row['rl_steps']} RL steps, {wall:.0f} s wall)", flush=True)

    gains = [row["gain_points"] for row in rows]
    summary = {
        "rows": rows,
        "mean_before": statistics.mean(row["before"] for row in rows),
        "mean_after": statistics.mean(row["after"] for row in rows),
        "mean_gain_points": statistics.mean(gains),
        "max_wall_seconds": max(row["wall_seconds"] for row in rows),
    }
    print(f"mean held-out success {summary['mean_before']:.3f} -> {summary['mean_after']:.3f}: "
          f"{summary['mean_gain_points']:+.1f} points over {len(rows)} seeds "
          f"(target >= +5); slowest run {summary['max_wall_seconds']:.0f} s (target <= 600 s)")
    os.makedirs(args.output_root, exist_ok=True)
    with open(os.path.join(args.output_root, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=2)


if __name__ == "__main__":
    main()
