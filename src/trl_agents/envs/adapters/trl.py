"""TRL's `environment_factory` in both directions: TRL tool environments under trl-agents, and our envs under TRL.

TRL 1.16's `GRPOTrainer(environment_factory=...)` (docs/concepts/trl_internals.md#environment_factory) takes a class
whose instances hold one episode: `reset(**row)` receives the whole dataset row and may return a string, which TRL
appends to the prompt's last user message; every other public method is a *tool* (its JSON schema comes from type
hints and a Google-style docstring); the model plays by emitting tool calls, which TRL executes, feeding each result
back as a `tool` message, until the model answers without a tool call. Rewards come from
`reward_funcs(environments=..., ...)` and from an optional `get_reward()` method. A tool that raises has its error
shown to the model (TRL's documented way to reject an action or to say the game is over); by convention a `done`
attribute marks the end of an episode.

- `TRLEnvironment` (registered as `"trl-environment"`) and `from_trl_environment(EnvClass, reward_funcs)` play such
  a class as an `AgentEnv`, so trl-agents trainers (per-turn prompts, credit assignment, GiGPO, ...) can train on
  it. Each `step(text)` parses the tool calls in the model's text (Qwen2.5/Hermes format `<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`), runs them, and returns their results.
- `to_trl_environment(env_name, **env_kwargs)` goes the other way: any registered environment becomes an
  `environment_factory` class with one tool, `act(action)`, and `trl_environment_reward` scores its episodes, so
  plain TRL `GRPOTrainer` users get every trl-agents environment.

Example:
    >>> from trl_agents.envs.adapters.trl import from_trl_environment, to_trl_environment, trl_environment_reward
    >>> SokobanTools = to_trl_environment("sokoban")  # an environment_factory class for GRPOTrainer
    >>> game = SokobanTools()
    >>> first = game.reset(layout="# # # # #\\n# P X O #\\n# # # # #")
    >>> print(game.act("right"))
    # # # # #
    # _ P * #
    # # # # #
    The episode is over: solved.
    >>> trl_environment_reward([game])
    [1.0]
    >>> class Guess:  # a TRL environment class: reset(**row) plus tool methods
    ...     def reset(self, **row):
    ...         self.target, self.done = row["target"], False
    ...         return "Guess my number (1-9)."
    ...     def guess(self, n: int) -> str:
    ...         '''Guess the number.
    ...
    ...         Args:
    ...             n: Your guess.
    ...         '''
    ...         self.done = n == self.target
    ...         return "Correct!" if self.done else ("Higher." if n < self.target else "Lower.")
    >>> env = from_trl_environment(Guess, lambda environments, **kw: [float(e.done) for e in environments])()
    >>> env.reset({"target": 7})
    'Guess my number (1-9).'
    >>> env.step('<tool_call>\\n{"name": "guess", "arguments": {"n": 3}}\\n</tool_call>')[:3]
    ('<tool_response>\\nHigher.\\n</tool_response>', 0.0, False)
    >>> env.step('<tool_call>{"name": "guess", "arguments": {"n": 7}}</tool_call>')[1:3]
    (1.0, True)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import importlib
import inspect
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from ..base import INFO_SUCCESS, INFO_VALID, AgentEnv
from ..registry import get_env_class, make_env, register_env
from ..replay import replay_snapshots

# Qwen2.5 / Qwen3 / Hermes tool-call markup, as TRL's Qwen2.5 chat template renders `assistant.tool_calls`.
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_TOOL_CALL_OPEN = "<tool_call>"
# Reasoning is not an action: a tool call written inside <think>...</think> is not executed.
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
# Methods of a TRL environment class that are not tools (TRL 1.16, grpo_trainer.py: `reset`, `get_reward`).
_NOT_TOOLS = ("reset", "get_reward")
# Dataset columns TRL does not forward to reward functions as keyword arguments (it passes them separately).
_NOT_REWARD_COLUMNS = ("prompt", "completion", "env")

ToolCall = dict  # {"name": str, "arguments": dict}


class ToolCallError(ValueError):
    """A model's tool call that cannot be executed; the message is written for the model to read."""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The tool calls in a model's text, Qwen2.5/Hermes style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

    Blocks inside `<think>...</think>` are ignored. `arguments` may also be a JSON-encoded string (OpenAI style) or
    be missing (no arguments); `parameters` is accepted as its synonym.

    Returns:
        `[{"name": str, "arguments": dict}, ...]` in order; `[]` when the text has no tool call (a final answer).

    Raises:
        ToolCallError: A block is not closed, is not JSON, or lacks a string `name` / an object of arguments.

    Example:
        >>> parse_tool_calls('<think>maybe 2</think><tool_call>{"name": "guess", "arguments": {"n": 3}}</tool_call>')
        [{'name': 'guess', 'arguments': {'n': 3}}]
    """
    if not isinstance(text, str):
        return []
    region = _THINK.sub(" ", text)
    blocks = _TOOL_CALL.findall(region)
    if region.count(_TOOL_CALL_OPEN) > len(blocks):
        raise ToolCallError("A <tool_call> block is not closed: end every call with </tool_call>.")
    calls = []
    for index, block in enumerate(blocks, 1):
        where = f"Tool call {index}" if len(blocks) > 1 else "The tool call"
        try:
            call = json.loads(block.strip())
        except json.JSONDecodeError as err:
            raise ToolCallError(
                f"{where} is not valid JSON ({err.msg} at character {err.pos}); write "
                '{"name": "<tool name>", "arguments": {...}} between <tool_call> and </tool_call>.'
            ) from None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ToolCallError(f'{where} needs a string "name": {{"name": "<tool name>", "arguments": {{...}}}}.')
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                raise ToolCallError(f'{where} has "arguments" that are neither an object nor JSON text.') from None
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ToolCallError(f'{where} needs "arguments" to be an object mapping argument names to values.')
        calls.append({"name": call["name"], "arguments": arguments})
    return calls


def format_tool_call(call: ToolCall) -> str:
    """A tool call written as the model writes it (what `parse_tool_calls` reads back), e.g. for expert plans.

    >>> format_tool_call({"name": "guess", "arguments": {"n": 3}})
    '<tool_call>\\n{"name": "guess", "arguments": {"n": 3}}\\n</tool_call>'
    """
    return "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": call["arguments"]}) + "\n</tool_call>"


def _resolve(value: Any) -> Any:
    """Await `value` when a (sync) caller got a coroutine: TRL allows async tools, `reset`, rewards and `get_reward`."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # already inside an event loop
        return pool.submit(asyncio.run, wait()).result()


