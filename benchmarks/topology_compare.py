"""Rollout-topology methods against GRPO at equal generation compute: held-out success after the same number of
generated tokens, from the same warm start.

Trees (BPO, PATR, IGRPO, APPO, 3SPO's allocation), growing groups (CANOPY) and K parallel environments per turn
(DPEPO) spend a rollout's tokens differently from G independent episodes, so equal RL *steps* would not be equal
compute. Every run here stops at the first optimizer step after its training rollouts have generated
`--generated_tokens` tokens (`AgentGRPOConfig.max_generated_tokens`; `--max_steps` is only a cap), and reports what
it actually used (generated tokens, env steps, episodes and RL steps: the budget is crossed by a whole rollout, so
runs overshoot it by less than one rollout's tokens).

For every (env, seed) the tiny model is warm-started once on solver demonstrations (the first run does it, exactly as
`benchmarks/credit_compare.py`, whose runner this reuses); every method then starts from that checkpoint, trains on
the same tasks and is evaluated on the same held-out tasks (greedily, or sampled from the same seeded stream where a
setting asks for it). Each run is a fresh `trl-agents train` process, one after the other. A method an env cannot run
(IGRPO needs a gold answer, which FrozenLake and Sokoban lack) is reported as n/a with the reason, and so is DPEPO,
whose success (any of K environment copies) is not the single-environment success the others are evaluated on.
Opt-in settings hold those two: `frozenlake-parallel` and `sokoban-parallel` (DPEPO and GRPO on 2 parallel copies of
the lake or the room; on the room both also on twice the tokens, `dpepo_2x_tokens` against `grpo_2x_tokens`), and
`searchqa` / `searchqa-2hop` (IGRPO and GRPO on one- and two-hop questions, Search-QA being the environment with a
gold answer, plus GRPO on twice the tokens, `grpo_2x_tokens`: about the RL steps and episodes IGRPO's tree buys with
one budget, to tell its cheaper leaves from its credit).

The table gives, per method and env, held-out success after RL (mean ± std over seeds), its gain over the warm
start, the paired difference to GRPO on the same seed (mean and a 95 % t-interval over seeds), and the compute each
run used. The reading underneath says which differences the spread allows to claim: with 3 seeds the t-interval's
half-width is 4.30·std/√3 ≈ 2.5 std of the paired differences, so only large, consistent effects can show.

Results go to `benchmarks/results/topology_compare.{json,md}`, updated after every run (an interrupted benchmark
keeps what it measured; rerunning skips finished runs).

    python benchmarks/topology_compare.py                                    # everything, 3 seeds, 2 envs
    python benchmarks/topology_compare.py --envs frozenlake --methods grpo bpo --seeds 0
    python benchmarks/topology_compare.py --generated_tokens 60000
    python benchmarks/topology_compare.py --generated_tokens 20000 --envs frozenlake-parallel sokoban-parallel \
        searchqa searchqa-2hop
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from credit_compare import ENV_CONFIGS, ENV_OVERRIDES, ROOT, run_one, unsupported_reason

RESULTS = ROOT / "benchmarks" / "results"


def parallel_setting(config: Path, inner: dict, task: str, place: str, runs: list[str]) -> dict:
    """A setting on the `parallel` wrapper: 2 copies of the `inner` task per turn, 8 turns, answers in the parallel
    format, sampled evaluation; `task` and `place` word its system prompt."""
    return {
        "env": "parallel", "config": config,
        "flags": ["--env_name", "parallel", "--env_kwargs",
                  json.dumps({**inner, "num_envs": 2, "max_history": 0,
                              "explore_actions": ["up", "down", "left", "right"]}),
                  "--system_prompt", (f"{task}, in 2 copies of the {place} at once. Answer with a move in each copy "
                                      "you choose, e.g. <parallel><env_1>down</env_1><env_2>right</env_2></parallel>."),
                  "--max_completion_length", "56", "--history_length", "0", "--max_turns", "8",
                  # Sampled evaluation (seeded, the same draws for both methods of a seed): a greedy policy whose
                  # observation does not change (a move into an ended copy) repeats its answer until the turns run out.
                  "--eval_temperature", "1.0",
                  "--per_device_train_batch_size", "32"],  # 4 tasks x 8 episodes per step (over the run's flags)
        "runs": runs,
        # A parallel-format turn is ~25 tokens where a plain move is 1-2, and an episode ~150 tokens where a plain
        # one is ~8: 10x the plain budget buys about the plain setting's number of RL steps (~40).
        "token_scale": 10,
    }


# The settings compared: credit_compare's FrozenLake and Sokoban, and both played in K = 2 parallel copies per turn
# (`parallel` wrapper), where DPEPO is compared with GRPO on the same wrapper from the same parallel-format warm
# start: both are evaluated on the wrapper's success (a task counts when any copy reaches the goal).
SETTINGS: dict[str, dict] = {
    "frozenlake": {"env": "frozenlake", "config": ENV_CONFIGS["frozenlake"], "flags": []},
    "sokoban": {"env": "sokoban", "config": ENV_CONFIGS["sokoban"], "flags": []},
    # The plain setting's 4x4 lakes (hole_prob 0.3) in 2 copies (the other topologies run on the plain lake). On 3x3
    # lakes the held-out layouts are few and unlike the training ones: a warm start that solved 58 % of training
    # layouts solved 0-4 % of held-out ones.
    "frozenlake-parallel": parallel_setting(
        ENV_CONFIGS["frozenlake"], {"inner": "frozenlake", "size": 4, "hole_prob": 0.3},
        "Walk P to the goal G without stepping into a hole H", "lake", ["grpo", "dpepo"]),
    # The plain setting's 5x5 one-box rooms in 2 copies: DPEPO's second environment, where the tiny policy acts in
    # both copies on most turns. Both methods also run on twice the tokens: GRPO gains ~0.5 points on one budget.
    "sokoban-parallel": parallel_setting(
        ENV_CONFIGS["sokoban"], {"inner": "sokoban", "size": 5, "num_boxes": 1}, "Push the box X onto the target O",
        "room", ["grpo", "dpepo", "grpo_2x_tokens", "dpepo_2x_tokens"]),
    # One-hop Search-QA questions: the setting with a gold answer, where IGRPO's information gain is defined.
    "searchqa": {"env": "searchqa", "config": ROOT / "configs" / "grpo_searchqa_tiny.yaml", "flags": [],
                 "runs": ["grpo", "igrpo", "grpo_2x_tokens"],
                 "token_scale": 4},  # ~51 tokens an episode where a lake move is 1-2
    # Two-hop questions (a search per hop, then the answer): more nodes for IGRPO's selection to choose between.
    "searchqa-2hop": {"env": "searchqa", "config": ROOT / "configs" / "grpo_searchqa_tiny.yaml",
                      "flags": ["--env_kwargs", json.dumps({"num_entities": 200, "hops": 2, "top_k": 1}),
                                "--max_turns", "4"],
                      "runs": ["grpo", "igrpo", "grpo_2x_tokens"], "token_scale": 6},  # ~80 tokens an episode
}
for _name, _setting in SETTINGS.items():  # the runner looks settings up by name
    ENV_CONFIGS.setdefault(_name, _setting["config"])
# The plain lake's warm start (configs/quickstart.yaml: at least 250 steps, before which the tiny model can reach the
# target by a shortcut), validated every 50 steps on 50 tasks.
ENV_OVERRIDES.setdefault("frozenlake-parallel", ["--warm_start_steps", "400", "--warm_start_min_steps", "250",
                                                 "--warm_start_target_success", "0.45", "--warm_start_eval_every",
                                                 "50", "--warm_start_val_tasks", "50"])
# Sokoban's warm start (credit_compare's, on 500 rooms) aiming higher: a task counts when either room is solved.
ENV_OVERRIDES.setdefault("sokoban-parallel", ["--warm_start_steps", "600", "--warm_start_min_steps", "200",
                                              "--warm_start_target_success", "0.45", "--warm_start_eval_every", "50",
                                              "--warm_start_tasks", "500", "--warm_start_val_tasks", "50"])
# Search-QA's config stops its warm start at 300 steps, where the tiny model answers 10 % of validation questions and
# GRPO's groups are nearly all failures (34 RL steps, no gain); SFT steps cost 0.5 s here, so it may go on to 1000.
ENV_OVERRIDES.setdefault("searchqa", ["--warm_start_steps", "1000", "--warm_start_min_steps", "300",
                                      "--warm_start_eval_every", "100"])
ENV_OVERRIDES.setdefault("searchqa-2hop", ["--warm_start_steps", "1500", "--warm_start_min_steps", "300",
                                           "--warm_start_eval_every", "100"])

# Each compared run: (registered method, its flags on top of the env's config). Leaves per task are kept at 8 (GRPO's
# group) where the topology has a fixed leaf budget; the tasks per step then follow from the batch size (episodes
# per step = tasks x num_generations, and a topology method's num_generations counts roots / backbones).
RUNS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("grpo", ["--num_generations", "8", "--per_device_train_batch_size", "64"]),
    # 2 backbones x (1 + 1 branch point x (4 - 1) forks) = 8 leaves per task, 8 tasks per step.
    "bpo": ("bpo", ["--num_generations", "2", "--per_device_train_batch_size", "16", "--bpo_branch_factor", "4"]),
    # Rounds of 8 until the group mixes outcomes, at most 16 episodes: CANOPY spends more on the hard tasks.
    "canopy": ("canopy", ["--num_generations", "8", "--per_device_train_batch_size", "64",
                          "--canopy_max_group_size", "16", "--beta", "0.0"]),
    # B = 8 leaves per task grown from 1 root by the solver's progress score, 8 tasks per step.
    "patr": ("patr", ["--num_generations", "8", "--per_device_train_batch_size", "64", "--patr_scorer", "solver"]),
    # 2 roots + 3 expansions of k = 2 = 8 leaves (needs a gold answer: Search-QA).
    "igrpo": ("igrpo", ["--num_generations", "2", "--igrpo_leaf_budget", "8", "--per_device_train_batch_size", "16"]),
    # n_init = 4 initial rollouts + 4 token-prefix branches = 8 episodes per task.
    "appo": ("appo", ["--num_generations", "4", "--appo_rollouts_per_task", "8", "--per_device_train_batch_size",
                      "32"]),
    # 3SPO with its allocation: a depth-first search per task until 8 trajectories finish, G_max = 8; per-task
    # statistics (with "global" every FrozenLake / Sokoban position has seen a success after one batch: S ≈ 0 and the
    # search truncates every episode after one action; docs/methods/3spo.md, sspo_min_root_rollouts).
    "3spo_adaptive": ("3spo", ["--num_generations", "8", "--per_device_train_batch_size", "64",
                               "--sspo_allocation", "adaptive", "--sspo_g_max", "8", "--state_scope", "task"]),
    # The same search with an episode term beside R_3SPO (as the independent allocation has by default).
    "3spo_adaptive_ep": ("3spo", ["--num_generations", "8", "--per_device_train_batch_size", "64",
                                  "--sspo_allocation", "adaptive", "--sspo_g_max", "8", "--state_scope", "task",
                                  "--episode_advantage_w", "1.0"]),
    # 8 parallel-format episodes per task with DPEPO's diversity weights, against GRPO on the same wrapper.
    "dpepo": ("dpepo", ["--num_generations", "8", "--per_device_train_batch_size", "64"]),  # (batch: the setting's)
    # GRPO on twice the tokens: about the RL steps and episodes a tree buys with one budget (IGRPO on Search-QA),
    # to tell a tree's cheaper leaves from its credit.
    "grpo_2x_tokens": ("grpo", ["--num_generations", "8", "--per_device_train_batch_size", "64"]),
    # DPEPO on twice the tokens, against GRPO on twice the tokens: where GRPO's own gain at one budget is small.
    "dpepo_2x_tokens": ("dpepo", ["--num_generations", "8", "--per_device_train_batch_size", "64"]),
}
# Runs whose budget is a multiple of the setting's.
RUN_TOKEN_SCALE = {"grpo_2x_tokens": 2, "dpepo_2x_tokens": 2}
# The run each is paired with: GRPO on the same budget (grpo_2x_tokens itself is paired with GRPO on one budget).
REFERENCE = {"dpepo_2x_tokens": "grpo_2x_tokens"}
# The runs a setting without its own "runs" list compares.
DEFAULT_RUNS = [run for run in RUNS if run not in RUN_TOKEN_SCALE]

# Runs whose numbers would not measure the same thing as the others' on a setting.
NOT_COMPARABLE = {
    ("frozenlake", "dpepo"): "runs on frozenlake-parallel: its episodes act in K copies of the task and succeed when "
                             "any copy does, against GRPO on the same parallel wrapper",
    ("sokoban", "dpepo"): "runs on sokoban-parallel (K copies per turn), against GRPO on the same wrapper",
}


def paired(rows: list[dict], env: str, run: str, reference: str = "grpo") -> list[float]:
    """Per seed: success after RL of `run` minus `reference`'s, in points (seeds where both finished)."""
    def by_seed(name):
        return {r["seed"]: r["after"] for r in rows if r["env"] == env and r["run"] == name and r["status"] == "ok"}

    mine, theirs = by_seed(run), by_seed(reference)
    return [100 * (mine[s] - theirs[s]) for s in sorted(mine) if s in theirs]


