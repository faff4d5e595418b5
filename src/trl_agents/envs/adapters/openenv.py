"""OpenEnv in both directions: play an OpenEnv server as an `AgentEnv`, and serve any `AgentEnv` over OpenEnv.

[OpenEnv](https://github.com/meta-pytorch/OpenEnv) (package `openenv-core`, 0.3.0 here) is a client/server standard
for RL environments: a FastAPI server wraps an `Environment` (`reset(seed, episode_id, **kw)`, `step(action)`,
`state`) with typed pydantic `Action`/`Observation`/`State` models, and clients talk to it by base URL. What this
module relies on, read from openenv-core 0.3.0 (`openenv/core/env_server/http_server.py`, `env_client.py`):

- **Sessions live on a WebSocket** at `<base_url>/ws`: each connection gets its own environment instance. Messages
  are JSON: `{"type": "reset", "data": {...reset kwargs}}`, `{"type": "step", "data": {...action fields}}`,
  `{"type": "state"}`, `{"type": "close"}`; the server answers `{"type": "observation", "data": {"observation":
  {...}, "reward": r, "done": d}}` or `{"type": "error", "data": {"message": ..., "code": ...}}`.
- The HTTP routes `POST /reset` and `POST /step` are **stateless** (every request builds, uses and closes a fresh
  environment), so multi-step play needs the WebSocket; `GET /health`, `/metadata`, `/schema` describe the server.
- An observation's `metadata` is **not sent** (the server drops it when serialising), so anything a client must see
  has to be an observation field.
- There is no snapshot/restore in the protocol, so the client below has no `snapshot` capability.

`OpenEnvClient` (registered as `"openenv"`) speaks that WebSocket protocol directly with the `websockets` package
(a dependency of openenv-core), synchronously, one connection per env instance: importing `openenv.core` costs
several seconds (it pulls gradio and fastmcp) and its sync wrapper runs an event-loop thread per client, neither of
which a pool of env instances needs. `create_openenv_app` / `serve_openenv` / `start_openenv_server` go the other
way and serve any registered environment with openenv-core's own `HTTPEnvServer`, so OpenEnv's clients
(`GenericEnvClient`, typed `EnvClient`s) and TRL's OpenEnv recipes can play it.

Example:
    >>> from trl_agents.envs import make_env
    >>> from trl_agents.envs.adapters.openenv import start_openenv_server
    >>> with start_openenv_server("sokoban") as server:  # a loopback server on a free port, in a thread
    ...     env = make_env("openenv", base_url=server.base_url)
    ...     print(env.reset({"layout": "# # # # #\\n# P X O #\\n# # # # #"}))
    ...     print(env.step("right")[1:3])
    ...     env.close()
    # # # # #
    # P X O #
    # # # # #
    (1.0, True)
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, NamedTuple, Self

from ..base import INFO_SUCCESS, INFO_VALID, AgentEnv
from ..registry import get_env_class, make_env, register_env

_INSTALL_HINT = 'pip install "trl-agents[envs]"'

# Keys of a task row that are trl-agents bookkeeping, not arguments of the remote environment's reset.
_ROW_BOOKKEEPING_KEYS = ("env", "task_id", "base_url", "prompt")

# Observation fields tried, in order, to find the text of an observation from a server we did not write: `text` is
# what `serve_openenv` sends, `prompt` is OpenEnv's TextArena wrapper, `echoed_message` its echo env.
_TEXT_FIELDS = ("text", "observation", "prompt", "message", "content", "echoed_message", "output", "result")

# Error codes of OpenEnv's WebSocket endpoint that end the session (openenv-core 0.3.0, `WSErrorCode`).
_SESSION_ERROR_CODES = ("CAPACITY_REACHED", "FACTORY_ERROR", "SESSION_ERROR")

# Path prefix of the extra routes `create_openenv_app` adds next to OpenEnv's own (instructions and task splits).
_EXTRA_ROUTES = "/trl_agents"


def _import_websocket_client():
    try:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
        from websockets.sync.client import connect
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ImportError(
            f"The OpenEnv adapter needs the `websockets` package (installed with openenv-core): {_INSTALL_HINT}"
        ) from err
    return connect, ConnectionClosed, InvalidHandshake, InvalidURI


def _websocket_url(base_url: str) -> str:
    """`http(s)://host:port/path` -> `ws(s)://host:port/path/ws` (the session endpoint of an OpenEnv server)."""
    url = base_url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
            break
    else:
        if not url.startswith(("ws://", "wss://")):
            url = "ws://" + url
    return url + "/ws"


def _http_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            return http + url[len(ws) :]
    return url if url.startswith(("http://", "https://")) else "http://" + url


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


def _json_safe(value: Any) -> Any:
    """A JSON-compatible copy of `value` (info dicts may hold tuples, sets, numpy scalars or infinities)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_json_safe(v) for v in items]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        try:
            return _json_safe(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _http_get_json(url: str, timeout: float) -> Any:
    """GET `url` and decode its JSON body; raises `urllib.error.HTTPError` / `URLError` as urllib does."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    opener = (
        urllib.request.build_opener(urllib.request.ProxyHandler({}))
        if _is_loopback(url)
        else urllib.request.build_opener()
    )
    with opener.open(request, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8"))


# ---- client: an OpenEnv server played as an AgentEnv ---------------------------------------------------------------


def default_observation_to_text(observation: dict[str, Any]) -> str:
    """The text of an OpenEnv observation dict (our choice, for servers that do not send trl-agents' `text` field).

    The first string field among `text`, `observation`, `prompt`, `message`, `content`, `echoed_message`, `output`,
    `result`; else the only string field; else the whole observation as sorted JSON. Servers whose text is spread
    over several fields (e.g. TextArena's `messages` list) need their own `observation_to_text`.
    """
    for key in _TEXT_FIELDS:
        if isinstance(observation.get(key), str):
            return observation[key]
    strings = [value for value in observation.values() if isinstance(value, str)]
    if len(strings) == 1:
        return strings[0]
    return json.dumps(observation, sort_keys=True, default=str)


@register_env
class OpenEnvClient(AgentEnv):
    """An environment running on an OpenEnv server, played over its WebSocket session endpoint.

    Each instance holds one WebSocket connection, hence one environment on the server (OpenEnv creates one per
    connection). `reset(task)` sends the task row as reset arguments (without the bookkeeping keys `env`, `task_id`,
    `base_url`, `prompt`): OpenEnv servers take `seed`, `episode_id` and whatever extra arguments their environment's
    `reset` accepts (servers from `serve_openenv` pass the whole row to the served env). `step(text)` turns the
    model's text into an action with `action_from_text` and sends it.

    `info` of every step: `valid` and `success` (the observation's bool fields of those names when the server sends
    them, as `serve_openenv` does; otherwise `valid=True`, and `success = done and reward > 0`, our choice), plus
    the served env's own info when the server is a trl-agents one, or the raw observation dict under
    `"observation"` otherwise. A missing reward counts as 0.

    No snapshots: the OpenEnv protocol has no way to copy or restore a session (deterministic servers can still be
    wrapped with `trl_agents.envs.replay_snapshots`, at the cost of a replay per restore).

    Args:
        base_url: The server, e.g. `"http://localhost:8000"` or `"https://openenv-echo-env.hf.space"` (`ws://` works
            too). A task row may name its own `base_url`, which then wins (the client reconnects when it changes).
        action_from_text: How the model's text becomes an action: a field name (the action is `{field: text}`), or a
            callable `text -> dict`, returning None for text it cannot turn into an action (then `valid=False` and
            nothing is sent). Default `"message"`, the text field of OpenEnv's text environments (echo, TextArena)
            and of `serve_openenv` servers (our choice, envs/openenv/README.md).
        observation_to_text: How an observation dict becomes the text the model sees: a field name, a callable
            `dict -> str`, or None for `default_observation_to_text`.
        instructions: The system prompt. None asks the server: trl-agents servers report their env's instructions;
            other servers give `""`.
        connect_timeout: Seconds to open the connection before failing with a `ConnectionError` naming the URL.
        message_timeout: Seconds to wait for each reply before failing with a `TimeoutError` naming the URL.
    """

    name = "openenv"
    requires = ("websockets",)
    instructions = ""

    def __init__(
        self,
        base_url: str | None = None,
        action_from_text: str | Callable[[str], dict[str, Any] | None] = "message",
        observation_to_text: str | Callable[[dict[str, Any]], str] | None = None,
        instructions: str | None = None,
        connect_timeout: float = 10.0,
        message_timeout: float = 60.0,
    ):
        self._ws_api = _import_websocket_client()
        if base_url is not None and (not isinstance(base_url, str) or not base_url.strip()):
            raise ValueError(f"`base_url` must be a URL such as 'http://localhost:8000', got {base_url!r}")
        if not (isinstance(action_from_text, str) and action_from_text) and not callable(action_from_text):
            raise ValueError(
                "`action_from_text` must be an action field name (e.g. 'message') or a callable text -> dict, got "
                f"{action_from_text!r}"
            )
        if (
            observation_to_text is not None
            and not isinstance(observation_to_text, str)
            and not callable(observation_to_text)
        ):
            raise ValueError(
                "`observation_to_text` must be None, an observation field name or a callable dict -> str, got "
                f"{observation_to_text!r}"
            )
        if instructions is not None and not isinstance(instructions, str):
            raise ValueError(f"`instructions` must be a string or None, got {instructions!r}")
        for field_name, value in (("connect_timeout", connect_timeout), ("message_timeout", message_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"`{field_name}` must be a positive number of seconds, got {value!r}")
        self.base_url = base_url.strip() if base_url else None
        self.action_from_text = action_from_text
        self.observation_to_text = observation_to_text
        self._fixed_instructions = instructions
        if instructions is not None:
            self.instructions = instructions
        self.connect_timeout = float(connect_timeout)
        self.message_timeout = float(message_timeout)
        self._ws = None
        self._url: str | None = None
        self._observation = ""
        self._task_description = ""
        self._admissible: list[str] | None = None
        self._done = False
        self._in_episode = False

    # ---- connection ----------------------------------------------------------------------------------------------

    def _connect(self, base_url: str) -> None:
        if self._ws is not None and self._url == base_url:
            return
        self.close()
        connect, _closed, invalid_handshake, invalid_uri = self._ws_api
        ws_url = _websocket_url(base_url)
        # Like OpenEnv's own client: never send loopback traffic through an HTTP proxy from the environment.
        proxy = None if _is_loopback(ws_url) else True
        try:
            self._ws = connect(
                ws_url, open_timeout=self.connect_timeout, proxy=proxy, max_size=100 * 2**20, compression=None
            )
        except (OSError, TimeoutError, invalid_handshake, invalid_uri) as err:
            raise ConnectionError(
                f"Could not open an OpenEnv session at {base_url} ({ws_url}) within {self.connect_timeout:g} s: "
                f"{type(err).__name__}: {err}. Is the server running there? Start one (e.g. "
                "`trl_agents.envs.adapters.openenv.serve_openenv(...)`) or fix `base_url`."
            ) from err
        self._url = base_url
        if self._fixed_instructions is None:
            self.instructions = self._server_instructions(base_url)

    def _server_instructions(self, base_url: str) -> str:
        """The served env's instructions when the server is a trl-agents one; `""` for other OpenEnv servers."""
        try:
            info = _http_get_json(_http_url(base_url) + _EXTRA_ROUTES + "/info", timeout=self.connect_timeout)
        except (urllib.error.URLError, OSError, ValueError):
            return ""
        return info.get("instructions", "") if isinstance(info, dict) else ""

    def _request(self, message: dict[str, Any], what: str) -> dict[str, Any]:
        """Send one message on the session and return the reply's `data`; an error reply raises `_ServerError`."""
        _connect, connection_closed, _handshake, _uri = self._ws_api
        url = self._url
        try:
            self._ws.send(json.dumps(message))
            raw = self._ws.recv(timeout=self.message_timeout)
        except TimeoutError as err:
            self._drop_connection()
            raise TimeoutError(
                f"The OpenEnv server at {url} did not answer `{what}` within {self.message_timeout:g} s "
                "(raise `message_timeout` for slow environments)."
            ) from err
        except (connection_closed, OSError) as err:
            # A server that refuses a session (e.g. at capacity) sends an error message and closes at once: read
            # that message if it is waiting, it says why.
            try:
                raw = self._ws.recv(timeout=0)
            except Exception:  # noqa: BLE001 - nothing was waiting; report the lost connection
                self._drop_connection()
                raise ConnectionError(f"Lost the OpenEnv session at {url} during `{what}`: {err}") from err
        reply = json.loads(raw)
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            message, code = str(data.get("message", "unknown error")), str(data.get("code", "UNKNOWN"))
            if code in _SESSION_ERROR_CODES:  # the server refused or lost the session itself, not this request
                self._drop_connection()
                hint = (
                    " (raise the server's `max_concurrent_envs`, or use fewer env instances)"
                    if code == "CAPACITY_REACHED"
                    else ""
                )
                raise ConnectionError(f"The OpenEnv server at {url} refused the session: {message} ({code}){hint}")
            raise _ServerError(message, code)
        return reply.get("data") or {}

    def _drop_connection(self) -> None:
        ws, self._ws, self._url = self._ws, None, None
        self._in_episode = False
        if ws is not None:
            with contextlib.suppress(Exception):  # the connection may already be broken
                ws.close()

    def close(self) -> None:
        """End the session: ask the server to close it and wait (briefly) until it has, so that the server does not
        try to close a connection the client already dropped."""
        if self._ws is not None:
            # ConnectionClosed is the normal way out of this loop; anything else: best effort, we are leaving anyway.
            with contextlib.suppress(Exception):
                self._ws.send(json.dumps({"type": "close"}))
                deadline = time.monotonic() + min(self.message_timeout, 5.0)
                while time.monotonic() < deadline:
                    self._ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
        self._drop_connection()

    # ---- episode -------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Open (or reuse) the session at the task's server and reset it with the task row; return the first text."""
        if not isinstance(task, dict):
            raise ValueError(f"An OpenEnv task must be a dict (a dataset row), got {type(task).__name__}")
        base_url = task.get("base_url") or self.base_url
        if not base_url or not isinstance(base_url, str):
            raise ValueError(
                "The OpenEnv client needs a server: pass `base_url` to the constructor (env_kwargs) or put a "
                "'base_url' field in the task row, e.g. 'http://localhost:8000'."
            )
        arguments = {k: v for k, v in task.items() if k not in _ROW_BOOKKEEPING_KEYS}
        try:
            json.dumps(arguments)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"The task row's fields must be JSON-serialisable to send them to the server: {err}"
            ) from err
        self._connect(base_url)
        try:
            data = self._request({"type": "reset", "data": arguments}, "reset")
        except _ServerError as err:
            raise ValueError(
                f"The OpenEnv server at {base_url} rejected reset with {sorted(arguments)}: {err.message} "
                f"({err.code}). Check the task row's fields against what the server's environment expects."
            ) from err
        observation, _reward, done, _info = self._parse(data)
        self._observation, self._done, self._in_episode = observation, done, True
        return observation

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        if not self._in_episode or self._ws is None:
            raise RuntimeError("Call reset(task) before step(): there is no open OpenEnv session")
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        action = self._action(action_text)
        if action is None:
            return self._invalid("The action could not be read from the answer.")
        try:
            data = self._request({"type": "step", "data": action}, "step")
        except _ServerError as err:
            if err.code == "VALIDATION_ERROR":  # the server's action model rejected the fields: a bad action
                return self._invalid(f"The server rejected the action ({err.message}).")
            raise RuntimeError(f"The OpenEnv server at {self._url} failed on step: {err.message} ({err.code})") from err
        observation, reward, done, info = self._parse(data)
        self._observation, self._done = observation, done
        return observation, reward, done, info

    def _action(self, text: str) -> dict[str, Any] | None:
        if isinstance(self.action_from_text, str):
            return {self.action_from_text: text if isinstance(text, str) else ""}
        action = self.action_from_text(text)
        if action is not None and not isinstance(action, dict):
            raise TypeError(f"action_from_text must return a dict or None, got {type(action).__name__}")
        return action

    def _invalid(self, reason: str) -> tuple[str, float, bool, dict[str, Any]]:
        info = {INFO_VALID: False, INFO_SUCCESS: False}
        return f"Invalid action. {reason}\n{self._observation}", 0.0, False, info

    def _parse(self, data: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        fields = dict(data.get("observation") or {})
        reward = data.get("reward")
        reward = 0.0 if reward is None else float(reward)
        done = bool(data.get("done", False))
        if isinstance(self.observation_to_text, str):
            if self.observation_to_text not in fields:
                raise KeyError(
                    f"The OpenEnv observation from {self._url} has no field {self.observation_to_text!r} "
                    f"(fields: {sorted(fields)}); fix `observation_to_text`."
                )
            text = str(fields[self.observation_to_text])
        elif callable(self.observation_to_text):
            text = str(self.observation_to_text(fields))
        else:
            text = default_observation_to_text(fields)
        served = isinstance(fields.get("info"), dict) and isinstance(fields.get("valid"), bool)
        if served:  # a trl-agents server: its env's info travels as a field
            info = dict(fields["info"])
        else:
            info = {"observation": fields}
        valid = fields.get("valid")
        success = fields.get("success")
        info[INFO_VALID] = valid if isinstance(valid, bool) else True
        info[INFO_SUCCESS] = success if isinstance(success, bool) else (done and reward > 0)
        self._task_description = (
            fields.get("task_description") if isinstance(fields.get("task_description"), str) else ""
        )
        admissible = fields.get("admissible_actions")
        self._admissible = [str(a) for a in admissible] if isinstance(admissible, list) else None
        return text, reward, done, info

    def task_description(self) -> str:
        return self._task_description

    def admissible_actions(self) -> list[str] | None:
        return self._admissible

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Task rows of the served env's split, from a trl-agents server (`serve_openenv`); rows name `"openenv"`.

        Other OpenEnv servers have no split route: build task rows for them yourself (e.g. `{"seed": s}`).
        """
        client = cls(**env_kwargs)  # validates the arguments
        if not client.base_url:
            raise ValueError("OpenEnvClient.task_split needs `base_url` (the server to ask for its task split)")
        query = {"split": split} if count is None else {"split": split, "count": count}
        url = f"{_http_url(client.base_url)}{_EXTRA_ROUTES}/task_split?{urllib.parse.urlencode(query)}"
        try:
            rows = _http_get_json(url, timeout=client.connect_timeout)
        except urllib.error.HTTPError as err:
            detail = _http_error_detail(err)
            if err.code == 404:
                raise NotImplementedError(
                    f"The OpenEnv server at {client.base_url} does not serve trl-agents task splits (only servers "
                    "started with serve_openenv do); build the task rows yourself, e.g. [{'seed': s} for s in ...]."
                ) from err
            if err.code == 501:
                raise NotImplementedError(detail) from err
            raise ValueError(
                f"The OpenEnv server at {client.base_url} refused task_split({split!r}): {detail}"
            ) from err
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(f"Could not reach the OpenEnv server at {client.base_url}: {err}") from err
        return [{**row, "env": cls.name} for row in rows]


class _ServerError(Exception):
    """An `{"type": "error"}` reply of an OpenEnv server."""

    def __init__(self, message: str, code: str):
        super().__init__(f"{message} ({code})")
        self.message, self.code = message, code


def _http_error_detail(err: Any) -> str:
    try:
        body = json.loads(err.read().decode("utf-8"))
        return str(body.get("detail", body))
    except Exception:  # noqa: BLE001 - the body is only used for the message
        return str(err)


# ---- server: any AgentEnv behind OpenEnv's HTTPEnvServer -----------------------------------------------------------


class OpenEnvTypes(NamedTuple):
    """The OpenEnv classes `serve_openenv` uses: pass `action`/`observation` to a typed OpenEnv client."""

    action: type
    observation: type
    environment: type


@functools.cache
def openenv_types() -> OpenEnvTypes:
    """Build (once) the pydantic `Action`/`Observation` models and the `Environment` that wraps an AgentEnv.

    - action `TextAction(message: str)`: the model's raw text, as OpenEnv's text environments take it;
    - observation `TextObservation`: `text`, `valid`, `success`, `task_description`, `admissible_actions` (list or
      None) and `info` (the rest of the env's info dict, made JSON-safe), plus OpenEnv's `reward` and `done`;
    - environment `AgentEnvEnvironment(env_name, env_kwargs)`: one AgentEnv per instance; `reset(seed=None,
      episode_id=None, **fields)` resets it with the task row `{**fields, "seed": seed}`.
    """
    try:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
        from pydantic import Field
    except ImportError as err:
        raise ImportError(f"Serving environments over OpenEnv needs openenv-core: {_INSTALL_HINT}") from err

    class TextAction(Action):
        """The model's raw output for one turn; the served environment parses it."""

        message: str = Field(..., description="The model's text for this turn (the served env parses the action)")

    class TextObservation(Observation):
        """A trl-agents observation: the text the model sees plus the AgentEnv step information."""

        text: str = Field(default="", description="What the model sees")
        valid: bool = Field(default=True, description="The action was parsed and applied")
        success: bool = Field(default=False, description="The task is solved")
        task_description: str = Field(default="", description="The goal of the current task (may be empty)")
        admissible_actions: list[str] | None = Field(default=None, description="Valid actions, when enumerable")
        info: dict[str, Any] = Field(default_factory=dict, description="The rest of the env's step info")

    class AgentEnvEnvironment(Environment):
        """An OpenEnv `Environment` that plays one trl-agents `AgentEnv` (one instance per OpenEnv session)."""

        # Every session builds its own AgentEnv and shares nothing with the others.
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self, env_name: str, env_kwargs: dict[str, Any] | None = None):
            super().__init__()
            self.env_name = env_name
            self.agent_env = make_env(env_name, **(env_kwargs or {}))
            self._state = State(episode_id=None, step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, **fields: Any) -> TextObservation:
            task = dict(fields)
            if seed is not None:
                task["seed"] = seed
            text = self.agent_env.reset(task)
            self._state = State(episode_id=episode_id, step_count=0)
            return self._observation(text, 0.0, False, {INFO_VALID: True, INFO_SUCCESS: False})

        def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
            text, reward, done, info = self.agent_env.step(action.message)
            self._state.step_count += 1
            return self._observation(text, reward, done, info)

        def _observation(self, text: str, reward: float, done: bool, info: dict[str, Any]) -> TextObservation:
            rest = {k: v for k, v in info.items() if k not in (INFO_VALID, INFO_SUCCESS)}
            return TextObservation(
                text=text,
                valid=bool(info.get(INFO_VALID, True)),
                success=bool(info.get(INFO_SUCCESS, False)),
                task_description=self.agent_env.task_description(),
                admissible_actions=self.agent_env.admissible_actions(),
                info=_json_safe(rest),
                reward=float(reward),
                done=bool(done),
            )

        @property
        def state(self) -> State:
            return self._state

        def get_metadata(self) -> EnvironmentMetadata:
            from ... import __version__

            return EnvironmentMetadata(
                name=self.env_name,
                description=type(self.agent_env).instructions or f"trl-agents environment {self.env_name!r}",
                version=__version__,
            )

        def close(self) -> None:
            self.agent_env.close()

    return OpenEnvTypes(TextAction, TextObservation, AgentEnvEnvironment)


def create_openenv_app(env_name: str, env_kwargs: dict[str, Any] | None = None, max_concurrent_envs: int = 64):
    """A FastAPI app serving the registered environment `env_name` with OpenEnv's `HTTPEnvServer`.

    Every OpenEnv session (WebSocket connection) gets its own `make_env(env_name, **env_kwargs)`. Besides OpenEnv's
    routes (`/ws`, `/reset`, `/step`, `/state`, `/schema`, `/metadata`, `/health`, `/mcp`) the app serves
    `GET /trl_agents/info` (env name, instructions, capabilities) and `GET /trl_agents/task_split?split=&count=`
    (the env's task rows), which `OpenEnvClient` uses.

    Args:
        env_name: A registered environment name (e.g. `"sokoban"`).
        env_kwargs: Its constructor arguments; checked here by building one instance.
        max_concurrent_envs: Most sessions at once (OpenEnv refuses more with CAPACITY_REACHED).
    """
    env_class = get_env_class(env_name)
    env_kwargs = dict(env_kwargs or {})
    if isinstance(max_concurrent_envs, bool) or not isinstance(max_concurrent_envs, int) or max_concurrent_envs < 1:
        raise ValueError(f"`max_concurrent_envs` must be a positive int, got {max_concurrent_envs!r}")
    make_env(env_name, **env_kwargs).close()  # bad constructor arguments fail now, not in the first session
    types = openenv_types()
    from fastapi import HTTPException
    from openenv.core.env_server.http_server import create_fastapi_app

    factory = functools.partial(types.environment, env_name, env_kwargs)
    app = create_fastapi_app(factory, types.action, types.observation, max_concurrent_envs=max_concurrent_envs)

    @app.get(_EXTRA_ROUTES + "/info", tags=["trl-agents"])
    def trl_agents_info() -> dict[str, Any]:
        """The served trl-agents environment: name, instructions, capabilities, constructor arguments."""
        return {
            "env": env_name,
            "instructions": env_class.instructions,
            "capabilities": sorted(env_class.capabilities()),
            "env_kwargs": _json_safe(env_kwargs),
        }

    @app.get(_EXTRA_ROUTES + "/task_split", tags=["trl-agents"])
    def trl_agents_task_split(split: str, count: int | None = None) -> list[dict[str, Any]]:
        """Task rows of a named split of the served environment (`AgentEnv.task_split`)."""
        try:
            return _json_safe(env_class.task_split(split, count, **env_kwargs))
        except NotImplementedError as err:
            raise HTTPException(status_code=501, detail=str(err)) from err
        except (ValueError, TypeError) as err:
            raise HTTPException(status_code=400, detail=str(err)) from err

    return app


def serve_openenv(
    env_name: str,
    env_kwargs: dict[str, Any] | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_concurrent_envs: int = 64,
    log_level: str = "info",
) -> None:
    """Serve `env_name` over OpenEnv's protocol until interrupted (blocking; uvicorn).

    Clients connect with `make_env("openenv", base_url=f"http://{host}:{port}")` or any OpenEnv client, e.g.
    `openenv.core.GenericEnvClient(base_url=...).sync()` with actions `{"message": text}`.
    """
    import uvicorn

    app = create_openenv_app(env_name, env_kwargs, max_concurrent_envs=max_concurrent_envs)
    uvicorn.run(app, host=host, port=port, log_level=log_level)


class OpenEnvServer:
    """A running `start_openenv_server` server: `base_url`, `stop()`, and use as a context manager."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int):
        self._server, self._thread = server, thread
        self.host, self.port = host, port
        display_host = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{display_host}:{port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to shut down (open sessions are closed) and wait for its thread."""
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"OpenEnvServer({self.base_url})"


def start_openenv_server(
    env_name: str,
    env_kwargs: dict[str, Any] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    max_concurrent_envs: int = 64,
    startup_timeout: float = 30.0,
) -> OpenEnvServer:
    """Serve `env_name` over OpenEnv in a background thread (for tests, notebooks and local training).

    Args:
        env_name, env_kwargs, max_concurrent_envs: As in `create_openenv_app`.
        host: Interface to bind; the default is loopback only.
        port: Port to bind; 0 picks a free one (read it from the returned `base_url`).
        startup_timeout: Seconds to wait for the server to accept connections.
    """
    app = create_openenv_app(env_name, env_kwargs, max_concurrent_envs=max_concurrent_envs)
    return _serve_app_in_thread(app, host, port, startup_timeout, label=env_name)


def _serve_app_in_thread(app: Any, host: str, port: int, startup_timeout: float, label: str) -> OpenEnvServer:
    """Run an ASGI app with uvicorn in a daemon thread on a socket bound here (so port 0 gives a known port)."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(f"Cannot serve {label!r} on {host}:{port}: {err}") from err
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, ws_ping_interval=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"openenv-server-{label}-{bound_port}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"The OpenEnv server for {label!r} on {host}:{bound_port} did not start")
        time.sleep(0.01)
    return OpenEnvServer(server, thread, host, bound_port)