def _import_object(path: str, what: str) -> Any:
    """`"package.module:attribute"` (or `"package.module.attribute"`) -> the object."""
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"`{what}` must be an object or an import path 'package.module:Name', got {path!r}")
    try:
        target = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"Cannot import `{what}` from {path!r}: {err}") from err
    return target


def _tool_methods(instance: Any) -> dict[str, Callable[..., Any]]:
    """The tools TRL would expose for `instance`: public functions of its class other than `reset`/`get_reward`."""
    return {
        name: getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    }


def _prompt_text(prompt: Any) -> str:
    """The text TRL appends `reset`'s observation to: the last message's content of a conversational prompt, or a
    plain string prompt."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        content = prompt[-1].get("content")
        return content if isinstance(content, str) else ""
    return ""


# ---- TRL environment classes played as AgentEnvs -------------------------------------------------------------------


@register_env
class TRLEnvironment(AgentEnv):
    """A TRL `environment_factory` class played as an `AgentEnv`: the model's tool calls are the actions.

    - `reset(task)` calls the class's `reset(**row)` with the task row (without trl-agents' `env` key). As in TRL, the
      first observation is the row's prompt text (last user message of a `prompt` column, if any) followed by what
      `reset` returned.
    - `step(text)` parses the tool calls in `text` with `tool_call_parser`, runs them in order (async tools are
      awaited), and returns their results, each inside `<tool_response>...</tool_response>` on its own lines
      (how Qwen2.5's chat template shows tool messages; our choice). Bad JSON, an unclosed block, an unknown tool or
      arguments that do not fit the tool's signature give `valid=False` with feedback, and no tool runs. A tool that
      raises gives TRL's tool response `{'error': '...'}` and `valid=False` (TRL's documented way to reject an
      action); as in TRL, the other calls of the turn still run.
    - The episode ends when the model answers without a tool call (`end_on_answer`, TRL's rule), or when a tool
      call leaves the instance's `done_attribute` truthy (the `self.done` convention of TRL's OpenEnv examples).
    - Reward: the sum of `reward_funcs` (called as TRL calls them, see below) and `get_reward()` when the class has
      one (TRL adds it with weight 1). With `reward_at="every_step"` (default, our choice) it is evaluated after
      every step and each step gets the change, so an episode's return equals the reward functions' value wherever
      the episode stops, even when the trainer truncates it at `max_turns`; `"end"` evaluates it once, on the last
      step (truncated episodes then get 0).
    - `info`: `valid`, `success` (the instance's bool `success_attribute` if it has one, else reward so far > 0),
      `action` (the calls re-serialised), `tools` (the names called) and `tool_errors`.

    Reward functions receive, for a batch of one episode: `prompts=[[first user message]]`, `completions=[[assistant
    and tool messages so far, TRL-style]]`, `environments=[instance]`, and every other column of the task row as a
    one-element list. TRL's `completion_ids`, `trainer_state`, `log_extra` and `log_metric` are not passed. A
    function returning `[None]` counts 0.

    Args:
        environment_class: The TRL environment class, a zero-argument factory, or its import path
            `"package.module:Class"` (use a path in configs: `env_kwargs` are saved as JSON).
        reward_funcs: A reward function, a list of them, or import paths; may be None when the class defines
            `get_reward`.
        instructions: Text put before the tool descriptions in the system prompt (default: none).
        done_attribute: Instance attribute that ends the episode once truthy after a tool call; None to disable.
        success_attribute: Instance attribute read as `info["success"]` when it is a bool; None to disable.
        end_on_answer: End the episode when the model answers without a tool call. When False such an answer is an
            invalid action (feedback: call a tool).
        reward_at: `"every_step"` or `"end"` (see above).
        tool_call_parser: `text -> [{"name", "arguments"}]` raising `ToolCallError` on malformed calls, for models
            with another tool-call format (default `parse_tool_calls`, Qwen2.5/Hermes).
    """

    name = "trl-environment"

    def __init__(
        self,
        environment_class: type | Callable[[], Any] | str,
        reward_funcs: Callable[..., Any] | str | Sequence[Callable[..., Any] | str] | None = None,
        instructions: str | None = None,
        done_attribute: str | None = "done",
        success_attribute: str | None = "success",
        end_on_answer: bool = True,
        reward_at: str = "every_step",
        tool_call_parser: Callable[[str], list[ToolCall]] | None = None,
    ):
        if isinstance(environment_class, str):
            environment_class = _import_object(environment_class, "environment_class")
        if not callable(environment_class):
            raise ValueError(
                "`environment_class` must be a TRL environment class (reset(**row) plus tool methods), a "
                f"zero-argument factory, or an import path 'package.module:Class'; got {environment_class!r}"
            )
        if reward_funcs is None:
            reward_funcs = []
        elif callable(reward_funcs) or isinstance(reward_funcs, str):
            reward_funcs = [reward_funcs]
        elif not isinstance(reward_funcs, Sequence):
            raise ValueError(
                f"`reward_funcs` must be a callable, an import path or a list of them, got {reward_funcs!r}"
            )
        resolved = []
        for func in reward_funcs:
            func = _import_object(func, "reward_funcs") if isinstance(func, str) else func
            if not callable(func):
                raise ValueError(f"`reward_funcs` holds {func!r}, which is not callable")
            resolved.append(func)
        if instructions is not None and not isinstance(instructions, str):
            raise ValueError(f"`instructions` must be a string or None, got {instructions!r}")
        for field_name, value in (("done_attribute", done_attribute), ("success_attribute", success_attribute)):
            if value is not None and not (isinstance(value, str) and value.isidentifier()):
                raise ValueError(f"`{field_name}` must be an attribute name or None, got {value!r}")
        if end_on_answer not in (True, False):
            raise ValueError(f"`end_on_answer` must be a bool, got {end_on_answer!r}")
        if reward_at not in ("every_step", "end"):
            raise ValueError(f"`reward_at` must be 'every_step' or 'end', got {reward_at!r}")
        if tool_call_parser is not None and not callable(tool_call_parser):
            raise ValueError(f"`tool_call_parser` must be a callable text -> list of calls, got {tool_call_parser!r}")

        self.environment_class = environment_class
        self.reward_funcs = resolved
        self.done_attribute = done_attribute
        self.success_attribute = success_attribute
        self.end_on_answer = end_on_answer
        self.reward_at = reward_at
        self.tool_call_parser = tool_call_parser or parse_tool_calls
        self._instance = environment_class()  # TRL: "construct once, reset often"
        if not callable(getattr(self._instance, "reset", None)):
            raise ValueError(
                f"{type(self._instance).__name__} has no `reset(**row)` method, which TRL environments need"
            )
        self._has_get_reward = callable(getattr(self._instance, "get_reward", None))
        if not self.reward_funcs and not self._has_get_reward:
            raise ValueError(
                f"No reward source for {type(self._instance).__name__}: pass `reward_funcs` (functions taking "
                "`environments=` like TRL's) or give the class a `get_reward()` method."
            )
        self._signatures = {name: inspect.signature(tool) for name, tool in _tool_methods(self._instance).items()}
        self.tool_names = sorted(self._signatures)
        self.instructions = self._render_instructions(instructions)
        self._row: dict[str, Any] | None = None
        self._prompt_messages: list[dict[str, Any]] = []
        self._messages: list[dict[str, Any]] = []
        self._reward_so_far = 0.0
        self._done = False

    def _render_instructions(self, prefix: str | None) -> str:
        from transformers.utils import get_json_schema

        schemas = []
        for name in self.tool_names:
            try:
                schemas.append(json.dumps(get_json_schema(getattr(self._instance, name))))
            except Exception as err:  # DocstringParsingException / TypeHintParsingException: TRL fails the same way
                raise ValueError(
                    f"Tool `{name}` of {type(self._instance).__name__} needs type hints and a Google-style docstring "
                    f"with an `Args:` section (TRL builds the tool schema from them): {err}"
                ) from err
        lines = [prefix.strip()] if prefix and prefix.strip() else []
        if schemas:
            lines += [
                "You act by calling tools. Their JSON schemas, one per line:",
                "<tools>",
                *schemas,
                "</tools>",
                "To call a tool, write a JSON object with its name and arguments between tags:",
                '<tool_call>\n{"name": "<tool name>", "arguments": {"<argument>": <value>}}\n</tool_call>',
                "You may make several calls in one reply; their results come back in <tool_response> tags.",
            ]
        if self.end_on_answer:
            lines.append("Reply without a tool call when you are done.")
        return "\n".join(lines)

    # ---- episode -------------------------------------------------------------------------------------------------

    @property
    def environment(self) -> Any:
        """The TRL environment instance being played (what reward functions get in `environments`)."""
        return self._instance

    def reset(self, task: dict[str, Any]) -> str:
        if not isinstance(task, dict):
            raise ValueError(f"A task must be a dict (a dataset row), got {type(task).__name__}")
        row = {k: v for k, v in task.items() if k != "env"}
        returned = _resolve(self._instance.reset(**row))
        if returned is not None and not isinstance(returned, str):
            raise TypeError(
                f"{type(self._instance).__name__}.reset() returned {type(returned).__name__}; trl-agents needs a "
                "string or None (multimodal observations are not supported)"
            )
        prompt = row.get("prompt")
        first = _prompt_text(prompt) + (returned or "")  # TRL appends reset's text to the last user message as is
        if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
            self._prompt_messages = [*prompt[:-1], {**prompt[-1], "content": first}]
        else:
            self._prompt_messages = [{"role": "user", "content": first}]
        self._row = row
        self._messages = []
        self._reward_so_far = 0.0
        self._done = False
        return first

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._row is None:
            raise RuntimeError("Call reset(task) before step()")
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        text = action_text if isinstance(action_text, str) else ""
        try:
            calls = self.tool_call_parser(text)
            self._check_calls(calls)
        except ToolCallError as err:
            return self._invalid(str(err))

        if not calls:
            if not self.end_on_answer:
                return self._invalid("Call one of the tools to act: " + ", ".join(self.tool_names) + ".")
            self._messages.append({"role": "assistant", "content": text})
            self._done = True
            reward = self._reward_step(done=True)
            return "The episode is over.", reward, True, self._info(valid=True, calls=[], errors=0)

        results, errors = [], 0
        for call in calls:
            try:
                result = _resolve(getattr(self._instance, call["name"])(**call["arguments"]))
            except Exception as err:  # noqa: BLE001 - TRL shows a failing tool's error to the model
                result, errors = {"error": str(err)}, errors + 1
            results.append(result if isinstance(result, str) else str(result))
        self._messages.append(
            {
                "role": "assistant",
                "content": _TOOL_CALL.sub("", _THINK.sub(" ", text)).strip(),
                "tool_calls": [{"type": "function", "function": dict(call)} for call in calls],
            }
        )
        self._messages += [{"role": "tool", "name": c["name"], "content": r} for c, r in zip(calls, results)]
        self._done = bool(self.done_attribute and getattr(self._instance, self.done_attribute, False))
        reward = self._reward_step(done=self._done)
        observation = "\n".join(f"<tool_response>\n{result}\n</tool_response>" for result in results)
        return observation, reward, self._done, self._info(valid=errors == 0, calls=calls, errors=errors)

    def _check_calls(self, calls: list[ToolCall]) -> None:
        """Reject the whole turn before running anything when a call names no tool or does not fit its signature."""
        for call in calls:
            signature = self._signatures.get(call["name"])
            if signature is None:
                available = ", ".join(self.tool_names) or "none"
                raise ToolCallError(f"Unknown tool {call['name']!r}. Available tools: {available}.")
            try:
                signature.bind(**call["arguments"])
            except TypeError as err:
                raise ToolCallError(
                    f"Bad arguments for tool {call['name']!r} ({err}); its parameters are {signature}."
                ) from None

    def _invalid(self, feedback: str) -> tuple[str, float, bool, dict[str, Any]]:
        return f"Invalid tool call. {feedback}", 0.0, False, self._info(valid=False, calls=[], errors=0)

    def _info(self, valid: bool, calls: list[ToolCall], errors: int) -> dict[str, Any]:
        return {
            INFO_VALID: valid,
            INFO_SUCCESS: self._success(),
            "action": "\n".join(format_tool_call(c) for c in calls) if calls else None,
            "tools": [c["name"] for c in calls],
            "tool_errors": errors,
        }

    def _success(self) -> bool:
        flag = getattr(self._instance, self.success_attribute, None) if self.success_attribute else None
        return flag if isinstance(flag, bool) else self._reward_so_far > 0

    def _reward_step(self, done: bool) -> float:
        if self.reward_at == "end" and not done:
            return 0.0
        total = self._episode_reward()
        reward, self._reward_so_far = total - self._reward_so_far, total
        return reward

    def _episode_reward(self) -> float:
        """The reward functions' value now, summed as TRL sums them (weight 1 each, None counts 0)."""
        row = self._row or {}
        kwargs = {k: [v] for k, v in row.items() if k not in _NOT_REWARD_COLUMNS}
        kwargs.update(
            prompts=[self._prompt_messages], completions=[list(self._messages)], environments=[self._instance]
        )
        total = 0.0
        for func in self.reward_funcs:
            values = _resolve(func(**kwargs))
            if not isinstance(values, (list, tuple)) or len(values) != 1:
                raise TypeError(
                    f"Reward function {getattr(func, '__name__', func)!r} must return a list with one reward per "
                    f"environment (here 1), got {values!r}"
                )
            total += 0.0 if values[0] is None else float(values[0])
        if self._has_get_reward:
            value = _resolve(self._instance.get_reward())
            total += 0.0 if value is None else float(value)
        return total

    # ---- task rows -----------------------------------------------------------------------------------------------

    splits: ClassVar[dict[str, list[dict[str, Any]]]] = {}

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """The rows given as `splits` to `from_trl_environment` (TRL classes own no task list of their own)."""
        if not cls.splits:
            raise NotImplementedError(
                f"environment {cls.name!r} has no task splits: pass rows to the trainer, or give "
                "`from_trl_environment(..., splits={'train': rows, ...})`"
            )
        if split not in cls.splits:
            raise ValueError(f"Unknown split {split!r} for {cls.name!r}; choose one of {sorted(cls.splits)}")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ValueError(f"`count` must be a non-negative int or None, got {count!r}")
        rows = cls.splits[split] if count is None else cls.splits[split][:count]
        return [{**copy.deepcopy(row), "env": cls.name} for row in rows]


class _DeepcopySnapshots(TRLEnvironment):
    """Snapshots that deep-copy the TRL instance and the episode bookkeeping (for instances that copy cleanly)."""

    def snapshot(self) -> tuple:
        if self._row is None:
            raise RuntimeError("snapshot() called before reset()")
        state = (self._instance, self._row, self._prompt_messages, self._messages, self._reward_so_far, self._done)
        return copy.deepcopy(state)

    def restore(self, snapshot: tuple) -> None:
        state = copy.deepcopy(snapshot)  # the snapshot stays reusable
        self._instance, self._row, self._prompt_messages, self._messages, self._reward_so_far, self._done = state


def from_trl_environment(
    environment_class: type | Callable[[], Any] | str,
    reward_funcs: Callable[..., Any] | str | Sequence[Callable[..., Any] | str] | None = None,
    *,
    name: str | None = None,
    snapshots: str | None = None,
    splits: dict[str, list[dict[str, Any]]] | None = None,
    **options: Any,
) -> type[TRLEnvironment]:
    """Register a TRL environment class as a named trl-agents environment and return the new `AgentEnv` class.

    `make_env(name)` (and trainers with `env_name=name`) then build it with these settings, so nothing but the
    name has to travel in configs. Settings are those of `TRLEnvironment`; `make_env(name, **overrides)` may
    override them.

    Args:
        environment_class: The TRL environment class (or factory, or import path).
        reward_funcs: As in `TRLEnvironment`.
        name: Registry name; default `"trl:<ClassName>"`.
        snapshots: None (no snapshot capability), `"replay"` (reset + replay the recorded actions; needs an
            environment that is deterministic given its row) or `"deepcopy"` (copy the instance; needs an instance
            without sockets, processes or locks).
        splits: `{"train": rows, "eval": rows, ...}` served by `task_split`.
        **options: Other `TRLEnvironment` arguments (`instructions`, `done_attribute`, `reward_at`, ...).
    """
    accepted = set(inspect.signature(TRLEnvironment.__init__).parameters) - {
        "self",
        "environment_class",
        "reward_funcs",
    }
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(f"Unknown option(s) {unknown} for from_trl_environment; accepted: {sorted(accepted)}")
    if snapshots not in (None, "replay", "deepcopy"):
        raise ValueError(f"`snapshots` must be None, 'replay' or 'deepcopy', got {snapshots!r}")
    if name is None:
        label = environment_class if isinstance(environment_class, str) else getattr(environment_class, "__name__", "")
        name = f"trl:{str(label).rpartition(':')[2].rpartition('.')[2] or 'environment'}"
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"`name` must be a non-empty string, got {name!r}")
    if splits is not None and not (
        isinstance(splits, dict)
        and all(isinstance(rows, list) and all(isinstance(r, dict) for r in rows) for rows in splits.values())
    ):
        raise ValueError("`splits` must map split names to lists of task-row dicts")
    defaults = {"environment_class": environment_class, "reward_funcs": reward_funcs, **options}
    base = _DeepcopySnapshots if snapshots == "deepcopy" else TRLEnvironment

    def __init__(self, **overrides: Any) -> None:
        base.__init__(self, **{**defaults, **overrides})

    cls = type(
        "TRLEnvironment",
        (base,),
        {
            "name": name,
            "splits": dict(splits or {}),
            "__init__": __init__,
            "__module__": __name__,
            "__doc__": base.__doc__,
        },
    )
    cls.__qualname__ = f"from_trl_environment[{name}]"  # same name -> same qualname, so re-registering replaces
    if snapshots == "replay":
        cls = replay_snapshots(cls)
    return register_env(cls)


