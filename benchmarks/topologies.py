"""What does a branching rollout save? Generated tokens and wall time per finished leaf, branching vs independent.

`RolloutEngine` driven directly (no trainer) with a `TransformersGenerator` on the offline tiny model
(`trl_agents.testing`) on Sokoban (snapshots: forks restore the state before their branch step), `--tasks` tasks
per rollout so that generation batches are realistic, at equal leaf counts per task:

* `independent`: G = 8 episodes per task from the initial state (GRPO's rollout);
* `branching`: 2 backbones per task, 1 branch point each, branch_factor K = 4 (the backbone's own continuation
  and K − 1 = 3 forks), so leaves = backbones × (1 + branch_points × (K − 1)) = 2 × (1 + 1 × 3) = 8 per task. Scores:
  `entropy_mean`, with the REAL `entropy` model signal (a `ModelSignalContext` on the tiny model, the no-grad
  forward a trainer runs: its cost is part of the rollout's wall time and is also shown on its own), and `random`
  (the control: no forward);
* `adaptive` (CANOPY-style): rounds of 8 episodes per task until the group carries signal (two episodes with
  different returns), at most `max_group_size` = 16; its leaves per task are what it chose;
* the topology methods' own rollouts at the same budget of 8 leaves per task: `patr` (1 root, b = 2, the solver
  scorer on the `solver_value` the engine records), `info_gain` (IGRPO: 2 roots + 3 expansions of k = 2; Sokoban has
  no gold answer, so the solver's plan stands in as the teacher-forced target), `token_branching` (APPO: 4 initial
  rollouts + 4 token-prefix branches, the real `policy_logprobs` forward), `state_score` (3SPO's allocation from an
  empty table: every state unseen, n = G_max, until 8 trajectories per task finish), DPEPO's `parallel` wrapper
  (2 episodes x K = 4 environment copies; a copy is a leaf) and Tool-RL's `supervised` groups (5 sampled episodes,
  1 teacher-forced on the solver's plan, which generates no tokens, and 2 sampled under a plan hint).

Why branching saves tokens: a fork starts from the snapshot taken before its branch step f and shares the
backbone's steps 0..f−1, the same `Step` objects, generated (and stepped in the environment) once. A leaf's path
still has all its steps, but only the steps from f on cost anything. With every path of length L and fork steps f,
the cost per leaf relative to independent episodes is, in env steps (and in tokens when every turn generates about
as many tokens),

    1 − (forks / leaves) · mean(f) / L = 1 − (K − 1)/K · mean(f) / L    (branch_points = 1),

e.g. with fork steps uniform over 0..L−1 (the `random` score) mean(f) ≈ (L − 1)/2, so ≈ 1 − 3/4 · 0.45 = 0.66 for
L = 10: a third fewer tokens. The table shows this prediction from the run's own fork steps and path lengths next to
the measured ratio (they differ by how path lengths and tokens per turn vary between the runs' samples). An
untrained tiny model mostly plays to the turn limit, so L ≈ max_turns here; a trained policy that finishes early
shortens L and the prefix alike.

Wall time is another matter: a branching rollout plays the backbones first (a quarter of the episodes, so smaller
generation batches), then the forks (3/4 of the leaves, for L − f turns each), so it makes up to twice as many
generation calls (one per turn of each phase), each on a smaller batch, plus the snapshots and restores, plus the
entropy forward between the phases. Whether the saved tokens become saved seconds depends on what a generation call
costs. On this CPU a call of the tiny model costs about in proportion to its batch × tokens, so wall time per leaf
falls with the tokens (less the entropy forward). Where a call costs the same whatever its batch (`model.generate`
on a GPU is bound by per-step overhead: 75-80 ms per decode step from 64 to 256 sequences, the README's H200
figures), twice the calls cost about twice the time, and branching saves tokens (and env steps, for slow
environments) but not generation time; a throughput-bound engine (vLLM, continuous batching) is in between.

Every figure comes from `RolloutBatch.stats` (`generated_tokens`, `env_steps`, `generation_calls`, `episodes`,
`topology/*`) and the wall time of `engine.run`. The topologies go in `--rounds` interleaved rounds (each round
reseeds torch the same way before every topology; the `random` score takes the round as its seed), after one
untimed warm-up rollout; tokens, env steps and leaves
are summed over the rounds; wall time per leaf (and the entropy forward's) is the mean over the faster half of the
rounds (a shared machine has bursts of contention, which only ever slow a rollout down); ratios are to
`independent` in the same run.

    python benchmarks/topologies.py                # ~1-2 min on 2 cores
    python benchmarks/topologies.py --rounds 1     # quicker, noisier

Benchmarks never assert on time; the table is written to `benchmarks/results/topologies.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ENV = "sokoban"
GROUP_SIZE = 8  # leaves per task of the independent and branching runs
BACKBONES, BRANCH_POINTS, BRANCH_FACTOR = 2, 1, 4
MAX_GROUP_SIZE = 16  # adaptive's cap
TURNS = [10]  # max_turns of the run (set from --turns; PATR's solver scorer needs the horizon)


def leaves_per_task(backbones: int, branch_points: int, branch_factor: int) -> int:
    """Leaves of a branching rollout per task: every branch point adds K − 1 forks to its backbone.

    >>> leaves_per_task(2, 1, 4)
    8
    """
    return backbones * (1 + branch_points * (branch_factor - 1))


PARALLEL_COPIES = 4  # DPEPO: K environment copies per parallel episode (2 episodes x 4 copies = GROUP_SIZE)
APPO_INITIAL = GROUP_SIZE // 2  # APPO: n_init initial rollouts of n = GROUP_SIZE (the rest are token branches)
IGRPO_ROOTS = 2  # IGRPO: 2 roots + 3 expansions of k = 2 children = GROUP_SIZE leaves


@dataclass
class Run:
    """One compared rollout: `make(seed)` builds its topology; `num_generations` is what `engine.run` gets (roots,
    backbones or initial rollouts for the trees); `signals` the environment signals its engine records; `parallel`:
    the tasks are played by DPEPO's `parallel` wrapper, each episode counting as `PARALLEL_COPIES` leaves."""

    label: str
    make: Callable[[int], Any]
    num_generations: int
    signals: tuple[str, ...] = ()
    parallel: bool = False


