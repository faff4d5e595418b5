"""IB-RL: co-trained roles against fixed-counterpart training on Deal-or-No-Deal, each evaluated against held-out
counterparts (arXiv 2608.06735; docs/methods/ib_rl.md).

Per seed, the tiny model is warm-started once on the environment's self-play demonstrations (`optimal_plan`: alice
proposes, bob accepts; both roles' turns) of the seed's own slice of training tasks; the held-out counterpart of
seed s is the warm start of the next seed (another init, data order and task slice; one shared tokenizer), which
never meets the roles trained from seed s. From seed s's warm start, with the same tasks, RL steps and sampling:

* `co_trained`: IB-RL, both roles' adapters learn (alice and bob co-evolve);
* `fixed_counterpart`: only alice's adapter learns; bob stays the warm start (`ib_rl_train_roles=["alice"]`).

Then alice is frozen and plays greedily, on held-out tasks, against (1) the environment's scripted partner
(`opponent="scripted"`, which accepts offers leaving it 60 % of its value), (2) the held-out checkpoint playing bob,
and (3) her own training counterpart (the co-trained bob, or the frozen warm-start bob). The warm start itself is
evaluated the same way (`warm_start`). Reported per arm and counterpart: alice's normalised utility and the agreement
rate (mean ± std over seeds), and the train-vs-held-out gap (training counterpart minus each held-out one).

Results go to `benchmarks/results/ib_rl.{json,md}`, updated after every seed (rerunning skips finished seeds whose
settings and flags are unchanged).

    python benchmarks/ib_rl.py                 # 3 seeds (≈ 15-25 min on 2 busy CPU cores)
    python benchmarks/ib_rl.py --quick         # 1 seed, fewer steps and tasks: a smoke run of the whole pipeline
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "src"))

ENV = "dealnodeal"
ROLES = ("alice", "bob")
COUNTERPARTS = ("scripted", "held_out", "training")
# A short system message instead of the environment's instructions (the tiny model's prompts stay short; both roles'
# observations still show the pool, their own values, the dialogue and the standing proposal).
SYSTEM_PROMPT = ("Negotiate a split of books, hats and balls. Write [Propose: book=X, hat=Y, ball=Z] with the items "
                 "you keep, or [Accept] to take the other player's offer.")
MODEL_SIZE = {"hidden_size": 48, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
# Each arm: the flags it trains with on top of the shared settings (rows remember them).
ARMS: dict[str, dict] = {
    "warm_start": {"train": False},
    "co_trained": {"train": True, "ib_rl_train_roles": ["alice", "bob"]},
    "fixed_counterpart": {"train": True, "ib_rl_train_roles": ["alice"]},
}


def settings_of(args) -> dict:
    return {"rl_steps": args.rl_steps, "warm_start_steps": args.warm_start_steps, "num_eval_tasks": args.num_eval_tasks,
            "num_train_tasks": args.num_train_tasks, "num_generations": args.num_generations,
            "tasks_per_step": args.tasks_per_step, "max_messages": args.max_messages, "learning_rate": args.lr}


def build_base(seed: int, tokenizer, tasks, args, output: Path):  # (the seed sets the init and the data order)
    """The tiny model warm-started on self-play demonstrations of `tasks` (both roles' turns)."""
    from trl_agents.testing import build_tiny_model
    from trl_agents.warmstart import solver_demonstrations, warm_start

    model = build_tiny_model(tokenizer, seed=seed, **MODEL_SIZE)
    rows = solver_demonstrations(ENV, tasks, env_kwargs=env_kwargs(args), history_length=0, system_prompt=SYSTEM_PROMPT)
    warm_start(model, tokenizer, rows, output_dir=str(output), max_steps=args.warm_start_steps,
               learning_rate=3e-3, batch_size=32, seed=seed)
    return model


def env_kwargs(args, **extra) -> dict:
    return {"max_turns": args.max_messages, **extra}


def train_arm(base_dir: str, tokenizer, tasks, arm: str, seed: int, args, output: Path):
    """A fresh IBRLTrainer on the warm-started weights; trained for `rl_steps` unless the arm is the warm start."""
    from transformers import AutoModelForCausalLM

    from trl_agents.trainers.ib_rl import IBRLConfig, IBRLTrainer

    flags = ARMS[arm]
    config = IBRLConfig(
        output_dir=str(output), env_name=ENV, env_kwargs=env_kwargs(args), max_turns=args.max_messages,
        num_generations=args.num_generations, per_device_train_batch_size=args.num_generations * args.tasks_per_step,
        max_steps=max(args.rl_steps, 1), max_completion_length=24, learning_rate=args.lr, lr_scheduler_type="constant",
        ib_rl_lora_r=8, ib_rl_lora_alpha=16, ib_rl_train_roles=flags.get("ib_rl_train_roles"), temperature=1.0,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, gradient_checkpointing=False,
        save_trajectories=False, seed=seed, system_prompt=SYSTEM_PROMPT,
    )
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    trainer = IBRLTrainer(model=model, args=config, processing_class=tokenizer, train_dataset=tasks)
    started = time.monotonic()
    if flags["train"]:
        trainer.train()
    return trainer, time.monotonic() - started


def evaluate_alice(trainer, counterpart, tokenizer, eval_tasks, args, held_out_model) -> dict:
    """Alice (the trainer's alice adapter, frozen) greedily against one counterpart: her mean normalised utility
    and the agreement rate over the held-out tasks."""
    from trl_agents.evaluation import evaluate_policy
    from trl_agents.rollout.generators import TransformersGenerator
    from trl_agents.trainers.ib_rl import RoleRoutedGenerator

    trainer.model.eval()
    inner = trainer.generator.generators["alice"]
    generators = {"alice": inner}
    contexts = {"alice": lambda: trainer.role_context("alice")}
    kwargs = env_kwargs(args)
    if counterpart == "scripted":
        kwargs.update(opponent="scripted", agent_role="alice")
    elif counterpart == "held_out":
        generators["bob"] = TransformersGenerator(held_out_model, tokenizer)
    else:  # the training counterpart: the trainer's own bob adapter
        generators["bob"] = inner
        contexts["bob"] = lambda: trainer.role_context("bob")
    generator = RoleRoutedGenerator(generators, contexts, default_role="alice")
    result = evaluate_policy(None, tokenizer, ENV, tasks=eval_tasks, env_kwargs=kwargs, max_turns=args.max_messages,
                             history_length=0, max_new_tokens=24, generator=generator, return_rollout=True,
                             system_prompt=SYSTEM_PROMPT)
    utilities, deals = [], []
    for trajectory in result["rollout"].trajectories:
        last = trajectory.steps[-1].info if trajectory.steps else {}
        utilities.append(float((last.get("role_rewards") or {}).get("alice", 0.0)))
        deals.append(float(bool(last.get("success"))))
    return {"alice_utility": statistics.mean(utilities), "agreement": statistics.mean(deals)}


def seed_tasks(seed: int, args) -> list[dict]:
    """The training tasks of a seed: its own slice of the sampled train split (seeds see different tasks)."""
    from trl_agents.envs import get_env_class

    count = args.num_train_tasks
    tasks = get_env_class(ENV).task_split("train", count * (seed + 1), source="sampled", **env_kwargs(args))
    return tasks[count * seed:]


def shared_tokenizer(args):
    """One tokenizer for every seed (so that any seed's warm start can play against any other's)."""
    from trl_agents.testing import build_tiny_tokenizer, env_corpus

    return build_tiny_tokenizer(env_corpus(ENV, seed=0, **env_kwargs(args)) + [SYSTEM_PROMPT], vocab_size=512)


def warm_started(seed: int, tokenizer, args) -> str:
    """The folder of seed `seed`'s warm start (built once, then reused)."""
    folder = Path(args.output_root) / f"warm-start-{seed}-{args.warm_start_steps}"
    if not (folder / "config.json").is_file():
        model = build_base(seed, tokenizer, seed_tasks(seed, args), args, folder / "sft")
        model.save_pretrained(str(folder))
    return str(folder)


def run_seed(seed: int, held_out_seed: int, args) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from trl_agents.envs import get_env_class

    torch.manual_seed(seed)
    output = Path(args.output_root) / f"seed{seed}"
    eval_tasks = get_env_class(ENV).task_split("eval", args.num_eval_tasks, source="sampled", **env_kwargs(args))
    tokenizer = shared_tokenizer(args)
    started = time.monotonic()
    base_dir = warm_started(seed, tokenizer, args)
    # The held-out counterpart: another seed's warm start (another init, data order and tasks), never trained with.
    held_out = AutoModelForCausalLM.from_pretrained(warm_started(held_out_seed, tokenizer, args)).eval()
    warm_seconds = time.monotonic() - started
    rows = []
    for arm, flags in ARMS.items():
        trainer, seconds = train_arm(base_dir, tokenizer, seed_tasks(seed, args), arm, seed, args, output / arm)
        row = {"seed": seed, "arm": arm, "status": "ok", "flags": flags, "held_out_seed": held_out_seed,
               "rl_seconds": seconds, "warm_start_seconds": warm_seconds, "rl_steps": trainer.state.global_step,
               "rl_generated_tokens": trainer.rollout_totals.get("generated_tokens", 0.0)}
        for counterpart in COUNTERPARTS:
            row[counterpart] = evaluate_alice(trainer, counterpart, tokenizer, eval_tasks, args, held_out)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del trainer
    return rows


def mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.3f}{spread}"


