"""Tool environments that run the model's commands in a sandbox: `shell-tasks` and `code-tasks`.

`SandboxToolEnv` plays a `SandboxTask` (sandbox_tasks.py): `reset` starts a fresh `Sandbox` (sandbox.py), writes the
task's files into its working directory and shows the file list; the model acts with tool calls, offered through the
tokenizer's chat template (`AgentEnv.tools`, as TRL offers tools) and parsed with `parse_tool_calls` (Qwen/Hermes
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`):

| tool | what it does | observation |
|---|---|---|
| `bash(command)` | runs `command` with bash in the working directory | its output, then `[exit code N]` (or that it timed out) |
| `python(code)` | runs `code` with python3 in the working directory | likewise |
| `write_file(path, content)` | writes a text file (folders created; no path out of the working directory) | `wrote N bytes to path` |
| `submit()` | ends the episode and runs the task's hidden check inside the sandbox | `solved` or `not solved` |

Reward: 1 when the hidden check passes at `submit`, else 0 (an episode cut at `max_turns` without `submit` is not
checked: our choice, the agent must say it is done, as in SWE-bench and Terminal-Bench). A reply without a tool
call, malformed JSON, an unknown tool or bad arguments is an invalid action (`info["valid"] = False`) with feedback,
and nothing runs. A command that fails or times out is a valid action: the model sees its output and exit code.
A sandbox that dies (a command killed its server) raises, which fails that episode only.

Capabilities: `snapshot`/`restore` (the working directory as a tar archive, plus the episode's bookkeeping: forks of
branching and tree methods restore it into a fresh sandbox), `expert_plan` (the task's expert solution while the
episode follows it: warm starts and ground-truth demonstrations), `privileged_context` (the task's hint).

Example:
    >>> from trl_agents.envs import make_env
    >>> from trl_agents.envs.sandbox import bubblewrap_available
    >>> env = make_env("shell-tasks", sandbox_backend="bwrap" if bubblewrap_available() else "none")
    >>> observation = env.reset({"seed": 3})
    >>> for action in env.expert_plan():
    ...     observation, reward, done, info = env.step(action)
    >>> reward, done, info["success"]
    (1.0, True, True)
    >>> env.close()
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, ClassVar

from .adapters.trl import ToolCallError, format_tool_call, parse_tool_calls
from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .code_tasks import CODE_KINDS, code_task
from .registry import register_env
from ..names import check_choice
from .sandbox import (
    BUBBLEWRAP_MISSING,
    SANDBOX_BACKENDS,
    Sandbox,
    SandboxLimits,
    SandboxResult,
    bubblewrap_available,
)
from .sandbox_tasks import TOOL_NAMES, SandboxTask
from .shell_tasks import SHELL_KINDS, shell_task


def _function(name: str, description: str, parameters: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string", "description": text} for key, text in parameters.items()},
                **({"required": list(parameters)} if parameters else {}),
            },
        },
    }


# The four tools, in the OpenAI function format chat templates render (what `transformers.utils.get_json_schema`
# gives for a typed function with a Google-style docstring).
TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    _function("bash", "Run a bash command in the working directory and see its output and exit code.",
              {"command": "The command line, e.g. `ls -la` or `grep -rn TODO src`."}),
    _function("python", "Run a Python 3 program in the working directory and see its output and exit code.",
              {"code": "The program's source code."}),
    _function("write_file", "Write a text file in the working directory, replacing it if it exists.",
              {"path": "The file's path, relative to the working directory.", "content": "The whole new content."}),
    _function("submit", "Say the task is done. The episode ends and a hidden check decides whether it is solved.", {}),
)
assert tuple(tool["function"]["name"] for tool in TOOL_SCHEMAS) == TOOL_NAMES
_PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOL_SCHEMAS}

INSTRUCTIONS = (
    "You work in a Linux sandbox without network access. The working directory is /work; the task's files are "
    "there. Act by calling the tools: look around, do the task, check your work, then call submit (a hidden check "
    "then decides whether the task is solved). Reply with tool calls only."
)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown ...]"


class SandboxToolEnv(AgentEnv):
    """Plays `SandboxTask`s in a `Sandbox`; subclasses say where tasks come from (`generate`: seed and kind -> task).

    Args:
        sandbox_backend: `"bwrap"` (bubblewrap isolation, the default) or `"none"` (no isolation: the commands run
            on this machine as your user; it warns once). Without bubblewrap, `"bwrap"` fails with a line naming the
            package.
        sandbox_limits: Overrides of `SandboxLimits` (e.g. `{"timeout": 5, "memory_mb": 512}`).
        max_output_chars: Characters of a tool's output shown to the model (the rest is cut with a marker): keeps
            prompts short (our choice: 1500).
        check_timeout: Seconds the hidden check may run.
        kinds: Restrict tasks to these kinds (a row's `kind` wins; default: all kinds of the family).
    """

    tools: ClassVar[tuple[dict[str, Any], ...]] = TOOL_SCHEMAS
    instructions = INSTRUCTIONS
    task_keys = ("seed",)
    KINDS: ClassVar[tuple[str, ...]] = ()
    generate: ClassVar[Callable[[int, str | None], SandboxTask]]  # (seed, kind or None) -> the task
    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 1000, "eval": 200}

    def __init__(
        self,
        sandbox_backend: str = "bwrap",
        sandbox_limits: dict[str, Any] | None = None,
        max_output_chars: int = 1500,
        check_timeout: float = 20.0,
        kinds: list[str] | tuple[str, ...] | None = None,
    ):
        from .validation import check_int

        self.sandbox_backend = sandbox_backend
        self.limits = SandboxLimits(**(sandbox_limits or {}))  # a bad limit fails here, with its name
        check_choice("sandbox_backend", sandbox_backend, SANDBOX_BACKENDS)
        if sandbox_backend == "bwrap" and not bubblewrap_available():
            raise ValueError(BUBBLEWRAP_MISSING)  # now, in one line, rather than as every episode failing later
        self.max_output_chars = check_int("max_output_chars", max_output_chars, 100, 1_000_000)
        if not float(check_timeout) > 0:
            raise ValueError(f"check_timeout must be positive, got {check_timeout!r}")
        self.check_timeout = float(check_timeout)
        unknown = sorted(set(kinds or ()) - set(self.KINDS))
        if unknown:
            raise ValueError(f"unknown {self.name} kinds {unknown}; choose among {list(self.KINDS)}")
        self.kinds = tuple(kinds) if kinds else self.KINDS
        self._sandbox: Sandbox | None = None
        self._task: SandboxTask | None = None
        self._row: dict[str, Any] | None = None
        self._done = False
        self._success = False
        self._expert_step: int | None = 0  # expert calls made so far; None once the episode left the expert's path

    # ---- tasks -------------------------------------------------------------------------------------------------------

    def make_task(self, row: dict[str, Any]) -> SandboxTask:
        """The task of a dataset row (`seed`, optionally `kind`)."""
        return type(self).generate(int(row["seed"]), self._kind_of(row))

    def _kind_of(self, row: dict[str, Any]) -> str | None:
        kind = row.get("kind")
        if kind is not None:
            if kind not in self.KINDS:
                raise ValueError(f"task kind {kind!r} is not a {self.name} kind; choose among {list(self.KINDS)}")
            return kind
        if self.kinds == self.KINDS:
            return None  # the seed picks among all kinds
        return self.kinds[int(row["seed"]) % len(self.kinds)]

    # ---- episode -----------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        if not isinstance(task, dict) or "seed" not in task:
            raise ValueError(f"a {self.name} task row needs a 'seed', got {task!r}")
        self._task = self.make_task(task)
        self._row = dict(task)
        self._open_sandbox()
        for path, content in self._task.files.items():
            self._sandbox.write_file(path, content, executable=path in self._task.executable)
        self._done, self._success, self._expert_step = False, False, 0
        return self._file_listing()

    def _open_sandbox(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
        self._sandbox = Sandbox(self.sandbox_backend, self.limits)

    def _file_listing(self) -> str:
        names = sorted(self._task.files)
        return "Files in the working directory:\n" + ("\n".join(names) if names else "(none)")

    def files(self) -> list[str]:
        """The paths of the working directory's files now, sorted (for tests and debugging)."""
        result = self._sandbox.run("find . -type f | cut -c3- | LC_ALL=C sort")
        return [line for line in result.stdout.splitlines() if line]

    def task_description(self) -> str:
        return self._task.instruction if self._task is not None else ""

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._task is None:
            raise RuntimeError("Call reset(task) before step()")
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        try:
            calls = parse_tool_calls(action_text if isinstance(action_text, str) else "")
            if not calls:
                raise ToolCallError("Call a tool: " + ", ".join(TOOL_NAMES) + " (submit when the task is done).")
            for call in calls:
                self._check_call(call)
        except ToolCallError as err:
            self._expert_step = None
            return f"Invalid tool call. {err}", 0.0, False, self._info(False, [], [])
        self._follow_expert(calls)
        results, exit_codes = [], []
        for call in calls:
            if call["name"] == "submit":
                passed = self._run_check()
                self._done, self._success = True, passed
                results.append("Submitted: the hidden check " + ("passed. Task solved." if passed else "failed."))
                break
            text, code = self._run_tool(call)
            results.append(text)
            exit_codes.append(code)
        observation = "\n".join(f"<tool_response>\n{text}\n</tool_response>" for text in results)
        reward = 1.0 if self._done and self._success else 0.0
        return observation, reward, self._done, self._info(True, calls, exit_codes)

    def _check_call(self, call: dict[str, Any]) -> None:
        schema = _PARAMETERS.get(call["name"])
        if schema is None:
            raise ToolCallError(f"Unknown tool {call['name']!r}. Available tools: {', '.join(TOOL_NAMES)}.")
        expected = set(schema["properties"])
        given = set(call["arguments"])
        if given != expected:
            wanted = ", ".join(sorted(expected)) or "no arguments"
            raise ToolCallError(f"Tool {call['name']!r} takes {wanted}; got {', '.join(sorted(given)) or 'none'}.")
        for key in expected:
            if not isinstance(call["arguments"][key], str):
                raise ToolCallError(f"Argument {key!r} of tool {call['name']!r} must be a string.")

    def _run_tool(self, call: dict[str, Any]) -> tuple[str, int]:
        arguments = call["arguments"]
        if call["name"] == "write_file":
            try:
                self._sandbox.write_file(arguments["path"], arguments["content"])
            except (ValueError, OSError) as err:
                return f"write_file failed: {err}", 1
            return f"wrote {len(arguments['content'].encode())} bytes to {arguments['path']}", 0
        if call["name"] == "bash":
            result = self._sandbox.run(arguments["command"])
        else:
            result = self._sandbox.run("python3 -", stdin=arguments["code"])
        return self._describe(result), result.exit_code

    def _describe(self, result: SandboxResult) -> str:
        output = result.stdout
        if result.stderr:
            output += ("" if not output or output.endswith("\n") else "\n") + result.stderr
        output = _clip(output, self.max_output_chars)
        if output and not output.endswith("\n"):
            output += "\n"
        if result.timed_out:
            return output + f"[timed out after {self.limits.timeout:g} s: every process of the command was killed]"
        return output + f"[exit code {result.exit_code}]"

    def _run_check(self) -> bool:
        """The hidden check, inside the sandbox: solved when it exits 0 and prints a fresh random token last (so a
        module that ends the interpreter early, e.g. with `os._exit(0)` at import, does not pass)."""
        token = secrets.token_hex(16)
        program = self._task.check + f"\nprint({token!r})\n"
        result = self._sandbox.run("python3 -I -", stdin=program, timeout=self.check_timeout)
        return result.ok and result.stdout.rstrip().endswith(token)

    def _follow_expert(self, calls: list[dict[str, Any]]) -> None:
        if self._expert_step is None:
            return
        end = self._expert_step + len(calls)
        if list(self._task.solution[self._expert_step:end]) == calls:
            self._expert_step = end
        else:
            self._expert_step = None

    def _info(self, valid: bool, calls: list[dict[str, Any]], exit_codes: list[int]) -> dict[str, Any]:
        return {INFO_VALID: valid, INFO_SUCCESS: self._success, "tools": [c["name"] for c in calls],
                "exit_codes": exit_codes, "kind": self._task.kind}

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    # ---- capabilities ------------------------------------------------------------------------------------------------

    def expert_plan(self) -> list[str] | None:
        """The rest of the task's expert solution while the episode has followed it (each call one action); None
        once the episode left it (no plan is known from an arbitrary state) or ended."""
        if self._task is None or self._done or self._expert_step is None:
            return None
        return [format_tool_call(call) for call in self._task.solution[self._expert_step:]]

    def privileged_context(self) -> str:
        return self._task.hint if self._task is not None else ""

    def snapshot(self) -> tuple:
        if self._task is None:
            raise RuntimeError("snapshot() called before reset()")
        return (dict(self._row), self._sandbox.snapshot(), self._done, self._success, self._expert_step)

    def restore(self, snapshot: tuple) -> None:
        row, files, done, success, expert_step = snapshot
        if self._row != row or self._sandbox is None or self._sandbox.closed:
            self._task, self._row = self.make_task(row), dict(row)
            self._open_sandbox()
        self._sandbox.restore(files)
        self._done, self._success, self._expert_step = done, success, expert_step

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded rows: `"train"` (seeds from 0) and `"eval"` (from 1_000_000), disjoint. `env_kwargs` are checked
        (a bad setting, or bubblewrap missing, fails here, before a run starts)."""
        cls(**env_kwargs)
        return cls.seeded_split(split, count)


@register_env
class ShellTasks(SandboxToolEnv):
    """Terminal tasks on a small generated file tree: find, count, rename, extract, fix a config (shell_tasks.py)."""

    name = "shell-tasks"
    KINDS = SHELL_KINDS
    generate = staticmethod(shell_task)


@register_env
class CodeTasks(SandboxToolEnv):
    """A tiny Python project with a failing test: fix the bug or implement the function (code_tasks.py)."""

    name = "code-tasks"
    KINDS = CODE_KINDS
    generate = staticmethod(code_task)
