"""How much time does credit assignment add to one training step? (a script, not a test)

Builds a verl-agent-sized ALFWorld batch: 16 groups x 8 trajectories x 50 steps = 128 trajectories, 6400 step rows.
Observations are ~150-character texts drawn from a small per-task state space with a few common states and a long
tail (so anchor groups repeat and a few are singletons), rewards are sparse (10 at the last step of ~40% of the
episodes) and ~3% of the actions are invalid. Times `gigpo_advantages` (exact anchors, the default) and
`grpo_advantages` over all 16 groups: median of 20 repeats after a warm-up.

Usage:
    python benchmarks/credit_overhead.py
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

from trl_agents.credit import gigpo_advantages, gigpo_advantages_with_stats, grpo_advantages
from trl_agents.trajectory import Group, Step, Trajectory

NUM_GROUPS, GROUP_SIZE, NUM_STEPS = 16, 8, 50
STATES_PER_TASK = 40
TARGET_MS = 20.0


def make_batch(seed: int = 0) -> list[Group]:
    rng = random.Random(seed)
    groups = []
    for task_index in range(NUM_GROUPS):
        task = {"env": "alfworld", "seed": task_index}
        states = [
            f"Task {task_index}. You are in room {s}. "
            + " ".join(f"On the shelf {k} you see a {rng.choice(['mug', 'cup', 'pan', 'bowl'])}." for k in range(4))
            for s in range(STATES_PER_TASK)
        ]
        popularity = [1.0 / (rank + 1) for rank in range(STATES_PER_TASK)]  # a few common states, a long tail
        trajectories = []
        for episode_id in range(GROUP_SIZE):
            success = rng.random() < 0.4
            steps = [
                Step(
                    observation=states[0] if t == 0 else rng.choices(states, weights=popularity)[0],
                    action_text="go to shelf 1",
                    valid=rng.random() > 0.03,
                    reward=10.0 if (success and t == NUM_STEPS - 1) else 0.0,
                    done=t == NUM_STEPS - 1,
                )
                for t in range(NUM_STEPS)
            ]
            trajectories.append(Trajectory(task=task, steps=steps, success=success, episode_id=episode_id))
        groups.append(Group(task=task, trajectories=trajectories))
    return groups


def median_ms(fn: Callable[[Group], object], groups: list[Group], repeats: int = 20) -> float:
    for group in groups:  # warm-up
        fn(group)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for group in groups:
            fn(group)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    groups = make_batch()
    rows = sum(len(t.steps) for g in groups for t in g.trajectories)
    stats = [gigpo_advantages_with_stats(g)[1] for g in groups]
    mean_size = statistics.mean(s["mean_anchor_group_size"] for s in stats)
    singletons = statistics.mean(s["singleton_fraction"] for s in stats)
    print(
        f"batch: {NUM_GROUPS} groups x {GROUP_SIZE} trajectories x {NUM_STEPS} steps = {rows} step rows; "
        f"anchor groups: mean size {mean_size:.1f}, singleton fraction {singletons:.2f}"
    )

    gigpo_ms = median_ms(gigpo_advantages, groups)
    grpo_ms = median_ms(grpo_advantages, groups)
    status = "OK" if gigpo_ms < TARGET_MS else "TOO SLOW"
    print(
        f"GiGPO on {NUM_GROUPS * GROUP_SIZE} trajectories x {NUM_STEPS} steps: {gigpo_ms:.1f} ms "
        f"(target < {TARGET_MS:.0f} ms) {status}"
    )
    print(f"GRPO on the same batch: {grpo_ms:.1f} ms; GiGPO/GRPO = {gigpo_ms / grpo_ms:.1f}x")


if __name__ == "__main__":
    main()
