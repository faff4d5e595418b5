"""The environment contract every trl-agents environment implements.

An `AgentEnv` is a text environment for one episode at a time: `reset(task)` returns the first observation,
`step(action_text)` parses the model's raw output, applies it, and returns `(observation, reward, done, info)`.
Parsing lives in the environment because only it knows its action syntax; an action it cannot parse or apply is
reported with `info["valid"] = False`, a clear observation saying what was expected, and an unchanged state.

Optional capabilities are methods a subclass overrides; `capabilities()` lists those it does, so topologies and
methods can check them up front (e.g. tree rollouts need `snapshot`, CAST needs `solver_value`):

| capability           | what it is for                                                             |
|----------------------|----------------------------------------------------------------------------|
| `snapshot`/`restore` | branching and tree rollouts (copy the state, continue from it later)       |
| `state_key`          | canonical state for anchor-state grouping (GiGPO and its relatives)        |
| `solver_value`       | exact cost-to-go of the current state (solver-based credit, CAST)          |
| `optimal_plan`       | a shortest action sequence from the current state (solver demonstrations)  |
| `verify`             | verifier atoms with witness steps and dependency edges (VICT)              |
| `privileged_context` | text only a teacher sees: hints, skills, the solution (self-distillation)  |
| `roles`              | two or more agents acting in turn (multi-agent co-training)                |
| `tools`              | actions are tool calls, whose schemas the chat template shows (`tools=`)   |

Example:
    >>> from trl_agents.envs import make_env
    >>> env = make_env("frozenlake", size=4)
    >>> obs = env.reset({"seed": 0})
    >>> sorted(env.capabilities())
    ['optimal_plan', 'restore', 'snapshot', 'solver_value', 'state_key']
"""

from __future__ import annotations

import abc
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

# Keys with a fixed meaning in the `info` dict returned by `step()`.
INFO_VALID = "valid"  # bool: the action was parsed and applied (default True)
INFO_SUCCESS = "success"  # bool: the task is solved (read at the last step of an episode)
INFO_ROLE_REWARDS = "role_rewards"  # dict role -> reward, at the end of an episode of a two-agent environment
INFO_ROLE = "role"  # str: the role that took this step, in environments with `roles` (saved in trajectory records)


@dataclass
class VerifierAtom:
    """One checkable fact of a task's success condition, as returned by `AgentEnv.verify()`.

    Args:
        name: Identifier of the atom (e.g. `"box_on_target:2"`, `"object_heated"`).
        status: `"sat"`, `"unsat"` or `"unknown"`.
        witness_step: Index of the step that produced or revealed the fact, or None when there is none.
        depends_on: Names of atoms that must hold before this one can (edges of the dependency DAG).
    """

    name: str
    status: str
    witness_step: int | None = None
    depends_on: list[str] = field(default_factory=list)


