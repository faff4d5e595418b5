"""Tests of the shell task family (`trl_agents.envs.shell_tasks`): every task's check fails on its starting files and
passes after its expert solution, plausible wrong answers fail, tasks are deterministic and varied, solutions short.

The sandbox does not run here: a small host runner writes a task's files into a temporary directory, replays the
expert's tool calls there (bash and python3 as subprocesses) and runs the check with `python3 -` in that directory,
as the sandboxed environment will.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from trl_agents.envs.sandbox_tasks import TOOL_NAMES, SandboxTask
from trl_agents.envs.shell_tasks import SHELL_KINDS, shell_task

SEEDS = range(25)
# The sandbox runs `python3`; here the interpreter running the tests stands in for it (a `python3` found on PATH may
# be a slow wrapper script, such as a pyenv shim, and the checks use the standard library only).
PYTHON = sys.executable


# ----------------------------------------------------------------------------------------------------------------
# The host runner


def _materialize(task: SandboxTask, root: Path) -> None:
    """Write the task's starting files into `root` (folders as needed, executables marked)."""
    for relative, text in task.files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for relative in task.executable:
        os.chmod(root / relative, 0o755)


def _replay(calls: tuple[dict, ...] | list[dict], root: Path) -> None:
    """Run tool calls in `root` until `submit`."""
    for call in calls:
        name, arguments = call["name"], call["arguments"]
        if name == "bash":
            subprocess.run(["bash", "-c", arguments["command"]], cwd=root, timeout=10, capture_output=True)
        elif name == "python":
            subprocess.run([PYTHON, "-c", arguments["code"]], cwd=root, timeout=10, capture_output=True)
        elif name == "write_file":
            path = root / arguments["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(arguments["content"], encoding="utf-8")
        elif name == "submit":
            return
        else:
            raise AssertionError(f"unknown tool {name!r}")


def _check(task: SandboxTask, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-"], input=task.check, cwd=root, text=True, capture_output=True, timeout=10)


def _solved_dir(task: SandboxTask, root: Path) -> Path:
    """`root` holding the task's files after the expert solution."""
    _materialize(task, root)
    _replay(task.solution, root)
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


# ----------------------------------------------------------------------------------------------------------------
# 1. The check fails on the starting files and passes after the expert solution


@pytest.mark.parametrize("kind", SHELL_KINDS)
def test_check_fails_at_start_and_passes_after_expert(kind, tmp_path):
    for seed in SEEDS:
        task = shell_task(seed, kind)
        assert task.kind == kind
        root = tmp_path / str(seed)
        root.mkdir()
        _materialize(task, root)
        start = _check(task, root)
        assert start.returncode != 0, f"{kind} seed {seed}: the check passes on the untouched files"
        _replay(task.solution, root)
        end = _check(task, root)
        assert end.returncode == 0, f"{kind} seed {seed}: the expert fails the check:\n{end.stderr}"


def test_answer_checks_forgive_whitespace_and_a_leading_dot_slash(tmp_path):
    task = shell_task(11, "find-file")
    root = _solved_dir(task, tmp_path)
    answer = (root / "answer.txt").read_text().strip()
    (root / "answer.txt").write_text(f"  ./{answer}\n\n")
    assert _check(task, root).returncode == 0
    task = shell_task(11, "count-lines")
    root = _solved_dir(task, tmp_path / "count")
    (root / "answer.txt").write_text((root / "answer.txt").read_text().strip())  # no final newline
    assert _check(task, root).returncode == 0


# ----------------------------------------------------------------------------------------------------------------
# 2. Determinism and variety


def test_same_seed_same_task_and_kind_argument_keeps_the_stream():
    for seed in (0, 1, 17, 123, 10_000):
        task = shell_task(seed)
        assert task == shell_task(seed)
        assert task == shell_task(seed, task.kind)
        for kind in SHELL_KINDS:
            assert shell_task(seed, kind) == shell_task(seed, kind)


def test_different_seeds_give_different_tasks():
    tasks = [shell_task(seed) for seed in range(100)]
    assert len({task.instruction for task in tasks}) >= 90
    assert len({repr(task.files) for task in tasks}) == 100
    # Checks of the counting kinds hold only a small number, so equal checks do happen across seeds.
    assert len({task.check for task in tasks}) >= 85
    for kind in SHELL_KINDS:
        same_kind = [shell_task(seed, kind) for seed in range(30)]
        assert len({task.instruction for task in same_kind}) >= 22, kind
        assert len({repr(task.files) for task in same_kind}) == 30, kind
        assert len({task.check for task in same_kind}) >= 5, kind  # the answers differ too


def test_seeds_cover_every_kind_roughly_uniformly():
    counts = Counter(shell_task(seed).kind for seed in range(200))
    assert set(counts) == set(SHELL_KINDS)
    assert min(counts.values()) >= 8  # 20 expected per kind


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown shell task kind"):
        shell_task(0, "delete-everything")


# ----------------------------------------------------------------------------------------------------------------
# 3. Plausible wrong answers fail


def _answer(root: Path) -> str:
    return (root / "answer.txt").read_text().strip()


def _off_by_one(task: SandboxTask, root: Path) -> None:
    (root / "answer.txt").write_text(f"{int(_answer(root)) + 1}\n")


def _with_header(task: SandboxTask, root: Path) -> None:
    """The CSV header line kept at the top of the answer (a `cut` without `tail -n +2`)."""
    csv = next(text for path, text in task.files.items() if path.endswith(".csv"))
    (root / "answer.txt").write_text(csv.splitlines()[0] + "\n" + _answer(root) + "\n")


def _without_root(task: SandboxTask, root: Path) -> None:
    """The path written relative to the searched folder instead of the working directory."""
    (root / "answer.txt").write_text(_answer(root).split("/", 1)[1] + "\n")


def _not_deduplicated(task: SandboxTask, root: Path) -> None:
    """`sort` without `-u`, or the least frequent entry instead of the most frequent one."""
    command = task.solution[0]["arguments"]["command"]
    wrong = command.replace("sort -u", "sort").replace("head -1", "tail -1")
    assert wrong != command
    _replay([{"name": "bash", "arguments": {"command": wrong}}], root)


def _one_left_unrenamed(task: SandboxTask, root: Path) -> None:
    old = next(path for path in task.files if not (root / path).exists())  # a renamed file
    stem = old.rsplit(".", 1)[0]
    new = next(path for path in (root / old).parent.iterdir() if str(path.relative_to(root)).startswith(stem + "."))
    new.rename(root / old)


def _config_also_changed_elsewhere(task: SandboxTask, root: Path) -> None:
    """The value fixed, but an extra line appended to the config."""
    path = task.solution[0]["arguments"]["command"].split()[-1]
    with open(root / path, "a") as handle:
        handle.write("debug=true\n")


def _replaced_in_every_file(task: SandboxTask, root: Path) -> None:
    """The substitution applied to every file of the folder, the .txt file too."""
    command = task.solution[0]["arguments"]["command"]
    wrong = re.sub(r"\*\.md$", "*", command)
    assert wrong != command
    _replay([{"name": "bash", "arguments": {"command": wrong}}], root)


def _one_moved_back(task: SandboxTask, root: Path) -> None:
    moved = next(path for path in task.files if not (root / path).exists())
    folder, name = moved.rsplit("/", 1)
    source = next(path for path in (root / folder).rglob(name) if path.parent != root / folder)
    shutil.move(source, root / moved)


WRONG_ANSWERS = [
    ("count-lines", _off_by_one),
    ("count-files", _off_by_one),
    ("aggregate-column", _off_by_one),
    ("extract-column", _with_header),
    ("find-file", _without_root),
    ("sort-dedupe", _not_deduplicated),
    ("rename-ext", _one_left_unrenamed),
    ("fix-config", _config_also_changed_elsewhere),
    ("replace-text", _replaced_in_every_file),
    ("organize-files", _one_moved_back),
]


@pytest.mark.parametrize(("kind", "spoil"), WRONG_ANSWERS, ids=[kind for kind, _ in WRONG_ANSWERS])
def test_plausible_wrong_answers_fail(kind, spoil, tmp_path):
    for seed in range(8):
        task = shell_task(seed, kind)
        root = _solved_dir(task, tmp_path / str(seed))
        solved = _snapshot(root)
        spoil(task, root)
        assert _snapshot(root) != solved, f"{kind} seed {seed}: the wrong answer changed nothing"
        assert _check(task, root).returncode != 0, f"{kind} seed {seed}: a wrong answer passes the check"


def test_config_fix_of_the_wrong_key_fails(tmp_path):
    task = shell_task(5, "fix-config")
    _materialize(task, tmp_path)
    path = task.solution[0]["arguments"]["command"].split()[-1]
    lines = (tmp_path / path).read_text().splitlines()
    lines[-1] += "0"  # the last value changed instead of the broken one (never the comment line)
    (tmp_path / path).write_text("\n".join(lines) + "\n")
    assert _check(task, tmp_path).returncode != 0


# ----------------------------------------------------------------------------------------------------------------
# 4. Small tasks, short solutions


def test_solutions_are_short_and_files_small():
    for kind in SHELL_KINDS:
        for seed in range(60):
            task = shell_task(seed, kind)
            assert 2 <= len(task.solution) <= 4
            assert task.solution[-1] == {"name": "submit", "arguments": {}}
            assert all(call["name"] in TOOL_NAMES for call in task.solution)
            for call in task.solution:
                if call["name"] == "bash":
                    assert len(call["arguments"]["command"]) <= 200, call
            assert 1 <= len(task.files) <= 12
            for path, text in task.files.items():
                assert len(text.encode()) <= 4096 and text.count("\n") <= 40, (kind, seed, path)
                assert not path.startswith("/") and ".." not in path.split("/")
            assert task.hint and "\n" not in task.hint
            assert "answer.txt" in task.check or "answer.txt" not in task.instruction
            assert len(task.instruction) <= 300, task.instruction
