"""Does RL improve held-out success over the warm start on sandboxed shell tasks? A short run per seed, whatever the
answer.

Each seed runs `trl-agents train --config grpo_shell_tasks_tiny` as a user would (the tiny offline model, the four
shell kinds of that config, every command in a bubblewrap sandbox): a warm start on the expert's commands, the
held-out evaluation after it (`eval_before_rl`, 100 eval-split tasks, greedy), GRPO for `--max_steps` steps, and the
same evaluation after RL (`eval_after_rl`). Reported per seed and as the mean paired difference with a t interval
(few seeds: read it as a direction, not a result).

    python benchmarks/sandbox_learning.py                # 3 seeds x 40 RL steps; writes benchmarks/results/sandbox_learning.md
    python benchmarks/sandbox_learning.py --seeds 0 --max_steps 10   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "grpo_shell_tasks_tiny"


def t_quantile_975(df: int) -> float:
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
    return table.get(df, 1.96)


def run_seed(seed: int, max_steps: int, workdir: Path, extra: list[str]) -> dict:
    output = workdir / f"seed{seed}"
    command = [sys.executable, "-m", "trl_agents.cli", "train", "--config", CONFIG, "--seed", str(seed),
               "--output_dir", str(output), "--max_steps", str(max_steps), "--disable_tqdm", "true", *extra]
    started = time.monotonic()
    result = subprocess.run(command, cwd=workdir, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SystemExit(f"seed {seed} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    results = json.loads((output / "eval_results.json").read_text())
    before, after = results["eval_before_rl"], results["eval_after_rl"]
    return {"seed": seed, "before": before["success_rate"], "after": after["success_rate"],
            "valid_before": before["valid_action_rate"], "valid_after": after["valid_action_rate"],
            "tasks": after["num_tasks"], "rl_steps": results.get("rl_steps"), "seconds": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sandbox_learning.md"))
    parser.add_argument("extra", nargs="*", help="more `trl-agents train` arguments (after --)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sandbox-learning-") as scratch:
        for seed in args.seeds:
            rows.append(run_seed(seed, args.max_steps, Path(scratch), args.extra))
            print(json.dumps(rows[-1]), flush=True)
    differences = [row["after"] - row["before"] for row in rows]
    mean = statistics.fmean(differences)
    half = (t_quantile_975(len(rows) - 1) * statistics.stdev(differences) / math.sqrt(len(rows))
            if len(rows) > 1 else math.nan)
    lines = [
        "# RL over the warm start on sandboxed shell tasks",
        "",
        f"`python benchmarks/sandbox_learning.py --seeds {' '.join(map(str, args.seeds))} --max_steps {args.max_steps}`"
        f" ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, Linux {platform.release()}, Python "
        f"{platform.python_version()}): `trl-agents train --config {CONFIG}` per seed (the tiny offline model; kinds "
        "count-lines, count-files, find-file, sort-dedupe; warm start on the expert's commands, then GRPO, every "
        "command in a bubblewrap sandbox). Success = the hidden check passes at `submit`, greedy, on the same "
        f"{rows[0]['tasks']} eval-split tasks before and after RL.",
        "",
        "| seed | success after warm start | success after RL | difference | valid calls before → after | minutes |",
        "|---|---|---|---|---|---|",
    ]
    for row, difference in zip(rows, differences):
        lines.append(f"| {row['seed']} | {row['before']:.3f} | {row['after']:.3f} | {difference:+.3f} | "
                     f"{row['valid_before']:.3f} → {row['valid_after']:.3f} | {row['seconds'] / 60:.1f} |")
    interval = f"[{mean - half:+.3f}, {mean + half:+.3f}]" if not math.isnan(half) else "n/a (one seed)"
    lines += ["", f"Mean difference (after RL − after warm start): {mean:+.3f}, 95 % t interval {interval} over "
              f"{len(rows)} seeds, {args.max_steps} RL steps each."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
