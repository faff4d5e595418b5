"""Does stepping environments concurrently hide their latency? Env steps/s of rollouts with 1, 8 and 32 slow envs.

`SlowEnv` sleeps 100 ms per step (a stand-in for an environment that waits on a simulator, a JVM or the network).
The policy is the tiny offline model generating with `TransformersGenerator`, so a rollout's time is generation plus
environment phases; the script times both (the pool's phases and the generator's calls) and reports the
environment side on its own: env steps/s = steps / time in environment phases. With N envs stepped at once a phase
ideally takes one step's latency, so the ideal speed-up over the 1-env rate is N; the ratio measured / ideal says how
much of the latency concurrency hides. Backends: `thread` (N workers), `process` (N worker processes, started by a
warm-up rollout that is not timed), and the sequential `thread` pool (1 worker) as the baseline.

A second table measures the cost of the thread pool for a fast environment (FrozenLake, microsecond steps): why
`env_workers` defaults to 1.

    python benchmarks/rollout_throughput.py                  # ~2 min on 2 cores
    python benchmarks/rollout_throughput.py --turns 2 --rollouts 1

Benchmarks never assert on time; the table is written to `benchmarks/results/rollout_throughput.md`.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trl_agents.envs import AgentEnv, register_env
from trl_agents.rollout import EnvPool

STEP_SECONDS = 0.1


@register_env
class SlowEnv(AgentEnv):
    """Every step sleeps `delay` seconds; `turns` steps per episode. Module-level, so worker processes can build it
    (they import this script as their main module: everything else runs under `if __name__ == "__main__":`)."""

    name = "bench-slow"
    instructions = "Say anything."
    task_keys = ("seed",)

    def __init__(self, delay: float = STEP_SECONDS, turns: int = 4):
        self.delay, self.turns = delay, turns

    def reset(self, task):
        self.seed, self.turn = task["seed"], 0
        return f"Turn 0 of task {self.seed}."

    def step(self, action_text):
        time.sleep(self.delay)
        self.turn += 1
        return f"Turn {self.turn} of task {self.seed}.", 0.0, self.turn >= self.turns, {"valid": True}


class TimedEnvPool(EnvPool):
    """An EnvPool that adds up the wall time of its step phases."""

    step_seconds = 0.0

    def run(self, calls, kind):
        start = time.perf_counter()
        try:
            return super().run(calls, kind)
        finally:
            if kind == "step":
                self.step_seconds += time.perf_counter() - start


class TimedGenerator:
    """Wraps a generator and adds up the wall time of its calls."""

    def __init__(self, generator):
        self.generator, self.seconds = generator, 0.0
        self.eos_token_ids = generator.eos_token_ids

    def generate(self, prompts, sampling):
        start = time.perf_counter()
        try:
            return self.generator.generate(prompts, sampling)
        finally:
            self.seconds += time.perf_counter() - start


def measure(generator, renderer, env: str, num_envs: int, turns: int, rollouts: int, **pool_args) -> dict:
    """Env-phase and generation time of `rollouts` rollouts of `num_envs` episodes (after one untimed warm-up)."""
    from trl_agents.rollout import RolloutEngine, SamplingParams

    env_kwargs = {"turns": turns} if env == "bench-slow" else {}
    pool = TimedEnvPool(env_kwargs=env_kwargs, **pool_args)
    timed = TimedGenerator(generator)
    engine = RolloutEngine(timed, renderer, max_turns=turns, sampling=SamplingParams(max_new_tokens=4), env_pool=pool)
    tasks = [{"env": env, "seed": seed} for seed in range(num_envs)]
    try:
        start = time.perf_counter()
        engine.run(tasks, num_generations=1)  # warm-up: worker processes start here
        warm_up = time.perf_counter() - start
        pool.step_seconds, timed.seconds, steps = 0.0, 0.0, 0
        start = time.perf_counter()
        for _ in range(rollouts):
            batch = engine.run(tasks, num_generations=1)
            steps += sum(t.num_steps for t in batch.trajectories)
            assert not any(t.failed for t in batch.trajectories), [t.error for t in batch.trajectories]
        wall = time.perf_counter() - start
    finally:
        pool.close()
    return {"steps": steps, "wall": wall, "env": pool.step_seconds, "generation": timed.seconds, "warm_up": warm_up}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=4, help="steps per episode")
    parser.add_argument("--rollouts", type=int, default=2, help="timed rollouts per setting")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "rollout_throughput.md"))
    args = parser.parse_args()

    from trl_agents.rollout import PromptRenderer, TransformersGenerator
    from trl_agents.testing import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    generator = TransformersGenerator(build_tiny_model(tokenizer), tokenizer)
    renderer = PromptRenderer(tokenizer)

    settings = [("thread, 1 worker (sequential)", {"num_workers": 1})]
    settings += [("thread, N workers", "threads"), ("process, N workers", "process")]
    rows, base_rate = [], None
    for num_envs in (1, 8, 32):
        for label, pool_args in settings:
            if pool_args == "threads":
                pool_args = {"num_workers": num_envs}
            elif pool_args == "process":
                pool_args = {"backend": "process"}
            if num_envs == 1 and pool_args.get("num_workers", 0) == 1 and label.startswith("thread, N"):
                continue  # the same as the sequential row
            result = measure(generator, renderer, "bench-slow", num_envs, args.turns, args.rollouts, **pool_args)
            rate = result["steps"] / result["env"]
            if num_envs == 1 and label.startswith("thread, 1"):
                base_rate = rate
            speed_up = rate / base_rate
            rows.append(
                f"| {num_envs} | {label} | {result['steps'] / result['wall']:.1f} | {result['generation']:.2f} | "
                f"{result['env']:.2f} | {rate:.1f} | {speed_up:.2f}x | {num_envs}x | {speed_up / num_envs:.2f} | "
                f"{result['warm_up']:.1f} |"
            )
            print(rows[-1], flush=True)

    fast_rows = []
    for label, pool_args in (("thread, 1 worker (inline)", {}), ("thread, 16 workers", {"num_workers": 16})):
        result = measure(generator, renderer, "frozenlake", 32, args.turns, args.rollouts * 5, **pool_args)
        env_ms, generation_ms = (1e3 * result[key] / result["steps"] for key in ("env", "generation"))
        fast_rows.append(f"| {label} | {env_ms:.3f} | {generation_ms:.3f} |")
        print(fast_rows[-1], flush=True)

    header = (
        f"Rollout throughput with slow environments, `python benchmarks/rollout_throughput.py --turns {args.turns} "
        f"--rollouts {args.rollouts}` on {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}).\n\n"
        f"`SlowEnv`: every step sleeps {STEP_SECONDS * 1000:.0f} ms; {args.turns} steps per episode; one episode per "
        "env. Policy: the tiny offline model with `TransformersGenerator` (4 new tokens per turn), timed separately. "
        "Env steps/s = steps / time in the pool's step phases; the 1-env sequential rate is the reference (ideal "
        "speed-up N: a phase of N concurrent steps ideally takes one step's latency). Warm-up: the untimed first "
        "rollout (process workers start there).\n\n"
        "| envs (N) | backend | rollout steps/s (all) | generation s | env phases s | env steps/s | speed-up | "
        "ideal | ratio | warm-up s |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    fast = (
        "\n\nCost of the thread pool for a fast environment (FrozenLake, 32 episodes, same policy): milliseconds per "
        "env step in the step phases, against generation per step.\n\n"
        "| pool | env ms/step | generation ms/step |\n|---|---|---|\n"
    )
    text = header + "\n".join(rows) + fast + "\n".join(fast_rows) + "\n"
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    main()
