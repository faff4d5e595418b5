"""What does the sandbox cost per command? Latency of `Sandbox.run` against the same command run unsandboxed.

For 1, 8 and 32 concurrent sandboxes (threads, each with its own `Sandbox`, started together), every thread runs
the same typical commands of a shell or code task in rounds: `true`, `ls -la`, `cat` of a 10 KB file, `grep -c`
over a small tree (60 files), `python3 -c 'print(1)'`. Then, at the same concurrency, the same commands run
unsandboxed, `subprocess.run(["bash", "-c", command], cwd=<a folder with the same files>)`, from the same number
of threads. It reports per-call latency (p50/p95/p99, milliseconds) of both, the overhead ratio (sandboxed p50 /
unsandboxed p50), and the start-up and close time of the sandboxes, all measured in one run, and writes the tables
to `benchmarks/results/sandbox.md` with the machine (cores, kernel, bubblewrap, Python) and the command.

    python benchmarks/sandbox.py                   # bubblewrap, 1/8/32 sandboxes: ~1 min on 2 cores
    python benchmarks/sandbox.py --quick           # fewer rounds, noisier
    python benchmarks/sandbox.py --backend none    # the no-isolation backend (same server, no bubblewrap)
    python benchmarks/sandbox.py --concurrency 1 4 --rounds 20
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trl_agents.envs.sandbox import Sandbox, bubblewrap_available

COMMANDS = {
    "true": "true",
    "ls -la": "ls -la",
    "cat 10 KB": "cat data.txt",
    "grep -c tree": "grep -rc needle tree",
    "python3 print(1)": "python3 -c 'print(1)'",
}
# Rounds per thread (each round runs every command once) at each concurrency.
DEFAULT_ROUNDS = {1: 100, 8: 25, 32: 8}
LIFECYCLES = 24  # sandboxes started and closed per concurrency level (at least one per thread)


def files() -> dict[str, str]:
    """The task files every sandbox (and the unsandboxed folder) holds: a 10 KB text and a tree of 60 small files."""
    line = "the quick brown fox jumps over the lazy dog, a needle in a haystack\n"
    tree = {f"tree/d{d}/f{f}.txt": (line * (3 + f)) for d in range(6) for f in range(10)}
    return {"data.txt": (line * 200)[:10_240], **tree}


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by the nearest-rank method, in milliseconds."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return 1000 * ordered[rank - 1]


def run_threads(count: int, work) -> list:
    """Run `work(index, barrier)` in `count` threads started together; their results, in index order."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list[BaseException] = []

    def target(index: int) -> None:
        try:
            results[index] = work(index, barrier)
        except BaseException as err:  # noqa: BLE001 — re-raised below, in the main thread
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def sandboxed(count: int, rounds: int, backend: str) -> dict[str, list[float]]:
    """Per-call seconds of each command, and `start` / `close` seconds, over `count` concurrent sandboxes."""

    def work(index: int, barrier: threading.Barrier) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        times["start"], times["close"] = [], []
        for _ in range(max(1, LIFECYCLES // count) - 1):  # start-up and close alone, all threads at once
            barrier.wait()
            started = time.perf_counter()
            box = Sandbox(backend=backend)
            times["start"].append(time.perf_counter() - started)
            box.run("true")
            barrier.wait()
            started = time.perf_counter()
            box.close()
            times["close"].append(time.perf_counter() - started)
        barrier.wait()
        started = time.perf_counter()
        box = Sandbox(backend=backend)
        times["start"].append(time.perf_counter() - started)
        try:
            for path, content in files().items():
                box.write_file(path, content)
            for name, command in COMMANDS.items():  # warm-up, not counted
                assert box.run(command).exit_code == 0, (name, box.run(command))
            barrier.wait()
            for _ in range(rounds):
                for name, command in COMMANDS.items():
                    started = time.perf_counter()
                    box.run(command)
                    times[name].append(time.perf_counter() - started)
            barrier.wait()
        finally:
            started = time.perf_counter()
            box.close()
            times["close"].append(time.perf_counter() - started)
        return times

    return merge(run_threads(count, work))


def unsandboxed(count: int, rounds: int) -> dict[str, list[float]]:
    """Per-call seconds of each command run with `subprocess.run(["bash", "-c", command], cwd=folder)`."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}

    def work(index: int, barrier: threading.Barrier) -> dict[str, list[float]]:
        folder = tempfile.mkdtemp(prefix="trl-agents-sandbox-bench-")
        try:
            for path, content in files().items():
                Path(folder, path).parent.mkdir(parents=True, exist_ok=True)
                Path(folder, path).write_text(content)
            times: dict[str, list[float]] = {name: [] for name in COMMANDS}
            for command in COMMANDS.values():  # warm-up
                subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, env=env, check=True)
            barrier.wait()
            for _ in range(rounds):
                for name, command in COMMANDS.items():
                    started = time.perf_counter()
                    subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, env=env)
                    times[name].append(time.perf_counter() - started)
            return times
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return merge(run_threads(count, work))


def merge(per_thread: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    merged: dict[str, list[float]] = {}
    for times in per_thread:
        for name, values in times.items():
            merged.setdefault(name, []).extend(values)
    return merged


def machine(backend: str) -> str:
    bwrap = shutil.which("bwrap")
    version = "not installed"
    if bwrap:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip() or "unknown"
    return (f"{os.cpu_count()} CPU cores, Linux {platform.release()}, {version}, Python {platform.python_version()}, "
            f"backend `{backend}`, running as {'root' if os.geteuid() == 0 else 'a regular user'}; "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per thread at every concurrency (default: 100 / 25 / 8 at 1 / 8 / 32)")
    parser.add_argument("--quick", action="store_true", help="a quarter of the rounds: faster, noisier")
    parser.add_argument("--backend", choices=["bwrap", "none"], default="bwrap")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "sandbox.md"))
    args = parser.parse_args()
    if args.backend == "bwrap" and not bubblewrap_available():
        sys.exit("bubblewrap is not installed (apt-get install bubblewrap); or run with --backend none")

    began = time.perf_counter()
    latency = ["| sandboxes | command | calls | p50 (ms) | p95 (ms) | p99 (ms) | unsandboxed p50 (ms) | "
               "unsandboxed p95 (ms) | unsandboxed p99 (ms) | overhead (p50 ratio) |", "|---" * 10 + "|"]
    lifecycle = ["| sandboxes | started | start p50 (ms) | start p95 (ms) | start max (ms) | close p50 (ms) | "
                 "close p95 (ms) |", "|---" * 7 + "|"]
    for count in args.concurrency:
        rounds = args.rounds or DEFAULT_ROUNDS.get(count, max(3, 40 // count))
        if args.quick:
            rounds = max(2, rounds // 4)
        boxed = sandboxed(count, rounds, args.backend)
        plain = unsandboxed(count, rounds)
        for name in COMMANDS:
            ours, theirs = boxed[name], plain[name]
            row = [percentile(ours, q) for q in (0.5, 0.95, 0.99)] + [percentile(theirs, q) for q in (0.5, 0.95, 0.99)]
            latency.append(f"| {count} | `{COMMANDS[name]}` | {len(ours)} | "
                           + " | ".join(f"{value:.1f}" for value in row) + f" | {row[0] / row[3]:.2f}x |")
            print(latency[-1], flush=True)
        starts, closes = boxed["start"], boxed["close"]
        lifecycle.append(f"| {count} | {len(starts)} | {percentile(starts, 0.5):.1f} | {percentile(starts, 0.95):.1f} | "
                         f"{1000 * max(starts):.1f} | {percentile(closes, 0.5):.1f} | {percentile(closes, 0.95):.1f} |")
        print(lifecycle[-1], flush=True)
    elapsed = time.perf_counter() - began

    command = "python benchmarks/sandbox.py " + " ".join(sys.argv[1:])
    text = (
        f"# Sandbox latency (`{command.strip()}`)\n\n"
        f"Machine: {machine(args.backend)}. Measured in {elapsed:.0f} s.\n\n"
        "Per-call wall time of `Sandbox.run(command)` as the trainer sees it (request, `bash -c` in the sandbox with "
        "its limits, output, the kill of every leftover process, answer), from N threads each driving its own "
        "sandbox at once; unsandboxed: `subprocess.run([\"bash\", \"-c\", command], cwd=folder)` from N threads. "
        "Overhead = sandboxed p50 / unsandboxed p50. With N above the core count, both queue for the CPUs. "
        "Percentiles by nearest rank over `calls` calls (p99 of a few hundred calls is close to the maximum).\n\n"
        "## Per-call latency\n\n" + "\n".join(latency) + "\n\n"
        "## Start-up and close\n\n"
        "Start: `Sandbox()` until its server answers (bubblewrap, namespaces, tmpfs, the server's Python); N "
        f"sandboxes started at once, {LIFECYCLES} or more per level. Close: `close()` until every process of the "
        "sandbox is gone.\n\n"
        + "\n".join(lifecycle) + "\n"
    )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(f"\nwritten to {args.output} ({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