def interval(values: list[float]) -> tuple[float, float] | None:
    """The 95 % Student-t interval of the mean of `values`: mean ± t(0.975, n − 1)·std/√n, the quantile from
    `scipy.stats.t` at every n (2.201 at 11 degrees of freedom, not the normal 1.96); None below 2 values. (Not
    `t.interval`: it answers NaN for a zero spread, and seeds that all differ by the same, e.g. 0, do happen here.)"""
    if len(values) < 2:
        return None
    half = float(stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
    mean = statistics.mean(values)
    return mean - half, mean + half


def table(rows: list[dict], runs: list[str], envs: list[str]) -> str:
    lines = [("| env | method | after RL (mean ± std) | gain (points) | vs GRPO, paired (points, 95 % CI) | "
              "RL steps | generated tokens | env steps | episodes | RL seconds |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for env in envs:
        for run in runs:
            if run not in SETTINGS[env].get("runs", DEFAULT_RUNS):
                continue
            mine = [r for r in rows if r["env"] == env and r["run"] == run]
            ok = [r for r in mine if r["status"] == "ok"]
            if not ok:
                reason = f"{mine[0]['status']}: {mine[0].get('reason', '')}" if mine else "not run"
                lines.append(f"| {env} | {run} | {reason} | | | | | | | |")
                continue
            after = [r["after"] for r in ok]
            spread = f" ± {statistics.stdev(after):.3f}" if len(after) > 1 else ""
            gain = statistics.mean(100 * (r["after"] - r["before"]) for r in ok)
            diffs = paired(rows, env, run, REFERENCE.get(run, "grpo"))
            if run == "grpo" or not diffs:
                versus = "—"
            else:
                ci = interval(diffs)
                versus = f"{statistics.mean(diffs):+.1f}" + (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else "")

            def mean_of(key, ok=ok):
                values = [r[key] for r in ok if key in r]
                return f"{statistics.mean(values):,.0f}" if values else "—"

            lines.append(f"| {env} | {run} | {statistics.mean(after):.3f}{spread} (n={len(ok)}) | {gain:+.1f} | "
                         f"{versus} | {mean_of('rl_steps')} | {mean_of('rl_generated_tokens')} | "
                         f"{mean_of('rl_env_steps')} | {mean_of('rl_episodes')} | {mean_of('rl_seconds')} |")
    return "\n".join(lines)


def reading(rows: list[dict], runs: list[str], envs: list[str]) -> str:
    """What the spread allows to claim, per method and env, from the paired intervals: against GRPO on the same
    budget, and against GRPO on a multiple of the budget where the setting has that run and no twin of this one on
    that multiple."""
    lines = []
    for env in envs:
        compared = SETTINGS[env].get("runs", DEFAULT_RUNS)
        for run in runs:
            if run == "grpo" or run not in compared:
                continue
            skipped = [r for r in rows if r["env"] == env and r["run"] == run and r["status"] == "n/a"]
            if skipped:
                lines.append(f"* {env}, {run}: not run ({skipped[0].get('reason', 'n/a').split(':')[0]}).")
                continue
            references = [REFERENCE.get(run, "grpo")]
            # GRPO on a multiple of the budget, for a run without its own twin on that budget (IGRPO: what its
            # cheaper leaves buy; DPEPO has dpepo_2x_tokens against grpo_2x_tokens instead)
            twin = any(RUNS[other][0] == RUNS[run][0] for other in compared if other in REFERENCE)
            if run not in RUN_TOKEN_SCALE and not twin:
                references += [ref for ref in compared if ref in RUN_TOKEN_SCALE and ref not in REFERENCE]
            lines += [claim(rows, env, run, reference) for reference in references]
    return "\n".join(lines)


def claim(rows: list[dict], env: str, run: str, reference: str) -> str:
    """One line: is `run` above, below or not distinguishable from `reference` on `env` (paired 95 % interval)?"""
    diffs = paired(rows, env, run, reference)
    ci = interval(diffs)
    name = "GRPO" if reference == "grpo" else reference
    if ci is None:
        return f"* {env}, {run} vs {name}: fewer than 2 paired seeds: nothing to claim."
    where = f"[{ci[0]:+.1f}, {ci[1]:+.1f}] points"
    if ci[0] > 0:
        return (f"* {env}, {run}: above {name} on this budget (95 % CI of the paired difference {where} excludes 0; "
                f"{len(diffs)} seeds).")
    if ci[1] < 0:
        return f"* {env}, {run}: below {name} on this budget (95 % CI {where} excludes 0; {len(diffs)} seeds)."
    return f"* {env}, {run}: not distinguishable from {name} (95 % CI {where} includes 0; {len(diffs)} seeds)."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["frozenlake", "sokoban"], choices=list(SETTINGS),
                        help="settings to run (opt-in, 3 seeds: frozenlake-parallel ~50, sokoban-parallel ~60, "
                             "searchqa ~40, searchqa-2hop ~60 min)")
    parser.add_argument("--methods", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--generated_tokens", type=int, default=40_000,
                        help="generation budget of every run: training stops once its rollouts generated this many")
    parser.add_argument("--max_steps", type=int, default=400, help="a cap on RL steps (the token budget binds first)")
    parser.add_argument("--num_eval_tasks", type=int, default=300)
    parser.add_argument("--table_only", action="store_true",
                        help="write the tables from the results file without training anything")
    parser.add_argument("--results_name", default="topology_compare",
                        help="results file stem in benchmarks/results/ (.json and .md)")
    parser.add_argument("--output_root", default=str(ROOT / "outputs" / "bench-topology"))
    args = parser.parse_args()
    args.batch_size = 64  # (credit_compare's runner sets it; the RUNS flags override it per method)

    RESULTS.mkdir(parents=True, exist_ok=True)
    json_path = RESULTS / f"{args.results_name}.json"
    previous = json.loads(json_path.read_text())["rows"] if json_path.exists() else []
    settings = {"generated_tokens": args.generated_tokens, "max_steps": args.max_steps,
                "num_eval_tasks": args.num_eval_tasks}
    # Failures are retried, and so are runs whose flags have changed since (a row keeps the flags it ran with).
    rows = current(previous, settings)
    done = {(r["env"], r["run"], r["seed"]) for r in rows}
    runs = ["grpo", *[m for m in args.methods if m != "grpo"]]  # GRPO is the reference of every paired difference
    for env in args.envs:
        for seed in args.seeds:
            for run in runs:
                if (env, run, seed) in done:
                    continue
                method, flags = RUNS[run]
                setting = SETTINGS[env]
                if run not in setting.get("runs", DEFAULT_RUNS):
                    continue
                reason = NOT_COMPARABLE.get((env, run)) or unsupported_reason(setting["env"], method)
                if reason:
                    row = {"env": env, "method": method, "seed": seed, "status": "n/a", "reason": reason}
                elif args.table_only:  # (n/a rows are written: they cost nothing)
                    continue
                else:
                    tokens = budget(env, settings, run)
                    extra = (*flags, *setting["flags"], "--max_generated_tokens", str(tokens))  # the setting wins
                    row = run_one(env, method, seed, args, Path(args.output_root), extra=extra, run_name=run,
                                  warm_flags=tuple(setting["flags"]))
                    row["budget"] = tokens
                row["warm_start_overrides"] = ENV_OVERRIDES.get(env, [])
                row["run"], row["settings"], row["flags"] = run, settings, flags
                row["setting_flags"] = setting["flags"]
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "settings"}), flush=True)
                rows = merged(json_path, rows, settings)  # keep what another sweep wrote into the file meanwhile
                json_path.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1))
                write_table(rows, runs, args.envs, settings, args.results_name)
    write_table(rows, runs, args.envs, settings, args.results_name)
    print(table(rows, runs, args.envs))