# ---- our environments as TRL environment_factory classes -----------------------------------------------------------

# Marks the classes built by `to_trl_environment` (so `trl_environment_reward` can skip other environments).
_TRL_CLASS_MARKER = "_trl_agents_env_name"


def to_trl_environment(env_name: str, *, tool_name: str = "act", **env_kwargs: Any) -> type:
    """An `environment_factory` class for TRL's `GRPOTrainer` that plays the registered environment `env_name`.

    Each instance holds one `make_env(env_name, **env_kwargs)`. Its `reset(**row)` resets it with the dataset row
    (minus TRL's `prompt` column and the multi-environment `environment` column; rows from
    `get_env_class(env_name).task_split(...)` work as they are, TRL supplies an empty prompt when the column is
    missing) and returns the env's instructions, a line saying to call the tool, the task description and the first
    observation. Its one tool, `act(action: str) -> str` (renamed by `tool_name`), steps the env with the action
    text and returns the observation, plus `The episode is over: solved.` (or `not solved.`) on the last step;
    calling it after that raises, which TRL shows the model as an error. Rejected actions return the env's feedback
    (no exception: the model should read it and retry).

    Score episodes with `reward_funcs=trl_environment_reward` (each episode's return). Instance attributes for your
    own reward functions: `episode_return`, `done`, `success`, `num_steps`, `num_invalid`, `last_info`, and the
    AgentEnv itself as `agent_env`.

    Args:
        env_name: A registered environment (e.g. `"sokoban"`).
        tool_name: Name of the tool the model calls (e.g. `"move"`).
        **env_kwargs: The environment's constructor arguments (checked now).
    """
    env_class = get_env_class(env_name)
    if (
        not isinstance(tool_name, str)
        or not tool_name.isidentifier()
        or tool_name.startswith("_")
        or tool_name in _NOT_TOOLS
    ):
        raise ValueError(f"`tool_name` must be a public identifier other than reset/get_reward, got {tool_name!r}")
    make_env(env_name, **env_kwargs).close()  # bad constructor arguments fail here, not inside TRL's trainer

    def __init__(self) -> None:
        self.agent_env = make_env(env_name, **env_kwargs)
        self.episode_return, self.done, self.success = 0.0, False, False
        self.num_steps, self.num_invalid, self.last_info = 0, 0, {}

    def reset(self, **row: Any) -> str:
        named = row.get("env")
        if named is not None and named != env_name:
            raise ValueError(f"This environment class plays {env_name!r}, but the row names env={named!r}")
        task = {k: v for k, v in row.items() if k not in ("prompt", "environment")}
        observation = self.agent_env.reset(task)
        self.episode_return, self.done, self.success = 0.0, False, False
        self.num_steps, self.num_invalid, self.last_info = 0, 0, {}
        parts = [
            self.agent_env.instructions,
            f"Play by calling the `{tool_name}` tool with your action; it returns what you observe next.",
            self.agent_env.task_description(),
            observation,
        ]
        text = "\n\n".join(part.strip("\n") for part in parts if part and part.strip())
        # TRL appends this to the prompt's last user message verbatim: keep it apart from any text already there.
        return "\n\n" + text if _prompt_text(row.get("prompt")).strip() else text

    def act(self, action: str) -> str:
        if self.done:
            outcome = "solved" if self.success else "not solved"
            raise ValueError(f"The episode is over ({outcome}); do not call `{tool_name}` again.")
        observation, reward, done, info = self.agent_env.step(action)
        self.num_steps += 1
        self.episode_return += float(reward)
        self.num_invalid += 0 if info.get(INFO_VALID, True) else 1
        self.done, self.success, self.last_info = bool(done), bool(info.get(INFO_SUCCESS, False)), dict(info)
        if done:
            observation += f"\nThe episode is over: {'solved' if self.success else 'not solved'}."
        return observation

    act.__name__ = act.__qualname__ = tool_name
    act.__doc__ = (
        f"Take one turn in the {env_name} environment.\n\n"
        "Args:\n"
        "    action: Your action for this turn, written as the instructions ask.\n\n"
        "Returns:\n"
        "    What you observe after the action."
    )
    # An environment with tools (`AgentEnv.tools`) offers them to TRL as they are: one method per tool, each a turn
    # of the environment with that one call (instead of `act`, which would take the call's markup as text).
    tools = {schema["function"]["name"]: _tool_method(schema, act) for schema in env_class.tools}

    def _close(self) -> None:
        self.agent_env.close()

    class_name = f"{env_class.__name__}ToolEnvironment"
    namespace = {
        "__init__": __init__,
        "reset": reset,
        **(tools or {tool_name: act}),
        "_close": _close,
        "__module__": __name__,
        "__qualname__": class_name,
        "__doc__": f"The trl-agents environment {env_name!r} as a TRL environment_factory class (tool `{tool_name}`).",
        _TRL_CLASS_MARKER: env_name,
    }
    return type(class_name, (), namespace)