def settings(tokenizer) -> list[Run]:
    """Every compared rollout, independent first (the reference of the ratios), then one per topology."""
    from trl_agents.judges import SolverProgressScorer
    from trl_agents.rollout.topologies.state_score import StateScoreTable
    from trl_agents.rollout.topologies import (AdaptiveTopology, BranchingTopology, IndependentTopology,
                                               get_topology)
    from trl_agents.rollout.topologies.appo import TokenBranchingTopology, punctuation_filter
    from trl_agents.rollout.topologies.patr import PATRTopology

    assert leaves_per_task(BACKBONES, BRANCH_POINTS, BRANCH_FACTOR) == GROUP_SIZE
    branching = {"branch_points": BRANCH_POINTS, "branch_factor": BRANCH_FACTOR}
    skip = punctuation_filter(tokenizer)
    return [
        Run("independent", lambda seed: IndependentTopology(), GROUP_SIZE),
        Run("branching, entropy_mean (BPO)", lambda seed: BranchingTopology(**branching, score="entropy_mean"),
            BACKBONES),
        Run("branching, random", lambda seed: BranchingTopology(**branching, score="random", seed=seed), BACKBONES),
        Run(f"adaptive, max {MAX_GROUP_SIZE} (CANOPY)", lambda seed: AdaptiveTopology(max_group_size=MAX_GROUP_SIZE),
            GROUP_SIZE),
        Run("patr, solver scorer (PATR)", lambda seed: PATRTopology(
            scorer=SolverProgressScorer(horizon=TURNS[0]), budget=GROUP_SIZE, roots=1, branch_factor=2), 1,
            signals=("solver_value",)),
        Run("info_gain, T_I 0.1 (IGRPO)", lambda seed: get_topology(
            "info_gain", leaf_budget=GROUP_SIZE, expansion_factor=2, temperature=0.1, seed=seed), IGRPO_ROOTS),
        Run("token_branching, z(H)·z(Ω) (APPO)", lambda seed: TokenBranchingTopology(
            rollouts_per_task=GROUP_SIZE, score="bs", skip_token=skip), APPO_INITIAL),
        Run("state_score, empty table (3SPO)", lambda seed: get_topology(
            "state_score", g_max=GROUP_SIZE, max_samples=GROUP_SIZE, table=StateScoreTable()), GROUP_SIZE),
        Run(f"independent, parallel K={PARALLEL_COPIES} (DPEPO)", lambda seed: IndependentTopology(),
            GROUP_SIZE // PARALLEL_COPIES, parallel=True),
        # Tool-RL: 5 sampled + 1 teacher-forced on the solver's plan (generates nothing) + 2 hinted episodes per task.
        Run("supervised, 1 forced + 2 hinted (Tool-RL)", lambda seed: get_topology(
            "supervised", replace_num=1, hint_num=2, env_name=ENV, max_turns=TURNS[0]), GROUP_SIZE),
    ]


class ModelSignals:
    """The engine's `signal_fn`: the real model signals on the tiny model (what `AgentGRPOTrainer` does for a
    topology mid-rollout: `entropy` for BPO, `policy_logprobs` for APPO, `gold_likelihood` for IGRPO), timed.

    Sokoban has no gold answer: IGRPO's `gold_likelihood` scores the solver's optimal plan from the task's initial
    state instead (a stand-in target with the same cost: one teacher-forced forward of the target per new node)."""

    def __init__(self, model, tokenizer, renderer, max_rows: int, plans: dict[int, str]):
        from trl_agents.signals import ModelSignalContext, get_signal
        from trl_agents.trainers.igrpo import GoldLikelihood

        self.context = ModelSignalContext(
            model_context=lambda: contextlib.nullcontext(model), renderer=renderer, row_format="step",
            pad_token_id=tokenizer.pad_token_id, temperature=1.0, max_rows_per_forward=max_rows,
        )
        self.signals = {"gold_likelihood": GoldLikelihood(source=lambda t, j: plans[t.task["seed"]],
                                                          template="{answer}")}
        self.get_signal = get_signal
        self.seconds = 0.0

    def __call__(self, name, trajectories):
        import torch

        from trl_agents.trajectory import Group

        signal = self.signals.get(name) or self.get_signal(name)
        start = time.perf_counter()
        with torch.no_grad():
            signal.compute([Group(task={}, trajectories=list(trajectories))], self.context)
        self.seconds += time.perf_counter() - start


def tree_stats(batch, copies: int = 1) -> dict[str, float]:
    """Fork steps and path lengths of a rollout, and the tokens its shared prefixes saved. With `copies` > 1 (DPEPO's
    parallel episodes) each episode counts as `copies` leaves, and env steps are the copies' own steps (the
    `applied` actions of every turn), not the wrapper's turns."""
    leaves = batch.trajectories
    forks = [t for t in leaves if t.parent_id is not None]
    path_tokens = sum(len(s.action_ids) for t in leaves for s in t.steps)  # every leaf's whole path
    stats = {
        "leaves": len(leaves) * copies,
        "forks": len(forks),
        "fork_step_sum": sum(t.fork_step for t in forks),
        "path_steps": sum(len(t.steps) for t in leaves) * copies,
        "path_tokens": path_tokens,
        "successes": sum(t.success for t in leaves) * copies,
    }
    if copies > 1:
        stats["copy_steps"] = sum(len(s.info.get("applied", ())) for t in leaves for s in t.owned_steps)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks per rollout")
    parser.add_argument("--turns", type=int, default=10, help="max_turns")
    parser.add_argument("--new-tokens", type=int, default=8, help="max_new_tokens per turn")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds of all topologies")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "topologies.md"))
    args = parser.parse_args()

    import torch

    from trl_agents.envs import get_env_class, make_env
    from trl_agents.rollout import EnvPool, PromptRenderer, RolloutEngine, SamplingParams, TransformersGenerator
    from trl_agents.testing import build_tiny_model, build_tiny_tokenizer, env_corpus

    TURNS[0] = args.turns

    started = time.perf_counter()
    tokenizer = build_tiny_tokenizer(env_corpus(ENV, num_tasks=64), vocab_size=1024)
    model = build_tiny_model(tokenizer, seed=0).eval()
    num_parameters = sum(p.numel() for p in model.parameters())
    generator = TransformersGenerator(model, tokenizer)
    renderer = PromptRenderer(tokenizer)
    tasks = get_env_class(ENV).task_split("train", args.tasks)
    plans = {}
    for task in tasks:
        env = make_env(ENV)
        env.reset(task)
        plans[task["seed"]] = " ".join(env.optimal_plan())
    sampling = SamplingParams(max_new_tokens=args.new_tokens)
    runs = settings(tokenizer)

    def rollout(run: Run, topology, signal_fn=None):
        engine_tasks, pool, run_sampling, run_renderer = tasks, None, sampling, renderer
        if run.parallel:  # DPEPO: one answer per turn holds an action for each of the K copies
            engine_tasks = [{**task, "env": "parallel"} for task in tasks]
            pool = EnvPool(env_kwargs={"inner": ENV, "num_envs": PARALLEL_COPIES, "max_history": 1})
            run_sampling = SamplingParams(max_new_tokens=PARALLEL_COPIES * args.new_tokens)
            run_renderer = PromptRenderer(tokenizer, history_length=0)
        engine = RolloutEngine(generator, run_renderer, max_turns=args.turns, sampling=run_sampling,
                               topology=topology, signal_fn=signal_fn, signals=run.signals, env_pool=pool)
        start = time.perf_counter()
        batch = engine.run(engine_tasks, run.num_generations)
        return batch, time.perf_counter() - start

    rollout(runs[0], runs[0].make(0))  # warm-up, not timed
    totals = {run.label: {"walls": [], "stats": {}, "tree": {}} for run in runs}
    for round_index in range(args.rounds):
        for run in runs:
            label = run.label
            torch.manual_seed(1000 + round_index)
            signal = ModelSignals(model, tokenizer, renderer, max_rows=16, plans=plans)
            batch, wall = rollout(run, run.make(round_index), signal)
            failed = [t.error for t in batch.trajectories if t.failed]
            assert not failed, failed[:3]
            tree = tree_stats(batch, PARALLEL_COPIES if run.parallel else 1)
            total = totals[label]
            total["walls"].append((wall / tree["leaves"], signal.seconds / tree["leaves"]))
            for key, value in batch.stats.items():
                total["stats"][key] = total["stats"].get(key, 0.0) + value
            for key, value in tree.items():
                total["tree"][key] = total["tree"].get(key, 0) + value
            print(f"round {round_index + 1} {label}: {tree['leaves']} leaves, {batch.stats['generated_tokens']:.0f} "
                  f"tokens, {batch.stats['generation_calls']:.0f} calls, {wall:.2f} s", flush=True)

    rows = []
    for run in runs:
        label = run.label
        total, stats, tree = totals[label], totals[label]["stats"], totals[label]["tree"]
        leaves = tree["leaves"]
        quiet = sorted(total["walls"])[: (len(total["walls"]) + 1) // 2]  # the faster half of the rounds
        row = {
            "label": label,
            "leaves_per_task": leaves / (args.tasks * args.rounds),
            "tokens": stats["generated_tokens"] / leaves,
            "env_steps": tree.get("copy_steps", stats["env_steps"]) / leaves,
            "calls": stats["generation_calls"] / args.rounds,
            "wall": statistics.mean(wall for wall, _ in quiet),
            "entropy_ms": 1000 * statistics.mean(entropy for _, entropy in quiet),
            "path_length": tree["path_steps"] / leaves,
            "fork_step": tree["fork_step_sum"] / tree["forks"] if tree["forks"] else None,
            "fork_fraction": tree["forks"] / leaves,
            "success": tree["successes"] / leaves,
        }
        if tree["forks"]:  # the prediction from this run's own fork steps and path lengths
            row["predicted"] = 1 - row["fork_fraction"] * row["fork_step"] / row["path_length"]
            row["saved_tokens"] = 1 - stats["generated_tokens"] / tree["path_tokens"]
        rows.append(row)
    base = rows[0]

    def ratio(row, key):
        return f"{row[key] / base[key]:.2f}"

    lines = [
        ("| topology | leaves per task | generated tokens per leaf | x indep. | env steps per leaf | x indep. | "
        "generation calls per rollout | wall ms per leaf | x indep. | signal forward ms per leaf | "
        "mean path length | mean fork step | predicted token ratio 1 − (forks/leaves)·f/L | success |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        fork = f"{row['fork_step']:.2f}" if row["fork_step"] is not None else "—"
        predicted = f"{row['predicted']:.2f}" if "predicted" in row else "—"
        lines.append(
            f"| {row['label']} | {row['leaves_per_task']:.2f} | {row['tokens']:.1f} | {ratio(row, 'tokens')} | "
            f"{row['env_steps']:.2f} | {ratio(row, 'env_steps')} | {row['calls']:.1f} | {1000 * row['wall']:.1f} | "
            f"{ratio(row, 'wall')} | {row['entropy_ms']:.2f} | {row['path_length']:.2f} | {fork} | {predicted} | "
            f"{row['success']:.3f} |"
        )
    adaptive = totals[runs[3].label]["stats"]
    notes = (
        f"\n\n* Adaptive: {adaptive['topology/mean_episodes_per_task'] / args.rounds:.2f} episodes per task on average "
        f"(max {adaptive['topology/max_episodes_per_task'] / args.rounds:.1f}, mean over rounds), "
        f"{adaptive['topology/rounds'] / args.rounds:.1f} rounds per rollout, groups carrying signal "
        f"{adaptive['topology/signal_fraction'] / args.rounds:.2f}; an untrained policy rarely solves a puzzle, so "
        "most groups grow to the cap (CANOPY spends its episodes on the tasks whose group has no signal yet)."
    )
    for row in rows:
        if "saved_tokens" in row:
            notes += (f"\n* {row['label']}: the shared prefixes saved {100 * row['saved_tokens']:.1f} % of the tokens "
                      "of the leaves' whole paths.")
    notes += (
        "\n* PATR: the solver scorer reads the `solver_value` the engine records; paths it scores below τ_prune for 2 "
        "turns, or that repeat or are refused, are pruned (kept as failed leaves), which is what an untrained policy "
        "mostly earns: its cheap leaves are cheap failures, not better exploration."
        "\n* IGRPO: Sokoban has no gold answer; the stand-in target is the solver's plan from the task's initial "
        "state (one teacher-forced forward per new node: the signal forward column)."
        "\n* APPO: the signal forward is `policy_logprobs` (current-policy log-probs and entropies of the initial "
        "rollouts); on one process with the sampling model Ω ≡ 1 and split points fall back to z(H)."
        "\n* 3SPO: with an empty table every state is unseen (S = 1), so each decision branches G_max ways until "
        f"{GROUP_SIZE} trajectories per task finish; its leaves include the siblings left on the frontier."
        f"\n* DPEPO: {GROUP_SIZE // PARALLEL_COPIES} parallel episodes per task, each acting in {PARALLEL_COPIES} "
        "copies of the env (a leaf is a copy); env steps are the copies' own steps (an untrained model that never "
        "writes the parallel format takes none: DPEPO needs its SFT warm start); one answer per turn serves all "
        "copies, with up to K times the tokens of one action."
        "\n* Tool-RL: the teacher-forced episode takes the solver's actions without generating (its tokens are not "
        "counted: Sokoban's solver plans are short, so it also ends early); the hinted episodes sample from a second "
        "prompt with the hint (rendered each turn) and record the hint-free one."
        "\n* Wall time: branching makes about twice the generation calls of independent, each on a smaller batch; on "
        "this CPU a call costs about in proportion to batch x tokens, so the time per leaf falls with the tokens, less "
        "the entropy forward. Where a call costs the same at any batch (plain `generate` on a GPU), twice the calls "
        "would cost about twice the generation time: the token saving need not be a time saving there."
    )
    table = "\n".join(lines)
    print("\n" + table + notes)
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    header = (
        f"Rollout topologies at equal leaf counts, `python benchmarks/topologies.py --tasks {args.tasks} --turns "
        f"{args.turns} --new-tokens {args.new_tokens} --rounds {args.rounds}` on {os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), torch {torch.__version__}.\n\n"
        f"Tiny Qwen2-style model ({num_parameters / 1e3:.0f}k parameters, untrained), `TransformersGenerator`, "
        f"{ENV} ({args.tasks} tasks per rollout, at most {args.turns} turns of at most {args.new_tokens} new tokens, "
        f"step rows). Independent: {GROUP_SIZE} episodes per task; branching: {BACKBONES} backbones x (1 + "
        f"{BRANCH_POINTS} branch point x ({BRANCH_FACTOR} − 1) forks) = {GROUP_SIZE} leaves per task, branch "
        "points chosen by the real `entropy` model signal (its forward is in the wall time and shown on its own) or "
        f"at random; adaptive: rounds of {GROUP_SIZE} up to {MAX_GROUP_SIZE}; the topology methods' rows at the "
        f"same leaf budget of {GROUP_SIZE} per task (notes below). Sums over {args.rounds} interleaved "
        "rounds; wall ms per leaf: `engine.run`'s wall time / leaves, the mean over the faster half of the rounds "
        "(contention bursts of a shared machine only slow rounds down), the entropy forward's over the same rounds; "
        "generation calls: per rollout (all tasks together). Ratios: to independent, same run. Path length: steps "
        "of a leaf's whole path (shared prefix included); fork step: the first own step of a fork.\n\n"
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(header + table + notes + "\n")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
