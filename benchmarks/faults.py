"""The fault matrix: every kind of environment fault on every environment backend, under a real training run.

For each (backend, fault): 2 GRPO steps of the tiny model on 4 tasks × 2 episodes of `trl_agents.testing.FaultyEnv`,
one episode of every task misbehaving at its second turn in the first rollout (`run_fault_case`). Faults: the env
raises; hangs (failed by `env_step_timeout`, 1 s here); ends its process (`os._exit`: kills a `process` worker or a
Ray actor); or returns outputs that break the contract (NaN / inf / string reward, None observation, list info,
int done). Backends: `inline` (thread backend, one worker, no timeout: calls on the training thread), `thread`
(a timeout: calls on worker threads), `process`, `ray`. Not run: a hang inline (with no timeout nothing can stop
it: that is what `env_step_timeout` is for, and the pool warns after 5 minutes), and `exit` on the in-process
backends (it would end the trainer itself).

Reported per case: faults injected, episodes failed, whether the run completed its steps, recorded episodes and
episodes lost from the trajectory records (must be 0). Counts are facts, not timings: one run is enough.

    python benchmarks/faults.py            # ~2-3 min on 2 cores (Ray starts once), then ~3 min of run-level faults
    python benchmarks/faults.py --no-ray   # without the Ray backend
    python benchmarks/faults.py --no-run-faults   # the matrix only (keeps the run-level section already written)

Writes `benchmarks/results/faults.md`, ending with the run-level faults of `benchmarks/faults_run.py` (SIGTERM during
a save, a full disk, a second run into the same folder, through the CLI).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BACKENDS = ("inline", "thread", "process", "ray")
NOT_RUN = {("inline", "hang"): "no timeout to stop it", ("inline", "exit"): "would end the trainer",
           ("thread", "exit"): "would end the trainer"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-ray", action="store_true", help="leave the Ray backend out")
    parser.add_argument("--no-run-faults", action="store_true",
                        help="leave out the run-level faults (benchmarks/faults_run.py); keep their section as it is")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "faults.md"))
    args = parser.parse_args()

    import logging

    from transformers.utils import logging as hf_logging

    from trl_agents.testing import FAULTS, build_tiny_model, build_tiny_tokenizer, run_fault_case

    logging.getLogger("trl_agents").setLevel(logging.ERROR)  # the failed episodes' warnings: hundreds of lines
    hf_logging.set_verbosity_error()
    backends = [b for b in BACKENDS if not (b == "ray" and args.no_ray)]
    if "ray" in backends:
        import ray

        ray.init(include_dashboard=False, log_to_driver=False)  # once; the pools reuse it
    tokenizer = build_tiny_tokenizer(["Round of task Say something with the letter a."], vocab_size=300)
    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        for backend in backends:
            for fault in FAULTS:
                if (backend, fault) in NOT_RUN:
                    continue
                model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, seed=0)
                case = time.perf_counter()
                results[(backend, fault)] = run_fault_case(fault, backend, Path(tmp) / f"{backend}-{fault}", model,
                                                           tokenizer, step_timeout=1.0)
                r = results[(backend, fault)]
                print(f"{backend:8s} {fault:17s} faults {r['faults']} failed {r['failed_episodes']} completed "
                      f"{r['completed']} lost {r['rows_lost']} ({time.perf_counter() - case:.1f} s)", flush=True)
    lines = ["| backend | fault | faults injected | episodes failed | run completed | episodes recorded | "
             "episodes lost | error recorded (first) |", "|---|---|---|---|---|---|---|---|"]
    for backend in backends:
        for fault in FAULTS:
            if (backend, fault) in NOT_RUN:
                lines.append(f"| {backend} | {fault} | not run: {NOT_RUN[(backend, fault)]} | | | | | |")
                continue
            r = results[(backend, fault)]
            first = (r["errors"][0] if r["errors"] else r["error"] or "").replace("|", "/")
            if "broke its contract" in first:  # the task JSON (with a temporary path) is long: keep what says why
                first = "environment 'test-faulty' broke its contract on task ..., episode " + first.split(", episode ", 1)[1]
            lines.append(f"| {backend} | {fault} | {r['faults']} | {r['failed_episodes']} | "
                         f"{'yes' if r['completed'] else 'NO: ' + str(r['error'])} | {r['recorded_episodes']} | "
                         f"{r['rows_lost']} | {first[:150]} |")
    ran = list(results.values())
    summary = (
        f"{len(ran)} cases: {sum(r['faults'] for r in ran)} faults injected, {sum(r['failed_episodes'] for r in ran)} "
        f"episodes failed, {sum(r['completed'] for r in ran)}/{len(ran)} runs completed, "
        f"{sum(r['rows_lost'] for r in ran)} recorded episodes lost."
    )
    header = (
        f"Fault matrix, `python benchmarks/faults.py{' --no-ray' if args.no_ray else ''}` on {os.cpu_count()} CPU "
        f"cores ({platform.processor() or platform.machine()}), {time.perf_counter() - started:.0f} s in all.\n\n"
        "Each case: 2 GRPO steps of a tiny model on 4 tasks × 2 episodes of `FaultyEnv` (trl_agents.testing), one "
        "episode of every task misbehaving at its second turn in the first rollout, `env_step_timeout` 1 s (none "
        "inline). The first rollout's groups are each left with one healthy episode, below `min_healthy_episodes` "
        "= 2, so its step updates nothing (logged and warned); the second rollout trains. Episodes recorded: in "
        "`trajectories/*.parquet`, failed ones with their error; lost = played − recorded.\n\n"
    )
    text = header + summary + "\n\n" + "\n".join(lines) + "\n"
    print("\n" + summary)
    from faults_run import MARKER, run_all, section

    if not args.no_run_faults:
        text += "\n" + section(*run_all())
    elif Path(args.output).exists() and MARKER in Path(args.output).read_text():
        text += "\n" + MARKER + Path(args.output).read_text().split(MARKER, 1)[1]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
