"""Reset, step and snapshot/restore latency of every registered environment, measured in one run.

For each environment with a built-in `train` split the script plays a few episodes: the actions are the env's
optimal plan when it has one, else a seeded random admissible action, else a fixed text (which measures the cost of
rejecting an action). It prints a markdown table (milliseconds, median over the calls) and writes it to
`benchmarks/results/envs.md`. Environments whose packages are missing, or that need a server the user runs
(OpenEnv, real WebShop, TRL environment classes), are listed as skipped with the reason.

    python benchmarks/envs.py                    # every environment
    python benchmarks/envs.py sokoban alfworld   # some of them
    python benchmarks/envs.py --episodes 5 --max_steps 30
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_agents.envs import list_envs  # noqa: E402


def _ms(seconds: list[float]) -> str:
    return f"{1000 * statistics.median(seconds):.3f}" if seconds else "-"


# Adapters wrap something that must be named; these are the ones measured here.
ADAPTER_SETTINGS = {"gymnasium": {"env_id": "FrozenLake-v1"}, "textarena": {"game": "TowerOfHanoi-v0"}}
NEEDS_USER_SERVER = {
    "webshop": "needs a WebShop server you run (webshop-lite is the offline one)",
    "trl-environment": "wraps a TRL environment class you write",
}


def measure(name, cls, episodes: int, max_steps: int, env_kwargs: dict) -> dict[str, str]:
    tasks = cls.task_split("train", episodes, **env_kwargs)
    construct_start = time.perf_counter()
    env = cls(**env_kwargs)
    construct = time.perf_counter() - construct_start
    resets, steps, snapshots, restores = [], [], [], []
    rng = random.Random(0)
    try:
        for task in tasks:
            start = time.perf_counter()
            env.reset(task)
            resets.append(time.perf_counter() - start)
            plan = env.optimal_plan() if env.supports("optimal_plan") else None
            for t in range(max_steps):
                if plan:
                    action = plan[t] if t < len(plan) else plan[-1]
                else:
                    admissible = env.admissible_actions()
                    action = rng.choice(admissible) if admissible else "look"
                if env.supports("snapshot") and t == 1:
                    start = time.perf_counter()
                    snap = env.snapshot()
                    snapshots.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    env.restore(snap)
                    restores.append(time.perf_counter() - start)
                start = time.perf_counter()
                done = env.step(action)[2]
                steps.append(time.perf_counter() - start)
                if done:
                    break
    finally:
        env.close()
    return {
        "construct": f"{1000 * construct:.1f}",
        "reset": _ms(resets),
        "step": _ms(steps),
        "snapshot": _ms(snapshots),
        "restore": _ms(restores),
        "steps measured": str(len(steps)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="environments to measure (default: all registered)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "envs.md"))
    args = parser.parse_args()

    registered = list_envs()
    names = args.names or list(registered)
    columns = ["construct", "reset", "step", "snapshot", "restore", "steps measured"]
    lines = [
        "| env | " + " | ".join(f"{c} (ms)" if c != "steps measured" else c for c in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for name in names:
        cls = registered[name]
        missing = cls.missing_requirements()
        reason = f"missing {', '.join(missing)}" if missing else NEEDS_USER_SERVER.get(name)
        if reason:
            lines.append(f"| {name} | skipped: {reason} |" + " |" * (len(columns) - 1))
            continue
        server = None
        env_kwargs = dict(ADAPTER_SETTINGS.get(name, {}))
        if name == "openenv":  # the client, against our Sokoban served on loopback
            from trl_agents.envs.adapters import start_openenv_server

            server = start_openenv_server("sokoban")
            env_kwargs["base_url"] = server.base_url
        try:
            row = measure(name, cls, args.episodes, args.max_steps, env_kwargs)
        finally:
            if server is not None:
                server.stop()
        label = f"{name} ({', '.join(f'{k}={v}' for k, v in env_kwargs.items() if k != 'base_url')})" if env_kwargs else name
        if name == "openenv":
            label = "openenv (client, loopback sokoban server)"
        lines.append(f"| {label} | " + " | ".join(row[c] for c in columns) + " |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(
        f"Environment latency on this machine ({os.cpu_count()} cores), `python benchmarks/envs.py`; "
        "median milliseconds per call. A reset includes generating the game the first time a task is seen "
        "(alfworld, textworld, rushhour, minesweeper cache what they generate).\n\n" + table + "\n"
    )


if __name__ == "__main__":
    main()
