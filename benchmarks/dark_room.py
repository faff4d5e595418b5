"""The Dark Room study's arms on a tiny, predictable environment: does the prediction reward collapse the agent?

Environment: FrozenLake 3×3 (holes with probability 0.3, deterministic moves) wrapped by `predict`: the agent
answers `<action>move</action><predict>the grid after the move</predict>`. Why this environment: its next
observation is a deterministic, short text (a 3×3 grid, about 20 tokens), so prediction accuracy can actually be
learned by a tiny model; and it has a dark room built in — a move off the grid does nothing, so the observation
repeats and is trivially predictable, exactly the behaviour the study says the z-scored prediction reward breeds
(episodes pinned at the horizon, success → 0). The solver gives warm-start demonstrations with exact predictions
(`PredictionEnv.optimal_plan`), so every arm starts from a policy that already uses the format.

Arms (equal budgets: the same warm-started checkpoint, RL steps, episodes per step, tasks, eval tasks):

    reward_std    dark_room_arm=reward,  scale_rewards=group   (a) the failing recipe
    reward_nostd  dark_room_arm=reward,  scale_rewards=none    (b) fix A
    aux           dark_room_arm=aux      (SP loss, gold)       (c) fix B
    placebo       dark_room_arm=placebo  (SP loss, shuffled)   (d)
    grpo          dark_room_arm=baseline (plain GRPO)

The tiny model is warm-started ONCE (the first run does it; every other run starts from that checkpoint), then each
(arm, seed) is a fresh `trl-agents train` process, one after the other (they would share the cores otherwise); the
seed changes the RL sampling. Curves come from each run's `metrics.json` (training rollouts: success rate, episode
length, prediction accuracy, dense share); the held-out numbers from `eval_results.json` (greedy). Results go to
`benchmarks/results/dark_room.{md,json}` and `dark_room_curves.png`, updated after every run (rerunning skips
finished runs with the same settings).

    python benchmarks/dark_room.py                        # 5 arms x 3 seeds, strong warm start: ~15-20 min on 2 cores
    python benchmarks/dark_room.py --warm_start_steps 60  # weak warm start (most groups fail): where it collapses
    python benchmarks/dark_room.py --arms reward_std grpo --seeds 0 --max_steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CONFIG = ROOT / "configs" / "dark_room_frozenlake_tiny.yaml"

ARMS = {
    "reward_std": ["--dark_room_arm", "reward", "--scale_rewards", "group"],
    "reward_nostd": ["--dark_room_arm", "reward", "--scale_rewards", "none"],
    "aux": ["--dark_room_arm", "aux", "--scale_rewards", "group"],
    "placebo": ["--dark_room_arm", "placebo", "--scale_rewards", "group"],
    "grpo": ["--dark_room_arm", "baseline", "--scale_rewards", "group"],
}
SYSTEM_PROMPT = ("Walk from P to G on the grid; avoid H. Answer <action>up, down, left or right</action>"
                 "<predict>the grid after your move</predict>.")
SETTINGS = [  # shared by every run
    "--env_kwargs", json.dumps({"inner": "frozenlake", "size": 3, "hole_prob": 0.3}),
    "--system_prompt", SYSTEM_PROMPT, "--max_turns", "6", "--max_completion_length", "32",
    "--num_train_tasks", "3000", "--num_generations", "8", "--learning_rate", "1e-4",
    "--time_budget", "1000000", "--disable_tqdm", "true",
    # 3×3 maps have few layouts and FrozenLake's eval split holds only layouts absent from train (a systematic shift
    # there), so the greedy evaluation runs on train-split tasks: in-distribution success, not generalisation.
    "--eval_split", "train",
]


def warm_start_arguments(steps: int) -> list[str]:
    """SFT on solver demonstrations (with exact predictions) for `steps` steps, at least min(200, steps)."""
    return ["--warm_start_steps", str(steps), "--warm_start_min_steps", str(min(200, steps)),
            "--warm_start_target_success", "0.5", "--warm_start_eval_every", "50", "--warm_start_tasks", "1000",
            "--warm_start_val_tasks", "30", "--warm_start_batch_size", "32"]


DEFAULT_WARM_START = 300
CURVES = {"success": "env/success_rate", "length": "env/episode_length", "accuracy": "dark_room/step_accuracy",
          "dense_share": "dark_room/dense_share", "all_fail": "dark_room/all_fail_fraction"}


def run_one(arm: str, seed: int, args, output_root: Path) -> dict:
    if args.warm_start_steps != DEFAULT_WARM_START:  # each warm start has its own folder of runs
        output_root = output_root / f"warm-{args.warm_start_steps}"
    output_dir = output_root / f"seed-{seed}" / arm
    warm = output_root / "warm-start"
    command = [sys.executable, "-m", "trl_agents.cli", "train", "--config", str(CONFIG), *SETTINGS, *ARMS[arm],
               "--seed", str(seed), "--output_dir", str(output_dir), "--max_steps", str(args.max_steps),
               "--per_device_train_batch_size", str(args.batch_size), "--num_eval_tasks", str(args.num_eval_tasks)]
    if (warm / "config.json").exists():
        command += ["--tiny_model", "false", "--model_name_or_path", str(warm), "--warm_start_steps", "0"]
    else:
        command += warm_start_arguments(args.warm_start_steps)
    started = time.monotonic()
    completed = subprocess.run(command, env=dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1"),
                               capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.monotonic() - started
    if completed.returncode != 0:
        tail = (completed.stdout + completed.stderr)[-1500:]
        reason = next((line for line in reversed(tail.splitlines()) if "error" in line.lower()), tail[-300:])
        return {"arm": arm, "seed": seed, "status": "failed", "reason": reason.strip()}
    if not (warm / "config.json").exists() and (output_dir / "warm-start" / "config.json").exists():
        warm.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(output_dir / "warm-start", warm)
    result = json.loads((output_dir / "eval_results.json").read_text())
    history = json.loads((output_dir / "metrics.json").read_text()).get("rl", [])
    steps = [h for h in history if "env/success_rate" in h]
    curves = {name: [h.get(key) for h in steps] for name, key in CURVES.items()}
    return {
        "arm": arm, "seed": seed, "status": "ok", "wall_seconds": wall, "rl_steps": result["rl_steps"],
        "before": result["eval_before_rl"]["success_rate"], "after": result["eval_after_rl"]["success_rate"],
        "eval_length_after": result["eval_after_rl"]["episode_length"], "curves": curves,
    }


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def _cell(values, digits=3):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    spread = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.{digits}f}{spread}"


def _tail_mean(curve, k):
    values = [v for v in curve[-k:] if v is not None]
    return _mean(values)


def table(rows: list[dict], arms: list[str], tail: int) -> str:
    lines = [
        ("| arm | greedy success after RL | Δ vs warm start (points) | train success, last "
         f"{tail} steps | episode length, last {tail} (horizon 6) | prediction accuracy, last {tail} | "
         f"dense share, last {tail} | all-fail groups, last {tail} | runs |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        ok = [r for r in rows if r["arm"] == arm and r["status"] == "ok"]
        failed = [r for r in rows if r["arm"] == arm and r["status"] != "ok"]
        if not ok:
            lines.append(f"| {arm} | " + (f"failed: {failed[0].get('reason', '')}" if failed else "not run")
                         + " | | | | | | | |")
            continue
        lines.append("| " + " | ".join([
            arm,
            _cell([r["after"] for r in ok]),
            _cell([100 * (r["after"] - r["before"]) for r in ok], 1),
            *(_cell([_tail_mean(r["curves"][name], tail) for r in ok])
              for name in ("success", "length", "accuracy", "dense_share", "all_fail")),
            str(len(ok)),
        ]) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], arms: list[str], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the `bench` extra installs it
        return False
    panels = [("success", "training success rate"), ("length", "episode length (horizon 6)"),
              ("accuracy", "prediction accuracy"), ("dense_share", "dense share of the advantage")]
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for axis, (name, title) in zip(axes, panels, strict=True):
        for arm in arms:
            curves = [r["curves"][name] for r in rows if r["arm"] == arm and r["status"] == "ok"]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            mean = [_mean([c[i] for c in curves]) for i in range(length)]
            axis.plot(range(1, length + 1), [m if m is not None else float("nan") for m in mean], label=arm)
        axis.set_title(title)
        axis.set_xlabel("RL step")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def _key(settings: dict) -> str:
    return json.dumps(settings, sort_keys=True)


def write(rows: list[dict], args) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dark_room.json").write_text(json.dumps({"rows": rows}, indent=1))
    md = RESULTS / "dark_room.md"
    notes = ""  # a hand-written "## What we see" section at the end survives reruns
    if md.exists() and "\n## What we see" in md.read_text():
        notes = "## What we see" + md.read_text().split("\n## What we see", 1)[1]
    text = [
        "# Dark Room arms on tiny FrozenLake 3×3 (`python benchmarks/dark_room.py`)",
        "",
        (f"{os.cpu_count()} CPU cores. Every run of a table starts from the same warm-started tiny model (SFT on "
         "solver demonstrations with exact predictions, `warm_start_steps` steps). Greedy success is measured on "
         "train-split tasks (3×3 maps; see the script's docstring) before and after RL (Δ: the change, in points); "
         "the other columns are means over the last steps of the training rollouts (sampled, temperature 1). "
         "Mean ± std over seeds."),
        "",
    ]
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(_key(row["settings"]), []).append(row)
    for key, group in sorted(groups.items()):
        settings = json.loads(key)
        walls = [r["wall_seconds"] for r in group if r["status"] == "ok"]
        before = [r["before"] for r in group if r["status"] == "ok"]
        summary = f"{len(walls)} runs, {sum(walls):.0f} s of wall time; greedy success before RL {_cell(before)}."
        text += [f"## Settings {settings}", "", summary, "", table(group, args.arms, args.tail), ""]
        png = f"dark_room_curves_warm{settings['warm_start_steps']}_steps{settings['max_steps']}.png"
        if plot(group, args.arms, RESULTS / png):
            text += [f"![curves]({png})", ""]
    if notes:
        text.append(notes.rstrip() + "\n")
    md.write_text("\n".join(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max_steps", type=int, default=80, help="RL steps per run (the same for every arm)")
    parser.add_argument("--batch_size", type=int, default=32, help="episodes per RL step (tasks x 8 generations)")
    parser.add_argument("--num_eval_tasks", type=int, default=100)
    parser.add_argument("--tail", type=int, default=5, help="steps averaged at the end of the curves")
    parser.add_argument("--warm_start_steps", type=int, default=DEFAULT_WARM_START,
                        help="SFT steps of the shared warm start (fewer: a weaker start, more all-fail groups)")
    parser.add_argument("--output_root", default=str(ROOT / "outputs" / "bench-dark-room"))
    args = parser.parse_args()

    settings = {k: getattr(args, k) for k in ("max_steps", "batch_size", "num_eval_tasks", "warm_start_steps")}
    json_path = RESULTS / "dark_room.json"
    previous = json.loads(json_path.read_text()) if json_path.exists() else {}
    rows = []
    for row in previous.get("rows", []):  # every finished run of every setting is kept; failures are retried
        if "settings" not in row:  # written before settings were per row
            row["settings"] = {"warm_start_steps": DEFAULT_WARM_START, **previous.get("settings", {})}
        if row["status"] == "ok":
            rows.append(row)
    done = {(r["arm"], r["seed"]) for r in rows if r["settings"] == settings}
    for seed in args.seeds:
        for arm in args.arms:
            if (arm, seed) in done:
                continue
            row = {**run_one(arm, seed, args, Path(args.output_root)), "settings": settings}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("curves", "settings")}), flush=True)
            write(rows, args)
    write(rows, args)
    print(table([r for r in rows if r["settings"] == settings], args.arms, args.tail))


if __name__ == "__main__":
    main()
