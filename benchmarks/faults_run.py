"""Run-level faults: what stops or disturbs a whole `trl-agents train` job, run through the CLI as a user runs it.

Cases (each a tiny Sokoban run, 4 steps with a checkpoint after each, seed 0, compared with an uninterrupted run of
the same command):

* `SIGTERM during a save`: SIGTERM the moment `checkpoint-2/` appears (a cloud preemption while a checkpoint is
  written), then `--resume_from_checkpoint true`.
* `full disk`: the run's folder on a 5 MB tmpfs that fills up while a checkpoint is written (needs root and `mount -t
  tmpfs`; else a patched `torch.save` fails with ENOSPC halfway through checkpoint-2's optimizer.pt: the table says
  which), then the disk grows (or the patch is gone) and `--resume_from_checkpoint true`.
* `second run into the same folder`: a second `trl-agents train` (seed 1) into the folder of a run in progress.

Reported per case: the first run's exit status and its last line, whether the job completed (or resumed to the end),
rows recorded, rows lost and rows repeated against the uninterrupted run (by global step, episode and turn: lost
must be 0).

    python benchmarks/faults_run.py     # ~3 min on 2 cores; rewrites this section of benchmarks/results/faults.md

`benchmarks/faults.py` (the environment fault matrix) writes this section too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from trl_agents.testing import HELD_OPEN_TRAIN, failing_save_train  # noqa: E402

MARKER = "## Run-level faults"
STEPS = 4
TRAIN = ["--config", "gigpo_sokoban_tiny", "--max_steps", str(STEPS), "--save_strategy", "steps", "--save_steps",
         "1", "--num_train_tasks", "40", "--num_eval_tasks", "4", "--warm_start_steps", "0"]

ENOSPC_WRITER = failing_save_train('OSError(errno.ENOSPC, "No space left on device")')
HELD_OPEN = HELD_OPEN_TRAIN


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TRL_EXPERIMENTAL_SILENCE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    return env


def _command(out: Path, *extra: str, code: str | None = None, seed: int = 0) -> list[str]:
    head = ["-c", code] if code else ["-m", "trl_agents.cli", "train"]
    return [sys.executable, *head, *TRAIN, "--seed", str(seed), "--output_dir", str(out), *extra]


def _run(out: Path, home: Path, *extra: str, code: str | None = None, seed: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run(_command(out, *extra, code=code, seed=seed), env=_env(home), capture_output=True, text=True,
                          timeout=900, check=False)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and "it/s]" not in line
             and "s/it]" not in line]
    return lines[-1] if lines else ""


def _rows(out: Path) -> list[tuple]:
    from trl_agents.records import load_trajectories

    table = load_trajectories(str(out))
    return list(zip(table["global_step"], table["episode_uid"], table["step"], strict=True))


def _compare(reference: list[tuple], out: Path) -> dict:
    recorded = _rows(out)
    return {"rows": len(recorded), "lost": len(set(reference) - set(recorded)),
            "repeated": len(recorded) - len(set(recorded))}


def _sigterm_during_save(tmp: Path, reference: list[tuple]) -> dict:
    out, home, log = tmp / "sigterm", tmp / "home", tmp / "sigterm.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(_command(out), env=_env(home), stdout=handle, stderr=subprocess.STDOUT)
        while not (out / "checkpoint-2").is_dir() and process.poll() is None:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        process.wait()
    first = {"status": process.returncode, "line": _last_line(log.read_text())}
    resumed = _run(out, home, "--resume_from_checkpoint", "true")
    return {"case": "SIGTERM during a save", "how": "SIGTERM when `checkpoint-2/` appears", **first,
            "then": "resumed (`true`)", "completed": resumed.returncode == 0 and (out / "eval_results.json").exists(),
            **_compare(reference, out)}


def _tmpfs(mount: Path, size: str) -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    mount.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True).returncode == 0


def _full_disk(tmp: Path, reference: list[tuple]) -> dict:
    home, mount = tmp / "home", tmp / "small"
    if _tmpfs(mount, "5M"):
        try:
            out = mount / "run"
            first = _run(out, home)
            subprocess.run(["mount", "-o", "remount,size=40M", str(mount)], check=True)
            resumed = _run(out, home, "--resume_from_checkpoint", "true")
            result = {"how": "5 MB tmpfs (grown to 40 MB for the resume)", "status": first.returncode,
                      "line": _last_line(first.stderr), "then": "resumed (`true`)",
                      "completed": resumed.returncode == 0 and (out / "eval_results.json").exists(),
                      **_compare(reference, out)}
        finally:
            subprocess.run(["umount", str(mount)], check=False)
    else:
        out = tmp / "enospc"
        first = _run(out, home, code=ENOSPC_WRITER)
        resumed = _run(out, home, "--resume_from_checkpoint", "true")
        result = {"how": "patched `torch.save`: ENOSPC in checkpoint-2/optimizer.pt (no tmpfs: not root)",
                  "status": first.returncode, "line": _last_line(first.stderr), "then": "resumed (`true`)",
                  "completed": resumed.returncode == 0 and (out / "eval_results.json").exists(),
                  **_compare(reference, out)}
    return {"case": "full disk", **result}


def _second_run(tmp: Path, reference: list[tuple]) -> dict:
    out, home, release = tmp / "shared", tmp / "home", tmp / "release"
    first = subprocess.Popen(_command(out, code=HELD_OPEN), env={**_env(home), "RELEASE": str(release)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (out / "run_info.json").exists() and first.poll() is None:
            time.sleep(0.05)
        second = _run(out, home, seed=1)
    finally:
        release.touch()
    first.wait()
    return {"case": "second run into the same folder",
            "how": "`train --seed 1` while a `--seed 0` run is in progress there (held open until the second ends)",
            "status": second.returncode, "line": _last_line(second.stderr),
            "then": f"first run: exit {first.returncode}",
            "completed": first.returncode == 0 and (out / "eval_results.json").exists(), **_compare(reference, out)}


def run_all() -> tuple[list[dict], float]:
    """Run the three cases; return their results and the seconds taken."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-run-faults-") as name:
        tmp = Path(name)
        done = _run(tmp / "reference", tmp / "home")
        if done.returncode != 0:
            raise RuntimeError(f"the reference run failed: {done.stderr[-2000:]}")
        reference = _rows(tmp / "reference")
        results = []
        for case in (_sigterm_during_save, _full_disk, _second_run):
            results.append(case(tmp, reference))
            r = results[-1]
            print(f"{r['case']:32s} exit {r['status']} completed {r['completed']} rows {r['rows']} lost {r['lost']} "
                  f"repeated {r['repeated']}", flush=True)
        for result in results:
            result["line"] = result["line"].replace(name, "TMP")
        shutil.rmtree(tmp, ignore_errors=True)
    return results, time.perf_counter() - started


