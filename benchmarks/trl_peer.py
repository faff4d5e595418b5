"""What does trl-agents cost beyond TRL? AgentGRPOTrainer (multi-turn, step rows) against TRL's own single-turn
GRPOTrainer on the same tiny model, in one process, plus the breakdown of an agent step and its cost per turn against
the horizon.

1. **Peer comparison.** TRL's `GRPOTrainer`: 16 single-turn completions per step (2 prompts × 8) of FrozenLake's
   first observation, a reward function on the text. `AgentGRPOTrainer`: 16 FrozenLake episodes per step (2 tasks ×
   8) of up to 6 turns, step rows. Same model, tokenizer, `max_completion_length` per generation, learning rate,
   GRPO loss. Per step: seconds per generated token and per processed token (the prompt + completion tokens that went
   through generation and training: `num_tokens`, TRL's own count), and their ratio (agent / TRL); and the padded
   tokens (rows × width) of the training forwards (TRL's `_get_per_token_logps_and_entropies` calls: the loss, and
   the old/reference log-probs where they run), which padding makes larger than the processed ones. Ours twice, in
   the same process: with `length_grouped_forwards` (the default: rows forwarded in groups of similar length, each
   trimmed of its padding) and without it (TRL's one forward per micro-batch).
2. **Breakdown of an agent step**, timed by wrapping the trainer's parts: generation (the generator's calls),
   environments (the rest of the rollout), signals, credit, rows and padding, old/reference log-probs, loss forward
   and backward (the rest of TRL's `step_time`), optimizer, records and logging.
3. **Cost per turn against the horizon** (Sokoban, where a random policy seldom ends an episode early; 5, 20, 50
   turns): step seconds per turn played, step rows vs conversation rows. Step rows cost the same per turn whatever
   the horizon; a conversation row grows with the episode, so its cost per turn grows.

    python benchmarks/trl_peer.py              # ~6 min on 2 cores
    python benchmarks/trl_peer.py --steps 4    # quicker, noisier

Writes `benchmarks/results/trl_peer.md`. Benchmarks never assert on time; every ratio is measured in one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PARTS = ("generation", "environments", "signals", "credit", "rows and padding", "old/ref log-probs",
         "loss forward + backward", "optimizer", "records", "logging")


class ForwardTokens:
    """Padded tokens (rows × width) of the training forwards (TRL's `_get_per_token_logps_and_entropies`), per
    optimizer step (keyed by the step being computed); `close()` puts TRL's method back."""

    def __init__(self, trainer):
        from trl import GRPOTrainer

        self.tokens: dict[int, int] = defaultdict(int)
        self.original = original = GRPOTrainer._get_per_token_logps_and_entropies

        def counted(this, model, input_ids, *args, **kwargs):
            self.tokens[trainer.state.global_step + 1] += input_ids.numel()
            return original(this, model, input_ids, *args, **kwargs)

        GRPOTrainer._get_per_token_logps_and_entropies = counted

    def close(self):
        from trl import GRPOTrainer

        GRPOTrainer._get_per_token_logps_and_entropies = self.original


class Timer:
    """Seconds per part, per optimizer step (keyed by the step being computed)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.seconds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def wrap(self, owner, name: str, part: str):
        function = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[self.trainer.state.global_step + 1][part] += time.perf_counter() - start

        setattr(owner, name, timed)


def step_logs(trainer) -> list[dict]:
    """The trainer's per-step log entries, each with `processed`: the tokens of that step (`num_tokens` counts them
    since the start)."""
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    previous = 0.0
    for h in logs:
        h["processed"] = h["num_tokens"] - previous
        previous = h["num_tokens"]
    return logs


def common_settings(args) -> dict:
    return {"max_steps": args.steps, "per_device_train_batch_size": 16, "num_generations": 8, "learning_rate": 1e-4,
            "max_completion_length": 3, "logging_steps": 1, "report_to": "none", "save_strategy": "no",
            "disable_tqdm": True, "gradient_checkpointing": False, "seed": 0, "loss_type": "dapo", "beta": 0.0}


def run_trl(model_dir, tokenizer, args, output_dir) -> list[dict]:
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_agents.envs import make_env

    env = make_env("frozenlake")
    prompts = []
    for seed in range(64):
        observation = env.reset({"seed": seed})
        prompts.append([{"role": "system", "content": env.instructions}, {"role": "user", "content": observation}])

    def reward(completions, **kwargs):  # a stand-in task: answer "right"
        return [1.0 if "right" in (c[0]["content"] if isinstance(c, list) else c) else 0.0 for c in completions]

    config = GRPOConfig(output_dir=str(output_dir), **common_settings(args), use_cpu=True, bf16=False)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=[reward], args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": prompts}))
    trainer.remove_callback(PrinterCallback)
    forwards = ForwardTokens(trainer)
    try:
        trainer.train()
    finally:
        forwards.close()
    logs = step_logs(trainer)
    for h in logs:
        h["generated"] = h["completions/mean_length"] * 16
        h["padded"] = forwards.tokens.get(h["step"], 0)
    return logs


def run_agent(model_dir, tokenizer, args, output_dir, env="frozenlake", max_turns=6, row_format="step",
              breakdown=False, grouped=True) -> list[dict]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.envs import get_env_class
    from trl_agents.trainers import agent_grpo

    config = AgentGRPOConfig(output_dir=str(output_dir), **common_settings(args), env_name=env, max_turns=max_turns,
                             history_length=2, row_format=row_format, max_prompt_length=None,
                             length_grouped_forwards=grouped)
    trainer = AgentGRPOTrainer(model=model_dir, args=config, processing_class=tokenizer,
                               train_dataset=Dataset.from_list(get_env_class(env).task_split("train", 64)))
    trainer.remove_callback(PrinterCallback)
    timer = Timer(trainer)
    if breakdown:
        timer.wrap(trainer.generator, "generate", "generation")
        make_engine = trainer._engine  # time the rollout as a whole; environments = rollout − generation

        def engine():
            built = make_engine()
            timer.wrap(built, "run", "rollout")
            return built

        trainer._engine = engine
        for name, part in (("compute_signals", "signals"), ("compute_advantages", "credit"),
                           ("_add_old_and_ref_logps", "old/ref log-probs"),
                           ("_save_trajectories", "records"), ("_log_rollout", "logging")):
            timer.wrap(trainer, name, part)
        timer.wrap(agent_grpo, "pad_rows", "rows and padding")  # a stage function the trainer calls

        class OptimizerTimer(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                self.start = time.perf_counter()

            def on_optimizer_step(self, args, state, control, **kwargs):
                timer.seconds[state.global_step + 1]["optimizer"] += time.perf_counter() - self.start

        trainer.add_callback(OptimizerTimer())
    forwards = ForwardTokens(trainer)
    try:
        trainer.train()
    finally:
        forwards.close()
    logs = step_logs(trainer)
    for h in logs:
        h["generated"] = h["rollout/generated_tokens"]
        h["padded"] = forwards.tokens.get(h["step"], 0)
        h["parts"] = dict(timer.seconds.get(h["step"], {}))
    return logs


def mean(logs, key):
    return statistics.mean(h[key] for h in logs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first two are not counted)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "trl_peer.md"))
    parser.add_argument("--horizons", default="5,20,50",
                        help="Sokoban horizons of the cost-per-turn table, comma-separated ('' = no table)")
    args = parser.parse_args()
    horizon_list = [int(h) for h in args.horizons.split(",") if h.strip()]

    import torch
    from transformers.utils import logging as hf_logging

    from trl_agents.testing import build_tiny_model, build_tiny_tokenizer, env_corpus

    hf_logging.set_verbosity_error()
    started = time.perf_counter()
    tokenizer = build_tiny_tokenizer(env_corpus("frozenlake", num_tasks=64) + env_corpus("sokoban", num_tasks=16),
                                     vocab_size=1024)
    with tempfile.TemporaryDirectory(prefix="bench-trl-peer-") as tmp:
        model_dir = os.path.join(tmp, "model")
        model = build_tiny_model(tokenizer, hidden_size=128, num_layers=2, seed=0)
        num_parameters = sum(p.numel() for p in model.parameters())
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        trl_logs = run_trl(model_dir, tokenizer, args, Path(tmp) / "trl")[2:]
        agent_logs = run_agent(model_dir, tokenizer, args, Path(tmp) / "agent", breakdown=True)[2:]
        ungrouped_logs = run_agent(model_dir, tokenizer, args, Path(tmp) / "ungrouped", grouped=False)[2:]
        horizons = {}
        for horizon in horizon_list:
            for row_format in ("step", "conversation"):
                logs = run_agent(model_dir, tokenizer, argparse.Namespace(steps=3), Path(tmp) / f"h{horizon}{row_format}",
                                 env="sokoban", max_turns=horizon, row_format=row_format)[1:]
                horizons[(horizon, row_format)] = logs
                print(f"horizon {horizon} {row_format}: {mean(logs, 'step_time'):.2f} s per step", flush=True)

    rows = []
    for label, logs in (("TRL GRPOTrainer, single turn", trl_logs), ("AgentGRPOTrainer, 6-turn FrozenLake", agent_logs),
                        ("AgentGRPOTrainer, `length_grouped_forwards=False`", ungrouped_logs)):
        step = mean(logs, "step_time")
        rows.append((label, step, mean(logs, "generated"), mean(logs, "processed"), mean(logs, "padded")))
    peer = [
        "| trainer | step s | generated tokens / step | processed tokens / step | padded tokens / step in training "
        "forwards | ms per generated token | ms per processed token |", "|---|---|---|---|---|---|---|",
    ]
    for label, step, generated, processed, padded in rows:
        peer.append(f"| {label} | {step:.3f} | {generated:.0f} | {processed:.0f} | {padded:.0f} | "
                    f"{1000 * step / generated:.2f} | {1000 * step / processed:.4f} |")
    (_, trl_step, trl_gen, trl_proc, _) = rows[0]
    for (label, ag_step, ag_gen, ag_proc, _), name in zip(rows[1:], ("agent / TRL", "agent without grouping / TRL")):
        ratio_gen = (ag_step / ag_gen) / (trl_step / trl_gen)
        ratio_proc = (ag_step / ag_proc) / (trl_step / trl_proc)
        peer.append(f"| **{name}** | {ag_step / trl_step:.2f} | | | | **{ratio_gen:.2f}×** | **{ratio_proc:.2f}×** |")

    parts = defaultdict(list)
    for h in agent_logs:
        p = h["parts"]
        p["environments"] = p.get("rollout", 0.0) - p.get("generation", 0.0)
        timed = sum(v for k, v in p.items() if k in PARTS and k != "optimizer")
        p["loss forward + backward"] = h["step_time"] - timed  # step_time holds all but the optimizer
        for part in PARTS:
            parts[part].append(p.get(part, 0.0))
    total = sum(statistics.mean(parts[part]) for part in PARTS)
    breakdown = ["| part of an agent step | s | share |", "|---|---|---|"]
    for part in PARTS:
        value = statistics.mean(parts[part])
        breakdown.append(f"| {part} | {value:.4f} | {100 * value / total:.1f} % |")
    breakdown.append(f"| **total (step_time + optimizer)** | {total:.4f} | 100 % |")

    horizon_lines = ["| horizon (turns) | row format | turns played / episode | rows / step | step s | "
                     "ms per turn played |", "|---|---|---|---|---|---|"]
    for (horizon, row_format), logs in horizons.items():
        turns = mean(logs, "env/episode_length") * 16
        horizon_lines.append(f"| {horizon} | {row_format} | {mean(logs, 'env/episode_length'):.1f} | "
                             f"{mean(logs, 'train_rows'):.0f} | {mean(logs, 'step_time'):.3f} | "
                             f"{1000 * mean(logs, 'step_time') / turns:.2f} |")
    command = f"python benchmarks/trl_peer.py --steps {args.steps}" + (
        f" --horizons {args.horizons}" if args.horizons != "5,20,50" else "")
    header = (
        f"trl-agents against TRL, `{command}` on {os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"{time.perf_counter() - started:.0f} "
        f"s in all. A {num_parameters / 1e3:.0f}k-parameter Qwen2-style model, the same for every run; means over "
        f"steps 3-{args.steps} of each run (the first two pay warm-ups).\n\n"
        "## Peer comparison\n\n16 single-turn completions (TRL) against 16 episodes of up to 6 turns (ours), at most "
        "3 new tokens per generation, GRPO (`dapo` loss, no KL). Processed tokens: TRL's `num_tokens` (prompt + "
        "completion tokens of the training rows; ours are step rows, one per turn). Padded tokens: rows × width of "
        "every training forward (here the loss only: the old log-probs are not needed, no KL), padding included. "
        "The runs are one after the other in one process; on a shared machine, compare ratios of one run.\n\n"
    )
    text = (header + "\n".join(peer) + "\n\n## Where an agent step's time goes\n\nThe 6-turn FrozenLake run above "
            "(with `length_grouped_forwards`), "
            "its parts timed by wrapping the trainer's methods (loss forward + backward: TRL's `step_time` minus "
            "the other timed parts).\n\n" + "\n".join(breakdown) +
            "\n" + ("\n## Cost per turn against the horizon\n\nSokoban, 16 episodes (2 tasks × 8) of up to `horizon` "
            "turns, history window 2 in step rows; 2 steps counted per run.\n\n" + "\n".join(horizon_lines) + "\n"
            if horizons else ""))
    print("\n" + text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