def current(rows: list[dict], settings: dict) -> list[dict]:
    """The rows measured with these settings, their run's present flags, their setting's present flags and its present
    warm-start overrides (failures are retried; rows from before a field was recorded count as matching it)."""
    return [r for r in rows if r.get("settings") == settings and r["status"] != "failed"
            and r.get("run") in RUNS and r.get("flags") == RUNS[r["run"]][1]
            and r.get("setting_flags", []) == SETTINGS.get(r["env"], {}).get("flags")
            and r.get("warm_start_overrides", ENV_OVERRIDES.get(r["env"], [])) == ENV_OVERRIDES.get(r["env"], [])
            and r.get("budget", budget(r["env"], settings, r["run"])) == budget(r["env"], settings, r["run"])]


def budget(env: str, settings: dict, run: str = "grpo") -> int:
    """The generated-token budget of `run` on setting `env`."""
    return settings["generated_tokens"] * SETTINGS.get(env, {}).get("token_scale", 1) * RUN_TOKEN_SCALE.get(run, 1)


def merged(json_path: Path, rows: list[dict], settings: dict) -> list[dict]:
    """`rows` and the current rows of `json_path` that are not in `rows` (by setting, run and seed), so that two
    sweeps over different settings can share one results file."""
    mine = {(r["env"], r["run"], r["seed"]) for r in rows}
    others = current(json.loads(json_path.read_text())["rows"], settings) if json_path.exists() else []
    return rows + [r for r in others if (r["env"], r["run"], r["seed"]) not in mine]


