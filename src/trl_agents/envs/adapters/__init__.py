"""Adapters: other libraries' environments as `AgentEnv`s, and our environments in other libraries' formats.

Importing this package registers every adapter (`make_env("textarena", ...)`); the adapter modules import their
third-party packages only when an environment is built, so this import needs nothing beyond trl-agents itself. The
wrapped libraries come with `pip install "trl-agents[envs]"`.

| registry name     | class                                             | wraps                                          |
|-------------------|---------------------------------------------------|------------------------------------------------|
| `textarena`       | `trl_agents.envs.adapters.textarena.TextArenaEnv` | a TextArena game (`Sokoban-v0`, ...)           |
| `gymnasium`       | `trl_agents.envs.adapters.gymnasium.GymnasiumEnv` | a gymnasium env with a text render             |
| `openenv`         | `trl_agents.envs.adapters.openenv.OpenEnvClient`  | an OpenEnv server, by base URL                 |
| `trl-environment` | `trl_agents.envs.adapters.trl.TRLEnvironment`     | a TRL `environment_factory` class (tool calls) |

The other direction: `serve_openenv` / `start_openenv_server` serve any registered environment as an OpenEnv
server, and `to_trl_environment(name)` turns one into a class for `GRPOTrainer(environment_factory=...)`.
"""

from .gymnasium import GymnasiumEnv
from .openenv import OpenEnvClient, create_openenv_app, openenv_types, serve_openenv, start_openenv_server
from .textarena import TextArenaEnv, TextArenaGameUnavailable
from .trl import TRLEnvironment, from_trl_environment, parse_tool_calls, to_trl_environment, trl_environment_reward

__all__ = [
    "GymnasiumEnv",
    "OpenEnvClient",
    "TRLEnvironment",
    "TextArenaEnv",
    "TextArenaGameUnavailable",
    "create_openenv_app",
    "from_trl_environment",
    "openenv_types",
    "parse_tool_calls",
    "serve_openenv",
    "start_openenv_server",
    "to_trl_environment",
    "trl_environment_reward",
]
