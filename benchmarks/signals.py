"""What does each model signal cost, as a share of a training step? (a script, not a test)

Trains plain GRPO and each signal-bearing trainer for a few steps on the SAME tiny setting, in one process: the
offline tiny Qwen2-style model (`trl_agents.testing`, rebuilt from seed 0 for every run), a tokenizer trained on
Search-QA texts, the same Search-QA tasks in the same order, the same rollout and batch settings (step rows).
Search-QA has `privileged_context()` (the reasoning chain and the gold answer: the teacher's privileged view). Runs:

* GRPO (`AgentGRPOTrainer`): no model signal, the reference step;
* SDAR (`teacher="current"`): `teacher_logprobs`, privileged prompts rendered + one no-grad forward over them and the
  sampled actions;
* OPSD, `opsd_loss="jsd"`: `teacher_prompt` renders the privileged prompts only; the real cost, the teacher forward
  (the frozen step-0 copy) over them, runs inside the loss, and is timed here by wrapping `teacher_logits`. OPSD also
  skips TRL's policy loss (`policy_loss_coef=0`) and runs its own student forward for the JSD's logits, so its step
  is compared with GRPO's as a whole;
* GRPO + `entropy`: a GRPO subclass declaring the `entropy` signal (no built-in trainer needs it after the rollout:
  BPO's branching topology computes it mid-rollout), one no-grad forward;
* BiPACE, `hidden_state_source="forward"`: `hidden_states` from an extra no-grad forward over the step prompts, cut
  after the layer (the paper's way);
* BiPACE, `hidden_state_source="rollout"`: `hidden_states` kept from the generator's own prefill: ~0 by design;
* OCSD: `ocsd_residual`, two replay views (Full, Observation-Ablated) of the ⌈20 %⌉ most uncertain steps of each
  episode, one no-grad forward over both;
* ADRS and PCSD: `teacher_logprobs` under the privileged view, as SDAR (ADRS: the current policy; PCSD: the frozen
  step-0 copy);
* GRSD: reflections (one batched generation per episode), the policy judging them (one batched generation), the
  guidance of mixed groups (one more), then teacher and student scores of the mixed groups' steps; its auxiliary
  loss forwards the reflections once more;
* EnvRL: no forward signal (`envrl_examples` only builds the examples); its cost is the auxiliary loss, an extra
  forward and backward over the next-observation and inverse-dynamics examples of the step rows;
* Dark Room, on the same tasks wrapped by `predict` (the agent adds `<predict>...</predict>` to its answer): the
  reward arm scores every prediction against the observation that followed inside its credit (a string
  similarity); the auxiliary arm is EnvRL's next-observation loss.

Per step, from `trainer.state.log_history` (logging_steps 1): TRL's `step_time` (the wall time of `training_step`:
rollout, signals, credit, loss forward and backward; not the optimizer step); timed on the side: the rollout
(`RolloutEngine.run`), every model signal of the step together (`compute_signals`: for GRSD its generations and
judge too), the credit (`compute_advantages`) and the method's auxiliary loss (`compute_auxiliary_loss`, forward
only; its backward is in the step). The runs go in `--rounds` interleaved rounds (GRPO,
SDAR, ..., then again), after one untimed warm-up run; a round's first step pays one-off warm-ups and is left out.
A 2-core machine shared with other jobs has bursts of contention that make a step several times slower (seen: 0.4 s
steps taking 4-6 s); they only ever slow steps down, so every figure of a run is the mean over the same steps, the
faster half of its counted steps by step time (interleaving spreads the bursts over all runs alike; the step's
shape does not change from step to step here, so this picks quiet steps, not small ones). Reported per signal:
seconds per step, its share of that run's step (%), and the run's step time over GRPO's, with the step's shape
(episodes, turns per episode, training rows, tokens forwarded): a forward signal's cost scales with the rows and
tokens it forwards.

Read the shares with care. The papers' overheads are for big models on GPUs (BiPACE's README: 11.3 % of a step for
its hidden-state pass; OCSD's 1.4 % and ADRS's ≈ 12 %, for the methods later issues add), where a step is dominated
by generating long actions token by token and a no-grad forward over the batch is comparatively cheap. On the tiny
CPU setting the rollout is a third of GRPO's step (at most 8 new tokens per turn from a 2-layer model) and a forward
over the batch's ~15k prompt tokens is not small next to it, so forward-bound signals take a larger share here than
they would there: these figures show what each signal does and how it scales, not what it costs on a real run.

    python benchmarks/signals.py               # ~2 min on 2 cores
    python benchmarks/signals.py --rounds 1    # quicker, noisier

Benchmarks never assert on time; the table is written to `benchmarks/results/signals.md`.
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

ENV = "searchqa"


def build_runs():
    """(label, trainer class, config class, config overrides, signal name) of every run; GRPO first."""
    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.trainers.adrs import ADRSConfig, ADRSTrainer
    from trl_agents.trainers.bipace import BiPACEConfig, BiPACETrainer
    from trl_agents.trainers.dark_room import DarkRoomConfig, DarkRoomTrainer
    from trl_agents.trainers.envrl import EnvRLConfig, EnvRLTrainer
    from trl_agents.trainers.grsd import GRSDConfig, GRSDTrainer
    from trl_agents.trainers.ocsd import OCSDConfig, OCSDTrainer
    from trl_agents.trainers.opsd import OPSDConfig, OPSDTrainer
    from trl_agents.trainers.pcsd import PCSDConfig, PCSDTrainer
    from trl_agents.trainers.sdar import SDARConfig, SDARTrainer

    class EntropyGRPOTrainer(AgentGRPOTrainer):
        """GRPO that declares the `entropy` model signal."""

        methods = ()
        signals = ("entropy",)

    hidden = {"hidden_layer": -1}  # BiPACE's default (-12) is for Qwen2.5-1.5B; the tiny model has 2 layers
    predict = {"env_name": "predict", "env_kwargs": {"inner": ENV}}  # the same tasks, answers with a prediction
    return [
        ("GRPO", AgentGRPOTrainer, AgentGRPOConfig, {}, None),
        ("SDAR, teacher current", SDARTrainer, SDARConfig, {}, "teacher_logprobs"),
        ("OPSD jsd, teacher frozen", OPSDTrainer, OPSDConfig, {"opsd_loss": "jsd"}, "teacher_prompt"),
        ("GRPO + entropy", EntropyGRPOTrainer, AgentGRPOConfig, {}, "entropy"),
        ("BiPACE, source forward", BiPACETrainer, BiPACEConfig, {**hidden, "hidden_state_source": "forward"},
         "hidden_states"),
        ("BiPACE, source rollout", BiPACETrainer, BiPACEConfig, {**hidden, "hidden_state_source": "rollout"},
         "hidden_states"),
        ("OCSD", OCSDTrainer, OCSDConfig, {}, "ocsd_residual"),
        # ADRS's teacher term starts after its 20-step warm-up: no warm-up here, so that its credit runs too.
        ("ADRS", ADRSTrainer, ADRSConfig, {"adrs_warmup_steps": 0}, "teacher_logprobs"),
        ("PCSD, teacher frozen", PCSDTrainer, PCSDConfig, {}, "teacher_logprobs"),
        ("GRSD, policy judge", GRSDTrainer, GRSDConfig, {}, "reflections, judge, guidance, teacher"),
        ("EnvRL", EnvRLTrainer, EnvRLConfig, {}, None),
        ("Dark Room, reward arm", DarkRoomTrainer, DarkRoomConfig, {**predict, "dark_room_arm": "reward"}, None),
        ("Dark Room, aux arm", DarkRoomTrainer, DarkRoomConfig, {**predict, "dark_room_arm": "aux"}, None),
    ]


def train_one(trainer_class, config_class, overrides, tokenizer, tasks, args, output_dir, steps=None):
    """Train one run; return one dict per step: the step's log entry plus `rollout_seconds` and, for OPSD's jsd
    loss, `teacher_seconds` (the teacher forward inside the loss)."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from trl_agents.testing import build_tiny_model, tiny_training_config

    config = tiny_training_config(
        config_class, output_dir, max_steps=steps or args.steps, max_turns=args.turns,
        max_completion_length=args.new_tokens, per_device_train_batch_size=args.batch,
        num_generations=args.generations, **overrides,
    )
    if config.env_name == "predict":  # the same tasks, played through the prediction wrapper
        tasks = [{**task, "env": "predict"} for task in tasks]
    trainer = trainer_class(model=build_tiny_model(tokenizer, seed=0), args=config,
                            train_dataset=Dataset.from_list(tasks), processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # no log line per step: the script prints its own
    extra: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))

    def timed(fn, key):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:  # the step being computed is global_step + 1 (logged under that step)
                extra[key][trainer.state.global_step + 1] += time.perf_counter() - start

        return wrapper

    make_engine = trainer._engine  # a benchmark may look inside: time the rollout on its own

    def engine():
        built = make_engine()
        built.run = timed(built.run, "rollout_seconds")
        return built

    trainer._engine = engine
    trainer.compute_signals = timed(trainer.compute_signals, "signals_seconds")
    trainer.compute_auxiliary_loss = timed(trainer.compute_auxiliary_loss, "aux_seconds")
    trainer.compute_advantages = timed(trainer.compute_advantages, "credit_seconds")
    if hasattr(trainer, "teacher_logits"):
        trainer.teacher_logits = timed(trainer.teacher_logits, "teacher_seconds")
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    return [{**h, **{key: values[h["step"]] for key, values in extra.items()}} for h in logs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4,
                        help="training steps per run and round (the first is not counted)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds of all runs")
    parser.add_argument("--turns", type=int, default=4, help="max_turns")
    parser.add_argument("--new-tokens", type=int, default=8, help="max_completion_length (new tokens per turn)")
    parser.add_argument("--batch", type=int, default=16, help="per_device_train_batch_size (episodes per step)")
    parser.add_argument("--generations", type=int, default=4, help="num_generations (episodes per task)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "signals.md"))
    args = parser.parse_args()

    import torch

    from trl_agents.envs import get_env_class
    from trl_agents.testing import build_tiny_model, build_tiny_tokenizer, env_corpus

    started = time.perf_counter()
    tokenizer = build_tiny_tokenizer(env_corpus(ENV, num_tasks=64), vocab_size=1024)
    num_parameters = sum(p.numel() for p in build_tiny_model(tokenizer, seed=0).parameters())
    tasks = get_env_class(ENV).task_split("train", 64)
    runs = build_runs()
    print(f"tiny model: {num_parameters / 1e3:.0f}k parameters; env {ENV}; {len(runs)} runs x {args.rounds} rounds x "
          f"{args.steps} steps", flush=True)

    steps = defaultdict(list)  # label -> per-step dicts (after each round's first step)
    with tempfile.TemporaryDirectory(prefix="bench-signals-") as tmp:
        label, trainer_class, config_class, overrides, _ = runs[0]
        train_one(trainer_class, config_class, overrides, tokenizer, tasks, args, Path(tmp) / "warm-up", steps=2)
        for round_index in range(args.rounds):
            for index, (label, trainer_class, config_class, overrides, signal) in enumerate(runs):
                logs = train_one(trainer_class, config_class, overrides, tokenizer, tasks, args,
                                 Path(tmp) / f"{round_index}-{index}")
                previous = [0.0] + [h["num_tokens"] for h in logs[:-1]]
                for h, before in zip(logs, previous, strict=True):
                    h["tokens"] = h["num_tokens"] - before  # num_tokens is cumulative
                steps[label].extend(logs[1:] if len(logs) > 1 else logs)
                print(f"round {round_index + 1} {label}: step_time "
                      f"{[round(h['step_time'], 3) for h in logs]}", flush=True)

    results = []
    for label, _, _, _, signal in runs:
        counted = len(steps[label])
        logs = sorted(steps[label], key=lambda h: h["step_time"])[: (counted + 1) // 2]  # the quiet half

        def m(key, logs=logs):
            values = [h[key] for h in logs if key in h]
            return statistics.mean(values) if values else float("nan")

        results.append({
            "label": label, "signal": signal, "step": m("step_time"), "rollout": m("rollout_seconds"),
            "signal_s": m("signals_seconds") if signal else None, "aux_s": m("aux_seconds"),
            "credit_s": m("credit_seconds"),
            "teacher_s": m("teacher_seconds") if any("teacher_seconds" in h for h in logs) else None,
            "episodes": m("rollout/episodes"), "turns": m("env/episode_length"), "rows": m("train_rows"),
            "tokens": m("tokens"), "generated": m("rollout/generated_tokens"), "n": len(logs), "counted": counted,
        })
    base = results[0]["step"]
    lines = [
        ("| run | signal | signal s/step | share of step | credit s/step | aux loss s/step (forward) | share | step s "
         "| x GRPO step | rollout s | episodes | turns/episode | rows | tokens (prompt + completion) | generated tokens |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["signal"] is None:
            signal_cell, seconds, share = "—", "—", "—"
        else:
            signal_cell = f"`{r['signal']}`" if " " not in r["signal"] else r["signal"]
            seconds, share = f"{r['signal_s']:.4f}", f"{100 * r['signal_s'] / r['step']:.2f} %"
        aux = r["aux_s"] if r["aux_s"] == r["aux_s"] else 0.0  # nan: the hook never ran
        lines.append(
            f"| {r['label']} | {signal_cell} | {seconds} | {share} | {r['credit_s']:.4f} | {aux:.4f} | "
            f"{100 * aux / r['step']:.2f} % | "
            f"{r['step']:.3f} | {r['step'] / base:.2f} | {r['rollout']:.3f} | {r['episodes']:.0f} | "
            f"{r['turns']:.1f} | {r['rows']:.0f} | {r['tokens']:.0f} | {r['generated']:.0f} |"
        )
        if r["teacher_s"] is not None:
            lines.append(
                f"| {r['label']} | teacher forward in the loss | {r['teacher_s']:.4f} | "
                f"{100 * r['teacher_s'] / r['step']:.2f} % | | | | | | | | | | | |"
            )
    table = "\n".join(lines)
    header = (
        f"Model signals' cost on the tiny setting, `python benchmarks/signals.py --steps {args.steps} --rounds "
        f"{args.rounds} --turns {args.turns} --new-tokens {args.new_tokens} --batch {args.batch} --generations "
        f"{args.generations}` on {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), torch "
        f"{torch.__version__}.\n\n"
        f"Tiny Qwen2-style model ({num_parameters / 1e3:.0f}k parameters, rebuilt from seed 0 for every run), "
        f"{ENV} tasks (the same ones in the same order for every run), {args.batch} episodes per step "
        f"({args.generations} per task), at most {args.turns} turns of at most {args.new_tokens} new tokens, step "
        f"rows. Means over the faster half ({results[0]['n']}) of each run's {results[0]['counted']} counted steps "
        f"({args.rounds} interleaved rounds of {args.steps} steps, each round's first step left out; the slower half "
        "holds the bursts of contention of a shared machine). Step s: TRL's `step_time` (rollout, signals, credit, "
        "loss forward and backward; not the optimizer step). Signal s: every model signal of the step "
        "(`compute_signals`; GRSD's reflection, judge and guidance generations included). Credit s: "
        "`compute_advantages` (the Dark Room reward arm scores its predictions there). Aux loss s: the method's "
        "`compute_auxiliary_loss` calls, their forward only (the backward is in the step). Shares: over the run's own "
        "step. Rollout s: `RolloutEngine.run`, inside the step. Rows: step rows trained (one per episode step); tokens: "
        "their prompt + completion tokens (teacher prompts are longer: they add the privileged text).\n\n"
    )
    grpo = results[0]
    notes = (
        f"\n\nGRPO's rollout takes {grpo['rollout']:.3f} s of its {grpo['step']:.3f} s step "
        f"({100 * grpo['rollout'] / grpo['step']:.0f} %); the rest is the loss forward and backward over "
        f"{grpo['rows']:.0f} rows. The papers' overheads are for big models on GPUs, where generating long actions "
        "token by token dominates a step and a no-grad forward over the batch is comparatively cheap (BiPACE's "
        "README: 11.3 % of a step for its hidden-state pass; OCSD's paper: 1.4 % (7.52 s of dual-view scoring in a "
        "544.7 s iteration, Qwen3-4B, 8 A100s); ADRS's log: ≈ 12 % (a 44.4 s teacher forward in a 356 s step, "
        "Qwen2.5-3B)). "
        "A tiny CPU model generating at most "
        f"{args.new_tokens} tokens per turn inflates the share of every forward-bound signal: read these as what each "
        "signal does and how it scales with rows and tokens, not as its cost on a real run."
    )
    print("\n" + table + notes)
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(header + table + notes + "\n")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