def settings_text(envs: list[str], settings: dict) -> str:
    lines = []
    for env in envs:
        setting = SETTINGS[env]
        tokens = budget(env, settings)
        flags = " ".join(f"'{f}'" if " " in f or "{" in f else f for f in setting["flags"])
        compared = setting.get("runs", DEFAULT_RUNS)
        runs = ", ".join(compared)
        scaled = [run for run in compared if run in RUN_TOKEN_SCALE]
        lines.append(f"* `{env}`: `{Path(setting['config']).relative_to(ROOT)}` {('`' + flags + '`') if flags else ''}"
                     f" — {tokens:,} generated tokens per run"
                     + "".join(f" ({run}: {RUN_TOKEN_SCALE[run]}x)" for run in scaled) + f"; runs: {runs}")
    return "\n".join(lines)


def write_table(rows: list[dict], runs: list[str], envs: list[str], settings: dict,
                name: str = "topology_compare") -> None:
    flags = "\n".join(f"* `{run}`: `--method {RUNS[run][0]} {' '.join(RUNS[run][1])}`"
                      + (f" on {RUN_TOKEN_SCALE[run]}x the setting's token budget" if run in RUN_TOKEN_SCALE else "")
                      for run in runs)
    (RESULTS / f"{name}.md").write_text(
        "Held-out success (greedy, or sampled where a setting sets `--eval_temperature`) after the same generation "
        "budget from the same warm-started tiny model "
        f"(`python benchmarks/topology_compare.py`, settings {settings}; {os.cpu_count()} CPU cores). Gain = after RL "
        "minus after warm start, in points; vs GRPO = this run minus GRPO's on the same seed (dpepo_2x_tokens: minus "
        "grpo_2x_tokens'), in points, mean and 95 % t-interval over seeds. Compute columns: what the runs used, mean "
        "over seeds.\n\n"
        + table(rows, runs, envs) + "\n\nRuns (on top of the env's config):\n\n" + flags
        + "\n\nSettings (flags on top of the config, for every run of the setting):\n\n" + settings_text(envs, settings)
        + "\n\nWhat the spread allows to claim:\n\n" + reading(rows, runs, envs) + "\n" + NOTES
    )