class AgentEnv(abc.ABC):
    """Base class of every environment. Subclasses set `name` and `instructions` and implement `reset`/`step`.

    Class attributes:
        name: Registry name (`make_env(name)`).
        instructions: The rules and action format, shown to the policy as the system message.
        roles: Names of the agents that act in turn; empty for single-agent environments.
        tools: JSON schemas of the tools the model acts with, in the OpenAI function format TRL and
            `transformers.utils.get_json_schema` use (`{"type": "function", "function": {"name", "description",
            "parameters"}}`); empty when actions are plain text. Prompts pass them to the tokenizer's chat template
            (`tools=`, as TRL does), which shows them and how to call them in the model's own format; `step` parses
            the calls (e.g. `envs.adapters.trl.parse_tool_calls` for the Qwen/Hermes format).
        task_keys: A task row must hold at least one of these keys (e.g. `("seed", "layout")`); checked when a
            trainer receives its dataset, so a row without a task fails with a clear message up front.
        requires: Python packages (import names) the environment needs beyond trl-agents' own dependencies; they
            come with the `envs` extra. `missing_requirements()` says which are absent.
        thread_safe: False when instances may not run on several threads at once, e.g. because the environment
            uses module-level state of a library (TextWorld's parsers). The rollout's thread backend then runs the
            calls of all such environments one at a time; the process and Ray backends give every environment its
            own interpreter and run them in parallel.
        solver_semantics: How `solver_value()` counts, for solver-based credit (CAST's boundary rules):
            `"shortest_path"` — actions an optimal solver still needs, `math.inf` once the task cannot be solved
            (Sokoban, Rush Hour, FrozenLake); `"minesweeper"` — safe reveals a logic solver still needs, `math.inf`
            when logic alone cannot finish; a step that loses reports `info["mine_hit"]`, and every step reports
            the board's `info["safe_cells"]`.
    """

    name: ClassVar[str] = ""
    instructions: ClassVar[str] = ""
    roles: ClassVar[tuple[str, ...]] = ()
    tools: ClassVar[tuple[dict[str, Any], ...]] = ()
    task_keys: ClassVar[tuple[str, ...]] = ()
    requires: ClassVar[tuple[str, ...]] = ()
    thread_safe: ClassVar[bool] = True
    solver_semantics: ClassVar[str] = "shortest_path"

    _CAPABILITY_METHODS: ClassVar[tuple[str, ...]] = (
        "snapshot",
        "restore",
        "state_key",
        "solver_value",
        "optimal_plan",
        "verify",
        "privileged_context",
    )

    @abc.abstractmethod
    def reset(self, task: dict[str, Any]) -> str:
        """Start the episode described by `task` (a dataset row) and return the first observation."""

    @abc.abstractmethod
    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply the model's raw output; return `(observation, reward, done, info)`.

        `info` carries at least `valid` (bool) and, once the episode ends, `success` (bool).
        """

    def task_description(self) -> str:
        """The goal of the current task, repeated in every prompt (empty when the observation says it all)."""
        return ""

    def admissible_actions(self) -> list[str] | None:
        """The actions valid in the current state, when the environment can enumerate them."""
        return None

    def current_role(self) -> str:
        """The role that takes the next `step()` in environments with `roles` (empty string otherwise).

        Two-agent environments return each observation from the point of view of the role that acts next, name the
        acting role in every step's `info["role"]`, and put every role's reward in `info["role_rewards"]` (a dict
        role -> float) when the episode ends.
        """
        return self.roles[0] if self.roles else ""

    def close(self) -> None:
        """Release external resources (processes, servers). Called once the environment is no longer needed."""

    # ---- optional capabilities: override to declare -------------------------------------------------------------

    def snapshot(self) -> Any:
        """Return an opaque copy of the current state that `restore` can return to."""
        raise NotImplementedError(f"{type(self).__name__} does not support snapshots")

    def restore(self, snapshot: Any) -> None:
        """Return to a state captured by `snapshot()`."""
        raise NotImplementedError(f"{type(self).__name__} does not support snapshots")

    def state_key(self) -> Hashable:
        """A canonical, hashable key of the current state (equal keys = same state)."""
        raise NotImplementedError(f"{type(self).__name__} does not define state keys")

    def solver_value(self) -> float:
        """Exact cost-to-go of the current state: the number of actions an optimal solver still needs
        (0 when solved, `math.inf` when the task can no longer be solved)."""
        raise NotImplementedError(f"{type(self).__name__} has no solver")

    def optimal_plan(self) -> list[str] | None:
        """A shortest list of actions (as text the env parses) from the current state to success; None when the
        task can no longer be solved."""
        raise NotImplementedError(f"{type(self).__name__} has no solver")

    def verify(self) -> list[VerifierAtom]:
        """Check the episode so far: the atoms of the success condition, with witness steps and dependencies."""
        raise NotImplementedError(f"{type(self).__name__} has no instrumented verifier")

    def privileged_context(self) -> str:
        """Text that only a teacher may see (hints, skills, the solution) for self-distillation methods."""
        raise NotImplementedError(f"{type(self).__name__} has no privileged context")

    # ---- capability discovery and task splits --------------------------------------------------------------------

    @classmethod
    def capabilities(cls) -> frozenset[str]:
        """The optional capabilities this class implements (methods overridden from `AgentEnv`, plus `roles` and
        `tools` when it declares them)."""
        found = {m for m in cls._CAPABILITY_METHODS if getattr(cls, m) is not getattr(AgentEnv, m)}
        if cls.roles:
            found.add("roles")
        if cls.tools:
            found.add("tools")
        return frozenset(found)

    @classmethod
    def missing_requirements(cls) -> list[str]:
        """The packages in `requires` that cannot be imported here (empty when the environment can run)."""
        import importlib.util

        return [name for name in cls.requires if importlib.util.find_spec(name) is None]

    def supports(self, capability: str) -> bool:
        return capability in self.capabilities()

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Task rows of a named split (e.g. `"train"`, `"eval"`), at most `count` of them.

        Every row carries `env` (this env's registry name), so a dataset built from it is ready for the trainer.
        Subclasses with seeded tasks implement it; the default says the env has no built-in splits.
        """
        raise NotImplementedError(f"environment {cls.name!r} has no built-in task splits")

    # Seeded splits: subclasses that set these can build their rows with `seeded_split` (disjoint seed ranges).
    SPLIT_SEED_START: ClassVar[dict[str, int]] = {}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {}
    _MAX_SPLIT_COUNT: ClassVar[int] = 1_000_000  # the gap between split seed ranges

    @classmethod
    def seeded_split(cls, split: str, count: int | None, id_prefix: str | None = None, **fields: Any) -> list[dict]:
        """Rows `{"env", "seed", "task_id", **fields}` for seeds `SPLIT_SEED_START[split]` onwards (`count` of them,
        default `SPLIT_DEFAULT_COUNT[split]`); task ids read `<id_prefix or name>-<split>-<seed>`."""
        from .validation import check_int

        if split not in cls.SPLIT_SEED_START:
            raise ValueError(f"Unknown {cls.name} split {split!r}; choose one of {sorted(cls.SPLIT_SEED_START)}")
        count = cls.SPLIT_DEFAULT_COUNT[split] if count is None else check_int("count", count, 0, cls._MAX_SPLIT_COUNT)
        start = cls.SPLIT_SEED_START[split]
        prefix = id_prefix or cls.name
        return [
            {"env": cls.name, "seed": seed, "task_id": f"{prefix}-{split}-{seed}", **fields}
            for seed in range(start, start + count)
        ]


def has_plans(env_cls: type[AgentEnv]) -> bool:
    """Whether an environment class gives plans to demonstrate or teacher-force: a solver's (`optimal_plan`
    capability) or an expert's (`expert_plan()`, for plans that are good but not shortest: Search-QA, WebShop)."""
    return "optimal_plan" in env_cls.capabilities() or callable(getattr(env_cls, "expert_plan", None))


def plan_of(env: AgentEnv) -> list[str] | None:
    """The actions that finish the task from the environment's current state (None when there are none):
    `optimal_plan()` where the environment has a solver, else `expert_plan()`."""
    return env.optimal_plan() if env.supports("optimal_plan") else env.expert_plan()
