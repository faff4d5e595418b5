"""The task of a sandboxed tool environment: starting files, an instruction, an expert solution and a hidden check.

Task families (`shell_tasks.py`, `code_tasks.py`) generate `SandboxTask`s from a seed; `SandboxToolEnv`
(`tool_sandbox.py`) plays them: it writes `files` into a fresh sandbox's working directory, shows `instruction`,
runs the model's tool calls, and once the model calls `submit` (or the episode is cut) runs `check` inside the
sandbox. The check is hidden: it is never written into the working directory and the model never sees it.

Example:
    >>> task = SandboxTask(
    ...     kind="count-lines",
    ...     instruction="Write the number of lines of notes.txt into answer.txt.",
    ...     files={"notes.txt": "a\\nb\\nc\\n"},
    ...     solution=(bash("wc -l < notes.txt > answer.txt"), submit()),
    ...     check="assert open('answer.txt').read().strip() == '3'",
    ... )
    >>> task.solution[0]
    {'name': 'bash', 'arguments': {'command': 'wc -l < notes.txt > answer.txt'}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The tools every sandboxed task offers, by name: their JSON schemas are in `tool_sandbox.TOOL_SCHEMAS`.
TOOL_NAMES = ("bash", "python", "write_file", "submit")


@dataclass(frozen=True)
class SandboxTask:
    """One task of a sandboxed tool environment.

    Args:
        kind: The task template it was drawn from (e.g. `"count-lines"`, `"fix-off-by-one"`); recorded per episode
            so results can be broken down by kind.
        instruction: What the agent must do, in plain words (shown in every prompt).
        files: The working directory at the start: relative path -> text content (folders are created as needed).
        solution: The expert's tool calls, in order, ending with `submit`: `{"name": tool, "arguments": {...}}`
            with a tool of `TOOL_NAMES`. Replaying them from the start solves the task (used for warm starts,
            `optimal_plan` and the tests).
        check: The hidden verifier, a Python program run with `python3` inside the sandbox, in the working
            directory, after the episode. The task is solved when it exits with status 0 (a failed `assert`
            fails it). It may read any file of the working directory and run commands with `subprocess`.
        hint: Privileged context for self-distillation teachers (what the solution does, in words); may be empty.
        executable: Paths of `files` to mark executable (scripts the task runs).
    """

    kind: str
    instruction: str
    files: dict[str, str]
    solution: tuple[dict[str, Any], ...]
    check: str
    hint: str = ""
    executable: tuple[str, ...] = field(default=())


def bash(command: str) -> dict[str, Any]:
    """An expert `bash` tool call: run `command` with bash in the working directory."""
    return {"name": "bash", "arguments": {"command": command}}


def python(code: str) -> dict[str, Any]:
    """An expert `python` tool call: run `code` with python3 in the working directory."""
    return {"name": "python", "arguments": {"code": code}}


def write_file(path: str, content: str) -> dict[str, Any]:
    """An expert `write_file` tool call: write `content` to `path` (relative to the working directory)."""
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def submit() -> dict[str, Any]:
    """The expert's last call: the work is done, run the hidden check."""
    return {"name": "submit", "arguments": {}}