# What the table cannot say by itself (kept with the script, so that a re-run keeps them).
NOTES = """
Reading:

* On FrozenLake and Sokoban no topology method is separated from GRPO at this budget: every paired 95 % interval
  includes 0. Three seeds of a tiny model on 300 held-out tasks give seed-to-seed spreads of 5-16 points, so only
  effects of that size could show; this table says what each method costs and that none of them breaks training
  here, not which is better.
* The compute columns are what differs by design: at the same generated tokens the trees train more RL steps on
  more episodes (PATR 61 / 52 steps and 1.6-2.3x GRPO's episodes, BPO 46 / 31 steps) because forks do not regenerate
  their prefix; CANOPY trains fewer steps (its groups grow on the tasks without signal); 3SPO's adaptive search makes
  many short siblings (about 3.6x GRPO's episodes on FrozenLake, 6.3x on Sokoban).
* 3SPO with the adaptive allocation and R_3SPO alone (`3spo_adaptive`, `episode_advantage_w` 0, its reference
  setting) loses 10.2 points on FrozenLake (seeds: -9.7, -21.0, 0.0). With the episode term beside it
  (`3spo_adaptive_ep`, `--episode_advantage_w 1.0`, the default of the independent allocation) the loss shrinks to
  -1.3 points (seeds +3.0, -3.0, -4.0; paired -6.1 [-15.9, +3.7] against GRPO) and Sokoban stays within noise
  (+3.7): the same cure the independent allocation needed (docs/methods/3spo.md, "Our choices").
* IGRPO on `searchqa` (one-hop questions, warm starts at 47-61 % held-out, 5 seeds) is the one method above GRPO at
  equal tokens: +3.5 points [+2.0, +4.9], every seed ahead (+2.3 to +5.0). Its tree bought 66 RL steps on 4,211 leaves
  with GRPO's tokens (forks do not regenerate their shared prefix) against 35 steps on 2,266 episodes. GRPO on twice
  the tokens (`grpo_2x_tokens`: 70 steps, 4,480 episodes) gains as much (+4.9 [+2.0, +7.8] over GRPO) and IGRPO
  against it is -1.4 [-4.3, +1.5]: here IGRPO's gain is what its cheaper leaves buy; its information-gain selection
  and leaf weights show no effect of their own (a one-hop question leaves the tree one search to choose).
* On two-hop questions (`searchqa-2hop`, 3 seeds, warm starts at 47-57 %), where the tree has more nodes to choose
  between, IGRPO's gain disappears: +0.3 [-3.8, +4.5] against GRPO at equal tokens (74 RL steps on 4,715 leaves
  against 32 on 2,048), and -4.3 [-9.3, +0.6] against GRPO on twice the tokens (64 steps, 4,117 episodes), below it
  on every seed. On this tiny model the information-gain tree's extra leaves are worth less than independent ones.
* DPEPO on `frozenlake-parallel` (2 copies of the plain 4x4 lake per turn, 5 seeds) is not distinguishable from GRPO
  on the same wrapper: -0.4 points [-6.4, +5.6] (seeds +0.7, +2.7, +4.3, -8.0, -1.7), and GRPO itself gains only
  +3.5 points in 37 steps. The tiny policy acts in 0.94-1.27 of the 2 copies per turn and writes a valid parallel
  answer 54-78 % of the time, so the diversity weight has little diversity to reward: its mean W is 0.96 and it
  scales 24-30 % of the turns' negative advantages by 2 - W. On 3x3 lakes (the first version of this setting) the
  held-out layouts are few and unlike the training ones: a warm start that solved 58 % of its validation layouts
  solved 0 % of the held-out ones greedily and 4 % sampled, so that setting compared zeros. This one evaluates by
  sampling (`eval_temperature` 1.0, the same seeded draws for both methods of a seed) because a greedy answer whose
  observation does not change (a move into an ended copy) repeats until the turns run out.
* DPEPO on `sokoban-parallel` (2 copies of credit_compare's 5x5 one-box room per turn, 5 seeds, warm starts at
  25-33 % held-out, sampled evaluation) is not distinguishable from GRPO on the same wrapper either: -0.4 points
  [-4.6, +3.8] at one budget (200,000 tokens, 34-37 RL steps; seeds 0.0, -5.7, -0.3, +0.3, +3.7), where GRPO itself
  gains only +0.5 points, and -1.7 [-5.9, +2.4] on twice the tokens against GRPO on twice the tokens (68-72 steps;
  seeds -5.3, +1.3, +0.7, -5.3, 0.0), where GRPO gains +2.2. Here the policy acts in both copies on most turns
  (1.83-1.88 copies per turn, 1-3 % of turns without a parsable action): the width the lake lacked. W still
  averages 0.96. The warm start's demonstrations already put a different move in each copy, and the two copies get
  the same move on only 9-12 % of turns (C_width > 0; counted from the recorded trajectories of the 2x-budget runs,
  seeds 0, 2 and 4). What lowers W is the depth term: with four moves and up to 8 turns, 45-47 % of a copy's moves
  repeat one it made before, whether or not the play loops, so 26-35 % of the turns get their negative advantage
  scaled by 2 - W for repetition a grid game needs. The paper's text environments, where a repeated action is a
  loop, are where that term means what it was built for.
* The opt-in settings cost minutes per run, two runs side by side on the 2 cores (SFT steps of 0.5 s, RL runs of
  1-7 min, a warm start of 4-12 min per seed).
* RL seconds are wall time on a shared machine (other jobs ran beside most of these runs, several times slower for
  some); compare the token, step and episode columns.
"""


if __name__ == "__main__":
    main()
