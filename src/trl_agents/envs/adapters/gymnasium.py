"""gymnasium adapter: a gymnasium environment with a text rendering and a discrete action space as an `AgentEnv`.

The observation is the environment's `render_mode="ansi"` text with ANSI colour codes removed (a highlighted cell,
such as FrozenLake's player, becomes `highlight_char`), or whatever a user-provided `observation_to_text` returns.
Actions are parsed from the answer by name (e.g. FrozenLake's `left`/`down`/`right`/`up`) or by index, or by a
user-provided `text_to_action`.

Example:
    >>> from trl_agents.envs.adapters.gymnasium import GymnasiumEnv
    >>> env = GymnasiumEnv(env_id="FrozenLake-v1", env_kwargs={"is_slippery": False})
    >>> print(env.reset({"seed": 0}))
    PFFF
    FHFH
    FFFH
    HFFG
    >>> observation, reward, done, info = env.step("<action>down</action>")
    >>> print(observation)
    SFFF
    PHFH
    FFFH
    HFFG
    >>> info["action"], env.step("north")[3]["valid"]
    ('down', False)
"""

from __future__ import annotations

import copy
import numbers
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..base import INFO_SUCCESS, INFO_VALID, AgentEnv
from ..parsing import extract_answer
from ..registry import register_env

_INSTALL_HINT = 'pip install "trl-agents[envs]" (or gymnasium)'

