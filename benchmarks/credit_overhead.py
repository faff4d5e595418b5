"""How much time does credit assignment add to one training step? (a script, not a test)

Builds a verl-agent-sized ALFWorld batch: 16 groups x 8 trajectories x 50 steps = 128 trajectories, 6400 step rows.
Observations are ~150-character texts drawn from a small per-task state space with a few common states and a long
tail (so anchor groups repeat and a few are singletons), rewards are sparse (10 at the last step of ~40% of the
episodes) and ~3% of the actions are invalid. Every step also carries what the step-level methods read: a parsed
action (`info["action"]`, 6 choices), solver values N(s_t), N(s_t+1) (CAST), and the last step carries verifier
atoms, a chain of 5 with witness steps (VICT). Times every estimator over all 16 groups at its defaults (3SPO with a
state table filled by one earlier batch; SCPO with its default lexical scorer, kept across calls as
the trainer keeps it): median of 20 repeats after a
warm-up, target < 50 ms each.

Usage:
    python benchmarks/credit_overhead.py
"""

from __future__ import annotations

import random
import statistics
import time

from trl_agents.credit import (
    BEPOParams,
    BiPACEParams,
    CASTParams,
    CreditParams,
    ECPOParams,
    GiGPOParams,
    GRPOParams,
    ProGPOParams,
    RLOOParams,
    SCPOParams,
    SSPOParams,
    VICTParams,
    get_estimator,
    stat_means,
)
from trl_agents.credit.scpo import LexicalScorer
from trl_agents.rollout.topologies.state_score import StateScoreTable
from trl_agents.trajectory import Group, Step, Trajectory

NUM_GROUPS, GROUP_SIZE, NUM_STEPS = 16, 8, 50
STATES_PER_TASK = 40
TARGET_MS = 50.0
HIDDEN_WIDTH = 896
ACTIONS = ["go to shelf 1", "go to shelf 2", "take mug 1", "open drawer 1", "look", "inventory"]


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
                    action_text=(action := rng.choice(ACTIONS)),
                    valid=rng.random() > 0.03,
                    reward=10.0 if (success and t == NUM_STEPS - 1) else 0.0,
                    done=t == NUM_STEPS - 1,
                    info={"action": action, "solver_value": float(NUM_STEPS - t + rng.randint(0, 2)),
                          "solver_value_next": float(NUM_STEPS - t - 1 + rng.randint(0, 2))},
                )
                for t in range(NUM_STEPS)
            ]
            witnesses = sorted(rng.sample(range(NUM_STEPS), 5))
            steps[-1].info["verifier_atoms"] = [
                {"name": f"k{k}", "status": "sat" if success or k < 2 else "unsat",
                 "witness_step": witnesses[k] if success or k < 2 else None,
                 "depends_on": [f"k{k - 1}"] if k else []}
                for k in range(5)
            ]
            trajectories.append(Trajectory(task=task, steps=steps, success=success, episode_id=episode_id))
        groups.append(Group(task=task, trajectories=trajectories))
    return groups


def median_ms(name: str, params: CreditParams, groups: list[Group], repeats: int = 20) -> float:
    """Median milliseconds of one call of the estimator `name` on the whole batch `groups`."""
    estimator = get_estimator(name)
    estimator(groups, params)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        estimator(groups, params)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    groups = make_batch()
    rows = sum(len(t.steps) for g in groups for t in g.trajectories)
    stats = stat_means(get_estimator("gigpo")(groups, GiGPOParams())[1])
    mean_size, singletons = stats["mean_anchor_group_size"], stats["singleton_anchor_fraction"]
    print(
        f"batch: {NUM_GROUPS} groups x {GROUP_SIZE} trajectories x {NUM_STEPS} steps = {rows} step rows; "
        f"anchor groups: mean size {mean_size:.1f}, singleton fraction {singletons:.2f}"
    )
    table = StateScoreTable()
    table.update(make_batch(seed=1))
    scorer = LexicalScorer()  # SCPOTrainer keeps one scorer (and its similarity cache) for the whole run
    estimators: dict[str, CreditParams] = {
        "grpo": GRPOParams(),
        "rloo": RLOOParams(),
        "gigpo": GiGPOParams(),
        "bepo": BEPOParams(),
        "ecpo": ECPOParams(),
        "progpo": ProGPOParams(),
        "scpo": SCPOParams(scpo_scorer=scorer),
        "3spo": SSPOParams(state_scores=table),
        "vict": VICTParams(),
    }
    results = {name: median_ms(name, params, groups) for name, params in estimators.items()}
    # BiPACE clusters steps by the cosine of the policy's hidden states: without them it falls back to exact state
    # keys; with them the cost is one n x n x d Gram matrix per group (d = hidden width; 896 is Qwen2.5-0.5B's).
    results["bipace (state keys)"] = median_ms("bipace", BiPACEParams(), groups)
    import numpy as np

    rng = np.random.default_rng(0)
    states = rng.standard_normal((STATES_PER_TASK, HIDDEN_WIDTH)).astype(np.float32)
    hidden_states = []
    for group in groups:
        index = {}
        rows_of = [index.setdefault(step.observation, len(index) % STATES_PER_TASK)
                   for traj in group.trajectories for step in traj.steps]
        hidden = states[rows_of] + 0.01 * rng.standard_normal((len(rows_of), HIDDEN_WIDTH)).astype(np.float32)
        hidden_states.append(hidden)
    results[f"bipace (hidden width {HIDDEN_WIDTH})"] = median_ms(
        "bipace", BiPACEParams(hidden_states=hidden_states), groups, repeats=5
    )
    results["cast"] = median_ms("cast", CASTParams(), groups)  # CAST normalises over the whole batch
    grpo_ms = results["grpo"]
    print(f"| estimator | ms per batch ({NUM_GROUPS * GROUP_SIZE} trajectories x {NUM_STEPS} steps) | x GRPO | "
          f"target < {TARGET_MS:.0f} ms |")
    print("|---|---|---|---|")
    for name, ms in results.items():
        verdict = "OK" if ms < TARGET_MS else ("exempt (see README)" if name.startswith("bipace") else "TOO SLOW")
        print(f"| {name} | {ms:.1f} | {ms / grpo_ms:.1f} | {verdict} |")


if __name__ == "__main__":
    main()