_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict, "array": list}


def _tool_method(schema: dict[str, Any], act: Callable[..., str]) -> Callable[..., str]:
    """A TRL tool method for one tool schema of an environment: its parameters, type hints and Google-style
    docstring rebuilt from the schema (TRL derives the schema back from them), stepping the environment with the
    call written in the model's markup."""
    function = schema["function"]
    name, parameters = function["name"], function.get("parameters", {})
    properties, required = parameters.get("properties", {}), set(parameters.get("required", ()))

    def method(self, **arguments: Any) -> str:
        return act(self, format_tool_call({"name": name, "arguments": arguments}))

    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for key, spec in properties.items():
        annotations[key] = _JSON_TYPES.get(spec.get("type"), str)
        signature.append(inspect.Parameter(key, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotations[key],
                                           default=inspect.Parameter.empty if key in required else None))
    method.__signature__ = inspect.Signature(signature, return_annotation=str)
    method.__annotations__ = {**annotations, "return": str}
    method.__name__ = method.__qualname__ = name
    lines = [function.get("description", name), ""]
    if properties:
        lines += ["Args:", *(f"    {key}: {spec.get('description', key)}" for key, spec in properties.items()), ""]
    method.__doc__ = "\n".join([*lines, "Returns:", "    What you observe after the call."])
    return method


def trl_environment_reward(environments: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL reward function: the return of each episode played through a `to_trl_environment` class.

    Other environments (in multi-environment runs) get None, which TRL ignores.
    """
    return [float(env.episode_return) if getattr(type(env), _TRL_CLASS_MARKER, None) else None for env in environments]
