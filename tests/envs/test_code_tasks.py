"""The code task family: every task fails at the start and is solved by its expert solution, the hidden check catches
special-casing and partial fixes, tasks are deterministic and varied, and the solutions are short.

A small host runner stands in for the sandbox: it writes a task's files into a temporary directory, replays the
expert's tool calls there with subprocess, and runs the hidden check with `python3 -`, as the sandbox will.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from trl_agents.envs.code_tasks import CODE_KINDS, MODULE_NAMES, PACKAGE_NAMES, code_task
from trl_agents.envs.sandbox_tasks import TOOL_NAMES, SandboxTask

ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # no stale __pycache__ when a fix keeps the file's size
# The system's python3, as in the sandbox (a pyenv shim or a virtual environment's site-packages start 5x slower).
PYTHON3 = shutil.which("python3", path="/usr/bin:/bin") or "python3"


def write_files(task: SandboxTask, root: Path) -> None:
    for path, content in task.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(content)


def replay(calls: tuple[dict[str, Any], ...], root: Path) -> None:
    """Run tool calls as the sandbox would (bash and python in the working directory), up to `submit`."""
    for call in calls:
        name, arguments = call["name"], call["arguments"]
        if name == "bash":
            subprocess.run(["bash", "-c", arguments["command"]], cwd=root, env=ENV, timeout=10, check=True)
        elif name == "python":
            subprocess.run([PYTHON3, "-c", arguments["code"]], cwd=root, env=ENV, timeout=10, check=True)
        elif name == "write_file":
            (root / arguments["path"]).parent.mkdir(parents=True, exist_ok=True)
            (root / arguments["path"]).write_text(arguments["content"])
        else:
            assert name == "submit"
            return


def visible_passes(root: Path) -> bool:
    run = subprocess.run([PYTHON3, "-m", "unittest", "-q"], cwd=root, env=ENV, capture_output=True, timeout=10)
    return run.returncode == 0


def check_passes(task: SandboxTask, root: Path) -> bool:
    """Run the hidden check as tool_sandbox.py does: isolated (`-I`: no working directory on sys.path, no env)."""
    run = subprocess.run([PYTHON3, "-I", "-"], input=task.check, cwd=root, env=ENV, text=True, capture_output=True,
                         timeout=10)
    return run.returncode == 0


def module_path(task: SandboxTask) -> str:
    return next(p for p in task.files if not Path(p).name.startswith("test_") and not p.endswith("__init__.py"))


def visible_cases(task: SandboxTask) -> list[tuple[tuple[Any, ...], Any]]:
    """The (arguments, expected) pairs of the visible test: `self.assert...Equal(fn(args), expected)` lines."""
    test = next(content for path, content in task.files.items() if Path(path).name.startswith("test_"))
    cases = []
    for node in ast.walk(ast.parse(test)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("Equal"):
            call, want = node.args
            cases.append((tuple(ast.literal_eval(a) for a in call.args), ast.literal_eval(want)))
    return cases


def function_name(task: SandboxTask) -> str:
    return re.search(r"import_module\('[\w.]+'\)\.(\w+)", task.check).group(1)


@pytest.mark.parametrize("kind", CODE_KINDS)
def test_each_task_fails_at_the_start_and_the_expert_solution_solves_it(kind, tmp_path):
    for seed in range(15):
        task = code_task(seed, kind)
        root = tmp_path / str(seed)
        root.mkdir()
        write_files(task, root)
        assert not visible_passes(root), (seed, task.files)
        assert not check_passes(task, root), (seed, task.files)
        replay(task.solution, root)
        assert visible_passes(root), (seed, task.solution)
        assert check_passes(task, root), (seed, task.solution)
        if seed == 0:  # the check looks at behaviour only: it needs no test file
            for path in task.files:
                if Path(path).name.startswith("test_"):
                    (root / path).unlink()
            assert check_passes(task, root)


def test_tasks_are_deterministic_varied_and_cover_every_kind():
    assert len(CODE_KINDS) == len(set(CODE_KINDS)) == 8
    tasks = [code_task(seed) for seed in range(200)]
    assert all(code_task(seed) == task for seed, task in enumerate(tasks[:50]))
    assert all(code_task(seed, task.kind) == task for seed, task in enumerate(tasks[:50]))  # the kind is drawn first
    assert code_task(5, "fix-dict-key") != code_task(6, "fix-dict-key")
    projects = {tuple(sorted(task.files.items())) for task in tasks[:100]}
    assert len(projects) >= 90
    kinds = Counter(task.kind for task in tasks)
    assert set(kinds) == set(CODE_KINDS) and min(kinds.values()) >= 10, kinds
    assert len({function_name(task) for task in tasks}) >= 40
    assert len({module_path(task) for task in tasks}) >= 30
    assert any("/" in module_path(task) for task in tasks) and any("/" not in module_path(task) for task in tasks)
    # No module or package shadows the standard library (the project sits first on sys.path).
    assert not set(MODULE_NAMES + PACKAGE_NAMES) & set(sys.stdlib_module_names)
    for task in tasks:
        test_path = next(path for path in task.files if Path(path).name.startswith("test_"))
        assert test_path in task.instruction and module_path(task) in task.instruction
        assert task.hint and "python3 -m unittest" in task.instruction
    with pytest.raises(ValueError, match="fix-off-by-one"):
        code_task(0, "fix-everything")


def special_cased(task: SandboxTask, fall_back: bool) -> str:
    """The module with the function replaced by a lookup of the visible test's values; for other arguments it raises
    (or, with `fall_back`, runs the starting code)."""
    fn = function_name(task)
    table = {repr(args): want for args, want in visible_cases(task)}
    other = "_start(*args)" if fall_back else "None"
    return (task.files[module_path(task)] + f"\n_start = {fn}\n_TABLE = {table!r}\n\n\n"
            f"def {fn}(*args):\n    return _TABLE[repr(args)] if repr(args) in _TABLE else {other}\n")


@pytest.mark.parametrize("kind", CODE_KINDS)
def test_special_casing_the_visible_values_fails_the_check(kind, tmp_path):
    for seed in range(3):
        task = code_task(seed, kind)
        for fall_back in (False, True) if kind != "fix-empty-case" else (False,):  # [] -> value IS that fix
            root = tmp_path / f"{seed}-{fall_back}"
            root.mkdir()
            write_files(task, root)
            (root / module_path(task)).write_text(special_cased(task, fall_back))
            assert visible_passes(root), (seed, fall_back)  # it fools the visible test...
            assert not check_passes(task, root), (seed, fall_back)  # ...but not the hidden one


WRONG_FIXES = [  # kind, a pattern of the starting module and its replacement (re.sub with re.M)
    # the loop still skips the last element; adding it after the loop breaks the empty list
    ("fix-off-by-one", r"^(def \w+\((\w+)\):(?:\n.*)*\n    return total)$", r"\1 + \2[-1]"),
    # `x > limit - 1` instead of `x >= limit`: right for whole numbers only
    ("fix-comparison", r" > (\w+)([\])])$", r" > \1 - 1\2"),
    # `ext in path` instead of `path.endswith("." + ext)`: right for the visible file names only
    ("fix-string-method", r"return (\w+)\.startswith\(\"\.\" \+ (\w+)\)$", r"return \2 in \1"),
]


@pytest.mark.parametrize(("kind", "pattern", "replacement"), WRONG_FIXES)
def test_a_fix_that_breaks_another_case_fails_the_check(kind, pattern, replacement, tmp_path):
    task = next(t for s in range(200) if re.search(pattern, (t := code_task(s, kind)).files[module_path(t)], re.M))
    path = module_path(task)
    source = task.files[path]
    write_files(task, tmp_path)
    (tmp_path / path).write_text(re.sub(pattern, replacement, source, flags=re.M))
    assert (tmp_path / path).read_text() != source  # the wrong fix was applied...
    assert visible_passes(tmp_path), (tmp_path / path).read_text()  # ...it passes the visible test...
    assert not check_passes(task, tmp_path), (tmp_path / path).read_text()  # ...but not the hidden one


def test_solutions_are_short():
    for kind in CODE_KINDS:
        for seed in range(50):
            task = code_task(seed, kind)
            calls = task.solution
            assert 2 <= len(calls) <= 3 and calls[-1]["name"] == "submit", calls
            assert all(call["name"] in TOOL_NAMES for call in calls)
            for call in calls:
                if call["name"] == "bash":
                    assert len(call["arguments"]["command"]) <= 200, call
                    assert call["arguments"]["command"].startswith("sed -i 's/^")  # anchored on the buggy line
                if call["name"] == "write_file":
                    assert len(call["arguments"]["content"].encode()) <= 1500, call
            assert len(task.files[module_path(task)].splitlines()) <= 25
            assert len(task.check) < 2000