# An ANSI "select graphic rendition" run: ESC [ codes m ... (text) ... ESC [ 0 m.
_STYLED = re.compile(r"\x1b\[([0-9;]*)m(.*?)\x1b\[0m", re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# toy-text renders print the previous action on a line of its own, e.g. "  (Down)": not part of the state.
_LAST_ACTION_LINE = re.compile(r"^\s*\([A-Za-z]+\)\s*$")


@dataclass(frozen=True)
class _KnownEnv:
    action_names: tuple[str, ...]
    description: str
    success: str  # "terminated" or "positive_terminal" (terminated with a reward > 0)


# Defaults for gymnasium's toy-text environments, by the env id without its version.
KNOWN_ENVS: dict[str, _KnownEnv] = {
    "FrozenLake": _KnownEnv(
        ("left", "down", "right", "up"),
        "Walk from the start S to the goal G across the frozen lake without falling into a hole H (F is frozen "
        "ice; P marks your position). The ice may be slippery.",
        "positive_terminal",
    ),
    "CliffWalking": _KnownEnv(
        ("up", "right", "down", "left"),
        "Walk from the bottom-left start to T (bottom-right). x marks your position, o is safe ground and C is the "
        "cliff: stepping on it costs -100 and sends you back to the start. Every step costs -1.",
        "terminated",
    ),
    "Taxi": _KnownEnv(
        ("south", "north", "east", "west", "pickup", "dropoff"),
        "Drive the taxi to the passenger, pick them up and drop them off at their destination (R, G, Y or B).",
        "terminated",
    ),
}


def ansi_to_text(text: str, highlight_char: str | None = "P") -> str:
    """Plain text from an ANSI render: characters on a coloured background become `highlight_char` (None keeps
    them), every other escape code is removed, previous-action lines such as `"  (Down)"` and blank edges dropped.

    Example:
        >>> ansi_to_text("  (Down)\\n\\x1b[41mS\\x1b[0mFF\\nFHG\\n")
        'PFF\\nFHG'
    """

    def replace(match: re.Match) -> str:
        codes = [int(c) for c in match.group(1).split(";") if c.isdigit()]
        highlighted = any(40 <= c <= 47 or 100 <= c <= 107 for c in codes)
        inner = match.group(2)
        return highlight_char * len(inner) if highlighted and highlight_char is not None else inner

    plain = _ANSI.sub("", _STYLED.sub(replace, text))
    lines = [line.rstrip() for line in plain.split("\n") if not _LAST_ACTION_LINE.match(line)]
    return "\n".join(lines).strip("\n")


@register_env
class GymnasiumEnv(AgentEnv):
    """A gymnasium environment (`gymnasium>=1.0`) as an `AgentEnv`.

    A task row is `{"seed": s}`, optionally with `env_id` and `env_kwargs` (they override the constructor's). The
    seed goes to `env.reset(seed=s)`, so transitions (e.g. slippery ice) are reproducible.

    Args:
        env_id: The gymnasium id, e.g. `"FrozenLake-v1"`, `"CliffWalking-v1"`, `"Taxi-v4"`.
        env_kwargs: Keyword arguments for `gymnasium.make` (e.g. `{"is_slippery": False}`).
        action_names: Names of the discrete actions, by index. Default: gymnasium's meanings for FrozenLake,
            CliffWalking and Taxi, else none (answers are then action indices).
        observation_to_text: `f(observation, env) -> str` replacing the ANSI render (`env` is the gymnasium env).
        text_to_action: `f(answer, env) -> action or None` replacing the name/index parser; None marks the answer
            invalid. Needed for non-discrete action spaces.
        is_success: `f(reward, terminated, truncated, info) -> bool` deciding success at the last step. Default (our
            choice): `terminated` for CliffWalking and Taxi, `terminated and reward > 0` otherwise.
        description: Text repeated in every prompt (rules, legend). Default: a line for the known toy-text envs.
        highlight_char: What a highlighted (coloured background) character of the ANSI render becomes, e.g.
            FrozenLake's player; None keeps the character. Other colours are dropped, so Taxi's passenger and
            destination colours are lost: give Taxi an `observation_to_text`.
    """

    name = "gymnasium"
    requires = ("gymnasium",)
    task_keys = ("seed",)
    instructions = (
        "You control the agent of an environment shown as text. Each turn, answer with exactly one action: its "
        "name (or its number) as listed in the task."
    )

    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 1000, "eval": 100}

    def __init__(
        self,
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        action_names: list[str] | tuple[str, ...] | None = None,
        observation_to_text: Callable[[Any, Any], str] | None = None,
        text_to_action: Callable[[str, Any], Any] | None = None,
        is_success: Callable[[float, bool, bool, dict], bool] | None = None,
        description: str | None = None,
        highlight_char: str | None = "P",
    ):
        try:
            import gymnasium  # noqa: F401
        except ImportError as err:
            raise ImportError(f"The gymnasium adapter needs the gymnasium package: {_INSTALL_HINT}") from err
        if env_id is not None and not isinstance(env_id, str):
            raise ValueError(f"`env_id` must be a gymnasium id such as 'FrozenLake-v1', got {env_id!r}")
        if env_kwargs is not None and not isinstance(env_kwargs, dict):
            raise ValueError(f"`env_kwargs` must be a dict of gymnasium.make arguments, got {env_kwargs!r}")
        if action_names is not None:
            if not isinstance(action_names, (list, tuple)) or not all(
                isinstance(n, str) and n.strip() for n in action_names
            ):
                raise ValueError(f"`action_names` must be a list of non-empty strings, got {action_names!r}")
            lowered = [n.strip().lower() for n in action_names]
            if len(set(lowered)) != len(lowered):
                raise ValueError(f"`action_names` must be distinct (case-insensitive), got {action_names!r}")
        for arg, value in (
            ("observation_to_text", observation_to_text),
            ("text_to_action", text_to_action),
            ("is_success", is_success),
        ):
            if value is not None and not callable(value):
                raise ValueError(f"`{arg}` must be callable, got {value!r}")
        if highlight_char is not None and (not isinstance(highlight_char, str) or len(highlight_char) != 1):
            raise ValueError(f"`highlight_char` must be one character or None, got {highlight_char!r}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.action_names = None if action_names is None else tuple(n.strip() for n in action_names)
        self.observation_to_text = observation_to_text
        self.text_to_action = text_to_action
        self.is_success = is_success
        self.description = description
        self.highlight_char = highlight_char
        self._gym_env = None
        self._made_with: tuple[str, dict[str, Any]] | None = None
        self._names: tuple[str, ...] = ()
        self._observation: Any = None
        self._done = False
        self._steps = 0

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Make (or reuse) the task's gymnasium env, reset it with the task's seed and return its text."""
        env_id = task.get("env_id") or self.env_id  # a dataset fills missing keys with None
        if not isinstance(env_id, str):
            raise ValueError(
                "A gymnasium task needs an 'env_id' (e.g. 'FrozenLake-v1'), in the row or as the `env_id=` "
                f"constructor argument; got {env_id!r}"
            )
        seed = task.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"A gymnasium task needs an integer 'seed', got {seed!r} (keys {sorted(task)})")
        task_kwargs = task.get("env_kwargs") or {}
        if not isinstance(task_kwargs, dict):
            raise ValueError(f"Task field 'env_kwargs' must be a dict, got {task_kwargs!r}")
        kwargs = {**self.env_kwargs, **task_kwargs}
        if self._gym_env is None or self._made_with != (env_id, kwargs):
            self._make(env_id, kwargs)
        self._observation, _info = self._gym_env.reset(seed=int(seed))
        self._done = False
        self._steps = 0
        return self.render()

    def _make(self, env_id: str, kwargs: dict[str, Any]) -> None:
        import gymnasium

        make_kwargs = dict(kwargs)
        if self.observation_to_text is None:
            make_kwargs.setdefault("render_mode", "ansi")
            if make_kwargs["render_mode"] != "ansi":
                raise ValueError(
                    f"The text observation comes from render_mode='ansi' (got {make_kwargs['render_mode']!r}); "
                    "pass observation_to_text= to render observations yourself"
                )
        try:
            env = gymnasium.make(env_id, **make_kwargs)
        except gymnasium.error.Error as err:
            raise ValueError(f"gymnasium cannot make {env_id!r} with {kwargs}: {err}") from err
        space = env.action_space
        if self.text_to_action is None and not isinstance(space, gymnasium.spaces.Discrete):
            env.close()
            raise ValueError(
                f"{env_id!r} has a {type(space).__name__} action space; the adapter parses discrete actions only, "
                "so pass text_to_action= to turn answers into actions"
            )
        known = KNOWN_ENVS.get(env_id.split("-v")[0])
        names = self.action_names or (known.action_names if known else ())
        if names and isinstance(space, gymnasium.spaces.Discrete) and len(names) != space.n:
            env.close()
            raise ValueError(f"`action_names` has {len(names)} names but {env_id!r} has {space.n} actions")
        if self._gym_env is not None:
            self._gym_env.close()
        self._gym_env, self._made_with, self._names = env, (env_id, dict(kwargs)), tuple(names)

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        env = self._require_env()
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        answer = extract_answer(action_text)
        action, name = self._parse(answer)
        if action is None:
            info = {INFO_VALID: False, INFO_SUCCESS: False, "action": None}
            return f"{self._invalid_feedback()}\n{self.render()}", 0.0, False, info
        self._observation, reward, terminated, truncated, gym_info = env.step(action)
        self._steps += 1
        self._done = bool(terminated or truncated)
        reward = float(reward)
        success = False
        if self._done:
            success = bool(self._success(reward, bool(terminated), bool(truncated), gym_info))
        info = {
            INFO_VALID: True,
            INFO_SUCCESS: success,
            "action": name,
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "gym_info": {k: v for k, v in gym_info.items() if isinstance(v, (bool, int, float, str))},
        }
        return self.render(), reward, self._done, info

    def _parse(self, answer: str) -> tuple[Any, str | None]:
        """(gymnasium action, canonical name) from the answer, or (None, None) when it names no single action."""
        env = self._gym_env
        if self.text_to_action is not None:
            action = self.text_to_action(answer, env)
            return (None, None) if action is None else (action, answer.strip())
        n = env.action_space.n
        stripped = answer.strip().strip("[]()'\"`.").strip()
        if re.fullmatch(r"\d+", stripped) and int(stripped) < n:
            index = int(stripped)
            return index, self._names[index] if self._names else str(index)
        if self._names:
            words = set(re.findall(r"[a-z]+", answer.lower()))
            found = [i for i, name in enumerate(self._names) if name.lower() in words]
            if len(found) == 1:
                return found[0], self._names[found[0]]
        return None, None

    def _invalid_feedback(self) -> str:
        if self.text_to_action is not None:
            return "Invalid action: the answer could not be turned into an action."
        n = self._gym_env.action_space.n
        if self._names:
            listed = ", ".join(self._names)
            return f"Invalid action. Reply with exactly one of: {listed} (or its number, 0-{n - 1})."
        return f"Invalid action. Reply with one action number from 0 to {n - 1}."

    def _success(self, reward: float, terminated: bool, truncated: bool, info: dict) -> bool:
        if self.is_success is not None:
            return self.is_success(reward, terminated, truncated, info)
        known = KNOWN_ENVS.get(self._made_with[0].split("-v")[0])
        if known is not None and known.success == "terminated":
            return terminated
        return terminated and reward > 0

    # ---- text ------------------------------------------------------------------------------------------------------

    def render(self) -> str:
        """The current observation as text (`observation_to_text`, else the cleaned ANSI render)."""
        env = self._require_env()
        if self.observation_to_text is not None:
            return str(self.observation_to_text(self._observation, env))
        return ansi_to_text(env.render(), self.highlight_char)

    def task_description(self) -> str:
        """The env id, the description and the action list (repeated in every prompt)."""
        env_id = self._made_with[0] if self._made_with else self.env_id
        known = KNOWN_ENVS.get(str(env_id).split("-v")[0])
        description = self.description if self.description is not None else (known.description if known else "")
        lines = [f"Environment: {env_id}."]
        if description:
            lines.append(description)
        if self._names:
            lines.append("Actions: " + ", ".join(f"{name} ({i})" for i, name in enumerate(self._names)) + ".")
        elif self.text_to_action is None and self._gym_env is not None:
            lines.append(f"Actions: a number from 0 to {self._gym_env.action_space.n - 1}.")
        return "\n".join(lines)

    def admissible_actions(self) -> list[str] | None:
        """The action names (or numbers) of a discrete action space; None with a custom `text_to_action`."""
        if self.text_to_action is not None or self._gym_env is None:
            return None
        return list(self._names) or [str(i) for i in range(self._gym_env.action_space.n)]

    def _require_env(self):
        if self._gym_env is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._gym_env

    def close(self) -> None:
        if self._gym_env is not None:
            self._gym_env.close()
            self._gym_env = None
            self._made_with = None

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        """A deep copy of the gymnasium env (its state and random generator) and the adapter's episode state."""
        env = self._require_env()
        state = (env, self._made_with, self._names, self._observation, self._done, self._steps)
        return copy.deepcopy(state, _shared_tables(env))

    def restore(self, snapshot: tuple) -> None:
        # Copy again so that the snapshot stays reusable.
        env, made_with, names, observation, done, steps = copy.deepcopy(snapshot, _shared_tables(snapshot[0]))
        self._gym_env, self._made_with, self._names = env, made_with, names
        self._observation, self._done, self._steps = observation, done, steps

    def state_key(self) -> Hashable:
        """The last gymnasium observation, made hashable (numpy arrays become shape + bytes). For the fully observed
        toy-text envs (FrozenLake, CliffWalking, Taxi) it is the whole state."""
        self._require_env()
        return _hashable(self._observation)

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded rows for the env named by `env_id=` (required): `"train"` seeds from 0, `"eval"` from 1,000,000.
        The rows carry `env_id` and `env_kwargs`, so any adapter instance plays the same tasks."""
        if split not in cls.SPLIT_SEED_START:
            raise ValueError(f"Unknown gymnasium split {split!r}; choose one of {sorted(cls.SPLIT_SEED_START)}")
        env_id = env_kwargs.get("env_id")
        if not isinstance(env_id, str):
            raise ValueError("GymnasiumEnv.task_split needs the env id: task_split('train', env_id='FrozenLake-v1')")
        cls(**env_kwargs)  # validate the arguments
        if count is None:
            count = cls.SPLIT_DEFAULT_COUNT[split]
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 0 <= count <= 1_000_000:
            raise ValueError(f"`count` must be an integer in [0, 1_000_000], got {count!r}")
        start = cls.SPLIT_SEED_START[split]
        # Empty dicts are left out: a datasets column of empty structs cannot be stored.
        extra = {"env_kwargs": dict(env_kwargs["env_kwargs"])} if env_kwargs.get("env_kwargs") else {}
        return [
            {"env": cls.name, "task_id": f"{cls.name}-{env_id}-{split}-{s}", "env_id": env_id, "seed": s, **extra}
            for s in range(start, start + int(count))
        ]


def _shared_tables(env: Any) -> dict[int, Any]:
    """A deepcopy memo that shares the toy-text transition table `P` (read-only; Taxi's has 3,000 entries and copying
    it would dominate the snapshot cost) between an env and its copies."""
    table = getattr(getattr(env, "unwrapped", None), "P", None)
    return {id(table): table} if isinstance(table, dict) else {}


def _hashable(value: Any) -> Hashable:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if hasattr(value, "tobytes") and hasattr(value, "shape"):  # numpy arrays and scalars
        return (tuple(value.shape), str(value.dtype), value.tobytes())
    if isinstance(value, (tuple, list)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return repr(value)
