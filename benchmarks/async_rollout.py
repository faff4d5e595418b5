"""Does per-episode scheduling pay? Rollout wall time under `lockstep`, `task` and `free` schedules, same content.

Workload: 8 tasks × 8 episodes × 8 turns of `CountdownEnv` (episodes never end early) behind `LatencyEnv`: every
step sleeps clip(lognormal(median 100 ms, σ = 1), 10 ms, 2 s), drawn from a hash of (task, turn, actions so far),
so every schedule sees the same latency for the same step (a paired comparison). Environments run on 64 threads
(sleeps release the GIL). Deterministic sampling (a seed per request) is on in every schedule.

Generators (`--cases`, all by default):

* `simulated`: `SeededScriptGenerator`, answers from a hash of (prompt, seed), a call costing 20 ms + 2 ms per
  sequence as a sleep (the tiny model's regime on a CPU). Batch invariant, so the row hashes must be equal.
* `tiny`: the built-in tiny model (`TransformersGenerator`, backend "generate", per-request seeds); batched, so
  rows may differ in the last bits between schedules (the table says whether the hashes match).
* `vllm`: the loopback vLLM server (the tiny model behind `/v1/completions`), one request per episode turn under
  `free`, one concurrent burst per turn under lockstep.
* `sandbox`: `shell-tasks` in bubblewrap sandboxes, a scripted policy running real commands (`ls`, `wc`, `cat`,
  `find`) through the `bash` tool: the sandbox's own latency, no sleep.
* `constant`: the simulated generator, a constant 100 ms step (no tail): lockstep is already optimal.
* `generation-bound`: the simulated generator with a 1 s fixed cost per call: the window rule must not lose.

For each case and schedule: median wall time over `--repeats` rollouts after a warm-up, generator busy fraction
(generation time / wall), calls and mean batch, the scheduler's own CPU time as a fraction of wall time, and the
sha256 of the rows (prompt ids, action ids, sampling log-probs, rewards, observations). Ratios are lockstep / free
(and lockstep / task) measured in this run. Writes `benchmarks/results/async_rollout.md`.

    python benchmarks/async_rollout.py                       # all cases, 5 repeats: ~15 min on 2 cores
    python benchmarks/async_rollout.py --cases simulated --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams  # noqa: E402
from trl_agents.rollout.env_pool import EnvPool  # noqa: E402
from trl_agents.testing import SeededScriptGenerator, build_tiny_model, build_tiny_tokenizer  # noqa: E402

SCHEDULES = ("lockstep", "task", "free")
CASES = ("simulated", "tiny", "vllm", "sandbox", "constant", "generation-bound")
ACTIONS = ["```up```", "```down```", "```left```", "```right```"]
TASKS, GROUP, TURNS = 8, 8, 8
LATENCY = {"median": 0.1, "sigma": 1.0, "low": 0.01, "high": 2.0}
SHELL_COMMANDS = ["ls", "wc -l *", "find . -type f | sort | head", "cat * | head -n 5", "ls -R | wc -l"]  # no clock in the output


def rows_hash(batch) -> str:
    digest = hashlib.sha256()
    for row in batch.to_rows():
        digest.update(json.dumps([row["task"], row["episode_id"], row["step"], row["prompt_ids"], row["action_ids"],
                                  row["action_logprobs"], row["reward"], row["observation"]], default=str).encode())
    return digest.hexdigest()


def actions_hash(batch) -> str:
    """sha256 of what was played (prompt ids, action ids, rewards), without the sampling log-probs, whose last bits
    depend on the batch a prompt was in for a batched model."""
    digest = hashlib.sha256()
    for row in batch.to_rows():
        digest.update(json.dumps([row["task"], row["episode_id"], row["step"], row["prompt_ids"], row["action_ids"],
                                  row["reward"]], default=str).encode())
    return digest.hexdigest()


def bash_calls() -> list[str]:
    from trl_agents.envs.adapters.trl import format_tool_call

    return [format_tool_call({"name": "bash", "arguments": {"command": command}}) for command in SHELL_COMMANDS]


class Case:
    """A generator, an environment pool and task rows for one benchmark case."""

    def __init__(self, name: str, tokenizer):
        self.name, self.tokenizer = name, tokenizer
        self.server = None
        self.close_generator = None
        latency = dict(LATENCY)
        inner = "test-countdown"
        if name == "constant":
            latency["sigma"] = 0.0
        self.tasks = [{"env": "test-latency", "seed": seed, "turns": TURNS} for seed in range(TASKS)]
        self.env_kwargs = {"inner": inner, **latency}
        self.max_new_tokens = 8
        if name in ("simulated", "constant"):
            self.generator = SeededScriptGenerator(tokenizer, ACTIONS, call_seconds=0.020, seconds_per_prompt=0.002)
        elif name == "generation-bound":
            self.generator = SeededScriptGenerator(tokenizer, ACTIONS, call_seconds=1.0, seconds_per_prompt=0.002)
        elif name == "tiny":
            from trl_agents.rollout import TransformersGenerator

            self.generator = TransformersGenerator(build_tiny_model(tokenizer, hidden_size=64, num_layers=2),
                                                   tokenizer, backend="generate")
        elif name == "vllm":
            from trl_agents.loopback import LoopbackVLLMServer, loopback_trl_vllm
            from trl_agents.rollout.vllm import VLLMClientGenerator

            self.server = LoopbackVLLMServer(build_tiny_model(tokenizer, hidden_size=64, num_layers=2), tokenizer)
            self.server.start()
            self.patch = loopback_trl_vllm()  # TRL's client, without vLLM installed, speaking to the loopback server
            self.patch.__enter__()
            self.generator = VLLMClientGenerator(self.server.base_url, [tokenizer.eos_token_id])
            self.close_generator = self.generator.close
        elif name == "sandbox":
            self.generator = SeededScriptGenerator(tokenizer, bash_calls())
            self.tasks = [{"env": "shell-tasks", "seed": seed} for seed in range(TASKS)]
            self.env_kwargs = {}
            self.max_new_tokens = 64
        else:
            raise ValueError(f"unknown case {name!r}; choose among {CASES}")

    def run(self, schedule: str, pool: EnvPool) -> tuple[float, object]:
        engine = RolloutEngine(self.generator, PromptRenderer(self.tokenizer), max_turns=TURNS,
                               sampling=SamplingParams(max_new_tokens=self.max_new_tokens), env_pool=pool,
                               schedule=schedule, deterministic_sampling=True, seed=0)
        started = time.perf_counter()
        batch = engine.run(self.tasks, GROUP, rollout_index=0)
        return time.perf_counter() - started, batch

    def close(self) -> None:
        if self.close_generator is not None:
            self.close_generator()
        if self.server is not None:
            self.patch.__exit__(None, None, None)
            self.server.stop()


def measure(case: Case, schedule: str, repeats: int) -> dict:
    pool = EnvPool(env_kwargs=case.env_kwargs, backend="thread", num_workers=TASKS * GROUP)
    try:
        case.run(schedule, pool)  # warm-up: environments built, sandboxes started, caches filled
        walls, batches = [], []
        for _ in range(repeats):
            wall, batch = case.run(schedule, pool)
            walls.append(wall)
            batches.append(batch)
    finally:
        pool.close()
    wall = statistics.median(walls)
    middle = batches[walls.index(sorted(walls)[len(walls) // 2])]
    stats = middle.stats
    calls = stats["generation_calls"]
    hashes = {rows_hash(batch) for batch in batches}
    return {
        "wall": wall, "walls": walls, "busy": stats.get("generation_seconds", 0.0) / max(walls[batches.index(middle)],
                                                                                         1e-9),
        "calls": calls, "mean_batch": stats["env_steps"] / calls if calls else 0.0,
        "steps": stats["env_steps"], "overhead": stats.get("scheduler_seconds", 0.0) / walls[batches.index(middle)],
        "hash": rows_hash(middle), "actions": actions_hash(middle), "stable": len(hashes) == 1, "success": sum(t.success for t in middle.trajectories),
    }


def simulate(a: float, c: float, rule: str, samples: int, episodes: int = TASKS * GROUP, turns: int = TURNS,
             seed: int = 0) -> float:
    """The mean lockstep / free ratio of rollout time in a discrete-event model of this workload: a serial generator
    whose call on b prompts costs a + c·b seconds, unlimited environments with the benchmark's latency distribution,
    and the launch rule `rule` ("greedy": whatever is pending whenever the generator is free; "window": only when
    no environment call is in flight or the oldest request has waited a)."""
    import heapq
    import random

    rng = random.Random(seed)
    ratios = []
    for _ in range(samples):
        latency = [[min(max(LATENCY["median"] * math.exp(LATENCY["sigma"] * rng.gauss(0.0, 1.0)), LATENCY["low"]),
                        LATENCY["high"]) for _ in range(turns)] for _ in range(episodes)]
        lockstep = sum(a + c * episodes + max(latency[i][t] for i in range(episodes)) for t in range(turns))
        now, done, played = 0.0, 0, [0] * episodes
        pending = [(0.0, i) for i in range(episodes)]  # (since when, episode)
        in_env: list[tuple[float, int]] = []  # heap of (finish time, episode)
        finish = 0.0
        while done < episodes:
            oldest = pending[0][0] if pending else None
            if pending and (rule == "greedy" or not in_env or now >= oldest + a):
                end = now + a + c * len(pending)
                for _, i in pending:
                    heapq.heappush(in_env, (end + latency[i][played[i]], i))
                pending, now = [], end
            elif in_env:
                wake = in_env[0][0]
                if pending and rule == "window":
                    wake = min(wake, oldest + a)
                now = max(now, wake)
            while in_env and in_env[0][0] <= now:
                when, i = heapq.heappop(in_env)
                played[i] += 1
                if played[i] == turns:
                    done, finish = done + 1, max(finish, when)
                else:
                    pending.append((when, i))
            pending.sort()
        ratios.append(lockstep / finish)
    return sum(ratios) / len(ratios)


SIMULATED_COSTS = ((0.020, 0.002), (0.050, 0.004), (0.3, 0.010), (1.0, 0.020), (2.0, 0.050), (3.8, 0.0))


def simulation_table(samples: int) -> list[str]:
    header = "| launch rule | " + " | ".join(f"a {a:g} s, c {c * 1000:g} ms" for a, c in SIMULATED_COSTS) + " |"
    lines = [header, "|---|" + "---|" * len(SIMULATED_COSTS)]
    for rule, label in (("greedy", "whatever is pending"), ("window", "wait up to a (ours)")):
        values = [simulate(a, c, rule, samples) for a, c in SIMULATED_COSTS]
        lines.append(f"| {label} | " + " | ".join(f"{value:.2f}" for value in values) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "async_rollout.md"))
    parser.add_argument("--simulate", type=int, default=300, metavar="SAMPLES",
                        help="samples of the discrete-event model of the launch rules (0: skip)")
    args = parser.parse_args()
    args.simulation = []
    if args.simulate:
        args.simulation = simulation_table(args.simulate)
        print("\n".join(["model: mean lockstep / free ratio by launch rule", *args.simulation]), flush=True)

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    from trl_agents.testing import env_corpus

    tokenizer = build_tiny_tokenizer(env_corpus("frozenlake", num_tasks=8), vocab_size=512)
    results: dict[str, dict[str, dict]] = {}
    for name in args.cases:
        if name == "sandbox":
            from trl_agents.envs.sandbox import bubblewrap_available

            if not bubblewrap_available():
                print("sandbox: bubblewrap is not installed; skipped", flush=True)
                continue
        case = Case(name, tokenizer)
        try:
            results[name] = {}
            for schedule in SCHEDULES:
                results[name][schedule] = measure(case, schedule, args.repeats)
                row = results[name][schedule]
                print(f"{name:17s} {schedule:9s} wall {row['wall']:6.2f} s  busy {row['busy']:.2f}  calls "
                      f"{row['calls']:4.0f}  batch {row['mean_batch']:5.1f}  overhead {row['overhead']:.3f}  "
                      f"hash {row['hash'][:12]}", flush=True)
            lock = results[name]["lockstep"]
            print(f"{name}: lockstep/free {lock['wall'] / results[name]['free']['wall']:.2f}x, lockstep/task "
                  f"{lock['wall'] / results[name]['task']['wall']:.2f}x, rows equal: "
                  f"{len({results[name][s]['hash'] for s in SCHEDULES}) == 1}, actions equal: "
                  f"{len({results[name][s]['actions'] for s in SCHEDULES}) == 1}", flush=True)
        finally:
            case.close()
    write(results, args)


def write(results: dict, args) -> None:
    lines = [
        "# Per-episode scheduling: rollout wall time by schedule",
        "",
        f"Measured {datetime.date.today().isoformat()} on {os.cpu_count()} CPU cores, {platform.platform()}, Python "
        f"{platform.python_version()}, with `python benchmarks/async_rollout.py {' '.join(sys.argv[1:])}`.".rstrip(),
        "",
        f"{TASKS} tasks × {GROUP} episodes × {TURNS} turns; step latency clip(lognormal(median 100 ms, σ 1), 10 ms, "
        "2 s) keyed by (task, turn, actions), constant 100 ms in `constant`; 64 environment threads; a seed per "
        f"request. Wall time: median of {args.repeats} rollouts after a warm-up. Busy: generation time / wall. "
        "Overhead: the scheduler's own CPU time (event loop, outside generation and the engine's rendering and "
        "recording) / wall. Ratios: lockstep wall / schedule wall, measured in this run.",
        "",
        "| case | schedule | wall (s) | vs lockstep | generator busy | calls | mean batch | overhead | rows sha256 | "
        "same rows as lockstep | same actions as lockstep |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_schedule in results.items():
        lock = by_schedule["lockstep"]
        for schedule, row in by_schedule.items():
            lines.append(
                f"| {name} | {schedule} | {row['wall']:.2f} | {lock['wall'] / row['wall']:.2f}× | {row['busy']:.2f} | "
                f"{row['calls']:.0f} | {row['mean_batch']:.1f} | {100 * row['overhead']:.1f} % | `{row['hash'][:12]}` | "
                f"{'yes' if row['hash'] == lock['hash'] else 'no'} | "
                f"{'yes' if row['actions'] == lock['actions'] else 'no'} |"
            )
    if args.simulation:
        lines += ["", f"The launch rules in a discrete-event model of the same workload (`simulate`, {args.simulate} "
                  "samples): mean lockstep / free ratio when a generation call on b prompts costs a + c·b seconds.",
                  "", *args.simulation]
    lines += ["", "Per-rollout wall times (s):", ""]
    for name, by_schedule in results.items():
        for schedule, row in by_schedule.items():
            lines.append(f"- {name} / {schedule}: {', '.join(f'{w:.2f}' for w in row['walls'])}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