def section(results: list[dict], seconds: float) -> str:
    """The markdown section of faults.md for `results`."""
    lines = [
        f"{MARKER} (`python benchmarks/faults_run.py`, {seconds:.0f} s in all)",
        "",
        f"Each case: `trl-agents train --config gigpo_sokoban_tiny --max_steps {STEPS} --save_strategy steps "
        "--save_steps 1 --num_train_tasks 40 --num_eval_tasks 4 --warm_start_steps 0 --seed 0`, through the CLI; rows "
        f"compared with an uninterrupted run of the same command ({STEPS} rollouts) by global step, episode and turn.",
        "",
        "| case | how | exit status | what it said (last line) | then | job completed | rows recorded | rows lost | "
        "rows repeated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        said = r["line"].replace("|", "/")
        lines.append(f"| {r['case']} | {r['how']} | {r['status']} | {said} | {r['then']} | "
                     f"{'yes' if r['completed'] else 'NO'} | {r['rows']} | {r['lost']} | {r['repeated']} |")
    return "\n".join(lines) + "\n"


def splice(text: str, new_section: str) -> str:
    """`text` (faults.md) with its run-level section replaced by `new_section` (appended when it has none)."""
    head = text.split(MARKER)[0].rstrip("\n")
    return (head + "\n\n" if head else "") + new_section


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "faults.md"))
    args = parser.parse_args()
    results, seconds = run_all()
    path = Path(args.output)
    path.write_text(splice(path.read_text() if path.exists() else "", section(results, seconds)))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