def table(rows: list[dict]) -> str:
    lines = [("| arm | vs scripted partner | vs held-out checkpoint | vs training counterpart | gap: training − "
              "scripted | gap: training − held-out | RL steps | generated tokens | RL seconds |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for metric, label in (("alice_utility", "alice's utility"), ("agreement", "agreement rate")):
        lines.append(f"| **{label}** | | | | | | | | |")
        for arm in ARMS:
            ok = [r for r in rows if r["arm"] == arm and r["status"] == "ok"]
            if not ok:
                lines.append(f"| {arm} | not run | | | | | | | |")
                continue
            cells = [mean_std([r[c][metric] for r in ok]) for c in COUNTERPARTS]
            gaps = [mean_std([r["training"][metric] - r[c][metric] for r in ok]) for c in ("scripted", "held_out")]
            steps = statistics.mean(r["rl_steps"] for r in ok)
            tokens = statistics.mean(r["rl_generated_tokens"] for r in ok)
            seconds = statistics.mean(r["rl_seconds"] for r in ok)
            lines.append(f"| {arm} (n={len(ok)}) | {' | '.join(cells)} | {' | '.join(gaps)} | {steps:.0f} | "
                         f"{tokens:,.0f} | {seconds:.0f} |")
    return "\n".join(lines)


def paired(rows: list[dict], counterpart: str, metric: str) -> list[float]:
    """Per seed: co_trained minus fixed_counterpart, alice against `counterpart`."""
    def by_seed(arm):
        return {r["seed"]: r[counterpart][metric] for r in rows if r["arm"] == arm and r["status"] == "ok"}

    co, fixed = by_seed("co_trained"), by_seed("fixed_counterpart")
    return [co[s] - fixed[s] for s in sorted(co) if s in fixed]


def reading(rows: list[dict]) -> str:
    """What the numbers allow to say (generated from the rows, so that a rerun keeps it true)."""
    seeds = sorted({r["seed"] for r in rows})
    lines = [f"Seeds: {seeds}."]
    for counterpart in COUNTERPARTS:
        for metric in ("alice_utility", "agreement"):
            diffs = paired(rows, counterpart, metric)
            if not diffs:
                continue
            mean = statistics.mean(diffs)
            spread = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
            sign = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
            lines.append(f"* co-trained − fixed-counterpart, alice vs {counterpart}, {metric}: {mean:+.3f} "
                         f"(std {spread:.3f} over {len(diffs)} seeds; higher on {sign[0]}, lower on {sign[1]})")
    return "\n".join(lines)


def write_results(rows: list[dict], settings: dict, quick: bool) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "ib_rl_quick" if quick else "ib_rl"
    (RESULTS / f"{name}.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=1))
    flags = "\n".join(f"* `{arm}`: {json.dumps(f)}" for arm, f in ARMS.items())
    (RESULTS / f"{name}.md").write_text(
        "IB-RL on Deal-or-No-Deal with the tiny model: alice frozen after training, greedy, on "
        f"{settings['num_eval_tasks']} held-out tasks, against three counterparts (`python benchmarks/ib_rl.py"
        f"{' --quick' if quick else ''}`, settings {settings}; {os.cpu_count()} CPU cores). Alice's utility is her "
        "normalised points (0 without a deal); agreement = deals / dialogues. Mean ± std over seeds. Gap = against the "
        "training counterpart minus against a held-out one (positive: alice does better with the partner she trained "
        "with). `warm_start` is the starting point of both arms (its training counterpart is the warm-start bob).\n\n"
        + table(rows) + "\n\nArms (flags of IBRLConfig):\n\n" + flags
        + "\n\nPaired differences:\n\n" + reading(rows) + "\n" + NOTES
    )


NOTES = """
Reading (of the run recorded above, 3 seeds; the paired differences are above):

* At this scale the question cannot be answered, and the table says so. The warm-started tiny model (48 hidden
  units, one layer, 80 SFT steps) learned the message format but not offers that depend on the pool: greedy alice
  always writes `[Propose: book=0, hat=0, ball=0]` (she keeps nothing), which every counterpart accepts, so the warm
  start has agreement 1.0 and utility 0.0 against all three counterparts.
* Co-trained (both adapters learn, lr 1e-2): the joint dialogues collapse within a few steps. In a diagnostic rerun
  of seed 0, alice's sampled reward per step was 0.11, 0.17, 0.11 and then 0 on 26 of the last 27 steps; both roles
  drift into degenerate plain talk (repeated control characters or brackets), which the environment accepts as valid
  talk, so nothing penalises it and no offer is made: agreement 0.0 against every counterpart on all 3 seeds. With
  every group at reward 0 the advantages are 0 and only Adam's momentum moves the weights: an instability of two
  policies learning at a high rate on a sparse reward, not evidence for or against IB-RL.
* Fixed counterpart (only alice learns): her sampled reward fluctuated between 0.01 and 0.33 with no trend in the same
  diagnostic; greedy alice still closes every deal on 1 seed and none on the other 2 (utility 0 throughout).
* A first run with 12 RL steps at lr 2e-3 (same warm starts) left every greedy policy exactly at the warm start (all
  rows equal to `warm_start`), so the lr was raised for the run recorded here.
* The train-vs-held-out gap is 0 in every cell because none of these policies does anything that depends on the
  counterpart. Measuring it needs a model that makes conditional offers (a small instruct model on a GPU with
  `configs/ib_rl_dealnodeal.yaml`'s settings); the tiny model only checks that the protocol runs end to end: two
  adapters, per-role rewards, advantages, optimizers and schedules, the fixed-counterpart control, and evaluation of
  a frozen alice against the scripted partner, another seed's warm start and her own training partner.
* Cost: both arms ran the same 30 RL steps on the same tasks; the co-trained arm generated more tokens (its
  degenerate messages run to the token limit) and took about twice the RL time (two adapters forwarded per step). The
  run took about 19 min on 2 busy cores with the warm starts already built; building them adds about 8 min.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rl_steps", type=int, default=30)
    parser.add_argument("--warm_start_steps", type=int, default=80)
    parser.add_argument("--num_train_tasks", type=int, default=200)
    parser.add_argument("--num_eval_tasks", type=int, default=60)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--tasks_per_step", type=int, default=4)
    parser.add_argument("--max_messages", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--quick", action="store_true", help="1 seed (seed 1's warm start as its held-out "
                        "counterpart), 3 RL steps, 20 eval tasks, 30 warm-start steps")
    parser.add_argument("--output_root", default=str(ROOT / "outputs" / "bench-ib-rl"))
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.rl_steps, args.num_eval_tasks, args.warm_start_steps = [0], 3, 20, 30
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings = settings_of(args)
    path = RESULTS / ("ib_rl_quick.json" if args.quick else "ib_rl.json")
    previous = json.loads(path.read_text())["rows"] if path.exists() else []
    rows = [r for r in previous if r.get("settings") == settings and r.get("flags") == ARMS.get(r.get("arm"))]
    done = {r["seed"] for r in rows if r["arm"] == "fixed_counterpart"}
    for index, seed in enumerate(args.seeds):
        if seed in done:
            continue
        rows = [r for r in rows if r["seed"] != seed]
        held_out_seed = args.seeds[(index + 1) % len(args.seeds)] if len(args.seeds) > 1 else seed + 1
        for row in run_seed(seed, held_out_seed, args):
            row["settings"] = settings
            rows.append(row)
        write_results(rows, settings, args.quick)
    write_results(rows, settings, args.quick)
    print(table(rows))


if __name__ == "__main__":
    main()
